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
from collections.abc import Sequence
from dataclasses import dataclass, field

__all__ = ["RECENT_ENTRIES", "DedupState", "ProducerSequence"]

# How many stored entries per producer can still be answered with their ids.
RECENT_ENTRIES = 10_000


@dataclass(slots=True)
class _Stored:
    first_seq: int
    last_seq: int
    entry_id: int
    seqs: tuple[int, ...] | None  # None when consecutive: first_seq..last_seq


@dataclass(slots=True)
class ProducerSequence:
    pushed: int = -1
    persisted: int = -1
    last_append: asyncio.Future[int] | None = None
    _recent: list[_Stored] = field(default_factory=list)
    _lasts: list[int] = field(default_factory=list)  # _recent[i].last_seq, for bisect

    def record(self, seqs: Sequence[int], entry_id: int) -> None:
        """The messages with ``seqs`` (increasing) are durable in ``entry_id``."""
        first, last = seqs[0], seqs[-1]
        consecutive = last - first + 1 == len(seqs)
        self._recent.append(_Stored(first, last, entry_id, None if consecutive else tuple(seqs)))
        self._lasts.append(last)
        if len(self._recent) > 2 * RECENT_ENTRIES:
            del self._recent[:RECENT_ENTRIES]
            del self._lasts[:RECENT_ENTRIES]
        self.persisted = max(self.persisted, last)
        self.pushed = max(self.pushed, last)

    def lookup(self, seq: int) -> tuple[int, int] | None:
        """``(entry_id, batch_index)`` of the stored message ``seq``, if still known."""
        i = bisect.bisect_left(self._lasts, seq)
        if i == len(self._recent):
            return None
        stored = self._recent[i]
        if seq < stored.first_seq:
            return None
        if stored.seqs is None:
            return (stored.entry_id, seq - stored.first_seq)
        j = bisect.bisect_left(stored.seqs, seq)
        if j < len(stored.seqs) and stored.seqs[j] == seq:
            return (stored.entry_id, j)
        return None


class DedupState:
    """Sequence state of every producer that wrote to one partition."""

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
