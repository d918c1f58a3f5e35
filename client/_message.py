"""Message ids and received messages, and their wire (de)coding."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import NamedTuple

from proto import txnbuf_pb2 as pb

from ._foreign import decoding
from .errors import InvalidInputError, ProtocolError


class MessageId(NamedTuple):
    """Where a message is stored: ``(partition, entry_id, batch_index)``.

    Ids order as they are stored within a partition; ``str`` gives
    ``"partition:entry_id:batch_index"``. A transactional send is answered
    with ``entry_id == -1`` (its commit marker's entry id is known only at
    commit) and ``batch_index`` its place in the transaction on that
    partition; consumers receive it with the marker's entry id. A re-sent
    message that the broker stored long ago is answered with
    ``(partition, -1, -1)`` (``is_duplicate``). A named tuple, not a dataclass:
    one is made per message sent and received, and a tuple is the cheapest
    immutable record to make.
    """

    partition: int
    entry_id: int
    batch_index: int = 0

    def __str__(self) -> str:
        return f"{self.partition}:{self.entry_id}:{self.batch_index}"

    @property
    def is_duplicate(self) -> bool:
        """True for the answer to a re-sent message that the broker stored
        already, too long ago to say where: ``(partition, -1, -1)``."""
        return self.entry_id == -1 and self.batch_index == -1

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


# ``MessageId(...)`` runs a __new__ written in Python; the hot paths, which
# make one id per message, make the same tuple from C.
new_message_id: Callable[[tuple[int, int, int]], MessageId] = partial(tuple.__new__, MessageId)


class _Origin:
    """Where the messages of one delivered entry come from: their topic,
    partition and entry id, redelivery count and producer. Shared by them
    (one object per entry, not five fields per message)."""

    __slots__ = ("entry_id", "partition", "producer_name", "redelivery_count", "topic")

    def __init__(
        self, topic: str, partition: int, entry_id: int, redelivery_count: int, producer_name: str
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.entry_id = entry_id
        self.redelivery_count = redelivery_count
        self.producer_name = producer_name


class Message:
    """A message as a consumer receives it (read-only).

    ``value`` is the payload, ``key`` the routing key the producer gave (or
    None), ``redelivery_count`` how often the broker delivered it before,
    ``publish_time_ms`` the producer's wall clock when it sent the message,
    ``sequence_id`` and ``producer_name`` the producer's numbering (what the
    broker deduplicates on). Messages compare and hash by all of these.

    Fields are read from the received protobuf on access: decoding a
    delivered batch makes one small object per message (its protobuf, its
    place in its entry, and what it shares with the entry's other messages)
    and nothing more; its ``message_id`` is made when asked for.
    """

    __slots__ = ("_index", "_origin", "_single")

    _single: pb.SingleMessage
    _origin: _Origin
    _index: int

    def __init__(
        self,
        value: bytes,
        key: str | None,
        properties: dict[str, str],
        message_id: MessageId,
        topic: str,
        redelivery_count: int = 0,
        publish_time_ms: int = 0,
        sequence_id: int = 0,
        producer_name: str = "",
    ) -> None:
        single = pb.SingleMessage(
            payload=value,
            properties=properties,
            publish_time_ms=publish_time_ms,
            sequence_id=sequence_id,
        )
        if key is not None:
            single.key = key
        self._single = single
        partition, entry_id, index = message_id
        self._origin = _Origin(topic, partition, entry_id, redelivery_count, producer_name)
        self._index = index

    @property
    def message_id(self) -> MessageId:
        origin = self._origin
        return new_message_id((origin.partition, origin.entry_id, self._index))

    @property
    def topic(self) -> str:
        return self._origin.topic

    @property
    def redelivery_count(self) -> int:
        return self._origin.redelivery_count

    @property
    def producer_name(self) -> str:
        return self._origin.producer_name

    @property
    def value(self) -> bytes:
        return self._single.payload

    @property
    def key(self) -> str | None:
        single = self._single
        return single.key if single.HasField("key") else None

    @property
    def properties(self) -> dict[str, str]:
        return dict(self._single.properties)

    @property
    def publish_time_ms(self) -> int:
        return self._single.publish_time_ms

    @property
    def sequence_id(self) -> int:
        return self._single.sequence_id

    def _fields(self) -> tuple[object, ...]:
        return (
            self.value,
            self.key,
            tuple(sorted(self._single.properties.items())),
            self.message_id,
            self.topic,
            self.redelivery_count,
            self.publish_time_ms,
            self.sequence_id,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Message):
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        return (
            f"Message(value={self.value!r}, key={self.key!r}, message_id={self.message_id}, "
            f"topic={self.topic!r}, redelivery_count={self.redelivery_count})"
        )


# One message to send: (value, key, properties, sequence id).
Entry = tuple[bytes, str | None, Mapping[str, str] | None, int]


def encode_batch(entries: Sequence[Entry], now_ms: int) -> bytes:
    """The messages of one send (every one stamped ``now_ms``) as a
    serialized EntryBatch with no producer name: what a SEND or a
    COMMIT_TXN carries, stored by the broker as it is."""
    batch = pb.EntryBatch()
    add = batch.messages.add
    for value, key, properties, sequence_id in entries:
        # Field by field: upb looks up each keyword argument of add() by
        # name, which costs more than the attribute stores (per message).
        single = add()
        single.payload = value
        single.sequence_id = sequence_id
        single.publish_time_ms = now_ms
        if key is not None:
            single.key = key
        if properties:
            single.properties.update(properties)
    return batch.SerializeToString()


Extras = dict[int, tuple[str | None, Mapping[str, str] | None]]


def encode_values(
    values: Sequence[bytes], seqs: Sequence[int], extras: Extras | None, now_ms: int
) -> bytes:
    """`encode_batch` of messages given as their values, their sequence ids
    and, by index, the key and properties of those that have any."""
    batch = pb.EntryBatch()
    add = batch.messages.add
    for i, value in enumerate(values):
        single = add()
        single.payload = value
        single.sequence_id = seqs[i]
        single.publish_time_ms = now_ms
        if extras is not None and (extra := extras.get(i)) is not None:
            key, properties = extra
            if key is not None:
                single.key = key
            if properties:
                single.properties.update(properties)
    return batch.SerializeToString()


def held_entries(
    values: Sequence[bytes], seqs: Sequence[int], extras: Extras | None
) -> list[Entry]:
    """The same messages as `Entry` tuples."""
    out: list[Entry] = []
    for i, value in enumerate(values):
        key, properties = (None, None) if extras is None else extras.get(i, (None, None))
        out.append((value, key, properties, seqs[i]))
    return out


def decode_entry(topic: str, entry: pb.DeliveredEntry) -> list[Message]:
    """The messages of one delivered ledger entry, in batch order.

    Message ``i`` of the entry's ``EntryBatch`` has id
    ``(partition, entry_id, first_index + i)`` (``first_index`` 0 but for a
    read of part of an entry); ``entry.indexes`` names the ones this
    consumer gets (all of them when empty).
    """
    with decoding("EntryBatch"):
        batch = pb.EntryBatch.FromString(entry.data)
    singles = batch.messages
    partition = entry.partition
    entry_id = entry.entry_id
    origin = _Origin(topic, partition, entry_id, entry.redelivery_count, batch.producer_name)
    chosen: Iterable[tuple[int, pb.SingleMessage]]
    if entry.indexes:
        count = len(singles)
        for i in entry.indexes:
            if not 0 <= i < count:
                raise ProtocolError(f"entry {partition}:{entry_id} has no batch index {i}")
        chosen = [(i, singles[i]) for i in entry.indexes]
    else:
        chosen = enumerate(singles, entry.first_index)
    # Made field by field, without __init__ (which would build a SingleMessage):
    # this runs once per message received.
    messages = []
    new = object.__new__
    for i, single in chosen:
        message: Message = new(Message)
        message._single = single
        message._origin = origin
        message._index = i
        messages.append(message)
    return messages
