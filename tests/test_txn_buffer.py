"""The transaction buffer (PIP-31 sidecar approach) on a real LedgerStore.

Transactional sends go to the sidecar ledger ``x/{topic}/{index}``; COMMIT
appends a marker to the partition ledger that materializes into the
transaction's messages; ABORT leaves them for the sweep. Crash tests make
`faults.hit` raise at a step, then close and reopen the store.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from conftest import Crash

import buffer._txnbuffer as txnbuffer_module
import buffer._txnindex as txnindex_module
import ledger._store as ledger_store
from buffer import (
    COMMIT_MARKER,
    DATA,
    Partition,
    PartitionTxnState,
    PublishResult,
    SendRejectedError,
    Topics,
    TransactionBuffer,
    TransactionBufferError,
    TxnConflictError,
    TxnEndedError,
    TxnInfo,
    entry_count,
    entry_kind,
    entry_meta,
    sidecar_ledger_name,
    txn_run_start,
)
from buffer._entries import txn_places
from buffer._sidecar import TXN_ABORT, TXN_COMMIT, TXN_DATA, TXN_SNAPSHOT
from ledger import Entry, LedgerStore
from proto import txnbuf_pb2 as pb

T1, T2, T3 = (1 << 48 | 1, 7), (1 << 48 | 2, 8), (2 << 48 | 3, 9)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "broker.db"


class Stores:
    """The store a test works on; `reopen` closes it and opens the database again."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.store: LedgerStore | None = None

    async def open(self) -> tuple[LedgerStore, Partition]:
        self.store = await LedgerStore.open(self.db)
        topics = await Topics.load(self.store)
        topic = topics.get("t") or await topics.create("t", 1)
        return self.store, topic.partitions[0]

    async def reopen(self) -> tuple[LedgerStore, Partition]:
        await self.close()
        return await self.open()

    async def close(self) -> None:
        if self.store is not None:
            await settle(self.store)
            await self.store.close()
            self.store = None


@pytest.fixture
async def stores(db: Path) -> AsyncIterator[Stores]:
    s = Stores(db)
    try:
        yield s
    finally:
        await s.close()


async def settle(store: LedgerStore) -> None:
    """Wait until fire-and-forget writes (snapshots) are committed (see test_partition)."""
    if store._failed is not None:
        return  # a failed store writes nothing more
    barrier = await store.open_ledger("test/barrier")
    for _ in range(4):
        await barrier.append(b"")
    assert not store._queue


def msgs(*seqs: int, tag: str = "m") -> list[pb.SingleMessage]:
    return [pb.SingleMessage(payload=f"{tag}{s}".encode(), sequence_id=s) for s in seqs]


def txn_ids(start: int, n: int) -> PublishResult:
    return PublishResult(-1, None, start)


def loaded(part: Partition) -> TransactionBuffer:
    """The transaction buffer `Partition.load` recovered (it must exist)."""
    tb = part.transaction_buffer
    assert tb is not None, "the sidecar log was not loaded"
    return tb


async def sidecar_kinds(tb: TransactionBuffer) -> list[int]:
    return [entry_kind(m) for _, m in await tb.sidecar.read_meta()]


async def markers(part: Partition) -> list[tuple[int, int]]:
    """(entry id, message count) of every commit marker in the partition ledger."""
    return [
        (e, entry_count(m))
        for e, m in await part.ledger.read_meta()
        if entry_kind(m) == COMMIT_MARKER
    ]


async def delivered(part: Partition, entry_id: int) -> list[bytes]:
    """The payloads a consumer gets for partition entry ``entry_id``."""
    (entry,) = await part.ledger.read(entry_id, entry_id)
    batch = pb.EntryBatch.FromString(await part.materialize(entry))
    assert len(batch.messages) == entry_count(entry.meta)
    return [m.payload for m in batch.messages]


# -- creation --------------------------------------------------------------------------


async def test_sidecar_is_created_on_first_use_only(stores: Stores) -> None:
    store, part = await stores.open()
    await part.publish("p", msgs(0))
    assert part.transaction_buffer is None
    assert store.get_ledger(sidecar_ledger_name("t", 0)) is None
    a, b = await asyncio.gather(part.txn_buffer(), part.txn_buffer())
    assert a is b is part.transaction_buffer
    assert await part.txn_buffer() is a
    assert a.sidecar.name == "x/t/0"

    store, part = await stores.reopen()  # an empty sidecar is loaded again
    assert part.transaction_buffer is not None
    assert part.transaction_buffer.transactions() == []


async def test_partition_without_sidecar_cannot_materialize_a_marker(stores: Stores) -> None:
    _, part = await stores.open()
    marker = Entry(0, entry_meta(COMMIT_MARKER, 1), b"")
    with pytest.raises(TransactionBufferError, match="no transaction log"):
        await part.materialize(marker)
    data = Entry(0, entry_meta(DATA, 1), b"stored")
    assert await part.materialize(data) == b"stored"


# -- publish, commit, materialize ------------------------------------------------------


