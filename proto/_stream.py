"""The data plane's frames on a byte stream (TCP, or TLS over TCP).

The WebSocket carries one `BaseCommand` per message; a stream carries the
same frames, each behind its length: 4 bytes, big-endian (network order),
then that many bytes of one serialized `BaseCommand` (a BATCH as on the
WebSocket). Nothing else: CONNECT is the first frame either way.
"""

from __future__ import annotations

import asyncio
import struct
from typing import cast

__all__ = ["FrameTooLargeError", "FramedStream", "StreamFrames", "stream_frame"]

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


class FramedStream(asyncio.Protocol):
    """What both ends of a stream connection share: the transport, writes
    of whole frames that wait while the transport's buffer is full
    (``send_bytes``, as a WebSocket's), and the ``closed`` flag. Each end
    reads its own way (``data_received``) and may close more gently
    (``_close``)."""

    CLOSED_MESSAGE = "the connection is closed"

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._writable: asyncio.Future[None] | None = None  # while the transport is paused
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses)
        self._transport = cast(asyncio.Transport, transport)

    def eof_received(self) -> bool:
        return False  # (close the transport: the other end is done)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    async def send_bytes(self, data: bytes) -> None:
        """Write one frame; wait while the transport's buffer is full."""
        if self.closed or self._transport is None:
            raise ConnectionResetError(self.CLOSED_MESSAGE)
        self._transport.write(stream_frame(data))
        if self._writable is not None and not self._writable.done():
            await self._writable

    async def close(self) -> bool:
        self._close()
        return True

    def _close(self) -> None:
        self.closed = True
        if self._transport is not None:
            self._transport.close()
