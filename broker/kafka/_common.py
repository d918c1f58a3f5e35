"""What the Kafka handler modules share: the codes they answer directly,
the shape of a handler, and the checks each of them makes.

`broker.kafka._handlers` (the listener's table, Produce, Fetch, metadata),
`broker.kafka._txn_apis` (transactions), `broker.kafka._group_apis`
(consumer groups and their offsets) and `broker.kafka._admin` import this
module; it imports none of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker._errors import error_text, kafka_code
from broker.kafka._groups import GroupError
from broker.kafka._records import RecordError
from broker.kafka._session import KafkaError, KafkaSession
from buffer import InvalidNameError, Partition, check_subscription_name
from tc import coordinator_of_producer

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = [
    "INVALID_GROUP_ID",
    "INVALID_TXN_STATE",
    "NONE",
    "OPERATION_NOT_ATTEMPTED",
    "UNKNOWN_TOPIC_OR_PARTITION",
    "Handler",
    "Response",
    "allow_producer",
    "error_code",
    "failed",
    "group_subscription",
    "partition_of",
]

# Kafka error codes answered directly by more than one handler module.
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_GROUP_ID = 24
INVALID_TXN_STATE = 48
OPERATION_NOT_ATTEMPTED = 55

Response = dict[str, Any]
Handler = Callable[[Any, int, KafkaSession], "Response | Awaitable[Response] | None"]


def error_code(exc: BaseException) -> tuple[int, str]:
    """The Kafka error code and message that answer ``exc``: a Kafka
    refusal's own, else the refusal's (`broker._errors.kafka_code`, which
    logs what is no refusal)."""
    if isinstance(exc, (KafkaError, RecordError, GroupError)):
        return exc.code, str(exc)
    return kafka_code(exc), error_text(exc)


def partition_of(broker: Broker, topic_name: str, index: int) -> Partition:
    """Partition ``index`` of a loaded topic; UNKNOWN_TOPIC_OR_PARTITION
    if there is none (or the topic is still loading: its load is asked
    for, and the client asks again after a metadata request)."""
    topic = broker.topics.get(topic_name)
    if topic is None and topic_name in broker.topics:
        broker.topics.request_load(topic_name)
        raise KafkaError(UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic_name!r} is loading; try again")
    if topic is None or not 0 <= index < len(topic.partitions):
        raise KafkaError(
            UNKNOWN_TOPIC_OR_PARTITION, f"no partition {index} of topic {topic_name!r}"
        )
    return topic.partitions[index]


def allow_producer(
    broker: Broker, session: KafkaSession, producer_id: int, transactional_id: str | None
) -> None:
    """A transactional request: refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
    unless the role may produce on the transactional id it names and on
    the one that holds its producer id (as `broker._epoch` checks the
    producer-epoch mode: without it, a role could end or write into
    another's transaction by naming its own transactional id)."""
    if session.superuser:
        return
    if transactional_id is not None:
        session.allow_transactional_id(transactional_id)
    tc = broker.coordinators.get(coordinator_of_producer(producer_id))
    entry = tc.producer_of(producer_id) if tc is not None else None
    if entry is not None and entry.transactional_id != transactional_id:
        session.allow_transactional_id(entry.transactional_id)


def group_subscription(group_id: str) -> str:
    """The txnbuf subscription a consumer group is (its name), or
    INVALID_GROUP_ID."""
    try:
        return check_subscription_name(group_id)
    except InvalidNameError as exc:
        raise KafkaError(INVALID_GROUP_ID, str(exc)) from None


async def failed(exc: BaseException) -> Any:
    """An awaitable that raises ``exc`` (a refusal among awaited answers)."""
    raise exc