async def test_publish_commit_materialize(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    assert await part.publish("plain", msgs(0)) == PublishResult(0, None)
    assert await tb.publish(T1, "p", msgs(0, 1, tag="a")) == txn_ids(0, 2)
    assert await tb.publish(T2, "q", msgs(5, tag="b")) == txn_ids(0, 1)
    assert await tb.publish(T1, "p", msgs(2, tag="a")) == txn_ids(2, 1)
    assert await tb.publish(T1, "r", msgs(0, 3, tag="c")) == txn_ids(3, 2)  # another producer
    assert await sidecar_kinds(tb) == [TXN_DATA] * 4
    # Nothing is visible in the partition before the commit.
    assert part.ledger.last_entry_id == 0
    assert tb.open_transactions() == [T1, T2]
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.OPEN, 5, -1, (0, 2, 3))

    await tb.end(T1, commit=True)
    assert await markers(part) == [(1, 5)]
    assert part.count(1) == 5
    await tb.settled()  # END answers at the durable marker; its TXN_COMMIT follows
    assert await sidecar_kinds(tb) == [TXN_DATA] * 4 + [TXN_COMMIT]
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 5, 1, ())
    assert tb.open_transactions() == [T2]
    assert await delivered(part, 1) == [b"a0", b"a1", b"a2", b"c0", b"c3"]
    # Message i of the transaction is (partition, marker entry id, i): the batch
    # index of the materialized entry is the index answered at send time.
    assert await delivered(part, 0) == [b"m0"]  # a DATA entry as stored

    await part.publish("plain", msgs(1))  # entry 2
    await tb.end(T2, commit=True)
    assert await markers(part) == [(1, 5), (3, 1)]
    assert await delivered(part, 3) == [b"b5"]
    assert part.messages_after((-1, (1 << 31) - 1)) == 1 + 5 + 1 + 1


async def test_commit_waits_for_sends_queued_before_it(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    first = tb.publish(T1, "p", msgs(0, 1))
    second = tb.publish(T1, "p", msgs(2))
    await tb.end(T1, commit=True)  # the sends are still in flight when END arrives
    assert await first == txn_ids(0, 2)
    assert await second == txn_ids(2, 1)
    assert await markers(part) == [(0, 3)]
    assert await delivered(part, 0) == [b"m0", b"m1", b"m2"]


async def test_materialize_reads_sparse_entries_from_disk(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A tiny tail cache: the reads go to SQLite, in runs of the marker's entries.
    store = await LedgerStore.open(db, cache_entries=1)
    try:
        part = (await (await Topics.load(store)).create("t", 1)).partitions[0]
        tb = await part.txn_buffer()
        for i in range(6):
            await tb.publish(T1, "p", msgs(i))
            for j in range(6):  # T2's sends keep T1's entries far apart
                await tb.publish(T2, "q", msgs(6 * i + j))
        await tb.end(T1, commit=True)
        monkeypatch.setattr(txnbuffer_module, "MATERIALIZED_CACHE_ENTRIES", 0)
        assert await delivered(part, 0) == [f"m{i}".encode() for i in range(6)]
        await tb.end(T2, commit=True)
        assert await delivered(part, 1) == [f"m{i}".encode() for i in range(36)]
    finally:
        await settle(store)
        await store.close()


# -- abort and late writes -------------------------------------------------------------


async def test_abort_writes_no_marker_and_refuses_late_writes(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0, 1))
    await tb.end(T1, commit=False)
    assert part.ledger.last_entry_id == -1
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_ABORT]
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.ABORTED, 2, -1, ())
    assert tb.open_transactions() == []
    with pytest.raises(TxnEndedError, match="late write"):
        tb.publish(T1, "p", msgs(2))
    with pytest.raises(TxnEndedError):
        tb.publish(T1, "other", msgs(0))  # any producer
    await settle(part.ledger.store)
    assert tb.sidecar.last_entry_id == 1  # nothing stored


