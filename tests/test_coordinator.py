"""The transaction coordinator on its own: the status table, the transaction
table (no I/O), and the coordinator's log, recovery, timeouts and ends.

The participant here is a recorder (a unit test of the coordinator) that
queues its writes in the coordinator's store as the broker's do; the real
broker participant is exercised by the integration and crash tests.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
from collections.abc import Awaitable
from pathlib import Path

import pytest

import tc._log as log_module
import tc._participants as participants_module
from buffer import TxnConflictError
from ledger import LedgerStore
from proto import txnbuf_pb2 as pb
from tc import (
    TRANSITIONS,
    CoordinatorMoved,
    InvalidTxnStatusError,
    NotStuckError,
    ParticipantElsewhere,
    ProducerSettings,
    TransactionCoordinator,
    TxnEnd,
    TxnEvent,
    TxnID,
    TxnNotFoundError,
    TxnStatus,
    TxnTable,
    TxnTimeoutError,
    check_update,
    transition,
)
from tests.conftest import until

Op = pb.TransactionMetadataEntry
EPOCH = 1 << 64  # a counter is (boot epoch << 64) | sequence


class Recorder:
    """A participant: records each end, and queues a write for it in the
    coordinator's store (behind the decision), as the broker's do. It can
    fail the first few calls, make each one wait (``later``), or hang."""

    def __init__(self, failures: int = 0, later: bool = False, hang: bool = False) -> None:
        self.calls: list[tuple[str, str, object, TxnID, bool]] = []
        self.failures = failures
        self.later = later
        self.hang = hang
        self.store: LedgerStore | None = None
        self.written: list[asyncio.Future[int]] = []
        self.ends: list[TxnEnd] = []  # every end told, as told

    def _call(
        self, kind: str, topic: str, what: object, txnid: TxnID, commit: bool
    ) -> Awaitable[None] | None:
        if self.hang:
            return asyncio.Event().wait()  # type: ignore[return-value]
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("participant unavailable")
        if self.later:
            return self._later(kind, topic, what, txnid, commit)
        self._record(kind, topic, what, txnid, commit)
        return None

    async def _later(self, kind: str, topic: str, what: object, txnid: TxnID, commit: bool) -> None:
        await asyncio.sleep(0.01)
        self._record(kind, topic, what, txnid, commit)

    def _record(self, kind: str, topic: str, what: object, txnid: TxnID, commit: bool) -> None:
        self.calls.append((kind, topic, what, txnid, commit))
        if self.store is not None:
            ledger = self.store.get_ledger("participant")
            if ledger is not None:
                self.written.append(ledger.append(b"commit" if commit else b"abort"))

    def end_txn_on_partition(
        self, topic: str, partition: int, end: TxnEnd
    ) -> Awaitable[None] | None:
        self.ends.append(end)
        return self._call("partition", topic, partition, end.txnid, end.commit)

    def end_txn_on_subscription(
        self, topic: str, subscription: str, end: TxnEnd
    ) -> Awaitable[None] | None:
        self.ends.append(end)
        return self._call("subscription", topic, subscription, end.txnid, end.commit)


class Opener:
    """Opens coordinators on ``tmp_path``'s broker.db; closing a coordinator
    closes its store too (a restart reopens both)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.stores: dict[int, LedgerStore] = {}

    async def __call__(
        self, tcid: int, participant: Recorder, settings: ProducerSettings | None = None
    ) -> TransactionCoordinator:
        store = await LedgerStore.open(self.path / "broker.db")
        await store.open_ledger("participant")
        participant.store = store
        tc = await TransactionCoordinator.open(tcid, store, participant, settings)
        self.stores[id(tc)] = store
        return tc

    async def close(self, tc: TransactionCoordinator) -> None:
        await tc.close()
        await self.stores.pop(id(tc)).close()


@pytest.fixture
def open_tc(tmp_path: Path) -> Opener:
    return Opener(tmp_path)


async def wait_status(tc: TransactionCoordinator, txnid: TxnID, status: TxnStatus) -> None:
    def reached() -> bool:
        meta = tc.get(txnid)
        return meta is not None and meta.status is status

    await until(reached, f"{txnid} to reach {status}")


async def records(tc: TransactionCoordinator) -> list[pb.TransactionMetadataEntry]:
    ledger = tc._log.ledger
    return [
        Op.FromString(e.data)
        for e in await ledger.read(ledger.first_entry_id, ledger.last_entry_id)
        if e.meta == 0  # a record, not a snapshot
    ]


# -- the status table --------------------------------------------------------------


