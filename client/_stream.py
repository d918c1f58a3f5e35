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

import aiohttp

from proto import FramedStream, FrameTooLargeError, StreamFrames

__all__ = ["STREAM_SCHEMES", "StreamSocket", "open_stream"]

# URL scheme -> does it use TLS?
STREAM_SCHEMES = {"txnbuf": False, "txnbufs": True}
NO_LIMIT = (1 << 32) - 1  # (the broker's frames are as large as they are: as aiohttp's 0)

_BINARY = aiohttp.WSMsgType.BINARY
_CLOSED = aiohttp.WSMessage(aiohttp.WSMsgType.CLOSED, None, None)


class StreamSocket(FramedStream):
    """One connection to a broker's stream listener."""

    CLOSED_MESSAGE = "the connection to the broker is closed"

    def __init__(self) -> None:
        super().__init__()
        self._frames = StreamFrames(NO_LIMIT)
        self._ready: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._eof = False

    def data_received(self, data: bytes) -> None:
        try:
            self._ready.extend(self._frames.feed(data))
        except FrameTooLargeError:  # (cannot happen with NO_LIMIT: a broken stream)
            self._close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._eof = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

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


async def open_stream(host: str, port: int, tls: ssl.SSLContext | bool) -> StreamSocket:
    """Connect to a stream listener (``tls``: False, True for the system's
    trusted CAs, or a context)."""
    loop = asyncio.get_running_loop()
    _, socket = await loop.create_connection(
        StreamSocket, host, port, ssl=tls or None, server_hostname=host if tls else None
    )
    return socket
