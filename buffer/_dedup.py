"""Producer deduplication by sequence id, per partition.

A named producer numbers its messages with increasing sequence ids. The
partition remembers, per producer name, the highest sequence id pushed to
the ledger (``pushed``) and the highest one durable (``persisted``), plus
where the recent ones were stored, so that a re-sent message is answered
with its original message id and never stored twice (Pulsar's message
deduplication, which keeps the same two high-water marks).

What survives a restart: `DedupState.snapshot()` (producer -> highest
sequence id) is written to the partition's dedup ledger now and then, and on
start the partition replays the entries after it (and at least the last
`RECENT_ENTRIES`), which also rebuilds the recent lookup.
"""

from __future__ import annotations

import asyncio
import bisect
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RECENT_ENTRIES", "DedupState", "ProducerSequence"]

# How many stored entries per producer can still be answered with their ids.
RECENT_ENTRIES = 10_000


@dataclass(slots=True)
class ProducerSequence:
    pushed: int = -1
    persisted: int = -1
    last_append: asyncio.Future[int] | None = None
    # The recent stored entries, oldest first, three numbers each: the
    # first and last sequence id it holds and its entry id (24 bytes an
    # entry; made by the first).
    _recent: array[int] | None = None
    # Entry id -> its sequence ids, for the recent entries whose ids are not
    # consecutive (made by the first).
    _gaps: dict[int, tuple[int, ...]] | None = None

    def record(self, seqs: Sequence[int], entry_id: int) -> None:
        """The messages with ``seqs`` (increasing) are durable in ``entry_id``."""
        first, last = seqs[0], seqs[-1]
        recent = self._recent
        if recent is None:
            recent = self._recent = array("q")
        recent.append(first)
        recent.append(last)
        recent.append(entry_id)
        if last - first + 1 != len(seqs):
            if self._gaps is None:
                self._gaps = {}
            self._gaps[entry_id] = tuple(seqs)
        if len(recent) > 3 * 2 * RECENT_ENTRIES:
            del recent[: 3 * RECENT_ENTRIES]
            if self._gaps:
                oldest = recent[2]
                self._gaps = {e: s for e, s in self._gaps.items() if e >= oldest}
        self.persisted = max(self.persisted, last)
        self.pushed = max(self.pushed, last)

    def lookup(self, seq: int) -> tuple[int, int] | None:
        """``(entry_id, batch_index)`` of the stored message ``seq``, if still known."""
        recent = self._recent
        if recent is None:
            return None
        n = len(recent) // 3
        # (The first recent entry whose last sequence id is at least seq.)
        i = bisect.bisect_left(range(n), seq, key=lambda j: recent[3 * j + 1])
        if i == n:
            return None
        first, entry_id = recent[3 * i], recent[3 * i + 2]
        if seq < first:
            return None
        seqs = self._gaps.get(entry_id) if self._gaps else None
        if seqs is None:
            return (entry_id, seq - first)
        j = bisect.bisect_left(seqs, seq)
        if j < len(seqs) and seqs[j] == seq:
            return (entry_id, j)
        return None


class DedupState:
    """Sequence state of every producer that wrote to one partition."""

    __slots__ = ("producers",)

    def __init__(self) -> None:
        self.producers: dict[str, ProducerSequence] = {}

    def get(self, name: str) -> ProducerSequence:
        seq = self.producers.get(name)
        if seq is None:
            seq = self.producers[name] = ProducerSequence()
        return seq

    def last_sequence_id(self, name: str) -> int:
        seq = self.producers.get(name)
        return -1 if seq is None else seq.persisted

    def snapshot(self) -> dict[str, int]:
        return {name: s.persisted for name, s in self.producers.items() if s.persisted >= 0}

    def restore(self, snapshot: dict[str, int]) -> None:
        for name, last in snapshot.items():
            s = self.get(name)
            s.persisted = s.pushed = max(s.persisted, int(last))
