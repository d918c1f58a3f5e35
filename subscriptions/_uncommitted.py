"""What a ``read_uncommitted`` subscription has acknowledged of the
transaction buffer (PIP-31 §Isolation Levels, READ_UNCOMMITTED).

A read_uncommitted subscription delivers, besides the partition's committed
messages, the messages of transactional sends as soon as they are durable in
the partition's sidecar transaction log, whether their transaction is open,
later commits or later aborts. Such a message is named by its sidecar record:
*sidecar position* ``(sidecar entry id, index)``. On the wire (and in the
subscription's pending and redelivery maps) it is
``(-2 - sidecar entry id, index)``: entry ids below -1 mean "from the
transaction buffer" (-1 already means "a transactional send's message, not
committed yet" in send receipts). The subscription skips commit markers, whose
messages it delivered from the sidecar already, so each message comes once.

Only plain individual acks apply to them (a cumulative or transactional ack
of one is refused). The acks are the records of a ledger of their own
(`UncommittedLog`: durable, then applied), ``u/{topic}/{index}/{subscription}``
(whose existence also marks the subscription as read_uncommitted, durably):

    0 SNAPSHOT  JSON {"md": sidecar entry id, "acked": [e, i, ...]}
    1 ACK       sidecar positions, int64 pairs (as `encode_record`)

Every sidecar entry at or below the mark-delete ``md`` is done; ``acked``
holds the positions acknowledged after it. The mark-delete moves over an
entry once all its messages are acknowledged (or it holds none: a commit or
abort record), which needs its size: `note` tells it as dispatch reads the
sidecar; after a restart dispatch reads on from ``md + 1`` and tells again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable

from sortedcontainers import SortedSet

from buffer import Position
from ledger import Ledger
from subscriptions._cursor import SNAPSHOT_EVERY, decode_record, encode_record, snapshot_then_trim
from subscriptions._state import MsgState

__all__ = [
    "SNAPSHOT",
    "UNCOMMITTED_ACK",
    "UncommittedCursor",
    "UncommittedLog",
    "from_wire",
    "to_wire",
]

SNAPSHOT, UNCOMMITTED_ACK = 0, 1


def to_wire(sidecar_pos: Position) -> Position:
    """The wire position of sidecar position ``(entry, index)``: ``(-2 - entry, index)``."""
    return (-2 - sidecar_pos[0], sidecar_pos[1])


def from_wire(pos: Position) -> Position:
    """The sidecar position of a wire position whose entry id is below -1."""
    return (-2 - pos[0], pos[1])


class UncommittedCursor:
    def __init__(self, mark_delete: int = -1) -> None:
        self.mark_delete = mark_delete  # sidecar entries at or below it are done
        self.acked: SortedSet = SortedSet()  # sidecar positions acknowledged after it
        self._sizes: dict[int, int] = {}  # message count of entries read after it

    def __repr__(self) -> str:
        return f"UncommittedCursor(mark_delete={self.mark_delete}, acked={len(self.acked)})"

    def state(self, pos: Position) -> MsgState:
        """DELETED or PENDING (a message of the sidecar is never PENDING_ACK)."""
        if pos[0] <= self.mark_delete or pos in self.acked:
            return MsgState.DELETED
        return MsgState.PENDING

    def note(self, entry_id: int, count: int) -> None:
        """Sidecar entry ``entry_id`` holds ``count`` messages to deliver (0: none)."""
        if entry_id > self.mark_delete:
            self._sizes[entry_id] = count
            self._advance()

    def skip_to(self, entry_id: int) -> None:
        """Entries up to ``entry_id`` are gone from the sidecar (reclaimed)."""
        if entry_id > self.mark_delete:
            self.mark_delete = entry_id
            while self.acked and self.acked[0][0] <= entry_id:
                self.acked.pop(0)
            for e in [e for e in self._sizes if e <= entry_id]:
                del self._sizes[e]
            self._advance()

    def ack(self, positions: list[Position]) -> list[Position]:
        """Acknowledge ``positions``; returns those that were PENDING."""
        changed = [p for p in dict.fromkeys(positions) if self.state(p) is MsgState.PENDING]
        self.acked.update(changed)
        self._advance()
        return changed

    def _advance(self) -> None:
        acked = self.acked
        while True:
            entry_id = self.mark_delete + 1
            n = self._sizes.get(entry_id)
            if n is None:
                return  # not read yet: its size is unknown
            if any((entry_id, i) not in acked for i in range(n)):
                return
            for i in range(n):
                acked.discard((entry_id, i))
            del self._sizes[entry_id]
            self.mark_delete = entry_id

    def snapshot(self) -> bytes:
        flat = [x for pos in self.acked for x in pos]
        return json.dumps({"md": self.mark_delete, "acked": flat}).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> UncommittedCursor:
        record = json.loads(data)
        cursor = cls(int(record["md"]))
        flat = record["acked"]
        cursor.acked.update(zip(flat[::2], flat[1::2], strict=True))
        return cursor


class UncommittedLog:
    """``cursor``, kept by the records of ``ledger``. Create with `create`
    or `load`."""

    def __init__(self, ledger: Ledger, cursor: UncommittedCursor) -> None:
        self.ledger = ledger
        self.cursor = cursor
        # Told of each ack applied, with its (wire) positions.
        self.on_applied: Callable[[list[Position]], None] = lambda positions: None
        self._since_snapshot = 0

    @classmethod
    async def create(cls, ledger: Ledger, mark_delete: int) -> UncommittedLog:
        """A new cursor past sidecar entry ``mark_delete``, durably."""
        cursor = UncommittedCursor(mark_delete)
        await ledger.append(cursor.snapshot(), meta=SNAPSHOT)
        return cls(ledger, cursor)

    @classmethod
    async def load(cls, ledger: Ledger) -> UncommittedLog:
        """The cursor rebuilt from ``ledger``: its snapshots and acks."""
        cursor = UncommittedCursor()
        for entry in await ledger.read(ledger.first_entry_id, ledger.last_entry_id):
            kind = entry.meta
            if kind == SNAPSHOT:
                cursor = UncommittedCursor.from_snapshot(entry.data)
            elif kind == UNCOMMITTED_ACK:
                cursor.ack(decode_record(entry.data))
            else:
                raise RuntimeError(f"{ledger.name}, entry {entry.entry_id}: unknown kind {kind}")
        return cls(ledger, cursor)

    async def ack(self, positions: list[Position]) -> None:
        """Acknowledge messages read uncommitted (wire positions), durably,
        then apply (persist, then act)."""
        sidecar = [from_wire(p) for p in positions]
        appended = self.ledger.append(encode_record(sidecar), meta=UNCOMMITTED_ACK)
        outcome: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def durable(f: asyncio.Future[int]) -> None:
            if f.cancelled() or f.exception() is not None:
                if not outcome.done():
                    outcome.set_exception(f.exception() or asyncio.CancelledError())
                return
            self.cursor.ack(sidecar)
            self.on_applied(positions)
            self._since_snapshot += 1
            if self._since_snapshot >= SNAPSHOT_EVERY:
                self._since_snapshot = 0
                snapshot_then_trim(self.ledger, self.cursor.snapshot(), SNAPSHOT)
            if not outcome.done():
                outcome.set_result(None)

        appended.add_done_callback(durable)
        await outcome