@pytest.mark.parametrize(("state", "event"), list(TRANSITIONS))
def test_every_row_of_the_table(state: TxnStatus, event: TxnEvent) -> None:
    assert transition(state, event) is TRANSITIONS[(state, event)]
    assert check_update(state, TRANSITIONS[(state, event)]) is TRANSITIONS[(state, event)]


@pytest.mark.parametrize(
    ("state", "event"),
    [(s, e) for s in TxnStatus for e in TxnEvent if (s, e) not in TRANSITIONS],
)
def test_events_without_a_row_are_refused(state: TxnStatus, event: TxnEvent) -> None:
    with pytest.raises(InvalidTxnStatusError):
        transition(state, event)


def test_logged_updates_are_checked_against_the_table() -> None:
    with pytest.raises(InvalidTxnStatusError):
        check_update(TxnStatus.COMMITTING, TxnStatus.ABORTED)
    with pytest.raises(InvalidTxnStatusError):
        check_update(TxnStatus.OPEN, TxnStatus.ABORTED)
    # A local transaction's one record (TxnEvent.COMMIT_LOCAL):
    assert check_update(TxnStatus.OPEN, TxnStatus.COMMITTED) is TxnStatus.COMMITTED


# -- the transaction table (no I/O) -------------------------------------------------


def booted(tcid: int = 3) -> TxnTable:
    table = TxnTable(tcid)
    assert table.apply(table.boot())
    return table


def opened(table: TxnTable, timeout_ms: int = 1000, now_ms: int = 0) -> TxnID:
    rec = table.new(timeout_ms, now_ms)
    txnid = table.next_txnid()
    assert table.apply(rec)
    return txnid


def test_the_table_hands_out_ids_of_its_boot_epoch() -> None:
    table = TxnTable(3)
    with pytest.raises(RuntimeError, match="not booted"):
        table.next_txnid()
    assert table.apply(table.boot())
    ids = [opened(table) for _ in range(3)]
    assert [i.tcid for i in ids] == [3, 3, 3]
    assert [i.counter for i in ids] == [EPOCH, EPOCH + 1, EPOCH + 2]
    assert table.apply(table.boot())  # a restart: a new epoch, ids above all before
    assert opened(table).counter == 2 * EPOCH
    with pytest.raises(ValueError, match="timeout"):
        table.new(-1, 0)


def test_the_table_decides_finishes_and_refuses_what_the_status_table_refuses() -> None:
    table = booted()
    txnid = opened(table)
    table.register(txnid, partitions=[("t", 0), ("t", 0)], subscriptions=[("t", "s")])
    table.verify_partition(txnid, "t", 0)
    table.verify_subscription(txnid, "t", "s")
    with pytest.raises(InvalidTxnStatusError, match="not added"):
        table.verify_partition(txnid, "t", 1)
    with pytest.raises(InvalidTxnStatusError):
        table.finish(txnid, 1)  # not decided: nothing to finish
    decision = table.decide(txnid, TxnEvent.COMMIT, 5)
    assert table.get(txnid).status is TxnStatus.OPEN  # type: ignore[union-attr]  # (built, not applied)
    assert [(p.topic, p.partition) for p in decision.partitions] == [("t", 0)]
    assert [(s.topic, s.subscription) for s in decision.subscriptions] == [("t", "s")]
    assert table.apply(decision)
    assert not table.apply(decision)  # a repeat no longer applies
    with pytest.raises(InvalidTxnStatusError):
        table.decide(txnid, TxnEvent.ABORT, 6)
    with pytest.raises(InvalidTxnStatusError):
        table.register(txnid, partitions=[("late", 0)])
    with pytest.raises(InvalidTxnStatusError):
        table.verify_partition(txnid, "t", 0)  # a late write is refused
    assert table.apply(table.finish(txnid, 7))
    assert table.get(txnid).status is TxnStatus.COMMITTED  # type: ignore[union-attr]
    assert txnid not in table.txns and txnid in table.ended
    with pytest.raises(TxnNotFoundError):
        table.live(TxnID.of(3, 999))
    with pytest.raises(TxnNotFoundError):
        table.live(TxnID.of(4, EPOCH))  # another coordinator's


def test_the_table_lists_the_expired_once_and_a_decision_removes_a_deadline() -> None:
    table = booted()
    early = opened(table, timeout_ms=100, now_ms=0)
    decided = opened(table, timeout_ms=50, now_ms=0)
    late = opened(table, timeout_ms=500, now_ms=0)
    table.apply(table.decide(decided, TxnEvent.ABORT, 1))
    assert table.next_deadline() == 100
    assert table.expired(99) == []
    assert table.expired(100) == [early]
    assert table.expired(100) == []  # each once
    assert table.next_deadline() == 500 and table.expired(1000) == [late]


