"""The data plane's frames on a byte stream (TCP, or TLS over TCP).

The WebSocket carries one `BaseCommand` per message; a stream carries the
same frames, each behind its length: 4 bytes, big-endian (network order),
then that many bytes of one serialized `BaseCommand` (a BATCH as on the
WebSocket). Nothing else: CONNECT is the first frame either way.
"""

from __future__ import annotations

import struct

__all__ = ["FrameTooLargeError", "StreamFrames", "stream_frame"]

_LENGTH = struct.Struct(">I")
_HEADER = _LENGTH.size


def stream_frame(data: bytes) -> bytes:
    """``data`` (a serialized command) as it goes on a stream."""
    return _LENGTH.pack(len(data)) + data


class FrameTooLargeError(Exception):
    """A frame's length is over the reader's limit (or the stream is not
    speaking this protocol: an HTTP request's first bytes read as a length
    of about a gigabyte)."""


class StreamFrames:
    """Cuts the bytes read from a stream into frames of at most ``limit``
    bytes each."""

    __slots__ = ("_buffer", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The frames complete once ``data`` is added (the start of a frame
        still arriving is kept); `FrameTooLargeError` for a frame over the
        limit (the stream can't be read further)."""
        buffer = self._buffer
        if not buffer and len(data) >= _HEADER:  # (usually: whole frames, nothing kept)
            (n,) = _LENGTH.unpack_from(data)
            if len(data) == _HEADER + n:
                if n > self.limit:
                    raise FrameTooLargeError(f"a frame of {n:,} bytes (at most {self.limit:,})")
                return [data[_HEADER:]]
        buffer += data
        frames: list[bytes] = []
        pos, size = 0, len(buffer)
        while size - pos >= _HEADER:
            (n,) = _LENGTH.unpack_from(buffer, pos)
            if n > self.limit:
                raise FrameTooLargeError(f"a frame of {n:,} bytes (at most {self.limit:,})")
            end = pos + _HEADER + n
            if end > size:
                break
            frames.append(bytes(buffer[pos + _HEADER : end]))
            pos = end
        del buffer[:pos]
        return frames
