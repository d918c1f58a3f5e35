"""The data plane on a raw TCP port, beside the WebSocket (``--stream-port``).

The same `Connection` serves both: the same `BaseCommand` frames (each
behind its length on the stream, `proto.stream_frame`), the same CONNECT
with its token, the same permission checks on every command, TLS with the
broker's certificate when it serves TLS. What the stream saves is the
WebSocket's framing and aiohttp's machinery around it: frames are cut
from what the socket read, in the protocol's callback, and handed to the
connection at once (no reader task, no message objects).

A frame longer than the WebSocket would take (`proto.MAX_MESSAGE_SIZE` +
`proto.FRAME_SLACK`) closes the connection, as the WebSocket's limit does.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from typing import cast

from broker._broker import Broker
from broker._connection import Connection
from proto import (
    FRAME_SLACK,
    MAX_MESSAGE_SIZE,
    FramedStream,
    FrameTooLargeError,
    StreamFrames,
    stream_frame,
)

__all__ = ["StreamListener"]

log = logging.getLogger(__name__)

LINGER = 5.0  # seconds a closed connection waits for the client to close its end


class StreamListener:
    """Serve the data plane for ``broker`` on ``host``:``port`` (`start`,
    `close`); TLS with ``ssl_context`` if given. ``advertised_host``: the
    host of the ``txnbuf://`` URL its connections name in LOOKUP's CONNECT
    answers (``--advertised-url``'s host; default ``host``)."""

    def __init__(
        self,
        broker: Broker,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        advertised_host: str | None = None,
    ) -> None:
        self.broker = broker
        self.host = host
        self.advertised_host = advertised_host or host  # (in the URL its connections name)
        self.port = port
        self.ssl_context = ssl_context
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        scheme = "txnbufs" if self.ssl_context is not None else "txnbuf"
        self._server = await loop.create_server(
            lambda: StreamSocket(self.broker, f"{scheme}://{self.advertised_host}:{self.port}"),
            self.host,
            self.port,
            ssl=self.ssl_context,
            reuse_address=True,
        )
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
        log.info("stream listener on %s:%d", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()


class StreamSocket(FramedStream):
    """One client on the stream listener: what `Connection` needs of a
    WebSocket (``send_bytes``, ``close``, ``closed``, from `FramedStream`),
    and the frames read handed to it as they come (`Connection.run_fed`)."""

    def __init__(self, broker: Broker, url: str) -> None:
        super().__init__()
        self.broker = broker
        self.url = url
        self._frames = StreamFrames(MAX_MESSAGE_SIZE + FRAME_SLACK)
        self._conn: Connection | None = None
        self._serving: asyncio.Task[None] | None = None  # (its `Connection.run_fed`)
        self._gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        conn = Connection.admit(self.broker, self, f"stream {name}", self.url)
        if isinstance(conn, bytes):  # (refused: over --max-connections)
            cast(asyncio.Transport, transport).write(stream_frame(conn))
            self._close()
            return
        self._conn = conn
        self._serving = asyncio.get_running_loop().create_task(conn.run_fed(self._gone))

    def data_received(self, data: bytes) -> None:
        conn = self._conn
        if conn is None or self.closed:
            return
        try:
            frames = self._frames.feed(data)
        except FrameTooLargeError as exc:
            log.info("%s: %s; closing it", conn.peer, exc)
            self._close()
            return
        for frame in frames:
            conn.on_frame(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        if not self._gone.done():
            self._gone.set_result(None)

    def _close(self) -> None:
        """Stop reading and writing; the socket closes once the client has
        read what was written (it closes its end, or `LINGER` seconds pass).
        Closing at once with the client's frames unread would reset the
        connection, and the client could lose the answer that says why."""
        transport = self._transport
        if self.closed or transport is None:
            self.closed = True
            return
        self.closed = True
        if transport.can_write_eof():
            transport.write_eof()
            asyncio.get_running_loop().call_later(LINGER, transport.close)
        else:  # (TLS: no half-close)
            transport.close()
