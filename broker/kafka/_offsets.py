"""Kafka offsets <-> txnbuf positions, one to one per partition.

A txnbuf message sits at (entry id, batch index) of its partition's
ledger. Its Kafka offset is ``entry_id << OFFSET_BITS | batch_index``: an
entry takes the offsets from ``entry_id << OFFSET_BITS`` on, one per
message, and a commit marker one more, right after its messages, for the
COMMIT control batch Kafka consumers expect. The offsets between entries
are never used (Kafka's consumers step over such gaps as they do over
compacted or control records); the next offset after the last entry, the
high watermark, is ``(last entry id + 1) << OFFSET_BITS``.

Nothing is stored to map them: an offset stays valid across restarts and
after the front of the partition is trimmed (the log start offset is the
first entry's). The price is that offsets are not dense: the difference
of two offsets is not a message count (consumer lag in messages is not
the difference of the high watermark and the position).

An entry may hold up to `MAX_ENTRY_MESSAGES` messages (a transaction's
messages in one partition, a send's); a Kafka producer's transaction that
would pass it there is refused.
"""

from __future__ import annotations

__all__ = ["MAX_ENTRY_MESSAGES", "OFFSET_BITS", "offset_of", "position_of"]

OFFSET_BITS = 20
MAX_ENTRY_MESSAGES = (1 << OFFSET_BITS) - 2  # (one offset left for a control record)
_INDEX_MASK = (1 << OFFSET_BITS) - 1


def offset_of(entry_id: int, index: int) -> int:
    """The Kafka offset of message ``index`` of entry ``entry_id``."""
    return (entry_id << OFFSET_BITS) | index


def position_of(offset: int) -> tuple[int, int]:
    """(entry id, index) of a Kafka offset (the index may name no message)."""
    return offset >> OFFSET_BITS, offset & _INDEX_MASK
