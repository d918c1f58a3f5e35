"""Frames of several commands (`CommandBatch`), built without re-encoding them."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from proto import txnbuf_pb2 as pb

__all__ = ["BATCH_MAX_BYTES", "batch_frame", "next_frame"]

BATCH_MAX_BYTES = 1 << 16  # frames joined into one BATCH at most; a bigger one goes alone


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


_VARINT, _LEN = 0, 2
_TYPE = _tag(1, _VARINT) + _varint(pb.BaseCommand.BATCH)  # BaseCommand.type
_BODY_TAG = _tag(pb.BaseCommand.BATCH_FIELD_NUMBER, _LEN)  # BaseCommand.batch
_COMMAND_TAG = _tag(pb.CommandBatch.COMMANDS_FIELD_NUMBER, _LEN)  # CommandBatch.commands


def batch_frame(frames: Sequence[bytes]) -> bytes:
    """One BATCH `BaseCommand` carrying ``frames`` (each a serialized
    `BaseCommand`, not a batch), in order: the bytes `SerializeToString`
    would give, made by concatenation."""
    parts: list[bytes] = []
    for frame in frames:
        parts += (_COMMAND_TAG, _varint(len(frame)), frame)
    body = b"".join(parts)
    return b"".join((_TYPE, _BODY_TAG, _varint(len(body)), body))


def next_frame(out: deque[bytes]) -> bytes:
    """The next WebSocket message to write from the queue ``out`` of
    serialized commands: the first alone, or, when more are queued, a BATCH
    of as many as fit in `BATCH_MAX_BYTES` (one write and one wake-up on
    each side instead of one per command)."""
    frame = out.popleft()
    if not out or len(frame) + len(out[0]) > BATCH_MAX_BYTES:
        return frame
    frames, size = [frame], len(frame)
    while out and size + len(out[0]) <= BATCH_MAX_BYTES:
        frame = out.popleft()
        frames.append(frame)
        size += len(frame)
    return batch_frame(frames)
