"""A subscription on one partition: its acknowledgements and its dispatch.

`PartitionSubscription` composes an `PendingAckLog` (the cursor and the ledger of
its records: plain acks and PIP-31's PENDING_ACK, `subscriptions._pending_ack`)
and a `Dispatcher` (consumers, permits and redelivery,
`subscriptions._dispatch`), which follows every record the log applies. A
read_uncommitted subscription also has an `UncommittedLog` for the messages
it delivers from the transaction buffer (`subscriptions._uncommitted`):
their positions have an entry id below -1.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import cast

from buffer import Partition, Position
from ledger import Ledger
from proto import TxnID, refusals
from subscriptions._cursor import WHOLE_ENTRY, Cursor, Range
from subscriptions._dispatch import Consumer, Dispatcher, SubType
from subscriptions._pending_ack import PendingAckLog
from subscriptions._state import MsgState
from subscriptions._uncommitted import UncommittedCursor, UncommittedLog, from_wire

__all__ = ["PartitionSubscription", "attached"]

log = logging.getLogger(__name__)


def attached(consumer: Consumer) -> list[PartitionSubscription]:
    """The partition subscriptions ``consumer`` is attached to (each one's
    `add_consumer` put itself in ``consumer.subscriptions``, which
    `subscriptions._dispatch` can only type as an `Attachment`)."""
    return cast(list[PartitionSubscription], consumer.subscriptions)


class PartitionSubscription:
    """Create with `create` or `load`. ``cursor`` is the acknowledgements'
    state (a reset moves it in place), ``uncommitted`` what a
    read_uncommitted subscription acknowledged of the transaction buffer."""

    def __init__(
        self,
        partition: Partition,
        name: str,
        acks: PendingAckLog,
        uncommitted: UncommittedLog | None = None,
    ) -> None:
        self.partition = partition
        self.name = name
        self.acks = acks
        self.cursor: Cursor = acks.cursor
        self.uncommitted: UncommittedCursor | None = uncommitted.cursor if uncommitted else None
        self._uncommitted_log = uncommitted
        self.dispatch = Dispatcher(partition, name, acks.cursor, self.uncommitted)
        acks.on_applied = self.dispatch.applied
        if uncommitted is not None:
            uncommitted.on_applied = self.dispatch.forget

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
        """A new subscription at the earliest or latest position (durably).
        Its cursor ledger should not exist yet. One that does (never
        expected: the broker did not hold this subscription in memory though
        its cursor is in the store) is loaded, not written over: a
        subscription never moves back by being created again. Logged at
        WARNING, naming the ledger."""
        store = partition.ledger.store
        name_of_cursor = cls.ledger_name(partition.topic, partition.index, name)
        existing = store.get_ledger(name_of_cursor)
        if existing is not None:
            log.warning(
                "subscription %r of %s asked to be created at the %s position, but its cursor "
                "ledger %s exists: loaded from there",
                name,
                partition.name,
                "earliest" if earliest else "latest",
                name_of_cursor,
            )
            return await cls.load(partition, name, existing)
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
            uncommitted = await UncommittedLog.create(uledger, start)
        ledger = await store.open_ledger(name_of_cursor)
        messages = partition.ledger
        start_at = (
            messages.first_entry_id - 1 if earliest else messages.last_entry_id,
            WHOLE_ENTRY,
        )
        count = _counter(partition, read_uncommitted)
        acks = await PendingAckLog.create(ledger, start_at, partition, name, count)
        return cls(partition, name, acks, uncommitted)

    @classmethod
    async def load(cls, partition: Partition, name: str, ledger: Ledger) -> PartitionSubscription:
        """Rebuild a subscription from its cursor ledger (and, for a
        read_uncommitted one, its ledger of the transaction buffer's acks)."""
        uledger = partition.ledger.store.get_ledger(
            cls.uncommitted_ledger_name(partition.topic, partition.index, name)
        )
        uncommitted = None if uledger is None else await UncommittedLog.load(uledger)
        count = _counter(partition, uledger is not None)
        acks = await PendingAckLog.load(ledger, partition, name, count)
        return cls(partition, name, acks, uncommitted)

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        """Let dispatch run, and look for work."""
        self.dispatch.start()

    def wake(self) -> None:
        self.dispatch.wake()

    async def close(self) -> None:
        await self.dispatch.close()

    def settled(self) -> bool:
        """Nothing under way: no consumer (so no dispatch task, nothing
        delivered and unacknowledged), no transaction holding
        acknowledgements, no record or reset in flight. Then `release`
        loses nothing: `load` rebuilds the same state from the ledgers."""
        ulog = self._uncommitted_log
        return self.dispatch.idle and self.acks.settled and (ulog is None or ulog.ledger.settled)

    def release(self) -> None:
        """Stop following the partition and give the ledgers' objects back
        to the store; this object is not to be used any more. Only when
        `settled`."""
        self.dispatch.detach()
        for ledger in self._ledgers():
            ledger.store.release_ledger(ledger)

    async def delete(self) -> None:
        await self.close()
        for ledger in self._ledgers():
            await ledger.store.delete_ledger(ledger.name)

    def _ledgers(self) -> list[Ledger]:
        ulog = self._uncommitted_log
        return [self.acks.ledger] if ulog is None else [self.acks.ledger, ulog.ledger]

    # -- consumers ----------------------------------------------------------------

    @property
    def consumers(self) -> list[Consumer]:
        return self.dispatch.consumers

    @property
    def sub_type(self) -> SubType | None:
        return self.dispatch.sub_type

    @property
    def pending(self) -> Mapping[Position, Consumer]:
        """Messages delivered and not acknowledged, and their consumers."""
        return self.dispatch.pending

    def check_can_add(self, consumer: Consumer) -> None:
        self.dispatch.check_can_add(consumer)

    def add_consumer(self, consumer: Consumer) -> None:
        self.dispatch.add_consumer(consumer)
        consumer.subscriptions.append(self)

    def remove_consumer(self, consumer: Consumer) -> None:
        """Detach ``consumer``; its unacknowledged messages go to redelivery."""
        if self in consumer.subscriptions:
            consumer.subscriptions.remove(self)
        self.dispatch.remove_consumer(consumer)

    def redeliver_unacked(self, consumer: Consumer, positions: list[Position] | None) -> None:
        self.dispatch.redeliver_unacked(consumer, positions)

    # -- acknowledgements ---------------------------------------------------------

    async def ack(
        self,
        positions: list[Position],
        cumulative: bool,
        txn: TxnID | None = None,
        early: bool = False,
    ) -> None:
        """Acknowledge durably, then apply: `PendingAckLog.ack`. A message read
        uncommitted takes only a plain individual ack. Raises
        (`proto.refusals`) besides: NOT_ALLOWED for a cumulative ack on a
        shared subscription, INVALID_ARGUMENT for no positions. Positions
        must exist (the caller checks)."""
        if not positions:
            raise refusals.InvalidArgument("an acknowledgement needs positions")
        uncommitted = [p for p in positions if p[0] < -1]
        if uncommitted:
            ulog = self._uncommitted_log
            if cumulative or txn is not None or ulog is None:
                raise refusals.NotAllowed(
                    "a message read uncommitted (from the transaction buffer) takes only a "
                    "plain individual acknowledgement",
                )
            committed = [p for p in positions if p[0] >= -1]
            if committed:
                await asyncio.gather(self.ack(committed, False), ulog.ack(uncommitted))
            else:
                await ulog.ack(uncommitted)
            return
        if cumulative and self.sub_type is SubType.SHARED:
            raise refusals.NotAllowed(
                "cumulative acknowledgement is not allowed on a shared subscription"
            )
        await self.acks.ack(positions, cumulative, txn, early)

    def check_acked(self, txn: TxnID, ranges: list[Range]) -> None:
        """Before a local transaction's commit: raise (`proto.refusals`,
        nothing changed) unless every message of ``ranges`` ((entry id,
        first index, last index), sorted and apart) is stored, PENDING here
        and may be locked now (`PendingAckLog.check_acked`)."""
        for entry_id, first, last in ranges:
            if entry_id < -1:
                raise refusals.NotAllowed(
                    "a message read uncommitted (from the transaction buffer) takes only a "
                    "plain individual acknowledgement",
                )
            if first < 0 or last < first or not self.partition.exists((entry_id, last)):
                raise refusals.UnknownMessageId(
                    f"no messages {self.partition.index}:{entry_id}:{first}..{last} on "
                    f"{self.partition.name} (subscription {self.name!r})",
                )
        self.acks.check_acked(txn, ranges)

    def queue_acked(self, txn: TxnID, ranges: list[Range]) -> asyncio.Future[list[Position]]:
        """`PendingAckLog.queue_acked` of ranges `check_acked` passed."""
        return self.acks.queue_acked(txn, tuple(ranges))

    async def end_txn(self, txn: TxnID, commit: bool) -> None:
        """EndTxnOnSubscription: `PendingAckLog.end_txn`."""
        await self.acks.end_txn(txn, commit)

    def end_txn_early(self, txn: TxnID, commit: bool) -> None:
        """`PendingAckLog.end_txn_early`."""
        self.acks.end_txn_early(txn, commit)

    def check_no_txn_acks(self, what: str) -> None:
        self.acks.check_no_txn_acks(what)

    # -- operators: reset, skip ---------------------------------------------------

    async def reset(self, mark_delete: Position) -> None:
        """Move the cursor (durably) so that every message after
        ``mark_delete`` is PENDING, delivered again in order from there, and
        every one at or before it DELETED; what consumers hold unacknowledged
        is forgotten (their late acks of it apply to the new cursor). A
        read_uncommitted subscription's reads of open transactions stay as
        they are. Refused (`refusals.NotAllowed`, nothing changed) while a
        transaction holds acknowledgements here."""
        self.acks.check_no_txn_acks("reset")
        await self.dispatch.pause()
        try:
            await self.acks.reset(mark_delete)
        finally:
            self.dispatch.start()

    def pending_positions(self, limit: int) -> list[Position]:
        """The first ``limit`` PENDING messages after mark-delete (not
        acknowledged, not locked by a transaction), in order."""
        found: list[Position] = []
        bound = (self.partition.ledger.last_entry_id, WHOLE_ENTRY)
        for pos in self.cursor.messages_through(bound, self.acks.count):
            if len(found) >= limit:
                break
            if self.cursor.state(pos) is MsgState.PENDING:
                found.append(pos)
        return found

    async def skip(self, limit: int) -> int:
        """Acknowledge the first ``limit`` PENDING messages (durably); how many there were."""
        positions = self.pending_positions(limit)
        if positions:
            await self.ack(positions, cumulative=False)
        return len(positions)

    # -- what is here -------------------------------------------------------------

    def state(self, pos: Position) -> MsgState:
        """The state of a message, committed or (entry id below -1) read uncommitted."""
        return self.dispatch.state(pos)

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
        return (
            pos in self.dispatch.pending
            or pos in self.dispatch.redeliver
            or self.uncommitted.state(from_wire(pos)) is MsgState.DELETED
        )

    def uncommitted_floor(self) -> int | None:
        """The first sidecar entry this subscription still needs (None: not read_uncommitted)."""
        return None if self.uncommitted is None else self.uncommitted.mark_delete + 1

    def backlog(self) -> int:
        """Messages not DELETED yet (PENDING and PENDING_ACK ones)."""
        return max(
            0, self.partition.messages_after(self.cursor.mark_delete) - len(self.cursor.acked)
        )


def _counter(partition: Partition, read_uncommitted: bool) -> Callable[[int], int]:
    """Entry sizes as the cursor counts them: a read_uncommitted one counts
    commit markers as empty (their messages were read from the transaction
    buffer)."""
    if not read_uncommitted:
        return partition.count

    def count(entry_id: int) -> int:
        return 0 if partition.is_marker(entry_id) else partition.count(entry_id)

    return count