def test_a_table_restored_from_its_snapshot_is_the_same() -> None:
    table = booted()
    a, b, c = opened(table), opened(table), opened(table)
    table.register(a, partitions=[("t", 1)])
    table.apply(table.decide(b, TxnEvent.COMMIT, 1))
    table.apply(table.decide(c, TxnEvent.TIMEOUT, 1))
    table.apply(table.finish(c, 2))
    again = TxnTable(3)
    again.restore(table.snapshot())
    assert again.txns == table.txns and list(again.ended) == list(table.ended)
    assert again.get(c).timed_out  # type: ignore[union-attr]
    assert again.next_deadline() == table.next_deadline()
    again.apply(again.boot())
    assert again.next_txnid().counter == 2 * EPOCH  # above every id of the snapshot


# -- the coordinator ------------------------------------------------------------------


async def test_ids_carry_the_tcid_and_grow_across_restarts(open_tc: Opener) -> None:
    tc = await open_tc(7, Recorder())
    ids = [tc.new_txn() for _ in range(3)]
    await open_tc.close(tc)
    assert [i.tcid for i in ids] == [7, 7, 7]
    assert [i.counter for i in ids] == [EPOCH, EPOCH + 1, EPOCH + 2]
    tc = await open_tc(7, Recorder())
    try:
        again = tc.new_txn()
        assert again.counter == 2 * EPOCH and again > max(ids)
    finally:
        await open_tc.close(tc)


