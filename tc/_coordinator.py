"""A transaction coordinator (PIP-31 §Transaction Coordinator): the I/O
around a `TxnTable`.

Each coordinator has an id (TCID) and its own log, the ledger ``tc/<id>``
(`tc._log`), in the store its participants (the broker's partitions and
subscriptions) write to. In that store append order is durability order
(`ledger`): a record appended after another is durable only with it. So a
record is applied to the table as it is appended, and what follows it
(a participant's writes behind the decision, the next record) can be queued
at once, in the same group commit, without waiting for it.

One path per request:

- NEW (`new_txn`): the NEW record (OPEN) is appended and the id answered at
  once. A crash may forget a transaction with no durable participant write
  yet (its client gets TxnNotFound and starts again), never one whose data
  is durable: that data is behind its NEW record. Ids carry the epoch of
  the coordinator's start (`tc._table`), so one answered before a crash is
  never handed out again.
- Registration (`add_partition`, `add_subscription`): in memory, not logged
  (the decision record names every participant); sends and acks are checked
  against it (`verify_partition`, `verify_subscription`: KIP-890's defense).
- END (`end_txn`): the decision (COMMITTING / ABORTING) is appended, and
  every participant told at once: each queues its commit marker or ack
  commit right behind it (`Participant`), in the turn of the loop that read
  the END, so a transaction's sends, its decision and its markers share one
  group commit. END is answered once the decision is durable and every
  participant has applied it; a participant that has to wait (or fails) is
  awaited in a task, retried until it applies the decision, and listed as
  stuck meanwhile (`stuck`, `resolve`); END answers after `END_WAIT` then,
  the decision being durable. Then the end (COMMITTED / ABORTED) is logged.
  PIP-31 answers END once the decision is logged; waiting until the
  participants have queued their markers means a client's next send lands
  after them, and a consumer sees the committed messages once commit()
  returns.
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
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger import LedgerError, LedgerStore, faults, pass_failure
from proto import TxnID, refusals, wire_txnid
from tc._log import TxnLog
from tc._producers import (
    DEFAULT_EXPIRATION_MS,
    MAX_TXN_TIMEOUT_MS,
    ConcurrentTransactionsError,
    InvalidPidMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerEntry,
    ProducerEpochError,
    ProducerRegistry,
    TransactionAbortableError,
)
from tc._status import InvalidTxnStatusError, TxnEvent, TxnStatus, status_of
from tc._table import Record, TxnArgumentError, TxnMeta, TxnTable, TxnTimeoutError, same_outcome

__all__ = [
    "NotStuckError",
    "Participant",
    "ProducerSettings",
    "StuckParticipant",
    "TransactionCoordinator",
    "TwoPhaseCommitNotAllowedError",
]

log = logging.getLogger(__name__)

RETRY_MAX_S = 2.0  # the longest wait between tries of a participant with a storage error
STUCK_RETRY_MAX_S = 30.0  # ... and of a participant that refuses
END_WAIT = 5.0  # seconds END waits for the participants to apply the decision
MAX_SPARES_KEPT = 10_000  # spares remembered for `is_spare` (newest kept)


class NotStuckError(LookupError):
    """An operator resolved a transaction that has no stuck participant."""


class TwoPhaseCommitNotAllowedError(ProducerEpochError, refusals.AuthorizationError):
    """A producer asked for two-phase commit (KIP-939) where the broker does
    not allow it (AUTHORIZATION_ERROR, as Kafka answers); nothing changed."""


class Participant(Protocol):
    """What a coordinator needs from brokers: end a transaction on a
    partition or a subscription, as its coordinator decided.

    Each is called in the turn of the loop in which the decision was
    appended to the coordinator's log, and queues its writes in the same
    store, behind the decision (so they are durable only with it). It
    returns None once they are queued, or an awaitable that completes when
    they are (it has to wait: a transaction buffer being created, another
    END of the transaction under way there). Both are idempotent; they raise
    if they cannot apply the decision (the coordinator tries again)."""

    def end_txn_on_partition(
        self, topic: str, partition: int, txnid: TxnID, commit: bool
    ) -> Awaitable[None] | None: ...

    def end_txn_on_subscription(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool
    ) -> Awaitable[None] | None: ...


@dataclass(slots=True)
class StuckParticipant:
    """A participant that failed to apply its coordinator's decision: the
    coordinator keeps trying it (backing off) until it applies it or an
    operator resolves it (`TransactionCoordinator.resolve`)."""

    participant: str  # "partition <topic>/<index>" or "subscription <topic>/<name>"
    reason: str  # the last failure
    since_ms: int
    attempts: int = 0
    action: str | None = None  # an operator's: "retry" (now) or "skip" (give up on it)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    def to_json(self) -> dict[str, Any]:
        return {
            "participant": self.participant,
            "reason": self.reason,
            "since_ms": self.since_ms,
            "attempts": self.attempts,
        }


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """The producer-epoch mode's limits (Kafka's names in brackets)."""

    max_txn_timeout_ms: int = MAX_TXN_TIMEOUT_MS  # (transaction.max.timeout.ms)
    expiration_ms: int = DEFAULT_EXPIRATION_MS  # (transactional.id.expiration.ms)
    allow_two_phase: bool = False  # (transaction.two.phase.commit.enable)


# One participant of a decided transaction: its name ("partition t/0") and
# what tells it the decision.
_Tell = tuple[str, Callable[[], "Awaitable[None] | None"], str]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


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
        self._participant = participant
        self.settings = settings or ProducerSettings()
        self._table = TxnTable(tcid)
        self._producers = ProducerRegistry(tcid)
        self._initializing: set[str] = set()  # transactional ids in InitProducerId now
        self._producer_expiry: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Decided transactions whose participants have not all applied the
        # decision yet: done once they have.
        self._applied: dict[TxnID, asyncio.Future[None]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0  # ms: when the expiry timer fires (0: none set)
        self._closed = False
        self._aborted_at_start: set[TxnID] = set()  # (for a clearer error)
        # Producers' transactions whose begin is not durable yet: the write of
        # the registry record that names them ongoing (`producer_begin`).
        self._begins: dict[TxnID, asyncio.Future[int]] = {}
        # Decided transactions with a participant that failed to apply the
        # decision: txnid -> participant -> what went wrong.
        self._stuck: dict[TxnID, dict[str, StuckParticipant]] = {}
        # Transactions opened as a client's spare (`new_txn(spare=True)`),
        # newest last, at most MAX_SPARES_KEPT: memory only (`is_spare`).
        self._spares: dict[TxnID, None] = {}
        self.participant_failures = 0  # failed attempts to end on a participant, ever
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
        if self._producer_expiry is not None:
            self._producer_expiry.cancel()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass

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
        rec = self._table.new(timeout_ms, _now_ms(), producer, two_phase, tag, prepared_timeout_ms)
        txnid = self._table.next_txnid()
        self.txns_begun += 1
        self._append(rec, lazy=True)  # (durable with the first write that needs it)
        self._arm_for(txnid)
        if spare:
            self._spares[txnid] = None
            if len(self._spares) > MAX_SPARES_KEPT:
                del self._spares[next(iter(self._spares))]
        return txnid

    def is_spare(self, txnid: TxnID) -> bool:
        """Whether ``txnid`` is a spare nobody has used yet, as far as this
        coordinator can tell: opened ahead for a client, still OPEN, with no
        partition or subscription. (A client takes a spare without telling
        the coordinator, so a taken one looks the same until its first send
        or acknowledgement.) Not kept across a restart."""
        meta = self._table.txns.get(txnid)
        return (
            txnid in self._spares
            and meta is not None
            and meta.status is TxnStatus.OPEN
            and not meta.partitions
            and not meta.subscriptions
        )

    def _arm_for(self, txnid: TxnID) -> None:
        """Fire the expiry at ``txnid``'s deadline if it has one before the
        timer's."""
        meta = self._table.txns.get(txnid)
        deadline = None if meta is None else meta.deadline_ms
        if deadline is not None and (not self._expiry_at or deadline < self._expiry_at):
            self._arm_expiry(deadline)

    def add_partition(self, txnid: TxnID, topic: str, partition: int) -> None:
        """§CommandAddPartitionToTxn (or a send that asks to add its
        partition, KIP-890 part 2): TxnNotFound, or an invalid status
        unless OPEN; adding it again changes nothing."""
        self._table.register(txnid, partitions=[(topic, partition)], now_ms=_now_ms())

    def add_subscription(self, txnid: TxnID, topic: str, subscription: str) -> None:
        """§CommandAddSubscriptionToTxn: as `add_partition`."""
        self._table.register(txnid, subscriptions=[(topic, subscription)], now_ms=_now_ms())

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
        if meta.status not in (TxnStatus.OPEN, TxnStatus.PREPARED):
            if same_outcome(meta.status, commit):
                return self._answer(txnid, None)
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
        return self._decide(meta, TxnEvent.COMMIT)

    def prepare_txn(self, txnid: TxnID) -> asyncio.Future[int]:
        """KIP-939's prepare of an OPEN transaction: log PREPARED (naming
        its participants); done once it is durable, and with it every write
        of the transaction queued before. A PREPARED transaction survives a
        restart and never times out; it waits for `end_txn`. Preparing it
        again is answered at once."""
        meta = self._table.live(txnid)
        if meta.status is TxnStatus.PREPARED:
            done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            done.set_result(-1)
            return done
        if meta.status is not TxnStatus.OPEN:
            raise InvalidTxnStatusError(meta.status, TxnEvent.PREPARE)
        written = self._append(self._table.decide(txnid, TxnEvent.PREPARE, _now_ms()))
        self._arm_for(txnid)  # (a prepared timeout)
        return written

    def transactions_tagged(self, tag: str, prefix: bool = False) -> list[TxnMeta]:
        """The transactions not ended tagged ``tag`` (``prefix``: whose tag
        starts with it), oldest first."""
        return self._table.with_tag(tag, prefix)

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
        rec = self._table.group(group, sequence, commit, abort_tag, _now_ms())
        updates = [
            (wire_txnid(u.txnid_most_bits, u.txnid_least_bits), status_of(u.new_status))
            for u in rec.group_updates
        ]
        committed = sum(1 for _, status in updates if status is TxnStatus.COMMITTING)
        if rec.group_duplicate and not updates:
            # (nothing to change: answered without a record)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return True, 0, 0, done
        logged = self._append(rec)
        answers = []
        for txnid, _ in updates:
            meta = self._table.txns[txnid]
            self._tell(meta, logged)
            answers.append(self._answer(txnid, logged))
        if not answers:
            answers.append(self._answer_logged(logged))
        return (
            rec.group_duplicate,
            committed,
            len(updates) - committed,
            _all_of(answers),
        )

    def _answer_logged(self, logged: asyncio.Future[int]) -> asyncio.Future[None]:
        """Done once ``logged`` is durable (failed if its write fails)."""
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def durable(written: asyncio.Future[int]) -> None:
            if not pass_failure(written, answered) and not answered.done():
                answered.set_result(None)

        logged.add_done_callback(durable)
        return answered

    def abort_tagged(self, tag: str, prefix: bool = False) -> tuple[int, asyncio.Future[None]]:
        """Abort every undecided (OPEN or PREPARED) transaction tagged
        ``tag`` (``prefix``: whose tag starts with it). Returns how many,
        and a future done when their aborts are durable and applied."""
        if not tag:
            raise TxnArgumentError("name a tag (or, with prefix, its start) to abort by")
        metas = [m for m in self._table.with_tag(tag, prefix) if m.status in _WAITING]
        answers = [self._abort_by_coordinator(meta, TxnEvent.ABORT) for meta in metas]
        return len(metas), _all_of(answers)

    def _decide(self, meta: TxnMeta, event: TxnEvent) -> asyncio.Future[None]:
        """Log the decision on an OPEN transaction and tell its participants;
        the result as `end_txn`'s."""
        logged = self._append(self._table.decide(meta.txnid, event, _now_ms()))
        self._tell(meta, logged)
        return self._answer(meta.txnid, logged)

    def _answer(self, txnid: TxnID, logged: asyncio.Future[int] | None) -> asyncio.Future[None]:
        """Done once the decision (``logged``, None if durable already) is
        durable and every participant has applied it, or `END_WAIT` seconds
        after the decision is durable; failed if the decision's write fails."""
        loop = asyncio.get_running_loop()
        answered: asyncio.Future[None] = loop.create_future()

        def applied(_: object = None) -> None:
            if not answered.done():
                answered.set_result(None)

        def durable(written: asyncio.Future[int] | None = None) -> None:
            if written is not None:
                if pass_failure(written, answered):
                    return
                faults.hit("tc.after_decision_logged")
            pending = self._applied.get(txnid)
            if pending is None or pending.done():
                applied()
                return
            pending.add_done_callback(applied)
            timer = loop.call_later(END_WAIT, applied)
            answered.add_done_callback(lambda _f: timer.cancel())

        if logged is None:
            durable()
        else:
            logged.add_done_callback(durable)
        return answered

    def _tell(self, meta: TxnMeta, logged: asyncio.Future[int] | None) -> None:
        """Tell every participant of ``meta`` its decision (durable, or being
        written by ``logged``), now; once each has applied it and the
        decision is durable, log the end. Participants that wait or fail are
        awaited in a task."""
        txnid = meta.txnid
        commit = meta.status is TxnStatus.COMMITTING
        participant = self._participant
        tells: list[_Tell] = [
            (
                f"partition {topic}/{index}",
                functools.partial(participant.end_txn_on_partition, topic, index, txnid, commit),
                "tc.after_partition_end",
            )
            for topic, index in meta.partitions
        ]
        tells += [
            (
                f"subscription {topic}/{sub}",
                functools.partial(participant.end_txn_on_subscription, topic, sub, txnid, commit),
                "tc.after_subscription_end",
            )
            for topic, sub in meta.subscriptions
        ]
        loop = asyncio.get_running_loop()
        later: list[tuple[_Tell, Awaitable[None]]] = []
        for tell in tells:
            try:
                pending = tell[1]()
            except Exception as exc:  # (the task counts it, says why, tells it again)
                pending = loop.create_future()
                pending.set_exception(exc)
            if pending is not None:
                later.append((tell, pending))
        self._applied[txnid] = loop.create_future()
        if not later:
            if logged is None:
                self._all_applied(meta, tells)
            else:
                logged.add_done_callback(functools.partial(self._when_durable, meta, tells))
            return
        self._spawn(self._finish(meta, tells, later, logged))

    def _when_durable(self, meta: TxnMeta, tells: list[_Tell], logged: asyncio.Future[int]) -> None:
        if logged.cancelled() or logged.exception() is not None:
            return  # (the store failed: END reports it; a restart finishes the decision)
        self._all_applied(meta, tells)

    async def _finish(
        self,
        meta: TxnMeta,
        tells: list[_Tell],
        later: list[tuple[_Tell, Awaitable[None]]],
        logged: asyncio.Future[int] | None,
    ) -> None:
        """`_tell`'s task: wait for (or tell again, until they apply it) the
        participants that did not apply the decision at once; then, the
        decision durable, log the end."""
        await asyncio.gather(
            *(self._until_applied(meta.txnid, tell, pending) for tell, pending in later)
        )
        if logged is not None:
            try:
                await logged
            except LedgerError:
                return  # (END reports it; a restart finishes the decision)
        self._all_applied(meta, tells)

    def _all_applied(self, meta: TxnMeta, tells: list[_Tell]) -> None:
        """Every participant applied the decision, which is durable: END may
        be answered; log the end (lazily: nobody waits for it, and it is
        durable only with what the participants queued behind the decision)."""
        for _, _, step in tells:
            faults.hit(step)
        applied = self._applied.get(meta.txnid)
        if applied is not None and not applied.done():
            applied.set_result(None)
        try:
            rec = self._table.finish(meta.txnid, _now_ms())
        except InvalidTxnStatusError:
            return  # (ended already: a repeated finish after a restart)
        written = self._append(rec, lazy=True)
        if TxnStatus(rec.new_status) is TxnStatus.COMMITTED:
            self.txns_committed += 1
        else:
            self.txns_aborted += 1
        written.add_done_callback(functools.partial(self._end_logged, meta.txnid))

    def _end_logged(self, txnid: TxnID, written: asyncio.Future[int]) -> None:
        self._applied.pop(txnid, None)
        if not written.cancelled() and (error := written.exception()) is not None:
            log.error("coordinator %d: logging the end of %s failed: %s", self.tcid, txnid, error)

    async def _until_applied(
        self, txnid: TxnID, tell: _Tell, pending: Awaitable[None] | None
    ) -> None:
        """Wait for ``pending`` (the participant's answer to being told),
        telling it again until it applies the decision on
        ``txnid``. A participant that fails is listed as stuck (`stuck`),
        logged at ERROR on its 1st, 2nd, 4th, 8th, ... failure, and tried
        again, backing off up to `STUCK_RETRY_MAX_S` (`RETRY_MAX_S` for a
        storage error, which passes), or at once when an operator asks
        (`resolve`); an operator may also skip it: the transaction then ends
        without it."""
        participant, attempt = tell[0], tell[1]
        delay = 0.05
        while True:
            try:
                if pending is None:
                    pending = attempt()
                if pending is not None:
                    await pending
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                pending = None
                self.participant_failures += 1
                stuck = self._stuck.setdefault(txnid, {})
                entry = stuck.get(participant)
                if entry is None:
                    entry = stuck[participant] = StuckParticipant(participant, "", _now_ms())
                entry.reason = str(exc) or type(exc).__name__
                entry.attempts += 1
                if entry.attempts & (entry.attempts - 1) == 0:
                    log.error(
                        "coordinator %d: %s did not apply the decision on %s (failure %d: %s); "
                        "retrying, listed as stuck (admin API: POST "
                        "/admin/v1/transactions/%s/resolve)",
                        self.tcid,
                        participant,
                        txnid,
                        entry.attempts,
                        entry.reason,
                        txnid,
                    )
                transient = isinstance(exc, LedgerError)
                try:
                    async with asyncio.timeout(delay):
                        await entry.wake.wait()
                except TimeoutError:
                    pass
                entry.wake.clear()
                delay = min(delay * 2, RETRY_MAX_S if transient else STUCK_RETRY_MAX_S)
                if entry.action == "skip":
                    log.warning(
                        "coordinator %d: %s skipped by an operator: %s ends without it "
                        "(it did not apply the decision: %s)",
                        self.tcid,
                        participant,
                        txnid,
                        entry.reason,
                    )
                    self._unstick(txnid, participant)
                    return
                entry.action = None
                continue
            if participant in self._stuck.get(txnid, ()):
                log.info("coordinator %d: %s applied %s at last", self.tcid, participant, txnid)
                self._unstick(txnid, participant)
            return

    def _unstick(self, txnid: TxnID, participant: str) -> None:
        stuck = self._stuck.get(txnid)
        if stuck is not None:
            stuck.pop(participant, None)
            if not stuck:
                del self._stuck[txnid]

    def stuck(self, txnid: TxnID | None = None) -> dict[TxnID, list[StuckParticipant]]:
        """The decided transactions (or just ``txnid``) with a participant
        that failed to apply the decision, and those participants."""
        if txnid is not None:
            found = self._stuck.get(txnid)
            return {txnid: list(found.values())} if found else {}
        return {t: list(p.values()) for t, p in self._stuck.items()}

    def resolve(self, txnid: TxnID, action: str, participant: str | None = None) -> int:
        """An operator's answer to a stuck transaction: ``"retry"`` its stuck
        participants now, or ``"skip"`` them (the transaction ends without
        them; they are left as they are). ``participant`` narrows it to one.
        Returns how many participants it applies to; raises
        `NotStuckError` if none."""
        if action not in ("retry", "skip"):
            raise TxnArgumentError(f"action must be 'retry' or 'skip', got {action!r}")
        entries = [
            e
            for e in self._stuck.get(txnid, {}).values()
            if participant is None or e.participant == participant
        ]
        if not entries:
            which = f" on {participant}" if participant else ""
            raise NotStuckError(
                f"transaction {txnid} is not stuck{which} on coordinator {self.tcid}"
            )
        for entry in entries:
            entry.action = action
            entry.wake.set()
        return len(entries)

    # -- the producer-epoch mode (KIP-98, KIP-890, KIP-939) ---------------------------

    def producers(self) -> list[ProducerEntry]:
        """Every transactional id this coordinator holds."""
        return list(self._producers.entries.values())

    def producer(self, transactional_id: str) -> ProducerEntry | None:
        return self._producers.get(transactional_id)

    def producer_of(self, producer_id: int) -> ProducerEntry | None:
        """The entry holding ``producer_id`` (None if none does): whose
        transactional id a request carrying only the producer id acts for."""
        try:
            return self._producers.of_producer(producer_id)
        except InvalidPidMappingError:
            return None

    async def init_producer(
        self,
        transactional_id: str,
        timeout_ms: int,
        two_phase: bool = False,
        keep_prepared: bool = False,
    ) -> tuple[int, int, int, int]:
        """InitProducerId: (producer id, epoch, ongoing transaction's producer
        id, its epoch; -1 when nothing is kept ongoing).

        A new transactional id gets a new producer id, epoch 0. A known one
        gets the next identity (an older instance is fenced from now on), and
        its unfinished transaction is rolled back (aborted if OPEN or
        PREPARED) or forward (waited for if decided) before the answer, unless
        ``keep_prepared``: then it stays, with its own identity, for the new
        instance to commit, abort or complete. Answered once durable."""
        if not transactional_id:
            raise InvalidTxnStateError("a transactional id is required")
        if two_phase and not self.settings.allow_two_phase:
            raise TwoPhaseCommitNotAllowedError(
                f"transactional id {transactional_id!r} asked for two-phase commit "
                "(TWO_PHASE_COMMIT), which this broker does not allow (txnbuf serve --allow-2pc)"
            )
        if not two_phase and not 1 <= timeout_ms <= self.settings.max_txn_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction timeout must be 1..{self.settings.max_txn_timeout_ms} ms, "
                f"got {timeout_ms}"
            )
        if transactional_id in self._initializing:
            raise ConcurrentTransactionsError(
                f"transactional id {transactional_id!r} is being initialized; retry"
            )
        self._initializing.add(transactional_id)
        try:
            entry = self._producers.get(transactional_id)
            if entry is None:
                entry = ProducerEntry(
                    transactional_id,
                    self._producers.allocate(),
                    0,
                    timeout_ms,
                    two_phase,
                    _now_ms(),
                )
                await self._append(ProducerRegistry.record(entry))
                return (entry.producer_id, entry.epoch, -1, -1)
            if entry.ongoing is not None and not keep_prepared:
                await self._roll(entry.ongoing)
                entry = self._producers.get(transactional_id) or entry
            pid, epoch = self._producers.bump(*entry.identity)
            kept = entry.ongoing is not None and keep_prepared
            updated = dataclasses.replace(
                entry,
                producer_id=pid,
                epoch=epoch,
                timeout_ms=timeout_ms,
                two_phase=two_phase,
                updated_ms=_now_ms(),
                bumped_by="init",
                ongoing=entry.ongoing if kept else None,
                txn_producer_id=entry.txn_producer_id if kept else -1,
                txn_epoch=entry.txn_epoch if kept else -1,
            )
            await self._append(ProducerRegistry.record(updated))
            ongoing = updated.txn_identity or (-1, -1)
            return (pid, epoch, *ongoing)
        finally:
            self._initializing.discard(transactional_id)

    async def terminate_producer(self, transactional_id: str) -> tuple[int, int]:
        """KIP-939's forceTerminateTransaction: InitProducerId without keeping
        the ongoing transaction (it is aborted, the producer fenced)."""
        entry = self._producers.get(transactional_id)
        if entry is None:
            raise KeyError(transactional_id)
        pid, epoch, _, _ = await self.init_producer(
            transactional_id, entry.timeout_ms, entry.two_phase and self.settings.allow_two_phase
        )
        return pid, epoch

    async def _roll(self, txnid: TxnID) -> None:
        """Roll an unfinished transaction back (abort it if OPEN or PREPARED)
        or forward (wait until its decision is applied)."""
        meta = self._table.get(txnid)
        if meta is None:
            return
        if meta.status in _WAITING:
            await self._decide(meta, TxnEvent.ABORT)
        else:
            await self._answer(txnid, None)

    def producer_txn(self, producer_id: int, epoch: int, what: str) -> TxnID:
        """The ongoing transaction of the producer a send or ack (``what``)
        comes from, begun now if it has none (KIP-890 part 2); raises the
        producer's refusal (fenced, not allowed in its state, ...)."""
        entry = self._producers.check(producer_id, epoch, what)
        ongoing = self._ongoing_of(entry, what)
        if ongoing is not None:
            return ongoing
        return self._begin_producer_txn(entry, producer_id, epoch, lazy=True)

    def producer_begin(self, producer_id: int, epoch: int, what: str) -> asyncio.Future[TxnID]:
        """`producer_txn` for a producer that begins its transactions
        explicitly (Kafka's AddPartitionsToTxn and AddOffsetsToTxn): its
        ongoing transaction once the begin is durable (at once if it is).

        Sends and acks are answered before they are durable, and a crash
        aborts their transaction; but one that came before the transaction's
        begin was durable loses it altogether, and a Kafka client's EndTxn
        names no transaction: it would find nothing ongoing and succeed,
        committing nothing of what the client was told it wrote. Once the
        begin is durable, a restart finds the transaction OPEN, aborts it and
        bumps the producer's epoch: the client learns it was aborted."""
        entry = self._producers.check(producer_id, epoch, what)
        ongoing = self._ongoing_of(entry, what)
        result: asyncio.Future[TxnID] = asyncio.get_running_loop().create_future()
        if ongoing is None:
            ongoing = self._begin_producer_txn(entry, producer_id, epoch, lazy=False)
        txnid = ongoing
        written = self._begins.get(txnid)
        if written is None:
            result.set_result(txnid)
            return result

        def logged(f: asyncio.Future[int]) -> None:
            if not pass_failure(f, result) and not result.done():
                result.set_result(txnid)

        written.add_done_callback(logged)
        return result

    def _begin_producer_txn(
        self, entry: ProducerEntry, producer_id: int, epoch: int, lazy: bool
    ) -> TxnID:
        """Open the producer's next transaction and log it as its ongoing one
        (``lazy``: see `ledger.Ledger.append`)."""
        txnid = self.new_txn(
            0 if entry.two_phase else entry.timeout_ms,
            producer=entry.identity,
            two_phase=entry.two_phase,
        )
        began = dataclasses.replace(
            entry,
            ongoing=txnid,
            txn_producer_id=producer_id,
            txn_epoch=epoch,
            updated_ms=_now_ms(),
        )
        written = self._append(ProducerRegistry.record(began), lazy=lazy)
        self._begins[txnid] = written
        written.add_done_callback(lambda _: self._begins.pop(txnid, None))
        return txnid

    def producer_verified_partition(
        self, producer_id: int, epoch: int, topic: str, partition: int
    ) -> TxnID:
        """A send of a producer that adds its partitions explicitly (Kafka's
        AddPartitionsToTxn before KIP-890 part 2): its ongoing transaction, if
        the partition was added to it (KIP-890 part 1's verification);
        `InvalidTxnStateError` if not, and nothing begins."""
        what = f"send to {topic}/{partition}"
        entry = self._producers.check(producer_id, epoch, what)
        ongoing = self._ongoing_of(entry, what)
        if ongoing is None:
            raise InvalidTxnStateError(
                f"{what} refused: {entry.transactional_id!r} has no ongoing transaction "
                "(add the partition to one first)"
            )
        try:
            self.verify_partition(ongoing, topic, partition)
        except Exception as exc:
            raise InvalidTxnStateError(
                f"{what} refused: the partition was not added to the transaction of "
                f"{entry.transactional_id!r}"
            ) from exc
        return ongoing

    def _ongoing_of(self, entry: ProducerEntry, what: str) -> TxnID | None:
        """``entry``'s OPEN transaction (None if none); raises if it has one
        that a send or ack may not join."""
        tid = entry.transactional_id
        if entry.ongoing is not None:
            if entry.txn_identity != entry.identity:
                raise InvalidTxnStateError(
                    f"{what} refused: {tid!r} was initialized keeping its prepared transaction: "
                    "commit, abort or complete it first"
                )
            meta = self._table.get(entry.ongoing)
            if meta is not None and meta.status is TxnStatus.OPEN:
                return entry.ongoing
            if meta is not None and meta.status is TxnStatus.PREPARED:
                raise InvalidTxnStateError(
                    f"{what} refused: the transaction of {tid!r} is prepared: commit, abort or "
                    "complete it"
                )
            raise TransactionAbortableError(
                f"{what} refused: the transaction of {tid!r} was aborted; abort it and begin "
                "the next"
            )
        return None

    def producer_add_partition(
        self, producer_id: int, epoch: int, topic: str, partition: int
    ) -> TxnID:
        """A producer's send to a partition: its transaction, with the partition added."""
        txnid = self.producer_txn(producer_id, epoch, f"send to {topic}/{partition}")
        self.add_partition(txnid, topic, partition)
        return txnid

    def producer_add_subscription(
        self, producer_id: int, epoch: int, topic: str, subscription: str
    ) -> TxnID:
        """send_offsets_to_transaction: the producer's transaction, with the subscription added."""
        txnid = self.producer_txn(producer_id, epoch, f"acknowledge on {topic}/{subscription}")
        self.add_subscription(txnid, topic, subscription)
        return txnid

    def prepare_producer_txn(self, producer_id: int, epoch: int) -> asyncio.Future[tuple[int, int]]:
        """KIP-939's prepareTransaction: the ongoing transaction PREPARED
        (`prepare_txn`, its record queued now, so it shares a group commit
        with the transaction's last writes); the result, its identity, once
        that is durable; refused with nothing ongoing, as a commit is
        (`end_producer_txn`). A refusal is raised at once, changing nothing."""
        entry = self._producers.check(producer_id, epoch, "prepare")
        if not entry.two_phase:
            raise InvalidTxnStateError(
                f"prepare refused: {entry.transactional_id!r} did not enable two-phase commit"
            )
        if entry.ongoing is None:
            raise TransactionAbortableError(
                f"prepare refused: producer {producer_id} epoch {epoch} "
                f"({entry.transactional_id!r}) has no transaction here; a broker restart lost "
                "it before any of its writes were durable: abort it and begin the next"
            )
        result: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()
        if entry.txn_identity != entry.identity:
            raise InvalidTxnStateError(
                f"prepare refused: {entry.transactional_id!r} was initialized keeping its "
                "prepared transaction: commit, abort or complete it"
            )
        meta = self._table.get(entry.ongoing)
        if meta is None or meta.status not in _WAITING:
            raise TransactionAbortableError(
                f"prepare refused: the transaction of {entry.transactional_id!r} was aborted"
            )
        identity = entry.identity

        def durable(written: asyncio.Future[int]) -> None:
            if not pass_failure(written, result) and not result.done():
                result.set_result(identity)

        self.prepare_txn(entry.ongoing).add_done_callback(durable)
        return result

    def end_producer_txn(
        self, producer_id: int, epoch: int, commit: bool, bump: bool = True
    ) -> asyncio.Future[tuple[int, int]]:
        """EndTxn: commit or abort the producer's ongoing transaction and
        bump its identity (KIP-890). With nothing ongoing an abort only
        bumps, and a commit is refused (TRANSACTION_ABORTABLE): clients send
        no END for a transaction that wrote nothing, so the transaction was
        lost in a restart before any of it was durable. The result, the
        identity for its next transaction, once the decision is applied and
        the new identity durable. A retried END (the identity it ended, the
        same outcome) is answered with the identity it was given.

        ``bump=False``: Kafka's EndTxn before version 5 (transactions before
        KIP-890 part 2), whose producer keeps its identity for the next
        transaction: the identity stays, and the producer's sends must name
        partitions added explicitly (`producer_verified_partition`)."""
        outcome = "commit" if commit else "abort"
        entry = self._producers.of_producer(producer_id)
        loop = asyncio.get_running_loop()
        result: asyncio.Future[tuple[int, int]] = loop.create_future()
        if (
            (producer_id, epoch) == (entry.prev_producer_id, entry.prev_epoch)
            and entry.prev_outcome == outcome
            and ((producer_id, epoch) != entry.identity or entry.ongoing is None)
        ):
            result.set_result(entry.identity)  # (a retry of the END that ended it)
            return result
        entry = self._producers.check(producer_id, epoch, f"{outcome} transaction")
        if entry.ongoing is None and commit:
            raise TransactionAbortableError(
                f"commit refused: producer {producer_id} epoch {epoch} "
                f"({entry.transactional_id!r}) has no transaction here; a broker restart lost "
                "it before any of its writes were durable: abort it and begin the next"
            )
        decided: asyncio.Future[None] | None = None
        if entry.ongoing is not None:
            meta = self._table.get(entry.ongoing)
            if meta is not None and meta.status in _WAITING:
                decided = self._decide(meta, TxnEvent.COMMIT if commit else TxnEvent.ABORT)
            elif meta is not None and same_outcome(meta.status, commit):
                decided = self._answer(entry.ongoing, None)
            else:
                raise TransactionAbortableError(
                    f"{outcome} refused: the transaction of {entry.transactional_id!r} was "
                    "aborted; abort it and begin the next"
                )
        if bump:
            pid, next_epoch = self._producers.bump(*entry.identity)
            ended = dataclasses.replace(
                entry,
                producer_id=pid,
                epoch=next_epoch,
                ongoing=None,
                txn_producer_id=-1,
                txn_epoch=-1,
                prev_producer_id=producer_id,
                prev_epoch=epoch,
                prev_outcome=outcome,
                bumped_by="end",
                updated_ms=_now_ms(),
            )
        else:
            pid, next_epoch = entry.identity
            ended = dataclasses.replace(
                entry,
                ongoing=None,
                txn_producer_id=-1,
                txn_epoch=-1,
                prev_producer_id=producer_id,
                prev_epoch=epoch,
                prev_outcome=outcome,
                updated_ms=_now_ms(),
            )
        written = self._append(ProducerRegistry.record(ended))
        waits: list[asyncio.Future[Any]] = [written] if decided is None else [decided, written]
        left = len(waits)

        def one_done(f: asyncio.Future[Any]) -> None:
            nonlocal left
            left -= 1
            if result.done() or pass_failure(f, result):
                return
            if left == 0:
                result.set_result((pid, next_epoch))

        for f in waits:
            f.add_done_callback(one_done)
        return result

    def _abort_by_coordinator(self, meta: TxnMeta, event: TxnEvent) -> asyncio.Future[None]:
        """Abort ``meta`` (a timeout, a restart, an operator): decide, and if
        it is a producer's ongoing transaction, bump that producer's
        identity, so a late write of it is refused and its client learns it
        may abort and go on (TRANSACTION_ABORTABLE)."""
        decided = self._decide(meta, event)
        if meta.producer is not None:
            try:
                entry = self._producers.of_producer(meta.producer[0])
            except Exception:
                return decided
            if entry.ongoing == meta.txnid and entry.txn_identity == entry.identity:
                pid, epoch = self._producers.bump(*entry.identity)
                self._append(
                    ProducerRegistry.record(
                        dataclasses.replace(
                            entry,
                            producer_id=pid,
                            epoch=epoch,
                            ongoing=None,
                            txn_producer_id=-1,
                            txn_epoch=-1,
                            prev_producer_id=entry.producer_id,
                            prev_epoch=entry.epoch,
                            prev_outcome="abort",
                            bumped_by="coordinator",
                            updated_ms=_now_ms(),
                        )
                    )
                )
        return decided

    def _expire_producers(self) -> None:
        """Forget the transactional ids idle for longer than their expiration
        (a producer of one gets INVALID_PRODUCER_ID_MAPPING); again later."""
        self._producer_expiry = None
        if self._closed:
            return
        for tid in self._producers.expired(_now_ms(), self.settings.expiration_ms):
            log.info("coordinator %d: transactional id %r expired", self.tcid, tid)
            self._append(ProducerRegistry.expire_record(tid), lazy=True)
        every = min(60.0, max(0.05, self.settings.expiration_ms / 4000))
        self._producer_expiry = asyncio.get_running_loop().call_later(every, self._expire_producers)

    def active_open_time_max_ms(self) -> int:
        """KIP-939's active-transaction-open-time-max: the longest any
        transaction not yet decided (OPEN or PREPARED) has been open."""
        now = _now_ms()
        starts = [m.start_ms for m in self._table.txns.values() if m.status in _WAITING]
        return max((now - s for s in starts), default=0)

    # -- timeouts -------------------------------------------------------------------

    def _arm_expiry(self, deadline_ms: int) -> None:
        """Fire the expiry at ``deadline_ms`` (or at once if past)."""
        if self._closed:
            return
        if self._expiry is not None:
            self._expiry.cancel()
        self._expiry_at = deadline_ms
        delay = max(0.0, (deadline_ms - _now_ms()) / 1000)
        self._expiry = asyncio.get_running_loop().call_later(delay, self._expire)

    def _expire(self) -> None:
        """Abort every OPEN transaction past its deadline; wait for the next."""
        self._expiry, self._expiry_at = None, 0
        for txnid in self._table.expired(_now_ms()):
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

    def _append(self, rec: Record, lazy: bool = False) -> asyncio.Future[int]:
        """Append ``rec`` and apply it (append order is durability order);
        the result is done once it is durable."""
        written = self._log.append(rec, lazy)
        self._table.apply(rec) or self._producers.apply(rec)
        if self._log.snapshot_due():
            self._log.write_snapshot(self._table, self._producers)
        return written

    def _spawn(self, coro: Any) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recover(self) -> None:
        t0 = time.perf_counter()
        replayed = await self._log.replay(self._table, self._producers)
        boot = self._table.boot()
        await self._append(boot)  # (durable before any id of its epoch is handed out)
        table = self._table
        unfinished = [m for m in table.txns.values() if m.status not in _WAITING]
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
            self._tell(meta, None)
        self._aborted_at_start = {m.txnid for m in lost}
        # (all decisions logged at once: one group commit, not one each)
        ended = [self._abort_by_coordinator(meta, TxnEvent.ABORT) for meta in lost]
        if ended:
            await asyncio.wait(ended, timeout=END_WAIT)
        deadline = table.next_deadline()
        if deadline is not None:
            self._arm_expiry(deadline)
        self._expire_producers()


_WAITING = (TxnStatus.OPEN, TxnStatus.PREPARED)  # not decided: nothing to finish


def _quietly(f: asyncio.Future[None]) -> None:
    if not f.cancelled() and (error := f.exception()) is not None:
        log.warning("timing out a transaction failed: %s", error)


def _all_of(futures: list[asyncio.Future[None]]) -> asyncio.Future[None]:
    """Done when every one of ``futures`` is; failed with the first failure."""
    result: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = len(futures)
    if not left:
        result.set_result(None)
        return result

    def one_done(f: asyncio.Future[None]) -> None:
        nonlocal left
        left -= 1
        if result.done() or pass_failure(f, result):
            return
        if left == 0:
            result.set_result(None)

    for f in futures:
        f.add_done_callback(one_done)
    return result
