"""The producer-epoch mode in the coordinator: the registry of transactional
ids, fencing, the epoch bump per transaction (KIP-890) and two-phase
commit (KIP-939). The participant is the recorder of test_coordinator."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import tc._producers as producers_module
from tc import (
    MAX_EPOCH,
    InvalidPidMappingError,
    InvalidProducerEpochError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    InvalidTxnStatusError,
    ProducerFencedError,
    ProducerSettings,
    TransactionAbortableError,
    TransactionCoordinator,
    TwoPhaseCommitNotAllowedError,
    TxnStatus,
    coordinator_of,
)
from tests.test_coordinator import Opener as CoordinatorOpener
from tests.test_coordinator import Recorder, wait_status

TWO_PC = ProducerSettings(allow_two_phase=True)


class Opener(CoordinatorOpener):
    """test_coordinator's opener, for coordinator 3, 2PC allowed by default."""

    async def __call__(  # type: ignore[override]
        self, participant: Recorder | None = None, settings: ProducerSettings = TWO_PC
    ) -> TransactionCoordinator:
        return await super().__call__(3, participant or Recorder(), settings)


@pytest.fixture
def open_tc(tmp_path: Path) -> Opener:
    return Opener(tmp_path)


def test_a_transactional_id_always_maps_to_the_same_coordinator() -> None:
    ids = [0, 5, 9]
    picked = {coordinator_of(f"copier-{i}", ids) for i in range(200)}
    assert picked == set(ids)  # spread over all of them...
    assert all(coordinator_of(f"copier-{i}", [9, 0, 5]) == coordinator_of(f"copier-{i}", ids)
               for i in range(200))  # fmt: skip  # ...the same whatever the order


async def test_init_gives_a_new_id_then_fences_the_older_instance(open_tc: Opener) -> None:
    tc = await open_tc()
    try:
        pid, epoch, ongoing_pid, ongoing_epoch = await tc.init_producer("copier", 60_000)
        assert (epoch, ongoing_pid, ongoing_epoch) == (0, -1, -1)
        assert pid >> 47 == 3  # producer ids carry their coordinator
        other, _, _, _ = await tc.init_producer("other", 60_000)
        assert other != pid
        tc.producer_add_partition(pid, 0, "out", 0)  # begins the transaction
        again = await tc.init_producer("copier", 60_000)  # a new instance
        assert again == (pid, 1, -1, -1)
        # The older instance is fenced everywhere: send, ack, commit, abort.
        with pytest.raises(ProducerFencedError, match="fenced by a newer instance"):
            tc.producer_add_partition(pid, 0, "out", 1)
        with pytest.raises(ProducerFencedError):
            tc.producer_add_subscription(pid, 0, "in", "s")
        with pytest.raises(ProducerFencedError):
            tc.end_producer_txn(pid, 0, commit=True)
        with pytest.raises(ProducerFencedError):
            await tc.prepare_producer_txn(pid, 0)
        with pytest.raises(InvalidProducerEpochError):
            tc.producer_add_partition(pid, 5, "out", 0)  # an epoch it never had
        with pytest.raises(InvalidPidMappingError):
            tc.producer_add_partition(12345, 0, "out", 0)
    finally:
        await open_tc.close(tc)


async def test_init_rolls_the_unfinished_transaction_back_before_answering(
    open_tc: Opener,
) -> None:
    rec = Recorder()
    tc = await open_tc(rec)
    try:
        pid, _, _, _ = await tc.init_producer("copier", 60_000)
        txnid = tc.producer_add_partition(pid, 0, "out", 0)
        await tc.init_producer("copier", 60_000)
        assert tc.get(txnid).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)  # type: ignore[union-attr]
        assert rec.calls == [("partition", "out", 0, txnid, False)]  # told before the answer
        assert tc.producer("copier").ongoing is None  # type: ignore[union-attr]
    finally:
        await open_tc.close(tc)