async def test_commit_tells_every_participant_then_logs_committed(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn()
        tc.add_partition(txn, "out", 0)
        tc.add_partition(txn, "out", 1)
        tc.add_partition(txn, "out", 0)
        tc.add_subscription(txn, "in", "copier")
        tc.verify_partition(txn, "out", 1)
        tc.verify_subscription(txn, "in", "copier")
        with pytest.raises(InvalidTxnStatusError):
            tc.verify_partition(txn, "out", 2)  # not added
        answered = tc.end_txn(txn, commit=True)
        # Decided and every participant told in the turn that read the END:
        assert tc.get(txn).status is TxnStatus.COMMITTING  # type: ignore[union-attr]
        assert rec.calls == [
            ("partition", "out", 0, txn, True),
            ("partition", "out", 1, txn, True),
            ("subscription", "in", "copier", txn, True),
        ]
        assert not answered.done()  # (the decision is not durable yet)
        await answered
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        await tc.end_txn(txn, commit=True)  # repeated END: success, nothing more
        with pytest.raises(InvalidTxnStatusError):
            tc.end_txn(txn, commit=False)
        with pytest.raises(InvalidTxnStatusError):
            tc.add_partition(txn, "late", 0)
        with pytest.raises(InvalidTxnStatusError):
            tc.verify_partition(txn, "out", 0)  # a late write is refused
        assert len(rec.calls) == 3
        # Logged: NEW, the decision naming the participants, the end. No registration.
        await until(lambda: tc._log.ledger.settled, "the end logged (lazily)")
        ops = [(r.metadata_op, r.new_status) for r in await records(tc)]
        assert ops == [
            (Op.BOOT, pb.OPEN),
            (Op.NEW, pb.OPEN),
            (Op.UPDATE, pb.COMMITTING),
            (Op.UPDATE, pb.COMMITTED),
        ]
    finally:
        await open_tc.close(tc)


async def test_participants_write_behind_the_decision_in_its_group_commit(
    open_tc: Opener,
) -> None:
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn()
        tc.add_partition(txn, "t", 0)
        tc.add_subscription(txn, "t", "s")
        await until(lambda: tc._log.ledger.settled, "the NEW record durable")
        commits = tc.store.commits
        answered = tc.end_txn(txn, commit=True)
        assert len(rec.written) == 2 and not any(w.done() for w in rec.written)
        await answered
        assert all(w.done() for w in rec.written)  # durable with the decision
        assert tc.store.commits == commits + 1
    finally:
        await open_tc.close(tc)


async def test_a_participant_that_has_to_wait_is_awaited_before_end_answers(
    open_tc: Opener,
) -> None:
    rec = Recorder(later=True)
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn()
        tc.add_partition(txn, "t", 0)
        answered = tc.end_txn(txn, commit=False)
        assert rec.calls == []
        await asyncio.wait_for(answered, 5)
        assert rec.calls == [("partition", "t", 0, txn, False)]
        await wait_status(tc, txn, TxnStatus.ABORTED)
    finally:
        await open_tc.close(tc)


async def test_unknown_transactions_are_not_found(open_tc: Opener) -> None:
    tc = await open_tc(1, Recorder())
    try:
        for ghost in (TxnID.of(1, 99), TxnID.of(2, 0)):
            with pytest.raises(TxnNotFoundError):
                tc.end_txn(ghost, commit=True)
            with pytest.raises(TxnNotFoundError):
                tc.add_partition(ghost, "t", 0)
            with pytest.raises(TxnNotFoundError):
                tc.verify_partition(ghost, "t", 0)
        with pytest.raises(ValueError):
            tc.new_txn(timeout_ms=-1)
    finally:
        await open_tc.close(tc)


async def test_failing_participants_are_retried_until_they_answer(
    open_tc: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tc")
    rec = Recorder(failures=3)
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn()
        tc.add_partition(txn, "t", 0)
        await tc.end_txn(txn, commit=False)
        await wait_status(tc, txn, TxnStatus.ABORTED)
        assert rec.calls == [("partition", "t", 0, txn, False)]
        # ERROR on the 1st and 2nd failure (then on the 4th, 8th, ...)
        said = f"partition t/0 did not apply the decision on {txn}"
        assert caplog.text.count(said) == 2
        assert f"partition t/0 applied {txn} at last" in caplog.text
        assert tc.stuck() == {}
        assert tc.participant_failures == 3
    finally:
        await open_tc.close(tc)


class Refuser(Recorder):
    """A participant that refuses every end on partition ``t/1`` (a bug or
    corruption there) until told to stop."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = True

    def end_txn_on_partition(
        self, topic: str, partition: int, end: TxnEnd
    ) -> Awaitable[None] | None:
        if self.refusing and (topic, partition) == ("t", 1):
            raise TxnConflictError(f"cannot commit {end.txnid}: it is aborted on this partition")
        return super().end_txn_on_partition(topic, partition, end)


async def wait_stuck(tc: TransactionCoordinator, txnid: TxnID, attempts: int = 1) -> None:
    def stuck() -> bool:
        found = tc.stuck(txnid).get(txnid, [])
        return bool(found) and found[0].attempts >= attempts

    await until(stuck, f"{txnid} stuck")


async def test_a_participant_that_refuses_is_listed_stuck_until_it_applies(
    open_tc: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Refuser()
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn()
        other = tc.new_txn()
        tc.add_partition(txn, "t", 0)
        tc.add_partition(txn, "t", 1)
        end = tc.end_txn(txn, commit=True)
        await wait_stuck(tc, txn, attempts=3)
        (stuck,) = tc.stuck()[txn]
        assert stuck.participant == "partition t/1"
        assert "it is aborted on this partition" in stuck.reason
        assert tc.stuck(other) == {}
        assert tc.get(txn).status is TxnStatus.COMMITTING  # type: ignore[union-attr]
        # ERROR once, then with backoff (the 1st, 2nd, 4th, ... failure), not every try
        said = f"partition t/1 did not apply the decision on {txn}"
        assert 2 <= caplog.text.count(said) < stuck.attempts
        with pytest.raises(NotStuckError):
            tc.resolve(other, "retry")
        with pytest.raises(NotStuckError):
            tc.resolve(txn, "retry", participant="partition t/0")
        with pytest.raises(ValueError, match="retry"):
            tc.resolve(txn, "ignore")
        rec.refusing = False  # (repaired)
        assert tc.resolve(txn, "retry") == 1
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        await end
        assert tc.stuck() == {}
        assert ("partition", "t", 1, txn, True) in rec.calls
    finally:
        await open_tc.close(tc)


async def test_an_operator_may_skip_a_stuck_participant(open_tc: Opener) -> None:
    rec = Refuser()
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn()
        tc.add_partition(txn, "t", 0)
        tc.add_partition(txn, "t", 1)
        end = tc.end_txn(txn, commit=True)
        await wait_stuck(tc, txn)
        assert tc.resolve(txn, "skip", participant="partition t/1") == 1
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        await end
        assert tc.stuck() == {}
        assert rec.calls == [("partition", "t", 0, txn, True)]  # t/1 left as it was
        await until(lambda: tc._log.ledger.settled, "the end durable")
    finally:
        await open_tc.close(tc)
    # The end is logged: a restart does not try the skipped participant again.
    rec2 = Refuser()
    tc = await open_tc(0, rec2)
    try:
        assert tc.get(txn).status is TxnStatus.COMMITTED  # type: ignore[union-attr]
        await asyncio.sleep(0.1)
        assert rec2.calls == [] and tc.stuck() == {}
    finally:
        await open_tc.close(tc)


async def test_timeout_aborts_and_a_later_commit_says_timeout(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn(timeout_ms=150)
        tc.add_subscription(txn, "in", "s")
        keep = tc.new_txn(timeout_ms=60_000)
        await wait_status(tc, txn, TxnStatus.ABORTED)
        assert rec.calls == [("subscription", "in", "s", txn, False)]
        with pytest.raises(TxnTimeoutError):
            tc.end_txn(txn, commit=True)
        await tc.end_txn(txn, commit=False)  # an abort is fine
        with pytest.raises(TxnTimeoutError, match="timed out"):
            tc.verify_subscription(txn, "in", "s")
        assert tc.get(keep).status is TxnStatus.OPEN  # type: ignore[union-attr]
    finally:
        await open_tc.close(tc)


async def test_a_timeout_expires_in_time_whatever_the_timer_was_set_for(
    open_tc: Opener,
) -> None:
    """The timer fires at the earliest deadline: a new earlier one moves it;
    one whose transaction ended first finds nothing and waits for the next."""
    tc = await open_tc(0, Recorder())
    try:
        keep = tc.new_txn(timeout_ms=60_000)
        short = tc.new_txn(timeout_ms=150)  # earlier than the timer
        await wait_status(tc, short, TxnStatus.ABORTED)
        ended = tc.new_txn(timeout_ms=200)
        await tc.end_txn(ended, commit=True)
        later = tc.new_txn(timeout_ms=400)
        await wait_status(tc, later, TxnStatus.ABORTED)
        assert tc.get(later).timed_out  # type: ignore[union-attr]
        assert not tc.get(ended).timed_out  # type: ignore[union-attr]
        assert tc.get(keep).status is TxnStatus.OPEN  # type: ignore[union-attr]
    finally:
        await open_tc.close(tc)


async def test_a_decided_transaction_is_finished_after_restart(open_tc: Opener) -> None:
    """Decided (COMMITTING durable) and stopped before its participants
    answered: the restarted coordinator finishes it from the decision
    record alone (registrations are not logged)."""
    first = Recorder(hang=True)
    tc = await open_tc(0, first)
    txn = tc.new_txn()
    tc.add_partition(txn, "t", 0)
    tc.add_subscription(txn, "t", "s")
    ending = tc.end_txn(txn, commit=True)
    await asyncio.sleep(0.1)  # (the decision durable; the participants never answer)
    assert tc.get(txn).status is TxnStatus.COMMITTING  # type: ignore[union-attr]
    assert not ending.done()
    await open_tc.close(tc)
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert sorted(rec.calls) == [
            ("partition", "t", 0, txn, True),
            ("subscription", "t", "s", txn, True),
        ]
        # Each was told everything it needs, with the epoch of the
        # coordinator that told it: 1 before the restart, 2 after.
        assert first.ends == [TxnEnd(txn, True, None, 1)] * 2
        assert rec.ends == [TxnEnd(txn, True, None, 2)] * 2
        assert tc.decision(txn) == TxnEnd(txn, True, None, 2)
    finally:
        await open_tc.close(tc)


async def test_a_producer_transaction_s_participants_are_told_its_producer(
    open_tc: Opener,
) -> None:
    """A participant never asks the coordinator back: the END it is told
    carries the producer and epoch the transaction belongs to."""
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        pid, epoch, _, _ = await tc.init_producer("app", 60_000)
        txn = tc.producer_add_partition(pid, epoch, "t", 0)
        tc.producer_add_subscription(pid, epoch, "in", "s")
        assert tc.decision(txn) is None  # (undecided)
        await tc.end_producer_txn(pid, epoch, commit=True)
        assert rec.ends == [TxnEnd(txn, True, (pid, epoch), 1)] * 2
        assert tc.decision(txn) == TxnEnd(txn, True, (pid, epoch), 1)
    finally:
        await open_tc.close(tc)


async def test_a_restart_aborts_open_transactions(open_tc: Opener) -> None:
    """An OPEN transaction may have lost a send or ack answered before it was
    durable, so a restart aborts it (the broker's participants abort what
    they hold of it, see test_txn_crash); a decided one is finished as
    decided."""
    tc = await open_tc(0, Recorder())
    with_data = tc.new_txn()
    tc.add_partition(with_data, "t", 0)
    tc.add_subscription(with_data, "t", "s")
    empty = tc.new_txn()
    committed = tc.new_txn(timeout_ms=20_000)
    tc.add_partition(committed, "t", 1)
    await tc.end_txn(committed, commit=True)
    await open_tc.close(tc)
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, with_data, TxnStatus.ABORTED)
        await wait_status(tc, empty, TxnStatus.ABORTED)
        assert rec.calls == []  # (its registrations were never logged)
        assert tc.get(committed).status is TxnStatus.COMMITTED  # type: ignore[union-attr]
        assert tc.get(committed).partitions == [("t", 1)]  # type: ignore[union-attr]  # (from the decision)
        assert tc.get(committed).timeout_ms == 20_000  # type: ignore[union-attr]
        with pytest.raises(InvalidTxnStatusError, match="open when the coordinator restarted"):
            tc.end_txn(with_data, commit=True)
        await tc.end_txn(with_data, commit=False)  # (an abort is answered with success)
        # One a crash forgot (its NEW not durable yet) is not known, and said why.
        with pytest.raises(TxnNotFoundError, match="open when the coordinator restarted"):
            tc.end_txn(TxnID.of(0, committed.counter + 100), commit=True)
    finally:
        await open_tc.close(tc)


async def test_a_restart_aborts_open_transactions_kept_in_a_snapshot(
    open_tc: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open transactions are in the snapshots (of the table in memory, with
    their registrations): after a restart they are known, and aborted on
    their participants; a commit of one is refused with why."""
    monkeypatch.setattr(log_module, "SNAPSHOT_EVERY", 1)
    tc = await open_tc(0, Recorder())
    open_one = tc.new_txn()
    tc.add_partition(open_one, "t", 0)
    other = tc.new_txn()
    await tc.end_txn(other, commit=False)  # (logged records: a snapshot after each)
    await open_tc.close(tc)
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, open_one, TxnStatus.ABORTED)
        assert rec.calls == [("partition", "t", 0, open_one, False)]
        with pytest.raises(InvalidTxnStatusError, match="open when the coordinator restarted"):
            tc.end_txn(open_one, commit=True)
    finally:
        await open_tc.close(tc)


async def test_snapshots_bound_the_log_and_recover_the_same_state(
    open_tc: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(log_module, "SNAPSHOT_EVERY", 20)
    tc = await open_tc(3, Recorder())
    ended = []
    for i in range(60):
        txn = tc.new_txn()
        tc.add_partition(txn, "t", i % 3)
        if i % 2:
            await tc.end_txn(txn, commit=bool(i % 4 == 1))
            ended.append((txn, TxnStatus.COMMITTED if i % 4 == 1 else TxnStatus.ABORTED))
    for txn, status in ended:
        await wait_status(tc, txn, status)
    ledger = tc._log.ledger
    await until(lambda: ledger.entry_count < 60, "the log trimmed behind snapshots")
    await open_tc.close(tc)
    tc = await open_tc(3, Recorder())
    try:
        assert [(t, tc.get(t).status) for t, _ in ended] == ended  # type: ignore[union-attr]
        assert tc.new_txn().counter == 2 * EPOCH
    finally:
        await open_tc.close(tc)


async def test_racing_ends_decide_once(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        txn = tc.new_txn()
        tc.add_partition(txn, "t", 0)
        first = tc.end_txn(txn, commit=True)
        with pytest.raises(InvalidTxnStatusError):
            tc.end_txn(txn, commit=False)
        again = tc.end_txn(txn, commit=True)  # the same END, while the first is under way
        await asyncio.gather(first, again)
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert rec.calls == [("partition", "t", 0, txn, True)]
    finally:
        await open_tc.close(tc)


KILLED_AFTER_NEW = r"""
import asyncio, os, signal, sys
from ledger import LedgerStore
from tc import TransactionCoordinator

class Nobody:
    def end_txn_on_partition(self, *args): return None
    def end_txn_on_subscription(self, *args): return None

async def main():
    store = await LedgerStore.open(sys.argv[1])
    tc = await TransactionCoordinator.open(0, store, Nobody())
    for _ in range(int(sys.argv[2])):
        print(tc.new_txn().counter, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # NEW records perhaps not durable yet

asyncio.run(main())
"""


async def test_ids_answered_before_a_crash_are_never_reissued(tmp_path: Path) -> None:
    """NEW is answered before its record is durable: after a SIGKILL right
    behind it, the restarted coordinator hands out new ids."""
    issued: set[int] = set()
    for run in range(3):
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", KILLED_AFTER_NEW, str(tmp_path / "broker.db"), "50"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == -signal.SIGKILL, done.stderr
        counters = {int(line) for line in done.stdout.split()}
        assert len(counters) == 50 and not counters & issued, run
        issued |= counters
    opener = Opener(tmp_path)
    tc = await opener(0, Recorder())
    try:
        assert tc.new_txn().counter > max(issued)
    finally:
        await opener.close(tc)


async def test_a_restart_tells_the_participants_registered_from_other_brokers(
    open_tc: Opener,
) -> None:
    """A participant on another broker registers through a logged REGISTER
    record: the restart that aborts the OPEN transaction knows to tell it
    (an in-memory registration would be forgotten, as above)."""
    tc = await open_tc(0, Recorder())
    txnid = tc.new_txn()
    await tc.register_remote(txnid, partitions=[("elsewhere", 2)])
    await tc.register_remote(txnid, subscriptions=[("elsewhere", "s")])
    done = tc.new_txn()
    await tc.end_txn(done, commit=False)
    with pytest.raises(InvalidTxnStatusError):
        tc.register_remote(done, partitions=[("elsewhere", 0)])  # (not OPEN: refused)
    with pytest.raises(TxnNotFoundError):
        tc.register_remote(TxnID.of(0, 10_000), partitions=[("elsewhere", 0)])
    await open_tc.close(tc)
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, txnid, TxnStatus.ABORTED)
        assert sorted((*c[:3], c[4]) for c in rec.calls) == [
            ("partition", "elsewhere", 2, False),
            ("subscription", "elsewhere", "s", False),
        ]
    finally:
        await open_tc.close(tc)


@pytest.mark.parametrize("logged", [False, True])
async def test_in_a_cluster_a_restart_tells_the_participants_registered_here(
    open_tc: Opener, logged: bool
) -> None:
    """A cluster's coordinator (``log_registrations``) logs the
    registrations of participants on its own broker too (a lazy REGISTER,
    made durable by the writes queued behind it): its recovery, on whichever
    broker, tells them its abort, for their topics may be on another broker
    than its own by then, where nobody else aborts what they hold. A single
    broker's does not (its participants abort the orphans themselves)."""
    tc = await open_tc(0, Recorder())
    tc.log_registrations = logged
    txnid = tc.new_txn()
    tc.add_partition(txnid, "here", 1)
    tc.add_subscription(txnid, "here", "s")
    tc.add_partition(txnid, "here", 1)  # (again: nothing more logged)
    await tc.end_txn(tc.new_txn(), commit=False)  # (durable, and what was queued before it)
    registers = [r for r in await records(tc) if r.metadata_op == Op.REGISTER]
    assert len(registers) == (2 if logged else 0)
    await open_tc.close(tc)
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, txnid, TxnStatus.ABORTED)
        told = sorted((*c[:3], c[4]) for c in rec.calls if c[3] == txnid)
        assert told == (
            [("partition", "here", 1, False), ("subscription", "here", "s", False)]
            if logged
            else []
        )
    finally:
        await open_tc.close(tc)


@pytest.mark.parametrize("logged", [False, True])
async def test_in_a_cluster_a_restart_tells_a_producer_transaction_s_participants_here(
    open_tc: Opener, logged: bool
) -> None:
    """The producer-epoch mode's sends and acks (`producer_add_partition`,
    `producer_add_subscription`) register through the same
    `add_partition` / `add_subscription`, so a cluster's coordinator logs
    them too: its recovery tells each participant on its own broker the
    abort, with the producer's identity (the participant's topic may have
    moved to another broker, which runs no orphan abort for this
    coordinator). A single broker's does not."""
    tc = await open_tc(0, Recorder())
    try:
        tc.log_registrations = logged
        pid, epoch, _, _ = await tc.init_producer("app", 60_000)
        txnid = tc.producer_add_partition(pid, epoch, "here", 1)
        assert tc.producer_add_subscription(pid, epoch, "here", "s") == txnid
        tc.producer_add_partition(pid, epoch, "here", 1)  # (again: nothing more logged)
        await tc.end_txn(tc.new_txn(), commit=False)  # (durable, and what was queued before)
        registers = [r for r in await records(tc) if r.metadata_op == Op.REGISTER]
    finally:
        await open_tc.close(tc)
    assert len(registers) == (2 if logged else 0)
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, txnid, TxnStatus.ABORTED)
        told = sorted((*c[:3], c[4]) for c in rec.calls if c[3] == txnid)
        assert told == (
            [("partition", "here", 1, False), ("subscription", "here", "s", False)]
            if logged
            else []
        )
        if logged:
            assert {e.producer for e in rec.ends if e.txnid == txnid} == {(pid, epoch)}
    finally:
        await open_tc.close(tc)


