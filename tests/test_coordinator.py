"""The transaction coordinator on its own: status table, log, recovery, timeouts.

The participant here is a recorder (a unit test of the coordinator); the
real broker participant is exercised by the integration and crash tests.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tc._coordinator as coordinator_module
from tc import (
    TRANSITIONS,
    InvalidTxnStatusError,
    TransactionCoordinator,
    TxnEvent,
    TxnID,
    TxnNotFoundError,
    TxnStatus,
    TxnTimeoutError,
    check_update,
    transition,
)


class Recorder:
    """Records participant calls; can fail the first few, or block."""

    def __init__(self, failures: int = 0, block: bool = False) -> None:
        self.calls: list[tuple[str, str, object, TxnID, bool]] = []
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
        self, topic: str, partition: int, txnid: TxnID, commit: bool
    ) -> None:
        await self._call("partition", topic, partition, txnid, commit)

    async def end_txn_on_subscription(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool
    ) -> None:
        await self._call("subscription", topic, subscription, txnid, commit)


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


async def test_ids_carry_the_tcid_and_the_counter_survives_restart(tmp_path: Path) -> None:
    tc = await TransactionCoordinator.open(7, tmp_path, Recorder())
    ids = [await tc.new_txn() for _ in range(3)]
    await tc.close()
    assert [i.tcid for i in ids] == [7, 7, 7]
    assert [i.counter for i in ids] == [0, 1, 2]
    tc = await TransactionCoordinator.open(7, tmp_path, Recorder())
    try:
        again = await tc.new_txn()
        assert again.counter == 3 and again not in ids
        assert tc.get(ids[1]) is not None and tc.get(ids[1]).status is TxnStatus.OPEN  # type: ignore[union-attr]
    finally:
        await tc.close()


async def test_commit_tells_every_participant_then_logs_committed(tmp_path: Path) -> None:
    rec = Recorder()
    tc = await TransactionCoordinator.open(0, tmp_path, rec)
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


async def test_unknown_transactions_are_not_found(tmp_path: Path) -> None:
    tc = await TransactionCoordinator.open(1, tmp_path, Recorder())
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


async def test_failing_participants_are_retried_until_they_answer(tmp_path: Path) -> None:
    rec = Recorder(failures=3)
    tc = await TransactionCoordinator.open(0, tmp_path, rec)
    try:
        txn = await tc.new_txn()
        await tc.add_partitions(txn, [("t", 0)])
        await tc.end_txn(txn, commit=False)
        assert tc.get(txn).status is TxnStatus.ABORTING  # type: ignore[union-attr]
        await wait_status(tc, txn, TxnStatus.ABORTED)
        assert rec.calls == [("partition", "t", 0, txn, False)]
    finally:
        await tc.close()


async def test_timeout_aborts_and_a_later_commit_says_timeout(tmp_path: Path) -> None:
    rec = Recorder()
    tc = await TransactionCoordinator.open(0, tmp_path, rec)
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


async def test_a_decided_transaction_is_finished_after_restart(tmp_path: Path) -> None:
    tc = await TransactionCoordinator.open(0, tmp_path, Recorder(block=True))
    txn = await tc.new_txn()
    await tc.add_partitions(txn, [("t", 0), ("t", 1)])
    await tc.end_txn(txn, commit=True)
    assert tc.get(txn).status is TxnStatus.COMMITTING  # type: ignore[union-attr]
    await tc.close()  # "crash" while the participants never answered
    rec = Recorder()
    tc = await TransactionCoordinator.open(0, tmp_path, rec)
    try:
        await wait_status(tc, txn, TxnStatus.COMMITTED)
        assert [c[:3] for c in rec.calls] == [("partition", "t", 0), ("partition", "t", 1)]
        assert all(c[4] is True for c in rec.calls)
    finally:
        await tc.close()


async def test_open_transaction_past_its_timeout_is_aborted_after_restart(
    tmp_path: Path,
) -> None:
    tc = await TransactionCoordinator.open(0, tmp_path, Recorder())
    txn = await tc.new_txn(timeout_ms=200)
    await tc.add_partitions(txn, [("t", 0)])
    await tc.close()
    await asyncio.sleep(0.3)
    rec = Recorder()
    tc = await TransactionCoordinator.open(0, tmp_path, rec)
    try:
        await wait_status(tc, txn, TxnStatus.ABORTED)
        assert rec.calls == [("partition", "t", 0, txn, False)]
    finally:
        await tc.close()


async def test_snapshots_bound_the_log_and_recover_the_same_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(coordinator_module, "SNAPSHOT_EVERY", 20)
    tc = await TransactionCoordinator.open(3, tmp_path, Recorder())
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
    tc = await TransactionCoordinator.open(3, tmp_path, Recorder())
    try:
        after = {m.txnid: (m.status, m.partitions) for m in tc.transactions()}
        assert {t: after[t] for t in open_} == {t: before[t] for t in open_}
        assert {t: after[t][0] for t in ended} == {t: before[t][0] for t in ended}
        assert (await tc.new_txn()).counter == 60
    finally:
        await tc.close()


async def test_racing_ends_decide_once(tmp_path: Path) -> None:
    rec = Recorder()
    tc = await TransactionCoordinator.open(0, tmp_path, rec)
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
