"""Every code block of README.md and docs/*.md, run (or checked) as a reader
would use it, and the README's examples table run as it is written.

How a block is found: a fenced block (a line of three or more backticks,
then the closing one). `BLOCKS` below says, for each block (by its file and
its first line; the n-th of equal first lines by its number), what this
test does with it. A block that is not in `BLOCKS` fails
`test_every_block_is_known`, naming it: a new snippet cannot go untested.

What the test does with a block, by kind:

- a **program** (complete Python): written to a file of its own and run
  with this venv's Python (the README's ``.venv/bin/python``, where
  `client` is installed) as a subprocess, in a folder of its own, against
  a real broker these tests start; it must exit 0 in its time limit, and
  what it prints is checked where it prints something. A program that runs
  until stopped (a copy loop) is fed its input, watched until its output
  is complete, then stopped with SIGINT (Ctrl-C, as its comment says).
- a **fragment** (lines of a longer program, ``...`` where lines are left
  out): the text before the block names the program; each of its lines
  (trailing comments aside) must be a line of that program, in order, and
  that program is one of the README's examples, which run below.
- **shell** commands: run by ``bash -e`` in a folder of its own, with this
  venv's ``bin`` first on PATH (the README's ``.venv/bin/txnbuf``); a
  ``txnbuf serve`` line starts a broker in the background, waited for
  until it answers.
- a **synopsis** (``[--option X]``, ``A|B``, ``...``): each option it names
  must be one that ``txnbuf ... --help`` lists.
- **data** (JSON, sample output, a layout): read by the code that reads
  it, or compared with what the code prints for the same input.

What a program or command is changed in, before it runs (the only
changes): the documented addresses (``127.0.0.1:6650``, ``broker:6650``,
``127.0.0.1:9092``) become those of the test's broker, and paths under
``/tmp/`` go to the test's temporary folder, so that tests run side by
side and leave nothing behind; ``--host 0.0.0.0`` becomes 127.0.0.1 (a
test listens on loopback only).

Why a collector of our own rather than pytest-examples, mktestdocs or
Sybil: those find the blocks (the easy part: `fenced_blocks` is twenty
lines) and run Python in pytest's own process. These blocks are programs
that need a broker process started for them, their own process (an
asyncio.run of their own, a timeout, a signal to stop an endless loop),
the venv's interpreter as the README names it, shell commands, and
fragments checked against the program they come from: all of that is ours
whatever finds the blocks, and the registry of every block (so that none
goes untested) is too.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker._checkdata import Finding, Repair, Report
from client import Client
from tests.conftest import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BIN = Path(sys.executable).parent  # this venv's bin: python, txnbuf
TIMEOUT = 180.0  # seconds a program may take (Spark starts a JVM)


# -- finding the blocks ---------------------------------------------------------


@dataclass(frozen=True)
class Block:
    path: str  # relative to the repository root
    line: int  # of the opening fence
    lang: str
    text: str
    before: str  # the paragraph before the block
    nth: int  # among the blocks of this file with the same first line

    @property
    def first(self) -> str:
        return self.text.splitlines()[0].strip() if self.text.strip() else ""

    @property
    def key(self) -> tuple[str, str, int]:
        return (self.path, self.first, self.nth)

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


def fenced_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    seen: Counter[str] = Counter()
    i = 0
    while i < len(lines):
        opening = re.match(r"^(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        if opening is None:
            i += 1
            continue
        fence, start = opening.group(2), i
        j = i + 1
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        text = "\n".join(lines[i + 1 : j]) + "\n"
        paragraph: list[str] = []
        k = start - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        while k >= 0 and lines[k].strip():
            paragraph.insert(0, lines[k])
            k -= 1
        first = text.splitlines()[0].strip() if text.strip() else ""
        rel = path.relative_to(ROOT).as_posix()
        found.append(
            Block(rel, start + 1, opening.group(3), text, " ".join(paragraph), seen[first])
        )
        seen[first] += 1
        i = j + 1
    return found


ALL_BLOCKS = [b for doc in DOCS for b in fenced_blocks(doc)]


# -- running things ---------------------------------------------------------------


def localize(text: str, url: str = "", kafka: str = "", tmp: Path | None = None) -> str:
    """``text`` with the documented addresses and /tmp paths made the test's."""
    if url:
        hostport = url.split("://", 1)[1]
        text = text.replace("http://127.0.0.1:6650", url).replace("http://broker:6650", url)
        text = text.replace("https://broker:6650", url.replace("127.0.0.1", "localhost"))
        text = text.replace("127.0.0.1:6650", hostport)
    if kafka:
        text = text.replace("127.0.0.1:9092", kafka)
    if tmp is not None:
        text = text.replace("/tmp/", f"{tmp}/")
    return text.replace("--host 0.0.0.0", "--host 127.0.0.1")


