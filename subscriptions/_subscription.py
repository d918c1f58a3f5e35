"""A subscription on one partition: durable cursor, consumers and dispatch.

Dispatch: one task per subscription pushes entries to consumers within their
flow-control permits: first messages to redeliver (nacked, or unacked by a
consumer that left), then new entries from the read position. A whole entry
goes to one consumer (its permits may go below zero, as in Pulsar). Every
delivered message is *pending* on its consumer until acked; when the
consumer closes or disconnects its pending messages are redelivered.

Types: exclusive (one consumer), failover (many, one active per partition:
``sorted consumers[partition % n]``), shared (round robin over consumers
with permits).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from sortedcontainers import SortedSet

from buffer import DATA, Partition, Position, entry_count, entry_kind
from ledger import Entry, Ledger
from proto import txnbuf_pb2 as pb
from subscriptions._cursor import (
    CUMULATIVE,
    INDIVIDUAL,
    SNAPSHOT,
    WHOLE_ENTRY,
    Cursor,
    decode_record,
    encode_record,
)
from subscriptions._state import MsgState

__all__ = ["Consumer", "PartitionSubscription", "SubType", "SubscriptionError"]

log = logging.getLogger(__name__)

PENDING = MsgState.PENDING
SNAPSHOT_EVERY = 1000  # ack records between cursor snapshots
READ_BATCH = 64  # entries read per dispatch step
FRAME_BYTES = 1 << 20  # push at most about this much in one frame


class SubType(enum.Enum):
    EXCLUSIVE = "exclusive"
    SHARED = "shared"
    FAILOVER = "failover"


class SubscriptionError(Exception):
    """A request this subscription refuses; ``code`` is the wire error name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


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

    def add_permits(self, n: int) -> None:
        self.permits += n
        for sub in self.subscriptions:
            sub.wake()


