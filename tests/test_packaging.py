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
