"""Transaction groups in the coordinator: tags, prepared timeouts and the
group commit (one GROUP record, idempotent under its key), as a table (no
I/O) and as a coordinator with its log, recovery and timeouts. The
participant is `test_coordinator.Recorder`; the broker's commands and the
client's side are in tests/test_txn_groups_wire.py."""

from __future__ import annotations

import asyncio

import pytest

import tc._table as table_module
from proto import txnbuf_pb2 as pb
from tc import InvalidTxnStatusError, TxnEvent, TxnID, TxnNotFoundError, TxnStatus, TxnTable
from tests.test_coordinator import EPOCH, Opener, Recorder, open_tc, records, wait_status

__all__ = ["open_tc"]  # (the fixture, imported for these tests)

Op = pb.TransactionMetadataEntry


def booted(tcid: int = 2) -> TxnTable:
    table = TxnTable(tcid)
    assert table.apply(table.boot())
    return table


def tagged(table: TxnTable, tag: str, prepared_ms: int = 0, now_ms: int = 0) -> TxnID:
    rec = table.new(1000, now_ms, tag=tag, prepared_timeout_ms=prepared_ms)
    txnid = table.next_txnid()
    assert table.apply(rec)
    table.register(txnid, partitions=[("out", 0)])
    return txnid


def prepared(table: TxnTable, tag: str, prepared_ms: int = 0, now_ms: int = 0) -> TxnID:
    txnid = tagged(table, tag, prepared_ms, now_ms)
    assert table.apply(table.decide(txnid, TxnEvent.PREPARE, now_ms))
    return txnid


def status(table: TxnTable, txnid: TxnID) -> TxnStatus:
    meta = table.get(txnid)
    assert meta is not None
    return meta.status


# -- the table ------------------------------------------------------------------------


def test_tags_index_the_undecided_transactions_until_they_end() -> None:
    table = booted()
    a, b = tagged(table, "q/1"), tagged(table, "q/1")
    c = tagged(table, "q/2")
    tagged(table, "other")
    assert [m.txnid for m in table.with_tag("q/1")] == [a, b]
    assert [m.txnid for m in table.with_tag("q/", prefix=True)] == [a, b, c]
    assert table.with_tag("q/") == []  # (not a prefix search)
    table.apply(table.decide(a, TxnEvent.ABORT, 1))
    assert [m.txnid for m in table.with_tag("q/1")] == [a, b]  # ABORTING: not ended yet
    table.apply(table.finish(a, 2))
    assert [m.txnid for m in table.with_tag("q/1")] == [b]
    with pytest.raises(ValueError, match="tag"):
        table.new(1000, 0, tag="x" * 2000)
    with pytest.raises(ValueError, match="prepared timeout"):
        table.new(1000, 0, prepared_timeout_ms=-1)


def test_a_prepared_transaction_times_out_only_with_a_prepared_timeout() -> None:
    table = booted()
    forever = prepared(table, "q/1", prepared_ms=0, now_ms=10)
    bounded = prepared(table, "q/1", prepared_ms=500, now_ms=10)
    # Prepared: the OPEN deadline (start + 1000) is gone, the prepared one is set.
    assert table.next_deadline() == 510
    assert table.expired(509) == []
    assert table.expired(510) == [bounded]
    assert table.expired(10**9) == []  # (never the one without a prepared timeout)
    # The timeout decides as the status table says: PREPARED --TIMEOUT--> ABORTING.
    decision = table.decide(bounded, TxnEvent.TIMEOUT, 511)
    assert table.apply(decision) and decision.timed_out
    assert status(table, bounded) is TxnStatus.ABORTING
    assert status(table, forever) is TxnStatus.PREPARED


def test_a_group_commits_its_members_and_aborts_the_rest_of_its_tag_in_one_record() -> None:
    table = booted()
    a, b = prepared(table, "q/7"), prepared(table, "q/7")
    stray = prepared(table, "q/7")  # (a failed attempt's transaction)
    running = tagged(table, "q/7")  # (an attempt still running)
    other = prepared(table, "q/8")
    rec = table.group("q", 7, [a, b, a], "q/7", 5)
    assert rec.metadata_op == Op.GROUP and not rec.group_duplicate
    assert table.group_sequence("q") is None  # (built, not applied)
    assert status(table, a) is TxnStatus.PREPARED
    updates = {
        TxnID(u.txnid_most_bits, u.txnid_least_bits): u.new_status for u in rec.group_updates
    }
    assert updates == {
        a: pb.COMMITTING,
        b: pb.COMMITTING,
        stray: pb.ABORTING,
        running: pb.ABORTING,
    }
    assert [(p.topic, p.partition) for p in rec.group_updates[0].partitions] == [("out", 0)]
    assert table.apply(rec)
    assert [status(table, t) for t in (a, b, stray, running, other)] == [
        TxnStatus.COMMITTING,
        TxnStatus.COMMITTING,
        TxnStatus.ABORTING,
        TxnStatus.ABORTING,
        TxnStatus.PREPARED,
    ]
    assert table.group_sequence("q") == 7


