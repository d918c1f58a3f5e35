"""Packaging: our import names belong to the txnbuf distribution, the console
script works, and no package imports a package above its floor."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = [
    "proto",
    "ledger",
    "tc",
    "buffer",
    "subscriptions",
    "client",
    "broker",
    "checker",
    "pipelines",
    "cluster",
]

# What each package may import from ours (itself included). broker may import all.
ALLOWED: dict[str, set[str]] = {
    "proto": {"proto"},
    "ledger": {"ledger"},
    "tc": {"ledger", "proto", "tc"},
    "buffer": {"ledger", "proto", "buffer"},
    "subscriptions": {"ledger", "proto", "buffer", "subscriptions"},
    "client": {"proto", "client"},
    # The correctness harness drives brokers through the client, like examples/.
    "checker": {"proto", "client", "checker"},
    # Spark's format("txnbuf") uses the client only (DESIGN.md: pipelines use client).
    "pipelines": {"client", "pipelines"},
    # Membership and slot ownership: a pure core, its store interface and model.
    "cluster": {"cluster"},
    # broker.cli hands `txnbuf check` to checker (imported only for that command).
    "broker": set(PACKAGES),
}


@pytest.mark.parametrize("name", PACKAGES)
def test_import_name_belongs_to_txnbuf(name: str) -> None:
    assert "txnbuf" in importlib.metadata.packages_distributions().get(name, [])


@pytest.mark.parametrize("name", PACKAGES)
def test_import_name_resolves_to_this_repository(name: str) -> None:
    # Google's proto-plus also installs a top-level `proto`: make sure ours wins.
    module = importlib.import_module(name)
    locations = [Path(p).resolve() for p in module.__path__]
    assert locations, name
    for location in locations:
        assert location == REPO / name


def test_proto_is_ours_not_proto_plus() -> None:
    import proto

    assert proto.__file__ is not None
    assert Path(proto.__file__).resolve() == REPO / "proto" / "__init__.py"
    assert Path(proto.txnbuf_pb2.__file__).resolve().parent == REPO / "proto"
    assert hasattr(proto.txnbuf_pb2, "BaseCommand")


def test_console_script_points_at_broker_cli_main() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts")
    ours = [ep for ep in scripts if ep.name == "txnbuf"]
    assert len(ours) == 1
    (ep,) = ours
    assert ep.value == "broker.cli:main"
    assert ep.dist is not None and ep.dist.name == "txnbuf"
    from broker.cli import main

    assert ep.load() is main


def test_serve_help_exits_0_and_mentions_data_dir(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "--data-dir" in proc.stdout
    assert "usage: txnbuf serve" in proc.stdout
    assert not (tmp_path / "txnbuf-data").exists()  # --help starts nothing


def test_txnbuf_without_command_fails(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "broker"], capture_output=True, text=True, timeout=30, cwd=tmp_path
    )
    assert proc.returncode != 0
    assert "serve" in proc.stderr


# -- import floors -------------------------------------------------------------


def _module_package(path: Path, root: Path) -> list[str]:
    """Dotted package of the module at ``path`` (a file under ``root``)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1]  # __init__.py and plain modules both live in their directory


def imported_top_names(source: str, package: list[str]) -> set[str]:
    """Top-level names of every module imported by ``source``.

    ``package`` is the dotted package the source lives in (for relative
    imports). Imports inside functions count too, as do
    ``importlib.import_module("x")`` and ``__import__("x")`` with a constant.
    A relative import that climbs above the top-level package gives "..".
    """
    names: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                assert node.module is not None
                names.add(node.module.split(".")[0])
            elif node.level > len(package):
                names.add("..")
            else:
                base = package[: len(package) - node.level + 1]
                names.add(base[0])
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
                isinstance(func, ast.Attribute) and func.attr == "import_module"
            )
            first = node.args[0]
            if dynamic and isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value.lstrip(".").split(".")[0] or "..")
    return names