def ctrl_c_works() -> None:
    """In the child before it runs (``preexec_fn``): SIGINT back to its default.
    A process started in the background by a shell without job control
    inherits SIGINT ignored, and Python then never raises KeyboardInterrupt,
    so a program that stops on Ctrl-C would not stop on the test's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TXNBUF_TOKEN", "PYTHONPATH")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return {**env, **extra}


def run_python(
    source: str, cwd: Path, *args: str, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[str]:
    """``source`` as a program of its own, run by this venv's Python in ``cwd``."""
    program = cwd / "program.py"
    program.write_text(source)
    return subprocess.run(
        [sys.executable, str(program), *args],
        cwd=cwd,
        env=environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}\n{result.stdout}\n{result.stderr}"
    return result.stdout


@contextmanager
def started_broker(tmp: Path, *args: str) -> Iterator[BrokerProcess]:
    broker = BrokerProcess(tmp / "data", tmp / "broker.log")
    broker.args = list(args)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        sys.stderr.write(f"----- broker log -----\n{broker.log()[-5000:]}\n")


def send(url: str, topic: str, values: list[bytes]) -> None:
    async def go() -> None:
        async with Client(url) as client:
            producer = await client.create_producer(topic)
            await asyncio.gather(*(producer.send(v) for v in values))

    asyncio.run(go())


def committed(url: str, topic: str) -> list[bytes]:
    """The committed messages of ``topic`` (read by position: nothing is acknowledged)."""

    async def go() -> list[bytes]:
        async with Client(url) as client:
            out: list[bytes] = []
            for partition in range(await client.partitions(topic)):
                reader = await client.create_reader(topic, partition)
                while batch := await reader.read_batch(10_000):
                    out += [m.value for m in batch]
            return out

    return asyncio.run(go())


