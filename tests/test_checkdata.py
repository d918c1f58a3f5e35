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
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker._checkdata import CLASSES, INFO, PROBLEM, check_data
from buffer import (
    COMMIT_MARKER,
    TXN_COMMIT,
    TXN_DATA,
    decode_commit_marker,
    decode_sidecar_record,
    entry_kind,
    entry_meta,
)
from client import Client
from ledger._writer import MAX_ENTRY_ID, key
from tests.conftest import BrokerProcess
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
    for _ in range(100):
        _, body = broker.admin("GET", "/admin/v1/transactions")
        if all(t["status"] in ("COMMITTED", "ABORTED") for t in json.loads(body)["transactions"]):
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"transactions did not end: {body!r}")


async def run_transactions(broker: BrokerProcess) -> str:
    """Sends and acks committed, others aborted, a read_uncommitted reader;
    returns the id of the aborted transaction."""
    status, _ = broker.admin("PUT", "/admin/v1/topics/out", b'{"partitions": 2}')
    assert status == 200
    async with Client(broker.url) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        peek = await client.subscribe(
            "out", "peek", initial_position="earliest", read_uncommitted=True
        )
        producer = await client.create_producer("in")
        for i in range(8):
            await producer.send(b"in-%d" % i)
        out = await client.create_producer("out")
        inputs = [await source.receive(timeout=10) for _ in range(8)]
        async with client.transaction(timeout=30) as txn:
            for i, m in enumerate(inputs[:4]):
                await out.send(m.value + b"-copied", key=f"k{i}", txn=txn)
            await source.acknowledge(inputs[:4], txn=txn)
        aborted = await client.new_transaction(timeout=30)
        for i, m in enumerate(inputs[4:]):
            await out.send(m.value + b"-dropped", key=f"k{i}", txn=aborted)
        await source.acknowledge(inputs[4:], txn=aborted)
        await aborted.abort()
        got = [await sink.receive(timeout=10) for _ in range(4)]
        await sink.acknowledge(got[:2])
        seen = [await peek.receive(timeout=10) for _ in range(8)]
        await peek.acknowledge(seen)
    await wait_all_ended(broker)
    return str(aborted.id)


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


def markers(db: sqlite3.Connection) -> list[tuple[str, int, bytes]]:
    """(partition ledger, entry id, data) of every commit marker of topic out."""
    return [
        (name, e, d)
        for name in ("p/out/0", "p/out/1")
        for e, m, d in entries(db, name)
        if entry_kind(m) == COMMIT_MARKER
    ]


def classes(report_json: dict) -> dict[str, int]:  # type: ignore[type-arg]
    return {k: v["count"] for k, v in report_json["classes"].items()}


async def test_clean_data_corrupted_on_purpose_then_fixed(broker: BrokerProcess) -> None:
    aborted = await run_transactions(broker)
    assert broker.stop() == 0
    data = broker.data_dir

    clean = txnbuf("check-data", str(data))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert clean.stdout.rstrip().endswith("result: clean"), clean.stdout
    report = await check_data(data)
    assert report.findings == []
    assert report.counts["commit markers"] >= 1 and report.counts["subscription cursors"] == 5  # 1 + 2 + 2

    with database(data) as db:
        # 1. A sidecar entry that a commit marker names, deleted.
        pname, marker_at, marker = markers(db)[0]
        txn, ids = decode_commit_marker(marker)
        xname = "x/" + pname[2:]
        db.execute("DELETE FROM entries WHERE id = ?", (key(ledger_id(db, xname), ids[0]),))
        # 2. A commit marker of the transaction the coordinator aborted (with
        # a TXN_DATA record of it to name).
        most, least = (int(x) for x in aborted.strip("()").split(","))
        head = most.to_bytes(8, "big") + least.to_bytes(8, "big")
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
    assert contradiction["objects"] == [pname, xname, f"txn {aborted}"]
    assert "ABORTED at coordinator 0" in contradiction["detail"]
    # Its TXN_ABORT is still in the sidecar (unless swept already): reported;
    # if swept, its marker lacks a TXN_COMMIT, which --fix must not write.
    unrecorded = [f for f in found["findings"] if f["class"] == "commit-unrecorded"]
    if "commit-and-abort" in by_class:
        assert by_class["commit-and-abort"]["objects"] == [pname, xname, f"txn {aborted}"]
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
        pname, marker_at, marker = markers(db)[0]
        txn, _ = decode_commit_marker(marker)
        xname = "x/" + pname[2:]
        for e, m, d in entries(db, xname):
            if entry_kind(m) == TXN_COMMIT and decode_sidecar_record(m, d)[1] == txn:
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
        assert decode_sidecar_record(m, d) == (TXN_COMMIT, txn, marker_at)

    broker.start()
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        got = [(await sink.receive(timeout=10)).value for _ in range(2)]  # 2 of 4 acked
        assert all(v.endswith(b"-copied") for v in got)


async def test_a_running_broker_is_refused(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("t")
        await producer.send(b"x")
    for args in (["check-data", str(broker.data_dir)], ["check-data", "--fix", str(broker.data_dir)]):
        result = txnbuf(*args)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "refused" in result.stderr and "in use" in result.stderr, result.stderr
    # ... and the broker was not disturbed.
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        assert (await consumer.receive(timeout=10)).value == b"x"


def test_usage_errors(tmp_path: Path) -> None:
    result = txnbuf("check-data", str(tmp_path / "nowhere"))
    assert result.returncode == 2 and "is not a directory" in result.stderr
    result = txnbuf("check-data", str(tmp_path))
    assert result.returncode == 2 and "broker.db not found" in result.stderr
    assert not (tmp_path / "broker.db").exists()  # nothing created
    result = txnbuf("check-data", "--progress-every", "0", str(tmp_path))
    assert result.returncode == 2 and "--progress-every" in result.stderr


async def test_progress_lines(broker: BrokerProcess) -> None:
    await run_transactions(broker)
    assert broker.stop() == 0
    lines: list[str] = []
    report = await check_data(broker.data_dir, progress=lines.append, progress_every=5)
    assert lines and len(lines) == report.ledgers // 5
    assert lines[-1] == f"checked {5 * len(lines)} of {report.ledgers} ledgers"


@pytest.mark.crash
@pytest.mark.parametrize(
    "step",
    [
        "buffer.after_commit_marker",  # a marker on a partition, no TXN_COMMIT yet
        "buffer.after_txn_data_write",  # inside an open transaction
    ],
)
async def test_the_data_a_crash_leaves_has_only_informational_findings(
    broker: BrokerProcess, step: str
) -> None:
    await setup_topics(broker)
    broker.stop()
    broker.env["TXNBUF_FAULT"] = step
    broker.start()
    copy = asyncio.create_task(run_copy(broker))
    assert broker.proc is not None
    await asyncio.to_thread(broker.proc.wait, 30)  # the fault killed it
    assert f"SIGKILL at {step}" in broker.log()

    report = await check_data(broker.data_dir)
    assert report.exit_code == 0, report.text()
    assert {f.severity for f in report.findings} == {INFO}, report.text()
    kinds = {f.kind for f in report.findings}
    if step == "buffer.after_commit_marker":
        assert {"to-finish", "commit-unrecorded"} <= kinds, report.text()
    else:
        assert "open-at-coordinator" in kinds, report.text()

    broker.env.pop("TXNBUF_FAULT")
    broker.start()  # recovers as it would have without the check
    if await copy is not None:
        await abort_open_transactions(broker)
    await wait_ended(broker)
    assert_all_or_nothing(*await outcome(broker))
