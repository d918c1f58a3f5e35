"""A transaction coordinator (PIP-31 §Transaction Coordinator): requests,
log and recovery around a `TxnTable`.

Each coordinator has an id (TCID) and its own log, the ledger ``tc/<id>``
(`tc._log`), in the store its participants (the broker's partitions and
subscriptions) write to. In that store append order is durability order
(`ledger`): a record appended after another is durable only with it. So a
record is applied to the table as it is appended (`log_record`), and what
follows it (a participant's writes behind the decision, the next record)
can be queued at once, in the same group commit, without waiting for it.

The coordinator is split by job, as Kafka's is (``TransactionCoordinator``,
``TransactionStateManager``, ``TransactionMarkerChannelManager``):

- this module: the requests, the log and recovery, timeouts;
- `tc._table` and `tc._status`: what it knows, as data (no I/O);
- `tc._participants`: telling the participants of a decided transaction
  (retries, stuck ones, an operator's resolve) and END's answer;
- `tc._epoch_mode` (and `tc._producers`, its data): the producer-epoch mode.

One path per request:

- NEW (`new_txn`): the NEW record (OPEN) is appended and the id answered at
  once. A crash may forget a transaction with no durable participant write
  yet (its client gets TxnNotFound and starts again), never one whose data
  is durable: that data is behind its NEW record. Ids carry the epoch of
  the coordinator's start (`tc._table`), so one answered before a crash is
  never handed out again.
- Registration (`add_partition`, `add_subscription`): in memory, not logged
  (the decision record names every participant), except in a cluster
  (`log_registrations`: a participant's topic may move to another broker
  than the coordinator's, where only a logged registration tells the
  recovered coordinator to tell it); sends and acks are checked
  against it (`verify_partition`, `verify_subscription`: KIP-890's defense).
  A participant on another broker (a cluster) registers with
  `register_remote`, which is logged (a REGISTER record) and answered once
  durable: its send is answered once durable too, so a recovery that
  aborts the transaction must know to tell it. A participant logged already
  is not logged again (a Kafka producer's participant checks every batch).
- END (`end_txn`): the decision (COMMITTING / ABORTING) is appended
  (`decide`), and every participant told at once (`tc._participants`):
  each queues its commit marker or ack commit right behind it, in the turn
  of the loop that read the END, so a transaction's sends, its decision and
  its markers share one group commit. END is answered once the decision is
  durable and every participant has applied it (or `END_WAIT` after the
  decision is durable; the channel goes on telling). Then the end
  (COMMITTED / ABORTED) is logged (`_finished`). PIP-31 answers END once
  the decision is logged; waiting until the participants have queued their
  markers means a client's next send lands after them, and a consumer sees
  the committed messages once commit() returns.
- A local transaction's commit (`commit_local`): the broker checks its
  sends and acks, queues them, and this coordinator queues the one record
  that commits it (OPEN -> COMMITTED, naming its participants) behind them,
  in the same turn: one group commit holds the transaction's writes and its
  outcome, so a crash leaves all of it or none of it, and there is nobody
  to tell afterwards. `local_commit_check` tells a first commit (the
  transaction is OPEN) from a retry whose answer was lost (it is COMMITTED:
  answered once durable, nothing written twice).
- Timeouts: OPEN transactions past their deadline are aborted, and so are
  PREPARED ones past their prepared timeout, if they were opened with one
  (a sorted index of deadlines in the table, one timer).
- Groups (`commit_group`): one GROUP record commits a set of PREPARED
  transactions and aborts others, as one decision, idempotently under a
  key (see `tc._table`); each is then told to its participants and
  finished as an END's decision is. `abort_tagged` aborts the undecided
  transactions of a tag.
- Recovery: replay the log into the table (`TxnLog.replay`), log BOOT (a new
  id epoch) and wait for it, finish every decided transaction, and abort
  every one left OPEN: its registrations, sends and acks were answered once
  queued, so some may be lost; its participants abort what they hold of it
  (the broker asks them, `broker.Broker`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable

from ledger import LedgerStore, all_of, pass_failure, resolved, then
from proto import TxnID, wire_txnid
from tc._epoch_mode import ProducerEpochMode, ProducerSettings
from tc._log import TxnLog, apply_record
from tc._participants import (
    END_WAIT,
    Participant,
    ParticipantChannel,
    StuckParticipant,
    TxnEnd,
)
from tc._producers import InvalidTxnStateError, ProducerEntry, ProducerRegistry
from tc._status import InvalidTxnStatusError, TxnEvent, TxnStatus, status_of
from tc._table import (
    Record,
    TxnArgumentError,
    TxnMeta,
    TxnTable,
    TxnTimeoutError,
    now_ms,
    same_outcome,
)

__all__ = ["TransactionCoordinator"]

log = logging.getLogger(__name__)

_UNDECIDED = (TxnStatus.OPEN, TxnStatus.PREPARED)  # not decided: nothing to finish
MAX_SPARES_KEPT = 10_000  # spares remembered for `is_spare` (newest kept)


class TransactionCoordinator:
    """Create with `TransactionCoordinator.open`; `close` stops its tasks."""

    def __init__(
        self,
        tcid: int,
        store: LedgerStore,
        txn_log: TxnLog,
        participant: Participant,
        settings: ProducerSettings | None = None,
    ) -> None:
        self.tcid = tcid
        self.store = store
        self._log = txn_log
        self.settings = settings or ProducerSettings()
        # Log the registrations of participants on this broker too (a
        # cluster's broker sets it: `_log_registration`).
        self.log_registrations = False
        # The REGISTER record of each OPEN transaction last appended and not
        # yet durable (dropped once it is), and whether it was lazy:
        # `register_remote` of a participant logged already waits for it
        # instead of logging it again.
        self._registering: dict[TxnID, tuple[asyncio.Future[int], bool]] = {}
        self._table = TxnTable(tcid)
        self._producers = ProducerRegistry(tcid)
        self._channel = ParticipantChannel(tcid, participant, self._finished)
        self._epoch_mode = ProducerEpochMode(self, self._producers, self.settings)
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0  # ms: when the expiry timer fires (0: none set)
        self._closed = False
        self._aborted_at_start: set[TxnID] = set()  # (for a clearer error)
        # Transactions opened as a client's spare (`new_txn(spare=True)`),
        # newest last, at most MAX_SPARES_KEPT: memory only (`is_spare`).
        self._spares: dict[TxnID, None] = {}
        # Local transactions' commits not durable yet (`commit_local`).
        self._local_writes: dict[TxnID, asyncio.Future[int]] = {}
        # Transactions opened, ended (committed / aborted, the timed out
        # ones among the aborted) since start, for stats.
        self.txns_begun = 0
        self.txns_committed = 0
        self.txns_aborted = 0
        self.txns_timed_out = 0

    @classmethod
    async def open(
        cls,
        tcid: int,
        store: LedgerStore,
        participant: Participant,
        settings: ProducerSettings | None = None,
    ) -> TransactionCoordinator:
        """Open coordinator ``tcid``: its log is the ledger ``tc/<tcid>`` in
        ``store``, where ``participant`` keeps every partition and
        subscription it ends transactions on. Returns once recovered."""
        ledger = await store.open_ledger(f"tc/{tcid}")
        tc = cls(tcid, store, TxnLog(ledger), participant, settings)
        await tc._recover()
        return tc

    async def close(self) -> None:
        self._closed = True
        self._log.closed = True
        if self._expiry is not None:
            self._expiry.cancel()
        self._epoch_mode.close()
        await self._channel.close()

    # -- queries --------------------------------------------------------------------

    def get(self, txnid: TxnID) -> TxnMeta | None:
        return self._table.get(txnid)

    def transactions(self) -> list[TxnMeta]:
        """Every transaction not ended, and the recently ended ones."""
        return [*self._table.txns.values(), *self._table.ended.values()]

    def is_open(self, txnid: TxnID) -> bool:
        """Whether ``txnid`` is known here as OPEN."""
        return self._table.is_open(txnid)

    def verify_partition(self, txnid: TxnID, topic: str, partition: int) -> None:
        """KIP-890's check before a transactional write: OPEN, partition added."""
        self._table.verify_partition(txnid, topic, partition)

    def verify_subscription(self, txnid: TxnID, topic: str, subscription: str) -> None:
        """The same check before a transactional acknowledgement."""
        self._table.verify_subscription(txnid, topic, subscription)

    def transactions_tagged(self, tag: str, prefix: bool = False) -> list[TxnMeta]:
        """The transactions not ended tagged ``tag`` (``prefix``: whose tag
        starts with it), oldest first."""
        return self._table.with_tag(tag, prefix)

    def active_open_time_max_ms(self) -> int:
        """KIP-939's active-transaction-open-time-max: the longest any
        transaction not yet decided (OPEN or PREPARED) has been open."""
        now = now_ms()
        starts = [m.start_ms for m in self._table.txns.values() if m.status in _UNDECIDED]
        return max((now - s for s in starts), default=0)

    @property
    def participant_failures(self) -> int:
        """Failed attempts to end a transaction on a participant, ever."""
        return self._channel.failures

    def stuck(self, txnid: TxnID | None = None) -> dict[TxnID, list[StuckParticipant]]:
        """The decided transactions (or just ``txnid``) with a participant
        that failed to apply the decision, and those participants."""
        return self._channel.stuck(txnid)

    def resolve(self, txnid: TxnID, action: str, participant: str | None = None) -> int:
        """An operator's answer to a stuck transaction: ``"retry"`` its stuck
        participants now, or ``"skip"`` them (the transaction ends without
        them; they are left as they are). ``participant`` narrows it to one.
        Returns how many participants it applies to; raises
        `tc.NotStuckError` if none."""
        if action not in ("retry", "skip"):
            raise TxnArgumentError(f"action must be 'retry' or 'skip', got {action!r}")
        return self._channel.resolve(txnid, action, participant)

    # -- requests -----------------------------------------------------------------

    def new_txn(
        self,
        timeout_ms: int = 0,
        producer: tuple[int, int] | None = None,
        two_phase: bool = False,
        tag: str = "",
        prepared_timeout_ms: int = 0,
        spare: bool = False,
    ) -> TxnID:
        """Open a transaction (§CommandNewTxn): its NEW record is appended,
        and it is OPEN from now on. ``tag`` and ``prepared_timeout_ms``: see
        `tc._table`. ``spare``: opened ahead for a client (the next
        transaction an END_TXN asks for; see `is_spare`). ValueError for a
        bad timeout or tag."""
        rec = self._table.new(timeout_ms, now_ms(), producer, two_phase, tag, prepared_timeout_ms)
        txnid = self._table.next_txnid()
        self.txns_begun += 1
        self.log_record(rec, lazy=True)  # (durable with the first write that needs it)
        self._arm_for(txnid)
        if spare:
            self._spares[txnid] = None
            if len(self._spares) > MAX_SPARES_KEPT:
                del self._spares[next(iter(self._spares))]
        return txnid

    def new_producer_txn(
        self,
        timeout_ms: int,
        producer: tuple[int, int],
        two_phase: bool,
        carry: Callable[[TxnID], Record],
        lazy: bool,
    ) -> tuple[TxnID, asyncio.Future[int]]:
        """Open a producer's transaction (the producer-epoch mode) with one
        NEW record that also carries the registry's change ``carry(txnid)``
        makes (its ongoing transaction), applied with it live and on replay
        (`tc._log.apply_record`); the id, and the record's write (``lazy``:
        see `ledger.Ledger.append`)."""
        rec = self._table.new(timeout_ms, now_ms(), producer, two_phase)
        txnid = self._table.next_txnid()
        rec.producer.CopyFrom(carry(txnid).producer)
        self.txns_begun += 1
        written = self.log_record(rec, lazy=lazy)
        self._arm_for(txnid)
        return txnid, written

    def is_spare(self, txnid: TxnID) -> bool:
        """Whether ``txnid`` is a spare nobody has used yet, as far as this
        coordinator can tell: opened ahead for a client, still OPEN, with no
        partition or subscription. (A client takes a spare without telling
        the coordinator, so a taken one looks the same until its first send
        or acknowledgement reaches the broker: a local transaction's, until
        its commit.) Not kept across a restart."""
        meta = self._table.txns.get(txnid)
        return (
            txnid in self._spares
            and meta is not None
            and meta.status is TxnStatus.OPEN
            and not meta.partitions
            and not meta.subscriptions
        )

    def add_partition(self, txnid: TxnID, topic: str, partition: int) -> None:
        """§CommandAddPartitionToTxn (or a send that asks to add its
        partition, KIP-890 part 2): TxnNotFound, or an invalid status
        unless OPEN; adding it again changes nothing. With
        `log_registrations`, a new participant is also logged (see there)."""
        if self._table.register(txnid, partitions=[(topic, partition)], now_ms=now_ms()):
            self._log_registration(txnid, partitions=[(topic, partition)])

    def add_subscription(self, txnid: TxnID, topic: str, subscription: str) -> None:
        """§CommandAddSubscriptionToTxn: as `add_partition`."""
        if self._table.register(txnid, subscriptions=[(topic, subscription)], now_ms=now_ms()):
            self._log_registration(txnid, subscriptions=[(topic, subscription)])

    def _log_registration(
        self,
        txnid: TxnID,
        partitions: list[tuple[str, int]] = (),  # type: ignore[assignment]
        subscriptions: list[tuple[str, str]] = (),  # type: ignore[assignment]
    ) -> None:
        """In a cluster (`log_registrations`), a participant on this broker
        is logged too (a REGISTER record, queued and not waited for: the
        participant's own write is queued after it in the same store, so it
        is durable once that write is). Its topic may be on another broker
        by the time a recovery aborts the transaction left OPEN, and a
        participant that loads a topic aborts only the transactions of
        coordinators it runs (`broker.Broker._abort_orphans`): the
        recovered coordinator must know to tell it."""
        if not self.log_registrations:
            return
        written = self._log_register(_register_record(txnid, partitions, subscriptions), lazy=True)
        written.add_done_callback(_retrieved)

    def register_remote(
        self,
        txnid: TxnID,
        partitions: list[tuple[str, int]] = (),  # type: ignore[assignment]
        subscriptions: list[tuple[str, str]] = (),  # type: ignore[assignment]
    ) -> asyncio.Future[int]:
        """A participant on another broker registers (it checks with this
        coordinator before it takes the transaction's first send or ack
        there): raises as `add_partition` unless the transaction is OPEN;
        else the registration is logged (a REGISTER record), so that after
        a crash the recovered coordinator still knows to tell that
        participant its decision. The result is done once durable.

        A participant logged already in this transaction (a Kafka producer's
        participant checks every batch; the producer-epoch mode's
        AddPartitionsToTxn logs it first) is not logged again: the result
        is then the transaction's REGISTER record still on its way to disk
        (the last one appended, which is durable only with every one before
        it), or done at once if there is none. (If that record is a lazy
        one, one is logged again, as it starts no write of its own and the
        participant's answer waits for it.)"""
        meta = self._table.open_one(txnid, "add participants to")
        if self.log_registrations and self._logged_already(meta, partitions, subscriptions):
            pending, lazy = self._registering.get(txnid, (None, False))
            if pending is None:
                done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
                done.set_result(-1)
                return done
            if not lazy:
                return pending
        return self._log_register(_register_record(txnid, partitions, subscriptions), lazy=False)

    @staticmethod
    def _logged_already(
        meta: TxnMeta, partitions: list[tuple[str, int]], subscriptions: list[tuple[str, str]]
    ) -> bool:
        """Does ``meta`` name every one of these participants? (With
        `log_registrations`, each participant of an OPEN transaction was
        logged when it was added: `_log_registration`, `register_remote`.)"""
        return all(p in meta.partitions for p in partitions) and all(
            s in meta.subscriptions for s in subscriptions
        )

    def _log_register(self, rec: Record, lazy: bool) -> asyncio.Future[int]:
        """Log a REGISTER record, kept as its transaction's pending one
        (`register_remote`) until it is durable."""
        txnid = wire_txnid(rec.txnid_most_bits, rec.txnid_least_bits)
        written = self.log_record(rec, lazy=lazy)
        self._registering[txnid] = (written, lazy)
        registering = self._registering

        def durable(f: asyncio.Future[int]) -> None:
            # (A failed write stays: the store fails every later write too,
            # and a check waiting for it must fail, not pass.)
            kept = registering.get(txnid)
            if kept is not None and kept[0] is f and not f.cancelled() and f.exception() is None:
                del registering[txnid]

        written.add_done_callback(durable)
        return written

    def end_txn(self, txnid: TxnID, commit: bool) -> asyncio.Future[None]:
        """§CommandEndTxn: decide now, tell the participants; the result is
        done when END may be answered (see the module docstring).

        Repeating the same END is answered with success at any later status;
        the other action raises `InvalidTxnStatusError` (`TxnTimeoutError`
        for a COMMIT of a transaction the timeout aborted), as an unknown
        transaction raises `TxnNotFoundError`: at once, changing nothing."""
        meta = self._table.live(txnid)
        if meta.producer is not None and commit:
            raise InvalidTxnStateError(
                f"transaction {txnid} belongs to producer {meta.producer[0]} epoch "
                f"{meta.producer[1]}: it commits through that producer"
            )
        if meta.status not in _UNDECIDED:
            if same_outcome(meta.status, commit):
                return self.when_applied(txnid)
            if commit and meta.timed_out:
                raise TxnTimeoutError(meta.status, "commit (it timed out and was aborted)")
            if commit and txnid in self._aborted_at_start:
                raise InvalidTxnStatusError(
                    meta.status,
                    "commit (it was open when the coordinator restarted, so it was aborted)",
                )
            raise InvalidTxnStatusError(meta.status, TxnEvent.COMMIT if commit else TxnEvent.ABORT)
        if not commit:
            return self._abort_by_coordinator(meta, TxnEvent.ABORT)
        return self.decide(meta, TxnEvent.COMMIT)

    def local_commit_check(self, txnid: TxnID, commit_id: int) -> asyncio.Future[None] | None:
        """Before a local transaction's commit (COMMIT_TXN) numbered
        ``commit_id``: None if ``txnid`` may commit in one record now
        (`TxnTable.may_commit_local`); a future done once its commit is
        durable if this commit was written already (a retry whose answer was
        lost: nothing is written again); raises otherwise (aborted, timed
        out, unknown, committed by another commit, ...), changing nothing."""
        meta = self._table.live(txnid)
        if meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
            if meta.commit_id != commit_id:
                raise InvalidTxnStatusError(
                    meta.status,
                    f"commit {txnid} with commit id {commit_id} (another commit ended it)",
                )
            written = self._local_writes.get(txnid)
            if written is None:
                return self.when_applied(txnid)
            answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def durable(f: asyncio.Future[int]) -> None:
                if not pass_failure(f, answered) and not answered.done():
                    answered.set_result(None)

            written.add_done_callback(durable)
            return answered
        if meta.status is TxnStatus.OPEN:
            self._table.may_commit_local(txnid, now_ms())
            return None
        if meta.timed_out:
            raise TxnTimeoutError(meta.status, "commit (it timed out and was aborted)")
        if txnid in self._aborted_at_start:
            raise InvalidTxnStatusError(
                meta.status,
                "commit (it was open when the coordinator restarted, so it was aborted)",
            )
        raise InvalidTxnStatusError(meta.status, TxnEvent.COMMIT)

    def commit_local(
        self,
        txnid: TxnID,
        partitions: list[tuple[str, int]],
        subscriptions: list[tuple[str, str]],
        commit_id: int,
    ) -> asyncio.Future[int]:
        """Commit a local transaction: append its one record (OPEN ->
        COMMITTED, naming ``partitions`` and ``subscriptions`` and the
        commit's number ``commit_id``), right behind the writes the caller
        queued for it in this turn of the loop, so they share one group
        commit; done once it is durable. The transaction is COMMITTED here
        at once: a retry, or a timeout, finds it so. Raises (nothing
        appended) unless it may (`local_commit_check`)."""
        rec = self._table.local_commit(txnid, partitions, subscriptions, now_ms(), commit_id)
        written = self.log_record(rec)
        self.txns_committed += 1
        # Until it is durable, a retry waits for it (and an END of it, as
        # for any decided transaction, waits until it is applied).
        self._local_writes[txnid] = written
        self._channel.applied_with(txnid, written)
        written.add_done_callback(lambda _: self._local_writes.pop(txnid, None))
        return written

    def prepare_txn(self, txnid: TxnID) -> asyncio.Future[int]:
        """KIP-939's prepare of an OPEN transaction: log PREPARED (naming
        its participants); done once it is durable, and with it every write
        of the transaction queued before. A PREPARED transaction survives a
        restart and never times out; it waits for `end_txn`. Preparing it
        again is answered at once."""
        meta = self._table.live(txnid)
        if meta.status is TxnStatus.PREPARED:
            return resolved(-1)
        if meta.status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(meta.status, TxnEvent.PREPARE)
        written = self.log_record(self._table.decide(txnid, TxnEvent.PREPARE, now_ms()))
        self._arm_for(txnid)  # (a prepared timeout)
        return written

    def commit_group(
        self, group: str, sequence: int, commit: list[TxnID], abort_tag: str = ""
    ) -> tuple[bool, int, int, asyncio.Future[None]]:
        """Commit the PREPARED transactions ``commit`` as one decision, one
        GROUP record, under the key (``group``, ``sequence``), and abort
        the undecided ones tagged ``abort_tag`` that it does not commit. If
        the group committed this sequence or a later one before, nothing is
        committed and the undecided ones of ``commit`` are aborted instead.

        Returns (duplicate, how many committed, how many aborted, done):
        ``done`` when the decision is durable and applied, as END's answer.
        Raises at once, changing nothing, as `TxnTable.group` refuses."""
        rec = self._table.group(group, sequence, commit, abort_tag, now_ms())
        updates = [
            (wire_txnid(u.txnid_most_bits, u.txnid_least_bits), status_of(u.new_status))
            for u in rec.group_updates
        ]
        committed = sum(1 for _, status in updates if status is TxnStatus.COMMITTING)
        if rec.group_duplicate and not updates:
            return True, 0, 0, resolved(None)  # (nothing to change: answered without a record)
        logged = self.log_record(rec)
        answers = []
        for txnid, _ in updates:
            meta = self._table.txns[txnid]
            self._channel.tell(meta, self._end_of(meta), logged)
            answers.append(self._channel.answer(txnid, logged))
        if not answers:
            answers.append(then(logged, lambda _: None))
        return rec.group_duplicate, committed, len(updates) - committed, all_of(answers)

    def abort_tagged(self, tag: str, prefix: bool = False) -> tuple[int, asyncio.Future[None]]:
        """Abort every undecided (OPEN or PREPARED) transaction tagged
        ``tag`` (``prefix``: whose tag starts with it). Returns how many,
        and a future done when their aborts are durable and applied."""
        if not tag:
            raise TxnArgumentError("name a tag (or, with prefix, its start) to abort by")
        metas = [m for m in self._table.with_tag(tag, prefix) if m.status in _UNDECIDED]
        answers = [self._abort_by_coordinator(meta, TxnEvent.ABORT) for meta in metas]
        return len(metas), all_of(answers)

    # -- decisions ------------------------------------------------------------------

    def decide(
        self, meta: TxnMeta, event: TxnEvent, producer: Record | None = None
    ) -> asyncio.Future[None]:
        """Log the decision (``event``: COMMIT, ABORT, TIMEOUT) on an
        undecided transaction and tell its participants; the result as
        `end_txn`'s. ``producer``: the registry's change that goes with the
        decision (a producer's END or abort bumps its identity), carried in
        the same record."""
        rec = self._table.decide(meta.txnid, event, now_ms())
        if producer is not None:
            rec.producer.CopyFrom(producer.producer)
        logged = self.log_record(rec)
        self._channel.tell(meta, self._end_of(meta), logged)
        return self._channel.answer(meta.txnid, logged)

    def when_applied(self, txnid: TxnID) -> asyncio.Future[None]:
        """END's answer for a transaction decided already (durably): done
        once its participants have applied the decision."""
        return self._channel.answer(txnid, None)

    def decision(self, txnid: TxnID) -> TxnEnd | None:
        """What the participants of ``txnid`` are told, once it is decided
        (None while it is undecided, or unknown here)."""
        meta = self._table.get(txnid)
        if meta is None or meta.status in _UNDECIDED:
            return None
        return self._end_of(meta)

    def _end_of(self, meta: TxnMeta) -> TxnEnd:
        """What each participant of ``meta`` (decided) is told."""
        commit = meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
        return TxnEnd(meta.txnid, commit, meta.producer, self._table.epoch)

    def _abort_by_coordinator(self, meta: TxnMeta, event: TxnEvent) -> asyncio.Future[None]:
        """Abort ``meta`` (a timeout, a restart, an operator): decide, and if
        it is a producer's ongoing transaction, bump that producer's
        identity in the same record, so a late write of it is refused and
        its client learns it may abort and go on (TRANSACTION_ABORTABLE)."""
        bumped = None
        if meta.producer is not None:
            bumped = self._producers.coordinator_abort(meta.txnid, meta.producer[0], now_ms())
        return self.decide(meta, event, bumped)

    def _finished(self, meta: TxnMeta) -> None:
        """Every participant applied the decision on ``meta``, which is
        durable: log the end (lazily: nobody waits for it, and it is durable
        only with what the participants queued behind the decision)."""
        try:
            rec = self._table.finish(meta.txnid, now_ms())
        except InvalidTxnStatusError:
            return  # (ended already: a repeated finish after a restart)
        written = self.log_record(rec, lazy=True)
        if status_of(rec.new_status) is TxnStatus.COMMITTED:
            self.txns_committed += 1
        else:
            self.txns_aborted += 1
        written.add_done_callback(functools.partial(self._end_logged, meta.txnid))

    def _end_logged(self, txnid: TxnID, written: asyncio.Future[int]) -> None:
        if not written.cancelled() and (error := written.exception()) is not None:
            log.error("coordinator %d: logging the end of %s failed: %s", self.tcid, txnid, error)

    # -- the producer-epoch mode (tc._epoch_mode) -------------------------------------

    def producers(self) -> list[ProducerEntry]:
        """Every transactional id this coordinator holds."""
        return list(self._producers.entries.values())

    def producer(self, transactional_id: str) -> ProducerEntry | None:
        return self._producers.get(transactional_id)

    def producer_of(self, producer_id: int) -> ProducerEntry | None:
        """The entry holding ``producer_id`` (None if none does)."""
        return self._epoch_mode.producer_of(producer_id)

    async def init_producer(
        self,
        transactional_id: str,
        timeout_ms: int,
        two_phase: bool = False,
        keep_prepared: bool = False,
    ) -> tuple[int, int, int, int]:
        """InitProducerId (`tc._epoch_mode.ProducerEpochMode.init_producer`)."""
        return await self._epoch_mode.init_producer(
            transactional_id, timeout_ms, two_phase, keep_prepared
        )

    async def terminate_producer(self, transactional_id: str) -> tuple[int, int]:
        """KIP-939's forceTerminateTransaction (`ProducerEpochMode.terminate_producer`)."""
        return await self._epoch_mode.terminate_producer(transactional_id)

    def producer_txn(self, producer_id: int, epoch: int, what: str) -> TxnID:
        """A producer's ongoing transaction, begun if none (`ProducerEpochMode.producer_txn`)."""
        return self._epoch_mode.producer_txn(producer_id, epoch, what)

    def producer_begin(self, producer_id: int, epoch: int, what: str) -> asyncio.Future[TxnID]:
        """`producer_txn`, once its begin is durable (`ProducerEpochMode.producer_begin`)."""
        return self._epoch_mode.producer_begin(producer_id, epoch, what)

    def producer_verified_partition(
        self, producer_id: int, epoch: int, topic: str, partition: int
    ) -> TxnID:
        """KIP-890 part 1's check of a send (`ProducerEpochMode.producer_verified_partition`)."""
        return self._epoch_mode.producer_verified_partition(producer_id, epoch, topic, partition)

    def producer_add_partition(
        self, producer_id: int, epoch: int, topic: str, partition: int
    ) -> TxnID:
        """A producer's send to a partition (`ProducerEpochMode.producer_add_partition`)."""
        return self._epoch_mode.producer_add_partition(producer_id, epoch, topic, partition)

    def producer_add_subscription(
        self, producer_id: int, epoch: int, topic: str, subscription: str
    ) -> TxnID:
        """send_offsets_to_transaction (`ProducerEpochMode.producer_add_subscription`)."""
        return self._epoch_mode.producer_add_subscription(producer_id, epoch, topic, subscription)

    def prepare_producer_txn(self, producer_id: int, epoch: int) -> asyncio.Future[tuple[int, int]]:
        """KIP-939's prepareTransaction (`ProducerEpochMode.prepare_producer_txn`)."""
        return self._epoch_mode.prepare_producer_txn(producer_id, epoch)

    def end_producer_txn(
        self, producer_id: int, epoch: int, commit: bool, bump: bool = True
    ) -> asyncio.Future[tuple[int, int]]:
        """EndTxn (`ProducerEpochMode.end_producer_txn`)."""
        return self._epoch_mode.end_producer_txn(producer_id, epoch, commit, bump)

    # -- timeouts -------------------------------------------------------------------

    def _arm_for(self, txnid: TxnID) -> None:
        """Fire the expiry at ``txnid``'s deadline if it has one before the
        timer's."""
        meta = self._table.txns.get(txnid)
        deadline = None if meta is None else meta.deadline_ms
        if deadline is not None and (not self._expiry_at or deadline < self._expiry_at):
            self._arm_expiry(deadline)

    def _arm_expiry(self, deadline_ms: int) -> None:
        """Fire the expiry at ``deadline_ms`` (or at once if past)."""
        if self._closed:
            return
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = deadline_ms
        delay = max(0.0, (deadline_ms - now_ms()) / 1000)
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        """Abort every OPEN transaction past its deadline; wait for the next."""
        self._expiry, self._expiry_at = None, 0
        for txnid in self._table.expired(now_ms()):
            log.info("coordinator %d: transaction %s timed out", self.tcid, txnid)
            meta = self._table.txns[txnid]
            try:
                self._abort_by_coordinator(meta, TxnEvent.TIMEOUT).add_done_callback(_quietly)
                self.txns_timed_out += 1
            except Exception as exc:
                log.warning("timing out %s failed: %s", txnid, exc)
        deadline = self._table.next_deadline()
        if deadline is not None:
            self._arm_expiry(deadline)

    # -- the log --------------------------------------------------------------------

    def log_record(self, rec: Record, lazy: bool = False) -> asyncio.Future[int]:
        """Append ``rec`` to the log and apply it (append order is
        durability order); the result is done once it is durable. ``lazy``:
        nobody waits for it soon (see `ledger.Ledger.append`)."""
        written = self._log.append(rec, lazy)
        apply_record(self._table, self._producers, rec)
        if self._log.snapshot_due():
            self._log.write_snapshot(self._table, self._producers)
        return written

    async def _recover(self) -> None:
        t0 = time.perf_counter()
        replayed = await self._log.replay(self._table, self._producers)
        boot = self._table.boot()
        await self.log_record(boot)  # (durable before any id of its epoch is handed out)
        table = self._table
        unfinished = [m for m in table.txns.values() if m.status not in _UNDECIDED]
        lost = [m for m in table.txns.values() if m.status is TxnStatus.OPEN]
        log.info(
            "coordinator %d recovered %d transactions (%d to finish, %d open to abort) from %d "
            "records in %.2fs",
            self.tcid,
            len(table.txns),
            len(unfinished),
            len(lost),
            replayed,
            time.perf_counter() - t0,
        )
        for meta in unfinished:
            self._channel.tell(meta, self._end_of(meta), None)
        self._aborted_at_start = {m.txnid for m in lost}
        # (all decisions logged at once: one group commit, not one each)
        ended = [self._abort_by_coordinator(meta, TxnEvent.ABORT) for meta in lost]
        if ended:
            await asyncio.wait(ended, timeout=END_WAIT)
        deadline = table.next_deadline()
        if deadline is not None:
            self._arm_expiry(deadline)
        self._epoch_mode.expire_producers()


def _quietly(f: asyncio.Future[None]) -> None:
    if not f.cancelled() and (error := f.exception()) is not None:
        log.warning("timing out a transaction failed: %s", error)


def _retrieved(written: asyncio.Future[int]) -> None:
    """A queued registration's failure is the store's, which fails every
    later write too (fail-stop): nothing to do here but mark it seen."""
    if not written.cancelled():
        written.exception()


def _register_record(
    txnid: TxnID, partitions: list[tuple[str, int]], subscriptions: list[tuple[str, str]]
) -> Record:
    """A REGISTER record naming these participants of ``txnid``."""
    rec = Record(metadata_op=Record.REGISTER)
    rec.txnid_most_bits, rec.txnid_least_bits = txnid
    rec.txn_last_modification_time = now_ms()
    for topic, index in partitions:
        rec.partitions.add(topic=topic, partition=index)
    for topic, sub in subscriptions:
        rec.subscriptions.add(topic=topic, subscription=sub)
    return rec
