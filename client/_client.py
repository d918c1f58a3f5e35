"""The Client: its broker connections, the factory of producers and consumers."""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType

from proto import TxnID

from ._backoff import Backoff
from ._brokers import Brokers, Route, service_urls, slot_of
from ._connection import CONNECT_TIMEOUT, Command, Connection, command
from ._consumer import Consumer
from ._deadletter import DeadLetterPolicy, DeadLetters, Source
from ._epoch import TransactionalProducer
from ._foreign import tls_context
from ._producer import Producer
from ._reader import Position, Reader
from ._reader import _position as _reader_position
from ._spares import Spare, SparePool
from ._txn import Transaction, TxnState
from .errors import ClientClosedError, InvalidInputError, NotOwnerError

MAX_TXN_TTL_MS = 2**64 - 1


def _check_seconds(value: float, what: str) -> None:
    """Refuse (``InvalidInputError``) a ``value`` that is not a positive,
    finite number of seconds (a bool is not one)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise InvalidInputError(f"{what} must be a positive number of seconds, not {value!r}")


class Client:
    """A client of a txnbuf broker, or of a cluster of them::

        async with Client("http://127.0.0.1:6650") as client:
            producer = await client.create_producer("orders")
            await producer.send(b"payload")

    One WebSocket (``<url>/ws``, or one stream) carries every producer and consumer of the
    client; it reconnects by itself when it drops (see ``client._connection``
    for what is re-created and re-sent). ``url`` may name several brokers of
    one service (``["http://a:6650", "http://b:6650"]``, or one string with
    commas): the first that answers is connected to, the others are tried
    when it cannot be reached: one attempt at a broker that does not
    answer (paused, or its machine gone silent) is given up after
    ``connect_timeout`` seconds (5 by default, at most
    ``operation_timeout``) when there is another broker to try (with one
    URL and no other broker known, it waits the operation timeout, as
    there is nothing else to try). A broker of a cluster (docs/cluster.md) makes
    the client look each topic up and keep one WebSocket per broker, each
    producer and consumer on its topic's owner, following ownership changes
    by itself (see ``client._brokers``); so do readers, subscription
    cursors, transaction groups and the producer-epoch mode's producers,
    request by request. A transaction may span topics and subscriptions of
    several brokers (its coordinator tells each participant on its owner);
    ``new_transaction(near=topic)`` takes a coordinator on the broker of
    ``topic``, so that a transaction kept to that broker commits in one
    request. Every operation gives up after
    ``operation_timeout`` seconds with ``OperationTimeoutError``. The client
    connects on ``__aenter__`` (or ``connect()``, or its first operation);
    after ``close()`` every use raises ``ClientClosedError``.

    Transactions (PIP-31)::

        async with client.transaction(timeout=60.0) as txn:
            msg = await consumer.receive()
            await producer.send(b"out", txn=txn)
            await consumer.acknowledge(msg, txn=txn)
        # committed here; aborted (and the exception re-raised) on an exception

    Security (docs/security.md): ``token`` is a JWT the broker accepts,
    whose subject is the client's role; without one the client takes
    ``TXNBUF_TOKEN`` from the environment (``token=""``: none at all). A
    broker that refuses it makes ``connect`` raise ``AuthenticationError``
    at once. An ``https://`` URL connects over TLS; ``tls_ca`` names a PEM
    file of the CA certificates to trust (default: the system's).
    ``txnbuf://host:port`` (``txnbufs://`` with TLS) connects to the
    broker's stream listener (``txnbuf serve --stream-port``): the same
    protocol on raw TCP instead of the WebSocket, with less framing.
    """

    def __init__(
        self,
        url: str | list[str],
        *,
        operation_timeout: float = 30.0,
        token: str | None = None,
        tls_ca: str | os.PathLike[str] | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
    ) -> None:
        urls = service_urls(url)
        if not operation_timeout > 0:
            raise InvalidInputError("operation_timeout must be positive")
        _check_seconds(connect_timeout, "connect_timeout")
        if token is None:
            token = os.environ.get("TXNBUF_TOKEN", "")
        if not isinstance(token, str) or not token.isascii():
            raise InvalidInputError("token must be a str of ASCII characters (a JWT)")
        if tls_ca is not None and not urls[0].startswith(("https://", "txnbufs://")):
            raise InvalidInputError("tls_ca is for https:// and txnbufs:// URLs")
        context = tls_context(tls_ca) if tls_ca is not None else None
        self.url = ",".join(urls)
        self.operation_timeout = operation_timeout
        self._brokers = Brokers(
            urls, operation_timeout, token or None, context, connect_timeout=connect_timeout
        )
        self._conn: Connection = self._brokers.home
        self._closed = False
        self._next_tc = 0  # round robin over the broker's coordinators
        self._spares = SparePool(self._round_robin_tc, self._abort_spare, self._conn.is_current)

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<Client {self.url} {state}>"

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def connections(self) -> int:
        """How many times this client has connected (1 + reconnects so far;
        in a cluster, the links of every broker's connection, and every move
        of a producer or consumer to another broker).

        A consumer that sees this change knows its unacknowledged messages
        may come again (the broker redelivers them after a reconnect, and
        the new owner after a move).
        """
        brokers = self._brokers
        return sum(conn.links for conn in brokers.connections()) + brokers.moves

    async def connect(self) -> None:
        """Connect now (retrying until ``operation_timeout``, then raising
        ``BrokerConnectionError``; the client stays usable: the next
        operation tries again). Idempotent."""
        self._check_open()
        await self._conn.start()  # (never closes the client: only close() does)

    async def create_transactional_producer(
        self,
        transactional_id: str,
        *,
        transaction_timeout: float = 60.0,
        enable_2pc: bool = False,
    ) -> TransactionalProducer:
        """A producer of the producer-epoch mode (Kafka's transactional
        producer, see ``client._epoch``): call ``init_transactions()`` first.
        Instances with the same ``transactional_id`` fence each other;
        ``enable_2pc`` (KIP-939) makes its transactions never time out and
        lets it ``prepare_transaction()`` (the broker must allow it)."""
        _check_name("transactional_id", transactional_id)
        if not enable_2pc and not 0 < transaction_timeout <= 900:
            raise InvalidInputError("transaction_timeout must be in (0, 900] seconds")
        await self.connect()
        route = Route(self._brokers, self._conn)
        if self._brokers.cluster:  # (the owner of the transactional id's slot)
            route = Route(self._brokers, tc_id=slot_of(transactional_id, self._brokers.slots))
        return TransactionalProducer(route, transactional_id, transaction_timeout, enable_2pc)

    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        *,
        max_pending_messages: int = 50_000,
        batching_max_messages: int = 1000,
        batching_max_bytes: int = 1024 * 1024,
        partitions_update_interval: float | None = 60.0,
    ) -> Producer:
        """A producer on ``topic`` (created with one partition if missing).

        ``producer_name`` names the producer on the broker, which
        deduplicates sends by (name, sequence id); without one the client
        makes up a unique name, kept across reconnects. Automatic sequence
        ids continue after the highest one the broker stored for the name.
        Every ``partitions_update_interval`` seconds (None: never) the
        producer asks how many partitions the topic has, and routes over
        the new ones once it grew.
        """
        _check_name("topic", topic)
        if producer_name is None:
            producer_name = f"producer-{uuid.uuid4().hex}"
        else:
            _check_name("producer_name", producer_name)
        await self.connect()
        producer = Producer(
            await self._brokers.route(topic),
            topic,
            producer_name,
            max_pending_messages=max_pending_messages,
            batching_max_messages=batching_max_messages,
            batching_max_bytes=batching_max_bytes,
            partitions_update_interval=partitions_update_interval,
        )
        await self._at_owner(producer, producer._create)
        return producer

    async def _at_owner(
        self, handler: Producer | Consumer, create: Callable[[], Awaitable[None]]
    ) -> None:
        """``create()`` at the broker of ``handler``'s topic: looked up again
        and tried there while it is refused NOT_OWNER (a cluster's slot
        moved meanwhile), until the operation timeout: at once at a broker
        not tried yet, after a pause at one tried already (``client._backoff``)."""
        deadline = asyncio.get_running_loop().time() + self.operation_timeout
        backoff = Backoff(deadline, handler._conn)
        while True:
            try:
                await create()
                return
            except NotOwnerError:
                if asyncio.get_running_loop().time() >= deadline:
                    raise
                found = await self._brokers.lookup(topic=handler.topic, deadline=deadline)
                if not await backoff.wait(found):
                    raise
                handler.move_to(found)

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        subscription_type: str = "exclusive",
        initial_position: str = "latest",
        *,
        consumer_name: str | None = None,
        receiver_queue_size: int = 1000,
        read_uncommitted: bool = False,
        negative_ack_redelivery_delay: float = 1.0,
        dead_letter_policy: DeadLetterPolicy | None = None,
    ) -> Consumer:
        """A consumer of ``subscription`` on ``topic`` (both created if missing).

        ``subscription_type`` is ``"exclusive"``, ``"shared"`` or
        ``"failover"``; ``initial_position`` (``"latest"`` or ``"earliest"``)
        only matters when the subscription is created. At most
        ``receiver_queue_size`` messages are queued in the client.
        ``read_uncommitted=True`` also receives messages of transactions not
        committed (yet); the default reads committed messages only.
        ``negative_acknowledge`` asks for a message again
        ``negative_ack_redelivery_delay`` seconds later. ``dead_letter_policy``
        (``DeadLetterPolicy(max_redeliver_count, dead_letter_topic=None)``)
        moves a message redelivered more often than that to the dead letter
        topic instead of handing it out (see ``client._deadletter``).
        """
        if dead_letter_policy is not None and not isinstance(dead_letter_policy, DeadLetterPolicy):
            raise InvalidInputError("dead_letter_policy must be a DeadLetterPolicy or None")
        _check_name("topic", topic)
        _check_name("subscription", subscription)
        if consumer_name is not None and not isinstance(consumer_name, str):
            raise InvalidInputError("consumer_name must be a str or None")
        await self.connect()
        consumer = Consumer(
            await self._brokers.route(topic),
            topic,
            subscription,
            subscription_type=subscription_type,
            initial_position=initial_position,
            consumer_name=consumer_name,
            receiver_queue_size=receiver_queue_size,
            read_uncommitted=read_uncommitted,
            negative_ack_redelivery_delay=negative_ack_redelivery_delay,
        )
        if dead_letter_policy is not None:
            source = Source(
                consumer.topic,
                consumer.subscription,
                consumer.consumer_id,
                lambda message, txn: consumer.acknowledge(message, txn=txn),
                consumer._give_back,
            )
            consumer._dead_letters = DeadLetters(self, source, dead_letter_policy)
        await self._at_owner(consumer, consumer._subscribe)
        return consumer

    async def new_transaction(
        self, timeout: float = 60.0, *, near: str | None = None
    ) -> Transaction:
        """Open a transaction that its coordinator aborts if it is not ended
        within ``timeout`` seconds (PIP-31 §Public APIs).

        New transactions go round robin to the coordinators the broker
        named in CONNECTED (coordinator 0 if it named none): NEW_TXN, then
        the TxnID from NEW_TXN_RESPONSE. A transaction with the same timeout
        that just ended asked for this one already, with its END_TXN (a
        spare, see ``client._spares``); then nothing is sent.
        See ``client._txn`` for the rest.

        A cluster: coordinator k lives on the owner of slot k. Without
        ``near`` the coordinators are those of the first broker; with
        ``near`` (a topic) the coordinator of that topic's slot, which is
        always on the broker serving it (topics of near's own slot stay
        with it through every move): a transaction whose sends and acks are
        all on its coordinator's broker commits in one frame; one across
        brokers takes the longer path of ``client._txn`` (docs/cluster.md).
        """
        _check_seconds(timeout, "timeout")
        ttl_ms = max(1, round(timeout * 1000))
        if ttl_ms > MAX_TXN_TTL_MS:
            raise InvalidInputError(f"timeout {timeout} s is too long")
        if near is not None:
            _check_name("near", near)
        await self.connect()
        if near is not None and self._brokers.cluster:
            # Coordinator k lives on the owner of slot k, with the topics of
            # slot k: the coordinator of near's own slot is on near's broker
            # whichever broker that is, before and after any move (a
            # coordinator named by a CONNECTED may have moved since).
            conn = await self._brokers.route(near)
            tc_id = slot_of(near, conn.slots)
            fresh, conn = await self._new_txn(ttl_ms, conn, tc_id)
            txn_id = TxnID(fresh.most_bits, fresh.least_bits)
            return Transaction(conn, txn_id, fresh.tc_id, timeout)
        spare = self._spares.take(ttl_ms)
        conn = self._conn
        if spare is None:
            spare, conn = await self._new_txn(ttl_ms)
        elif self._brokers.cluster:
            conn = await self._brokers.route_coordinator(spare.tc_id)
        txn_id = TxnID(spare.most_bits, spare.least_bits)
        # (Spares are the first broker's: a transaction elsewhere asks none.)
        spares = self._spares if conn is self._conn else None
        return Transaction(conn, txn_id, spare.tc_id, timeout, spares)

    def _round_robin_tc(self, conn: Connection | None = None) -> int:
        tc_ids = (conn or self._conn).tc_ids or (0,)
        tc_id = tc_ids[self._next_tc % len(tc_ids)]
        self._next_tc += 1
        return tc_id

    async def _new_txn(
        self, ttl_ms: int, conn: Connection | None = None, tc_id: int | None = None
    ) -> tuple[Spare, Connection]:
        """NEW_TXN to coordinator ``tc_id``, or the next coordinator (round
        robin) of ``conn``'s broker (the first broker's by default); in a
        cluster, at the coordinator's owner if it moved. The transaction,
        and the connection of its coordinator."""
        conn = conn or self._conn
        if tc_id is None:
            tc_id = self._round_robin_tc(conn)
        born = asyncio.get_running_loop().time()

        def build(request_id: int) -> Command:
            return command(
                Command.NEW_TXN, "new_txn", request_id=request_id, txn_ttl_ms=ttl_ms, tc_id=tc_id
            )

        what = f"new transaction on coordinator {tc_id}"
        try:
            reply = await conn.request(build, Command.NEW_TXN_RESPONSE, what, link_bound=False)
        except NotOwnerError:
            conn = await self._brokers.lookup(tc_id=tc_id)
            reply = await conn.request(build, Command.NEW_TXN_RESPONSE, what, link_bound=False)
        answer = reply.new_txn_response
        spare = Spare(answer.txnid_most_bits, answer.txnid_least_bits, tc_id, born, conn.gen)
        return spare, conn

    async def _abort_spare(self, spare: Spare) -> None:
        txn_id = TxnID(spare.most_bits, spare.least_bits)
        await Transaction(self._conn, txn_id, spare.tc_id, 1.0).abort()

    async def partitions(self, topic: str) -> int:
        """How many partitions ``topic`` has (it is created with one if missing)."""
        _check_name("topic", topic)
        await self.connect()

        def build(request_id: int) -> Command:
            return command(
                Command.PARTITIONED_METADATA,
                "partitioned_metadata",
                request_id=request_id,
                topic=topic,
            )

        conn = await self._brokers.route(topic)
        what = f"partitions of {topic!r}"
        try:
            reply = await conn.request(build, Command.PARTITIONED_METADATA_RESPONSE, what)
        except NotOwnerError:  # (a cluster's slot moved meanwhile)
            conn = await self._brokers.lookup(topic=topic)
            reply = await conn.request(build, Command.PARTITIONED_METADATA_RESPONSE, what)
        return int(reply.partitioned_metadata_response.partitions)

    async def create_reader(
        self,
        topic: str,
        partition: int = 0,
        start: str | tuple[int, int] = "earliest",
        *,
        batch: int = 1000,
    ) -> Reader:
        """A reader of one partition of ``topic`` in its committed order
        (see ``client._reader``), from ``start``: ``"earliest"`` (the first
        message not trimmed), ``"latest"`` (the next one committed) or a
        ``Position(entry_id, index)``. It reads up to ``batch`` messages
        per request."""
        _check_name("topic", topic)
        if type(partition) is not int or partition < 0:
            raise InvalidInputError(f"partition must be an int >= 0, not {partition!r}")
        if type(batch) is not int or batch <= 0:
            raise InvalidInputError(f"batch must be a positive int, not {batch!r}")
        await self.connect()
        route = Route(self._brokers, await self._brokers.route(topic), topic=topic)
        reader = Reader(route, topic, partition, Position(0, 0), batch)
        if start == "earliest":
            reader._fetched = await reader.first()
        elif start == "latest":
            reader._fetched = await reader.end()
        elif isinstance(start, tuple):
            reader._fetched = _reader_position(start)
        else:
            raise InvalidInputError(
                f"start must be 'earliest', 'latest' or a Position, not {start!r}"
            )
        return reader

    @contextlib.asynccontextmanager
    async def transaction(
        self, timeout: float = 60.0, *, near: str | None = None
    ) -> AsyncIterator[Transaction]:
        """``async with client.transaction() as txn:`` a new transaction
        (see ``new_transaction``), committed when the block ends cleanly,
        aborted when it raises (the exception is re-raised; a failure to
        abort is only logged: the coordinator aborts at the timeout). A
        transaction the block committed or aborted itself is left as it is."""
        txn = await self.new_transaction(timeout, near=near)
        try:
            yield txn
        except BaseException:
            await txn._abort_after_error()
            raise
        if txn.state is TxnState.OPEN:
            await txn.commit()

    async def close(self) -> None:
        """Close every producer (sending what they hold) and consumer, then
        the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        handlers = self._brokers.handlers()
        try:
            await asyncio.gather(*(handler.close() for handler in handlers), return_exceptions=True)
            await self._spares.close(timeout=min(2.0, self.operation_timeout))
        finally:
            await self._brokers.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} must be a non-empty str, not {value!r}")
