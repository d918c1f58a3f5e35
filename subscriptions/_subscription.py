"""A subscription on one partition: durable cursor, consumers and dispatch.

Dispatch: one task per subscription, while it has consumers (`wake` starts
it, and it ends when the last consumer goes: an idle subscription costs no
task), pushes entries to consumers within their flow-control permits: first
messages to redeliver (nacked, or unacked by a consumer that left), then new
entries from the read position. A whole entry
goes to one consumer (its permits may go below zero, as in Pulsar). Every
delivered message is *pending* on its consumer until acked; when the
consumer closes or disconnects its pending messages are redelivered.

Transactions (PIP-31 §PENDING_ACK State): an ack inside a transaction locks
its messages in PENDING_ACK until `end_txn`. A locked message is never
dispatched, and a negative ack, a consumer leaving or a failover change
drops it from the consumer's pending messages instead of redelivering it;
commit deletes it, abort makes it PENDING again and redelivers it.

Persist, then act: every ack record is checked against the cursor, appended
to the cursor ledger, and applied when it is durable, in ledger order (in
the append's done callback, so that a caller that stops waiting cannot leave
a durable record unapplied). A record that a concurrent record made invalid
in between (a transactional ack of a message another record deleted or
locked first) is refused when applied: it changes nothing, live and when the
ledger is replayed, and its caller gets the conflict.

Types: exclusive (one consumer), failover (many, one active per partition:
``sorted consumers[partition % n]``), shared (round robin over consumers
with permits).

Isolation: read committed by default. A subscription created with
``read_uncommitted`` also delivers the messages of transactional sends as
soon as they are in the transaction buffer (open, later committed or later
aborted transactions alike) and skips commit markers (see
`subscriptions._uncommitted` for their ids and acks); no order is promised
between those and the partition's own messages.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import repeat

from sortedcontainers import SortedSet

from buffer import DATA, Partition, Position, TransactionBuffer, entry_count, entry_kind
from ledger import Entry, Ledger, faults, read_runs, unawaited
from proto import TxnID, refusals
from proto import txnbuf_pb2 as pb
from subscriptions._cursor import (
    CUMULATIVE,
    INDIVIDUAL,
    SNAPSHOT,
    TXN_ABORT,
    TXN_ACK,
    TXN_COMMIT,
    WHOLE_ENTRY,
    AckConflict,
    AckRecord,
    Cursor,
    check_txn_key,
    decode_record,
    encode_record,
    replay_cursor,
    txn_end_record,
    txn_text,
)
from subscriptions._state import InvalidAckTransition, MsgState
from subscriptions._uncommitted import SNAPSHOT as U_SNAPSHOT
from subscriptions._uncommitted import (
    UNCOMMITTED_ACK,
    UncommittedCursor,
    from_wire,
    to_wire,
)

__all__ = ["Consumer", "PartitionSubscription", "SubType"]

log = logging.getLogger(__name__)

PENDING = MsgState.PENDING
SNAPSHOT_EVERY = 1000  # ack records between cursor snapshots
READ_BATCH = 64  # entries read per dispatch step
FRAME_BYTES = 1 << 20  # push at most about this much in one frame
ENDED_MEMORY = 10_000  # ended transactions remembered, to refuse their late acks


class SubType(enum.Enum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    FAILOVER = "failover"


@dataclass(eq=False)
class Consumer:
    """A consumer as the broker sees it: one per (connection, consumer id).

    ``push`` sends entries to the client. Permits are shared by every
    partition of the topic the consumer reads.
    """

    consumer_id: int
    name: str
    topic: str
    subscription: str
    sub_type: SubType
    push: Callable[[Consumer, list[pb.DeliveredEntry]], None]
    on_active_change: Callable[[Consumer, bool], None] = lambda c, active: None
    permits: int = 0
    subscriptions: list[PartitionSubscription] = field(default_factory=list)
    order: int = 0  # connect order, breaks ties between equal names
    read_uncommitted: bool = False  # wants a read_uncommitted subscription

    def add_permits(self, n: int) -> None:
        self.permits += n
        for sub in self.subscriptions:
            sub.wake()


class PartitionSubscription:
    """Create with `PartitionSubscription.load`."""

    def __init__(
        self,
        partition: Partition,
        name: str,
        cursor_ledger: Ledger,
        cursor: Cursor,
        uncommitted: tuple[Ledger, UncommittedCursor] | None = None,
    ) -> None:
        self.partition = partition
        self.name = name
        self.cursor = cursor
        self._ledger = cursor_ledger
        # read_uncommitted: the ledger and cursor of what it acked of the sidecar.
        self._uledger: Ledger | None = uncommitted[0] if uncommitted else None
        self.uncommitted: UncommittedCursor | None = uncommitted[1] if uncommitted else None
        self._count: Callable[[int], int] = (
            _count_without_markers(partition) if uncommitted else partition.count
        )
        self.read_sidecar = self.uncommitted.mark_delete + 1 if self.uncommitted else 0
        self._uncommitted_since_snapshot = 0
        self._buffer: TransactionBuffer | None = None
        self.consumers: list[Consumer] = []
        self.pending: dict[Position, Consumer] = {}
        # (Shared and empty until something is to be redelivered: a
        # SortedSet costs about 1 KB, and most subscriptions never need one.)
        self.redeliver: SortedSet = _NO_REDELIVERIES
        self.redelivery_counts: dict[Position, int] = {}
        # Delivered to consumers since start (redelivered ones too), for stats.
        self.messages_out = 0
        self.bytes_out = 0
        self.redelivered = 0
        self.read_entry = cursor.first_open_entry()
        self._active: Consumer | None = None
        self._rr = 0
        self._records_since_snapshot = 0
        self._inflight: list[AckRecord] = []  # ack records appended, not yet applied
        self._resetting: Cursor | None = None  # the cursor a `reset` in flight moves to
        # Transactions ended here lately: a late ack of one would lock its
        # messages for ever, so it is refused (see `end_txn`).
        self._ended: OrderedDict[TxnID, None] = OrderedDict()
        # Dispatch: woken since it last looked, the future it sleeps on, and
        # held by a `reset` (no dispatch task starts meanwhile).
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        partition.ledger.add_listener(self._on_entries)
        if self.uncommitted is not None:
            partition.watch_txn_buffer(self._on_buffer)

    def __repr__(self) -> str:
        return f"PartitionSubscription({self.partition.name!r}, {self.name!r})"

    @staticmethod
    def ledger_name(topic: str, index: int, name: str) -> str:
        return f"c/{topic}/{index}/{name}"

    @staticmethod
    def uncommitted_ledger_name(topic: str, index: int, name: str) -> str:
        return f"u/{topic}/{index}/{name}"

    @property
    def read_uncommitted(self) -> bool:
        return self.uncommitted is not None

    @classmethod
    async def create(
        cls, partition: Partition, name: str, earliest: bool, read_uncommitted: bool = False
    ) -> PartitionSubscription:
        """A new subscription at the earliest or latest position (durably)."""
        store = partition.ledger.store
        uncommitted = None
        if read_uncommitted:  # its ledger first: the cursor ledger makes it exist
            uledger = await store.open_ledger(
                cls.uncommitted_ledger_name(partition.topic, partition.index, name)
            )
            buffer = partition.transaction_buffer
            start = -1
            if buffer is not None:
                sidecar = buffer.sidecar
                start = sidecar.first_entry_id - 1 if earliest else sidecar.last_entry_id
            ucursor = UncommittedCursor(start)
            await uledger.append(ucursor.snapshot(), meta=U_SNAPSHOT)
            uncommitted = (uledger, ucursor)
        ledger = await store.open_ledger(cls.ledger_name(partition.topic, partition.index, name))
        if earliest:
            cursor = Cursor((partition.ledger.first_entry_id - 1, WHOLE_ENTRY))
        else:
            cursor = Cursor((partition.ledger.last_entry_id, WHOLE_ENTRY))
        await ledger.append(cursor.snapshot(), meta=SNAPSHOT)
        return cls(partition, name, ledger, cursor, uncommitted)

    @classmethod
    async def load(cls, partition: Partition, name: str, ledger: Ledger) -> PartitionSubscription:
        """Rebuild a subscription from its cursor ledger: snapshot, then records
        (and, for a read_uncommitted one, its ledger of sidecar acks)."""
        uledger = partition.ledger.store.get_ledger(
            cls.uncommitted_ledger_name(partition.topic, partition.index, name)
        )
        uncommitted = None
        count: Callable[[int], int] = partition.count
        if uledger is not None:
            uncommitted = (uledger, await _load_uncommitted(uledger))
            count = _count_without_markers(partition)
        entries = await ledger.read(ledger.first_entry_id, ledger.last_entry_id)
        cursor, ended = replay_cursor(ledger.name, entries, count, partition.ledger.last_entry_id)
        sub = cls(partition, name, ledger, cursor, uncommitted)
        sub._records_since_snapshot = len(entries) - 1
        for txn in ended:
            sub._remember_ended(txn)
        return sub

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """Let dispatch run (after a `reset`), and look for work."""
        self._paused = False
        self.wake()

    async def close(self) -> None:
        self._detach()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def _detach(self) -> None:
        self._closed = True
        self.partition.ledger.remove_listener(self._on_entries)
        self.partition.unwatch_txn_buffer(self._on_buffer)
        if self._buffer is not None:
            self._buffer.sidecar.remove_listener(self._on_entries)
        self.wake()

    def settled(self) -> bool:
        """Nothing under way: no consumer (so no dispatch task, nothing
        delivered and unacknowledged), no transaction holding
        acknowledgements, no record or reset in flight. Then `release`
        loses nothing: `load` rebuilds the same state from the ledgers."""
        return (
            not self.consumers
            and self._task is None
            and not self._inflight
            and not self.cursor.txn_acks
            and self._resetting is None
            and self._ledger.settled
            and (self._uledger is None or self._uledger.settled)
        )

    def release(self) -> None:
        """Stop following the partition and give the ledgers' objects back
        to the store; this object is not to be used any more. Only when
        `settled`."""
        self._detach()
        store = self._ledger.store
        store.release_ledger(self._ledger)
        if self._uledger is not None:
            store.release_ledger(self._uledger)

    def wake(self) -> None:
        """Dispatch what can go now: wake the dispatch task, or start one
        if the subscription has consumers."""
        self._woken = True
        waiter = self._waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
        elif self._task is None and self.consumers and not (self._closed or self._paused):
            self._task = asyncio.get_running_loop().create_task(self._dispatch_loop())

    def _on_entries(self, _ledger: Ledger, _entries: list[Entry]) -> None:
        if self.consumers:
            self.wake()

    def _on_buffer(self, buffer: TransactionBuffer) -> None:
        """The partition has a transaction buffer: read its sidecar too."""
        if self._buffer is None and not self._closed:
            self._buffer = buffer
            buffer.sidecar.add_listener(self._on_entries)
            self.wake()

    # -- consumers ----------------------------------------------------------------

    @property
    def sub_type(self) -> SubType | None:
        return self.consumers[0].sub_type if self.consumers else None

    def check_can_add(self, consumer: Consumer) -> None:
        """Raise a `refusals.Refusal` if ``consumer`` may not join (changes
        nothing): NOT_ALLOWED, SUBSCRIPTION_TYPE_MISMATCH or CONSUMER_BUSY."""
        if consumer.read_uncommitted != self.read_uncommitted:
            have = "read_uncommitted" if self.read_uncommitted else "read committed"
            raise refusals.NotAllowed(
                f"subscription {self.name!r} is {have}; its isolation level is fixed "
                "when it is created",
            )
        current = self.sub_type
        if current is None:
            return
        if current is not consumer.sub_type:
            raise refusals.SubscriptionTypeMismatch(
                f"subscription {self.name!r} is {current.value} while it has consumers; "
                f"cannot attach a {consumer.sub_type.value} consumer",
            )
        if current is SubType.EXCLUSIVE:
            raise refusals.ConsumerBusy(
                f"exclusive subscription {self.name!r} already has a consumer"
            )

    def add_consumer(self, consumer: Consumer) -> None:
        self.check_can_add(consumer)
        self.consumers.append(consumer)
        consumer.subscriptions.append(self)
        self._update_active()
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; its unacknowledged messages go to redelivery."""
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        if self in consumer.subscriptions:
            consumer.subscriptions.remove(self)
        self._requeue([p for p, c in self.pending.items() if c is consumer])
        self._update_active()
        self.wake()

    def _update_active(self) -> None:
        if not self.consumers or self.sub_type is not SubType.FAILOVER:
            self._active = self.consumers[0] if self.consumers else None
            return
        ranked = sorted(self.consumers, key=lambda c: (c.name, c.order))
        active = ranked[self.partition.index % len(ranked)]
        if active is not self._active:
            old, self._active = self._active, active
            # The new active consumer gets everything the old one had not acked.
            self._requeue(list(self.pending))
            if old is not None and old in self.consumers:
                old.on_active_change(old, False)
            active.on_active_change(active, True)

    def redeliver_unacked(self, consumer: Consumer, positions: list[Position] | None) -> None:
        """Negative ack: redeliver ``positions`` (all if None) pending on ``consumer``."""
        if positions is None:
            mine = [p for p, c in self.pending.items() if c is consumer]
        else:
            mine = [p for p in positions if self.pending.get(p) is consumer]
        self._requeue(mine)
        self.wake()

    def _requeue(self, positions: list[Position]) -> None:
        """Take ``positions`` from their consumers and redeliver the PENDING ones.

        A PENDING_ACK message stays locked (its transaction's abort
        redelivers it); a DELETED one is done.
        """
        for pos in positions:
            del self.pending[pos]
            if self.state(pos) is not PENDING:
                continue
            self._redelivering().add(pos)
            self.redelivery_counts[pos] = self.redelivery_counts.get(pos, 0) + 1

    def _redelivering(self) -> SortedSet:
        """The redelivery set, to add to (made on first use)."""
        if self.redeliver is _NO_REDELIVERIES:
            self.redeliver = SortedSet()
        return self.redeliver

    # -- acknowledgements ---------------------------------------------------------

    async def ack(
        self,
        positions: list[Position],
        cumulative: bool,
        txn: TxnID | None = None,
        early: bool = False,
    ) -> None:
        """Acknowledge durably, then apply (persist, then act).

        ``early`` (inside a transaction only): return once the record is
        queued, before it is durable, when no ack record in flight can change
        the messages it names: it is then applied to exactly the state it was
        checked against, so it cannot turn out void. Only for a transaction
        that a crash aborts (see
        `tc.TransactionCoordinator.participants_answer_early`).

        Outside a transaction (``txn`` None) a PENDING message becomes
        DELETED; an ack of a PENDING_ACK message is dropped (PIP-31: it stays
        locked by its transaction). A cumulative ack deletes every message up
        to the highest position except the PENDING_ACK ones, which stay
        locked: mark-delete stops before the first of them.

        Inside a transaction the messages become PENDING_ACK; a cumulative
        ack names every message after mark-delete up to the position that is
        not DELETED. Re-sending an ack of messages this transaction already
        holds is a retry and writes nothing. Raises (`proto.refusals`):
        TRANSACTION_CONFLICT (nothing changed) if a message is DELETED or
        held by another transaction, INVALID_TXN_STATUS if ``txn`` has
        already ended here, NOT_ALLOWED for a cumulative ack on a shared
        subscription, INVALID_ARGUMENT for no positions or a malformed
        ``txn``. Positions must exist (the caller checks).
        """
        if not positions:
            raise refusals.InvalidArgument("an acknowledgement needs positions")
        uncommitted = [p for p in positions if p[0] < -1]
        if uncommitted:
            if cumulative or txn is not None:
                raise refusals.NotAllowed(
                    "a message read uncommitted (from the transaction buffer) takes only a "
                    "plain individual acknowledgement",
                )
            committed = [p for p in positions if p[0] >= -1]
            if committed:
                await asyncio.gather(self.ack(committed, False), self._ack_uncommitted(uncommitted))
            else:
                await self._ack_uncommitted(uncommitted)
            return
        if cumulative and self.sub_type is SubType.SHARED:
            raise refusals.NotAllowed(
                "cumulative acknowledgement is not allowed on a shared subscription"
            )
        if txn is None:
            if cumulative:
                record = AckRecord(CUMULATIVE, (max(positions),))
            else:
                record = AckRecord(INDIVIDUAL, tuple(positions))
        else:
            txn = self._check_txn(txn)
            if txn in self._ended:
                raise refusals.InvalidTxnStatus(
                    f"transaction {txn_text(txn)} has already ended on subscription "
                    f"{self.name!r} of {self.partition.name}",
                )
            count = self._count
            wanted = (
                self.cursor.expand_cumulative(max(positions), count) if cumulative else positions
            )
            try:
                locked = self.cursor.plan_txn_ack(wanted, txn)
            except AckConflict as exc:
                raise self._conflict(exc) from exc
            if not locked:
                return  # every message is durably held by this transaction already
            # Checked against the state it will be applied to, unless a
            # record in flight may change it first (then it is planned again).
            checked = self._unaffected_by_inflight(locked)
            record = AckRecord(TXN_ACK, tuple(locked), txn, checked)
            if early and checked:
                self._persist(record).add_done_callback(unawaited)
                return
        try:
            await self._persist(record)
        except AckConflict as exc:
            raise self._conflict(exc) from exc

    def _unaffected_by_inflight(self, positions: Sequence[Position]) -> bool:
        """Can no ack record in flight change the state of ``positions``
        (all PENDING as applied so far)? Then a record about them is applied
        to the state it was checked against. Plain and transactional acks
        change the messages they name (a cumulative one, all up to its
        bound); a transaction's commit or abort only the messages it holds,
        which are not PENDING or are named by its acks in flight."""
        if not self._inflight:
            return True
        first = min(positions)
        mine: set[Position] | None = None
        for record in self._inflight:
            if record.kind == SNAPSHOT:  # (a reset)
                return False
            if record.kind == CUMULATIVE:
                if max(record.positions) >= first:
                    return False
            elif record.kind in (INDIVIDUAL, TXN_ACK):
                if mine is None:
                    mine = set(positions)
                if not mine.isdisjoint(record.positions):
                    return False
        return True

    async def end_txn(self, txn: TxnID, commit: bool, durable: bool = True) -> None:
        """EndTxnOnSubscription: commit (DELETED) or abort (PENDING) ``txn``'s acks.

        Durable before it returns; with ``durable=False`` (see
        `buffer.TransactionBuffer.end`), queued: the acks change when the
        record is durable. A transaction with no acks here writes nothing;
        repeating the call is harmless (the TC retries it). From now on an
        ack in ``txn`` is refused (INVALID_TXN_STATUS).
        """
        outcome = self._queue_end(txn, commit)
        if outcome is None:
            return
        if durable:
            await outcome
        else:
            outcome.add_done_callback(unawaited)

    def end_txn_now(self, txn: TxnID, commit: bool) -> None:
        """`end_txn` with ``durable=False``, without a turn of the loop."""
        outcome = self._queue_end(txn, commit)
        if outcome is not None:
            outcome.add_done_callback(unawaited)

    def _queue_end(self, txn: TxnID, commit: bool) -> asyncio.Future[list[Position]] | None:
        """Refuse acks in ``txn`` from now on and queue its end record, if it
        has acks here (None if not: nothing to write)."""
        txn = self._check_txn(txn)
        self._remember_ended(txn)
        if txn not in self.cursor.txn_acks and not any(
            r.kind == TXN_ACK and r.txn == txn for r in self._inflight
        ):
            return None
        return self._persist(txn_end_record(txn, commit))

    def _check_txn(self, txn: object) -> TxnID:
        try:
            return check_txn_key(txn)
        except ValueError as exc:
            raise refusals.InvalidArgument(str(exc)) from exc

    def _remember_ended(self, txn: TxnID) -> None:
        self._ended[txn] = None
        self._ended.move_to_end(txn)
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _conflict(self, exc: AckConflict) -> refusals.TransactionConflict:
        return refusals.TransactionConflict(
            f"subscription {self.name!r} of {self.partition.name}: {exc}"
        )

    def _persist(self, record: AckRecord) -> asyncio.Future[list[Position]]:
        """Append ``record``, apply it once durable; the result is what
        changed.

        It raises what the append raised, or `AckConflict` if the record was
        refused when applied (it is void: it changed nothing).
        """
        outcome: asyncio.Future[list[Position]] = asyncio.get_running_loop().create_future()
        appended = self._ledger.append(record.encode(), meta=record.kind)
        self._inflight.append(record)
        appended.add_done_callback(functools.partial(self._on_durable, record, outcome))
        return outcome

    def _on_durable(
        self,
        record: AckRecord,
        outcome: asyncio.Future[list[Position]],
        appended: asyncio.Future[int],
    ) -> None:
        # Done callbacks run in append order: records are applied in ledger order.
        self._inflight.remove(record)
        if appended.cancelled():
            outcome.cancel()
            return
        error = appended.exception()
        if error is not None:
            if not outcome.done():
                outcome.set_exception(error)
            return
        if record.kind == TXN_ACK:
            faults.hit("subscriptions.after_pending_ack_write")
        elif record.kind in (TXN_COMMIT, TXN_ABORT):
            faults.hit("subscriptions.after_txn_end_write")
        try:
            changed = self._apply(record)
        except Exception as exc:
            if not isinstance(exc, InvalidAckTransition):
                log.exception("applying %r to %r failed", record, self)
            if not outcome.done():
                outcome.set_exception(exc)
            changed = None
        self._records_since_snapshot += 1
        if self._records_since_snapshot >= SNAPSHOT_EVERY:
            self._records_since_snapshot = 0
            self._write_snapshot()
        if changed is not None and not outcome.done():
            outcome.set_result(changed)

    def _apply(self, record: AckRecord) -> list[Position]:
        part = self.partition
        kind = record.kind
        cursor = self.cursor
        changed = cursor.apply(
            kind,
            record.positions,
            self._count,
            part.ledger.last_entry_id,
            record.txn,
            record.checked,
        )
        if kind == TXN_ABORT:
            # PENDING again: deliver them again. Those dispatch has not read
            # yet it delivers in turn.
            for pos in changed:
                if pos[0] < self.read_entry:
                    self._redelivering().add(pos)
                    self.redelivery_counts[pos] = self.redelivery_counts.get(pos, 0) + 1
            if changed:
                self.wake()
            return changed
        if kind == TXN_ACK:
            # Locked: no longer pending on a consumer, never redelivered.
            self._forget(changed, counts=False)
            return changed
        if kind == CUMULATIVE:
            md = cursor.mark_delete
            done = [p for p in self.pending if p <= md]
            done.extend(self.redeliver.irange(maximum=md))
            done.extend(changed)
        elif kind == INDIVIDUAL:
            done = [p for p in record.positions if cursor.state(p) is MsgState.DELETED]
        else:
            done = changed
        self._forget(done)
        return changed

    def _forget(self, positions: list[Position], counts: bool = True) -> None:
        """Drop ``positions`` from the pending, redelivery (and, with
        ``counts``, redelivery count) bookkeeping."""
        pending = self.pending
        # (A commit's messages left it when they were locked: one C-level
        # pass finds that, instead of a pop per message.)
        if not pending.keys().isdisjoint(positions):
            pop = pending.pop
            for pos in positions:
                pop(pos, None)
        if self.redeliver:  # (usually empty: no per-message call then)
            discard = self.redeliver.discard
            for pos in positions:
                discard(pos)
        if counts and self.redelivery_counts:
            drop = self.redelivery_counts.pop
            for pos in positions:
                drop(pos, None)

    def _write_snapshot(self) -> None:
        # The snapshot must include the ack records queued before it.
        state = self.cursor.copy()
        part = self.partition
        for record in self._inflight:
            if record.kind == SNAPSHOT and self._resetting is not None:
                state = self._resetting.copy()
                continue
            try:
                state.apply(
                    record.kind,
                    record.positions,
                    self._count,
                    part.ledger.last_entry_id,
                    record.txn,
                )
            except InvalidAckTransition:
                pass  # refused, as it will be when applied: it changes nothing
        _snapshot_then_trim(self._ledger, state.snapshot(), SNAPSHOT)

    # -- operators: reset, skip ----------------------------------------------------

    def check_no_txn_acks(self, what: str) -> None:
        """Raise `refusals.NotAllowed` if a transaction holds
        acknowledgements here (PENDING_ACK, or on their way)."""
        held = set(self.cursor.txn_acks)
        held.update(r.txn for r in self._inflight if r.kind == TXN_ACK and r.txn is not None)
        if held:
            raise refusals.NotAllowed(
                f"cannot {what} subscription {self.name!r} of {self.partition.name}: "
                f"transaction(s) {', '.join(txn_text(t) for t in sorted(held))} hold "
                "acknowledgements of it (PENDING_ACK); end or abort them first",
            )

    async def reset(self, mark_delete: Position) -> None:
        """Move the cursor (durably) so that every message after
        ``mark_delete`` is PENDING, delivered again in order from there, and
        every one at or before it DELETED; what consumers hold unacknowledged
        is forgotten (their late acks of it apply to the new cursor). A
        read_uncommitted subscription's reads of open transactions stay as
        they are. Refused (`refusals.NotAllowed`, nothing changed)
        while a transaction holds acknowledgements here."""
        self.check_no_txn_acks("reset")
        self._paused = True  # (dispatch stops while the cursor moves)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        try:
            while self._inflight:  # (records already queued apply to the old cursor)
                await self._ledger.wait_for(self._ledger.next_entry_id - 1)
                await asyncio.sleep(0)
            self.check_no_txn_acks("reset")
            cursor = Cursor(mark_delete)
            marker = AckRecord(SNAPSHOT)  # (in flight: later acks are planned again)
            self._resetting = cursor
            self._inflight.append(marker)
            outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def durable(appended: asyncio.Future[int]) -> None:
                # Applied in ledger order, before the records appended after it.
                self._inflight.remove(marker)
                self._resetting = None
                if appended.cancelled() or appended.exception() is not None:
                    if not outcome.done():
                        outcome.set_exception(appended.exception() or asyncio.CancelledError())
                    return
                self.cursor = cursor
                self.pending.clear()
                self.redeliver.clear()
                self.redelivery_counts.clear()
                self.read_entry = cursor.first_open_entry()
                self._records_since_snapshot = 0
                if not outcome.done():
                    outcome.set_result(None)

            self._ledger.append(cursor.snapshot(), meta=SNAPSHOT).add_done_callback(durable)
            await outcome
        finally:
            self.start()

    def pending_positions(self, limit: int) -> list[Position]:
        """The first ``limit`` PENDING messages after mark-delete (not
        acknowledged, not locked by a transaction), in order."""
        found: list[Position] = []
        bound = (self.partition.ledger.last_entry_id, WHOLE_ENTRY)
        for pos in self.cursor.messages_through(bound, self._count):
            if len(found) >= limit:
                break
            if self.cursor.state(pos) is PENDING:
                found.append(pos)
        return found

    async def skip(self, limit: int) -> int:
        """Acknowledge the first ``limit`` PENDING messages (durably); how many there were."""
        positions = self.pending_positions(limit)
        if positions:
            await self.ack(positions, cumulative=False)
        return len(positions)

    async def delete(self) -> None:
        await self.close()
        await self._ledger.store.delete_ledger(self._ledger.name)
        if self._uledger is not None:
            await self._uledger.store.delete_ledger(self._uledger.name)

    # -- read_uncommitted -------------------------------------------------------------

    def state(self, pos: Position) -> MsgState:
        """The state of a message, committed or (entry id below -1) read uncommitted."""
        if pos[0] < -1:
            if self.uncommitted is None:
                return MsgState.DELETED  # no such message here
            return self.uncommitted.state(from_wire(pos))
        return self.cursor.state(pos)

    def first_unknown(self, positions: list[Position]) -> Position | None:
        """The first of ``positions`` (at least one) with no message here
        (`knows`), or None. Positions all in one stored entry (an ack of a
        batch: the usual case) are checked by their lowest and highest."""
        low, high = min(positions), max(positions)
        if low[0] == high[0] and low[0] >= 0 and low[1] >= 0 and self.partition.exists(high):
            return None  # (an entry's messages are its indexes 0 .. count - 1)
        for pos in positions:
            if not self.knows(pos):
                return pos
        return None

    def knows(self, pos: Position) -> bool:
        """Is there a message at ``pos`` here (for an ack to name)?"""
        if pos[0] >= -1:
            return self.partition.exists(pos)
        if self.uncommitted is None:
            return False
        sidecar_pos = from_wire(pos)
        return (
            pos in self.pending
            or pos in self.redeliver
            or self.uncommitted.state(sidecar_pos) is MsgState.DELETED
        )

    def uncommitted_floor(self) -> int | None:
        """The first sidecar entry this subscription still needs (None: not read_uncommitted)."""
        return None if self.uncommitted is None else self.uncommitted.mark_delete + 1

    async def _ack_uncommitted(self, positions: list[Position]) -> None:
        """Acknowledge messages read uncommitted, durably (persist, then act)."""
        assert self.uncommitted is not None and self._uledger is not None
        sidecar = [from_wire(p) for p in positions]
        appended = self._uledger.append(encode_record(sidecar), meta=UNCOMMITTED_ACK)
        outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def durable(f: asyncio.Future[int]) -> None:
            if f.cancelled() or f.exception() is not None:
                if not outcome.done():
                    outcome.set_exception(f.exception() or asyncio.CancelledError())
                return
            assert self.uncommitted is not None
            self.uncommitted.ack(sidecar)
            self._forget(positions)
            self._uncommitted_since_snapshot += 1
            if self._uncommitted_since_snapshot >= SNAPSHOT_EVERY:
                self._uncommitted_since_snapshot = 0
                self._write_uncommitted_snapshot()
            if not outcome.done():
                outcome.set_result(None)

        appended.add_done_callback(durable)
        await outcome

    def _write_uncommitted_snapshot(self) -> None:
        assert self.uncommitted is not None and self._uledger is not None
        _snapshot_then_trim(self._uledger, self.uncommitted.snapshot(), U_SNAPSHOT)

    async def _dispatch_uncommitted(self) -> bool:
        """Deliver the next sidecar records (read_uncommitted); False if none."""
        buffer, ucursor = self._buffer, self.uncommitted
        if buffer is None or ucursor is None:
            return False
        sidecar = buffer.sidecar
        if self.read_sidecar < sidecar.first_entry_id:  # reclaimed by a sweep
            ucursor.skip_to(sidecar.first_entry_id - 1)
            self.read_sidecar = sidecar.first_entry_id
        if self.read_sidecar > sidecar.last_entry_id:
            return False
        entries = await sidecar.read(self.read_sidecar, self.read_sidecar + READ_BATCH - 1)
        if self.redeliver:
            return True  # a consumer left meanwhile: its messages first
        out = _Out()
        for entry in entries:
            if entry.entry_id < self.read_sidecar:
                continue  # a concurrent step already sent it
            batch = buffer.uncommitted_batch(entry)
            n = entry_count(entry.meta) if batch is not None else 0
            ucursor.note(entry.entry_id, n)
            if batch is not None:
                indexes = [
                    i for i in range(n) if ucursor.state((entry.entry_id, i)) is MsgState.PENDING
                ]
                if indexes:
                    consumer = self._pick()
                    if consumer is None:
                        break
                    wire = Entry(to_wire((entry.entry_id, 0))[0], entry.meta, batch)
                    self._deliver(consumer, out, wire, [] if len(indexes) == n else indexes, n, 0)
            self.read_sidecar = entry.entry_id + 1
        out.flush()
        return bool(entries)

    # -- stats ----------------------------------------------------------------------

    def backlog(self) -> int:
        """Messages not DELETED yet (PENDING and PENDING_ACK ones)."""
        return max(
            0, self.partition.messages_after(self.cursor.mark_delete) - len(self.cursor.acked)
        )

    # -- dispatch -------------------------------------------------------------------

    def _pick(self) -> Consumer | None:
        """The consumer for the next entry, or None if nobody may take one now."""
        if not self.consumers:
            return None
        if self.sub_type is SubType.SHARED:
            n = len(self.consumers)
            for i in range(n):
                c = self.consumers[(self._rr + i) % n]
                if c.permits > 0:
                    self._rr = (self._rr + i + 1) % n
                    return c
            return None
        active = self._active
        return active if active is not None and active.permits > 0 else None

    async def _dispatch_loop(self) -> None:
        """The dispatch task: runs while there are consumers (see `wake`)."""
        try:
            while not self._closed and self.consumers:
                if not self._woken:
                    self._waiter = asyncio.get_running_loop().create_future()
                    try:
                        await self._waiter
                    finally:
                        self._waiter = None
                    continue
                self._woken = False
                try:
                    while await self._dispatch_step():
                        pass
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("dispatch failed on %r; retrying", self)
                    await asyncio.sleep(0.5)
                    self._woken = True
        finally:
            if self._task is asyncio.current_task():
                self._task = None

    async def _dispatch_step(self) -> bool:
        """Deliver one batch of entries; False when nothing more can go now."""
        if self._pick() is None:
            return False
        if self.redeliver:
            return await self._dispatch_redeliveries()
        moved = False
        if self.uncommitted is not None:
            moved = await self._dispatch_uncommitted()
            if self.redeliver or self._pick() is None:
                return moved
        return await self._dispatch_partition() or moved

    async def _dispatch_partition(self) -> bool:
        part = self.partition
        ledger = part.ledger
        self.read_entry = max(self.read_entry, ledger.first_entry_id)
        if self.read_entry > ledger.last_entry_id:
            return False
        entries = await ledger.read(self.read_entry, self.read_entry + READ_BATCH - 1)
        if self.redeliver:
            # While we read, a consumer left (or an abort landed): its
            # messages go first, before anything newer.
            return True
        out = _Out()
        cursor = self.cursor
        for entry in entries:
            if entry.entry_id < self.read_entry:
                continue  # a concurrent step already sent it
            n = entry_count(entry.meta)
            if n > 0 and self.uncommitted is not None and entry_kind(entry.meta) != DATA:
                n = 0  # a commit marker: read uncommitted, its messages went already
            if n > 0:
                if self._pick() is None:
                    break
                if entry_kind(entry.meta) != DATA:
                    # Resolve a commit marker into its messages (one dispatch
                    # task per subscription: nothing else moves read_entry).
                    entry = Entry(entry.entry_id, entry.meta, await part.materialize(entry))
                    if self.redeliver:
                        # While we waited, a consumer left (or an abort landed):
                        # its messages go first, before anything newer.
                        break
                if cursor.all_pending(entry.entry_id):
                    indexes: list[int] = []  # all of them
                else:
                    indexes = [i for i in range(n) if cursor.state((entry.entry_id, i)) is PENDING]
                    if not indexes:
                        self.read_entry = entry.entry_id + 1
                        continue
                consumer = self._pick()
                if consumer is None:
                    break
                self._deliver(consumer, out, entry, indexes, n, 0)
            self.read_entry = entry.entry_id + 1
        out.flush()
        return bool(entries)

    async def _dispatch_redeliveries(self) -> bool:
        """Redeliver the lowest positions of the redelivery set, in order.

        Two phases. Fetch (awaits): read, and materialize, the entries of
        the positions the consumers' permits cover. Deliver (no awaits):
        walk the redelivery set *as it is now* from its lowest position and
        send what was fetched, stopping at the first position not fetched.
        While the fetch awaited, a consumer may have left or an abort landed,
        putting lower positions in the set; they must still go first (a
        consumer must never get a newer message before an older one that is
        due again: Jepsen's nonmonotonic-poll).
        """
        wanted: list[int] = []
        budget = sum(max(c.permits, 0) for c in self.consumers)
        for entry_id, _index in self.redeliver:
            if not wanted or wanted[-1] != entry_id:
                if budget <= 0:
                    break
                wanted.append(entry_id)
            budget -= 1
        fetched = await self._fetch(wanted)
        out = _Out()
        delivered = False
        while self.redeliver:
            entry_id = self.redeliver[0][0]
            if entry_id not in fetched:
                break
            entry = fetched.pop(entry_id)
            indexes = [i for e, i in self.redeliver.irange((entry_id, 0), (entry_id, WHOLE_ENTRY))]
            still = self._still_to_redeliver(entry_id, indexes)
            if entry is None:  # trimmed: those messages were all acknowledged
                for i in still:
                    self.redeliver.discard((entry_id, i))
                delivered = True
                continue
            if not still:
                continue
            consumer = self._pick()
            if consumer is None:
                break
            count = max(self.redelivery_counts.get((entry_id, i), 0) for i in still)
            for i in still:
                self.redeliver.discard((entry_id, i))
            self._deliver(consumer, out, entry, still, entry_count(entry.meta), count)
            delivered = True
        out.flush()
        # Go on if something went out, or if lower positions came in meanwhile.
        return delivered or bool(self.redeliver and self.redeliver[0][0] not in wanted)

    async def _fetch(self, entry_ids: list[int]) -> dict[int, Entry | None]:
        """The entries ``entry_ids`` (wire ids, sorted) ready to deliver:
        markers materialized, sidecar records (ids below -1) as their batch;
        None for one that is gone (trimmed or swept)."""
        part = self.partition
        fetched: dict[int, Entry | None] = dict.fromkeys(entry_ids)
        committed = [e for e in entry_ids if e >= -1]
        for entry in (await read_runs(part.ledger, committed, READ_BATCH)).values():
            if entry_kind(entry.meta) != DATA:
                entry = Entry(entry.entry_id, entry.meta, await part.materialize(entry))
            fetched[entry.entry_id] = entry
        buffer = self._buffer
        sidecar_ids = sorted(from_wire((e, 0))[0] for e in entry_ids if e < -1)
        if buffer is not None and sidecar_ids:
            for entry in (await read_runs(buffer.sidecar, sidecar_ids, READ_BATCH)).values():
                batch = buffer.uncommitted_batch(entry)
                if batch is not None:
                    wire_id = to_wire((entry.entry_id, 0))[0]
                    fetched[wire_id] = Entry(wire_id, entry.meta, batch)
        return fetched

    def _still_to_redeliver(self, entry_id: int, indexes: list[int]) -> list[int]:
        """Those of ``indexes`` still to redeliver now: in the set and PENDING.

        Acks discard from the redelivery set, and only PENDING messages enter
        it; the state check keeps a DELETED or PENDING_ACK message from ever
        going out even if one got in.
        """
        still = []
        for i in indexes:
            pos = (entry_id, i)
            if pos in self.redeliver:
                if self.state(pos) is PENDING:
                    still.append(i)
                else:
                    self.redeliver.discard(pos)
        return still

    def _deliver(
        self,
        consumer: Consumer,
        out: _Out,
        entry: Entry,
        indexes: list[int],
        n: int,
        redelivery_count: int,
    ) -> None:
        entry_id = entry.entry_id
        delivered = indexes if indexes else range(n)
        # (entry_id, i) -> consumer for each i, without a Python loop.
        self.pending.update(zip(zip(repeat(entry_id), delivered), repeat(consumer)))
        consumer.permits -= len(delivered)
        self.messages_out += len(delivered)
        self.bytes_out += len(entry.data)
        if redelivery_count:
            self.redelivered += len(delivered)
        out.add(
            consumer,
            pb.DeliveredEntry(
                partition=self.partition.index,
                entry_id=entry_id,
                data=entry.data,
                indexes=indexes,
                redelivery_count=redelivery_count,
            ),
        )


