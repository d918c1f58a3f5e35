"""Dispatch: a subscription's consumers on one partition, and what goes to them.

One task per subscription while it has consumers (`Dispatcher.wake` starts
it; it ends with the last consumer) pushes entries within the consumers'
flow-control permits: first the messages to redeliver (nacked, unacked by a
consumer that left, or released by an aborted transaction), then new entries
from the read position. A whole entry goes to one consumer (its permits may
go below zero, as in Pulsar); its messages are *pending* on that consumer
until acked, and redelivered if it leaves. Types: exclusive (one consumer),
failover (one active per partition: ``sorted consumers[partition % n]``),
shared (round robin over the consumers with permits).

Dispatch reads the cursor and writes nothing: only PENDING messages go out,
and a PENDING_ACK one that a consumer gives back stays locked instead of
being redelivered. `Dispatcher.applied` follows each record the cursor
applies. A read_uncommitted subscription also delivers the messages of the
transaction buffer as soon as they are there, whatever becomes of their
transaction, and skips commit markers (`subscriptions._uncommitted`); no
order is promised between those and the partition's own messages.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from typing import Protocol

from sortedcontainers import SortedSet

from buffer import COMMIT_MARKER, Partition, Position, TransactionBuffer, entry_count, entry_kind
from ledger import Entry, Ledger, read_runs
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions._cursor import (
    CUMULATIVE,
    INDIVIDUAL,
    SNAPSHOT,
    TXN_ABORT,
    TXN_ACK,
    TXN_ACKED,
    WHOLE_ENTRY,
    AckRecord,
    Cursor,
)
from subscriptions._ranges import DeliveredMap
from subscriptions._state import MsgState
from subscriptions._uncommitted import UncommittedCursor, from_wire, to_wire

__all__ = ["Attachment", "Consumer", "Dispatcher", "SubType"]

log = logging.getLogger(__name__)

PENDING = MsgState.PENDING
READ_BATCH = 64  # entries read per dispatch step
FRAME_BYTES = 1 << 20  # push at most about this much in one frame


class SubType(enum.Enum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    FAILOVER = "failover"


class Attachment(Protocol):
    """A partition subscription a consumer is attached to, as the consumer
    sees it (`subscriptions._subscription.PartitionSubscription`, which
    imports this module: `subscriptions._subscription.attached` gives the
    list back with its own type)."""

    def wake(self) -> None:
        """Permits came: deliver what is waiting."""


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
    subscriptions: list[Attachment] = field(default_factory=list)
    order: int = 0  # connect order, breaks ties between equal names
    read_uncommitted: bool = False  # wants a read_uncommitted subscription

    def add_permits(self, n: int) -> None:
        self.permits += n
        for sub in self.subscriptions:
            sub.wake()


class Dispatcher:
    """The consumers of subscription ``name`` on ``partition``, reading
    ``cursor`` (and, read_uncommitted, ``uncommitted``)."""

    def __init__(
        self,
        partition: Partition,
        name: str,
        cursor: Cursor,
        uncommitted: UncommittedCursor | None,
    ) -> None:
        self.partition = partition
        self.name = name
        self.cursor = cursor
        self.uncommitted = uncommitted
        self.consumers: list[Consumer] = []
        # Delivered and not acknowledged, by position (ranges: an entry goes
        # to one consumer whole).
        self.pending: DeliveredMap[Consumer] = DeliveredMap()
        # Shared and empty until something is to be redelivered: most
        # subscriptions never need a set of their own.
        self.redeliver: SortedSet = _NO_REDELIVERIES
        self.redelivery_counts: dict[Position, int] = {}
        # Delivered to consumers since start (redelivered ones too), for stats.
        self.messages_out = 0
        self.bytes_out = 0
        self.redelivered = 0
        self.read_entry = cursor.first_open_entry()
        self.read_sidecar = uncommitted.mark_delete + 1 if uncommitted else 0
        self._buffer: TransactionBuffer | None = None
        self._active: Consumer | None = None
        self._rr = 0
        # The task: woken since it last looked, the future it sleeps on, and
        # held by a `pause` (no task starts meanwhile).
        self._woken = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        partition.ledger.add_listener(self._on_entries)
        if uncommitted is not None:
            partition.watch_txn_buffer(self._on_buffer)

    def __repr__(self) -> str:
        return f"Dispatcher({self.partition.name!r}, {self.name!r})"

    # -- lifecycle ----------------------------------------------------------------

    @property
    def idle(self) -> bool:
        """No consumer and no task: nothing delivered and unacknowledged."""
        return not self.consumers and self._task is None

    def start(self) -> None:
        """Let dispatch run (after a `pause`), and look for work."""
        self._paused = False
        self.wake()

    async def pause(self) -> None:
        """Stop the task, and start none until `start`."""
        self._paused = True
        task, self._task = self._task, None
        if task is not None:
            await _cancelled(task)

    async def close(self) -> None:
        self.detach()
        if self._task is not None:
            await _cancelled(self._task)

    def detach(self) -> None:
        """Stop following the partition; dispatch ends."""
        self._closed = True
        self.partition.ledger.remove_listener(self._on_entries)
        self.partition.unwatch_txn_buffer(self._on_buffer)
        if self._buffer is not None:
            self._buffer.sidecar.remove_listener(self._on_entries)
        self.wake()

    def wake(self) -> None:
        """Dispatch what can go now: wake the task, or start one if there
        are consumers."""
        self._woken = True
        waiter = self._waiter
        if waiter is not None:
            if not waiter.done():
                waiter.set_result(None)
        elif self._task is None and self.consumers and not (self._closed or self._paused):
            self._task = asyncio.get_running_loop().create_task(self._loop())

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
        if consumer.read_uncommitted != (self.uncommitted is not None):
            have = "read_uncommitted" if self.uncommitted is not None else "read committed"
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
        self._update_active()
        self.wake()

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; its unacknowledged messages go to redelivery."""
        if consumer not in self.consumers:
            return
        self.consumers.remove(consumer)
        self._requeue(self.pending.of(consumer))
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
            mine = self.pending.of(consumer)
        else:
            mine = [p for p in positions if self.pending.get(p) is consumer]
        self._requeue(mine)
        self.wake()

    def _requeue(self, positions: list[Position]) -> None:
        """Take ``positions`` from their consumers and redeliver the PENDING ones.

        A PENDING_ACK message stays locked (its transaction's abort
        redelivers it); a DELETED one is done.
        """
        self.pending.forget(positions)
        self._redeliver_later([p for p in positions if self.state(p) is PENDING])

    def _redeliver_later(self, positions: list[Position]) -> None:
        if not positions:
            return
        if self.redeliver is _NO_REDELIVERIES:
            self.redeliver = SortedSet()
        counts = self.redelivery_counts
        for pos in positions:
            self.redeliver.add(pos)
            counts[pos] = counts.get(pos, 0) + 1

    def state(self, pos: Position) -> MsgState:
        """The state of a message, committed or (entry id below -1) read uncommitted."""
        if pos[0] < -1:
            if self.uncommitted is None:
                return MsgState.DELETED  # no such message here
            return self.uncommitted.state(from_wire(pos))
        return self.cursor.state(pos)

    # -- following the cursor -----------------------------------------------------

    def applied(self, record: AckRecord, changed: list[Position]) -> None:
        """The cursor applied ``record``, changing ``changed``.

        What became DELETED or PENDING_ACK is no longer pending on a consumer
        nor to be redelivered; what an abort made PENDING again is
        redelivered (what dispatch has not read yet it delivers in turn); a
        reset (SNAPSHOT) forgets everything and reads on from the new cursor.
        """
        kind = record.kind
        if kind == TXN_ACKED and not self.redeliver and not self.redelivery_counts:
            for entry_id, first, last in record.ranges:  # (the usual case: by range)
                self.pending.discard_range(entry_id, first, last)
        elif kind == TXN_ACK:
            self.forget(changed, counts=False)  # locked: never redelivered
        elif kind == TXN_ABORT:
            self._redeliver_later([p for p in changed if p[0] < self.read_entry])
            if changed:
                self.wake()
        elif kind == CUMULATIVE:
            md = self.cursor.mark_delete
            done = self.pending.through(md)
            done.extend(self.redeliver.irange(maximum=md))
            done.extend(changed)
            self.forget(done)
        elif kind == INDIVIDUAL:
            state = self.cursor.state
            self.forget([p for p in record.positions if state(p) is MsgState.DELETED])
        elif kind == SNAPSHOT:
            self.pending.clear()
            self.redeliver.clear()
            self.redelivery_counts.clear()
            self.read_entry = self.cursor.first_open_entry()
        else:
            self.forget(changed)

    def forget(self, positions: list[Position], counts: bool = True) -> None:
        """Drop ``positions`` from the pending, redelivery (and, with
        ``counts``, redelivery count) bookkeeping."""
        self.pending.forget(positions)
        if self.redeliver:  # (usually empty: no per-message call then)
            discard = self.redeliver.discard
            for pos in positions:
                discard(pos)
        if counts and self.redelivery_counts:
            deque(map(self.redelivery_counts.pop, positions, repeat(None)), 0)

    # -- the task -----------------------------------------------------------------

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

    async def _loop(self) -> None:
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
                    while await self._step():
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

    async def _step(self) -> bool:
        """Deliver one batch of entries; False when nothing more can go now."""
        if self._pick() is None:
            return False
        if self.redeliver:
            return await self._step_redeliveries()
        moved = False
        if self.uncommitted is not None:
            moved = await self._step_uncommitted()
            if self.redeliver or self._pick() is None:
                return moved
        return await self._step_partition() or moved

    async def _step_partition(self) -> bool:
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
            marker = entry_kind(entry.meta) == COMMIT_MARKER
            if n > 0 and marker and self.uncommitted is not None:
                n = 0  # a commit marker: read uncommitted, its messages went already
            if n > 0:
                if self._pick() is None:
                    break
                if marker:
                    # Resolve a commit marker into its messages (one task per
                    # subscription: nothing else moves read_entry).
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

    async def _step_uncommitted(self) -> bool:
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

    async def _step_redeliveries(self) -> bool:
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
            if entry_kind(entry.meta) == COMMIT_MARKER:
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
        if indexes:
            self.pending.deliver(entry_id, indexes, consumer)
        else:
            self.pending.deliver_range(entry_id, 0, n - 1, consumer)
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
    """The redelivery set of every dispatcher that has nothing to redeliver
    yet: shared, so it refuses additions (`Dispatcher._redeliver_later`
    gives a dispatcher its own set first); removing from it and clearing it
    change nothing."""

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


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait until it has stopped."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
