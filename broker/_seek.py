"""SEEK and UNSUBSCRIBE, a consumer's own requests on its subscription.

Both reuse what the admin API does to a subscription (`broker._operations`):
SEEK is its reset (to a message id, or to a publish time on every
partition), UNSUBSCRIBE its deletion without ``force``, allowed while the
asking consumer is connected (it is closed with the subscription) but
refused while another consumer is, or while a transaction not ended holds
the subscription. Both need the consume permission on the subscription.
A refusal changes nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from broker._context import Context, Handlers, success
from broker._operations import (
    AdminError,
    delete_subscription,
    holding_transactions,
    reset_subscription,
)
from proto import refusals
from proto import txnbuf_pb2 as pb

if TYPE_CHECKING:
    from subscriptions import Consumer

__all__ = ["seek_handlers"]

log = logging.getLogger(__name__)

T = pb.BaseCommand

# An admin refusal's HTTP status -> the wire's refusal.
_REFUSALS: dict[int, type[refusals.Refusal]] = {
    400: refusals.InvalidArgument,
    404: refusals.TopicNotFound,
    409: refusals.NotAllowed,
}


def seek_handlers(conn: Context) -> Handlers:
    """SEEK and UNSUBSCRIBE for ``conn``'s dispatch table."""

    def consumer_of(consumer_id: int, what: str) -> Consumer:
        consumer = conn.consumers.get(consumer_id)
        if consumer is None:
            raise refusals.ConsumerNotFound(f"{what}: no consumer {consumer_id} here")
        conn.broker.security.allow_consume(conn.who, consumer.topic, consumer.subscription)
        return consumer

    def on_seek(cmd: pb.BaseCommand) -> None:
        req = cmd.seek

        async def work() -> pb.BaseCommand:
            consumer = consumer_of(req.consumer_id, "SEEK")
            body: dict[str, Any]
            target = req.WhichOneof("target")
            if target == "message_id":
                mid = req.message_id
                if mid.entry_id < 0 or mid.batch_index < 0:
                    raise refusals.InvalidArgument(
                        f"SEEK to {mid.partition}:{mid.entry_id}:{mid.batch_index}: a stored "
                        "message's id (entry id and batch index >= 0)",
                    )
                body = {
                    "position": {
                        "partition": mid.partition,
                        "entry_id": mid.entry_id,
                        "batch_index": mid.batch_index,
                    }
                }
            elif target == "publish_time_ms":
                body = {"time_ms": req.publish_time_ms}
            else:
                raise refusals.InvalidArgument("SEEK names a message_id or a publish time")
            try:
                await reset_subscription(conn.broker, consumer.topic, consumer.subscription, body)
            except AdminError as exc:
                raise _REFUSALS.get(exc.status, refusals.InvalidArgument)(str(exc)) from None
            log.info(
                "consumer %s reset subscription %r of %r (%s)",
                consumer.name,
                consumer.subscription,
                consumer.topic,
                target,
            )
            return success(req.request_id)

        conn.answer(req.request_id, work(), "seek")

    def on_unsubscribe(cmd: pb.BaseCommand) -> None:
        req = cmd.unsubscribe

        async def work() -> pb.BaseCommand:
            consumer = consumer_of(req.consumer_id, "UNSUBSCRIBE")
            broker, topic, name = conn.broker, consumer.topic, consumer.subscription
            what = f"subscription {name!r} of topic {topic!r}"
            # Checked first, with no wait before the deletion's own checks:
            # a refusal leaves the consumer attached.
            subs = broker.subscriptions.of_topic(topic).get(name, [])
            others = {c for sub in subs for c in sub.consumers if c is not consumer}
            if others:
                raise refusals.NotAllowed(
                    f"cannot unsubscribe from {what}: {len(others)} other consumer(s) "
                    "connected to it",
                )
            holders = holding_transactions(broker, topic, name)
            if holders:
                raise refusals.NotAllowed(
                    f"cannot unsubscribe from {what}: transaction(s) "
                    f"{', '.join(map(str, holders[:10]))} not ended hold it",
                )
            del conn.consumers[req.consumer_id]
            broker.subscriptions.detach(consumer)
            try:
                await delete_subscription(broker, topic, name, force=False)
            except AdminError as exc:  # (not expected: checked just above)
                raise _REFUSALS.get(exc.status, refusals.NotAllowed)(str(exc)) from None
            log.info("consumer %s unsubscribed: %s deleted", consumer.name, what)
            return success(req.request_id)

        conn.answer(req.request_id, work(), "unsubscribe")

    return {T.SEEK: on_seek, T.UNSUBSCRIBE: on_unsubscribe}