async def test_late_write_after_commit_and_while_ending(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    ending = asyncio.ensure_future(tb.end(T1, commit=True))
    await asyncio.sleep(0)  # END has begun, its records are not durable yet
    assert tb.status(T1).state is PartitionTxnState.ENDING_COMMIT  # type: ignore[union-attr]
    with pytest.raises(TxnEndedError, match="ending"):
        tb.publish(T1, "p", msgs(1))
    with pytest.raises(TxnConflictError, match="commit has begun"):
        await tb.end(T1, commit=False)
    await ending
    await tb.settled()
    with pytest.raises(TxnEndedError, match="committed"):
        tb.publish(T1, "p", msgs(1))
    assert await markers(part) == [(0, 1)]
    assert await delivered(part, 0) == [b"m0"]


async def test_end_of_a_transaction_that_never_wrote_here(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.end(T1, commit=True)
    await tb.end(T2, commit=False)
    assert part.ledger.last_entry_id == -1  # no marker for no messages
    assert await sidecar_kinds(tb) == [TXN_COMMIT, TXN_ABORT]
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 0, -1, ())
    assert tb.status(T2) == TxnInfo(T2, PartitionTxnState.ABORTED, 0, -1, ())
    for txn in (T1, T2):  # the small record makes late writes refusable
        with pytest.raises(TxnEndedError):
            tb.publish(txn, "p", msgs(0))
    _, part = await stores.reopen()
    tb = await part.txn_buffer()
    with pytest.raises(TxnEndedError):
        tb.publish(T1, "p", msgs(0))
    assert tb.open_transactions() == []


# -- idempotent and conflicting ENDs ---------------------------------------------------


async def test_end_is_idempotent(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0, 1))
    await tb.publish(T2, "p", msgs(0))
    # Retries racing each other, and after the first finished: one marker.
    await asyncio.gather(tb.end(T1, commit=True), tb.end(T1, commit=True))
    await tb.end(T1, commit=True)
    await tb.end(T2, commit=False)
    await tb.end(T2, commit=False)
    assert await markers(part) == [(0, 2)]
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_DATA, TXN_COMMIT, TXN_ABORT]

    _, part = await stores.reopen()
    tb = await part.txn_buffer()
    await tb.end(T1, commit=True)
    await tb.end(T2, commit=False)
    assert await markers(part) == [(0, 2)]
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_DATA, TXN_COMMIT, TXN_ABORT]


async def test_conflicting_end_is_refused_and_changes_nothing(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    await tb.publish(T2, "p", msgs(0))
    await tb.end(T1, commit=True)
    await tb.end(T2, commit=False)
    with pytest.raises(TxnConflictError, match="committed"):
        await tb.end(T1, commit=False)
    with pytest.raises(TxnConflictError, match="aborted"):
        await tb.end(T2, commit=True)
    assert await markers(part) == [(0, 1)]
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_DATA, TXN_COMMIT, TXN_ABORT]
    assert tb.status(T1).state is PartitionTxnState.COMMITTED  # type: ignore[union-attr]
    assert tb.status(T2).state is PartitionTxnState.ABORTED  # type: ignore[union-attr]


# -- deduplication ---------------------------------------------------------------------


async def test_retried_sends_are_stored_once(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    assert await tb.publish(T1, "p", msgs(0, 1, 2)) == txn_ids(0, 3)
    assert await tb.publish(T1, "p", msgs(3)) == txn_ids(3, 1)
    stored = tb.sidecar.last_entry_id
    assert await tb.publish(T1, "p", msgs(0, 1, 2)) == txn_ids(0, 3)
    assert await tb.publish(T1, "p", msgs(1, 3)) == PublishResult(-1, [(-1, 1), (-1, 3)])
    assert tb.sidecar.last_entry_id == stored
    # A partly re-sent send stores only its new messages.
    assert await tb.publish(T1, "p", msgs(2, 3, 4, 5)) == txn_ids(2, 4)
    assert tb.sidecar.last_entry_id == stored + 1
    # Another producer, or the same producer in another transaction, is not a duplicate.
    assert await tb.publish(T1, "q", msgs(0)) == txn_ids(6, 1)
    assert await tb.publish(T2, "p", msgs(0)) == txn_ids(0, 1)
    # A re-send while the original is in flight.
    first = tb.publish(T2, "p", msgs(1, 2))
    again = tb.publish(T2, "p", msgs(1, 2))
    assert await first == txn_ids(1, 2)
    assert await again == txn_ids(1, 2)
    await tb.end(T1, commit=True)
    assert await delivered(part, 0) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5", b"m0"]
    assert tb.status(T2).count == 3  # type: ignore[union-attr]


@pytest.mark.parametrize("seqs", [(3, 3), (5, 4), (0, 2, 1), (1, 2, 2, 4), (4, 4, 5, 7)])
async def test_bad_sends_are_rejected_and_store_nothing(stores: Stores, seqs: tuple[int]) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    with pytest.raises(SendRejectedError, match="increase"):
        tb.publish(T1, "p", msgs(*seqs))
    with pytest.raises(SendRejectedError, match="at least one"):
        tb.publish(T1, "p", [])
    for bad in [(1,), (1, -1), (1 << 64, 0), [1, 2], (1.0, 2)]:
        with pytest.raises(SendRejectedError, match="transaction id"):
            tb.publish(bad, "p", msgs(1))  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="transaction id"):
            await tb.end(bad, commit=True)  # type: ignore[arg-type]
    await settle(part.ledger.store)
    assert tb.sidecar.last_entry_id == 0
    assert await tb.publish(T1, "p", msgs(1)) == txn_ids(1, 1)