class PartitionSubscription:
    """Create with `PartitionSubscription.load`."""

    def __init__(
        self, partition: Partition, name: str, cursor_ledger: Ledger, cursor: Cursor
    ) -> None:
        self.partition = partition
        self.name = name
        self.cursor = cursor
        self._ledger = cursor_ledger
        self.consumers: list[Consumer] = []
        self.pending: dict[Position, Consumer] = {}
        self.redeliver: SortedSet = SortedSet()
        self.redelivery_counts: dict[Position, int] = {}
        self.read_entry = cursor.first_open_entry()
        self._active: Consumer | None = None
        self._rr = 0
        self._records_since_snapshot = 0
        self._inflight: list[tuple[int, list[Position]]] = []  # ack records not yet durable
        self._wake = asyncio.Event()
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        partition.ledger.add_listener(self._on_entries)

    def __repr__(self) -> str:
        return f"PartitionSubscription({self.partition.name!r}, {self.name!r})"

    @staticmethod
    def ledger_name(topic: str, index: int, name: str) -> str:
        return f"c/{topic}/{index}/{name}"

    @classmethod
    async def create(cls, partition: Partition, name: str, earliest: bool) -> PartitionSubscription:
        """A new subscription at the earliest or latest position (durably)."""
        ledger = await partition.ledger.store.open_ledger(
            cls.ledger_name(partition.topic, partition.index, name)
        )
        if earliest:
            cursor = Cursor((partition.ledger.first_entry_id - 1, WHOLE_ENTRY))
        else:
            cursor = Cursor((partition.ledger.last_entry_id, WHOLE_ENTRY))
        await ledger.append(cursor.snapshot(), meta=SNAPSHOT)
        return cls(partition, name, ledger, cursor)

    @classmethod
    async def load(cls, partition: Partition, name: str, ledger: Ledger) -> PartitionSubscription:
        """Rebuild a subscription from its cursor ledger: snapshot, then records."""
        entries = await ledger.read(ledger.first_entry_id, ledger.last_entry_id)
        if not entries or entries[0].meta != SNAPSHOT:
            raise RuntimeError(f"cursor ledger {ledger.name} does not start with a snapshot")
        cursor = Cursor.from_snapshot(entries[0].data)
        last = partition.ledger.last_entry_id
        for entry in entries[1:]:
            if entry.meta == SNAPSHOT:
                cursor = Cursor.from_snapshot(entry.data)
            else:
                cursor.apply(entry.meta, decode_record(entry.data), partition.count, last)
        sub = cls(partition, name, ledger, cursor)
        sub._records_since_snapshot = len(entries) - 1
        return sub

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._dispatch_loop())

    async def close(self) -> None:
        self._closed = True
        self.partition.ledger.remove_listener(self._on_entries)
        self._wake.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    def wake(self) -> None:
        self._wake.set()

    def _on_entries(self, _ledger: Ledger, _entries: list[Entry]) -> None:
        if self.consumers:
            self._wake.set()

    # -- consumers ----------------------------------------------------------------

    @property
    def sub_type(self) -> SubType | None:
        return self.consumers[0].sub_type if self.consumers else None

    def check_can_add(self, consumer: Consumer) -> None:
        """Raise `SubscriptionError` if ``consumer`` may not join (changes nothing)."""
        current = self.sub_type
        if current is None:
            return
        if current is not consumer.sub_type:
            raise SubscriptionError(
                "SUBSCRIPTION_TYPE_MISMATCH",
                f"subscription {self.name!r} is {current.value} while it has consumers; "
                f"cannot attach a {consumer.sub_type.value} consumer",
            )
        if current is SubType.EXCLUSIVE:
            raise SubscriptionError(
                "CONSUMER_BUSY", f"exclusive subscription {self.name!r} already has a consumer"
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
        for pos in positions:
            del self.pending[pos]
            self.redeliver.add(pos)
            self.redelivery_counts[pos] = self.redelivery_counts.get(pos, 0) + 1

    # -- acknowledgements ---------------------------------------------------------

    async def ack(self, positions: list[Position], cumulative: bool) -> None:
        """Acknowledge durably, then apply (persist, then act).

        Raises `SubscriptionError` NOT_ALLOWED for a cumulative ack on a
        shared subscription. Positions must exist (the caller checks).
        """
        if cumulative and self.sub_type is SubType.SHARED:
            raise SubscriptionError(
                "NOT_ALLOWED", "cumulative acknowledgement is not allowed on a shared subscription"
            )
        kind = CUMULATIVE if cumulative else INDIVIDUAL
        if cumulative:
            positions = [max(positions)]
        record = (kind, positions)
        self._inflight.append(record)
        try:
            await self._ledger.append(encode_record(positions), meta=kind)
        finally:
            self._inflight.remove(record)
        self._apply(kind, positions)
        self._records_since_snapshot += 1
        if self._records_since_snapshot >= SNAPSHOT_EVERY:
            self._records_since_snapshot = 0
            self._write_snapshot()

    def _apply(self, kind: int, positions: list[Position]) -> None:
        part = self.partition
        self.cursor.apply(kind, positions, part.count, part.ledger.last_entry_id)
        if kind == CUMULATIVE:
            md = self.cursor.mark_delete
            done = [p for p in self.pending if p <= md]
            done.extend(self.redeliver.irange(maximum=md))
        else:
            done = positions
        for pos in done:
            self.pending.pop(pos, None)
            self.redeliver.discard(pos)
            self.redelivery_counts.pop(pos, None)

    def _write_snapshot(self) -> None:
        # The snapshot must include the ack records queued before it.
        state = self.cursor.copy()
        part = self.partition
        for kind, positions in self._inflight:
            state.apply(kind, positions, part.count, part.ledger.last_entry_id)
        fut = self._ledger.append(state.snapshot(), meta=SNAPSHOT)

        def trim(_f: object) -> None:
            if not fut.cancelled() and fut.exception() is None:
                self._ledger.trim(fut.result())

        fut.add_done_callback(trim)

    async def delete(self) -> None:
        await self.close()
        await self._ledger.store.delete_ledger(self._ledger.name)

    # -- stats ----------------------------------------------------------------------

    def backlog(self) -> int:
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
        while not self._closed:
            await self._wake.wait()
            self._wake.clear()
            try:
                while await self._dispatch_step():
                    pass
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("dispatch failed on %r; retrying", self)
                await asyncio.sleep(0.5)
                self._wake.set()

    async def _dispatch_step(self) -> bool:
        """Deliver one batch of entries; False when nothing more can go now."""
        if self._pick() is None:
            return False
        if self.redeliver:
            return await self._dispatch_redeliveries()
        part = self.partition
        ledger = part.ledger
        self.read_entry = max(self.read_entry, ledger.first_entry_id)
        if self.read_entry > ledger.last_entry_id:
            return False
        entries = await ledger.read(self.read_entry, self.read_entry + READ_BATCH - 1)
        out = _Out()
        cursor = self.cursor
        for entry in entries:
            if entry.entry_id < self.read_entry:
                continue  # a concurrent step already sent it
            n = entry_count(entry.meta)
            if n > 0:
                if self._pick() is None:
                    break
                if entry_kind(entry.meta) != DATA:
                    # Resolve a commit marker into its messages (one dispatch
                    # task per subscription: nothing else moves read_entry).
                    entry = Entry(entry.entry_id, entry.meta, await part.materialize(entry))
                if entry.entry_id > cursor.mark_delete[0] and not self._acked_in(entry.entry_id):
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

    def _acked_in(self, entry_id: int) -> bool:
        acked = self.cursor.acked
        i: int = acked.bisect_left((entry_id, 0))
        return i < len(acked) and bool(acked[i][0] == entry_id)

    async def _dispatch_redeliveries(self) -> bool:
        by_entry: dict[int, list[int]] = {}
        budget = sum(max(c.permits, 0) for c in self.consumers)
        for entry_id, index in self.redeliver:
            if budget <= 0 and entry_id not in by_entry:
                break
            by_entry.setdefault(entry_id, []).append(index)
            budget -= 1
        ledger = self.partition.ledger
        out = _Out()
        for entry_id, indexes in by_entry.items():
            entries = await ledger.read(entry_id, entry_id)
            still = [i for i in indexes if (entry_id, i) in self.redeliver]
            if not entries:  # trimmed: those messages were all acknowledged
                for i in still:
                    self.redeliver.discard((entry_id, i))
                continue
            entry = entries[0]
            if entry_kind(entry.meta) != DATA:
                entry = Entry(entry_id, entry.meta, await self.partition.materialize(entry))
                still = [i for i in indexes if (entry_id, i) in self.redeliver]
            if not still:
                continue
            consumer = self._pick()
            if consumer is None:
                break
            count = max(self.redelivery_counts.get((entry_id, i), 0) for i in still)
            for i in still:
                self.redeliver.discard((entry_id, i))
            self._deliver(consumer, out, entry, still, entry_count(entry.meta), count)
        out.flush()
        return bool(by_entry)

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
        for i in delivered:
            self.pending[(entry_id, i)] = consumer
        consumer.permits -= len(delivered)
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