def wait_until(check: Callable[[], bool], proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        assert proc.poll() is None, f"the program ended before {what}: exit {proc.returncode}"
        assert time.monotonic() < deadline, f"no {what} within {TIMEOUT}s"
        time.sleep(0.2)


# -- what each kind of block gets ---------------------------------------------------


Handler = Callable[[Block, Path, pytest.FixtureRequest], None]


def produce_and_consume(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    broker: BrokerProcess = request.getfixturevalue("broker")
    out = ok(run_python(localize(block.text, broker.url), tmp))
    assert re.fullmatch(r"b'order #1' customer-7 \{'v': '1'\} 0:\d+:0\n", out), out


def until_interrupted(input_topic: str, output_topic: str, n: int = 50) -> Handler:
    """A copy loop that runs until Ctrl-C: fed ``n`` messages, stopped once
    its output holds them all, upper-cased, once."""

    def handler(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
        broker: BrokerProcess = request.getfixturevalue("broker")
        sent = [b"message %d" % i for i in range(n)]
        send(broker.url, input_topic, sent)
        (tmp / "program.py").write_text(localize(block.text, broker.url, tmp=tmp))
        with (tmp / "stderr").open("w") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "program.py"],
                cwd=tmp,
                env=environment(),
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                text=True,
                start_new_session=True,
                preexec_fn=ctrl_c_works,
            )
            try:
                wait_until(lambda: len(committed(broker.url, output_topic)) >= n, proc, "output")
                proc.send_signal(signal.SIGINT)
                proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        err = (tmp / "stderr").read_text()
        # Stopped by Ctrl-C, as its comment says, and by nothing else.
        assert proc.returncode in (-signal.SIGINT, 130), (proc.returncode, err)
        assert err.rstrip().endswith("KeyboardInterrupt"), err
        assert sorted(committed(broker.url, output_topic)) == sorted(v.upper() for v in sent)

    return handler


def fragment_of(program: str) -> Handler:
    """Lines of ``program`` (which the README's examples table runs)."""

    def handler(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
        assert program in block.before, f"{block}: the text before it must name {program}"
        assert program in EXAMPLE_PROGRAMS, f"{program} is not among the README's examples"
        assert_lines_of(block.text, (ROOT / program).read_text(), str(block))

    return handler


def _code(line: str) -> str:
    """A line without its indentation and trailing comment (a ``#`` in a
    string is kept: the comment is what `tokenize` would call one)."""
    text = line.strip()
    in_string: str | None = None
    for i, ch in enumerate(text):
        if in_string:
            if ch == in_string:
                in_string = None
        elif ch in "'\"":
            in_string = ch
        elif ch == "#":
            return text[:i].rstrip()
    return text


def assert_lines_of(fragment: str, program: str, where: str) -> None:
    lines = [_code(line) for line in program.splitlines()]
    at = 0
    for line in fragment.splitlines():
        code = _code(line)
        if not code or code == "...":
            continue
        try:
            at = lines.index(code, at) + 1
        except ValueError:
            raise AssertionError(
                f"{where}: {code!r} is not a line of the program (after its line {at})"
            ) from None


def spark_copy(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """The README's Spark snippet: reads what `orders` holds from the start,
    copies it upper-cased and ends by itself."""
    broker: BrokerProcess = request.getfixturevalue("broker")
    orders = [b"order %d" % i for i in range(200)]
    send(broker.url, "orders", orders)
    ok(run_python(localize(block.text, broker.url, tmp=tmp), tmp))
    assert sorted(committed(broker.url, "orders-upper")) == sorted(v.upper() for v in orders)


def spark_streaming(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """docs/spark.md's query: runs until stopped; what `orders` holds comes out
    upper-cased, once."""
    broker: BrokerProcess = request.getfixturevalue("broker")
    orders = [b"order %d" % i for i in range(100)]
    send(broker.url, "orders", orders)
    (tmp / "program.py").write_text(localize(block.text, broker.url, tmp=tmp))
    with (tmp / "output").open("w") as output:
        proc = subprocess.Popen(
            [sys.executable, "program.py"],
            cwd=tmp,
            env=environment(),
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # (its JVM with it, for the kill below)
            preexec_fn=ctrl_c_works,
        )
        try:
            wait_until(lambda: len(committed(broker.url, "orders-upper")) >= 100, proc, "output")
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # (the JVM, if Ctrl-C left it)
            proc.wait()
    assert sorted(committed(broker.url, "orders-upper")) == sorted(v.upper() for v in orders)


def setup_commands(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """The two set-up commands: the second is what CI runs (.ci/run), the
    first installs and runs the broker, as written, in a fresh copy of
    the repository (its own venv; the port moved to a free one)."""
    commands = [line for line in block.text.splitlines() if not line.startswith("#")]
    assert len(commands) == 2, "two set-up commands: the broker, the tests"
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == commands[1], "the README's test command is .ci/run's"
    assert commands[0] == (
        "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/txnbuf serve"
    )
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    clone = tmp / "clone"
    for name in filter(None, files):
        source = ROOT / name.decode()
        if source.is_file():
            (clone / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            (clone / name.decode()).write_bytes(source.read_bytes())
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    log = (tmp / "setup.log").open("w")
    proc = subprocess.Popen(
        ["bash", "-c", f"{commands[0]} --port {port}"],
        cwd=clone,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, (tmp / "setup.log").read_text()[-5000:]
            assert time.monotonic() < deadline, "the broker did not answer"
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/admin/v1/health", timeout=1
                ) as answer:
                    assert json.loads(answer.read()) == {"status": "ok"}
                    break
            except OSError:
                time.sleep(0.5)
        assert (clone / "txnbuf-data" / "broker.db").is_file()
    finally:
        with contextlib.suppress(ProcessLookupError):  # (gone already if it failed)
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def layout(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """docs/architecture.md's layout: each folder named exists, and each of
    our packages is named."""
    named = {line.split()[0].rstrip("/") for line in block.text.splitlines() if line[:1] != " "}
    for folder in named:
        assert (ROOT / folder).is_dir(), folder
    text = (ROOT / "pyproject.toml").read_text()
    packages = re.search(r"include = \[(.*?)\]", text, re.S)
    assert packages is not None
    ours = {p.split(".")[0] for p in re.findall(r'"([\w.]+)"', packages.group(1))}
    assert ours - {"proto"} <= named | {"proto"} and "proto" in named, ours - named


def backup_command(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    broker: BrokerProcess = request.getfixturevalue("broker")
    send(broker.url, "backed-up", [b"x"])
    script = block.text.replace("./txnbuf-data", str(broker.data_dir))
    script = script.replace("/backups/txnbuf-1", str(tmp / "backup"))
    ok(shell(script, tmp))
    assert (tmp / "backup" / "broker.db").is_file()


def check_data_commands(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """Each command on a stopped broker's data: a clean directory exits 0."""
    broker: BrokerProcess = request.getfixturevalue("broker")
    send(broker.url, "checked", [b"x"])
    broker.stop()
    for line in block.text.splitlines():
        result = shell(line.replace("DIR", str(broker.data_dir)), tmp)
        out = ok(result)
        if "--json" in line:
            assert json.loads(out)["clean"] is True
        else:
            assert out.rstrip().endswith("result: clean"), out


def check_data_sample(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """The sample output is what `Report.text` prints for those findings
    (a line ending in ``...`` is the start of the real one)."""
    report = Report("txnbuf-data/broker.db", fix=False)
    report.findings = [
        Finding(
            "marker-data-missing",
            ("p/out/1@0", "x/out/1", "txn (1,0)"),
            "commit marker 0 names sidecar entries 0, which are gone",
        ),
        Finding(
            "dangling-ledger",
            ("x/gone/0",),
            "no partition ledger, and topic 'gone' is not in the topic list",
            Repair("drop", "x/gone/0"),
        ),
        Finding(
            "to-finish",
            ("tc/0", "txn (2,0)"),
            "COMMITTING at coordinator 0, to be told on partition out/1, partition out/0, "
            "subscription in/copier",
        ),
    ]
    report.ledgers = 19
    report.counts = Counter(
        {
            "topics": 2,
            "coordinators": 1,
            "transactions at coordinators": 3,
            "partitions": 3,
            "commit markers": 2,
            "subscription cursors": 5,
            "sidecars": 1,
            "transactions on partitions": 3,
        }
    )
    real = report.text().splitlines()
    sample = block.text.rstrip("\n").splitlines()
    assert len(sample) == len(real), (sample, real)
    for shown, printed in zip(sample, real, strict=True):
        if shown.endswith(" ..."):
            assert printed.startswith(shown[:-4]), (shown, printed)
        else:
            assert shown == printed


def shell(script: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=cwd,
        env=environment(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
    )


def _tls_files(folder: Path) -> None:
    """cert.pem and key.pem for localhost and 127.0.0.1, and ca.pem (the
    certificate signs itself), in ``folder``."""
    from tests.test_security import self_signed  # (the security tests' own)

    (folder / "tls").mkdir()
    cert, key = self_signed(folder / "tls")
    (folder / "cert.pem").write_bytes(cert.read_bytes())
    (folder / "ca.pem").write_bytes(cert.read_bytes())
    (folder / "key.pem").write_bytes(key.read_bytes())


def security_setup(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """Keys, tokens, a TLS broker that authenticates, the grants; then the
    application block after it, in the same folder."""
    _tls_files(tmp)
    port = free_port()
    url = f"https://127.0.0.1:{port}"
    script = localize(block.text, url)
    serve = re.search(r"^txnbuf serve .*?(?<!\\)$", script, re.S | re.M)
    assert serve is not None, "the block starts a broker"
    before, after = script[: serve.start()], script[serve.end() :]
    ok(shell(before, tmp))
    argv = shlex.split(serve.group(0).replace("\\\n", " "))
    log = (tmp / "broker.log").open("w")
    proc = subprocess.Popen(
        [*argv, "--port", str(port), "--data-dir", str(tmp / "data")],
        cwd=tmp,
        env=environment(),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        _wait_for_https(port, tmp / "ca.pem", proc)
        ok(shell(after, tmp))
        app = next(b for b in ALL_BLOCKS if b.path == block.path and b.line > block.line)
        assert app.lang == "python", "the application follows the commands"
        printed = ok(run_python(localize(app.text, url), tmp))
        assert re.fullmatch(r"0:\d+:0\n", printed), printed
        grants = json.loads((tmp / "data" / "acl.json").read_text())["grants"]
        assert {(g["role"], g["permission"], g["resource"]) for g in grants} == {
            ("orders-app", "produce", "topic:orders-*"),
            ("orders-app", "consume", "topic:payments"),
        }
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def _wait_for_https(port: int, ca: Path, proc: subprocess.Popen[Any]) -> None:
    import ssl

    context = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, "the broker ended"
        try:
            with urllib.request.urlopen(
                f"https://localhost:{port}/admin/v1/health", timeout=1, context=context
            ):
                return
        except OSError:
            assert time.monotonic() < deadline, "the broker did not answer"
            time.sleep(0.1)


def kafka_sasl_program(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """The Kafka listener's program: a broker that authenticates and serves
    TLS and Kafka; ``orders-app`` granted produce on ``orders-*``, its
    token in app.token and the CA in ca.pem beside the program."""
    from tests.test_kafka_security import SecureKafkaBroker

    assert "orders-app" in block.before and "ca.pem" in block.before
    broker = SecureKafkaBroker(tmp / "data", tmp / "broker.log", tls=True)  # (tmp/cert.pem)
    (tmp / "ca.pem").write_bytes((tmp / "cert.pem").read_bytes())
    broker.start()
    try:
        broker.grant("produce", "topic:orders-*", role="orders-app")
        (tmp / "app.token").write_text(broker.make_token("orders-app") + "\n")
        out = ok(run_python(block.text.replace("broker:9092", broker.bootstrap), tmp))
        assert re.fullmatch(r"aiokafka: offset \d+\nconfluent-kafka: delivered\n", out), out
        assert broker.messages("orders-eu") == 2
    finally:
        broker.stop()
        sys.stderr.write(f"----- broker log -----\n{broker.log()[-5000:]}\n")


def security_application(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """Run by `security_setup`, after the commands before it."""
    assert "The application, in the same folder" in block.before


def synopsis(*command: str) -> Handler:
    """Each option the block names is one ``txnbuf COMMAND ... --help`` lists."""

    def handler(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
        for line in block.text.replace("\\\n", " ").splitlines():
            words = line.split()
            if not words or words[0] != "txnbuf":
                continue
            sub: list[str] = []
            for word in words[1:3]:
                if not re.fullmatch(r"[a-z][a-z-]*", word):
                    break
                sub.append(word)
            assert tuple(sub[: len(command)]) == command, line
            helped = ok(shell(f"txnbuf {' '.join(sub)} --help", tmp))
            for option in re.findall(r"(?<![\w-])--[a-z0-9-]+", line):
                assert option in helped, f"{line}: txnbuf {' '.join(sub)} has no {option}"
            for choice in re.findall(r"\b([A-Z0-9]+(?:\|[A-Z0-9]+)+)\b", line):
                for value in choice.split("|"):
                    assert value in helped, f"{line}: {value} is not among the choices"

    return handler


def acl_file(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    from broker._acl import AclStore

    (tmp / "acl.json").write_text(block.text)
    store = AclStore.load(tmp / "acl.json")
    assert [e.to_json() for e in store.entries()] == json.loads(block.text)["grants"]


def spark_offset(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    from pipelines._source import _offset, positions_of

    offset = json.loads(block.text)
    assert _offset(offset["subscription"], positions_of(offset)) == offset


def tagged_transactions(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    broker: BrokerProcess = request.getfixturevalue("broker")
    script = localize(block.text, broker.url).replace("<query id>", "3f2a9c1e")
    for line in script.splitlines():
        answer = json.loads(ok(shell(line, tmp)))
        assert "transactions" in answer or "aborted" in answer, answer


def cluster_tables(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """docs/scaling.md's tables: the columns of each are those of its CREATE
    TABLE in `cluster.MembershipStore`'s docstring (the statements an
    implementation runs)."""
    import cluster

    spec = cluster.MembershipStore.__doc__ or ""
    for line in block.text.splitlines():
        shown = re.match(r"(\w+)\(([^)]*)\)", line.strip())
        assert shown is not None, line
        table, columns = shown.group(1), [c.strip() for c in shown.group(2).split(",")]
        created = re.search(rf"CREATE TABLE {table} \((.*?)\n\s*\);", spec, re.S)
        assert created is not None, f"no CREATE TABLE {table} in cluster.MembershipStore"
        defined = [c.split()[0] for c in created.group(1).strip().splitlines()]
        assert columns == defined, (table, columns, defined)


def cluster_setup(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """README's cluster: the commands as written (PostgreSQL's programs from
    their folder; as root, run as the ``postgres`` user, since PostgreSQL
    refuses root; its ports and /tmp made the test's), the three brokers
    waited for, then the application block after it, which must print each
    topic's first message."""
    from bench._postgres import postgres_bin

    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server programs")
    ports = {str(p): str(free_port()) for p in (5433, 6650, 6651, 6652)}
    pgtmp = Path(tempfile.mkdtemp(prefix="txnbuf-docs-pg-"))
    as_postgres = "runuser -u postgres -- " if os.geteuid() == 0 else ""
    if as_postgres:
        shutil.chown(pgtmp, "postgres")
    script = block.text.replace("/tmp", str(pgtmp))
    for documented, port in ports.items():
        script = script.replace(documented, port)
    script = re.sub(
        r"^(initdb|pg_ctl) ", lambda m: f"{as_postgres}{bindir}/{m.group(1)} ", script, flags=re.M
    )
    pgdata = pgtmp / "txnbuf-pg"
    log = (tmp / "cluster.log").open("w")
    try:
        done = subprocess.run(
            ["bash", "-e", "-c", f"{script}\njobs -p > {tmp}/pids\n"],
            cwd=tmp,
            env=environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=TIMEOUT,
        )
        assert done.returncode == 0, (tmp / "cluster.log").read_text()[-5000:]
        pids = [int(p) for p in (tmp / "pids").read_text().split()]
        assert len(pids) == 3, "three brokers in the background"
        try:
            for port in (ports["6650"], ports["6651"], ports["6652"]):
                _wait_healthy(port)
            app = next(b for b in ALL_BLOCKS if b.path == block.path and b.line > block.line)
            assert app.lang == "python", "the application follows the commands"
            source = app.text
            for documented, port in ports.items():
                source = source.replace(f"127.0.0.1:{documented}", f"127.0.0.1:{port}")
            out = ok(run_python(source, tmp))
            assert out == (
                "orders b'first orders'\npayments b'first payments'\nrefunds b'first refunds'\n"
            ), out
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            for pid in pids:
                with contextlib.suppress(ChildProcessError, ProcessLookupError):
                    _wait_gone(pid)
    finally:
        log.close()
        subprocess.run(
            [
                *as_postgres.split(),
                f"{bindir}/pg_ctl",
                "-D",
                str(pgdata),
                "-m",
                "immediate",
                "stop",
            ],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(pgtmp, ignore_errors=True)
        sys.stderr.write(f"----- cluster log -----\n{(tmp / 'cluster.log').read_text()[-5000:]}\n")


def _wait_healthy(port: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/v1/health", timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"no broker on {port} within {TIMEOUT}s"
            time.sleep(0.1)


def _wait_gone(pid: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            return
        time.sleep(0.05)


def cluster_application(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """Run by `cluster_setup`, after the commands before it."""
    assert "Give a client any of the brokers' URLs" in block.before


def cluster_answer_sample(block: Block, tmp: Path, request: pytest.FixtureRequest) -> None:
    """GET /admin/v1/cluster's sample answer: JSON that `txnbuf cluster`
    prints (tests/test_cluster_admin.py compares its keys with a real
    cluster's answer)."""
    from broker._admin_cli import cluster_text

    text = cluster_text(json.loads(block.text))
    assert "http://a:6650 pid 41 (this)" in text and "failover" in text, text


# -- every block, and what it gets --------------------------------------------------

SPARK = (pytest.mark.spark,)
KAFKA = (pytest.mark.kafka,)
SLOW = (pytest.mark.slow,)

BLOCKS: dict[tuple[str, str, int], tuple[Handler, tuple[pytest.MarkDecorator, ...]]] = {
    ("README.md", "# 1. install and run the broker (127.0.0.1:6650, data in ./txnbuf-data)", 0): (
        setup_commands,
        SLOW,
    ),
    ("README.md", "import asyncio", 0): (produce_and_consume, ()),
    ("README.md", "import asyncio", 1): (until_interrupted("in", "out"), ()),
    (
        "README.md",
        'p = await client.create_transactional_producer("copier-1", transaction_timeout=60.0)',
        0,
    ): (fragment_of("examples/transactional_producer.py"), ()),
    ("README.md", "from pipelines import spark_session", 0): (spark_copy, SPARK),
    (
        "README.md",
        "# a PostgreSQL server for the cluster (or give --store your own database's URL)",
        0,
    ): (cluster_setup, ()),
    ("README.md", "import asyncio", 2): (cluster_application, ()),
    ("README.md", 'kafka = {"bootstrap_servers": bootstrap}  # "127.0.0.1:9092"', 0): (
        fragment_of("examples/aiokafka_copier.py"),
        (),
    ),
    (
        "docs/architecture.md",
        "proto/          the wire protocol and the coordinator's log records (protobuf),",
        0,
    ): (layout, ()),
    (
        "docs/client.md",
        "batch = await consumer.batch_receive(max_messages=args.batch, timeout=0.1)",
        0,
    ): (fragment_of("examples/consume_transform_produce.py"), ()),
    (
        "docs/operations.md",
        "txnbuf backup ./txnbuf-data /backups/txnbuf-1   # DATA_DIR DEST: a new or empty folder",
        0,
    ): (backup_command, ()),
    (
        "docs/operations.md",
        "txnbuf check-data DIR            # read-only: report what is inconsistent",
        0,
    ): (check_data_commands, ()),
    (
        "docs/operations.md",
        '{"cluster": true, "this": "http://a:6650 pid 41", "slot_count": 64,',
        0,
    ): (cluster_answer_sample, ()),
    ("docs/operations.md", "txnbuf check-data: txnbuf-data/broker.db (read-only)", 0): (
        check_data_sample,
        (),
    ),
    (
        "docs/security.md",
        "# a secret key (HS256), kept by the broker and by whoever makes tokens",
        0,
    ): (security_setup, ()),
    ("docs/security.md", "import asyncio", 0): (security_application, ()),
    ("docs/security.md", "import asyncio", 1): (kafka_sasl_program, KAFKA),
    (
        "docs/security.md",
        "txnbuf token create-key-pair --private-key-file issuer.pem "
        "--public-key-file broker.pub \\",
        0,
    ): (synopsis(), ()),
    (
        "docs/security.md",
        "txnbuf acl grant  --role R --permission produce|consume|two_phase_commit \\",
        0,
    ): (synopsis("acl"), ()),
    (
        "docs/security.md",
        '{"format": 1, "grants": [{"role": "orders-app", "permission": "produce", '
        '"resource": "topic:orders-*"}]}',
        0,
    ): (acl_file, ()),
    (
        "docs/spark.md",
        'from pipelines import spark_session  # a session with format("txnbuf") registered',
        0,
    ): (spark_streaming, SPARK),
    (
        "docs/scaling.md",
        "brokers(id, urls, lease_until)     -- leases by the database's clock, now()",
        0,
    ): (cluster_tables, ()),
    (
        "docs/spark.md",
        '{"subscription": "enrich-orders", "partitions": {"0": [12, 0], "1": [7, 3]}}',
        0,
    ): (spark_offset, ()),
    (
        "docs/spark.md",
        "curl 'http://broker:6650/admin/v1/tagged-transactions?tag=spark:<query id>/&prefix=true'",
        0,
    ): (tagged_transactions, ()),
}


def test_every_block_is_known() -> None:
    """Every block is in BLOCKS (so it runs below), and BLOCKS names no
    block that is gone."""
    found = {b.key: b for b in ALL_BLOCKS}
    unknown = [f"{b} {b.first!r}" for k, b in found.items() if k not in BLOCKS]
    assert not unknown, f"blocks with nothing to run them (add them to BLOCKS): {unknown}"
    gone = [k for k in BLOCKS if k not in found]
    assert not gone, f"BLOCKS names blocks that are gone: {gone}"


@pytest.mark.integration
@pytest.mark.parametrize(
    "block",
    [
        pytest.param(b, id=f"{b.path}:{b.line}", marks=BLOCKS[b.key][1])
        for b in ALL_BLOCKS
        if b.key in BLOCKS
    ],
)
def test_block(block: Block, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    handler, _ = BLOCKS[block.key]
    handler(block, tmp_path, request)


# -- the README's examples table, its options table, its guarantees -----------------

README = (ROOT / "README.md").read_text()
EXAMPLES = re.findall(r"^\| `(\.venv/bin/python examples/[^`]+)` \| (.*) \|$", README, re.M)
EXAMPLE_PROGRAMS = {command.split()[1] for command, _ in EXAMPLES}


@dataclass(frozen=True)
class ExampleRun:
    serve: tuple[str, ...]  # extra `txnbuf serve` options
    address: str  # the option that names the broker
    feed: str | None  # a topic to put 50 messages in first
    done: str  # what it prints at the end


EXAMPLE_RUNS = {
    "examples/consume_transform_produce.py": ExampleRun((), "--url", None, "done: 1000 messages"),
    "examples/transactional_producer.py": ExampleRun((), "--url", "in", "copied 50 messages"),
    "examples/dual_write.py": ExampleRun(("--allow-2pc",), "--url", None, ""),
    "examples/aiokafka_copier.py": ExampleRun(("kafka",), "--bootstrap", "in", "copied 50 records"),
    "examples/spark_transform.py": ExampleRun((), "--service-url", None, ""),  # (test_spark.py)
    "examples/spark_windowed.py": ExampleRun((), "--service-url", None, ""),
    "examples/spark_join.py": ExampleRun((), "--service-url", None, ""),
}


def test_the_examples_table_is_complete() -> None:
    assert EXAMPLES, "the README has an examples table"
    spark_tests = (ROOT / "tests" / "test_spark.py").read_text()
    assert "def test_the_readmes_spark_example_commands_run(" in spark_tests
    assert EXAMPLE_PROGRAMS == set(EXAMPLE_RUNS)
    on_disk = {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")}
    assert on_disk == EXAMPLE_PROGRAMS, "every program in examples/ is in the table"


@pytest.mark.integration
@pytest.mark.parametrize(
    "command",
    [
        pytest.param(c, id=c.split()[1], marks=KAFKA if "kafka" in c else ())
        for c, _ in EXAMPLES
        if "/spark_" not in c  # (tests/test_spark.py runs those, on its Spark session)
    ],
)
def test_example_runs_as_the_readme_says(command: str, tmp_path: Path) -> None:
    """``.venv/bin/python examples/X.py ...`` as written (this venv's
    Python, from a folder of its own: `client` comes from the install, not
    from the repository), against a broker started for it. The Spark
    examples run in tests/test_spark.py
    (`test_the_readmes_spark_example_commands_run`), in-process on its
    Spark session: a JVM each costs half a minute."""
    argv = shlex.split(localize(command, tmp=tmp_path))
    assert argv[0] == ".venv/bin/python", "run with the venv's Python, as the set-up makes it"
    program = argv[1]
    run = EXAMPLE_RUNS[program]
    serve = [a for a in run.serve if a != "kafka"]
    kafka_port = free_port() if "kafka" in run.serve else 0
    if kafka_port:
        serve += ["--kafka-port", str(kafka_port)]
    with started_broker(tmp_path, *serve) as broker:
        address = f"127.0.0.1:{kafka_port}" if run.address == "--bootstrap" else broker.url
        if run.feed:
            send(broker.url, run.feed, [b"message %d" % i for i in range(50)])
        result = subprocess.run(
            [sys.executable, str(ROOT / program), *argv[2:], run.address, address],
            cwd=tmp_path,
            env=environment(),
            capture_output=True,
            text=True,
            timeout=TIMEOUT * 2,
        )
        out = ok(result)
        assert run.done in out, out[-2000:]
        if run.feed:
            assert sorted(committed(broker.url, "out")) == sorted(
                b"MESSAGE %d" % i for i in range(50)
            )


def test_the_options_table_names_every_serve_option() -> None:
    table = README.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    helped = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--help"], capture_output=True, text=True
    ).stdout
    options = set(re.findall(r"(?<![\w-])(--[a-z0-9-]+)", helped)) - {"--help"}
    missing = sorted(o for o in options if not re.search(rf"(?<![\w-]){o}(?![\w-])", table))
    assert not missing, f"serve options missing from the README's Configuration table: {missing}"


def test_every_guarantee_is_held_by_tests_that_exist() -> None:
    section = README.split("## Guarantees", 1)[1].split("\n## ", 1)[0]
    guarantees = re.findall(r"^- \*\*(.+?)\*\*", section, re.M)
    assert len(guarantees) >= 8
    table = (ROOT / "docs" / "guarantees.md").read_text()
    rows = dict(re.findall(r"^\| \*\*(.+?)\*\* \| (.*) \|$", table, re.M))
    assert list(rows) == guarantees, "docs/guarantees.md has a row for each, in order"
    for guarantee, tests in rows.items():
        named = re.findall(r"`(tests/test_\w+\.py)::(test_\w+)`", tests)
        assert named, guarantee
        for path, name in named:
            tree = ast.parse((ROOT / path).read_text())
            defined = {
                n.name
                for n in ast.walk(tree)
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
            }
            assert name in defined, f"{guarantee}: {path}::{name} does not exist"


def test_the_quick_loop_is_the_one_pytest_knows() -> None:
    """The README's quicker loop names a marker pytest knows, which CI's
    command (no -m) does not leave out."""
    quick = re.search(r'`\.venv/bin/python -m pytest -m "([^"]+)"`', README)
    assert quick is not None
    pyproject = (ROOT / "pyproject.toml").read_text()
    for marker in re.findall(r"not (\w+)", quick.group(1)):
        assert f'"{marker}:' in pyproject, marker
    assert (ROOT / ".ci" / "run").read_text().rstrip().endswith("-m pytest"), "CI runs all"
