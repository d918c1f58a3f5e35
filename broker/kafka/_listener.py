"""The Kafka listener: Kafka's framing over asyncio TCP, one task per connection.

A connection reads size-prefixed request frames, hands each to its handler
(`broker.kafka._handlers`) as it arrives, and writes the responses in
request order (Kafka's clients match them by order), each as soon as it
and the ones before it are ready. A request that does not decode, or an
API or version this listener does not serve, closes the connection, as
Kafka does -- except ApiVersions at a version it does not serve, which is
answered (v0 body, UNSUPPORTED_VERSION, the versions served) so that the
client can pick one.

Security follows the broker's own port: at most ``--max-connections``
connections (one more is closed at once), and with its TLS certificate the
listener serves TLS (Kafka's SSL, or SASL_SSL with authentication), and
when the broker authenticates, each connection authenticates with SASL
before anything else (`broker.kafka._session`): a request before that
closes the connection, as does a failed SaslAuthenticate (once its answer
is out) and the expiry of the token it authenticated with.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
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
from broker.kafka._session import KafkaSession
from ledger import faults

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = ["KafkaListener", "default_advertised_host"]

log = logging.getLogger(__name__)

FAILED_AUTHENTICATION_DELAY = 0.1  # seconds before a failed SASL exchange's connection closes
MAX_REQUEST_SIZE = 100 << 20  # bytes in one request frame (Kafka's socket.request.max.bytes)
_SIZE = struct.Struct(">i")
# Crash tests' steps (`ledger.faults`): right after an answer to the API went out.
_ANSWERED: dict[int, str] = {api: f"kafka.after_answer.{api.name.lower()}" for api in Api}
# What a connection may send before it has authenticated.
_BEFORE_AUTHENTICATION = frozenset({Api.API_VERSIONS, Api.SASL_HANDSHAKE, Api.SASL_AUTHENTICATE})


def default_advertised_host(host: str) -> str:
    """The address Kafka clients are told to reach a listener on ``host`` at
    when ``--kafka-advertised-host`` is not given: ``host``, or 127.0.0.1
    for a wildcard address; an IPv6 address bare (Metadata's host field)."""
    host = host.removeprefix("[").removesuffix("]")
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


class KafkaListener:
    """Serve the Kafka protocol for ``broker`` on ``host``:``port``
    (`start`, `close`); ``advertised_host`` is the address clients are told
    to connect to (the listening one, or 127.0.0.1 for a wildcard);
    ``ssl_context``: serve TLS."""

    def __init__(
        self,
        broker: Broker,
        host: str,
        port: int,
        advertised_host: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.ssl_context = ssl_context
        self.advertised_host = (
            (advertised_host or default_advertised_host(host)).removeprefix("[").removesuffix("]")
        )  # (bare: Metadata's host field)
        self.apis: KafkaApis | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, self.host, self.port, ssl=self.ssl_context
        )
        if self.port == 0:
            self.port = self._server.sockets[0].getsockname()[1]
        self.apis = KafkaApis(self.broker, self.advertised_host, self.port)
        log.info("Kafka listener on %s:%d (%s)", self.host, self.port, self.security_protocol)

    @property
    def security_protocol(self) -> str:
        """Kafka's name for what this listener speaks (a client's
        ``security_protocol`` / ``security.protocol``)."""
        sasl = self.broker.security.enabled
        if self.ssl_context is not None:
            return "SASL_SSL" if sasl else "SSL"
        return "SASL_PLAINTEXT" if sasl else "PLAINTEXT"

    def stop_accepting(self) -> None:
        """Take no new connection (the open ones go on)."""
        if self._server is not None:
            self._server.close()

    async def close(self) -> None:
        self.stop_accepting()
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
        peer = writer.get_extra_info("peername")
        limit = self.broker.security.limits.max_connections
        if len(self._connections) >= limit:
            # (Kafka's protocol has no answer before a request: the connection
            # is closed, and the client tries again, as after Kafka's own
            # max.connections)
            log.warning(
                "Kafka connection %s refused: %d connections open, the limit "
                "(--max-connections %d)",
                peer,
                len(self._connections),
                limit,
            )
            writer.close()
            return
        self._connections.add(task)
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
        self.session = KafkaSession(apis.broker.security, peer, on_expiry=self._hang_up)
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
            self.session.close()
            self._answers.put_nowait(None)
            try:
                await writing
                if self.session.closing:
                    # (a failed SASL exchange: its answer is out; closing it
                    # a little later lets the client read it first, and slows
                    # a client that retries bad credentials, as Kafka's
                    # connection.failed.authentication.delay.ms does)
                    await asyncio.sleep(FAILED_AUTHENTICATION_DELAY)
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
            if not self.session.authenticated and header.api_key not in _BEFORE_AUTHENTICATION:
                log.info(
                    "Kafka connection %s: %s before SASL authentication (this broker "
                    "authenticates: SASL_PLAINTEXT or SASL_SSL with PLAIN or OAUTHBEARER); "
                    "closing it",
                    self.peer,
                    _name(header.api_key),
                )
                return
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
            if self.session.closing:  # (a failed SASL exchange: its answer, then the end)
                return

    def _hang_up(self) -> None:
        """Close the connection now (its token expired)."""
        self.writer.close()

    def _ready(self, api: int, frame: bytes | None) -> None:
        done: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
        done.set_result(frame)
        self._answers.put_nowait((api, done))

    def _answer(self, header: RequestHeader, body: Any) -> None:
        handler = self.apis.handler(header.api_key)
        self.session.client_id = header.client_id or ""
        result = handler(body, header.api_version, self.session)
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


def _name(api_key: int) -> str:
    try:
        return Api(api_key).name
    except ValueError:
        return f"API {api_key}"


def _encode(header: RequestHeader, data: dict[str, Any]) -> bytes:
    body = build(header.api_key, header.api_version, data)
    return encode_response(header, header.api_key, header.api_version, body)


async def _encoded(header: RequestHeader, pending: Awaitable[dict[str, Any]]) -> bytes:
    return _encode(header, await pending)