class _NoRedeliveries(SortedSet):  # type: ignore[misc]
    """The redelivery set of every subscription that has nothing to
    redeliver yet: shared, so it refuses additions (`_redelivering` gives a
    subscription its own set first); removing from it and clearing it change
    nothing."""

    def add(self, value: object) -> None:
        raise TypeError("the shared empty redelivery set takes no positions")

    def update(self, *iterables: object) -> SortedSet:
        raise TypeError("the shared empty redelivery set takes no positions")


_NO_REDELIVERIES = _NoRedeliveries()


class _Out:
    """Entries to push, per consumer, sent in frames of about FRAME_BYTES."""

    def __init__(self) -> None:
        self._batches: dict[Consumer, list[pb.DeliveredEntry]] = {}
        self._bytes: dict[Consumer, int] = {}

    def add(self, consumer: Consumer, delivered: pb.DeliveredEntry) -> None:
        self._batches.setdefault(consumer, []).append(delivered)
        size = self._bytes[consumer] = self._bytes.get(consumer, 0) + len(delivered.data)
        if size >= FRAME_BYTES:
            consumer.push(consumer, self._batches.pop(consumer))
            del self._bytes[consumer]

    def flush(self) -> None:
        for consumer, batch in self._batches.items():
            consumer.push(consumer, batch)
        self._batches.clear()
        self._bytes.clear()