def test_a_replayed_group_commits_nothing_and_aborts_what_it_names() -> None:
    table = booted()
    first = prepared(table, "q/3")
    table.apply(table.group("q", 3, [first], "q/3", 1))
    replay = prepared(table, "q/3")  # the same batch written again after a crash
    rec = table.group("q", 3, [replay], "q/3", 2)
    assert rec.group_duplicate
    assert [u.new_status for u in rec.group_updates] == [pb.ABORTING]
    assert table.apply(rec)
    assert status(table, replay) is TxnStatus.ABORTING
    assert status(table, first) is TxnStatus.COMMITTING
    # An older sequence is a duplicate too; a newer one commits.
    older = prepared(table, "q/2")
    assert table.group("q", 2, [older], "", 3).group_duplicate
    newer = prepared(table, "q/4")
    assert not table.group("q", 4, [newer], "", 3).group_duplicate


def test_a_group_with_a_member_not_prepared_is_refused_and_builds_nothing() -> None:
    table = booted()
    ready = prepared(table, "q/1")
    still_open = tagged(table, "q/1")
    with pytest.raises(InvalidTxnStatusError, match="PREPARED"):
        table.group("q", 1, [ready, still_open], "q/1", 1)
    with pytest.raises(TxnNotFoundError):
        table.group("q", 1, [ready, TxnID.of(2, 12345)], "q/1", 1)
    with pytest.raises(ValueError, match="group name"):
        table.group("", 1, [ready], "", 1)
    assert status(table, ready) is TxnStatus.PREPARED
    assert status(table, still_open) is TxnStatus.OPEN
    assert table.group_sequence("q") is None


def test_groups_are_bounded_and_survive_a_snapshot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(table_module, "GROUPS_KEPT", 3)
    table = booted()
    for n, group in enumerate(["a", "b", "c", "a", "d"]):
        table.apply(table.group(group, n, [], "", n))
    assert list(table.groups.items()) == [("c", 2), ("a", 3), ("d", 4)]  # b, least recent, gone
    keep = prepared(table, "q/9", prepared_ms=100, now_ms=50)
    again = TxnTable(2)
    again.restore(table.snapshot())
    assert list(again.groups.items()) == list(table.groups.items())
    assert [m.txnid for m in again.with_tag("q/9")] == [keep]
    assert again.next_deadline() == 150  # the prepared deadline too
    assert again.get(keep).prepared_timeout_ms == 100  # type: ignore[union-attr]
    assert again.group("a", 3, [], "", 0).group_duplicate


# -- the coordinator ---------------------------------------------------------------


async def prepare(tc_: object, tag: str, prepared_ms: int = 0) -> TxnID:
    from tc import TransactionCoordinator

    assert isinstance(tc_, TransactionCoordinator)
    txnid = tc_.new_txn(1000, tag=tag, prepared_timeout_ms=prepared_ms)
    tc_.add_partition(txnid, "out", 0)
    await tc_.prepare_txn(txnid)
    return txnid


async def test_a_group_commit_is_one_record_and_is_idempotent_across_a_restart(
    open_tc: Opener,
) -> None:
    rec = Recorder()
    tc = await open_tc(1, rec)
    try:
        a, b, stray = [await prepare(tc, "q/0") for _ in range(3)]
        duplicate, committed, aborted, done = tc.commit_group("q", 0, [a, b], "q/0")
        assert (duplicate, committed, aborted) == (False, 2, 1)
        await done
        for txnid in (a, b):
            await wait_status(tc, txnid, TxnStatus.COMMITTED)
        await wait_status(tc, stray, TxnStatus.ABORTED)
        assert sorted((c[3], c[4]) for c in rec.calls) == sorted(
            [(a, True), (b, True), (stray, False)]
        )
        await asyncio.sleep(0.05)  # (the ends are logged lazily)
        groups = [r for r in await records(tc) if r.metadata_op == Op.GROUP]
        assert len(groups) == 1 and len(groups[0].group_updates) == 3
    finally:
        await open_tc.close(tc)
    rec = Recorder()
    tc = await open_tc(1, rec)
    try:
        replay = await prepare(tc, "q/0")
        duplicate, committed, aborted, done = tc.commit_group("q", 0, [replay], "q/0")
        assert (duplicate, committed, aborted) == (True, 0, 1)
        await done
        await wait_status(tc, replay, TxnStatus.ABORTED)
        assert [(c[3], c[4]) for c in rec.calls] == [(replay, False)]
    finally:
        await open_tc.close(tc)


async def test_prepared_transactions_survive_a_restart_and_time_out_if_asked(
    open_tc: Opener,
) -> None:
    tc = await open_tc(1, Recorder())
    try:
        forever = await prepare(tc, "q/5")
        bounded = await prepare(tc, "q/5", prepared_ms=300)
    finally:
        await open_tc.close(tc)
    tc = await open_tc(1, Recorder())
    try:
        assert tc.get(forever).status is TxnStatus.PREPARED  # type: ignore[union-attr]
        await wait_status(tc, bounded, TxnStatus.ABORTED)
        assert tc.get(bounded).timed_out  # type: ignore[union-attr]
        assert tc.get(forever).status is TxnStatus.PREPARED  # type: ignore[union-attr]
        assert [m.txnid for m in tc.transactions_tagged("q/5")] == [forever]
        count, done = tc.abort_tagged("q/", prefix=True)
        assert count == 1
        await done
        await wait_status(tc, forever, TxnStatus.ABORTED)
        assert tc.transactions_tagged("q/", prefix=True) == []
        with pytest.raises(ValueError, match="tag"):
            tc.abort_tagged("")
    finally:
        await open_tc.close(tc)


def test_ids_of_tagged_transactions_are_ordinary_ids() -> None:
    table = booted(5)
    txnid = tagged(table, "x")
    assert txnid.tcid == 5 and txnid.counter == EPOCH