async def test_a_participant_registered_already_is_not_logged_again(open_tc: Opener) -> None:
    """A participant on another broker that checks each of its sends (a
    Kafka producer's batches) is logged once per transaction: a check of a
    participant logged already waits for the transaction's REGISTER record
    still on its way to disk, or is answered at once; a transaction no
    longer OPEN is still refused, and a new participant is still logged."""
    tc = await open_tc(0, Recorder())
    try:
        tc.log_registrations = True
        ledger = tc._log.ledger
        txnid = tc.new_txn()
        first = tc.register_remote(txnid, partitions=[("elsewhere", 2)])
        again = tc.register_remote(txnid, partitions=[("elsewhere", 2)])  # (before it is durable)
        assert not again.done()
        await again
        assert first.done() and ledger.settled
        for _ in range(5):  # (each answered at once: durable already)
            written = tc.register_remote(txnid, partitions=[("elsewhere", 2)])
            assert written.done()
            await written
        # A lazy REGISTER (the producer-epoch mode adds the participant first)
        # starts no write: a check right behind it logs its own, not lazy.
        tc.add_subscription(txnid, "elsewhere", "s")
        await tc.register_remote(txnid, subscriptions=[("elsewhere", "s")])
        await tc.register_remote(txnid, subscriptions=[("elsewhere", "s")])
        await tc.register_remote(txnid, partitions=[("elsewhere", 2), ("elsewhere", 3)])
        await tc.register_remote(txnid, partitions=[("elsewhere", 3)])
        registers = [r for r in await records(tc) if r.metadata_op == Op.REGISTER]
        assert [
            [(p.topic, p.partition) for p in r.partitions]
            + [(s.topic, s.subscription) for s in r.subscriptions]
            for r in registers
        ] == [
            [("elsewhere", 2)],
            [("elsewhere", "s")],
            [("elsewhere", "s")],
            [("elsewhere", 2), ("elsewhere", 3)],
        ]
        await tc.end_txn(txnid, commit=False)
        with pytest.raises(InvalidTxnStatusError):
            tc.register_remote(txnid, partitions=[("elsewhere", 2)])  # (not OPEN: refused)
        assert tc._registering == {}
    finally:
        await open_tc.close(tc)


