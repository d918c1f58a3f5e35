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
- Timeouts: OPEN transactions past their deadline are aborted (a sorted
  index of deadlines in the table, one timer).
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger import LedgerError, LedgerStore, faults, pass_failure
from tc._log import TxnLog
from tc._status import InvalidTxnStatusError, TxnEvent, TxnStatus
from tc._table import Record, TxnMeta, TxnTable, TxnTimeoutError, same_outcome
from tc._txnid import TxnID

__all__ = [
    "NotStuckError",
    "Participant",
    "StuckParticipant",
    "TransactionCoordinator",
]

log = logging.getLogger(__name__)

RETRY_MAX_S = 2.0  # the longest wait between tries of a participant with a storage error
STUCK_RETRY_MAX_S = 30.0  # ... and of a participant that refuses
END_WAIT = 5.0  # seconds END waits for the participants to apply the decision


class NotStuckError(LookupError):
    """An operator resolved a transaction that has no stuck participant."""


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


# One participant of a decided transaction: its name ("partition t/0") and
# what tells it the decision.
_Tell = tuple[str, Callable[[], "Awaitable[None] | None"], str]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


class TransactionCoordinator:
    """Create with `TransactionCoordinator.open`; `close` stops its tasks."""

    def __init__(
        self, tcid: int, store: LedgerStore, txn_log: TxnLog, participant: Participant
    ) -> None:
        self.tcid = tcid
        self.store = store
        self._log = txn_log
        self._participant = participant
        self._table = TxnTable(tcid)
        self._tasks: set[asyncio.Task[None]] = set()
        # Decided transactions whose participants have not all applied the
        # decision yet: done once they have.
        self._applied: dict[TxnID, asyncio.Future[None]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._expiry_at = 0  # ms: when the expiry timer fires (0: none set)
        self._closed = False
        self._aborted_at_start: set[TxnID] = set()  # (for a clearer error)
        # Decided transactions with a participant that failed to apply the
        # decision: txnid -> participant -> what went wrong.
        self._stuck: dict[TxnID, dict[str, StuckParticipant]] = {}
        self.participant_failures = 0  # failed attempts to end on a participant, ever

    @classmethod
    async def open(
        cls, tcid: int, store: LedgerStore, participant: Participant
    ) -> TransactionCoordinator:
        """Open coordinator ``tcid``: its log is the ledger ``tc/<tcid>`` in
        ``store``, where ``participant`` keeps every partition and
        subscription it ends transactions on. Returns once recovered."""
        ledger = await store.open_ledger(f"tc/{tcid}")
        tc = cls(tcid, store, TxnLog(ledger), participant)
        await tc._recover()
        return tc

    async def close(self) -> None:
        self._closed = True
        self._log.closed = True
        if self._expiry is not None:
            self._expiry.cancel()
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

    def new_txn(self, timeout_ms: int = 0) -> TxnID:
        """Open a transaction (§CommandNewTxn): its NEW record is appended,
        and it is OPEN from now on. ValueError for a bad timeout."""
        rec = self._table.new(timeout_ms, _now_ms())
        txnid = self._table.next_txnid()
        self._append(rec, lazy=True)  # (durable with the first write that needs it)
        deadline = self._table.txns[txnid].deadline_ms
        if not self._expiry_at or deadline < self._expiry_at:
            self._arm_expiry(deadline)
        return txnid

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
        if meta.status is not TxnStatus.OPEN:
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
        return self._decide(meta, TxnEvent.COMMIT if commit else TxnEvent.ABORT)

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
            written = self._append(self._table.finish(meta.txnid, _now_ms()), lazy=True)
        except InvalidTxnStatusError:
            return  # (ended already: a repeated finish after a restart)
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
            raise ValueError(f"action must be 'retry' or 'skip', got {action!r}")
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
                self._decide(meta, TxnEvent.TIMEOUT).add_done_callback(_quietly)
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
        self._table.apply(rec)
        if self._log.snapshot_due():
            self._log.write_snapshot(self._table)
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
        replayed = await self._log.replay(self._table)
        boot = self._table.boot()
        await self._append(boot)  # (durable before any id of its epoch is handed out)
        table = self._table
        unfinished = [m for m in table.txns.values() if m.status is not TxnStatus.OPEN]
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
        ended = [self._decide(meta, TxnEvent.ABORT) for meta in lost]
        if ended:
            await asyncio.wait(ended, timeout=END_WAIT)
        deadline = table.next_deadline()
        if deadline is not None:
            self._arm_expiry(deadline)


def _quietly(f: asyncio.Future[None]) -> None:
    if not f.cancelled() and (error := f.exception()) is not None:
        log.warning("timing out a transaction failed: %s", error)
