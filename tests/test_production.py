"""Running txnbuf in production, as docs/operations.md tells it: an online
backup of a broker under transactional load, checked and started; the data
format version (an older directory opened and stamped, a newer one refused
in one line, changing nothing); the systemd unit in docs/ as systemd reads
it and as its ExecStart runs; the log format and levels the page states."""

from __future__ import annotations

import asyncio
import configparser
import re
import shlex
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from broker.cli import LOG_FORMAT, LOG_LEVELS
from client import Client
from ledger._writer import FORMAT_VERSION
from tests.conftest import BrokerProcess, free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
OPERATIONS = (ROOT / "docs" / "operations.md").read_text()
UNIT = ROOT / "docs" / "txnbuf.service"
PER_TXN = 10


def txnbuf(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=timeout
    )


async def _copy_in_transactions(
    url: str, stop: asyncio.Event, committed: list[int], going: asyncio.Event
) -> None:
    """Commit transactions of PER_TXN numbered messages to ``copied`` until
    ``stop``; ``committed`` counts the messages of those whose commit
    returned; ``going`` is set after 200."""
    async with Client(url) as client:
        producer = await client.create_producer("copied")
        n = 0
        while not stop.is_set():
            async with client.transaction(timeout=30) as txn:
                for _ in range(PER_TXN):
                    await producer.send(str(n).encode(), txn=txn)
                    n += 1
            committed.append(n)
            if n >= 200:
                going.set()


async def test_an_online_backup_under_load_is_consistent_and_starts(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """The copy holds every transaction committed before the backup began,
    whole transactions only (a prefix of the committed ones), passes
    check-data, and a broker started on it serves them."""
    async with Client(broker.url) as client:  # (its subscription keeps every message)
        await (await client.subscribe("copied", "audit", initial_position="earliest")).close()
    stop, going, committed = asyncio.Event(), asyncio.Event(), [0]
    load = asyncio.create_task(_copy_in_transactions(broker.url, stop, committed, going))
    await asyncio.wait_for(going.wait(), 60)
    before = committed[-1]
    backup = await asyncio.to_thread(txnbuf, "backup", str(broker.data_dir), str(tmp_path / "bk"))
    during = committed[-1]
    stop.set()
    await load
    assert backup.returncode == 0, backup.stderr + backup.stdout
    # (informational findings are expected: a crash image has transactions
    # decided and not yet told to every participant, which a start finishes)
    assert re.search(r"^result: (clean|no problems)", backup.stdout, re.M), backup.stdout
    assert committed[-1] > before, "the broker went on committing"
    copy = BrokerProcess(tmp_path / "bk", tmp_path / "copy.log")
    copy.start()
    try:
        async with Client(copy.url) as client:
            audit = await client.subscribe("copied", "audit", initial_position="earliest")
            values: list[int] = []
            while batch := await audit.batch_receive(max_messages=1000, timeout=2.0):
                values += [int(m.value) for m in batch]
        assert values == list(range(len(values))), "in order, no gap, no duplicate"
        assert len(values) % PER_TXN == 0, "whole transactions only"
        assert before <= len(values) <= committed[-1], (before, len(values), during)
    finally:
        copy.stop()


def test_backup_refuses_a_folder_in_use_and_copies_nothing(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "dest").mkdir()
    (tmp_path / "dest" / "keep").write_text("x")
    result = txnbuf("backup", str(tmp_path / "data"), str(tmp_path / "dest"))
    assert result.returncode == 2 and "no broker.db in" in result.stderr
    assert [p.name for p in (tmp_path / "dest").iterdir()] == ["keep"]


def _version(db: Path) -> int:
    with sqlite3.connect(db) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


def _set_version(db: Path, version: int) -> None:
    conn = sqlite3.connect(db)
    try:
        conn.execute(f"PRAGMA user_version = {version}")
    finally:
        conn.close()


async def test_the_data_format_is_stamped_upgraded_and_a_newer_one_refused(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    db = broker.data_dir / "broker.db"
    broker.start()
    async with Client(broker.url) as client:
        await (await client.create_producer("kept")).send(b"before")
    broker.stop()
    assert _version(db) == FORMAT_VERSION
    # A directory from before the stamp (version 0) opens, and is stamped.
    _set_version(db, 0)
    broker.start()
    broker.stop()
    assert _version(db) == FORMAT_VERSION
    # A newer format: one line, exit 1, nothing changed.
    _set_version(db, FORMAT_VERSION + 1)
    size = db.stat().st_size
    result = txnbuf("serve", "--data-dir", str(broker.data_dir), "--port", str(free_port()))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"txnbuf: cannot open the data in {broker.data_dir}: {db} holds data of format "
        f"{FORMAT_VERSION + 1}, written by a newer txnbuf; this one reads formats up to "
        f"{FORMAT_VERSION}: run the newer txnbuf, or restore a backup taken before the upgrade"
    ]
    assert _version(db) == FORMAT_VERSION + 1 and db.stat().st_size == size
    checked = txnbuf("check-data", str(broker.data_dir))
    assert checked.returncode == 2 and "written by a newer txnbuf" in checked.stderr
    # Put back, the data is all there.
    _set_version(db, FORMAT_VERSION)
    broker.start()
    try:
        async with Client(broker.url) as client:
            reader = await client.subscribe("kept", "r", initial_position="earliest")
            assert (await reader.receive(timeout=10)).value == b"before"
    finally:
        broker.stop()


def _unit() -> configparser.RawConfigParser:
    unit = configparser.RawConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]
    unit.read_string(UNIT.read_text())
    return unit