async def test_first_sequence_id_in_a_transaction(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    assert await tb.publish(T1, "p", msgs(0, 1, 2), first_seq=0) == txn_ids(0, 3)
    with pytest.raises(SendRejectedError, match="first_sequence_id 3 says"):
        tb.publish(T1, "p", msgs(3, 5), first_seq=3)
    assert await tb.publish(T1, "p", msgs(3, 4), first_seq=3) == txn_ids(3, 2)
    assert await tb.publish(T1, "p", msgs(1, 2, 3)) == txn_ids(1, 3)  # re-sent: same places
    await tb.end(T1, commit=True)
    assert await delivered(part, 0) == [b"m0", b"m1", b"m2", b"m3", b"m4"]


async def test_a_failed_append_can_be_retried_after_a_restart(stores: Stores) -> None:
    store, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    await store._engine._reader.execute(  # (another connection: the trigger is the file's)
        "CREATE TRIGGER fail BEFORE INSERT ON entries BEGIN SELECT RAISE(ABORT, 'disk full'); END"
    )
    with pytest.raises(Exception, match="disk full"):
        await tb.publish(T1, "p", msgs(1, 2))
    with pytest.raises(Exception, match="refuses writes"):
        tb.publish(T1, "p", msgs(1, 2))  # the store stopped (fail-stop)
    await store._engine._reader.execute("DROP TRIGGER fail")
    _, part = await stores.reopen()
    tb = await part.txn_buffer()
    assert await tb.publish(T1, "p", msgs(1, 2)) == txn_ids(1, 2)
    await tb.end(T1, commit=True)
    assert await delivered(part, 0) == [b"m0", b"m1", b"m2"]


# -- crashes and recovery --------------------------------------------------------------


async def test_crash_between_marker_and_commit_record(stores: Stores, crash_at: list[str]) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0, 1))
    await tb.publish(T2, "p", msgs(0))
    crash_at.append("buffer.after_commit_marker")
    with pytest.raises(Crash):
        await tb.end(T1, commit=True)
    assert await markers(part) == [(0, 2)]
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_DATA]  # no TXN_COMMIT yet

    _, part = await stores.reopen()
    tb = loaded(part)
    # Recovery found the marker and completed the sidecar record.
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 2, 0, ())
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_DATA, TXN_COMMIT]
    assert tb.open_transactions() == [T2]
    await tb.end(T1, commit=True)  # the coordinator's retry
    assert await markers(part) == [(0, 2)]
    assert await delivered(part, 0) == [b"m0", b"m1"]
    with pytest.raises(TxnEndedError):
        tb.publish(T1, "p", msgs(2))


async def test_crash_between_marker_and_commit_record_after_a_snapshot(
    stores: Stores, crash_at: list[str]
) -> None:
    # The snapshot is written after the marker, so recovery does not scan the
    # partition for it: the snapshot itself must know the marker.
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    crash_at.append("buffer.after_commit_marker")
    with pytest.raises(Crash):
        await tb.end(T1, commit=True)
    await tb.sweep()  # writes a snapshot
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_SNAPSHOT]

    _, part = await stores.reopen()
    tb = loaded(part)
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 1, 0, ())
    await tb.end(T1, commit=True)
    assert await markers(part) == [(0, 1)]


async def test_retry_after_a_failed_commit_record_adds_no_marker(
    stores: Stores, crash_at: list[str]
) -> None:
    # The same, without a restart: the coordinator retries on the live broker.
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    crash_at.append("buffer.after_commit_marker")
    with pytest.raises(Crash):
        await tb.end(T1, commit=True)
    await tb.end(T1, commit=True)
    await tb.settled()
    assert await markers(part) == [(0, 1)]
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_COMMIT]
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 1, 0, ())


async def test_crash_after_data_write_then_retry(stores: Stores, crash_at: list[str]) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    crash_at.append("buffer.after_txn_data_write")
    with pytest.raises(Crash):
        await tb.publish(T1, "p", msgs(1, 2))  # stored, never answered

    _, part = await stores.reopen()
    tb = loaded(part)
    assert tb.open_transactions() == [T1]
    # The producer reconnects and re-sends: original ids, stored once.
    assert await tb.publish(T1, "p", msgs(1, 2)) == txn_ids(1, 2)
    assert await tb.publish(T1, "p", msgs(2, 3)) == txn_ids(2, 2)
    await tb.end(T1, commit=True)
    assert await delivered(part, 0) == [b"m0", b"m1", b"m2", b"m3"]


