"""Dead letters: a redelivery limit per subscription (Pulsar's ``DeadLetterPolicy``).

A consumer subscribed with ``dead_letter_policy=DeadLetterPolicy(n)`` hands
a message to the application at most ``n + 1`` times (the first delivery
and ``n`` redeliveries, after negative acks, consumers closing, reconnects).
A message delivered once more is not handed out: it is moved to the dead
letter topic (default ``{topic}-{subscription}-DLQ``), as Pulsar does on the
client side.

Decisions written down here:

* The move is a transaction: the message is sent to the dead letter topic
  (same value and key, its properties plus ``REAL_TOPIC`` and
  ``ORIGIN_MESSAGE_ID``, as Pulsar names them) and acknowledged on its
  subscription in one commit, so it is in exactly one of the two, whatever
  fails (Pulsar's send-then-ack may leave it in both).
* Messages to move are collected as they arrive and moved by one task per
  consumer, those that arrived together in one transaction. If the move
  fails (say the broker restarts), the messages are given back to the
  broker (REDELIVER_UNACKNOWLEDGED) after a second, and moved when they
  come again.
* ``initial_subscription_name``: a subscription made on the dead letter
  topic (from its earliest message) before the first message goes there,
  so that retention keeps dead letters until someone reads them.
* Closing the consumer stops the moves; messages not moved yet stay
  unacknowledged on the subscription (the broker redelivers them, and the
  next consumer with the policy moves them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Protocol

from ._message import Message, MessageId
from ._producer import Producer
from ._txn import Transaction
from .errors import InvalidInputError, TxnbufError

__all__ = ["DeadLetterPolicy"]

log = logging.getLogger("client")

RETRY_AFTER = 1.0  # seconds before messages whose move failed are given back


@dataclass(frozen=True, slots=True)
class DeadLetterPolicy:
    """How often a message may be redelivered before it goes to the dead
    letter topic (see ``client._deadletter``)."""

    max_redeliver_count: int
    dead_letter_topic: str | None = None
    initial_subscription_name: str | None = None

    def __post_init__(self) -> None:
        count = self.max_redeliver_count
        if type(count) is not int or count < 0:
            raise InvalidInputError(f"max_redeliver_count must be an int >= 0, not {count!r}")
        for name in ("dead_letter_topic", "initial_subscription_name"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise InvalidInputError(f"{name} must be a non-empty str or None, not {value!r}")


class _Closable(Protocol):
    async def close(self) -> None: ...


class Mover(Protocol):
    """What moving dead letters needs of the `client.Client`: a producer to
    the dead letter topic, its initial subscription, and transactions."""

    async def create_producer(self, topic: str) -> Producer: ...

    async def subscribe(
        self, topic: str, subscription: str, *, initial_position: str = ...
    ) -> _Closable: ...

    def transaction(self) -> AbstractAsyncContextManager[Transaction]: ...


@dataclass(frozen=True, slots=True)
class Source:
    """The consumer whose dead letters move: where they come from, how one
    is acknowledged in the move's transaction, and how messages whose move
    failed are given back to the broker (nothing once the consumer closes)."""

    topic: str
    subscription: str
    consumer_id: int
    acknowledge: Callable[[Message, Transaction], Awaitable[None]]
    give_back: Callable[[list[MessageId]], None]


class DeadLetters:
    """The moves of one consumer's dead letters."""

    def __init__(self, client: Mover, source: Source, policy: DeadLetterPolicy) -> None:
        self.client = client
        self.source = source
        self.policy = policy
        self.max_redeliver_count = policy.max_redeliver_count
        self.topic = policy.dead_letter_topic or f"{source.topic}-{source.subscription}-DLQ"
        self._queued: list[Message] = []
        self._wake = asyncio.Event()
        self._producer: Producer | None = None
        self._task: asyncio.Task[None] | None = None
        self.moved = 0  # messages moved so far

    def take(self, messages: list[Message]) -> None:
        """Move ``messages`` (delivered more often than the policy allows)."""
        self._queued += messages
        self._wake.set()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"txnbuf-dead-letters-{self.source.consumer_id}"
            )

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._queued = self._queued, []
            if not batch:
                continue
            try:
                await self._move(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # (TxnbufError, or anything unexpected: give them back)
                level = logging.WARNING if isinstance(exc, TxnbufError) else logging.ERROR
                log.log(
                    level,
                    "moving %d message(s) of %r to %r failed: %s; they come again",
                    len(batch),
                    self.source.subscription,
                    self.topic,
                    exc,
                )
                await asyncio.sleep(RETRY_AFTER)
                self.source.give_back([m.message_id for m in batch])

    async def _move(self, batch: list[Message]) -> None:
        producer = self._producer
        if producer is None:
            if self.policy.initial_subscription_name is not None:
                keeper = await self.client.subscribe(
                    self.topic, self.policy.initial_subscription_name, initial_position="earliest"
                )
                await keeper.close()
            producer = self._producer = await self.client.create_producer(self.topic)
        async with self.client.transaction() as txn:
            for msg in batch:
                properties = msg.properties
                properties["REAL_TOPIC"] = msg.topic
                properties["ORIGIN_MESSAGE_ID"] = str(msg.message_id)
                await producer.send(msg.value, msg.key, properties, txn=txn)
                await self.source.acknowledge(msg, txn)
        self.moved += len(batch)
        log.info(
            "moved %d message(s) of %r to %r", len(batch), self.source.subscription, self.topic
        )

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
        if self._producer is not None:
            await self._producer.close()
