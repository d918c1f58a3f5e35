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
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._message import Message
from .errors import InvalidInputError, TxnbufError

if TYPE_CHECKING:
    from ._client import Client
    from ._consumer import Consumer
    from ._producer import Producer

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


class DeadLetters:
    """The moves of one consumer's dead letters."""

    def __init__(self, client: Client, consumer: Consumer, policy: DeadLetterPolicy) -> None:
        self.client = client
        self.consumer = consumer
        self.policy = policy
        self.max_redeliver_count = policy.max_redeliver_count
        self.topic = policy.dead_letter_topic or f"{consumer.topic}-{consumer.subscription}-DLQ"
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
                self._run(), name=f"txnbuf-dead-letters-{self.consumer.consumer_id}"
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
                    self.consumer.subscription,
                    self.topic,
                    exc,
                )
                await asyncio.sleep(RETRY_AFTER)
                if not self.consumer._closing:
                    self.consumer._redeliver([m.message_id for m in batch])

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
                await self.consumer.acknowledge(msg, txn=txn)
        self.moved += len(batch)
        log.info(
            "moved %d message(s) of %r to %r", len(batch), self.consumer.subscription, self.topic
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
