"""Sets of message positions as ranges: what a cursor holds.

A position is (entry id, batch index). An entry's messages are acknowledged
or locked in runs (a batch acknowledged in order is one run), so a cursor
keeps them as ranges (entry id, first index, last index), inclusive, and
its work on an acknowledgement is per range, not per message.

`RangeSet`: positions, per entry a sorted list of disjoint, non-touching
(first, last) pairs; the entries in a sorted list beside. `LockTable`:
positions locked by transactions (PENDING_ACK), per entry a sorted list of
disjoint (first, last, transaction) triples, and per transaction the ranges
it holds. `DeliveredMap`: what dispatch delivered and is not acknowledged,
each range with its consumer. None does I/O.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Iterator, MutableMapping
from typing import TypeVar

from buffer import Position
from proto import TxnID

__all__ = ["DeliveredMap", "LockTable", "Range", "RangeSet", "positions_of", "ranges_of"]

Range = tuple[int, int, int]  # (entry id, first index, last index), inclusive
_C = TypeVar("_C")


def ranges_of(positions: Iterable[Position]) -> list[Range]:
    """``positions`` as ranges: each run of consecutive indexes of one entry,
    in the order given, is one range."""
    out: list[Range] = []
    entry_id = last = first = -2
    for e, i in positions:
        if i == last + 1 and e == entry_id:
            last = i
            continue
        if entry_id != -2:
            out.append((entry_id, first, last))
        entry_id, first, last = e, i, i
    if entry_id != -2:
        out.append((entry_id, first, last))
    return out


def positions_of(ranges: Iterable[Range]) -> list[Position]:
    """Every position of ``ranges``, in their order."""
    out: list[Position] = []
    for entry_id, first, last in ranges:
        n = last - first + 1
        out.extend(zip(itertools.repeat(entry_id, n), range(first, last + 1), strict=True))
    return out


class RangeSet:
    """A set of positions, kept as ranges (see the module docstring)."""

    __slots__ = ("_by_entry", "_count", "_entries")

    def __init__(self, positions: Iterable[Position] = ()) -> None:
        self._by_entry: dict[int, list[tuple[int, int]]] = {}
        self._entries: list[int] = []  # the keys of _by_entry, sorted
        self._count = 0
        for entry_id, first, last in ranges_of(sorted(set(positions))):
            self.add_range(entry_id, first, last)

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __contains__(self, pos: object) -> bool:
        entry_id: int
        index: int
        entry_id, index = pos  # type: ignore[misc]
        runs = self._by_entry.get(entry_id)
        if not runs:
            return False
        i = bisect.bisect_right(runs, (index, 1 << 62)) - 1
        return i >= 0 and runs[i][1] >= index

    def __iter__(self) -> Iterator[Position]:
        for entry_id in self._entries:
            for first, last in self._by_entry[entry_id]:
                yield from zip(itertools.repeat(entry_id), range(first, last + 1))

    def __repr__(self) -> str:
        return f"RangeSet({list(self.ranges())})"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RangeSet):
            return list(self.ranges()) == list(other.ranges())
        return NotImplemented

    def ranges(self) -> Iterator[Range]:
        """The ranges, in order."""
        for entry_id in self._entries:
            for first, last in self._by_entry[entry_id]:
                yield (entry_id, first, last)

    def copy(self) -> RangeSet:
        other = RangeSet()
        other._by_entry = {e: list(runs) for e, runs in self._by_entry.items()}
        other._entries = list(self._entries)
        other._count = self._count
        return other

    def first(self) -> Range | None:
        """The lowest range, or None."""
        if not self._entries:
            return None
        entry_id = self._entries[0]
        first, last = self._by_entry[entry_id][0]
        return (entry_id, first, last)

    def has_entry(self, entry_id: int) -> bool:
        return entry_id in self._by_entry

    def overlap(self, entry_id: int, first: int, last: int) -> int | None:
        """The first index of ``first``..``last`` of entry ``entry_id`` in
        the set, or None."""
        runs = self._by_entry.get(entry_id)
        if not runs:
            return None
        i = bisect.bisect_right(runs, (first, 1 << 62)) - 1
        if i >= 0 and runs[i][1] >= first:
            return first
        if i + 1 < len(runs) and runs[i + 1][0] <= last:
            return runs[i + 1][0]
        return None

    def add_range(self, entry_id: int, first: int, last: int) -> None:
        """Add ``first``..``last`` of entry ``entry_id`` (some may be in the set)."""
        runs = self._by_entry.get(entry_id)
        if runs is None:
            self._by_entry[entry_id] = [(first, last)]
            bisect.insort(self._entries, entry_id)
            self._count += last - first + 1
            return
        # The runs that touch first..last merge with it.
        lo = bisect.bisect_left(runs, (first, -1))
        if lo > 0 and runs[lo - 1][1] >= first - 1:
            lo -= 1
        hi = lo
        new_first, new_last = first, last
        removed = 0
        while hi < len(runs) and runs[hi][0] <= last + 1:
            a, b = runs[hi]
            new_first, new_last = min(new_first, a), max(new_last, b)
            removed += b - a + 1
            hi += 1
        runs[lo:hi] = [(new_first, new_last)]
        self._count += new_last - new_first + 1 - removed

    def add(self, pos: Position) -> None:
        self.add_range(pos[0], pos[1], pos[1])

    def update(self, positions: Iterable[Position]) -> None:
        for entry_id, first, last in ranges_of(positions):
            self.add_range(entry_id, first, last)

    def discard_range(self, entry_id: int, first: int, last: int) -> None:
        """Remove ``first``..``last`` of entry ``entry_id`` (what is in the set)."""
        runs = self._by_entry.get(entry_id)
        if not runs:
            return
        out: list[tuple[int, int]] = []
        for a, b in runs:
            if b < first or a > last:
                out.append((a, b))
                continue
            self._count -= min(b, last) - max(a, first) + 1
            if a < first:
                out.append((a, first - 1))
            if b > last:
                out.append((last + 1, b))
        self._set_runs(entry_id, out)

    def drop_through(self, pos: Position) -> None:
        """Remove every position at or before ``pos``."""
        entry_id, index = pos
        entries = self._entries
        while entries and entries[0] < entry_id:
            gone = entries[0]
            self._count -= sum(b - a + 1 for a, b in self._by_entry.pop(gone))
            del entries[0]
        if entries and entries[0] == entry_id:
            self.discard_range(entry_id, 0, index)

    def take_run(self, pos: Position) -> int | None:
        """If a range starts at ``pos``, remove it and return its last index."""
        entry_id, index = pos
        runs = self._by_entry.get(entry_id)
        if not runs:
            return None
        i = 0 if runs[0][0] == index else bisect.bisect_left(runs, (index, -1))
        if i >= len(runs) or runs[i][0] != index:
            return None
        last = runs[i][1]
        self._count -= last - index + 1
        del runs[i]
        self._set_runs(entry_id, runs)
        return last

    def _set_runs(self, entry_id: int, runs: list[tuple[int, int]]) -> None:
        if runs:
            self._by_entry[entry_id] = runs
        else:
            del self._by_entry[entry_id]
            del self._entries[bisect.bisect_left(self._entries, entry_id)]


class LockTable:
    """Positions locked by transactions (PENDING_ACK), as ranges (see the
    module docstring). ``held[txn]`` is the list of ranges ``txn`` holds,
    in the order it locked them."""

    __slots__ = ("_by_entry", "_count", "held")

    def __init__(self) -> None:
        self._by_entry: dict[int, list[tuple[int, int, TxnID]]] = {}
        self.held: dict[TxnID, list[Range]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def copy(self) -> LockTable:
        other = LockTable()
        other._by_entry = {e: list(runs) for e, runs in self._by_entry.items()}
        other.held = {txn: list(rs) for txn, rs in self.held.items()}
        other._count = self._count
        return other

    def holder(self, pos: Position) -> TxnID | None:
        """The transaction holding ``pos``, or None."""
        runs = self._by_entry.get(pos[0])
        if not runs:
            return None
        index = pos[1]
        for a, b, txn in runs:
            if a <= index <= b:
                return txn
            if a > index:
                break
        return None

    def has_entry(self, entry_id: int) -> bool:
        return entry_id in self._by_entry

    def overlap(self, entry_id: int, first: int, last: int) -> tuple[int, TxnID] | None:
        """The first locked index of ``first``..``last`` of entry
        ``entry_id`` and its holder, or None."""
        for a, b, txn in self._by_entry.get(entry_id, ()):
            if b >= first and a <= last:
                return max(a, first), txn
            if a > last:
                break
        return None

    def lock(self, txn: TxnID, ranges: Iterable[Range]) -> None:
        """Lock ``ranges`` (none of them locked: the caller checked) for ``txn``."""
        held = self.held.setdefault(txn, [])
        by_entry = self._by_entry
        for entry_id, first, last in ranges:
            runs = by_entry.get(entry_id)
            if runs is None:
                by_entry[entry_id] = [(first, last, txn)]
            else:
                bisect.insort(runs, (first, last, txn))
            held.append((entry_id, first, last))
            self._count += last - first + 1

    def unlock(self, txn: TxnID) -> list[Range]:
        """Unlock everything ``txn`` holds; its ranges, sorted."""
        ranges = self.held.pop(txn, [])
        by_entry = self._by_entry
        for entry_id, first, last in ranges:
            runs = by_entry[entry_id]
            runs.remove((first, last, txn))
            if not runs:
                del by_entry[entry_id]
            self._count -= last - first + 1
        ranges.sort()
        return ranges

    def positions(self) -> Iterator[tuple[Position, TxnID]]:
        """Every locked position and its holder, in order."""
        for entry_id in sorted(self._by_entry):
            for a, b, txn in self._by_entry[entry_id]:
                for i in range(a, b + 1):
                    yield (entry_id, i), txn

    def count(self, txn: TxnID) -> int:
        """How many messages ``txn`` holds."""
        return sum(last - first + 1 for _, first, last in self.held.get(txn, ()))


class DeliveredMap(MutableMapping[Position, _C]):
    """Messages delivered and not acknowledged, each with its consumer, as
    ranges: per entry a sorted list of disjoint (first, last, consumer).
    An entry goes to one consumer whole (one range), so delivering it and
    forgetting a commit of it cost per range, not per message. A mapping of
    positions all the same."""

    __slots__ = ("_by_entry", "_count")

    def __init__(self) -> None:
        self._by_entry: dict[int, list[tuple[int, int, _C]]] = {}
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Position]:
        for entry_id in sorted(self._by_entry):
            for a, b, _ in self._by_entry[entry_id]:
                yield from zip(itertools.repeat(entry_id), range(a, b + 1))

    def __getitem__(self, pos: Position) -> _C:
        for a, b, consumer in self._by_entry.get(pos[0], ()):
            if a <= pos[1] <= b:
                return consumer
        raise KeyError(pos)

    def __contains__(self, pos: object) -> bool:
        try:
            self[pos]  # type: ignore[index]
        except (KeyError, TypeError):
            return False
        return True

    def __setitem__(self, pos: Position, consumer: _C) -> None:
        entry_id, index = pos
        self.discard_range(entry_id, index, index)
        self._add(entry_id, index, index, consumer)

    def __delitem__(self, pos: Position) -> None:
        if not self.discard_range(pos[0], pos[1], pos[1]):
            raise KeyError(pos)

    def clear(self) -> None:
        self._by_entry.clear()
        self._count = 0

    def deliver(self, entry_id: int, indexes: Iterable[int], consumer: _C) -> None:
        """``indexes`` (sorted) of entry ``entry_id`` went to ``consumer``
        (a redelivery may take some from another one)."""
        for _, first, last in ranges_of(zip(itertools.repeat(entry_id), indexes)):
            self.discard_range(entry_id, first, last)
            self._add(entry_id, first, last, consumer)

    def deliver_range(self, entry_id: int, first: int, last: int, consumer: _C) -> None:
        """``first``..``last`` of entry ``entry_id`` went to ``consumer``."""
        if entry_id in self._by_entry:
            self.discard_range(entry_id, first, last)
        self._add(entry_id, first, last, consumer)

    def _add(self, entry_id: int, first: int, last: int, consumer: _C) -> None:
        runs = self._by_entry.get(entry_id)
        if runs is None:
            self._by_entry[entry_id] = [(first, last, consumer)]
        else:
            runs.insert(bisect.bisect_left([r[0] for r in runs], first), (first, last, consumer))
        self._count += last - first + 1

    def discard_range(self, entry_id: int, first: int, last: int) -> int:
        """Forget ``first``..``last`` of entry ``entry_id``; how many were here."""
        runs = self._by_entry.get(entry_id)
        if not runs:
            return 0
        if len(runs) == 1 and runs[0][0] >= first and runs[0][1] <= last:  # (the usual case)
            a, b, _ = runs[0]
            del self._by_entry[entry_id]
            self._count -= b - a + 1
            return b - a + 1
        out: list[tuple[int, int, _C]] = []
        gone = 0
        for a, b, consumer in runs:
            if b < first or a > last:
                out.append((a, b, consumer))
                continue
            gone += min(b, last) - max(a, first) + 1
            if a < first:
                out.append((a, first - 1, consumer))
            if b > last:
                out.append((last + 1, b, consumer))
        if out:
            self._by_entry[entry_id] = out
        else:
            del self._by_entry[entry_id]
        self._count -= gone
        return gone

    def forget(self, positions: Iterable[Position]) -> None:
        """Forget ``positions`` (those here)."""
        by_entry = self._by_entry
        for entry_id, first, last in ranges_of(positions):
            if entry_id in by_entry:
                self.discard_range(entry_id, first, last)

    def of(self, consumer: _C) -> list[Position]:
        """The positions delivered to ``consumer``, in order."""
        return [p for p, c in self.items() if c is consumer]

    def items(self) -> Iterator[tuple[Position, _C]]:  # type: ignore[override]
        for entry_id in sorted(self._by_entry):
            for a, b, consumer in self._by_entry[entry_id]:
                for i in range(a, b + 1):
                    yield (entry_id, i), consumer

    def through(self, bound: Position) -> list[Position]:
        """The positions at or before ``bound``, in order."""
        out: list[Position] = []
        for entry_id in sorted(e for e in self._by_entry if e <= bound[0]):
            for a, b, _ in self._by_entry[entry_id]:
                stop = b if entry_id < bound[0] else min(b, bound[1])
                out.extend(zip(itertools.repeat(entry_id), range(a, stop + 1)))
        return out
