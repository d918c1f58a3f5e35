"""The broker connection: one WebSocket, the request table, the reconnect loop.

A ``Connection`` owns the aiohttp session and, at any time, at most one
``Link`` (one WebSocket and its writer task). Each new link gets a new
generation number ``gen``; producers and consumers remember the generation
they were (re)created on, and write to the socket only while it is current.

Decisions written down here:

* Reconnect: when the socket drops and the client is not closed, the
  supervisor reconnects with a backoff of 0.05 s doubling to 2 s, sends
  CONNECT, then re-creates every open producer and consumer (same ids,
  names, subscription) concurrently. Each of them then re-sends, in order,
  the SEND / ACK frames still awaiting an answer (the broker deduplicates
  sends by sequence id; acks are idempotent). Only then is the connection
  "ready" again for new control requests. CONNECTED.tc_ids (the
  transaction coordinators the broker serves) are kept in ``tc_ids``.
* If re-creating a producer or consumer fails with a retriable error (or
  with PRODUCER_BUSY / CONSUMER_BUSY, for up to ``operation_timeout``: the
  broker may not have noticed the old socket is gone), the whole link is
  dropped and the reconnect starts over. Any other error closes that
  producer or consumer for good, with the error as the ``__cause__`` of its
  ``ClosedError``.
* One wire protocol version, ``PROTOCOL_VERSION``: a broker that announces
  another in CONNECTED is refused (``ProtocolError`` naming both versions),
  as such a broker refuses this client's CONNECT.
* Control requests (partitioned metadata, create producer, subscribe, and
  the coordinator requests NEW_TXN and END_TXN) are retried: on a new
  connection after a drop, and after a backoff on retriable server errors,
  until ``operation_timeout``. They are all safe to repeat (a repeated NEW_TXN
  whose first answer was lost leaves an unused transaction that the
  coordinator times out). Closing a producer or consumer is one attempt:
  if the connection is down or drops, the broker has dropped it anyway. The
  first connection also retries until ``operation_timeout``, then raises
  ``BrokerConnectionError``; but a first connection refused for good (a
  token the broker does not accept: ``AuthenticationError``; a TLS
  certificate the client does not trust: ``BrokerConnectionError`` that is
  not retriable) raises that error at once. Either way it stops trying,
  and the next operation tries again. Only ``close`` closes a connection:
  one that was up and cannot be re-established within an operation
  timeout (its broker down, the event loop starved) fails that operation
  with ``BrokerConnectionError`` (retriable) and keeps reconnecting, the
  client's home one trying each service URL and broker it knows in turn.
* Connect timeout: one connection attempt (opening the socket, CONNECT and
  its answer) may take the operation timeout when the connection has no
  other URL to try (a single broker: nothing else to do but wait), and at
  most ``connect_timeout`` (``Client``'s option, 5 s by default, never
  more than the operation timeout) when it has: a broker that accepts the
  connection and never answers (paused by SIGSTOP: its kernel still
  accepts) is left for the next URL, and the client reaches the rest of
  the service well within its operation timeout. Five seconds: far above
  a live broker's answer to CONNECT (milliseconds, a busy machine's
  hundreds), and short beside the operation timeout (30 s).
* Credentials: a token goes in CONNECT (``auth_method`` "token"); TLS
  (``https://`` and ``txnbufs://`` URLs) uses the SSL context the Client
  made from its CA.
* Transport: ``http(s)://`` URLs open the WebSocket ``/ws``;
  ``txnbuf(s)://host:port`` the broker's stream listener (``client._stream``:
  the same frames on raw TCP, each behind its length). A link runs the same
  on either.
* A cluster (CONNECTED.slots > 0: brokers sharing a database, each
  serving some slots): a client holds one connection per broker
  (``client._brokers``), each with its own ranges of request, producer and
  consumer ids and link generations (``id_base``), so a producer or
  consumer moves from one connection to another keeping its ids and its
  frames awaiting an answer. A control request refused NOT_OWNER is raised
  at once (the topic or coordinator is another broker's: the caller looks
  it up), not retried here. A handler whose re-creation is refused
  NOT_OWNER, and every handler of a connection whose broker cannot be
  reached again, is handed to the ``router`` (``client._brokers``), which
  looks its topic up and moves it to the owner's connection; there it
  re-sends what was not answered, as after a reconnect. A handler handed
  over while the link it is attached on is up (a send or ack refused
  NOT_OWNER) is closed on that link first (CLOSE_PRODUCER /
  CLOSE_CONSUMER, its answer not awaited): the broker would otherwise
  keep it there, refuse its id when the lookup names the same broker
  again ("consumer id in use on this connection", which closes a consumer
  for good), and keep an exclusive subscription or a producer name taken
  from its new connection.
* Timeouts of sends and acks (the hot path) are enforced by one sweeper
  task ticking every ``operation_timeout / 10`` (at most 1 s, at least
  10 ms), not by a timer per message.
* No WebSocket heartbeat: a broker restart closes the TCP connection, which
  is noticed at once; a silent network partition is caught by the
  operation timeouts.
* The reader lets the waiters of the answers it hands out run after every
  ``ANSWERS_IN_A_ROW`` (8) of them, instead of handing out a whole batch
  first: the broker answers the ENDs of transactions committed in one
  group commit together, and a client running many transactions at once
  would otherwise start all the next ones before sending any, and client
  and broker would take turns on whole convoys of transactions instead of
  working at once. Yielding after every answer would wake the broker once
  per transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy as copy_module
import logging
import ssl
import urllib.parse
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar, cast

import aiohttp

from proto import MAX_MESSAGE_SIZE, next_frame
from proto import txnbuf_pb2 as pb

from ._foreign import decoding, socket_errors
from ._stream import STREAM_SCHEMES, StreamSocket, open_stream
from .errors import (
    BrokerConnectionError,
    ClientClosedError,
    ConnectionLostError,
    InvalidInputError,
    NotOwnerError,
    OperationTimeoutError,
    ProducerBusyError,
    ProtocolError,
    TxnbufError,
    from_wire,
)

log = logging.getLogger("client")

T = TypeVar("T")
Command = pb.BaseCommand
Type = pb.BaseCommand.Type

CLIENT_VERSION = "txnbuf-python/0.1.0"
PROTOCOL_VERSION = 7  # the only one spoken (proto/txnbuf.proto)
# Used until the broker's CONNECTED says otherwise (see `proto.MAX_MESSAGE_SIZE`).
DEFAULT_MAX_MESSAGE_SIZE = MAX_MESSAGE_SIZE
BACKOFF_MIN = 0.05
BACKOFF_MAX = 2.0
# Seconds one connection attempt may take while another URL is left to try
# (``Client(connect_timeout=...)``'s default; see the module docstring).
CONNECT_TIMEOUT = 5.0
# The types of the answers to control requests (``Connection.request``).
ANSWERS = frozenset(
    {
        Type.SUCCESS,
        Type.ERROR,
        Type.PRODUCER_SUCCESS,
        Type.PARTITIONED_METADATA_RESPONSE,
        Type.LOOKUP_RESPONSE,
        Type.NEW_TXN_RESPONSE,
        Type.TXN_RESPONSE,
        Type.INIT_PRODUCER_ID_RESPONSE,
        Type.PRODUCER_TXN_RESPONSE,
        # reading by position and transaction groups (client._reader, client._groups)
        Type.READ_ENTRIES_RESPONSE,
        Type.CURSOR_RESPONSE,
        Type.TXN_GROUP_RESPONSE,
        # a Kafka group's offsets at their topic's owner (broker._peers)
        Type.GROUP_CURSORS_RESPONSE,
    }
)
# Answers handed out in a row before the reader yields to their waiters
# (see the module docstring).
ANSWERS_IN_A_ROW = 8
# Answers that report a refusal in an ``error`` field of their own (the
# others are refused with an ERROR frame), by type: the oneof field.
ANSWERS_WITH_ERROR = {
    Type.PARTITIONED_METADATA_RESPONSE: "partitioned_metadata_response",
    Type.NEW_TXN_RESPONSE: "new_txn_response",
    Type.TXN_RESPONSE: "txn_response",
    Type.INIT_PRODUCER_ID_RESPONSE: "init_producer_id_response",
    Type.PRODUCER_TXN_RESPONSE: "producer_txn_response",
    Type.READ_ENTRIES_RESPONSE: "read_entries_response",
    Type.CURSOR_RESPONSE: "cursor_response",
    Type.TXN_GROUP_RESPONSE: "txn_group_response",
    Type.GROUP_CURSORS_RESPONSE: "group_cursors_response",
}


def command(kind: Type, field: str, **fields: object) -> Command:
    """A ``BaseCommand`` with ``type`` and the matching oneof field set."""
    cmd = Command(type=kind)
    inner = getattr(cmd, field)
    inner.SetInParent()
    for name, value in fields.items():
        setattr(inner, name, value)
    return cmd


async def wait_until(awaitable: Awaitable[T], deadline: float, what: str) -> T:
    """Await ``awaitable`` until the loop-time ``deadline``; then raise
    ``OperationTimeoutError`` naming ``what``."""
    try:
        async with asyncio.timeout_at(deadline):
            return await awaitable
    except TimeoutError as exc:
        if isinstance(exc, TxnbufError):
            raise
        raise OperationTimeoutError(f"{what} timed out") from None


async def wait_future_until(future: asyncio.Future[T], deadline: float, what: str) -> T:
    """``wait_until`` for a future that only the caller awaits (the answer to
    a request): at ``deadline`` the future itself fails with
    ``OperationTimeoutError``. One timer, not ``asyncio.timeout``'s context
    manager and task bookkeeping, which cost several microseconds; this
    runs for every control request, several per transaction."""
    timer = future.get_loop().call_at(deadline, _time_out, future, what)
    try:
        return await future
    finally:
        timer.cancel()
        if future.done() and not future.cancelled():
            future.exception()  # seen, even if this task was cancelled meanwhile


def _time_out(future: asyncio.Future[Any], what: str) -> None:
    if not future.done():
        future.set_exception(OperationTimeoutError(f"{what} timed out"))


def _dropped(future: asyncio.Future[Any]) -> None:
    """An answer nobody waits for (`Connection.request_unawaited`)."""
    if not future.cancelled():
        future.exception()  # (retrieved: a lost link fails it, and that is fine)


def copy_error(exc: TxnbufError) -> TxnbufError:
    """A fresh copy of ``exc`` to raise once more (one exception object raised
    in many places would collect all their tracebacks)."""
    copy = copy_module.copy(exc)
    copy.__cause__ = exc.__cause__
    return copy


def fail_all(futures: Iterable[asyncio.Future[Any]], exc: TxnbufError) -> None:
    """Fail every pending future, each with its own copy of ``exc``."""
    for future in futures:
        if not future.done():
            future.set_exception(copy_error(exc))


class Handler(Protocol):
    """What a producer or consumer offers its connection."""

    async def reattach(self, link: Link) -> None:
        """Re-create yourself on a new link and re-send what awaits an answer.
        Raise only retriable errors (the link is then dropped and retried)."""

    def expire(self, now: float) -> None:
        """Fail the operations whose deadline (loop time) is past."""

    def on_disconnect(self) -> None:
        """The link this handler was attached on has died."""

    def fail_request(self, request_id: int, exc: TxnbufError) -> bool:
        """An ERROR answered ``request_id``: fail it if it is yours."""

    async def close(self) -> None:
        """Close for good (the Client closes all its handlers)."""

    @property
    def topic(self) -> str: ...

    @property
    def closed(self) -> bool:
        """Closed for good: nothing to move."""

    def move_to(self, conn: Connection) -> None:
        """Use ``conn`` from now on (``Connection.adopt``)."""

    def leave(self, link: Link) -> None:
        """You are handed over while ``link`` is up: if you are attached on
        it, close yourself there and write nothing more on it: what you
        frame from now on waits for your re-creation (``Connection.hand_over``)."""


class Router(Protocol):
    """Where the handlers of a cluster's connection go when their broker
    does not serve their topic any more (``client._brokers.Brokers``)."""

    @property
    def cluster(self) -> bool:
        """True once a broker said it is one of a cluster's."""

    def relocate(self, handler: Handler) -> None:
        """Look ``handler``'s topic up and move it there (in the background)."""

    def saw_cluster(self, conn: Connection, slots: int) -> None:
        """``conn``'s broker answered CONNECTED with ``slots``."""

    async def lookup(
        self, *, topic: str = "", tc_id: int | None = None, deadline: float | None = None
    ) -> Connection:
        """The connection of the broker serving ``topic`` or coordinator ``tc_id``."""


