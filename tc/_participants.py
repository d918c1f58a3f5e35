"""Telling the participants of a decided transaction (PIP-31
§CommandEndTxnOnPartition and §CommandEndTxnOnSubscription; Kafka's
``TransactionMarkerChannelManager``).

A coordinator decides (its COMMITTING / ABORTING record appended, see
`tc._coordinator`) and hands the transaction to its `ParticipantChannel`,
which tells every partition and subscription the transaction registered,
through the `Participant` the broker implements:

- What a participant is told is a `TxnEnd`: the transaction, the outcome,
  the producer it belongs to (the producer-epoch mode: a partition refuses
  a marker of an epoch older than it has seen) and the coordinator's boot
  epoch. It carries everything a participant needs, so a participant never
  asks the coordinator back: it is the shape of a message to a participant
  in another process.
- Each participant is told at once, in the turn of the loop that appended
  the decision, so that what it queues goes right behind the decision, in
  its group commit (`ledger`: append order is durability order). One that
  has to wait (a buffer being created, another END of the transaction under
  way there) or fails is awaited in a task, told again (backing off) until
  it applies the decision, and listed as stuck meanwhile (`stuck`): an
  operator may ask for a retry now or skip it (`resolve`).
- A participant owned by another broker (a cluster) raises
  `ParticipantElsewhere` with what tells it over the wire: that tell runs
  once the decision is durable (never before: a participant elsewhere
  does not share this store's group commit), and is retried like a local
  one until it is answered done; it looks the owner up again at each try.
- A tell elsewhere that finds this coordinator no longer owns its slot (the
  participant refused its END for an older slot epoch than the cluster
  tables', and the tables say so) raises `CoordinatorMoved`: the channel
  stops telling that participant, quietly, and never logs the end. The
  slot's new owner recovered the same log, and tells every participant of
  the decision itself; this broker drops the slot once it notices.
- Once every participant has applied the decision, and the decision is
  durable, the channel calls the coordinator's ``finished``, which logs the
  end (COMMITTED / ABORTED).
- `answer` is END's answer: done once the decision is durable and applied
  by every participant, or `END_WAIT` seconds after the decision is
  durable (the decision stands; the channel goes on telling).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ledger import LedgerError, faults, pass_failure
from proto import TxnID
from tc._table import TxnMeta, now_ms

__all__ = [
    "END_WAIT",
    "CoordinatorMoved",
    "NotStuckError",
    "Participant",
    "ParticipantChannel",
    "ParticipantElsewhere",
    "StuckParticipant",
    "TxnEnd",
]

log = logging.getLogger(__name__)

RETRY_MAX_S = 2.0  # the longest wait between tries of a participant with a storage error
STUCK_RETRY_MAX_S = 30.0  # ... and of a participant that refuses
END_WAIT = 5.0  # seconds END waits for the participants to apply the decision


@dataclass(frozen=True, slots=True)
class TxnEnd:
    """A coordinator's decision, as each of its participants is told it.

    ``producer``: the (producer id, epoch) the transaction belongs to in the
    producer-epoch mode (None otherwise): a partition refuses the marker of
    an epoch older than one it has seen. ``coordinator_epoch``: the boot
    epoch of the coordinator that decided (`tc._table`): one in another
    process can refuse an END of an older epoch of a coordinator than one it
    has heard from, as Kafka's partitions do with WriteTxnMarkers' coordinator
    epoch (in one process there is one coordinator of each id: nothing to
    refuse)."""

    txnid: TxnID
    commit: bool
    producer: tuple[int, int] | None = None
    coordinator_epoch: int = 0


class Participant(Protocol):
    """What a coordinator needs of brokers: end a transaction on a partition
    or a subscription, as its coordinator decided (``end``).

    Each is called in the turn of the loop in which the decision was
    appended to the coordinator's log, and queues its writes in the same
    store, behind the decision (so they are durable only with it). It
    returns None once they are queued, or an awaitable that completes when
    they are (it has to wait: a transaction buffer being created, another
    END of the transaction under way there). Both are idempotent; they raise
    if they cannot apply the decision (the coordinator tries again), or
    `ParticipantElsewhere` if another broker serves the participant."""

    def end_txn_on_partition(
        self, topic: str, partition: int, end: TxnEnd
    ) -> Awaitable[None] | None: ...

    def end_txn_on_subscription(
        self, topic: str, subscription: str, end: TxnEnd
    ) -> Awaitable[None] | None: ...


class ParticipantElsewhere(Exception):
    """Raised by a `Participant` whose partition or subscription another
    broker owns: ``tell()`` tells it there (over the wire), returning once
    that broker has applied the decision durably. The channel calls it only
    once the decision is durable."""

    def __init__(self, where: str, tell: Callable[[], Awaitable[None]]) -> None:
        super().__init__(f"{where} is served by another broker")
        self.tell = tell


class CoordinatorMoved(Exception):
    """Raised by a tell elsewhere (`ParticipantElsewhere.tell`) when this
    coordinator's slot has moved to another broker (the participant refused
    the END's slot epoch as older than the cluster tables', and they say
    so): it must stop telling, as the slot's new owner tells instead."""