def test_the_systemd_unit_is_valid_for_systemd(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze is not None, "scripts/install-system-deps installs systemd"
    installed = str(Path(sys.executable).parent / "txnbuf")
    local = tmp_path / "txnbuf.service"
    local.write_text(UNIT.read_text().replace("/opt/txnbuf/.venv/bin/txnbuf", installed))
    result = subprocess.run(
        [analyze, "verify", str(local)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "txnbuf.service" not in result.stderr, result.stderr  # (no warning about it)


def test_the_systemd_units_command_starts_and_stops_on_its_kill_signal(tmp_path: Path) -> None:
    """ExecStart as written (the data directory and port moved to this
    test's), stopped with KillSignal: clean, exit 0, within TimeoutStopSec."""
    service = _unit()["Service"]
    argv = shlex.split(service["ExecStart"])
    assert argv[0] == "/opt/txnbuf/.venv/bin/txnbuf" and argv[1] == "serve"
    assert service["StateDirectory"] == "txnbuf" and "/var/lib/txnbuf" in argv
    port = free_port()
    moved = {"/var/lib/txnbuf": str(tmp_path / "data"), "6650": str(port)}
    argv = [sys.executable, "-m", "broker", *(moved.get(a, a) for a in argv[1:])]
    log = (tmp_path / "journal").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "journal").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/admin/v1/health", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the broker did not answer"
                time.sleep(0.05)
        proc.send_signal(getattr(signal, service["KillSignal"]))
        assert proc.wait(timeout=float(service["TimeoutStopSec"])) == 0
    finally:
        proc.kill()
        proc.wait()
        log.close()
    journal = (tmp_path / "journal").read_text()
    assert journal.rstrip().endswith("INFO txnbuf: stopped"), journal[-2000:]
    for line in journal.splitlines():  # the documented format, every line
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ [\w.]+: .*", line), line


def test_the_log_format_and_levels_are_those_serve_help_and_the_docs_state() -> None:
    help_text = " ".join(txnbuf("serve", "--help").stdout.split())
    levels = ", ".join(LOG_LEVELS)
    assert f"--log-level LEVEL {levels} (INFO)" in help_text
    assert LOG_FORMAT in help_text
    logs = OPERATIONS.split("### Logs", 1)[1].split("###", 1)[0]
    assert f"`{LOG_FORMAT}`" in logs
    assert f"one of {levels} (default INFO)" in " ".join(logs.split())


def test_a_test_broker_whose_port_was_taken_starts_on_another(tmp_path: Path) -> None:
    """The fixtures' broker on a shared machine: a port chosen free and
    taken before the broker binds it makes it take another (once started,
    a broker keeps its port)."""
    import socket

    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    taken = broker.port
    with socket.create_server(("127.0.0.1", taken)):
        broker.start()
        try:
            assert broker.port != taken
        finally:
            broker.stop()