@pytest.fixture
def small_snapshots(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(txnbuffer_module, "SNAPSHOT_EVERY", 4)


@pytest.mark.usefixtures("small_snapshots")
async def test_recovery_from_snapshot_and_tail_equals_live_index(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    txns = [(1 << 48 | i, i) for i in range(12)]
    for i, txn in enumerate(txns):
        await tb.publish(txn, f"p{i % 3}", msgs(i, i + 1))
        if i % 3 == 0:
            await tb.end(txn, commit=True)
        elif i % 3 == 1:
            await tb.end(txn, commit=False)
    await tb.publish(txns[2], "p2", msgs(100))  # an open one, after snapshots
    await settle(part.ledger.store)
    if (await sidecar_kinds(tb))[-1] == TXN_SNAPSHOT:  # (keep a tail to replay)
        await tb.publish(txns[8], "p2", msgs(8, 101))
        await settle(part.ledger.store)
    live = tb.transactions()
    assert tb.snapshots_written >= 3
    assert len(tb.open_transactions()) == 4
    records = sum(k != TXN_SNAPSHOT for k in await sidecar_kinds(tb))

    applied: list[int] = []
    real_apply = TransactionBuffer._apply

    def counting(self: TransactionBuffer, entry: Entry) -> None:
        applied.append(entry.entry_id)
        real_apply(self, entry)

    monkeypatch.setattr(TransactionBuffer, "_apply", counting)
    _, part = await stores.reopen()
    tb = loaded(part)
    assert tb.transactions() == live
    assert 0 < len(applied) < records / 2  # the tail after the snapshot, not the history
    # Recovered sequence state: re-sends of open transactions are answered.
    assert await tb.publish(txns[2], "p2", msgs(2, 3, 100)) == txn_ids(0, 3)
    assert await tb.publish(txns[5], "p2", msgs(5, 6, 7)) == txn_ids(0, 3)  # 7 is new
    await tb.end(txns[2], commit=True)
    marker = part.ledger.last_entry_id
    assert await delivered(part, marker) == [b"m2", b"m3", b"m100"]
    assert await delivered(part, 0) == [b"m0", b"m1"]  # committed before the restart


@pytest.mark.usefixtures("small_snapshots")
async def test_ended_transactions_leave_the_index(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a partition that is never trimmed (no subscriptions), committed
    transactions do not pile up in the index or in its snapshots: they leave
    it as they end, and retention blocks keep their sidecar records while
    their markers are in the partition."""
    monkeypatch.setattr(txnindex_module, "RETENTION_BLOCK", 8)
    _, part = await stores.open()
    tb = await part.txn_buffer()
    for i in range(40):  # partition entry i is transaction i's marker
        txn = (1 << 48 | i, i)
        await tb.publish(txn, "p", msgs(i))
        await tb.end(txn, commit=True)
    await tb.publish(T1, "p", msgs(0))  # one still open
    await settle(part.ledger.store)
    metas = await tb.sidecar.read_meta()
    data = [e for e, m in metas if entry_kind(m) == TXN_DATA]  # data[i]: transaction i's
    assert [t.txn for t in tb.transactions()] == [T1]
    assert tb.stats()["committed"] == 40
    assert tb.stats()["retention_blocks"] == 5
    (last,) = [e for e, m in metas if entry_kind(m) == TXN_SNAPSHOT][-1:]
    (snap,) = await tb.sidecar.read(last, last)
    record = json.loads(snap.data)
    assert len(record["txns"]) <= 1 and len(record["retained"]) == 5

    assert await tb.sweep() == 0  # every marker is in the partition: all is kept
    await part.ledger.trim(12)  # past the first block's markers (0..7), not the second's
    part.trimmed(12)
    assert await tb.sweep() > 0
    assert tb.sidecar.first_entry_id == data[8]
    for entry_id in range(12, 40):
        assert await delivered(part, entry_id) == [f"m{entry_id}".encode()]

    _, part = await stores.reopen()
    tb = loaded(part)
    assert [t.txn for t in tb.transactions()] == [T1]
    assert tb.stats()["committed"] == 32
    await part.ledger.trim(40)  # every marker gone: only the open transaction's record stays
    part.trimmed(40)
    await tb.sweep()
    assert tb.sidecar.first_entry_id == data[-1]
    assert tb.stats()["committed"] == 0


async def test_a_version_1_snapshot_is_read(stores: Stores) -> None:
    """Version 1 kept committed transactions in the index: they become
    retention blocks and ended transactions."""
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0, 1))  # sidecar 0
    await tb.publish(T2, "p", msgs(0))  # 1
    await tb.end(T1, commit=True)  # marker at partition entry 0
    await tb.settled()
    old = {
        "v": 1,
        "covers": tb.sidecar.last_entry_id,
        "scan_from": part.ledger.last_entry_id + 1,
        "txns": [[*T1, "committed", 0, 2, [0], [0]], [*T2, "open", -1, 1, [1], [0]]],
        "ended": [],
    }
    await tb.sidecar.append(json.dumps(old).encode(), meta=entry_meta(TXN_SNAPSHOT, 0))
    _, part = await stores.reopen()
    tb = loaded(part)
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 2, 0, ())
    assert [t.txn for t in tb.transactions()] == [T2]
    assert tb.stats()["committed"] == 1
    assert await tb.sweep() == 0  # T1's marker is in the partition: its record stays
    assert await delivered(part, 0) == [b"m0", b"m1"]


# -- sweep / retention -----------------------------------------------------------------


async def test_sweep_keeps_what_is_needed(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    aborted, committed, still_open = T1, T2, T3
    await tb.publish(aborted, "p", msgs(0))  # sidecar 0
    await tb.publish(committed, "p", msgs(0, 1))  # 1
    await tb.publish(still_open, "p", msgs(0))  # 2
    await tb.publish(aborted, "p", msgs(1))  # 3
    await tb.end(aborted, commit=False)  # 4
    await tb.end(committed, commit=True)  # 5; marker at partition entry 0
    await part.publish("plain", msgs(0))  # partition entry 1

    # The aborted transaction's first entry goes; the committed one's marker is
    # still in the partition, so its entries stay (and so does all after them).
    assert await tb.sweep() == 1
    assert tb.sidecar.first_entry_id == 1
    assert tb.status(aborted) == TxnInfo(aborted, PartitionTxnState.ABORTED, 2, -1, ())
    assert await delivered(part, 0) == [b"m0", b"m1"]

    # The subscriptions acknowledged the marker: the partition is trimmed past it.
    await part.ledger.trim(1)
    part.trimmed(1)
    assert await tb.sweep() == 1  # up to the open transaction's entry
    assert tb.sidecar.first_entry_id == 2
    assert tb.status(committed) == TxnInfo(committed, PartitionTxnState.COMMITTED, 2, 0, ())
    assert tb.open_transactions() == [still_open]

    await tb.end(still_open, commit=False)
    trimmed = await tb.sweep()
    assert trimmed > 0
    kinds = await sidecar_kinds(tb)
    assert TXN_DATA not in kinds and kinds[0] == TXN_SNAPSHOT  # only the latest snapshot
    assert await tb.sweep() == 0  # nothing new: no new snapshot either
    assert await sidecar_kinds(tb) == kinds

    # Late writes and ENDs of swept transactions are still answered, also after a restart.
    for _ in range(2):
        for txn in (aborted, committed, still_open):
            with pytest.raises(TxnEndedError):
                tb.publish(txn, "p", msgs(9))
        await tb.end(committed, commit=True)
        with pytest.raises(TxnConflictError):
            await tb.end(aborted, commit=True)
        _, part = await stores.reopen()
        tb = loaded(part)
        assert tb.status(committed) == TxnInfo(committed, PartitionTxnState.COMMITTED, 2, 0, ())
    assert part.ledger.last_entry_id == 1  # no second marker


async def test_sweep_never_drops_an_open_or_visible_transaction(stores: Stores) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))  # sidecar 0: open throughout
    for i in range(5):
        txn = (5, i)
        await tb.publish(txn, "p", msgs(i))
        await tb.end(txn, commit=i % 2 == 0)
    assert await tb.sweep() == 0
    assert tb.sidecar.first_entry_id == 0
    await tb.end(T1, commit=True)
    await tb.sweep()
    # Every committed transaction is still readable through its marker.
    for entry_id, count in await markers(part):
        assert len(await delivered(part, entry_id)) == count
    assert len(await markers(part)) == 4


async def test_materializing_a_swept_marker_is_a_clear_error(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txnbuffer_module, "MATERIALIZED_CACHE_ENTRIES", 0)
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0))
    await tb.end(T1, commit=True)
    (marker,) = await part.ledger.read(0, 0)
    await part.ledger.trim(1)
    part.trimmed(1)
    await tb.sweep()
    with pytest.raises(TransactionBufferError, match="gone"):
        await part.materialize(marker)


async def five_aborted_and_swept(tb: TransactionBuffer) -> list[tuple[int, int]]:
    """Five transactions that wrote to ``tb`` and aborted, then a sweep."""
    txns = [(9, i) for i in range(5)]
    for txn in txns:
        await tb.publish(txn, "p", msgs(0))
        await tb.end(txn, commit=False)
    await tb.sweep()
    return txns


@pytest.mark.usefixtures("small_snapshots")
async def test_bounded_memory_of_swept_transactions(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txnindex_module, "ENDED_TXNS_KEPT", 3)
    _, part = await stores.open()
    tb = await part.txn_buffer()
    txns = await five_aborted_and_swept(tb)
    assert [tb.status(t) is not None for t in txns] == [False, False, True, True, True]
    with pytest.raises(TxnEndedError):
        tb.publish(txns[2], "p", msgs(1))
    _, part = await stores.reopen()
    tb = loaded(part)
    assert [tb.status(t) is not None for t in txns] == [False, False, True, True, True]
    assert tb.stats()["ended_remembered"] == 3


@pytest.mark.usefixtures("small_snapshots")
async def test_a_snapshot_keeps_only_the_newest_swept_transactions(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(txnindex_module, "ENDED_IN_SNAPSHOT", 2)
    _, part = await stores.open()
    tb = await part.txn_buffer()
    txns = await five_aborted_and_swept(tb)
    assert tb.stats()["ended_remembered"] == 5  # in memory: up to ENDED_TXNS_KEPT
    _, part = await stores.reopen()
    tb = loaded(part)
    # After a restart the newest two are remembered (the coordinator's
    # KIP-890 check refuses late writes of the others).
    assert [tb.status(t) is not None for t in txns] == [False, False, False, True, True]
    with pytest.raises(TxnEndedError):
        tb.publish(txns[4], "p", msgs(1))


async def test_an_early_send_is_answered_before_it_is_durable(stores: Stores) -> None:
    """``early``: the ids are known when the record is queued (records are
    stored in queue order), so the answer does not wait for the fsync."""
    _, part = await stores.open()
    tb = await part.txn_buffer()
    first = tb.publish(T1, "p", msgs(0, 1), early=True)
    second = tb.publish(T1, "p", msgs(2, 3, 4), early=True)
    assert isinstance(first, asyncio.Future) and first.done() and second.done()
    assert tb.sidecar.last_entry_id == -1  # nothing durable yet
    assert first.result() == txn_ids(0, 2) and second.result() == txn_ids(2, 3)
    # The same ids once durable, and the same as the ones a plain publish gives.
    assert await tb.publish(T1, "p", msgs(5)) == txn_ids(5, 1)
    assert tb.status(T1).count == 6
    await tb.end(T1, commit=True)
    (marker,) = await markers(part)
    assert await delivered(part, marker[0]) == [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"]


async def test_an_early_send_starts_no_group_commit_of_its_own(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An early send is a lazy append: it waits in the store's queue for
    the next group commit (the END's), and goes in the same one as the
    commit marker, before it."""
    monkeypatch.setattr(ledger_store, "LAZY_DELAY", 3600.0)  # (never alone, in this test)
    store, part = await stores.open()
    tb = await part.txn_buffer()
    commits = store.commits
    tb.publish(T1, "p", msgs(0, 1), early=True)
    for _ in range(20):
        await asyncio.sleep(0)
    assert store.commits == commits and tb.sidecar.last_entry_id == -1
    await tb.end(T1, commit=True)
    assert store.commits == commits + 1  # the send and the marker: one group commit
    (marker,) = await markers(part)
    assert await delivered(part, marker[0]) == [b"m0", b"m1"]


async def test_an_early_end_returns_with_its_marker_queued(stores: Stores) -> None:
    """``early=True`` (a coordinator sharing the store): END returns once
    the marker is queued; the marker is durable before anything queued after
    it, and its TXN_COMMIT record follows."""
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0, 1))
    await tb.publish(T2, "p", msgs(0))
    await tb.end(T1, commit=True, early=True)
    assert part.ledger.last_entry_id == -1  # the marker is not durable yet
    with pytest.raises(TxnEndedError):
        tb.publish(T1, "p", msgs(2))  # ending: refused from the call on
    after = await part.publish("plain", msgs(9))
    assert after.entry_id == 1  # behind the marker
    await tb.end(T1, commit=True, early=True)  # a retry waits for the first
    await tb.settled()
    assert await markers(part) == [(0, 2)]
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_DATA, TXN_COMMIT]
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 2, 0, ())
    await tb.end(T2, commit=False, early=True)
    await tb.settled()
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_DATA, TXN_COMMIT, TXN_ABORT]
    _, part = await stores.reopen()
    tb = loaded(part)
    assert (
        tb.status(T1).state is PartitionTxnState.COMMITTED
        and tb.status(T2).state is PartitionTxnState.ABORTED
    )
    assert await delivered(part, 0) == [b"m0", b"m1"]


