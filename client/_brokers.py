"""The connections of one Client: one per broker, and where each topic lives.

A client is given one service URL or several (a list, or one string with
commas, as Pulsar's service URLs). Its *home* connection goes to the first
that answers (trying the others, and every broker a lookup named, in turn
when it cannot be reached); everything that is not routed goes there.

A single broker (CONNECTED.slots is 0) serves every topic and coordinator
itself: nothing is looked up, the home connection carries everything, as a
client of one broker always did (no extra round trip).

A cluster (CONNECTED.slots > 0: brokers sharing a database, each serving
the topics and coordinators of some slots) is Pulsar's lookup: before a
producer or consumer is created, its topic is looked up (LOOKUP at the home
broker): CONNECT (served there: the home connection) or REDIRECT to the
owner's URL, whose connection is opened once and kept (one per broker). A
slot that no live broker owns (being taken over) is answered NOT_OWNER,
and the lookup is asked again after a backoff (0.05 s doubling to 0.5 s:
a broker answers a lookup from memory, so asking often costs little and
a slot served again is found soon) until the operation timeout; so is
one whose owner cannot be reached (its lease has not run out yet). A
transaction's coordinator k is looked up the same way (it lives in slot
k). A broker whose first connection was refused for good (a token it
does not take, a certificate not trusted, another protocol version) is
tried again when a lookup names it `REFUSED_RETRY_S` seconds later or
more: it may have restarted, on the same URL, with another configuration.

Every loop here that tries again after NOT_OWNER (or a connection lost)
pauses through one helper, ``client._backoff``: at once at a broker it has
not tried yet (a real move), 0.05 s doubling to 1 s before trying one it
has (a lookup naming the same broker again while a slot is between
owners), never past the operation's deadline.

Ownership changes are followed by the handlers themselves: a producer or
consumer whose re-creation, or send, is refused NOT_OWNER, or whose broker
cannot be reached again, is handed here (`relocate`): its topic is looked
up again and it is moved to the owner's connection, where it is re-created
and re-sends, in order, the frames not answered yet (the broker
deduplicates sends by producer name and sequence id, as after a
reconnect; acks are idempotent), until it is placed or closed. Its sends
keep their deadlines meanwhile.

What speaks in requests rather than through a producer or consumer
(readers, subscription cursors, transaction groups, the producer-epoch
mode's producers) holds a `Route`: the connection of its topic's or its
coordinator's owner, and `Route.request`, which sends there and, in a
cluster, follows the owner: a request refused NOT_OWNER, or whose
connection is lost or cannot be re-established within one attempt, is
looked up again and made again at the owner (each such request is
idempotent, or deduplicated by the broker: see each user).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import ssl
import zlib
from collections.abc import Callable
from typing import Protocol

from proto import txnbuf_pb2 as pb

from ._backoff import Backoff
from ._connection import CONNECT_TIMEOUT, Command, Connection, Handler, Type, command
from .errors import (
    ClientClosedError,
    ConnectionLostError,
    InvalidInputError,
    NotOwnerError,
    OperationTimeoutError,
    TxnbufError,
)

__all__ = ["Brokers", "ClientLink", "Route", "service_urls", "slot_of"]

log = logging.getLogger("client")

ID_RANGE = 1 << 40  # ids and link generations of the n-th connection start at n * ID_RANGE
LOOKUP_BACKOFF_MAX = 0.5  # seconds between lookups, at most (see the module docstring)
REFUSED_RETRY_S = 2.0  # seconds before a broker that refused a first connection is tried again


def slot_of(key: str, slots: int) -> int:
    """The slot of a topic or transactional id called ``key`` in a cluster
    of ``slots`` slots (crc32, as the brokers reckon it: docs/cluster.md)."""
    return zlib.crc32(key.encode()) % slots


def service_urls(url: object) -> list[str]:
    """The URLs of ``url`` (one, several with commas, or a list of them)."""
    if isinstance(url, str):
        urls = [u.strip() for u in url.split(",")]
    elif isinstance(url, list | tuple) and all(isinstance(u, str) for u in url):
        urls = [u.strip() for u in url]
    else:
        raise InvalidInputError(
            f"url must be a str (several with commas) or a list of str, not {url!r}"
        )
    schemes = ("http://", "https://", "txnbuf://", "txnbufs://")
    if not urls or not all(u.startswith(schemes) for u in urls):
        raise InvalidInputError(
            f"each url must look like http://host:port (or txnbuf://host:port), not {url!r}"
        )
    if len({u.split("://")[0] in ("https", "txnbufs") for u in urls}) > 1:
        raise InvalidInputError(f"the urls must all use TLS or all not, not {url!r}")
    return urls


class Brokers:
    """The home connection and one connection per other broker (see the
    module docstring). `Connection`'s ``router``."""

    def __init__(
        self,
        urls: list[str],
        operation_timeout: float,
        token: str | None,
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        self.operation_timeout = operation_timeout
        self._token = token
        self._ssl = ssl_context
        self.home = Connection(
            urls[0],
            operation_timeout,
            token,
            ssl_context,
            router=self,
            fallbacks=urls[1:],
            connect_timeout=connect_timeout,
        )
        self._others: dict[str, Connection] = {}  # url -> connection (not home)
        # url -> when its connection was first seen refused for good (loop time)
        self._refused: dict[str, float] = {}
        self._moving: dict[Handler, asyncio.Task[None]] = {}
        self._slots = 0
        self._closed = False
        self.moves = 0  # producers and consumers moved to another broker so far

    # -- Router ---------------------------------------------------------------------

    @property
    def cluster(self) -> bool:
        return self._slots > 0

    @property
    def slots(self) -> int:
        """The cluster's number of slots (0: a single broker)."""
        return self._slots

    def saw_cluster(self, conn: Connection, slots: int) -> None:
        if slots and not self._slots:
            log.info("%s is a cluster's broker (%d slots): topics are looked up", conn.url, slots)
        self._slots = max(self._slots, slots)

    def relocate(self, handler: Handler) -> None:
        if self._closed or handler in self._moving or handler.closed:
            return
        task = asyncio.get_running_loop().create_task(
            self._move(handler), name=f"txnbuf-move-{handler.topic}"
        )
        self._moving[handler] = task

    # -- routing ----------------------------------------------------------------------

    def connections(self) -> list[Connection]:
        return [self.home, *self._others.values()]

    def handlers(self) -> list[Handler]:
        """Every producer and consumer, on a connection or being moved."""
        found: list[Handler] = list(self._moving)
        for conn in self.connections():
            found.extend(conn.producers.values())
            found.extend(conn.consumers.values())
        return found

    async def route(self, topic: str) -> Connection:
        """The connection of the broker serving ``topic`` (home, with no
        lookup, when the broker is not a cluster's)."""
        await self.home.start()
        if not self.cluster:
            return self.home
        return await self.lookup(topic=topic)

    async def route_coordinator(self, tc_id: int) -> Connection:
        """The connection of the broker serving coordinator ``tc_id``."""
        await self.home.start()
        if not self.cluster or tc_id in self.home.tc_ids:
            return self.home
        return await self.lookup(tc_id=tc_id)

    async def lookup(
        self, *, topic: str = "", tc_id: int | None = None, deadline: float | None = None
    ) -> Connection:
        """Ask the home broker who serves ``topic`` (or coordinator
        ``tc_id``), until a connection to it is up (see the module
        docstring); `OperationTimeoutError` at ``deadline``."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.operation_timeout
        what = f"lookup of {topic!r}" if tc_id is None else f"lookup of coordinator {tc_id}"
        backoff = Backoff(deadline, most=LOOKUP_BACKOFF_MAX)
        refused = ""  # (the last broker named that refused a connection, and why)

        def build(request_id: int) -> Command:
            cmd = command(Command.LOOKUP, "lookup", request_id=request_id, topic=topic)
            if tc_id is not None:
                cmd.lookup.tc_id = tc_id
            return cmd

        while True:
            self._check_open()
            home = self.home
            try:
                reply = await home.request(build, Command.LOOKUP_RESPONSE, what, deadline)
                answer = reply.lookup_response
                if answer.response != pb.CommandLookupTopicResponse.REDIRECT:
                    return home
                target = self._connection(answer.broker_service_url)
                if await self._reachable(target, deadline):
                    return target
                refused = (
                    f" ({target.url} refused the connection: {target.refused})"
                    if target.refused is not None
                    else ""
                )
                log.info("%s: %s cannot be reached (yet)%s", what, target.url, refused)
            except NotOwnerError as exc:
                log.info("%s: %s", what, exc)  # (being taken over: ask again)
            if not await backoff.wait():  # (no owner to reach known: always a pause)
                raise OperationTimeoutError(f"{what} found no broker serving it in time{refused}")

    def _connection(self, url: str) -> Connection:
        url = url.rstrip("/")
        if url == self.home.url:
            return self.home
        conn = self._others.get(url)
        if conn is None:
            base = (len(self._others) + 1) * ID_RANGE
            conn = Connection(
                url, self.operation_timeout, self._token, self._ssl, id_base=base, router=self
            )
            self._others[url] = conn
            self.home.add_fallback(url)
        return conn

    async def _reachable(self, conn: Connection, deadline: float) -> bool:
        """Start ``conn`` if need be; True once it is up, False if it is not
        within one connection attempt (its supervisor keeps trying), or if
        its first connection was refused for good (tried again after
        `REFUSED_RETRY_S`)."""
        if conn.ready_link() is not None:
            return True
        loop = asyncio.get_running_loop()
        if conn.refused is not None:
            refused_at = self._refused.setdefault(conn.url, loop.time())
            if loop.time() - refused_at < REFUSED_RETRY_S:
                return False
            log.info("%s refused a connection (%s): trying it again", conn.url, conn.refused)
            del self._refused[conn.url]
            await conn.start_over()
        conn.start_background()
        # (Not longer: a dead broker's connection is in its reconnect backoff;
        # the lookup is asked again meanwhile, and may name another broker.)
        limit = min(deadline, loop.time() + LOOKUP_BACKOFF_MAX)
        with contextlib.suppress(TxnbufError):
            await conn.wait_ready(limit, f"connect to {conn.url}")
            return True
        return False

    async def _move(self, handler: Handler) -> None:
        """Look ``handler``'s topic up and move it there, until it is placed
        or closed (its sends time out meanwhile as on any connection)."""
        loop = asyncio.get_running_loop()
        backoff = Backoff(math.inf)  # (until placed or closed)
        try:
            while not self._closed and not handler.closed:
                try:
                    target = await self.lookup(topic=handler.topic)
                    # (at once at a broker not tried yet, after a pause at the same one)
                    await backoff.wait(target)
                    if self._closed or handler.closed:
                        return
                    if await target.adopt(handler):
                        self.moves += 1
                        log.info("%r now at %s", handler, target.url)
                        return
                except TxnbufError as exc:
                    if not exc.retriable:
                        log.warning("moving %r failed: %s", handler, exc)
                        return
                    log.info("moving %r: %s", handler, exc)
                    await backoff.wait()  # (no owner found: a pause before looking again)
                handler.expire(loop.time())
        finally:
            self._moving.pop(handler, None)

    # -- closing ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")

    async def close(self) -> None:
        self._closed = True
        for task in list(self._moving.values()):
            task.cancel()
        for conn in self.connections():
            await conn.close()


class Route:
    """Where the requests about one topic (``topic``) or one coordinator
    (``tc_id``) go: ``conn``, the connection of its owner, moved by
    `request` when the owner changes (see the module docstring). On a
    single broker it is the home connection, for good. ``conn`` None: not
    placed yet (in a cluster, the first request looks the owner up)."""

    def __init__(
        self,
        brokers: Brokers,
        conn: Connection | None = None,
        *,
        topic: str = "",
        tc_id: int | None = None,
    ) -> None:
        self.brokers = brokers
        self.conn = conn or brokers.home
        self._placed = conn is not None
        self.topic = topic
        self.tc_id = tc_id

    def __repr__(self) -> str:
        what = f"topic {self.topic!r}" if self.tc_id is None else f"coordinator {self.tc_id}"
        return f"<Route {what} at {self.conn.url}>"

    async def request(
        self,
        build: Callable[[int], Command],
        expect: Type,
        what: str,
        deadline: float | None = None,
    ) -> Command:
        """``build(request_id)``'s answer from the owner (see the module
        docstring), retried until ``deadline`` (default: the operation
        timeout from now). The request must be safe to make twice."""
        if not self.brokers.cluster:
            return await self.conn.request(build, expect, what, deadline, link_bound=False)
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.brokers.operation_timeout
        if not self._placed:
            self.conn = await self.brokers.lookup(
                topic=self.topic, tc_id=self.tc_id, deadline=deadline
            )
            self._placed = True
        backoff = Backoff(deadline, self.conn)
        while True:
            self.brokers._check_open()
            conn = self.conn
            try:
                if not await self.brokers._reachable(conn, deadline):
                    raise ConnectionLostError(f"{what}: {conn.url} cannot be reached")
                link = conn.ready_link()
                if link is None:
                    raise ConnectionLostError(f"{what}: connection lost")
                return await conn.request_on(link, build, expect, what, deadline)
            except TxnbufError as exc:
                if not exc.retriable or isinstance(exc, OperationTimeoutError):
                    raise
                if loop.time() >= deadline:
                    raise OperationTimeoutError(f"{what} timed out: {exc}") from exc
                if not isinstance(exc, NotOwnerError | ConnectionLostError):
                    log.info("%s: %s; trying again after a pause", what, exc)
                    target: Connection | None = None  # (the same broker: a pause)
                else:
                    log.info("%s: %s; looking the owner up again", what, exc)
                    target = self.conn = await self.brokers.lookup(
                        topic=self.topic, tc_id=self.tc_id, deadline=deadline
                    )
                # (at once at a broker not tried yet; a look may still name
                # the old owner, or none: then not in a busy loop)
                if not await backoff.wait(target):
                    raise OperationTimeoutError(f"{what} timed out: {exc}") from exc


class ClientLink(Protocol):
    """What a request object made from a `client.Client` (``TransactionGroups``,
    ``SubscriptionCursor``) needs of it: its connection, and a way to make
    sure it is up, and its brokers. Typed here, below the client, so that they do not import
    ``Client`` back."""

    _conn: Connection
    _brokers: Brokers

    async def connect(self) -> None: ...