async def test_each_end_bumps_the_epoch_and_a_late_write_is_refused(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(rec)
    try:
        pid, _, _, _ = await tc.init_producer("copier", 60_000)
        first = tc.producer_add_partition(pid, 0, "out", 0)
        assert tc.producer_add_subscription(pid, 0, "in", "s") == first  # the same transaction
        assert tc.get(first).producer == (pid, 0)  # type: ignore[union-attr]
        assert await tc.end_producer_txn(pid, 0, commit=True) == (pid, 1)
        await wait_status(tc, first, TxnStatus.COMMITTED)
        with pytest.raises(InvalidProducerEpochError, match="ended its transaction"):
            tc.producer_add_partition(pid, 0, "out", 0)  # a late write of the ended one
        second = tc.producer_add_partition(pid, 1, "out", 0)  # the next one begins
        assert second != first
        assert await tc.end_producer_txn(pid, 1, commit=False) == (pid, 2)
        await wait_status(tc, second, TxnStatus.ABORTED)
        # Nothing ongoing: an abort still bumps the epoch; a commit is refused
        # (clients send no END for a transaction that wrote nothing, so a
        # restart lost it) and changes nothing.
        with pytest.raises(TransactionAbortableError, match="has no transaction here"):
            await tc.end_producer_txn(pid, 2, commit=True)
        assert await tc.end_producer_txn(pid, 2, commit=False) == (pid, 3)
        # A retried abort (its answer lost) is answered with the same identity.
        assert await tc.end_producer_txn(pid, 2, commit=False) == (pid, 3)
    finally:
        await open_tc.close(tc)


async def test_a_retried_end_is_answered_with_the_identity_it_was_given(
    open_tc: Opener,
) -> None:
    tc = await open_tc()
    try:
        pid, _, _, _ = await tc.init_producer("copier", 60_000)
        tc.producer_add_partition(pid, 0, "out", 0)
        assert await tc.end_producer_txn(pid, 0, commit=True) == (pid, 1)
        # The answer was lost; the client retries with epoch - 1.
        assert await tc.end_producer_txn(pid, 0, commit=True) == (pid, 1)
        with pytest.raises(InvalidProducerEpochError):
            tc.end_producer_txn(pid, 0, commit=False)  # not the same command: refused
    finally:
        await open_tc.close(tc)


async def test_epoch_overflow_takes_a_new_producer_id(
    open_tc: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KIP-890 §Bump Epoch: producer x at epoch MAX-1 commits; the answer is
    a new producer id z at epoch 0; a retry with (x, MAX-1) gets (z, 0).
    (Aborts with nothing ongoing step the epochs up: each bumps it.)"""
    monkeypatch.setattr(producers_module, "MAX_EPOCH", 3)
    tc = await open_tc()
    try:
        x, _, _, _ = await tc.init_producer("copier", 60_000)
        assert await tc.end_producer_txn(x, 0, commit=False) == (x, 1)
        assert await tc.end_producer_txn(x, 1, commit=False) == (x, 2)  # MAX - 1
        txnid = tc.producer_add_partition(x, 2, "out", 0)
        z, zero = await tc.end_producer_txn(x, 2, commit=True)
        assert z != x and zero == 0
        await wait_status(tc, txnid, TxnStatus.COMMITTED)
        assert await tc.end_producer_txn(x, 2, commit=True) == (z, 0)  # the retry
        with pytest.raises(InvalidProducerEpochError):
            tc.producer_add_partition(x, 2, "out", 0)
        tc.producer_add_partition(z, 0, "out", 0)
        assert tc.producer("copier").identity == (z, 0)  # type: ignore[union-attr]
        # InitProducerId overflows the same way.
        assert await tc.end_producer_txn(z, 0, commit=False) == (z, 1)
        assert await tc.end_producer_txn(z, 1, commit=False) == (z, 2)
        w, w_epoch, _, _ = await tc.init_producer("copier", 60_000)
        assert w not in (x, z) and w_epoch == 0
    finally:
        await open_tc.close(tc)
    assert MAX_EPOCH == 32767


async def test_a_timeout_aborts_bumps_the_epoch_and_the_client_may_abort_and_go_on(
    open_tc: Opener,
) -> None:
    rec = Recorder()
    tc = await open_tc(rec)
    try:
        pid, _, _, _ = await tc.init_producer("copier", 200)
        txnid = tc.producer_add_partition(pid, 0, "out", 0)
        await wait_status(tc, txnid, TxnStatus.ABORTED)
        assert tc.get(txnid).timed_out  # type: ignore[union-attr]
        assert tc.producer("copier").identity == (pid, 1)  # type: ignore[union-attr]
        with pytest.raises(TransactionAbortableError, match="abort it and begin the next"):
            tc.producer_add_partition(pid, 0, "out", 0)  # a late write is refused
        with pytest.raises(TransactionAbortableError):
            tc.end_producer_txn(pid, 0, commit=True)
        assert await tc.end_producer_txn(pid, 0, commit=False) == (pid, 1)  # abort: fine
        tc.producer_add_partition(pid, 1, "out", 0)  # and the next transaction begins
    finally:
        await open_tc.close(tc)


async def test_the_registry_survives_a_restart_and_open_transactions_are_aborted(
    open_tc: Opener,
) -> None:
    tc = await open_tc()
    pid, _, _, _ = await tc.init_producer("copier", 60_000)
    txnid = tc.producer_add_partition(pid, 0, "out", 0)
    await tc.init_producer("idle", 60_000)
    await asyncio.sleep(0.05)  # (the lazy records durable)
    await open_tc.close(tc)
    tc = await open_tc()
    try:
        await wait_status(tc, txnid, TxnStatus.ABORTED)
        entry = tc.producer("copier")
        assert entry is not None and entry.identity == (pid, 1) and entry.ongoing is None
        assert entry.bumped_by == "coordinator"
        with pytest.raises(TransactionAbortableError):
            tc.producer_add_partition(pid, 0, "out", 0)
        assert {e.transactional_id for e in tc.producers()} == {"copier", "idle"}
        # Producer ids handed out before the restart are never handed out again.
        new, _, _, _ = await tc.init_producer("third", 60_000)
        assert new not in (pid, tc.producer("idle").producer_id)  # type: ignore[union-attr]
    finally:
        await open_tc.close(tc)


async def test_transactional_ids_expire_when_idle(open_tc: Opener) -> None:
    tc = await open_tc(settings=ProducerSettings(expiration_ms=200))
    try:
        pid, _, _, _ = await tc.init_producer("copier", 60_000)
        busy, _, _, _ = await tc.init_producer("busy", 60_000)
        tc.producer_add_partition(busy, 0, "out", 0)  # ongoing: never expires
        await asyncio.sleep(0.6)
        assert tc.producer("copier") is None and tc.producer("busy") is not None
        with pytest.raises(InvalidPidMappingError, match="expired"):
            tc.producer_add_partition(pid, 0, "out", 0)
    finally:
        await open_tc.close(tc)


async def test_limits_on_init(open_tc: Opener) -> None:
    tc = await open_tc(settings=ProducerSettings())
    try:
        with pytest.raises(InvalidTransactionTimeoutError):
            await tc.init_producer("copier", 15 * 60 * 1000 + 1)
        with pytest.raises(InvalidTransactionTimeoutError):
            await tc.init_producer("copier", 0)
        with pytest.raises(TwoPhaseCommitNotAllowedError, match="TWO_PHASE_COMMIT"):
            await tc.init_producer("copier", 60_000, two_phase=True)
        with pytest.raises(InvalidTxnStateError):
            await tc.init_producer("", 60_000)
        assert tc.producers() == []  # refused: nothing registered
    finally:
        await open_tc.close(tc)


async def test_a_prepared_transaction_survives_restarts_and_never_times_out(
    open_tc: Opener,
) -> None:
    rec = Recorder()
    tc = await open_tc(rec)
    pid, _, _, _ = await tc.init_producer("dual", 100, two_phase=True)
    txnid = tc.producer_add_partition(pid, 0, "out", 0)
    tc.producer_add_subscription(pid, 0, "in", "s")
    assert await tc.prepare_producer_txn(pid, 0) == (pid, 0)
    assert tc.get(txnid).status is TxnStatus.PREPARED  # type: ignore[union-attr]
    with pytest.raises(InvalidTxnStateError, match="prepared"):
        tc.producer_add_partition(pid, 0, "out", 1)  # no writes after prepare
    await asyncio.sleep(0.3)  # past its timeout: a two-phase transaction has none
    assert tc.get(txnid).status is TxnStatus.PREPARED  # type: ignore[union-attr]
    await open_tc.close(tc)  # the broker crashes...
    tc = await open_tc(Recorder())
    try:
        await asyncio.sleep(0.1)
        meta = tc.get(txnid)
        assert meta is not None and meta.status is TxnStatus.PREPARED
        assert meta.partitions == [("out", 0)] and meta.subscriptions == [("in", "s")]
        # ...and so does the producer: the new instance keeps the prepared one.
        new_pid, new_epoch, ongoing_pid, ongoing_epoch = await tc.init_producer(
            "dual", 100, two_phase=True, keep_prepared=True
        )
        assert (new_pid, new_epoch) == (pid, 1) and (ongoing_pid, ongoing_epoch) == (pid, 0)
        with pytest.raises(InvalidTxnStateError, match="keeping its prepared"):
            tc.producer_add_partition(new_pid, new_epoch, "out", 0)
        with pytest.raises(ProducerFencedError):
            tc.end_producer_txn(pid, 0, commit=True)  # the old instance is fenced
        assert await tc.end_producer_txn(new_pid, new_epoch, commit=True) == (pid, 2)
        await wait_status(tc, txnid, TxnStatus.COMMITTED)
    finally:
        await open_tc.close(tc)


async def test_keep_prepared_with_two_epoch_overflows_step_by_step(
    open_tc: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KIP-939's walk-through (MAX = 3): the prepared transaction keeps its
    identity across InitProducerId(keep_prepared) calls while the client's
    identity is bumped, overflowing to a new id; the commit answers a third."""
    monkeypatch.setattr(producers_module, "MAX_EPOCH", 3)
    tc = await open_tc()
    try:
        x, _, _, _ = await tc.init_producer("flink", 100, two_phase=True)
        assert await tc.end_producer_txn(x, 0, commit=False) == (x, 1)
        assert await tc.end_producer_txn(x, 1, commit=False) == (x, 2)  # MAX - 1
        # 1-2. Ongoing at (x, MAX-1), prepared; 3. the client crashes.
        txnid = tc.producer_add_partition(x, 2, "out", 0)
        await tc.prepare_producer_txn(x, 2)
        # 4. InitProducerId(keep): the next epoch would reach MAX: the client
        # gets a new id y at epoch 0; the transaction stays (x, MAX-1).
        y, y_epoch, ox, oe = await tc.init_producer("flink", 100, True, True)
        assert y != x and (y_epoch, ox, oe) == (0, x, 2)
        # 6-8. A crash loop: y's epoch goes up; the transaction's identity stays.
        assert await tc.init_producer("flink", 100, True, True) == (y, 1, x, 2)
        assert await tc.init_producer("flink", 100, True, True) == (y, 2, x, 2)
        # 9. Commit from (y, MAX-1): y overflows too; the answer is a third id z.
        z, z_epoch = await tc.end_producer_txn(y, 2, commit=True)
        assert z not in (x, y) and z_epoch == 0
        await wait_status(tc, txnid, TxnStatus.COMMITTED)
        assert tc.get(txnid).producer == (x, 2)  # type: ignore[union-attr]  # markers' identity
        # A retry of that commit with (y, 2) gets (z, 0) again.
        assert await tc.end_producer_txn(y, 2, commit=True) == (z, 0)
    finally:
        await open_tc.close(tc)


async def test_prepare_needs_two_phase_and_forced_termination_aborts(open_tc: Opener) -> None:
    rec = Recorder()
    tc = await open_tc(rec)
    try:
        pid, _, _, _ = await tc.init_producer("plain", 60_000)
        tc.producer_add_partition(pid, 0, "out", 0)
        with pytest.raises(InvalidTxnStateError, match="two-phase"):
            tc.prepare_producer_txn(pid, 0)  # (refused at once, nothing queued)
        dual, _, _, _ = await tc.init_producer("dual", 60_000, two_phase=True)
        txnid = tc.producer_add_partition(dual, 0, "out", 1)
        await tc.prepare_producer_txn(dual, 0)
        assert await tc.terminate_producer("dual") == (dual, 1)
        assert tc.get(txnid).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)  # type: ignore[union-attr]
        with pytest.raises(ProducerFencedError):
            tc.end_producer_txn(dual, 0, commit=True)
        # A producer's transaction commits only through its producer.
        with pytest.raises(InvalidTxnStateError, match="through that producer"):
            tc.end_txn(tc.producer("plain").ongoing, commit=True)  # type: ignore[arg-type,union-attr]
        with pytest.raises(InvalidTxnStatusError):
            await tc.prepare_txn(txnid)  # (aborted: nothing to prepare)
    finally:
        await open_tc.close(tc)


async def test_an_operator_abort_of_a_producers_transaction_is_abortable_for_it(
    open_tc: Opener,
) -> None:
    tc = await open_tc()
    try:
        pid, _, _, _ = await tc.init_producer("copier", 60_000)
        txnid = tc.producer_add_partition(pid, 0, "out", 0)
        await tc.end_txn(txnid, commit=False)  # the admin API's abort
        with pytest.raises(TransactionAbortableError):
            tc.producer_add_partition(pid, 0, "out", 0)
        assert await tc.end_producer_txn(pid, 0, commit=False) == (pid, 1)
        assert tc.active_open_time_max_ms() == 0
        tc.producer_add_partition(pid, 1, "out", 0)
        await asyncio.sleep(0.05)
        assert tc.active_open_time_max_ms() >= 40
    finally:
        await open_tc.close(tc)


async def test_a_producers_begin_and_end_are_one_record_each(open_tc: Opener) -> None:
    """The begin of a producer's transaction is its NEW record carrying the
    registry's change, its END the decision carrying the new identity:
    one coordinator record each (the end record follows, as for any
    transaction), and a restart replays them to the same registry."""
    tc = await open_tc()
    ledger = tc.store.get_ledger("tc/3")
    assert ledger is not None
    try:
        pid, _, _, _ = await tc.init_producer("copier", 60_000)
        before = ledger.next_entry_id
        txnid = await tc.producer_begin(pid, 0, "add out/0")
        assert ledger.next_entry_id - before == 1  # NEW + the producer's ongoing transaction
        entry = tc.producer("copier")
        assert entry is not None and entry.ongoing == txnid
        tc.add_partition(txnid, "out", 0)
        before = ledger.next_entry_id
        ended = tc.end_producer_txn(pid, 0, commit=True)
        assert ledger.next_entry_id - before == 1  # COMMITTING + the bumped identity
        assert await ended == (pid, 1)
        await wait_status(tc, txnid, TxnStatus.COMMITTED)
        entry = tc.producer("copier")
        assert entry is not None and entry.identity == (pid, 1) and entry.ongoing is None
        second = tc.producer_add_partition(pid, 1, "out", 0)
        await asyncio.sleep(0.05)  # (the lazy records durable)
    finally:
        await open_tc.close(tc)
    tc = await open_tc()
    try:
        entry = tc.producer("copier")
        # (the restart aborted the open one, bumping the identity again)
        assert entry is not None and entry.prev_producer_id == pid and entry.ongoing is None
        assert entry.identity == (pid, 2) and entry.bumped_by == "coordinator"
        await wait_status(tc, second, TxnStatus.ABORTED)
        assert tc.get(txnid).status is TxnStatus.COMMITTED  # type: ignore[union-attr]
    finally:
        await open_tc.close(tc)