async def test_an_early_end_crashing_after_its_marker_is_completed_on_restart(
    stores: Stores, crash_at: list[str]
) -> None:
    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(T1, "p", msgs(0, 1))
    crash_at.append("buffer.after_commit_marker")
    await tb.end(T1, commit=True, early=True)  # answered before the crash point
    await tb.settled()
    assert await markers(part) == [(0, 2)]
    assert await sidecar_kinds(tb) == [TXN_DATA]  # the crash came before TXN_COMMIT
    _, part = await stores.reopen()
    tb = loaded(part)
    assert tb.status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 2, 0, ())
    assert await sidecar_kinds(tb) == [TXN_DATA, TXN_COMMIT]


def test_txn_run_start_knows_only_consecutive_places() -> None:
    assert txn_places(5, 3) == [(-1, 5), (-1, 6), (-1, 7)]
    assert txn_run_start(txn_places(5, 3)) == 5
    assert txn_run_start([(-1, 5), (-1, 7)]) is None  # a gap (re-sent messages)
    assert txn_run_start([(-1, 5), (3, 0)]) is None  # stored already, committed
    assert txn_run_start([]) is None


async def test_an_end_queued_with_its_sends_names_them_all_in_one_group_commit(
    stores: Stores,
) -> None:
    """END right behind sends not durable yet (what the broker does: a
    client's SENDs and END arrive together): the marker names every TXN_DATA
    record queued before it, durable or not, and goes in the same group
    commit; `end_early` does it without a turn of the loop."""
    store, part = await stores.open()
    tb = await part.txn_buffer()
    first = tb.publish(T1, "p", msgs(0, 1), early=True)
    second = tb.publish(T1, "p", msgs(2), early=True)
    commits = store.commits
    assert tb.end_early(T1, commit=True)  # nothing durable yet, nothing awaited
    assert (await first, await second) == (txn_ids(0, 2), txn_ids(2, 1))
    aborted = tb.publish(T2, "p", msgs(3), early=True)
    await aborted
    await tb.settled()
    assert await markers(part) == [(0, 3)]
    assert await delivered(part, 0) == [b"m0", b"m1", b"m2"]
    assert store.commits - commits <= 2  # data and marker together (TXN_COMMIT after)
    # A second END while the first one's records are in flight waits (`end`).
    assert tb.end_early(T2, commit=False)
    assert not tb.end_early(T2, commit=False)
    await tb.end(T2, commit=False, early=True)
    await tb.settled()
    assert tb.status(T2).state is PartitionTxnState.ABORTED
    assert tb.end_early(T2, commit=False)  # (ended: nothing left to do)
    with pytest.raises(TxnConflictError):
        tb.end_early(T2, commit=True)
    _, part = await stores.reopen()
    assert loaded(part).status(T1) == TxnInfo(T1, PartitionTxnState.COMMITTED, 3, 0, ())
    assert await delivered(part, 0) == [b"m0", b"m1", b"m2"]


