"""A transaction coordinator (PIP-31 §Transaction Coordinator).

Each coordinator has an id (TCID) and its own log: a ledger ``tc/<id>`` of
`TransactionMetadataEntry` records (NEW / ADD_PARTITION / ADD_SUBSCRIPTION /
UPDATE / RESERVE_IDS). Every request is logged and applied to the in-memory
map, and answered once its record is durable (NEW excepted, see below);
recovery replays the log
through the same `_apply`. A snapshot (the live map and the id counter) is
written every `SNAPSHOT_EVERY` records and the log trimmed before it, so
recovery time does not grow with history.

Where the log lives decides when a record is applied:

- In a store of its own (a SQLite file ``tc-<id>.db``, or any store its
  participants do not write to), a record is applied once it is durable, and
  a participant writes for a transaction only after the coordinator's record
  that allows it is durable: a send or ack waits for its registration, the
  commit markers for the COMMITTING record.
- In the store its participants write to (``participants_share_store``, what
  the broker does), append order is durability order (`ledger`), so a record
  is applied as it is appended and the participants write right behind it:
  a send or ack lands in the same group commit as its registration, the
  commit markers in the same one as the COMMITTING record, and a whole
  transaction costs two fsyncs in a row instead of five. NEW is answered
  before its record is durable: a crash may forget a transaction that has
  no participant yet (its client gets TxnNotFound and starts again), never
  one with data; ids are reserved in blocks (RESERVE_IDS, logged ahead of
  use), so an id handed out before a crash is never handed out again.
  With ``abort_open_on_recovery`` (the broker's setting) registrations,
  sends and acks are answered once appended as well, and a restart aborts
  every transaction it finds OPEN: only END waits for an fsync. Then
  registrations are not logged at all: the decision record (COMMITTING /
  ABORTING) names every participant, which is all recovery needs to finish
  a decided transaction, and the participants abort on restart what they
  hold of a transaction the coordinator did not decide to commit (the
  broker asks them, `broker.Broker`). A transaction logs NEW, its decision
  and its end: three records, not five.

Ending a transaction (§CommandEndTxn): log COMMITTING / ABORTING (the
decision), tell every registered partition and subscription through the
`Participant` interface, retrying each until it answers, then log
COMMITTED / ABORTED. END is answered once every participant has applied the
decision (or after `END_WAIT`, the decision being durable anyway): PIP-31
answers as soon as the decision is logged, but then a client's next send
could land in a partition before the commit marker of the transaction it
just committed (Jepsen's nonmonotonic-send), and a consumer would not see
committed messages right after `commit()` returns. On start, every
COMMITTING / ABORTING transaction is finished; OPEN ones past their timeout
are aborted (a sorted deadline index).

The broker's END path (`end_txn_at_once`): with records applied as appended
and participants that can queue their end at once (`QueuingParticipant`),
the decision is logged and every participant queues its marker or ack
commit right behind it in the same turn of the loop as the END was read,
with no task: so a transaction's sends, its decision and its markers share
one group commit, and END is answered from a callback once it is durable.
Where a participant cannot end it at once, `_finish` tells them all in a
task, as before.

The coordinator reaches partitions and subscriptions only through
`Participant`, which the broker implements (in process today; over the wire
with END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION when a coordinator runs
alone).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from sortedcontainers import SortedList

from ledger import Ledger, LedgerError, LedgerStore, faults, pass_failure, unawaited
from proto import txnbuf_pb2 as pb
from tc._status import (
    InvalidTxnStatusError,
    TxnEvent,
    TxnStatus,
    check_update,
    status_of,
    transition,
)
from tc._txnid import TxnID, wire_txnid

__all__ = [
    "NotStuckError",
    "Participant",
    "QueuingParticipant",
    "StuckParticipant",
    "TransactionCoordinator",
    "TxnMeta",
    "TxnNotFoundError",
    "TxnTimeoutError",
]

log = logging.getLogger(__name__)

Op = pb.TransactionMetadataEntry
SNAPSHOT_EVERY = 10_000  # log records between snapshots (~3.7 ms to write one with 1,000 ended)
ENDED_KEPT = 10_000  # ended transactions remembered, so a repeated END is answered
ENDED_IN_SNAPSHOT = 1000  # of which the newest survive a restart
DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 3_600_000
RETRY_MAX_S = 2.0  # the longest wait between tries of a failing write of the log
STUCK_RETRY_MAX_S = 30.0  # ... and between tries of a participant that refuses
END_WAIT = 5.0  # seconds END waits for the participants to apply the decision
ID_BLOCK = 10_000  # ids reserved by one RESERVE_IDS record (the most a restart skips)
_RECORD, _SNAPSHOT = 0, 1  # ledger meta of the two entry kinds


class TxnNotFoundError(LookupError):
    """No such transaction on this coordinator (never, or ended long ago)."""


class TxnTimeoutError(InvalidTxnStatusError):
    """The transaction was aborted by its timeout."""


class NotStuckError(LookupError):
    """An operator resolved a transaction that has no stuck participant."""


class Participant(Protocol):
    """What a coordinator needs from brokers: end a transaction on a partition
    or a subscription. Both are idempotent and raise if they cannot answer.

    They return once what they wrote is durable, or, with ``durable=False``,
    once it is queued in the store (in order). A coordinator passes False
    only when its log shares that store (``participants_share_store``): its
    decision is durable already, and its COMMITTED/ABORTED record, appended
    after they return, is durable only with what they queued."""

    async def end_txn_on_partition(
        self, topic: str, partition: int, txnid: TxnID, commit: bool, durable: bool = True
    ) -> None: ...

    async def end_txn_on_subscription(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool, durable: bool = True
    ) -> None: ...


@runtime_checkable
class QueuingParticipant(Participant, Protocol):
    """A `Participant` that can also end a transaction at once: queue its
    writes in the coordinator's store (as with ``durable=False``) without a
    turn of the loop. Each returns False where it cannot (an END of the
    transaction already under way there, say); the coordinator then calls
    the async method, which waits. The broker's participants are these:
    with them a commit ends everywhere in the turn that decides it, with no
    task (see `TransactionCoordinator._finish_at_once`)."""

    def end_txn_on_partition_now(
        self, topic: str, partition: int, txnid: TxnID, commit: bool
    ) -> bool: ...

    def end_txn_on_subscription_now(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool
    ) -> bool: ...


@dataclass(slots=True)
class TxnMeta:
    txnid: TxnID
    status: TxnStatus
    timeout_ms: int
    start_ms: int
    last_modified_ms: int
    partitions: list[tuple[str, int]] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)
    timed_out: bool = False
    # Registrations logged but not durable yet: participant -> the log write's
    # outcome. A send or ack that follows its registration on the same
    # connection waits for it (`partition_registration`).
    adding: dict[tuple[str, int] | tuple[str, str], asyncio.Future[bool]] = field(
        default_factory=dict
    )

    @property
    def deadline_ms(self) -> int:
        return self.start_ms + self.timeout_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "txnid": str(self.txnid),
            "tc_id": self.txnid.tcid,
            "status": self.status.name,
            "timeout_ms": self.timeout_ms,
            "start_ms": self.start_ms,
            "last_modified_ms": self.last_modified_ms,
            "partitions": [{"topic": t, "partition": p} for t, p in self.partitions],
            "subscriptions": [{"topic": t, "subscription": s} for t, s in self.subscriptions],
            "timed_out": self.timed_out,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TxnMeta:
        return cls(
            txnid=TxnID.parse(d["txnid"]),
            status=TxnStatus[d["status"]],
            timeout_ms=int(d["timeout_ms"]),
            start_ms=int(d["start_ms"]),
            last_modified_ms=int(d["last_modified_ms"]),
            partitions=[(p["topic"], int(p["partition"])) for p in d["partitions"]],
            subscriptions=[(s["topic"], s["subscription"]) for s in d["subscriptions"]],
            timed_out=bool(d["timed_out"]),
        )


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


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_timeout(timeout_ms: int) -> None:
    if timeout_ms < 0 or timeout_ms > MAX_TIMEOUT_MS:
        raise ValueError(f"transaction timeout must be 0..{MAX_TIMEOUT_MS} ms, got {timeout_ms}")


def _answer_decided(answered: asyncio.Future[None], logged: asyncio.Future[bool]) -> None:
    """`TransactionCoordinator.end_txn_at_once`, every participant told at
    once: END may be answered now that the decision is durable (its
    participants counted as done in an earlier callback)."""
    if answered.done() or pass_failure(logged, answered):
        return
    faults.hit("tc.after_decision_logged")
    answered.set_result(None)


def _register_in_memory(meta: TxnMeta, registered: list[Any], new: list[Any]) -> None:
    """Register ``new`` participants without logging them (participants
    that answer early): the decision record names every participant
    (`TransactionCoordinator._decide`), and a restart aborts a transaction
    left OPEN wherever a participant holds it (the participants ask, see
    `broker.Broker`), so a registration a crash forgets is never needed."""
    registered.extend(new)
    meta.last_modified_ms = _now_ms()


def _add_participants(meta: TxnMeta, rec: pb.TransactionMetadataEntry) -> None:
    """Add the partitions and subscriptions ``rec`` names that ``meta`` lacks."""
    for p in rec.partitions:
        if (p.topic, p.partition) not in meta.partitions:
            meta.partitions.append((p.topic, p.partition))
    for s in rec.subscriptions:
        if (s.topic, s.subscription) not in meta.subscriptions:
            meta.subscriptions.append((s.topic, s.subscription))


class TransactionCoordinator:
    """Create with `TransactionCoordinator.open`; `close` stops its tasks."""

    def __init__(
        self,
        tcid: int,
        store: LedgerStore,
        ledger: Ledger,
        participant: Participant,
        eager: bool = False,
    ) -> None:
        self.tcid = tcid
        self.store = store
        self._ledger = ledger
        self._participant = participant
        # Apply records as they are appended (the participants share the store).
        self._eager = eager
        # Participants that end a transaction at once (eager mode only: their
        # writes must go behind the decision in its store).
        self._queuing = (
            participant if eager and isinstance(participant, QueuingParticipant) else None
        )
        self._id_bound = 0  # counters below it are reserved durably (eager mode)
        self._reserving: asyncio.Future[None] | None = None
        self._txns: dict[TxnID, TxnMeta] = {}
        self._ended: collections.OrderedDict[TxnID, TxnMeta] = collections.OrderedDict()
        self._next_counter = 0
        self._deadlines: SortedList = SortedList()  # (deadline_ms, txnid) of OPEN ones
        self._deadline_changed = asyncio.Event()
        self._wakes_at = 0  # ms: when the expiry loop wakes next (0: it is awake)
        self._tasks: set[asyncio.Task[None]] = set()
        # Decided transactions whose participants have not all answered yet.
        self._applied: dict[TxnID, asyncio.Future[None]] = {}
        self._records_since_snapshot = 0
        self._last_applied = -1  # entry id of the last record applied
        self._closed = False
        self._owns_store = False
        self._abort_open_on_recovery = False
        self._aborted_at_start: set[TxnID] = set()
        self._first_counter_here = 0  # ids below it were handed out before the last restart
        # Decided transactions with a participant that failed to apply the
        # decision: txnid -> participant -> what went wrong.
        self._stuck: dict[TxnID, dict[str, StuckParticipant]] = {}
        self.participant_failures = 0  # failed attempts to end on a participant, ever

    @classmethod
    async def open(
        cls,
        tcid: int,
        where: str | Path | LedgerStore,
        participant: Participant,
        *,
        participants_share_store: bool = False,
        abort_open_on_recovery: bool = False,
    ) -> TransactionCoordinator:
        """Open coordinator ``tcid``: its log is the ledger ``tc/<tcid>`` in
        ``where`` (a `LedgerStore` shared with others, or a directory in which
        it gets a database of its own, ``tc-<tcid>.db``).

        ``participants_share_store``: ``where`` is the store in which the
        participant keeps every partition and subscription it ends
        transactions on, so records are applied as they are appended (see
        the module docstring).

        ``abort_open_on_recovery``: on start, abort every transaction that
        was OPEN, rather than let its client go on. With the participants in
        the shared store this lets registrations, sends and acks be answered
        once queued, before they are durable (`participants_answer_early`):
        a crash that lost one of them aborts the transaction, so END (which
        waits for durability) never commits past it."""
        if isinstance(where, LedgerStore):
            store, owned = where, False
        elif participants_share_store:
            raise ValueError("participants_share_store needs the participants' LedgerStore")
        else:
            store, owned = await LedgerStore.open(Path(where) / f"tc-{tcid}.db"), True
        ledger = await store.open_ledger(f"tc/{tcid}")
        tc = cls(tcid, store, ledger, participant, eager=participants_share_store)
        tc._owns_store = owned
        tc._abort_open_on_recovery = abort_open_on_recovery
        await tc._recover()
        return tc

    @property
    def participants_answer_early(self) -> bool:
        """Are registrations (here) and transactional sends and acks (by the
        participants) answered once appended, before they are durable? Yes
        when the participants share this coordinator's store (what is
        appended after a write is durable only with it: the COMMITTING
        record cannot outlive a lost write) and a restart aborts the
        transactions it found open (``abort_open_on_recovery``)."""
        return self._eager and self._abort_open_on_recovery

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._owns_store:
            await self.store.close()

    # -- queries ------------------------------------------------------------------

    def get(self, txnid: TxnID) -> TxnMeta | None:
        return self._txns.get(txnid) or self._ended.get(txnid)

    def transactions(self) -> list[TxnMeta]:
        """Every transaction not ended, and the recently ended ones."""
        return [*self._txns.values(), *self._ended.values()]

    def is_open(self, txnid: TxnID) -> bool:
        """Whether ``txnid`` is known here as OPEN."""
        meta = self._txns.get(txnid)
        return meta is not None and meta.status is TxnStatus.OPEN

    def _live(self, txnid: TxnID) -> TxnMeta:
        meta = self.get(txnid)
        if meta is None or txnid.tcid != self.tcid:
            why = ""
            if (
                self._abort_open_on_recovery
                and txnid.tcid == self.tcid
                and txnid.counter < self._first_counter_here
            ):
                why = (
                    " (it was open when the broker restarted, which aborted it, or it "
                    "ended long ago)"
                )
            raise TxnNotFoundError(
                f"transaction {txnid} is not known to coordinator {self.tcid}{why}"
            )
        return meta

    def verify_partition(self, txnid: TxnID, topic: str, partition: int) -> None:
        """KIP-890's check before a transactional write: OPEN, partition registered."""
        meta = self._live(txnid)
        if meta.status is not TxnStatus.OPEN:
            raise self._status_error(meta, "write to")
        if (topic, partition) not in meta.partitions:
            raise InvalidTxnStatusError(
                meta.status, f"write to partition {topic}/{partition} (not added to) "
            )

    def verify_subscription(self, txnid: TxnID, topic: str, subscription: str) -> None:
        """The same check before a transactional acknowledgement."""
        meta = self._live(txnid)
        if meta.status is not TxnStatus.OPEN:
            raise self._status_error(meta, "acknowledge in")
        if (topic, subscription) not in meta.subscriptions:
            raise InvalidTxnStatusError(
                meta.status, f"acknowledge on {topic}/{subscription} (not added to) "
            )

    @staticmethod
    def _status_error(meta: TxnMeta, what: str) -> InvalidTxnStatusError:
        if meta.timed_out:
            return TxnTimeoutError(meta.status, f"{what} (timed out)")
        return InvalidTxnStatusError(meta.status, what)

    # -- requests -----------------------------------------------------------------

    async def new_txn(self, timeout_ms: int = 0) -> TxnID:
        """Open a transaction (§CommandNewTxn): logged OPEN before it is
        answered (in eager mode answered once appended, see the module
        docstring)."""
        _check_timeout(timeout_ms)
        if self._eager:
            await self._reserve_ids()
            return self._log_new(timeout_ms)[0]
        txnid, logged = self._log_new(timeout_ms)
        assert logged is not None  # (not eager: it is awaited)
        await logged
        return txnid

    def new_txn_now(self, timeout_ms: int = 0) -> TxnID | None:
        """`new_txn` at once, where it waits for nothing: eager mode (its
        OPEN record is applied as appended and answered before it is
        durable) with an id reserved. None otherwise (call `new_txn`);
        ValueError for a bad timeout."""
        _check_timeout(timeout_ms)
        if not self._eager or not self._ids_reserved():
            return None
        return self._log_new(timeout_ms)[0]

    def _log_new(self, timeout_ms: int) -> tuple[TxnID, asyncio.Future[bool] | None]:
        """Log the OPEN record (NEW) of the next transaction: its id and the
        log write to await (None in eager mode: the record is lazy, applied
        now, and nobody awaits it; the registration that follows is logged
        behind it)."""
        txnid = TxnID.of(self.tcid, self._next_counter)
        self._next_counter += 1
        now = _now_ms()
        rec = Op(
            metadata_op=Op.NEW,
            txnid_most_bits=txnid.most_bits,
            txnid_least_bits=txnid.least_bits,
            new_status=pb.OPEN,
            txn_timeout_ms=timeout_ms or DEFAULT_TIMEOUT_MS,
            txn_start_time=now,
            txn_last_modification_time=now,
        )
        if self._eager:
            self._log(rec, True, None)
            return txnid, None
        return txnid, self._persist_now(rec)

    def _ids_reserved(self) -> bool:
        """Is the next id below the durably reserved bound (eager mode)?
        Starts reserving the next block once half of this one is used."""
        if self._reserving is None and self._next_counter + ID_BLOCK // 2 >= self._id_bound:
            self._reserving = self._reserve(max(self._id_bound, self._next_counter) + ID_BLOCK)
        return self._next_counter < self._id_bound

    async def _reserve_ids(self) -> None:
        """Wait until the next id is below a durably reserved bound (eager mode)."""
        while not self._ids_reserved():
            assert self._reserving is not None
            await asyncio.shield(self._reserving)

    def _reserve(self, bound: int) -> asyncio.Future[None]:
        """Log RESERVE_IDS up to ``bound``; the result is done once the bound
        is durable and in force (so a waiter always finds it moved)."""
        rec = Op(metadata_op=Op.RESERVE_IDS, id_bound=bound)
        in_force: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def durable(appended: asyncio.Future[int]) -> None:
            self._reserving = None
            if appended.cancelled():
                in_force.cancel()
            elif (error := appended.exception()) is not None:
                in_force.set_exception(error)
            else:
                self._apply(rec)
                in_force.set_result(None)

        self._ledger.append(rec.SerializeToString(), meta=_RECORD).add_done_callback(durable)
        in_force.add_done_callback(unawaited)  # (its waiters, if any, get the error)
        return in_force

    def partition_registration(
        self, txnid: TxnID, topic: str, partition: int
    ) -> asyncio.Future[bool] | None:
        """Before a transactional write: None if the partition is registered,
        the registration's log write if it is still in flight (wait for it,
        then `verify_partition`); raises like `verify_partition` otherwise."""
        pending = self._pending(txnid, (topic, partition))
        if pending is None:
            self.verify_partition(txnid, topic, partition)
        return pending

    def subscription_registration(
        self, txnid: TxnID, topic: str, subscription: str
    ) -> asyncio.Future[bool] | None:
        """`partition_registration` for a transactional acknowledgement."""
        pending = self._pending(txnid, (topic, subscription))
        if pending is None:
            self.verify_subscription(txnid, topic, subscription)
        return pending

    def join_partition(
        self, txnid: TxnID, topic: str, partition: int
    ) -> asyncio.Future[bool] | None:
        """`partition_registration` for a send that asks to add its partition
        (KIP-890 part 2: the broker adds it, not a request of the client's):
        an OPEN transaction gets the partition registered (logged as by
        `add_partitions`) first."""
        self._join(txnid, (topic, partition), Op.ADD_PARTITION)
        return self.partition_registration(txnid, topic, partition)

    def join_subscription(
        self, txnid: TxnID, topic: str, subscription: str
    ) -> asyncio.Future[bool] | None:
        """`join_partition` for an acknowledgement that asks to add its subscription."""
        self._join(txnid, (topic, subscription), Op.ADD_SUBSCRIPTION)
        return self.subscription_registration(txnid, topic, subscription)

    def _join(self, txnid: TxnID, key: Any, op: Any) -> None:
        """Register ``key`` with an OPEN transaction that has it neither
        registered nor being registered; otherwise do nothing."""
        meta = self.get(txnid)
        if meta is None or meta.status is not TxnStatus.OPEN or key in meta.adding:
            return
        registered = meta.partitions if op == Op.ADD_PARTITION else meta.subscriptions
        if key in registered:
            return
        if self.participants_answer_early:
            _register_in_memory(meta, registered, [key])
            return
        self._register(txnid, op, [key], "join").add_done_callback(unawaited)

    def _pending(self, txnid: TxnID, key: Any) -> asyncio.Future[bool] | None:
        meta = self.get(txnid)
        if meta is None or meta.status is not TxnStatus.OPEN:
            return None
        return meta.adding.get(key)

    def add_partitions(
        self, txnid: TxnID, partitions: list[tuple[str, int]]
    ) -> asyncio.Future[None]:
        """§CommandAddPartitionToTxn: TxnNotFound, or invalid status unless OPEN.

        The log write starts now, before this returns, so that a send that
        follows on the same connection finds the registration in flight and
        waits for it (`partition_registration`) instead of being refused;
        await the result for durability. Refusals raise at once.
        """
        return self._register(txnid, Op.ADD_PARTITION, partitions, "add partitions to")

    def add_subscriptions(
        self, txnid: TxnID, subscriptions: list[tuple[str, str]]
    ) -> asyncio.Future[None]:
        """§CommandAddSubscriptionToTxn: as `add_partitions`."""
        return self._register(txnid, Op.ADD_SUBSCRIPTION, subscriptions, "add subscriptions to")

    def _register(
        self, txnid: TxnID, op: Any, wanted: list[Any], what: str
    ) -> asyncio.Future[None]:
        """Log an ADD_PARTITION / ADD_SUBSCRIPTION record of the participants
        of ``wanted`` neither registered nor being registered (none: no
        record); the result is done when every one of ``wanted`` is durably
        registered."""
        meta = self._live(txnid)
        if meta.status is not TxnStatus.OPEN:
            raise self._status_error(meta, what)
        partitions = op == Op.ADD_PARTITION
        registered: list[Any] = meta.partitions if partitions else meta.subscriptions
        keys = list(dict.fromkeys(wanted))
        new = [k for k in keys if k not in registered and k not in meta.adding]
        if self.participants_answer_early:
            _register_in_memory(meta, registered, new)
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            done.set_result(None)
            return done
        rec = self._record(op, txnid)
        refs: Any = rec.partitions if partitions else rec.subscriptions
        field = "partition" if partitions else "subscription"
        for topic, name in new:
            refs.add(topic=topic, **{field: name})
        waits = {meta.adding[k] for k in keys if k in meta.adding}
        if new:
            written = self._persist_now(rec)  # eager: registered from now on
            waits.add(written)
            if not self._eager:
                for key in new:
                    meta.adding[key] = written

                def settled(f: asyncio.Future[bool], keys: list[Any] = new) -> None:
                    if not f.cancelled():
                        f.exception()  # (the waiters get it)
                    for key in keys:
                        if meta.adding.get(key) is written:
                            del meta.adding[key]

                written.add_done_callback(settled)

        # Done when every write waited for is: a callback each, no task.
        result: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        left = len(waits)

        def one_done(written: asyncio.Future[bool]) -> None:
            nonlocal left
            left -= 1
            if result.done() or pass_failure(written, result):
                return
            if not written.result():
                result.set_exception(self._status_error(meta, what))
            elif left == 0:
                result.set_result(None)

        if not waits:
            result.set_result(None)
        for written in waits:
            written.add_done_callback(one_done)
        return result

    async def end_txn(self, txnid: TxnID, commit: bool) -> None:
        """§CommandEndTxn: log the decision, answer, then finish in the background.

        Repeating the same END is answered with success at any later status;
        the other action is an `InvalidTxnStatusError` (`TxnTimeoutError` for a
        COMMIT of a transaction the timeout aborted).
        """
        meta = self._live(txnid)
        event = TxnEvent.COMMIT if commit else TxnEvent.ABORT
        if meta.status is not TxnStatus.OPEN:
            if self._same_outcome(meta, commit):
                await self._wait_applied(txnid)
                return
            if commit and meta.timed_out:
                raise TxnTimeoutError(meta.status, "commit (it timed out and was aborted)")
            if commit and txnid in self._aborted_at_start:
                raise InvalidTxnStatusError(
                    meta.status, "commit (it was open when the broker restarted, so it was aborted)"
                )
            raise InvalidTxnStatusError(meta.status, event)
        await self._decide(meta, event)
        await self._wait_applied(txnid)

    async def _wait_applied(self, txnid: TxnID) -> None:
        """Wait (at most `END_WAIT` seconds) until every participant applied the
        decision, so that when END returns the transaction's messages are in
        their partitions (a later send of the same client lands after them)
        and its acknowledgements are final. The decision is durable already:
        past the wait, END answers anyway and the participants follow."""
        applied = self._applied.get(txnid)
        if applied is None or applied.done():
            return
        # A callback and a timer rather than wait_for(shield(...)): END's
        # answer is on the critical path of every transaction, and each
        # future chained in between is one more turn of a busy loop.
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()

        def release(_: object = None) -> None:
            if not waiter.done():
                waiter.set_result(None)

        applied.add_done_callback(release)
        timer = loop.call_later(END_WAIT, release)
        try:
            await waiter
        finally:
            timer.cancel()
            applied.remove_done_callback(release)
        if not applied.done():
            log.warning("coordinator %d: %s not applied everywhere yet", self.tcid, txnid)

    @staticmethod
    def _same_outcome(meta: TxnMeta, commit: bool) -> bool:
        if commit:
            return meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
        return meta.status in (TxnStatus.ABORTING, TxnStatus.ABORTED)

    def end_txn_at_once(self, txnid: TxnID, commit: bool) -> asyncio.Future[None] | None:
        """`end_txn` of an OPEN transaction where records are applied as
        appended (eager mode), without a task: decided in this turn of the
        loop, so that the decision goes in the group commit of the sends and
        acks read just before it, and the participants told at once
        (`QueuingParticipant`). The result is done when END may be answered
        (the decision durable and applied everywhere, as with `end_txn`),
        or failed as `end_txn` would fail. None where the transaction is not
        OPEN (a repeated END, a conflict, ...) or records wait for
        durability: call `end_txn`. Raises `TxnNotFoundError` at once."""
        if not self._eager:
            return None
        meta = self._live(txnid)
        if meta.status is not TxnStatus.OPEN:
            return None
        logged, at_once = self._decide_now(meta, TxnEvent.COMMIT if commit else TxnEvent.ABORT)
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if at_once:
            logged.add_done_callback(functools.partial(_answer_decided, answered))
        else:
            self._spawn(self._answer_applied(txnid, logged, answered))
        return answered

    async def _answer_applied(
        self, txnid: TxnID, logged: asyncio.Future[bool], answered: asyncio.Future[None]
    ) -> None:
        """`end_txn_at_once` where a participant could not be told at once:
        answer as `end_txn` does, once the decision is durable and applied."""
        try:
            await logged
            faults.hit("tc.after_decision_logged")
            await self._wait_applied(txnid)
        except asyncio.CancelledError:
            answered.cancel()
            raise
        except Exception as exc:
            if not answered.done():
                answered.set_exception(exc)
            return
        if not answered.done():
            answered.set_result(None)

    async def _decide(self, meta: TxnMeta, event: TxnEvent) -> None:
        if self._eager:
            await self._decide_now(meta, event)[0]
            faults.hit("tc.after_decision_logged")  # the markers may be durable too
            return
        rec = self._decision_record(meta, event)
        if not await self._persist(rec):
            # Another END won the race; it decided the same outcome or not.
            if self._same_outcome(meta, event is TxnEvent.COMMIT):
                return
            raise InvalidTxnStatusError(meta.status, event)
        faults.hit("tc.after_decision_logged")
        self._start_finish(meta)

    def _decide_now(self, meta: TxnMeta, event: TxnEvent) -> tuple[asyncio.Future[bool], bool]:
        """Eager mode: log the decision, applied as appended (the status
        checked just now is current), and start telling the participants:
        their markers and acks land behind it, in its group commit or a
        later one. The decision's log write, and whether every participant
        was told at once (`_start_finish`)."""
        logged = self._persist_now(self._decision_record(meta, event))
        return logged, self._start_finish(meta, logged)

    def _decision_record(self, meta: TxnMeta, event: TxnEvent) -> pb.TransactionMetadataEntry:
        new = transition(meta.status, event)
        rec = self._record(Op.UPDATE, meta.txnid)
        rec.expected_status = meta.status  # type: ignore[assignment]
        rec.new_status = new  # type: ignore[assignment]
        rec.timed_out = event is TxnEvent.TIMEOUT
        # The decision names every participant: recovery finishes it from
        # this record alone (registrations are not logged when participants
        # answer early).
        for topic, index in meta.partitions:
            rec.partitions.add(topic=topic, partition=index)
        for topic, sub in meta.subscriptions:
            rec.subscriptions.add(topic=topic, subscription=sub)
        return rec

    # -- finishing ------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        if self._closed:
            coro.close()
            return
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _start_finish(self, meta: TxnMeta, decided: asyncio.Future[bool] | None = None) -> bool:
        """Tell the participants of ``meta``'s decision: at once if they all
        can (True), else in a task (`_finish`)."""
        if meta.txnid not in self._applied:
            self._applied[meta.txnid] = asyncio.get_running_loop().create_future()
        if decided is not None and self._finish_at_once(meta, decided):
            return True
        self._spawn(self._finish(meta, decided))
        return False

    def _finish_at_once(self, meta: TxnMeta, decided: asyncio.Future[bool]) -> bool:
        """Eager mode, with a `QueuingParticipant`: tell every participant now,
        right behind the decision ``decided`` (the log write, not durable
        yet), and once it is durable, count them as done and log the end,
        in a callback. What `_finish` does, without a task or a turn of the
        loop: the commit path of every transaction. False if a participant
        cannot end it at once: then `_finish` tells them all again (ends are
        idempotent)."""
        queuing = self._queuing
        if queuing is None:
            return False
        commit = meta.status is TxnStatus.COMMITTING
        txnid = meta.txnid
        try:
            for topic, index in meta.partitions:
                if not queuing.end_txn_on_partition_now(topic, index, txnid, commit):
                    return False
            for topic, sub in meta.subscriptions:
                if not queuing.end_txn_on_subscription_now(topic, sub, txnid, commit):
                    return False
        except Exception as exc:  # (`_finish` retries it, and says so)
            log.debug("coordinator %d: ending %s at once failed: %s", self.tcid, txnid, exc)
            return False
        decided.add_done_callback(functools.partial(self._finished_at_once, meta))
        return True

    def _finished_at_once(self, meta: TxnMeta, decided: asyncio.Future[bool]) -> None:
        """The decision `_finish_at_once` told the participants of is durable:
        as `_finish` does once its participants answered, hit their fault
        steps, count them as done and log the end (lazily: it is durable only
        with what they queued behind the decision)."""
        if decided.cancelled() or decided.exception() is not None:
            return  # (the store failed: END reports it; a restart finishes the decision)
        for _ in meta.partitions:
            faults.hit("tc.after_partition_end")
        for _ in meta.subscriptions:
            faults.hit("tc.after_subscription_end")
        self._mark_applied(meta.txnid)
        logged = self._persist_now(self._end_record(meta), lazy=True)
        logged.add_done_callback(functools.partial(self._end_logged, meta.txnid))

    def _mark_applied(self, txnid: TxnID) -> None:
        """Every participant of ``txnid`` has applied its decision: an END
        waiting for that (`_wait_applied`) may be answered."""
        applied = self._applied.get(txnid)
        if applied is not None and not applied.done():
            applied.set_result(None)

    def _end_logged(self, txnid: TxnID, logged: asyncio.Future[bool]) -> None:
        self._applied.pop(txnid, None)
        if not logged.cancelled() and (error := logged.exception()) is not None:
            log.error("coordinator %d: logging the end of %s failed: %s", self.tcid, txnid, error)

    def _end_record(self, meta: TxnMeta) -> pb.TransactionMetadataEntry:
        """The record of ``meta``'s end (COMMITTED / ABORTED), every
        participant having applied its decision."""
        rec = self._record(Op.UPDATE, meta.txnid)
        rec.expected_status = meta.status  # type: ignore[assignment]
        rec.new_status = transition(meta.status, TxnEvent.FINISH)  # type: ignore[assignment]
        return rec

    async def _finish(self, meta: TxnMeta, decided: asyncio.Future[bool] | None = None) -> None:
        """Tell every participant (retrying each until it answers): all at
        once, or in turn where each answers as soon as its writes are queued;
        then log the end. ``decided``: the decision's log write,
        if it may not be durable yet (eager mode: the participants' writes
        go behind it at once); a participant counts as done once it is."""
        commit = meta.status is TxnStatus.COMMITTING
        durable = not self._eager  # (see `Participant`)
        on_partition = self._participant.end_txn_on_partition
        on_subscription = self._participant.end_txn_on_subscription

        def partition(topic: str, index: int) -> Callable[[], Awaitable[None]]:
            return lambda: self._until_applied(
                meta.txnid,
                f"partition {topic}/{index}",
                lambda: on_partition(topic, index, meta.txnid, commit, durable),
            )

        def subscription(topic: str, sub: str) -> Callable[[], Awaitable[None]]:
            return lambda: self._until_applied(
                meta.txnid,
                f"subscription {topic}/{sub}",
                lambda: on_subscription(topic, sub, meta.txnid, commit, durable),
            )

        # Each participant: what tells it, and the fault step after it.
        ends = [
            *((partition(t, i), "tc.after_partition_end") for t, i in meta.partitions),
            *((subscription(t, s), "tc.after_subscription_end") for t, s in meta.subscriptions),
        ]
        if not durable or len(ends) == 1:
            # Participants that answer once their writes are queued (they
            # wait for nothing), or just one: in turn, in this task, with no
            # task per participant and no turns of the loop between them.
            # Each counts as done once the decision is durable too.
            for tell, _ in ends:
                await tell()
            if decided is not None:
                await decided
            for _, step in ends:
                faults.hit(step)
        else:

            async def one(tell: Callable[[], Awaitable[None]], step: str) -> None:
                await tell()
                if decided is not None:
                    await decided
                faults.hit(step)

            await asyncio.gather(*(one(tell, step) for tell, step in ends))
        self._mark_applied(meta.txnid)
        rec = self._end_record(meta)
        # Nobody waits for this record (END answered once the participants
        # applied the decision): in eager mode it goes with a later commit.
        await self._until_done(
            lambda: self._persist(rec, lazy=self._eager), "log the end of %s", meta.txnid
        )
        self._applied.pop(meta.txnid, None)

    async def _until_done(self, attempt: Any, what: str, *args: object) -> None:
        """Await ``attempt()`` until it succeeds, backing off; ``what % args``
        says what failed (formatted only then)."""
        delay = 0.05
        while True:
            try:
                await attempt()
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("coordinator %d: %s failed (%s); retrying", self.tcid, what % args, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _until_applied(
        self, txnid: TxnID, participant: str, attempt: Callable[[], Awaitable[None]]
    ) -> None:
        """Await ``attempt()`` (tell ``participant`` the decision on
        ``txnid``) until it succeeds. A participant that fails is listed as
        stuck (`stuck`), logged at ERROR on its 1st, 2nd, 4th, 8th, ...
        failure, and tried again, backing off up to `STUCK_RETRY_MAX_S`
        (`RETRY_MAX_S` for a storage error, which passes), or at once when
        an operator asks (`resolve`); an operator may also skip it: the
        transaction then ends without it."""
        delay = 0.05
        while True:
            try:
                await attempt()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
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

    async def _expire_loop(self) -> None:
        while True:
            self._deadline_changed.clear()
            now = _now_ms()
            # It may wake at a deadline whose transaction has ended since:
            # it finds nothing to do and sleeps again.
            self._wakes_at = self._deadlines[0][0] if self._deadlines else now + 3_600_000
            wait = max(0.0, (self._wakes_at - now) / 1000)
            try:
                async with asyncio.timeout(wait):
                    await self._deadline_changed.wait()
                continue
            except TimeoutError:
                pass
            self._wakes_at = 0
            now = _now_ms()
            while self._deadlines and self._deadlines[0][0] <= now:
                _, txnid = self._deadlines.pop(0)
                meta = self._txns.get(txnid)
                if meta is not None and meta.status is TxnStatus.OPEN:
                    log.info("coordinator %d: transaction %s timed out", self.tcid, txnid)
                    try:
                        await self._decide(meta, TxnEvent.TIMEOUT)
                    except Exception as exc:
                        log.warning("timing out %s failed: %s", txnid, exc)

    # -- the log --------------------------------------------------------------------

    def _record(self, op: Any, txnid: TxnID) -> pb.TransactionMetadataEntry:
        return Op(
            metadata_op=op,
            txnid_most_bits=txnid.most_bits,
            txnid_least_bits=txnid.least_bits,
            txn_last_modification_time=_now_ms(),
        )

    async def _persist(self, rec: pb.TransactionMetadataEntry, lazy: bool = False) -> bool:
        """Append ``rec`` durably, then apply it; False if it no longer applies."""
        return await self._persist_now(rec, lazy)

    def _persist_now(
        self, rec: pb.TransactionMetadataEntry, lazy: bool = False
    ) -> asyncio.Future[bool]:
        """Queue ``rec`` now; the result, once it is durable and applied, is
        False if it no longer applies (`_log`)."""
        outcome: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._log(rec, lazy, outcome)
        return outcome

    def _log(
        self, rec: pb.TransactionMetadataEntry, lazy: bool, outcome: asyncio.Future[bool] | None
    ) -> None:
        """Queue ``rec`` now; once it is durable and applied, ``outcome`` (if
        any: eager mode's OPEN records have no waiter) gets False if it no
        longer applies. Records are applied in log order: as they are
        appended in eager mode, otherwise in the append's done callback (so
        that a waiter that gives up cannot leave a durable record
        unapplied)."""
        appended = self._ledger.append(rec.SerializeToString(), meta=_RECORD, lazy=lazy)
        applied_now = self._apply(rec) if self._eager else False

        def durable(appended: asyncio.Future[int]) -> None:
            if appended.cancelled():
                if outcome is not None:
                    outcome.cancel()
                return
            error = appended.exception()
            if error is not None:
                if outcome is not None and not outcome.done():
                    outcome.set_exception(error)
                return
            applied = applied_now if self._eager else self._apply(rec)
            self._last_applied = max(self._last_applied, appended.result())
            self._records_since_snapshot += 1
            if self._records_since_snapshot >= SNAPSHOT_EVERY:
                self._records_since_snapshot = 0
                self._write_snapshot()
            if outcome is not None and not outcome.done():  # (a waiter that gave up cancelled it)
                outcome.set_result(applied)

        appended.add_done_callback(durable)

    def _apply(self, rec: pb.TransactionMetadataEntry) -> bool:
        """Apply one log record to the map (live and in recovery). False: ignored
        because the transaction is no longer in the status the record expects."""
        op = rec.metadata_op
        if op == Op.RESERVE_IDS:
            self._id_bound = max(self._id_bound, rec.id_bound)
            return True
        txnid = wire_txnid(rec.txnid_most_bits, rec.txnid_least_bits)
        if op == Op.NEW:
            meta = TxnMeta(
                txnid=txnid,
                status=TxnStatus.OPEN,
                timeout_ms=rec.txn_timeout_ms,
                start_ms=rec.txn_start_time,
                last_modified_ms=rec.txn_last_modification_time,
            )
            self._txns[txnid] = meta
            self._next_counter = max(self._next_counter, txnid.counter + 1)
            deadline = (meta.deadline_ms, txnid)
            self._deadlines.add(deadline)
            if meta.deadline_ms < self._wakes_at:  # (else it wakes in time anyway)
                self._deadline_changed.set()
            return True
        meta_or_none = self._txns.get(txnid)
        if meta_or_none is None:
            return False
        meta = meta_or_none
        if op in (Op.ADD_PARTITION, Op.ADD_SUBSCRIPTION):
            if meta.status is not TxnStatus.OPEN:
                return False
            _add_participants(meta, rec)
        elif op == Op.UPDATE:
            expected = status_of(rec.expected_status)
            if meta.status is not expected:
                return False
            if expected is TxnStatus.OPEN:  # the decision: it names the participants
                _add_participants(meta, rec)
            meta.status = check_update(expected, status_of(rec.new_status))
            meta.timed_out = meta.timed_out or rec.timed_out
            if expected is TxnStatus.OPEN:
                self._deadlines.discard((meta.deadline_ms, txnid))
            if meta.status.ended:
                del self._txns[txnid]
                self._remember_ended(meta)
        else:
            return False
        meta.last_modified_ms = max(meta.last_modified_ms, rec.txn_last_modification_time)
        return True

    def _remember_ended(self, meta: TxnMeta) -> None:
        self._ended[meta.txnid] = meta
        while len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)

    def _write_snapshot(self) -> None:
        """Snapshot the map as of the last applied record, then trim before it.

        Records queued but not yet applied may land before the snapshot
        entry: recovery replays everything after ``covers`` (the last applied
        record), so they are never lost. In eager mode everything appended
        before the snapshot is applied: it covers every entry before its own
        (``covers`` null).
        """
        covers = None if self._eager else self._last_applied
        snap = {
            "covers": covers,
            "next_counter": self._next_counter,
            "id_bound": self._id_bound,
            "txns": [m.to_json() for m in self._txns.values()],
            "ended": [m.to_json() for m in list(self._ended.values())[-ENDED_IN_SNAPSHOT:]],
        }
        fut = self._ledger.append(json.dumps(snap).encode(), meta=_SNAPSHOT)

        def trim(_f: object) -> None:
            # (Not once closing: the store may be closed; the next snapshot trims.)
            if not self._closed and not fut.cancelled() and fut.exception() is None:
                self._ledger.trim(fut.result() if covers is None else covers + 1)

        fut.add_done_callback(trim)

    async def _recover(self) -> None:
        t0 = time.perf_counter()
        ledger = self._ledger
        metas = await ledger.read_meta()
        snapshots = [entry_id for entry_id, kind in metas if kind == _SNAPSHOT]
        start = ledger.first_entry_id
        if snapshots:
            (snap_entry,) = await ledger.read(snapshots[-1], snapshots[-1])
            snap = json.loads(snap_entry.data)
            self._next_counter = int(snap["next_counter"])
            self._id_bound = int(snap.get("id_bound", 0))
            for d in snap["txns"]:
                meta = TxnMeta.from_json(d)
                self._txns[meta.txnid] = meta
                if meta.status is TxnStatus.OPEN:
                    self._deadlines.add((meta.deadline_ms, meta.txnid))
            for d in snap["ended"]:
                self._remember_ended(TxnMeta.from_json(d))
            covers = snap["covers"]
            start = snapshots[-1] + 1 if covers is None else int(covers) + 1
        replayed = 0
        for entry in await ledger.read(start, ledger.last_entry_id):
            if entry.meta == _RECORD:
                self._apply(Op.FromString(entry.data))
                replayed += 1
        self._last_applied = ledger.last_entry_id
        self._records_since_snapshot = replayed
        # Ids below the reserved bound may have been handed out before the
        # crash without a durable NEW record: never again.
        self._next_counter = max(self._next_counter, self._id_bound)
        self._first_counter_here = self._next_counter
        unfinished = [m for m in self._txns.values() if m.status is not TxnStatus.OPEN]
        log.info(
            "coordinator %d recovered %d transactions (%d to finish) from %d records in %.2fs",
            self.tcid,
            len(self._txns),
            len(unfinished),
            replayed,
            time.perf_counter() - t0,
        )
        for meta in unfinished:
            self._start_finish(meta)
        if self._abort_open_on_recovery:
            lost = [m for m in self._txns.values() if m.status is TxnStatus.OPEN]
            self._aborted_at_start = {m.txnid for m in lost}  # (for a clearer error)
            # (all decisions logged at once: one group commit, not one each)
            await asyncio.gather(*(self._decide(meta, TxnEvent.ABORT) for meta in lost))
            if lost:
                log.info(
                    "coordinator %d: aborted %d transactions open at the restart (their "
                    "registrations, sends and acks were answered before they were durable)",
                    self.tcid,
                    len(lost),
                )
        self._spawn(self._expire_loop())
