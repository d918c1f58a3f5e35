"""The transaction coordinator on its own: status table, log, recovery, timeouts.

The participant here is a recorder (a unit test of the coordinator); the
real broker participant is exercised by the integration and crash tests.
Every request test runs twice: with the log in a file of its own (records
applied once durable) and in a store shared with the participants (records
applied as appended, what the broker does).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import tc._coordinator as coordinator_module
from buffer import TxnConflictError
from ledger import Ledger, LedgerStore
from proto import txnbuf_pb2 as pb
from tc import (
    TRANSITIONS,
    InvalidTxnStatusError,
    NotStuckError,
    TransactionCoordinator,
    TxnEvent,
    TxnID,
    TxnNotFoundError,
    TxnStatus,
    TxnTimeoutError,
    check_update,
    transition,
)

Op = pb.TransactionMetadataEntry


class Recorder:
    """Records participant calls; can fail the first few, or block."""

    def __init__(self, failures: int = 0, block: bool = False) -> None:
        self.calls: list[tuple[str, str, object, TxnID, bool]] = []
        self.durable: list[bool] = []  # the durable argument of each call
        self.failures = failures
        self.block = block

    async def _call(self, kind: str, topic: str, what: object, txnid: TxnID, commit: bool) -> None:
        if self.block:
            await asyncio.Event().wait()
        if self.failures > 0:
            self.failures -= 1
            raise ConnectionError("participant unavailable")
        self.calls.append((kind, topic, what, txnid, commit))

    async def end_txn_on_partition(
        self, topic: str, partition: int, txnid: TxnID, commit: bool, durable: bool = True
    ) -> None:
        self.durable.append(durable)
        await self._call("partition", topic, partition, txnid, commit)

    async def end_txn_on_subscription(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool, durable: bool = True
    ) -> None:
        self.durable.append(durable)
        await self._call("subscription", topic, subscription, txnid, commit)


class Opener:
    """Opens coordinators on ``tmp_path`` in one of the two log layouts; closing
    a coordinator closes its store too (a restart reopens both)."""

    def __init__(self, path: Path, shared: bool) -> None:
        self.path = path
        self.shared = shared

    async def __call__(self, tcid: int, participant: Recorder) -> TransactionCoordinator:
        if not self.shared:
            return await TransactionCoordinator.open(tcid, self.path, participant)
        store = await LedgerStore.open(self.path / "broker.db")
        tc = await TransactionCoordinator.open(
            tcid, store, participant, participants_share_store=True
        )
        tc._owns_store = True
        return tc

    def counter_after_restart(self, issued: int) -> int:
        """The first counter a reopened coordinator hands out after ``issued`` ids."""
        return max(issued, coordinator_module.ID_BLOCK) if self.shared else issued


@pytest.fixture(params=["own-file", "shared-store"])
def open_tc(request: pytest.FixtureRequest, tmp_path: Path) -> Opener:
    return Opener(tmp_path, request.param == "shared-store")


async def wait_status(tc: TransactionCoordinator, txnid: TxnID, status: TxnStatus) -> None:
    for _ in range(200):
        meta = tc.get(txnid)
        if meta is not None and meta.status is status:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{txnid} never reached {status}: {tc.get(txnid)}")


# -- the table ---------------------------------------------------------------------


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
        check_update(TxnStatus.OPEN, TxnStatus.COMMITTED)


# -- requests ----------------------------------------------------------------------


async def test_ids_carry_the_tcid_and_the_counter_survives_restart(open_tc: Opener) -> None:
    tc = await open_tc(7, Recorder())
    ids = [await tc.new_txn() for _ in range(3)]
    await tc.close()
    assert [i.tcid for i in ids] == [7, 7, 7]
    assert [i.counter for i in ids] == [0, 1, 2]
    tc = await open_tc(7, Recorder())
    try:
        again = await tc.new_txn()
        assert again.counter == open_tc.counter_after_restart(3) and again not in ids
        assert tc.get(ids[1]) is not None and tc.get(ids[1]).status is TxnStatus.OPEN  # type: ignore[union-attr]
    finally:
        await tc.close()


async def test_commit_tells_every_participant_then_logs_committed(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        txn = await tc.new_txn()
        await tc.add_partitions(txn, [("out", 0), ("out", 1), ("out", 0)])
        await tc.add_subscriptions(txn, [("in", "copier")])
        tc.verify_partition(txn, "out", 1)
        tc.verify_subscription(txn, "in", "copier")
        with pytest.raises(InvalidTxnStatusError):
            tc.verify_partition(txn, "out", 2)  # not added
        await tc.end_txn(txn, commit=True)
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert rec.calls == [
            ("partition", "out", 0, txn, True),
            ("partition", "out", 1, txn, True),
            ("subscription", "in", "copier", txn, True),
        ]
        await tc.end_txn(txn, commit=True)  # repeated END: success, nothing more
        with pytest.raises(InvalidTxnStatusError):
            await tc.end_txn(txn, commit=False)
        with pytest.raises(InvalidTxnStatusError):
            await tc.add_partitions(txn, [("late", 0)])
        with pytest.raises(InvalidTxnStatusError):
            tc.verify_partition(txn, "out", 0)  # a late write is refused
        assert len(rec.calls) == 3
    finally:
        await tc.close()


async def test_unknown_transactions_are_not_found(open_tc: Opener) -> None:
    tc = await open_tc(1, Recorder())
    try:
        for ghost in (TxnID.of(1, 99), TxnID.of(2, 0)):
            with pytest.raises(TxnNotFoundError):
                await tc.end_txn(ghost, commit=True)
            with pytest.raises(TxnNotFoundError):
                await tc.add_partitions(ghost, [("t", 0)])
            with pytest.raises(TxnNotFoundError):
                tc.verify_partition(ghost, "t", 0)
        with pytest.raises(ValueError):
            await tc.new_txn(timeout_ms=-1)
    finally:
        await tc.close()


async def test_failing_participants_are_retried_until_they_answer(
    open_tc: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tc")
    rec = Recorder(failures=3)
    tc = await open_tc(0, rec)
    try:
        txn = await tc.new_txn()
        await tc.add_partitions(txn, [("t", 0)])
        await tc.end_txn(txn, commit=False)
        # (ABORTED logged already when the log is applied as appended)
        assert tc.get(txn).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)  # type: ignore[union-attr]
        await wait_status(tc, txn, TxnStatus.ABORTED)
        assert rec.calls == [("partition", "t", 0, txn, False)]
        # ERROR on the 1st and 2nd failure (then on the 4th, 8th, ...)
        said = f"partition t/0 did not apply the decision on {txn}"
        assert caplog.text.count(said) == 2
        assert f"partition t/0 applied {txn} at last" in caplog.text
        assert tc.stuck() == {}
        assert tc.participant_failures == 3
    finally:
        await tc.close()


class Refuser(Recorder):
    """A participant that refuses every end on partition ``t/1`` (a bug or
    corruption there) until told to stop."""

    def __init__(self) -> None:
        super().__init__()
        self.refusing = True

    async def end_txn_on_partition(
        self, topic: str, partition: int, txnid: TxnID, commit: bool, durable: bool = True
    ) -> None:
        if self.refusing and (topic, partition) == ("t", 1):
            raise TxnConflictError(f"cannot commit {txnid}: it is aborted on this partition")
        await super().end_txn_on_partition(topic, partition, txnid, commit, durable)


async def wait_stuck(tc: TransactionCoordinator, txnid: TxnID, attempts: int = 1) -> None:
    for _ in range(500):
        stuck = tc.stuck(txnid).get(txnid, [])
        if stuck and stuck[0].attempts >= attempts:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{txnid} never stuck: {tc.stuck()}")


async def test_a_participant_that_refuses_is_listed_stuck_until_it_applies(
    open_tc: Opener, caplog: pytest.LogCaptureFixture
) -> None:
    rec = Refuser()
    tc = await open_tc(0, rec)
    try:
        txn = await tc.new_txn()
        other = await tc.new_txn()
        await tc.add_partitions(txn, [("t", 0), ("t", 1)])
        end = asyncio.ensure_future(tc.end_txn(txn, commit=True))
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
        await tc.close()


async def test_an_operator_may_skip_a_stuck_participant(open_tc: Opener) -> None:
    rec = Refuser()
    tc = await open_tc(0, rec)
    try:
        txn = await tc.new_txn()
        await tc.add_partitions(txn, [("t", 0), ("t", 1)])
        end = asyncio.ensure_future(tc.end_txn(txn, commit=True))
        await wait_stuck(tc, txn)
        assert tc.resolve(txn, "skip", participant="partition t/1") == 1
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        await end
        assert tc.stuck() == {}
        assert rec.calls == [("partition", "t", 0, txn, True)]  # t/1 left as it was
    finally:
        await tc.close()
    # The end is logged: a restart does not try the skipped participant again.
    rec2 = Refuser()
    tc = await open_tc(0, rec2)
    try:
        assert tc.get(txn).status is TxnStatus.COMMITTED  # type: ignore[union-attr]
        await asyncio.sleep(0.1)
        assert rec2.calls == [] and tc.stuck() == {}
    finally:
        await tc.close()


async def test_timeout_aborts_and_a_later_commit_says_timeout(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        txn = await tc.new_txn(timeout_ms=150)
        await tc.add_subscriptions(txn, [("in", "s")])
        keep = await tc.new_txn(timeout_ms=60_000)
        await wait_status(tc, txn, TxnStatus.ABORTED)
        assert rec.calls == [("subscription", "in", "s", txn, False)]
        with pytest.raises(TxnTimeoutError):
            await tc.end_txn(txn, commit=True)
        await tc.end_txn(txn, commit=False)  # an abort is fine
        assert tc.get(keep).status is TxnStatus.OPEN  # type: ignore[union-attr]
    finally:
        await tc.close()


async def test_a_timeout_expires_in_time_whatever_the_expiry_loop_sleeps_until(
    open_tc: Opener,
) -> None:
    """The loop sleeps until the earliest deadline: a new earlier one wakes
    it, a later one does not need to (it wakes at a deadline whose
    transaction ended, finds nothing, and sleeps again)."""
    tc = await open_tc(0, Recorder())
    try:
        keep = await tc.new_txn(timeout_ms=60_000)
        short = await tc.new_txn(timeout_ms=150)  # earlier than the loop's wake-up
        await wait_status(tc, short, TxnStatus.ABORTED)
        ended = await tc.new_txn(timeout_ms=200)
        await tc.end_txn(ended, commit=True)  # the loop still sleeps until its deadline
        later = await tc.new_txn(timeout_ms=400)
        await wait_status(tc, later, TxnStatus.ABORTED)
        assert tc.get(later).timed_out  # type: ignore[union-attr]
        assert tc.get(keep).status is TxnStatus.OPEN  # type: ignore[union-attr]
    finally:
        await tc.close()


async def test_a_decided_transaction_is_finished_after_restart(open_tc: Opener) -> None:
    tc = await open_tc(0, Recorder(block=True))
    txn = await tc.new_txn()
    await tc.add_partitions(txn, [("t", 0), ("t", 1)])
    await tc.end_txn(txn, commit=True)
    assert tc.get(txn).status is TxnStatus.COMMITTING  # type: ignore[union-attr]
    await tc.close()  # "crash" while the participants never answered
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert [c[:3] for c in rec.calls] == [("partition", "t", 0), ("partition", "t", 1)]
        assert all(c[4] is True for c in rec.calls)
    finally:
        await tc.close()


async def test_open_transaction_past_its_timeout_is_aborted_after_restart(
    open_tc: Opener,
) -> None:
    tc = await open_tc(0, Recorder())
    txn = await tc.new_txn(timeout_ms=200)
    await tc.add_partitions(txn, [("t", 0)])
    await tc.close()
    await asyncio.sleep(0.3)
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        await wait_status(tc, txn, TxnStatus.ABORTED)
        assert rec.calls == [("partition", "t", 0, txn, False)]
    finally:
        await tc.close()


async def test_snapshots_bound_the_log_and_recover_the_same_state(
    open_tc: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinator_module, "SNAPSHOT_EVERY", 20)
    tc = await open_tc(3, Recorder())
    ended, open_ = [], []
    for i in range(60):
        txn = await tc.new_txn()
        await tc.add_partitions(txn, [("t", i % 3)])
        if i % 2:
            await tc.end_txn(txn, commit=bool(i % 4 == 1))
            ended.append(txn)
        else:
            open_.append(txn)
    for txn in ended:
        await wait_status(
            tc, txn, TxnStatus.COMMITTED if txn.counter % 4 == 1 else TxnStatus.ABORTED
        )
    before = {m.txnid: (m.status, m.partitions) for m in tc.transactions()}
    ledger = tc._ledger
    assert ledger.entry_count < 60  # trimmed behind snapshots
    await tc.close()
    tc = await open_tc(3, Recorder())
    try:
        after = {m.txnid: (m.status, m.partitions) for m in tc.transactions()}
        assert {t: after[t] for t in open_} == {t: before[t] for t in open_}
        assert {t: after[t][0] for t in ended} == {t: before[t][0] for t in ended}
        assert (await tc.new_txn()).counter == open_tc.counter_after_restart(60)
    finally:
        await tc.close()


async def test_racing_ends_decide_once(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(0, rec)
    try:
        txn = await tc.new_txn()
        await tc.add_partitions(txn, [("t", 0)])
        results = await asyncio.gather(
            tc.end_txn(txn, commit=True), tc.end_txn(txn, commit=False), return_exceptions=True
        )
        assert results[0] is None
        assert isinstance(results[1], InvalidTxnStatusError)
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert rec.calls == [("partition", "t", 0, txn, True)]
    finally:
        await tc.close()


# -- a log shared with the participants ------------------------------------------


class Writer(Recorder):
    """A participant that writes its end of a transaction to the coordinator's
    store, as the broker does, and notes how far the coordinator's log was
    durable when it was asked and when its own write was."""

    def __init__(self, tc_ledger: Callable[[], Ledger], store: Callable[[], LedgerStore]) -> None:
        super().__init__()
        self.tc_ledger = tc_ledger
        self.store = store
        self.seen: list[tuple[int, int]] = []  # (log durable when asked, when written)

    async def end_txn_on_partition(
        self, topic: str, partition: int, txnid: TxnID, commit: bool, durable: bool = True
    ) -> None:
        asked = self.tc_ledger().last_entry_id
        mine = await self.store().open_ledger(f"marker/{topic}/{partition}")
        await mine.append(b"commit" if commit else b"abort")
        self.seen.append((asked, self.tc_ledger().last_entry_id))


async def test_participants_write_behind_the_decision_without_waiting_for_it(
    open_tc: Opener,
) -> None:
    tc: TransactionCoordinator | None = None
    writer = Writer(lambda: tc._ledger, lambda: tc.store)  # type: ignore[union-attr]
    tc = await open_tc(0, writer)
    try:
        txn = await tc.new_txn()
        await tc.add_partitions(txn, [("t", 0)])
        await tc.add_partitions(txn, [("t", 0)])  # (durable: NEW and ADD_PARTITION)
        before = tc._ledger.last_entry_id
        await tc.end_txn(txn, commit=True)
        ((asked, written),) = writer.seen
        # The participant's write is never durable before the decision...
        assert written > before
        # ...and only a coordinator sharing the store lets it write before
        # the decision is durable (they then share a group commit).
        assert asked == (before if open_tc.shared else before + 1)
    finally:
        await tc.close()


async def test_only_a_shared_store_lets_participants_answer_once_queued(
    open_tc: Opener,
) -> None:
    recorder = Recorder()
    tc = await open_tc(0, recorder)
    try:
        for commit in (True, False):
            txn = await tc.new_txn()
            await tc.add_partitions(txn, [("t", 0)])
            await tc.add_subscriptions(txn, [("t", "s")])
            await tc.end_txn(txn, commit=commit)
        # With its own log, what a participant queued may be durable before
        # the decision's end record or not: it must wait for durability.
        assert recorder.durable == [not open_tc.shared] * 4
    finally:
        await tc.close()


async def test_a_shared_store_registers_at_once(open_tc: Opener) -> None:
    tc = await open_tc(0, Recorder())
    try:
        txn = await tc.new_txn()
        durable = tc.add_partitions(txn, [("t", 0)])
        waiting = tc.partition_registration(txn, "t", 0)
        if open_tc.shared:
            assert waiting is None  # a send right behind it is taken at once
            tc.verify_partition(txn, "t", 0)
        else:
            assert waiting is not None  # a send waits for the log write
        await durable
        assert tc.partition_registration(txn, "t", 0) is None
    finally:
        await tc.close()


async def test_a_shared_store_reserves_ids_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinator_module, "ID_BLOCK", 8)
    opener = Opener(tmp_path, shared=True)
    tc = await opener(0, Recorder())
    ids = []
    for _ in range(5):  # many waiting on one reservation, in rounds
        ids += await asyncio.wait_for(asyncio.gather(*(tc.new_txn() for _ in range(64))), 10)
    assert sorted(i.counter for i in ids) == list(range(320))
    await tc.close()
    tc = await opener(0, Recorder())
    try:
        assert (await tc.new_txn()).counter >= 320
    finally:
        await tc.close()


KILLED_AFTER_NEW = r"""
import asyncio, os, signal, sys
from ledger import LedgerStore
from tc import TransactionCoordinator