# -- the producer-epoch mode: per-partition producer state ---------------------------

# Transactions of producer 5 (coordinator 1, boot epoch 1): one per epoch.
E0, E1 = (1 << 48 | 1, 100), (1 << 48 | 1, 101)
PID = 5


async def test_an_epoch_producer_starts_each_epoch_at_0_and_sends_without_gaps(
    stores: Stores,
) -> None:
    from buffer import OutOfOrderSequenceError, epoch_producer_name

    _, part = await stores.open()
    tb = await part.txn_buffer()
    name = epoch_producer_name(PID, 0)
    with pytest.raises(OutOfOrderSequenceError, match="an epoch starts at 0"):
        await tb.publish(E0, name, msgs(3), first_seq=3, epoch_producer=(PID, 0))
    assert tb.epoch_producers == {}  # refused: nothing noted
    assert await tb.publish(E0, name, msgs(0, 1), first_seq=0, epoch_producer=(PID, 0)) == txn_ids(
        0, 2
    )
    with pytest.raises(OutOfOrderSequenceError, match=r"sent sequence 5 .* where 2 comes next"):
        await tb.publish(E0, name, msgs(5), first_seq=5, epoch_producer=(PID, 0))
    # A re-sent batch is a duplicate, answered with the original places.
    again = await tb.publish(E0, name, msgs(0, 1), first_seq=0, epoch_producer=(PID, 0))
    assert again.first == 0 or again.ids == [(-1, 0), (-1, 1)]
    assert await tb.publish(E0, name, msgs(2), first_seq=2, epoch_producer=(PID, 0)) == txn_ids(
        2, 1
    )
    assert tb.status(E0).count == 3  # type: ignore[union-attr]  # stored once


