"""The Client: one broker connection, the factory of producers and consumers."""

from __future__ import annotations

import asyncio
import uuid
from types import TracebackType

from ._connection import Connection
from ._consumer import Consumer
from ._producer import Producer
from .errors import BrokerConnectionError, ClientClosedError, InvalidInputError


class Client:
    """A connection to one txnbuf broker::

        async with Client("http://127.0.0.1:6650") as client:
            producer = await client.create_producer("orders")
            await producer.send(b"payload")

    One WebSocket (``<url>/ws``) carries every producer and consumer of the
    client; it reconnects by itself when it drops (see ``client._connection``
    for what is re-created and re-sent). Every operation gives up after
    ``operation_timeout`` seconds with ``OperationTimeoutError``. The client
    connects on ``__aenter__`` (or ``connect()``, or its first operation);
    after ``close()`` every use raises ``ClientClosedError``.
    """

    def __init__(self, url: str, *, operation_timeout: float = 30.0) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise InvalidInputError(f"url must look like http://host:port, not {url!r}")
        if not operation_timeout > 0:
            raise InvalidInputError("operation_timeout must be positive")
        self.url = url
        self.operation_timeout = operation_timeout
        self._conn = Connection(url, operation_timeout)
        self._closed = False

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

    async def connect(self) -> None:
        """Connect now (retrying until ``operation_timeout``, then raising
        ``BrokerConnectionError``). Idempotent."""
        self._check_open()
        try:
            await self._conn.start()
        except BrokerConnectionError:
            self._closed = True  # the connection gave up; make a new Client
            raise

    async def create_producer(
        self,
        topic: str,
        producer_name: str | None = None,
        *,
        max_pending_messages: int = 50_000,
        batching_max_messages: int = 1000,
        batching_max_bytes: int = 1024 * 1024,
    ) -> Producer:
        """A producer on ``topic`` (created with one partition if missing).

        ``producer_name`` names the producer on the broker, which
        deduplicates sends by (name, sequence id); without one the client
        makes up a unique name, kept across reconnects. Automatic sequence
        ids continue after the highest one the broker stored for the name.
        """
        _check_name("topic", topic)
        if producer_name is None:
            producer_name = f"producer-{uuid.uuid4().hex}"
        else:
            _check_name("producer_name", producer_name)
        await self.connect()
        producer = Producer(
            self._conn,
            topic,
            producer_name,
            max_pending_messages=max_pending_messages,
            batching_max_messages=batching_max_messages,
            batching_max_bytes=batching_max_bytes,
        )
        await producer._create()
        return producer

    async def subscribe(
        self,
        topic: str,
        subscription: str,
        subscription_type: str = "exclusive",
        initial_position: str = "latest",
        *,
        consumer_name: str | None = None,
        receiver_queue_size: int = 1000,
    ) -> Consumer:
        """A consumer of ``subscription`` on ``topic`` (both created if missing).

        ``subscription_type`` is ``"exclusive"``, ``"shared"`` or
        ``"failover"``; ``initial_position`` (``"latest"`` or ``"earliest"``)
        only matters when the subscription is created. At most
        ``receiver_queue_size`` messages are queued in the client.
        """
        _check_name("topic", topic)
        _check_name("subscription", subscription)
        if consumer_name is not None and not isinstance(consumer_name, str):
            raise InvalidInputError("consumer_name must be a str or None")
        await self.connect()
        consumer = Consumer(
            self._conn,
            topic,
            subscription,
            subscription_type=subscription_type,
            initial_position=initial_position,
            consumer_name=consumer_name,
            receiver_queue_size=receiver_queue_size,
        )
        await consumer._subscribe()
        return consumer

    async def close(self) -> None:
        """Close every producer (sending what they hold) and consumer, then
        the connection. Idempotent."""
        if self._closed:
            return
        self._closed = True
        handlers = [*self._conn.producers.values(), *self._conn.consumers.values()]
        try:
            await asyncio.gather(*(handler.close() for handler in handlers), return_exceptions=True)
        finally:
            await self._conn.close()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("the client is closed")


def _check_name(what: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidInputError(f"{what} must be a non-empty str, not {value!r}")