class Nobody:
    async def end_txn_on_partition(self, *args, **kwargs): pass
    async def end_txn_on_subscription(self, *args, **kwargs): pass

async def main():
    store = await LedgerStore.open(sys.argv[1])
    tc = await TransactionCoordinator.open(0, store, Nobody(), participants_share_store=True)
    for _ in range(int(sys.argv[2])):
        print((await tc.new_txn()).counter, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # NEW records perhaps not durable yet

asyncio.run(main())
"""


async def test_ids_answered_before_a_crash_are_never_reissued(tmp_path: Path) -> None:
    """NEW is answered before its record is durable (shared store): after a
    SIGKILL right behind it, the restarted coordinator hands out new ids."""
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
    tc = await Opener(tmp_path, shared=True)(0, Recorder())
    try:
        assert (await tc.new_txn()).counter not in issued
    finally:
        await tc.close()


async def _open_early(path: Path, rec: Recorder) -> TransactionCoordinator:
    """A coordinator as the broker runs it: its log in the participants'
    store, participants answering early, open transactions aborted on restart."""
    store = await LedgerStore.open(path / "broker.db")
    tc = await TransactionCoordinator.open(
        0, store, rec, participants_share_store=True, abort_open_on_recovery=True
    )
    tc._owns_store = True
    return tc


def _logged_ops(entries: list[tuple[int, bytes]]) -> list[int]:
    return [
        pb.TransactionMetadataEntry.FromString(data).metadata_op
        for meta, data in entries
        if meta == 0
    ]


async def test_a_restart_aborts_open_transactions_whose_participants_answer_early(
    tmp_path: Path,
) -> None:
    """``abort_open_on_recovery`` (the broker's setting): an OPEN transaction
    may have lost a registration, send or ack answered before it was
    durable, so a restart aborts it; a decided one is finished as decided.
    Registrations are not logged then: the coordinator tells no participant
    of the abort (the broker's participants abort what they hold, see
    test_txn_crash), while a decision names its participants."""
    tc = await _open_early(tmp_path, Recorder())
    assert tc.participants_answer_early
    early = tc.add_partitions(await tc.new_txn(), [("t", 9)])
    assert early.done()  # answered once appended
    with_data = await tc.new_txn()
    await tc.add_partitions(with_data, [("t", 0)])
    await tc.add_subscriptions(with_data, [("t", "s")])
    empty = await tc.new_txn()
    committed = tc.new_txn_now(timeout_ms=20_000)  # (at once: no turn of the loop)
    assert committed is not None
    await tc.add_partitions(committed, [("t", 1)])
    await tc.end_txn(committed, commit=True)
    await tc.close()
    rec = Recorder()
    tc = await _open_early(tmp_path, rec)
    try:
        await wait_status(tc, with_data, TxnStatus.ABORTED)
        await wait_status(tc, empty, TxnStatus.ABORTED)
        assert rec.calls == []
        assert tc.get(with_data).partitions == [] and tc.get(with_data).subscriptions == []
        assert tc.get(committed).status is TxnStatus.COMMITTED
        assert tc.get(committed).partitions == [("t", 1)]  # (from the decision record)
        assert tc.get(committed).timeout_ms == 20_000
        entries = await tc._ledger.read(0, tc._ledger.last_entry_id)
        ops = _logged_ops([(e.meta, e.data) for e in entries])
        assert Op.ADD_PARTITION not in ops and Op.ADD_SUBSCRIPTION not in ops
        with pytest.raises(InvalidTxnStatusError, match="open when the broker restarted"):
            await tc.end_txn(with_data, commit=True)
        await tc.end_txn(with_data, commit=False)  # (an abort is answered with success)
        # One a crash forgot (its NEW not durable yet) is not known, and said why.
        with pytest.raises(TxnNotFoundError, match="open when the broker restarted"):
            await tc.end_txn(TxnID.of(0, committed.counter + 100), commit=True)
    finally:
        await tc.close()


async def test_a_decision_whose_participants_never_answered_is_finished_after_a_restart(
    tmp_path: Path,
) -> None:
    """Decided (COMMITTING durable) and stopped before its participants
    answered, where registrations are not logged: the restarted coordinator
    finishes it from the decision record alone."""
    tc = await _open_early(tmp_path, Recorder(block=True))
    txn = await tc.new_txn()
    await tc.add_partitions(txn, [("t", 0)])
    await tc.add_subscriptions(txn, [("t", "s")])
    ending = asyncio.get_running_loop().create_task(tc.end_txn(txn, commit=True))
    for _ in range(200):  # until the decision is durable
        meta = tc.get(txn)
        if meta.status is TxnStatus.COMMITTING and tc._ledger.last_entry_id >= 1:
            break
        await asyncio.sleep(0.01)
    await tc.close()  # (the participants never answered: no COMMITTED record)
    ending.cancel()
    rec = Recorder()
    tc = await _open_early(tmp_path, rec)
    try:
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert sorted(rec.calls) == [
            ("partition", "t", 0, txn, True),
            ("subscription", "t", "s", txn, True),
        ]
    finally:
        await tc.close()


async def test_a_restart_aborts_open_transactions_kept_in_a_snapshot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Open transactions are in the snapshots (of the map in memory): after a
    restart they are known, and aborted; a commit of one is refused with why,
    an abort answered with success."""
    monkeypatch.setattr(coordinator_module, "SNAPSHOT_EVERY", 1)
    tc = await _open_early(tmp_path, Recorder())
    open_one = await tc.new_txn()
    await tc.add_partitions(open_one, [("t", 0)])
    other = await tc.new_txn()
    await tc.end_txn(other, commit=False)  # (logged records: a snapshot after each)
    await tc.close()
    rec = Recorder()
    tc = await _open_early(tmp_path, rec)
    try:
        await wait_status(tc, open_one, TxnStatus.ABORTED)
        # (The snapshot has its registrations from memory: it tells them.)
        assert rec.calls == [("partition", "t", 0, open_one, False)]
        with pytest.raises(InvalidTxnStatusError, match="open when the broker restarted"):
            await tc.end_txn(open_one, commit=True)
        await tc.end_txn(open_one, commit=False)  # (an abort is answered with success)
    finally:
        await tc.close()


async def test_by_default_a_restart_keeps_open_transactions(open_tc: Opener) -> None:
    tc = await open_tc(0, Recorder())
    assert not tc.participants_answer_early
    txn = await tc.new_txn()
    await tc.add_partitions(txn, [("t", 0)])
    await tc.close()
    tc = await open_tc(0, Recorder())
    try:
        assert tc.get(txn).status is TxnStatus.OPEN
    finally:
        await tc.close()


async def test_join_adds_a_participant_once_and_only_while_open(open_tc: Opener) -> None:
    """KIP-890 part 2: the broker adds the partition / subscription that a
    send or ack names (`join_partition`, `join_subscription`)."""
    tc = await open_tc(0, Recorder())
    try:
        txn = await tc.new_txn()
        waiting = tc.join_partition(txn, "t", 0)
        if open_tc.shared:
            assert waiting is None  # registered as appended: the send goes on
        else:
            assert waiting is not None  # the send waits for the log write
            assert await waiting
        assert tc.join_partition(txn, "t", 0) is None  # registered: nothing more
        sub_waiting = tc.join_subscription(txn, "t", "s")
        if sub_waiting is not None:
            await sub_waiting
        meta = tc.get(txn)
        assert meta is not None
        assert meta.partitions == [("t", 0)] and meta.subscriptions == [("t", "s")]
        await tc.add_partitions(txn, [("t", 1)])  # (a barrier: every record is durable)
        logged = [
            pb.TransactionMetadataEntry.FromString(e.data)
            for e in await tc._ledger.read(0, tc._ledger.last_entry_id)
            if e.meta == 0  # a record, not a snapshot
        ]
        adds = [
            [(p.topic, p.partition) for p in r.partitions]
            + [(s.topic, s.subscription) for s in r.subscriptions]
            for r in logged
            if r.metadata_op in (r.ADD_PARTITION, r.ADD_SUBSCRIPTION)
        ]
        assert adds == [[("t", 0)], [("t", "s")], [("t", 1)]]  # one record each
        await tc.end_txn(txn, commit=True)
        with pytest.raises(InvalidTxnStatusError):
            tc.join_partition(txn, "t", 2)
        with pytest.raises(TxnNotFoundError):
            tc.join_subscription(TxnID(0, 999_999), "t", "s")
        assert ("t", 2) not in meta.partitions
    finally:
        await tc.close()


class Queuing(Recorder):
    """A `QueuingParticipant`: ends a transaction at once by appending its
    record to the coordinator's store, unless told to refuse (then the
    coordinator asks the async way)."""

    def __init__(self, store: Callable[[], LedgerStore], refuse: bool = False) -> None:
        super().__init__()
        self.store = store
        self.refuse = refuse
        self.at_once: list[tuple[str, object, TxnID, bool]] = []
        self.written: list[asyncio.Future[int]] = []

    def _now(self, kind: str, what: object, txnid: TxnID, commit: bool) -> bool:
        if self.refuse:
            return False
        self.at_once.append((kind, what, txnid, commit))
        ledger = self.store().get_ledger("participant")
        assert ledger is not None
        self.written.append(ledger.append(b"commit" if commit else b"abort"))
        return True

    def end_txn_on_partition_now(
        self, topic: str, partition: int, txnid: TxnID, commit: bool
    ) -> bool:
        return self._now("partition", partition, txnid, commit)

    def end_txn_on_subscription_now(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool
    ) -> bool:
        return self._now("subscription", subscription, txnid, commit)


async def test_end_at_once_decides_and_tells_every_participant_in_one_turn(
    tmp_path: Path,
) -> None:
    """The broker's END path: the decision is logged and every participant
    queues its write behind it in the same turn of the loop (one group
    commit), and END may be answered once the decision is durable."""
    tc: TransactionCoordinator | None = None
    participant = Queuing(lambda: tc.store)  # type: ignore[union-attr]
    tc = await _open_early(tmp_path, participant)
    try:
        await tc.store.open_ledger("participant")
        txn = await tc.new_txn()
        tc.join_partition(txn, "t", 0)
        tc.join_subscription(txn, "t", "s")
        commits = tc.store.commits
        answered = tc.end_txn_at_once(txn, commit=True)
        assert answered is not None and not answered.done()
        assert participant.at_once == [
            ("partition", 0, txn, True),
            ("subscription", "s", txn, True),
        ]
        assert tc.get(txn).status is TxnStatus.COMMITTING  # (applied as appended)
        await answered
        assert all(w.done() for w in participant.written)  # durable with the decision
        assert tc.store.commits == commits + 1
        assert participant.calls == []  # (the async way was not needed)
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert tc.end_txn_at_once(txn, commit=True) is None  # (a repeat: end_txn answers it)
        await tc.end_txn(txn, commit=True)
        with pytest.raises(TxnNotFoundError):
            tc.end_txn_at_once(TxnID(0, 999_999), commit=True)
    finally:
        await tc.close()


async def test_end_at_once_falls_back_to_telling_participants_in_a_task(
    tmp_path: Path,
) -> None:
    tc: TransactionCoordinator | None = None
    participant = Queuing(lambda: tc.store, refuse=True)  # type: ignore[union-attr]
    tc = await _open_early(tmp_path, participant)
    try:
        txn = await tc.new_txn()
        tc.join_partition(txn, "t", 0)
        answered = tc.end_txn_at_once(txn, commit=False)
        assert answered is not None
        await asyncio.wait_for(answered, 5)
        assert participant.calls == [("partition", "t", 0, txn, False)]  # the async way
        assert participant.durable == [False]
        await wait_status(tc, txn, TxnStatus.ABORTED)
    finally:
        await tc.close()


async def test_end_at_once_needs_records_applied_as_appended(tmp_path: Path) -> None:
    tc = await Opener(tmp_path, shared=False)(0, Recorder())
    try:
        txn = await tc.new_txn()
        assert tc.end_txn_at_once(txn, commit=True) is None  # (its own log: end_txn)
        await tc.end_txn(txn, commit=True)
    finally:
        await tc.close()