def test_import_checker_sees_every_form() -> None:
    source = """
import ledger.x
from buffer import Position
from . import sibling
from .errors import E
def f():
    import broker
    importlib.import_module("subscriptions._cursor")
    __import__("tc")
"""
    assert imported_top_names(source, ["client"]) == {
        "ledger",
        "buffer",
        "client",
        "broker",
        "subscriptions",
        "tc",
    }
    assert imported_top_names("from .. import x", ["client"]) == {".."}
    assert imported_top_names("from .. import x", ["client", "sub"]) == {"client"}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_above_its_floor(package: str) -> None:
    files = sorted((REPO / package).rglob("*.py"))
    assert files, f"no Python files in {package}"
    ours = set(PACKAGES)
    bad: list[str] = []
    for path in files:
        found = imported_top_names(path.read_text(), _module_package(path, REPO))
        found &= ours | {".."}
        for name in sorted(found - ALLOWED[package]):
            bad.append(f"{path.relative_to(REPO)} imports {name}")
    assert not bad, "\n".join(bad)


# -- no import circles -----------------------------------------------------------


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(source: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules among ``known`` that the module ``module`` imports, in
    any form: at the top, under ``if TYPE_CHECKING:``, inside a function,
    relative, or through ``importlib.import_module`` / ``__import__`` with a
    constant. ``from pkg import name`` imports ``pkg.name`` if that is a
    module, else ``pkg``; importing a module is not counted as importing the
    packages above it (Python runs them first, but they are the parents, not
    a dependency)."""

    def resolve(name: str) -> str | None:
        parts = name.split(".")
        while parts:
            if ".".join(parts) in known:
                return ".".join(parts)
            parts.pop()
        return None

    package = module.split(".") if is_package else module.split(".")[:-1]
    targets: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                assert node.module is not None
                base_name = node.module
            for alias in node.names:
                sub = f"{base_name}.{alias.name}"
                targets.append(sub if sub in known else base_name)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            dynamic = (isinstance(func, ast.Name) and func.id == "__import__") or (
                isinstance(func, ast.Attribute) and func.attr == "import_module"
            )
            first = node.args[0]
            if dynamic and isinstance(first, ast.Constant) and isinstance(first.value, str):
                targets.append(first.value)
    found = {resolve(t) for t in targets}
    return {m for m in found if m is not None and m != module}


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The circles of ``graph`` (module -> modules it imports): each set of
    two or more modules that import each other, directly or not (Tarjan's
    strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for other in sorted(graph.get(module, ())):
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in on_stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return circles


def test_the_circle_finder_sees_circles_in_every_import_form() -> None:
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c", "pkg.d"}
    sources = {
        "pkg": "from pkg.a import X\n",
        "pkg.a": "from pkg import b\n",  # (pkg.b, a module)
        "pkg.b": "def f():\n    from .c import Y\n",  # inside a function
        "pkg.c": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import X\n",
        "pkg.d": "import importlib\nimportlib.import_module('pkg.d')\nfrom pkg import a\n",
    }
    graph = {m: module_imports(src, m, m == "pkg", known) for m, src in sources.items()}
    assert graph == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.c"},
        "pkg.c": {"pkg.a"},
        "pkg.d": {"pkg.a"},
    }
    assert import_circles(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    del graph["pkg.c"]
    assert import_circles(graph) == []


def test_no_import_circles() -> None:
    """Imports go one way, inside each package and between them (a circle
    hidden in a function or under TYPE_CHECKING counts too): a module that
    needs something of one that imports it takes it as an argument, or
    names what it needs in a Protocol."""
    paths = {
        _module_name(path, REPO): path
        for package in PACKAGES
        for path in sorted((REPO / package).rglob("*.py"))
    }
    known = set(paths)
    graph = {
        module: module_imports(path.read_text(), module, path.name == "__init__.py", known)
        for module, path in paths.items()
    }
    circles = import_circles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)