class ProducerHandler(Handler, Protocol):
    @property
    def producer_id(self) -> int: ...

    def on_receipt(self, receipt: pb.CommandSendReceipt) -> None: ...
    def on_send_error(self, error: pb.CommandSendError) -> None: ...


class ConsumerHandler(Handler, Protocol):
    @property
    def consumer_id(self) -> int: ...

    def on_message(self, message: pb.CommandMessage) -> None: ...
    def on_ack_response(self, response: pb.CommandAckResponse) -> None: ...
    def on_active_change(self, is_active: bool) -> None: ...


class BusyClock:
    """How long the re-creation of a producer or consumer has been refused as
    busy: the broker may still hold the one of the dead socket for a while."""

    def __init__(self) -> None:
        self._since: float | None = None

    def still_waiting(self, now: float, limit: float) -> bool:
        """True while the refusals have lasted less than ``limit`` seconds."""
        if self._since is None:
            self._since = now
        return now - self._since < limit

    def reset(self) -> None:
        self._since = None


# What a link reads and writes: a WebSocket, or a stream (``txnbuf://`` URLs).
Socket = aiohttp.ClientWebSocketResponse | StreamSocket


def stream_address(url: str) -> tuple[str, int, bool] | None:
    """(host, port, TLS?) of a ``txnbuf://`` or ``txnbufs://`` URL; None for
    ``http://`` and ``https://`` (the WebSocket); `InvalidInputError` for
    anything else."""
    scheme, sep, _ = url.partition("://")
    if sep and scheme in ("http", "https"):
        return None
    if not sep or scheme not in STREAM_SCHEMES:
        raise InvalidInputError(
            f"broker url must start with http://, https://, txnbuf:// or txnbufs://, got {url!r}"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError as exc:
        raise InvalidInputError(f"broker url {url!r}: {exc}") from None
    if not host or port is None or parts.path.strip("/") or parts.query:
        raise InvalidInputError(f"a {scheme}:// url is {scheme}://host:port, not {url!r}")
    return host, port, STREAM_SCHEMES[scheme]


class Link:
    """One WebSocket (or stream) of a connection, and the task that writes to it in order.

    The frames queued together go as one BATCH (`proto.next_frame`): a send
    and an ack of one transaction, written in one turn of the loop, cost the
    broker one wake-up, not two."""

    def __init__(self, ws: Socket, gen: int) -> None:
        self.ws = ws
        self.gen = gen
        self.closed = False
        self._out: deque[bytes] = deque()
        self._wake = asyncio.Event()

    def write(self, data: bytes) -> None:
        """Queue one frame; frames go out in the order they are queued. A
        closed link drops it (whoever wrote it re-sends it on the next link)."""
        if not self.closed:
            self._out.append(data)
            self._wake.set()

    async def run_writer(self) -> None:
        out = self._out
        while True:
            await self._wake.wait()
            self._wake.clear()
            while out:
                await self.ws.send_bytes(next_frame(out))


class Connection:
    """The client's connection to one broker. See the module docstring."""

    def __init__(
        self,
        url: str,
        operation_timeout: float,
        token: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        *,
        id_base: int = 0,
        router: Router | None = None,
        fallbacks: list[str] | None = None,
        auth_method: str = "token",
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        """``id_base``: where this connection's request, producer and
        consumer ids and link generations start (the connections of one
        client use disjoint ranges); ``router``: see the module docstring;
        ``fallbacks``: further URLs of the same service to try in turn when
        ``url`` cannot be reached (the client's home connection: the other
        service URLs, and the brokers lookups named); ``auth_method``: what
        CONNECT names ``token`` as (a cluster's brokers talk to each other
        with "cluster", `broker._peers`); ``connect_timeout``: how long one
        connection attempt (the socket and CONNECT's answer) may take while
        there is another URL to try (see the module docstring)."""
        self._stream = stream_address(url)  # (None: the WebSocket)
        for other in fallbacks or ():
            stream_address(other)  # (refused here if it is not a broker's URL)
        self.url = url.rstrip("/")
        self.router = router
        self.slots = 0  # CONNECTED.slots of the last handshake (0: not a cluster)
        self._urls = [self.url, *(u.rstrip("/") for u in fallbacks or ())]
        self._attempt = 0
        self.operation_timeout = operation_timeout
        self.connect_timeout = connect_timeout
        self._token = token
        self._auth_method = auth_method
        self._ssl: ssl.SSLContext | bool = ssl_context if ssl_context is not None else True
        self.max_message_size = DEFAULT_MAX_MESSAGE_SIZE
        self.tc_ids: tuple[int, ...] = ()  # from the last CONNECTED
        self._id_base = id_base
        self.gen = id_base
        self.link: Link | None = None
        self.producers: dict[int, ProducerHandler] = {}
        self.consumers: dict[int, ConsumerHandler] = {}
        self._closed = False
        self._ready = asyncio.Event()
        self._requests: dict[int, asyncio.Future[Command]] = {}
        self._last_request_id = id_base
        self._last_producer_id = id_base
        self._last_consumer_id = id_base
        self._last_error: TxnbufError | None = None
        self._fatal: TxnbufError | None = None  # why the first connection can never succeed
        self._session: aiohttp.ClientSession | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # --- ids and state ----------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def next_request_id(self) -> int:
        """Request ids increase for the client's lifetime, across reconnects,
        so a frame re-sent on a new link can keep its request id."""
        self._last_request_id += 1
        return self._last_request_id

    def next_producer_id(self) -> int:
        self._last_producer_id += 1
        return self._last_producer_id

    def next_consumer_id(self) -> int:
        self._last_consumer_id += 1
        return self._last_consumer_id

    def deadline(self) -> float:
        return asyncio.get_running_loop().time() + self.operation_timeout

    @property
    def links(self) -> int:
        """How many links this connection has had (1 + reconnects so far)."""
        return self.gen - self._id_base

    def add_fallback(self, url: str) -> None:
        """Try ``url`` too when the others cannot be reached."""
        url = url.rstrip("/")
        if url not in self._urls:
            self._urls.append(url)

    def is_current(self, gen: int) -> bool:
        """True while the link of generation ``gen`` is up."""
        return gen == self.gen and self.link is not None

    def write(self, data: bytes) -> None:
        """Queue a frame on the current link (dropped if there is none)."""
        if self.link is not None:
            self.link.write(data)

    # --- lifecycle --------------------------------------------------------

    async def start(self) -> None:
        """Connect, retrying until ``operation_timeout``. Idempotent.

        Never closes the connection (only `close` does): a connection that
        was up before keeps reconnecting in the background after the
        ``BrokerConnectionError``; one that never connected stops trying
        (nothing is left running if the application drops it) and the next
        ``start`` begins again."""
        self.start_background()
        tasks = self._tasks
        try:
            await self.wait_ready(self.deadline(), "connect")
        except OperationTimeoutError:
            cause = self._last_error
            if self.gen == self._id_base:
                await self._stop(tasks)
            raise BrokerConnectionError(
                f"could not connect to {self.url} within {self.operation_timeout} s: {cause}"
            ) from cause
        except TxnbufError:
            if self._fatal is not None:
                await self._stop(tasks)
            raise

    def start_background(self) -> None:
        """Start connecting (and reconnecting) without waiting. Idempotent."""
        if self._closed:
            raise ClientClosedError("the client is closed")
        if not self._tasks:
            self._session = aiohttp.ClientSession()
            self._tasks = [
                asyncio.create_task(self._supervise(), name="txnbuf-connection"),
                asyncio.create_task(self._sweep(), name="txnbuf-sweeper"),
            ]

    @property
    def refused(self) -> TxnbufError | None:
        """Why its first connection was refused for good (authentication,
        TLS, protocol version), if it was: it tries no more until `start`
        or `start_over`."""
        return self._fatal

    async def start_over(self) -> None:
        """Forget a first connection refused for good (`refused`): the next
        `start_background` tries again (the broker may have changed since)."""
        if self._fatal is not None:
            await self._stop(self._tasks)

    async def _stop(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop the first connection attempts of ``tasks`` (if they are still
        this connection's: a later ``start`` may have begun anew) and forget
        why they failed; ``start_background`` starts over."""
        if tasks is not self._tasks or not tasks:
            return
        self._tasks = []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fatal = None
        self._ready.clear()
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    async def close(self) -> None:
        """Stop reconnecting, close the socket and the session. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._ready.set()  # wake waiters: they see the client closed
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_requests(ClientClosedError("the client is closed"))
        if self._session is not None:
            await self._session.close()

    async def wait_ready(self, deadline: float, what: str) -> Link:
        """The current link once it is up and every producer and consumer is
        re-created on it."""
        while True:
            if self._fatal is not None:
                raise copy_error(self._fatal)
            if self._closed:
                raise ClientClosedError("the client is closed")
            if self._ready.is_set() and self.link is not None:
                return self.link
            await wait_until(self._ready.wait(), deadline, what)

    # --- requests ---------------------------------------------------------

    async def request(
        self,
        build: Callable[[int], Command],
        expect: Type,
        what: str,
        deadline: float | None = None,
        *,
        link_bound: bool = True,
    ) -> Command:
        """Send the control request ``build(request_id)`` and return its
        answer, retrying (see the module docstring) until ``deadline`` (loop
        time; default: the operation timeout from now). Raises the mapped
        ``ServerError`` if the broker refuses.

        ``link_bound``: what the answer set up lives and dies with its link
        (a producer, a consumer), so an answer that arrives on a link that
        has died since is thrown away and the request made again. The
        coordinator's requests pass False: a transaction outlives links."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = self.deadline()
        delay = BACKOFF_MIN
        while True:
            link = await self.wait_ready(deadline, what)
            try:
                reply = await self.request_on(link, build, expect, what, deadline)
                if link_bound and link is not self.link:
                    # Answered on a link that has died since: what the broker
                    # set up with it is gone, so do it again.
                    raise ConnectionLostError(f"{what}: connection lost")
                return reply
            except TxnbufError as exc:
                if not exc.retriable or isinstance(exc, OperationTimeoutError | NotOwnerError):
                    raise
                if loop.time() >= deadline:
                    raise OperationTimeoutError(f"{what} timed out: {exc}") from exc
                if not isinstance(exc, ConnectionLostError):
                    log.info("%s: %s; retrying in %.2f s", what, exc, delay)
                    await asyncio.sleep(min(delay, max(0.0, deadline - loop.time())))
                    delay = min(delay * 2, BACKOFF_MAX)

    async def request_on(
        self,
        link: Link,
        build: Callable[[int], Command],
        expect: Type,
        what: str,
        deadline: float,
    ) -> Command:
        """One attempt of a control request on ``link``, no retries: its
        answer (raised if an error)."""
        if link.closed:
            raise ConnectionLostError(f"{what}: connection lost")
        request_id = self.next_request_id()
        future: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        self._requests[request_id] = future
        link.write(build(request_id).SerializeToString())
        try:
            reply = await wait_future_until(future, deadline, what)
        finally:
            self._requests.pop(request_id, None)
        if reply.type == Command.ERROR:  # (see _dispatch: not Type.ERROR)
            raise from_wire(reply.error.error, reply.error.message)
        if reply.type != expect:
            raise ProtocolError(
                f"{what}: expected {Type.Name(expect)}, got {Type.Name(reply.type)}"
            )
        field = ANSWERS_WITH_ERROR.get(reply.type)
        if field is not None:
            answer = getattr(reply, field)
            if answer.HasField("error"):
                raise from_wire(answer.error, answer.message)
        return reply

    def request_unawaited(self, link: Link, build: Callable[[int], Command]) -> None:
        """Write the request ``build(request_id)`` on ``link``; nobody waits
        for its answer, which is dropped whatever it is (an ERROR is not
        logged either)."""
        request_id = self.next_request_id()
        future: asyncio.Future[Command] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_dropped)
        self._requests[request_id] = future
        link.write(build(request_id).SerializeToString())

    def ready_link(self) -> Link | None:
        """The current link if requests may be written on it now."""
        link = self.link
        if self._ready.is_set() and link is not None and not link.closed:
            return link
        return None

    def _fail_requests(self, exc: TxnbufError) -> None:
        requests, self._requests = self._requests, {}
        fail_all(requests.values(), exc)

    # --- the supervisor: connect, re-create, serve, repeat ----------------

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        delay = BACKOFF_MIN
        while not self._closed:
            started = loop.time()
            try:
                await self._serve_one_link()
            except TxnbufError as exc:
                self._last_error = exc
                log.info("connection to %s: %s", self.url, exc)
                if self.gen == self._id_base and not exc.retriable:  # (see the module docstring)
                    self._fatal = exc
                    self._ready.set()
                    return
                if isinstance(exc, BrokerConnectionError):
                    self._unreachable()
            except Exception:
                log.exception("connection to %s failed unexpectedly", self.url)
            if self._closed:
                return
            # A link that lived a while reconnects at once; a failed attempt
            # or a link that died young waits out a doubling backoff.
            if loop.time() - started < BACKOFF_MAX:
                await asyncio.sleep(delay)
                delay = min(delay * 2, BACKOFF_MAX)
            else:
                delay = BACKOFF_MIN

    async def _serve_one_link(self) -> None:
        """Connect, re-create producers and consumers, serve until the link dies."""
        ws = await self._open_socket()
        self.gen += 1
        if self.router is not None:
            self.router.saw_cluster(self, self.slots)
        link = Link(ws, self.gen)
        self.link = link
        reader = asyncio.create_task(self._read(link), name="txnbuf-reader")
        writer = asyncio.create_task(link.run_writer(), name="txnbuf-writer")
        try:
            await self._reattach(link)
            if link.closed:
                raise ConnectionLostError("connection lost while re-creating producers/consumers")
            self._ready.set()
            log.info("connected to %s (link %d)", self.url, link.gen)
            await asyncio.wait([reader, writer], return_when=asyncio.FIRST_COMPLETED)
        finally:
            await self._drop(link, reader, writer)

    async def _open_socket(self) -> Socket:
        """Open the WebSocket (or the stream) and do the CONNECT / CONNECTED handshake."""
        assert self._session is not None
        ws: Socket | None = None
        if not self._ready.is_set() and self.link is None and len(self._urls) > 1:
            # (Home: the next service URL after a failed attempt.)
            self.url = self._urls[self._attempt % len(self._urls)]
            self._attempt += 1
            self._stream = stream_address(self.url)
        try:
            with socket_errors():
                async with asyncio.timeout(self.attempt_timeout()):
                    if self._stream is not None:
                        host, port, tls = self._stream
                        ws = await open_stream(host, port, self._ssl if tls else False)
                    else:
                        ws = await self._session.ws_connect(
                            self.url + "/ws",
                            max_msg_size=0,
                            timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=2.0),
                            ssl=self._ssl,
                        )
                    hello = command(
                        Type.CONNECT,
                        "connect",
                        client_version=CLIENT_VERSION,
                        protocol_version=PROTOCOL_VERSION,
                    )
                    if self._token:
                        hello.connect.auth_method = self._auth_method
                        hello.connect.auth_data = self._token.encode()
                    await ws.send_bytes(hello.SerializeToString())
                    msg = await ws.receive()
            if msg.type != aiohttp.WSMsgType.BINARY:
                raise BrokerConnectionError(f"socket closed during handshake ({msg.type.name})")
            with decoding("CONNECTED"):
                reply = Command.FromString(msg.data)
            if reply.type == Type.ERROR:
                raise from_wire(reply.error.error, reply.error.message)
            if reply.type != Type.CONNECTED:
                raise ProtocolError(f"expected CONNECTED, got {Type.Name(reply.type)}")
            if reply.connected.protocol_version != PROTOCOL_VERSION:
                raise ProtocolError(
                    f"the broker at {self.url} ({reply.connected.server_version}) speaks wire "
                    f"protocol version {reply.connected.protocol_version}; this client "
                    f"({CLIENT_VERSION}) speaks version {PROTOCOL_VERSION} only"
                )
        except BaseException:
            if ws is not None:
                await ws.close()
            raise
        if reply.connected.max_message_size > 0:
            self.max_message_size = reply.connected.max_message_size
        self.tc_ids = tuple(reply.connected.tc_ids)
        self.slots = reply.connected.slots
        return ws

    def attempt_timeout(self) -> float:
        """How long one connection attempt may take: the operation timeout
        when there is no other URL to try, else at most ``connect_timeout``
        (a broker that accepts the connection and never answers, e.g. a
        paused one, is left for the next URL; see the module docstring)."""
        if len(self._urls) > 1:
            return min(self.connect_timeout, self.operation_timeout)
        return self.operation_timeout

    async def _reattach(self, link: Link) -> None:
        handlers: list[Handler] = [*self.producers.values(), *self.consumers.values()]
        if not handlers:
            return
        results = await asyncio.gather(
            *(handler.reattach(link) for handler in handlers), return_exceptions=True
        )
        failed: BaseException | None = None
        for handler, result in zip(handlers, results, strict=True):
            if isinstance(result, NotOwnerError) and self.router is not None:
                self.hand_over(handler)  # (its topic is another broker's now)
            elif isinstance(result, BaseException) and failed is None:
                failed = result
        if failed is not None:
            raise failed

    # --- a cluster: handlers moving between connections -----------------------

    def hand_over(self, handler: Handler) -> None:
        """Take ``handler`` off this connection and give it to the router,
        which looks its topic up and moves it to the owner's connection."""
        if self.router is None:
            return
        link = self.link
        if link is not None and not link.closed:
            handler.leave(link)  # (see the module docstring)
        self._unregister(handler)
        handler.on_disconnect()
        self.router.relocate(handler)

    def _unreachable(self) -> None:
        """A connection attempt failed: in a cluster, the handlers go to
        whichever broker serves their topics now (this one may be dead,
        its slots taken over by others)."""
        if self.router is None or not self.router.cluster:
            return
        for handler in [*self.producers.values(), *self.consumers.values()]:
            self.hand_over(handler)

    async def adopt(self, handler: Handler) -> bool:
        """Take ``handler`` (moved here from another connection): register
        it and re-create it on the current link, which re-sends what awaits
        an answer. False (not taken) if there is no link now or the broker
        does not serve its topic."""
        link = self.ready_link()
        if link is None or self._closed:
            return False
        handler.move_to(self)
        self._register(handler)
        try:
            await handler.reattach(link)
        except TxnbufError as exc:
            if link.closed and not isinstance(exc, NotOwnerError):
                return True  # (registered: re-created on the next link)
            self._unregister(handler)
            log.info("%r not taken at %s (link %d): %s", handler, self.url, link.gen, exc)
            # (PRODUCER_BUSY: the broker still holds the producer on a
            # connection it has not closed yet, e.g. one it closes once it
            # has dropped everything; the producer's own re-creation gives up
            # after its wait for that, and then the producer is closed.)
            if not exc.retriable and not isinstance(exc, ProducerBusyError):
                raise
            return False
        if handler.closed:
            self._unregister(handler)
        return True

    def _register(self, handler: Handler) -> None:
        if hasattr(handler, "on_receipt"):
            producer = cast(ProducerHandler, handler)
            self.producers[producer.producer_id] = producer
        else:
            consumer = cast(ConsumerHandler, handler)
            self.consumers[consumer.consumer_id] = consumer

    def _unregister(self, handler: Handler) -> None:
        for table in (self.producers, self.consumers):
            for key, value in list(table.items()):
                if value is handler:
                    del table[key]

    async def _drop(
        self, link: Link, reader: asyncio.Task[None], writer: asyncio.Task[None]
    ) -> None:
        self._lost(link)
        for task in (reader, writer):
            task.cancel()
        for task in (reader, writer):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        with contextlib.suppress(Exception):
            await link.ws.close()

    def _lost(self, link: Link) -> None:
        """The link is dead: nothing may be written to it any more."""
        if link.closed:
            return
        link.closed = True
        if self.link is link:
            self.link = None
            self._ready.clear()
            log.info("connection to %s lost (link %d)", self.url, link.gen)
        self._fail_requests(ConnectionLostError("connection to the broker lost"))
        for handler in (*self.producers.values(), *self.consumers.values()):
            handler.on_disconnect()

    async def _read(self, link: Link) -> None:
        ws = link.ws
        binary = aiohttp.WSMsgType.BINARY
        in_a_row = 0  # answers handed out since the reader last yielded
        try:
            while True:
                msg = await ws.receive()
                if msg.type == binary:
                    try:
                        with decoding("frame"):
                            cmd = Command.FromString(msg.data)
                    except Exception:
                        log.exception("failed to decode a frame from the broker")
                        continue
                    for one in cmd.batch.commands if cmd.type == Command.BATCH else (cmd,):
                        try:
                            self._dispatch(one)
                        except Exception:
                            log.exception("failed to handle a frame from the broker")
                        if one.type in ANSWERS:
                            in_a_row += 1
                            if in_a_row == ANSWERS_IN_A_ROW:
                                in_a_row = 0
                                await asyncio.sleep(0)  # (their waiters run, and write)
                elif msg.type in (
                    aiohttp.WSMsgType.CLOSE,
                    aiohttp.WSMsgType.CLOSING,
                    aiohttp.WSMsgType.CLOSED,
                    aiohttp.WSMsgType.ERROR,
                ):
                    return
                else:
                    log.warning("ignoring a %s frame from the broker", msg.type.name)
        finally:
            self._lost(link)

    def _dispatch(self, cmd: Command) -> None:
        # Command.X, not Type.X: the enum wrapper's attributes cost a Python
        # call each (a microsecond), the message class's are plain ints.
        kind = cmd.type
        if kind == Command.SEND_RECEIPT:
            receipt = cmd.send_receipt
            producer = self.producers.get(receipt.producer_id)
            if producer is not None:
                producer.on_receipt(receipt)
        elif kind == Command.MESSAGE:
            message = cmd.message
            consumer = self.consumers.get(message.consumer_id)
            if consumer is not None:
                consumer.on_message(message)
        elif kind == Command.ACK_RESPONSE:
            response = cmd.ack_response
            consumer = self.consumers.get(response.consumer_id)
            if consumer is not None:
                consumer.on_ack_response(response)
        elif kind == Command.SEND_ERROR:
            producer = self.producers.get(cmd.send_error.producer_id)
            if producer is not None:
                producer.on_send_error(cmd.send_error)
        elif kind in ANSWERS:
            self._on_answer(cmd)
        elif kind == Command.ACTIVE_CONSUMER_CHANGE:
            change = cmd.active_consumer_change
            consumer = self.consumers.get(change.consumer_id)
            if consumer is not None:
                consumer.on_active_change(change.is_active)
        elif kind == Command.PING:
            self.write(command(Type.PONG, "pong").SerializeToString())
        elif kind != Command.PONG:
            log.warning("ignoring an unexpected %s frame", Type.Name(kind))

    def _on_answer(self, cmd: Command) -> None:
        field = cmd.WhichOneof("command")
        if field is None:
            log.warning("ignoring a %s frame without its body", Type.Name(cmd.type))
            return
        request_id: int = getattr(cmd, field).request_id
        future = self._requests.pop(request_id, None)
        if future is not None:
            if not future.done():
                future.set_result(cmd)
            return
        if cmd.type != Type.ERROR:
            log.debug("ignoring a late %s for request %d", Type.Name(cmd.type), request_id)
            return
        exc = from_wire(cmd.error.error, cmd.error.message)
        if request_id == 0:
            log.warning("the broker complains about this connection: %s", exc)
            return
        for handler in (*self.producers.values(), *self.consumers.values()):
            if handler.fail_request(request_id, exc):
                return
        log.warning("error for unknown request %d: %s", request_id, exc)

    # --- timeouts ---------------------------------------------------------

    async def _sweep(self) -> None:
        loop = asyncio.get_running_loop()
        interval = min(max(self.operation_timeout / 10, 0.01), 1.0)
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for handler in (*self.producers.values(), *self.consumers.values()):
                try:
                    handler.expire(now)
                except Exception:
                    log.exception("expiring timed-out operations failed")