def _count_without_markers(partition: Partition) -> Callable[[int], int]:
    """Entry sizes as a read_uncommitted cursor sees them: commit markers hold
    nothing (their messages were read from the transaction buffer)."""

    def count(entry_id: int) -> int:
        return 0 if partition.is_marker(entry_id) else partition.count(entry_id)

    return count


def _snapshot_then_trim(ledger: Ledger, snapshot: bytes, meta: int) -> None:
    """Append ``snapshot``; once it is durable, trim every record before it."""
    fut = ledger.append(snapshot, meta=meta)

    def trim(_f: object) -> None:
        if not fut.cancelled() and fut.exception() is None:
            ledger.trim(fut.result())

    fut.add_done_callback(trim)


async def _load_uncommitted(ledger: Ledger) -> UncommittedCursor:
    """Rebuild what a read_uncommitted subscription acked of the sidecar."""
    cursor = UncommittedCursor()
    for entry in await ledger.read(ledger.first_entry_id, ledger.last_entry_id):
        if entry.meta == U_SNAPSHOT:
            cursor = UncommittedCursor.from_snapshot(entry.data)
        elif entry.meta == UNCOMMITTED_ACK:
            cursor.ack(decode_record(entry.data))
        else:
            raise RuntimeError(f"{ledger.name}, entry {entry.entry_id}: unknown kind {entry.meta}")
    return cursor