class NotStuckError(LookupError):
    """An operator resolved a transaction that has no stuck participant."""


@dataclass(slots=True)
class StuckParticipant:
    """A participant that failed to apply its coordinator's decision: the
    coordinator keeps trying it (backing off) until it applies it or an
    operator resolves it (`ParticipantChannel.resolve`)."""

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


# One participant of a decided transaction: its name ("partition t/0"), what
# tells it the decision, and the crash hook hit once it has applied it.
_Tell = tuple[str, Callable[[], "Awaitable[None] | None"], str]


class ParticipantChannel:
    """The participants of one coordinator's decided transactions (see the
    module docstring). ``finished(meta)`` is called once every participant
    of ``meta`` has applied its decision, and the decision is durable."""

    def __init__(
        self, tcid: int, participant: Participant, finished: Callable[[TxnMeta], None]
    ) -> None:
        self.tcid = tcid
        self._participant = participant
        self._finished = finished
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        # Decided transactions whose participants have not all applied the
        # decision yet: done once they have.
        self._applied: dict[TxnID, asyncio.Future[None]] = {}
        # Decided transactions with a participant that failed to apply the
        # decision: txnid -> participant -> what went wrong.
        self._stuck: dict[TxnID, dict[str, StuckParticipant]] = {}
        self.failures = 0  # failed attempts to end on a participant, ever
        self.moved = 0  # participants no longer told: the coordinator's slot moved

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass

    # -- telling ----------------------------------------------------------------------

    def tell(self, meta: TxnMeta, end: TxnEnd, logged: asyncio.Future[int] | None) -> None:
        """Tell every participant of ``meta`` its decision ``end`` (durable,
        or being written by ``logged``), now; once each has applied it and
        the decision is durable, ``finished``. Participants that wait or
        fail are awaited in a task."""
        participant = self._participant
        tells: list[_Tell] = [
            (
                f"partition {topic}/{index}",
                functools.partial(participant.end_txn_on_partition, topic, index, end),
                "tc.after_partition_end",
            )
            for topic, index in meta.partitions
        ]
        tells += [
            (
                f"subscription {topic}/{sub}",
                functools.partial(participant.end_txn_on_subscription, topic, sub, end),
                "tc.after_subscription_end",
            )
            for topic, sub in meta.subscriptions
        ]
        tells = [(name, self._anywhere(call, logged), step) for name, call, step in tells]
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
        self._applied[meta.txnid] = loop.create_future()
        if not later:
            if logged is None:
                self._all_applied(meta, tells)
            else:
                logged.add_done_callback(functools.partial(self._when_durable, meta, tells))
            return
        self._spawn(self._finish(meta, tells, later, logged))

    @staticmethod
    def _anywhere(
        call: Callable[[], Awaitable[None] | None], logged: asyncio.Future[int] | None
    ) -> Callable[[], Awaitable[None] | None]:
        """``call`` (a participant's end), or, when it says its participant
        is on another broker, that broker's tell once ``logged`` (the
        decision) is durable."""

        def attempt() -> Awaitable[None] | None:
            try:
                return call()
            except ParticipantElsewhere as elsewhere:
                return _tell_elsewhere(elsewhere.tell, logged)

        return attempt

    def applied_with(self, txnid: TxnID, written: asyncio.Future[int]) -> None:
        """A decision nobody is told (a local transaction's commit: its
        writes are in its record's group commit): applied once ``written``
        is durable; until then an END of it waits (`answer`). Never
        finished (its record is its end)."""
        applied: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._applied[txnid] = applied

        def done(f: asyncio.Future[int]) -> None:
            if not f.cancelled() and f.exception() is None:
                applied.set_result(None)
                if self._applied.get(txnid) is applied:
                    del self._applied[txnid]

        written.add_done_callback(done)

    def answer(self, txnid: TxnID, logged: asyncio.Future[int] | None) -> asyncio.Future[None]:
        """END's answer: done once the decision (``logged``, None if durable
        already) is durable and every participant has applied it, or
        `END_WAIT` seconds after the decision is durable; failed if the
        decision's write fails."""
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
        """`tell`'s task: wait for (or tell again, until they apply it) the
        participants that did not apply the decision at once; then, the
        decision durable, `_all_applied`; not if the coordinator's slot
        moved (`CoordinatorMoved`: its new owner finishes the decision)."""
        applied = await asyncio.gather(
            *(self._until_applied(meta.txnid, tell, pending) for tell, pending in later)
        )
        if not all(applied):
            return
        if logged is not None:
            try:
                await logged
            except LedgerError:
                return  # (END reports it; a restart finishes the decision)
        self._all_applied(meta, tells)

    def _all_applied(self, meta: TxnMeta, tells: list[_Tell]) -> None:
        """Every participant applied the decision, which is durable: END may
        be answered, and the coordinator logs the end."""
        for _, _, step in tells:
            faults.hit(step)
        applied = self._applied.pop(meta.txnid, None)
        if applied is not None and not applied.done():
            applied.set_result(None)
        self._finished(meta)

    async def _until_applied(
        self, txnid: TxnID, tell: _Tell, pending: Awaitable[None] | None
    ) -> bool:
        """Wait for ``pending`` (the participant's answer to being told),
        telling it again until it applies the decision on ``txnid``. A
        participant that fails is listed as stuck (`stuck`), logged at ERROR
        on its 1st, 2nd, 4th, 8th, ... failure, and tried again, backing off
        up to `STUCK_RETRY_MAX_S` (`RETRY_MAX_S` for a storage error, which
        passes), or at once when an operator asks (`resolve`); an operator
        may also skip it: the transaction then ends without it. False: not
        told, the coordinator's slot having moved (`CoordinatorMoved`)."""
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
            except CoordinatorMoved as exc:
                self.moved += 1
                log.log(
                    logging.WARNING if self.moved == 1 else logging.INFO,
                    "coordinator %d: %s of %s not told here any more: %s (the slot's new owner "
                    "tells it%s)",
                    self.tcid,
                    participant,
                    txnid,
                    exc,
                    "; further ones logged at INFO" if self.moved == 1 else "",
                )
                self._unstick(txnid, participant)
                return False
            except Exception as exc:
                pending = None
                self.failures += 1
                entry = self._stuck_entry(txnid, participant, exc)
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
                    return True
                entry.action = None
                continue
            if participant in self._stuck.get(txnid, ()):
                log.info("coordinator %d: %s applied %s at last", self.tcid, participant, txnid)
                self._unstick(txnid, participant)
            return True

    # -- stuck participants --------------------------------------------------------------

    def _stuck_entry(self, txnid: TxnID, participant: str, exc: Exception) -> StuckParticipant:
        """List ``participant`` as stuck on ``txnid`` (failed with ``exc``),
        logging it on its 1st, 2nd, 4th, ... failure."""
        stuck = self._stuck.setdefault(txnid, {})
        entry = stuck.get(participant)
        if entry is None:
            entry = stuck[participant] = StuckParticipant(participant, "", now_ms())
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
        return entry

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
        Returns how many participants it applies to; raises `NotStuckError`
        if none (``action`` is checked by the caller)."""
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

    def _spawn(self, coro: Any) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _tell_elsewhere(
    tell: Callable[[], Awaitable[None]], logged: asyncio.Future[int] | None
) -> None:
    """A participant on another broker is told once the decision is durable."""
    if logged is not None:
        await asyncio.shield(logged)  # (a failed write raises: not told)
    await tell()
