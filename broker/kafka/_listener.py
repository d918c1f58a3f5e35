"""The Kafka listener: Kafka's framing over asyncio TCP, one task per connection.

A connection reads size-prefixed request frames, hands each to its handler
(`broker.kafka._handlers`) as it arrives, and writes the responses in
request order (Kafka's clients match them by order), each as soon as it
and the ones before it are ready. A request that does not decode, or an
API or version this listener does not serve, closes the connection, as
Kafka does -- except ApiVersions at a version it does not serve, which is
answered (v0 body, UNSUPPORTED_VERSION, the versions served) so that the
client can pick one.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from broker.kafka._codec import (
    Api,
    KafkaRequestError,
    RequestHeader,
    build,
    encode_response,
    read_request,
)
from broker.kafka._handlers import UNSUPPORTED_VERSION, KafkaApis
from ledger import faults

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = ["KafkaListener"]

log = logging.getLogger(__name__)

MAX_REQUEST_SIZE = 100 << 20  # bytes in one request frame (Kafka's socket.request.max.bytes)
_SIZE = struct.Struct(">i")
# Crash tests' steps (`ledger.faults`): right after an answer to the API went out.
_ANSWERED: dict[int, str] = {api: f"kafka.after_answer.{api.name.lower()}" for api in Api}


class KafkaListener:
    """Serve the Kafka protocol for ``broker`` on ``host``:``port``
    (`start`, `close`); ``advertised_host`` is the address clients are told
    to connect to (the listening one, or 127.0.0.1 for a wildcard)."""

    def __init__(
        self, broker: Broker, host: str, port: int, advertised_host: str | None = None
    ) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        if advertised_host is None:
            advertised_host = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        self.advertised_host = advertised_host
        self.apis: KafkaApis | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
        self.apis = KafkaApis(self.broker, self.advertised_host, self.port)
        log.info("Kafka listener on %s:%d", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self.apis is not None:
            self.apis.close()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None and self.apis is not None
        self._connections.add(task)
        peer = writer.get_extra_info("peername")
        try:
            await _Connection(self.apis, reader, writer, peer).run()
        except asyncio.CancelledError:
            # (`close`: the connection task ends quietly. Ended cancelled, its
            # done-callback in Python 3.11's asyncio.streams would log the
            # CancelledError as an error.)
            pass
        finally:
            self._connections.discard(task)


class _Connection:
    def __init__(
        self,
        apis: KafkaApis,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        peer: Any,
    ) -> None:
        self.apis = apis
        self.reader = reader
        self.writer = writer
        self.peer = peer
        # (API, its answer) in request order; None: no more
        self._answers: asyncio.Queue[tuple[int, asyncio.Future[bytes | None]] | None] = (
            asyncio.Queue()
        )

    async def run(self) -> None:
        writing = asyncio.ensure_future(self._write_loop())
        try:
            await self._read_loop()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except KafkaRequestError as exc:
            log.warning("Kafka connection %s: %s; closing it", self.peer, exc)
        finally:
            self._answers.put_nowait(None)
            try:
                await writing
            except (ConnectionError, asyncio.CancelledError):
                pass
            finally:
                writing.cancel()
                self.writer.close()

    async def _read_loop(self) -> None:
        reader = self.reader
        while True:
            (size,) = _SIZE.unpack(await reader.readexactly(4))
            if not 0 < size <= MAX_REQUEST_SIZE:
                raise KafkaRequestError(f"a request frame of {size} bytes")
            frame = await reader.readexactly(size)
            header, body = read_request(frame)
            if body is None:
                if header.api_key != Api.API_VERSIONS:
                    raise KafkaRequestError(
                        f"API {header.api_key} v{header.api_version} is not served here"
                    )
                body_v0 = build(
                    Api.API_VERSIONS, 0, KafkaApis.api_versions_body(UNSUPPORTED_VERSION)
                )
                self._ready(Api.API_VERSIONS, encode_response(header, Api.API_VERSIONS, 0, body_v0))
                continue
            self._answer(header, body)

    def _ready(self, api: int, frame: bytes | None) -> None:
        done: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        done.set_result(frame)
        self._answers.put_nowait((api, done))

    def _answer(self, header: RequestHeader, body: Any) -> None:
        handler = self.apis.handler(header.api_key)
        result = handler(body, header.api_version)
        if result is None:  # (a Produce with acks=0 is not answered)
            return
        api = header.api_key
        if isinstance(result, dict):
            self._ready(api, _encode(header, result))
            return
        self._answers.put_nowait((api, asyncio.ensure_future(_encoded(header, result))))

    async def _write_loop(self) -> None:
        while True:
            answer = await self._answers.get()
            if answer is None:
                return
            api, pending = answer
            try:
                frame = await pending
            except Exception:
                log.exception("Kafka connection %s: a request failed; closing it", self.peer)
                self.writer.close()
                return
            if frame is not None:
                self.writer.write(frame)
                faults.hit(_ANSWERED[api])
                if self._answers.empty():
                    await self.writer.drain()


def _encode(header: RequestHeader, data: dict[str, Any]) -> bytes:
    body = build(header.api_key, header.api_version, data)
    return encode_response(header, header.api_key, header.api_version, body)


async def _encoded(header: RequestHeader, pending: Awaitable[dict[str, Any]]) -> bytes:
    return _encode(header, await pending)
