"""A subscription's cursor on one partition, and its on-disk records.

The cursor is the mark-delete position (every message at or before it is
DELETED) plus the set of messages after it that were acknowledged one by one
(a `SortedSet` of positions). Acks go through the state table of
`subscriptions._state`; the mark-delete position then advances over every
contiguous acknowledged message.

Durably, a cursor is a ledger of records: a snapshot (``meta`` 0, JSON), or
an acknowledgement (``meta`` 1 individual / 2 cumulative, int64 pairs).
Replaying them in order through `Cursor.apply` rebuilds the cursor; a fresh
snapshot lets the ledger be trimmed before it.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Callable, Iterable

from sortedcontainers import SortedSet

from buffer import Position
from subscriptions._state import AckEvent, MsgState, transition

__all__ = ["WHOLE_ENTRY", "AckRecord", "Cursor", "decode_record", "encode_record"]

# A batch index meaning "every message of the entry": mark-delete (e, WHOLE_ENTRY)
# says entry e is done.
WHOLE_ENTRY = (1 << 31) - 1

SNAPSHOT, INDIVIDUAL, CUMULATIVE = 0, 1, 2

AckRecord = tuple[int, list[Position]]  # (INDIVIDUAL | CUMULATIVE, positions)


class Cursor:
    def __init__(self, mark_delete: Position) -> None:
        self.mark_delete: Position = mark_delete
        self.acked: SortedSet = SortedSet()

    def __repr__(self) -> str:
        return f"Cursor(mark_delete={self.mark_delete}, acked={len(self.acked)})"

    def state(self, pos: Position) -> MsgState:
        if pos <= self.mark_delete or pos in self.acked:
            return MsgState.DELETED
        return MsgState.PENDING

    def first_open_entry(self) -> int:
        """The first entry that may still hold a message not DELETED."""
        entry_id, index = self.mark_delete
        return entry_id + 1 if index == WHOLE_ENTRY else entry_id

    def apply(
        self, kind: int, positions: Iterable[Position], count: Callable[[int], int], last: int
    ) -> list[Position]:
        """Apply an ack record; returns the positions that became DELETED now.

        ``count(entry_id)`` gives an entry's message count and ``last`` the
        last entry id, for advancing the mark-delete position.
        """
        deleted: list[Position] = []
        if kind == CUMULATIVE:
            for pos in positions:
                if pos > self.mark_delete:
                    transition(MsgState.PENDING, AckEvent.ACK)
                    deleted.extend(self._delete_through(pos, count))
        else:
            # Check every transition first, so a refused one changes nothing.
            wanted = list(positions)
            states = [self.state(pos) for pos in wanted]
            for state in states:
                transition(state, AckEvent.ACK)
            for pos, state in zip(wanted, states, strict=True):
                if state is MsgState.PENDING and pos not in self.acked:
                    self.acked.add(pos)
                    deleted.append(pos)
        self._advance(count, last)
        return deleted

    def _delete_through(self, pos: Position, count: Callable[[int], int]) -> list[Position]:
        """Move mark-delete to ``pos``; returns the messages that became DELETED."""
        deleted = []
        entry_id, index = self.mark_delete
        if index == WHOLE_ENTRY:
            entry_id, index = entry_id + 1, -1
        while (entry_id, index + 1) <= pos:
            n = count(entry_id)
            stop = pos[1] if entry_id == pos[0] else n - 1
            for i in range(index + 1, min(stop, n - 1) + 1):
                if (entry_id, i) not in self.acked:
                    deleted.append((entry_id, i))
            if entry_id >= pos[0]:
                break
            entry_id, index = entry_id + 1, -1
        self.mark_delete = pos
        while self.acked and self.acked[0] <= pos:
            self.acked.pop(0)
        return deleted

    def _advance(self, count: Callable[[int], int], last: int) -> None:
        """Move the mark-delete position over acknowledged messages."""
        entry_id, index = self.mark_delete
        acked = self.acked
        while True:
            if index != WHOLE_ENTRY and index + 1 >= count(entry_id):
                index = WHOLE_ENTRY
            if index == WHOLE_ENTRY:
                if entry_id + 1 > last:
                    break
                if count(entry_id + 1) == 0:
                    entry_id += 1
                    continue
                nxt = (entry_id + 1, 0)
            else:
                nxt = (entry_id, index + 1)
            if not acked or acked[0] != nxt:
                break
            acked.pop(0)
            entry_id, index = nxt
        self.mark_delete = (entry_id, index)

    # -- records ----------------------------------------------------------------

    def snapshot(self) -> bytes:
        flat = [x for pos in self.acked for x in pos]
        return json.dumps({"md": list(self.mark_delete), "acked": flat}).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> Cursor:
        record = json.loads(data)
        cursor = cls((int(record["md"][0]), int(record["md"][1])))
        flat = record["acked"]
        cursor.acked.update(zip(flat[::2], flat[1::2], strict=True))
        return cursor

    def copy(self) -> Cursor:
        other = Cursor(self.mark_delete)
        other.acked = SortedSet(self.acked)
        return other


def encode_record(positions: Iterable[Position]) -> bytes:
    return array("q", [x for pos in positions for x in pos]).tobytes()


def decode_record(data: bytes) -> list[Position]:
    flat = array("q")
    flat.frombytes(data)
    return list(zip(flat[::2], flat[1::2], strict=True))