class Elsewhere(Recorder):
    """Every participant is on another broker: its tell notes whether the
    decision was durable when it ran."""

    def __init__(self, tc_holder: list[TransactionCoordinator]) -> None:
        super().__init__()
        self.holder = tc_holder
        self.durable_when_told: list[bool] = []

    def end_txn_on_partition(
        self, topic: str, partition: int, end: TxnEnd
    ) -> Awaitable[None] | None:
        async def tell() -> None:
            (tc,) = self.holder
            log_ledger = tc.store.get_ledger("tc/0")
            assert log_ledger is not None
            self.durable_when_told.append(log_ledger.settled)  # (the decision durable)
            self._record("partition", topic, partition, end.txnid, end.commit)

        raise ParticipantElsewhere(f"partition {topic}/{partition}", tell)


class Moved(Recorder):
    """Partition 0 is on another broker, which refuses the END because the
    coordinator's slot has moved (its tell raises `CoordinatorMoved`);
    partition 1 is here."""

    def __init__(self) -> None:
        super().__init__()
        self.tells = 0

    def end_txn_on_partition(
        self, topic: str, partition: int, end: TxnEnd
    ) -> Awaitable[None] | None:
        if partition == 1:
            return super().end_txn_on_partition(topic, partition, end)

        async def tell() -> None:
            self.tells += 1
            raise CoordinatorMoved("the slot's epoch is 7 now")

        raise ParticipantElsewhere(f"partition {topic}/{partition}", tell)


