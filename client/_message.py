"""Message ids and received messages, and their wire (de)coding."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from proto import txnbuf_pb2 as pb

from ._foreign import decoding
from .errors import InvalidInputError, ProtocolError


@dataclass(frozen=True, slots=True, order=True)
class MessageId:
    """Where a message is stored: ``(partition, entry_id, batch_index)``.

    Ids order as they are stored within a partition; ``str`` gives
    ``"partition:entry_id:batch_index"``.
    """

    partition: int
    entry_id: int
    batch_index: int = 0

    def __str__(self) -> str:
        return f"{self.partition}:{self.entry_id}:{self.batch_index}"

    @classmethod
    def parse(cls, text: str) -> MessageId:
        """The inverse of ``str``: ``MessageId.parse("0:12:3")``."""
        try:
            partition, entry_id, batch_index = (int(part) for part in text.split(":"))
        except ValueError:
            raise InvalidInputError(
                f"not a message id: {text!r} (want 'partition:entry_id:batch_index')"
            ) from None
        return cls(partition, entry_id, batch_index)


@dataclass(frozen=True, slots=True)
class Message:
    """A message as a consumer receives it.

    ``value`` is the payload, ``key`` the routing key the producer gave (or
    None), ``redelivery_count`` how often the broker delivered it before,
    ``publish_time_ms`` the producer's wall clock when it sent the message,
    ``sequence_id`` and ``producer_name`` the producer's numbering (what the
    broker deduplicates on).
    """

    value: bytes
    key: str | None
    properties: dict[str, str] = field(hash=False)
    message_id: MessageId
    topic: str
    redelivery_count: int = 0
    publish_time_ms: int = 0
    sequence_id: int = 0
    producer_name: str = field(default="", compare=False)


def decode_entry(topic: str, entry: pb.DeliveredEntry) -> list[Message]:
    """The messages of one delivered ledger entry, in batch order.

    Message ``i`` of the entry's ``EntryBatch`` has id
    ``(partition, entry_id, i)``; ``entry.indexes`` names the ones this
    consumer gets (all of them when empty).
    """
    with decoding("EntryBatch"):
        batch = pb.EntryBatch.FromString(entry.data)
    singles = batch.messages
    partition = entry.partition
    entry_id = entry.entry_id
    redelivery_count = entry.redelivery_count
    producer_name = batch.producer_name
    chosen: Iterable[tuple[int, pb.SingleMessage]]
    if entry.indexes:
        count = len(singles)
        for i in entry.indexes:
            if not 0 <= i < count:
                raise ProtocolError(f"entry {partition}:{entry_id} has no batch index {i}")
        chosen = [(i, singles[i]) for i in entry.indexes]
    else:
        chosen = enumerate(singles)
    return [
        Message(
            single.payload,
            single.key if single.HasField("key") else None,
            dict(single.properties) if single.properties else {},
            MessageId(partition, entry_id, i),
            topic,
            redelivery_count,
            single.publish_time_ms,
            single.sequence_id,
            producer_name,
        )
        for i, single in chosen
    ]
