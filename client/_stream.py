"""The client's end of the broker's stream listener (``txnbuf://`` and
``txnbufs://`` URLs): the WebSocket's frames on raw TCP, each behind its
length (`proto.stream_frame`), TLS for ``txnbufs://``.

`StreamSocket` offers what the connection uses of aiohttp's WebSocket
(``receive``, ``send_bytes``, ``close``, ``closed``), so that a `Link` runs
the same on either.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import cast

import aiohttp

from proto import FrameTooLargeError, StreamFrames, stream_frame

__all__ = ["STREAM_SCHEMES", "StreamSocket", "open_stream"]

# URL scheme -> does it use TLS?
STREAM_SCHEMES = {"txnbuf": False, "txnbufs": True}
NO_LIMIT = (1 << 32) - 1  # (the broker's frames are as large as they are: as aiohttp's 0)

_BINARY = aiohttp.WSMsgType.BINARY
_CLOSED = aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None)


class StreamSocket(asyncio.Protocol):
    """One connection to a broker's stream listener."""

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._frames = StreamFrames(NO_LIMIT)
        self._ready: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._writable: asyncio.Future[None] | None = None
        self._eof = False
        self.closed = False

    # -- the protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses)
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._ready.extend(self._frames.feed(data))
        except FrameTooLargeError:  # (cannot happen with NO_LIMIT: a broken stream)
            self._close()
        self._wake()

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = self.closed = True
        self._wake()
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def pause_writing(self) -> None:
        if self._writable is None or self._writable.done():
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._writable is not None and not self._writable.done():
            self._writable.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- what the connection uses of a WebSocket ------------------------------------

    async def receive(self) -> aiohttp.WSMessage:
        """The next frame (a BINARY message), or a CLOSED one once the
        connection is gone."""
        ready = self._ready
        while not ready:
            if self._eof:
                return _CLOSED
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return aiohttp.WSMessage(_BINARY, ready.popleft(), None)

    async def send_bytes(self, data: bytes) -> None:
        if self.closed or self._transport is None:
            raise ConnectionResetError("the connection to the broker is closed")
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


async def open_stream(host: str, port: int, tls: ssl.SSLContext | bool) -> StreamSocket:
    """Connect to a stream listener (``tls``: False, True for the system's
    trusted CAs, or a context)."""
    loop = asyncio.get_running_loop()
    _, socket = await loop.create_connection(
        StreamSocket, host, port, ssl=tls or None, server_hostname=host if tls else None
    )
    return socket
