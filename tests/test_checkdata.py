"""``txnbuf check-data``: the consistency check of a stopped broker's data.

The data comes from a real broker run with transactions (committed and
aborted, sends and acks) or a real SIGKILL; the damage is done on purpose
with sqlite3 in the layout of ledger/_store.py, and each kind must be
reported with its class, repaired by ``--fix`` only where that is safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from broker._checkdata import CLASSES, INFO, PROBLEM, check_data
from broker.cli import main
from buffer import (
    COMMIT_MARKER,
    TXN_DATA,
    CommitMarker,
    TxnAbort,
    TxnCommit,
    decode_sidecar_record,
    entry_count,
    entry_kind,
    entry_meta,
)
from client import Client
from ledger import LedgerError, LedgerStore, ReadOnlyStore
from ledger._writer import MAX_ENTRY_ID, key
from proto import TxnID
from proto import txnbuf_pb2 as pb
from subscriptions import WHOLE_ENTRY
from subscriptions._cursor import SNAPSHOT, TXN_ACK, AckRecord
from tests.conftest import BrokerProcess, until
from tests.test_txn_crash import (
    abort_open_transactions,
    assert_all_or_nothing,
    outcome,
    run_copy,
    setup_topics,
    wait_ended,
)

pytestmark = pytest.mark.integration


def txnbuf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=120
    )


async def wait_all_ended(broker: BrokerProcess) -> None:
    """Until the coordinator has ended every transaction (the aborts of a
    closing client's spare transactions are logged after END answers)."""

    def ended() -> bool:
        _, body = broker.admin("GET", "/admin/v1/transactions")
        return all(
            t["status"] in ("COMMITTED", "ABORTED") for t in json.loads(body)["transactions"]
        )

    await until(ended, "every transaction ended")


async def run_transactions(broker: BrokerProcess) -> tuple[TxnID, TxnID]:
    """Sends and acks committed, others aborted, a read_uncommitted reader;
    returns the ids of the committed and the aborted transaction."""
    status, _ = broker.admin("PUT", "/admin/v1/topics/out", b'{"partitions": 2}')
    assert status == 200
    async with Client(broker.url) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        peek = await client.subscribe(
            "out", "peek", initial_position="earliest", read_uncommitted=True
        )
        producer = await client.create_producer("in")
        for i in range(10):
            await producer.send(b"in-%d" % i)
        out = await client.create_producer("out")
        inputs = [await source.receive(timeout=10) for _ in range(10)]
        async with client.transaction(timeout=30) as committed:
            committed.flush()  # (the full path: markers and sidecar records)
            for i, m in enumerate(inputs[:4]):
                await out.send(m.value + b"-copied", key=f"k{i}", txn=committed)
            await source.acknowledge(inputs[:4], txn=committed)
        aborted = await client.new_transaction(timeout=30)
        aborted.flush()
        for i, m in enumerate(inputs[4:8]):
            await out.send(m.value + b"-dropped", key=f"k{i}", txn=aborted)
        await source.acknowledge(inputs[4:8], txn=aborted)
        await aborted.abort()
        async with client.transaction(timeout=30) as local:  # (one COMMIT_TXN)
            for i, m in enumerate(inputs[8:]):
                await out.send(m.value + b"-local", key=f"k{i}", txn=local)
                await source.acknowledge(m, txn=local)
        got = [await sink.receive(timeout=10) for _ in range(6)]
        await sink.acknowledge(got[:2])
        seen = [await peek.receive(timeout=10) for _ in range(10)]
        await peek.acknowledge(seen)
    await wait_all_ended(broker)
    return (
        (committed.id.most_bits, committed.id.least_bits),
        (aborted.id.most_bits, aborted.id.least_bits),
    )


@contextlib.contextmanager
def database(data_dir: Path) -> Iterator[sqlite3.Connection]:
    with contextlib.closing(sqlite3.connect(data_dir / "broker.db", isolation_level=None)) as db:
        yield db


def ledger_id(db: sqlite3.Connection, name: str) -> int:
    (found,) = db.execute("SELECT id FROM ledgers WHERE name = ?", (name,)).fetchone()
    return int(found)


def entries(db: sqlite3.Connection, name: str) -> list[tuple[int, int, bytes]]:
    lid = ledger_id(db, name)
    rows = db.execute(
        "SELECT id, meta, data FROM entries WHERE id BETWEEN ? AND ? ORDER BY id",
        (key(lid, 0), key(lid, MAX_ENTRY_ID)),
    )
    return [(k & MAX_ENTRY_ID, m, d) for k, m, d in rows]


def append(db: sqlite3.Connection, name: str, meta: int, data: bytes) -> int:
    """Append an entry past the last one (as the ledger would); its entry id."""
    lid = ledger_id(db, name)
    found = entries(db, name)
    nxt = found[-1][0] + 1 if found else 0
    db.execute("INSERT INTO entries(id, meta, data) VALUES (?, ?, ?)", (key(lid, nxt), meta, data))
    return nxt


def markers(db: sqlite3.Connection) -> list[tuple[str, int, bytes, CommitMarker]]:
    """(partition ledger, entry id, data, decoded) of every commit marker of topic out."""
    return [
        (name, e, d, CommitMarker.decode(m, d))
        for name in ("p/out/0", "p/out/1")
        for e, m, d in entries(db, name)
        if entry_kind(m) == COMMIT_MARKER
    ]


def txn_head(txn: TxnID) -> bytes:
    """How sidecar records and markers start: the transaction id, ``>QQ``."""
    return txn[0].to_bytes(8, "big") + txn[1].to_bytes(8, "big")


def txn_text(txn: TxnID) -> str:
    return f"txn ({txn[0]},{txn[1]})"


def classes(report_json: dict) -> dict[str, int]:  # type: ignore[type-arg]
    return {k: v["count"] for k, v in report_json["classes"].items()}


async def test_clean_data_corrupted_on_purpose_then_fixed(broker: BrokerProcess) -> None:
    _, aborted = await run_transactions(broker)
    assert broker.stop() == 0
    data = broker.data_dir

    clean = txnbuf("check-data", str(data))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.rstrip().endswith("result: clean"), clean.stdout
    report = await check_data(data)
    assert report.findings == []
    assert (
        report.counts["commit markers"] >= 1 and report.counts["subscription cursors"] == 5
    )  # 1 + 2 + 2

    with database(data) as db:
        # 1. A sidecar entry that a commit marker names, deleted.
        pname, marker_at, _, decoded = markers(db)[0]
        txn, ids = decoded.txn, decoded.entries
        xname = "x/" + pname[2:]
        db.execute("DELETE FROM entries WHERE id = ?", (key(ledger_id(db, xname), ids[0]),))
        # 2. A commit marker of the transaction the coordinator aborted (with
        # a TXN_DATA record of it to name).
        head = txn_head(aborted)
        record = append(db, xname, entry_meta(TXN_DATA, 0), head)
        forged = head + (1).to_bytes(4, "big") + record.to_bytes(8, "big")
        forged_at = append(db, pname, entry_meta(COMMIT_MARKER, 0), forged)
        # 3. A sidecar ledger of a partition that does not exist.
        db.execute("INSERT INTO ledgers(name) VALUES ('x/gone/0')")
        append(db, "x/gone/0", entry_meta(TXN_DATA, 0), head)

    result = txnbuf("check-data", "--json", str(data))
    assert result.returncode == 1, result.stdout + result.stderr
    found = json.loads(result.stdout)
    by_class = {f["class"]: f for f in found["findings"]}
    assert set(by_class) >= {
        "marker-data-missing",
        "commit-contradicts-coordinator",
        "dangling-ledger",
    }, found["findings"]
    missing = by_class["marker-data-missing"]
    assert missing["objects"] == [f"{pname}@{marker_at}", xname, f"txn ({txn[0]},{txn[1]})"]
    assert missing["repair"] is None and missing["severity"] == PROBLEM
    contradiction = by_class["commit-contradicts-coordinator"]
    assert contradiction["objects"] == [pname, xname, txn_text(aborted)]
    assert "ABORTED at coordinator 0" in contradiction["detail"]
    # Its TXN_ABORT is still in the sidecar (unless swept already): reported;
    # if swept, its marker lacks a TXN_COMMIT, which --fix must not write.
    unrecorded = [f for f in found["findings"] if f["class"] == "commit-unrecorded"]
    if "commit-and-abort" in by_class:
        assert by_class["commit-and-abort"]["objects"] == [pname, xname, txn_text(aborted)]
        assert unrecorded == []
    else:
        assert [f["objects"][0] for f in unrecorded] == [f"{pname}@{forged_at}"]
        assert unrecorded[0]["repair"] is None
    assert by_class["dangling-ledger"]["objects"] == ["x/gone/0"]
    assert by_class["dangling-ledger"]["repair"] == "drop ledger x/gone/0"
    text = txnbuf("check-data", str(data)).stdout
    for kind in ("marker-data-missing", "commit-contradicts-coordinator", "dangling-ledger"):
        assert CLASSES[kind].meaning in text  # the summary says what each class means

    fixed = txnbuf("check-data", "--fix", "--json", str(data))
    assert fixed.returncode == 1, fixed.stdout + fixed.stderr  # problems remain
    done = [f for f in json.loads(fixed.stdout)["findings"] if f["fixed"]]
    assert [f["class"] for f in done] == ["dangling-ledger"]
    after = json.loads(txnbuf("check-data", "--json", str(data)).stdout)
    assert "dangling-ledger" not in classes(after)
    assert classes(after) == {k: v for k, v in classes(found).items() if k != "dangling-ledger"}
    with database(data) as db:
        assert db.execute("SELECT 1 FROM ledgers WHERE name = 'x/gone/0'").fetchone() is None


async def test_fix_completes_a_commit_record_as_the_broker_would(broker: BrokerProcess) -> None:
    """A missing TXN_COMMIT behind a durable marker (what a crash between
    the two leaves) is informational; --fix writes the very record the
    broker's recovery writes, after which the check is clean and the
    broker starts on the data and delivers the transaction once."""
    await run_transactions(broker)
    assert broker.stop() == 0
    with database(broker.data_dir) as db:
        pname, marker_at, _, decoded = markers(db)[0]
        txn = decoded.txn
        xname = "x/" + pname[2:]
        for e, m, d in entries(db, xname):
            if decode_sidecar_record(m, d) == TxnCommit(txn, marker_at):
                db.execute("DELETE FROM entries WHERE id = ?", (key(ledger_id(db, xname), e),))
                break
        else:
            raise AssertionError(f"no TXN_COMMIT of {txn} in {xname}")

    report = await check_data(broker.data_dir)
    assert [(f.kind, f.severity) for f in report.findings] == [("commit-unrecorded", INFO)]
    assert report.exit_code == 0  # informational: the broker completes it on start
    (finding,) = report.findings
    assert finding.repair is not None and finding.repair.ledger == xname

    repaired = await check_data(broker.data_dir, fix=True)
    assert [f.fixed for f in repaired.findings] == [True]
    assert (await check_data(broker.data_dir)).findings == []
    with database(broker.data_dir) as db:
        e, m, d = entries(db, xname)[-1]
        assert decode_sidecar_record(m, d) == TxnCommit(txn, marker_at)

    broker.start()
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        got = [(await sink.receive(timeout=10)).value for _ in range(2)]  # 2 of 4 acked
        assert all(v.endswith(b"-copied") for v in got)


async def test_a_running_broker_is_refused(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("t")
        await producer.send(b"x")
    for args in (
        ["check-data", str(broker.data_dir)],
        ["check-data", "--fix", str(broker.data_dir)],
    ):
        result = txnbuf(*args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "refused" in result.stderr and "in use" in result.stderr, result.stderr
    # ... and the broker was not disturbed.
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        assert (await consumer.receive(timeout=10)).value == b"x"


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    def run(*args: str) -> tuple[int, str]:
        code = main(["check-data", *args])
        return code, capsys.readouterr().err

    code, err = run(str(tmp_path / "nowhere"))
    assert code == 2 and "is not a directory" in err
    code, err = run(str(tmp_path))
    assert code == 2 and "broker.db not found" in err
    assert not (tmp_path / "broker.db").exists()  # nothing created
    code, err = run("--progress-every", "0", str(tmp_path))
    assert code == 2 and "--progress-every" in err
    (tmp_path / "broker.db").write_bytes(b"")
    for fix in ([], ["--fix"]):
        code, err = run(*fix, str(tmp_path))
        assert code == 2 and "not a readable ledger database" in err
        assert (tmp_path / "broker.db").read_bytes() == b""  # (--fix wrote no schema into it)


async def test_progress_lines(run_data: tuple[Path, TxnID, TxnID]) -> None:
    lines: list[str] = []
    report = await check_data(run_data[0], progress=lines.append, progress_every=5)
    assert lines and len(lines) == report.ledgers // 5
    assert lines[-1] == f"checked {5 * len(lines)} of {report.ledgers} ledgers"


def _writer_gone(db: Path, timeout: float = 30.0) -> None:
    """Wait until no broker holds ``db``'s lock: the kernel releases a
    killed broker's lock as the process goes, a moment after the kill."""
    import fcntl
    import os
    import time

    fd = os.open(f"{db}.lock", os.O_RDONLY)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                assert time.monotonic() < deadline, "the writer outlived its broker"
                time.sleep(0.01)
    finally:
        os.close(fd)


@pytest.mark.crash
@pytest.mark.parametrize(
    "step",
    [
        "buffer.after_commit_marker",  # a marker on a partition, no TXN_COMMIT yet
        "buffer.after_txn_data_write",  # inside an open transaction
        "broker.after_local_commit",  # a local transaction durable, not answered
    ],
)
async def test_the_data_a_crash_leaves_has_only_informational_findings(
    broker: BrokerProcess, step: str
) -> None:
    await setup_topics(broker)
    broker.stop()
    broker.env["TXNBUF_FAULT"] = step
    broker.start()
    local = step == "broker.after_local_commit"
    copy = asyncio.create_task(run_copy(broker, full=not local))
    assert broker.proc is not None
    await asyncio.to_thread(broker.proc.wait, 30)  # the fault killed it
    assert f"SIGKILL at {step}" in broker.log()
    await asyncio.to_thread(_writer_gone, broker.data_dir / "broker.db")

    wal = broker.data_dir / "broker.db-wal"
    files = {p: p.read_bytes() for p in (broker.data_dir / "broker.db", wal)}
    assert files[wal], "the crash left no WAL to read"
    report = await check_data(broker.data_dir)
    # Read-only: the database and its WAL are as the crash left them (SQLite
    # rebuilds its index of the WAL, broker.db-shm, as any reader does).
    assert {p: p.read_bytes() for p in files} == files
    assert report.exit_code == 0, report.text()
    assert {f.severity for f in report.findings} == {INFO}, report.text()
    kinds = {f.kind for f in report.findings}
    if step == "buffer.after_commit_marker":
        assert {"to-finish", "commit-unrecorded"} <= kinds, report.text()
    elif local:
        assert "to-finish" not in kinds, report.text()  # all of it, done (OPEN: its spare)
    else:
        # Open at its coordinator; or decided already, when the client was
        # that fast (see tests/test_txn_crash.py).
        assert kinds & {"open-at-coordinator", "to-finish"}, report.text()

    broker.env.pop("TXNBUF_FAULT")
    broker.start()  # recovers as it would have without the check
    if await copy is not None:
        await abort_open_transactions(broker)
    await wait_ended(broker)
    assert_all_or_nothing(*await outcome(broker))


# -- one damage per class, on a copy of one real broker run's data -------------------


@dataclass
class Damage:
    """What a case works on: the data of `run_transactions`, open in sqlite3."""

    db: sqlite3.Connection
    committed: TxnID
    aborted: TxnID
    pname: str  # the partition with the committed transaction's marker
    xname: str  # its sidecar
    marker_at: int
    marker: bytes

    def new_ledger(self, name: str, *rows: tuple[int, bytes]) -> None:
        self.db.execute("INSERT INTO ledgers(name) VALUES (?)", (name,))
        for meta, data in rows:
            append(self.db, name, meta, data)

    def input_position(self, n: int) -> tuple[int, int]:
        """Where input message ``n`` of topic in is (entry id, batch index)."""
        places = [(e, i) for e, m, _ in entries(self.db, "p/in/0") for i in range(entry_count(m))]
        return places[n]


def ack(kind: int, txn: TxnID | None, *positions: tuple[int, int]) -> tuple[int, bytes]:
    record = AckRecord(kind, positions, txn)
    return record.kind, record.encode()


def cursor_snapshot(md: tuple[int, int]) -> tuple[int, bytes]:
    return SNAPSHOT, json.dumps({"md": list(md), "acked": [], "pending_ack": []}).encode()


def _duplicate_marker(d: Damage) -> None:
    (meta,) = [m for e, m, _ in entries(d.db, d.pname) if e == d.marker_at]
    append(d.db, d.pname, meta, d.marker)


def _count_mismatch(d: Damage) -> None:
    lid = ledger_id(d.db, d.pname)
    d.db.execute("UPDATE entries SET meta = meta + 1 WHERE id = ?", (key(lid, d.marker_at),))


def _record_without_marker(d: Damage) -> None:
    last = entries(d.db, d.pname)[-1][0]
    append(d.db, d.xname, *reversed(TxnCommit(TxnID(0, 999), last + 5).encode()))


def _abort_of_committed(d: Damage) -> None:
    append(d.db, d.xname, *reversed(TxnAbort(d.committed).encode()))


def _data_of_committed_elsewhere(d: Damage) -> None:
    d.new_ledger("x/in/0", (entry_meta(TXN_DATA, 1), txn_head(d.committed)))


def _data_of_aborted_left_open(d: Damage) -> None:
    d.new_ledger("x/in/0", (entry_meta(TXN_DATA, 1), txn_head(d.aborted)))


def _pending_ack_of(txn: str) -> Callable[[Damage], None]:
    def damage(d: Damage) -> None:
        held = d.committed if txn == "committed" else d.aborted
        # Input 5 was acknowledged in the aborted transaction: PENDING again.
        append(d.db, "c/in/0/copier", *ack(TXN_ACK, held, d.input_position(5)))

    return damage


def _cursor_past_end(d: Damage) -> None:
    last = entries(d.db, "p/in/0")[-1][0]
    append(d.db, "c/in/0/copier", *cursor_snapshot((last + 10, WHOLE_ENTRY)))


def _cursor_behind_trim(d: Damage) -> None:
    append(d.db, "c/in/0/copier", *cursor_snapshot((-1, WHOLE_ENTRY)))
    lid = ledger_id(d.db, "p/in/0")
    d.db.execute("DELETE FROM entries WHERE id >= ? AND id < ?", (key(lid, 0), key(lid, 2)))
    d.db.execute("UPDATE ledgers SET first_entry_id = 2, next_entry_id = 2 WHERE id = ?", (lid,))


def _orphan_partition(d: Damage) -> None:
    d.new_ledger("p/ghost/0", (entry_meta(0, 1), b""))
    d.new_ledger("c/ghost/0/s", cursor_snapshot((-1, WHOLE_ENTRY)))


def _dangling(d: Damage) -> None:
    d.new_ledger("x/gone/3", (entry_meta(TXN_DATA, 1), txn_head(d.committed)))
    d.new_ledger("c/gone/3/s", cursor_snapshot((-1, WHOLE_ENTRY)))
    d.new_ledger("c/out/7/s", cursor_snapshot((-1, WHOLE_ENTRY)))  # (out has 2 partitions)


def log_transaction(
    d: Damage, txn: TxnID, status: int, partitions: tuple[tuple[str, int], ...] = ()
) -> None:
    """Log ``txn`` at coordinator 0 as the coordinator does: NEW, then an
    update from OPEN to ``status`` naming ``partitions``."""
    Record = pb.TransactionMetadataEntry
    new = Record(
        metadata_op=Record.NEW,
        txnid_most_bits=txn[0],
        txnid_least_bits=txn[1],
        new_status=pb.OPEN,
        txn_timeout_ms=60_000,
    )
    update = Record(
        metadata_op=Record.UPDATE,
        txnid_most_bits=txn[0],
        txnid_least_bits=txn[1],
        expected_status=pb.OPEN,
        new_status=status,  # type: ignore[arg-type]
    )
    for topic, index in partitions:
        update.partitions.add(topic=topic, partition=index)
    for record in (new, update):
        append(d.db, "tc/0", 0, record.SerializeToString())


def _dangling_but_named_by_a_decision(d: Damage) -> None:
    d.new_ledger("x/gone/3", (entry_meta(TXN_DATA, 1), txn_head((1, 9999))))
    log_transaction(d, (1, 9999), pb.COMMITTING, (("gone", 3),))


def _prepared(d: Damage) -> None:
    # (its sends on x/in/0: open there, as a prepared transaction's are)
    d.new_ledger("x/in/0", (entry_meta(TXN_DATA, 1), txn_head((1, 9999))))
    log_transaction(d, (1, 9999), pb.PREPARED)


def _leftover(d: Damage) -> None:
    d.new_ledger("u/in/0/nobody", (0, b'{"md": -1, "acked": []}'))


def _unknown(d: Damage) -> None:
    d.new_ledger("backup/x")


def _torn_cursor_record(d: Damage) -> None:
    append(d.db, "c/in/0/copier", 9, b"?")


# (damage, the classes then found, whether --fix repairs them all)
CASES: dict[str, tuple[Callable[[Damage], None], dict[str, int], bool]] = {
    "duplicate-marker": (_duplicate_marker, {"duplicate-marker": 1}, False),
    "marker-data-mismatch": (_count_mismatch, {"marker-data-mismatch": 1}, False),
    "commit-record-without-marker": (
        _record_without_marker,
        {"commit-record-without-marker": 1},
        False,
    ),
    "abort-contradicts-coordinator": (
        _abort_of_committed,
        {"abort-contradicts-coordinator": 1, "commit-and-abort": 1},
        False,
    ),
    "commit-not-applied": (_data_of_committed_elsewhere, {"commit-not-applied": 1}, False),
    "orphan-open-txn": (_data_of_aborted_left_open, {"orphan-open-txn": 1}, True),
    "stale-pending-ack": (_pending_ack_of("aborted"), {"stale-pending-ack": 1}, True),
    "pending-ack-of-committed": (
        _pending_ack_of("committed"),
        {"pending-ack-of-committed": 1},
        False,
    ),
    "cursor-past-end": (_cursor_past_end, {"cursor-past-end": 1}, False),
    "cursor-behind-trim": (_cursor_behind_trim, {"cursor-behind-trim": 1}, False),
    "orphan-partition": (_orphan_partition, {"orphan-partition": 1}, False),
    "dangling-ledger": (_dangling, {"dangling-ledger": 3}, True),
    # (not dropped: the coordinator is to tell it the decision on start)
    "dangling-ledger named by a decision": (
        _dangling_but_named_by_a_decision,
        {"dangling-ledger": 1, "to-finish": 1},
        False,
    ),
    "prepared-at-coordinator": (_prepared, {"prepared-at-coordinator": 1}, False),
    "leftover-ledger": (_leftover, {"leftover-ledger": 1}, True),
    "unknown-ledger": (_unknown, {"unknown-ledger": 1}, False),
    "unreadable": (_torn_cursor_record, {"unreadable": 1}, False),
}


@pytest.fixture(scope="module")
def run_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TxnID, TxnID]:
    """The data of one real broker run of `run_transactions`, stopped."""
    base = tmp_path_factory.mktemp("run")
    proc = BrokerProcess(base / "data", base / "broker.log")
    proc.start()
    try:
        committed, aborted = asyncio.run(run_transactions(proc))
    finally:
        assert proc.stop() == 0, proc.log()
    return base / "data", committed, aborted


def test_every_class_has_a_case() -> None:
    informational_from_crashes = {"to-finish", "open-at-coordinator", "commit-unrecorded"}
    covered = {k for _, found, _ in CASES.values() for k in found}
    covered |= {"marker-data-missing", "commit-contradicts-coordinator"}  # (the first test)
    assert set(CLASSES) == covered | informational_from_crashes


@pytest.mark.parametrize("case", list(CASES))
async def test_each_damage_is_reported_with_its_class(
    case: str, run_data: tuple[Path, TxnID, TxnID], tmp_path: Path
) -> None:
    damage, expected, repairable = CASES[case]
    source, committed, aborted = run_data
    data = tmp_path / "data"
    shutil.copytree(source, data)
    with database(data) as db:
        pname, marker_at, marker, _ = markers(db)[0]
        damage(Damage(db, committed, aborted, pname, "x/" + pname[2:], marker_at, marker))

    report = await check_data(data)
    assert dict(report.by_class()) == expected, report.text()
    severity = {CLASSES[k].severity for k in expected}
    assert report.exit_code == (1 if PROBLEM in severity else 0)
    assert all((f.repair is not None) == repairable for f in report.findings), report.text()

    fixed = await check_data(data, fix=True)
    assert [f.fixed for f in fixed.findings] == [repairable] * len(fixed.findings)
    after = await check_data(data)
    assert dict(after.by_class()) == ({} if repairable else expected), after.text()


# -- the read-only store -------------------------------------------------------------


async def test_read_only_store_reads_what_the_store_wrote_and_locks_out_writers(
    tmp_path: Path,
) -> None:
    db = tmp_path / "broker.db"
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("l")
    for i in range(10):
        await ledger.append(b"e%d" % i, meta=i)
    await ledger.trim(4)
    await store.open_ledger("empty")
    with pytest.raises(LedgerError, match="in use"):
        ReadOnlyStore.open(db)  # (its writer holds the lock)
    await store.close()

    ro = ReadOnlyStore.open(db)
    try:
        assert ro.ledger_names() == ["empty", "l"]
        got = ro.get_ledger("l")
        assert got is not None and (got.first_entry_id, got.last_entry_id) == (4, 9)
        assert [(e.entry_id, e.meta, e.data) for e in await got.read(0, 100)] == [
            (i, i, b"e%d" % i) for i in range(4, 10)
        ]
        assert await got.read_meta() == [(i, i) for i in range(4, 10)]
        empty = ro.get_ledger("empty")
        assert empty is not None and empty.last_entry_id == empty.first_entry_id - 1
        # A broker cannot open the data while it is being checked.
        with pytest.raises(LedgerError, match="in use"):
            await LedgerStore.open(db, lock_wait=0.3)
    finally:
        ro.close()
    store = await LedgerStore.open(db, lock_wait=5)
    reopened = store.get_ledger("l")
    assert reopened is not None and (reopened.first_entry_id, reopened.last_entry_id) == (4, 9)
    await store.close()


def test_read_only_store_refuses_what_is_not_a_ledger_database(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="does not exist"):
        ReadOnlyStore.open(tmp_path / "none.db")
    (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
    with pytest.raises(LedgerError, match="not a readable ledger database"):
        ReadOnlyStore.open(tmp_path / "junk.db")
    assert (tmp_path / "junk.db").read_bytes() == b"not a database" * 100


def test_every_class_is_documented() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    assert "## Checking the data" in doc
    for kind in CLASSES:
        assert f"| `{kind}` |" in doc, kind