async def test_a_coordinator_whose_slot_moved_stops_telling_quietly(
    open_tc: Opener, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A tell that finds the coordinator's slot moved to another broker is
    not tried again, nor listed as stuck, nor logged at ERROR (one WARNING
    for the coordinator), and the end is not logged: the slot's new owner
    tells and finishes it. The other participants are told as ever."""
    monkeypatch.setattr(participants_module, "END_WAIT", 0.05)
    rec = Moved()
    tc = await open_tc(0, rec)
    try:
        with caplog.at_level(logging.INFO, logger="tc"):
            for _ in range(2):
                txnid = tc.new_txn()
                tc.add_partition(txnid, "t", 0)
                tc.add_partition(txnid, "t", 1)
                await tc.end_txn(txnid, commit=True)  # (answered after END_WAIT)
                await until(lambda: not tc._channel._tasks, "the channel to stop telling")
                assert tc.get(txnid).status is TxnStatus.COMMITTING  # type: ignore[union-attr]
                assert (txnid, True) in [(c[3], c[4]) for c in rec.calls if c[2] == 1]
        assert rec.tells == 2  # (once each: not tried again)
        assert tc.stuck() == {}
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    finally:
        await open_tc.close(tc)


async def test_a_participant_elsewhere_is_told_once_the_decision_is_durable(
    open_tc: Opener,
) -> None:
    holder: list[TransactionCoordinator] = []
    rec = Elsewhere(holder)
    tc = await open_tc(0, rec)
    holder.append(tc)
    try:
        txnid = tc.new_txn()
        tc.add_partition(txnid, "t", 0)
        await tc.end_txn(txnid, commit=True)
        assert [c[:3] for c in rec.calls] == [("partition", "t", 0)]
        assert rec.durable_when_told == [True]
        await wait_status(tc, txnid, TxnStatus.COMMITTED)
    finally:
        await open_tc.close(tc)