async def test_an_older_epoch_is_refused_on_send_and_on_its_marker(stores: Stores) -> None:
    from buffer import StaleEpochError, epoch_producer_name

    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(E0, epoch_producer_name(PID, 0), msgs(0), first_seq=0, epoch_producer=(PID, 0))
    # The next transaction (epoch 1) begins here before epoch 0's marker came.
    await tb.publish(E1, epoch_producer_name(PID, 1), msgs(0), first_seq=0, epoch_producer=(PID, 1))
    with pytest.raises(StaleEpochError, match="a write of a finished transaction"):
        await tb.publish(
            E0, epoch_producer_name(PID, 0), msgs(1), first_seq=1, epoch_producer=(PID, 0)
        )
    # A delayed marker of the finished transaction (epoch 0) is refused, changing nothing.
    with pytest.raises(StaleEpochError, match="marker of producer 5 epoch 0"):
        await tb.end(E0, commit=True, producer=(PID, 0))
    assert tb.status(E0).state is PartitionTxnState.OPEN  # type: ignore[union-attr]
    assert await markers(part) == []
    await tb.end(E1, commit=True, producer=(PID, 1))  # the current one's marker is fine
    assert [count for _, count in await markers(part)] == [1]
    # A transaction of an older coordinator epoch (a restarted coordinator's
    # predecessor) is refused too.
    old_boot = (0 << 48 | 0, 77)
    with pytest.raises(StaleEpochError):
        await tb.publish(
            old_boot, epoch_producer_name(PID, 2), msgs(0), first_seq=0, epoch_producer=(PID, 2)
        )


async def test_the_producer_state_survives_a_restart(
    stores: Stores, monkeypatch: pytest.MonkeyPatch
) -> None:
    from buffer import EpochProducer, StaleEpochError, epoch_producer_name

    _, part = await stores.open()
    tb = await part.txn_buffer()
    await tb.publish(E0, epoch_producer_name(PID, 0), msgs(0), first_seq=0, epoch_producer=(PID, 0))
    await tb.end(E0, commit=True, producer=(PID, 0))
    await tb.publish(E1, epoch_producer_name(PID, 1), msgs(0), first_seq=0, epoch_producer=(PID, 1))
    for snapshot_first in (False, True):
        if snapshot_first:
            await tb.sweep()  # (writes a snapshot: the state comes from it)
        _, part = await stores.reopen()
        tb = loaded(part)
        assert tb.epoch_producers[PID] == EpochProducer(1, E1, 1)
        late = (1 << 48 | 1, 102)  # (a transaction this partition never saw, epoch 0)
        with pytest.raises(StaleEpochError):
            await tb.publish(
                late, epoch_producer_name(PID, 0), msgs(0), first_seq=0, epoch_producer=(PID, 0)
            )
