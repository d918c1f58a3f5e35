"""What both ledgers of a partition share: entry kinds, send results, send errors.

An entry of the partition ledger is DATA, the messages of one send as a
serialized `EntryBatch`; a COMMIT_MARKER of a transaction, which stands for
the transaction's messages held in the partition's sidecar transaction log;
or COMMITTED_TXN, the messages of a local transaction committed in one
record (`committed_entry`: an `EntryBatch` naming its transaction, delivered
as stored). Its ledger ``meta`` packs the kind and the message count
(`entry_meta`), so that readers know entry sizes and kinds without reading
entries. The sidecar log packs its own record kinds the same way.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from buffer._names import Position
from proto import MAX_MESSAGE_SIZE, oversized
from proto import txnbuf_pb2 as pb

__all__ = [
    "COMMITTED_TXN",
    "COMMIT_MARKER",
    "COUNT_MASK",
    "DATA",
    "DUPLICATE_POSITION",
    "DuplicateTooOldError",
    "MalformedSendError",
    "PublishResult",
    "SendRejectedError",
    "committed_entry",
    "decode_send",
    "entry_batch",
    "entry_count",
    "entry_kind",
    "entry_meta",
    "send_sequence_ids",
    "stored_sequence_ids",
]

# Entry kinds, in the high bits of an entry's ledger meta.
DATA, COMMIT_MARKER, COMMITTED_TXN = 0, 1, 2
_KIND_SHIFT = 32
COUNT_MASK = (1 << _KIND_SHIFT) - 1


def entry_batch(
    producer: str, messages: Sequence[pb.SingleMessage], encoded: bytes | None = None
) -> bytes:
    """The stored form of a send: an `EntryBatch` of ``messages`` naming
    ``producer``. ``encoded`` is ``messages`` serialized already, with no
    producer name: used as it is (a serialized message followed by another
    is their merge, so appending the name field completes it)."""
    if encoded is None:
        return pb.EntryBatch(messages=messages, producer_name=producer).SerializeToString()
    return encoded + _name_field(producer)


@functools.lru_cache(maxsize=1024)
def _name_field(producer: str) -> bytes:
    return pb.EntryBatch(producer_name=producer).SerializeToString()


def committed_entry(txn: tuple[int, int], producer: str, encoded: Sequence[bytes]) -> bytes:
    """The stored form of a local transaction's messages on one partition
    (a COMMITTED_TXN entry): its sends' serialized `EntryBatch`es (no
    producer name) in order, then the fields naming ``producer`` and the
    transaction. Serialized messages one after another parse as one whose
    repeated fields are all of theirs, so this is one `EntryBatch` of every
    message, delivered to consumers as it is stored."""
    tail = pb.EntryBatch(
        producer_name=producer, txnid_most_bits=txn[0], txnid_least_bits=txn[1]
    ).SerializeToString()
    return b"".join((*encoded, tail))


def entry_meta(kind: int, count: int) -> int:
    """The ledger meta of an entry of ``kind`` holding ``count`` messages."""
    return (kind << _KIND_SHIFT) | count


def entry_count(meta: int) -> int:
    return meta & COUNT_MASK


def entry_kind(meta: int) -> int:
    return meta >> _KIND_SHIFT


class SendRejectedError(ValueError):
    """A send is malformed (e.g. sequence ids not increasing); nothing stored."""


class MalformedSendError(SendRejectedError):
    """A send's batch is not an encoded `EntryBatch` at all; nothing stored."""


def decode_send(encoded: bytes, command: str) -> pb.EntryBatch:
    """The messages of a send (``command``: SEND, PRODUCE), checked: an
    encoded `EntryBatch` (else `MalformedSendError`) of at least one
    message, none over the size limit, naming no producer (the broker names
    it: else `SendRejectedError`). The one check of every send's batch."""
    try:
        batch = pb.EntryBatch.FromString(encoded)  # (the messages, as they will be stored)
    except DecodeError:
        raise MalformedSendError(f"{command} batch is not a valid EntryBatch") from None
    messages = batch.messages
    if len(encoded) > MAX_MESSAGE_SIZE and (too_big := oversized(messages)):
        raise SendRejectedError(too_big)
    if not messages:
        raise SendRejectedError(
            f"a {command} carries its messages in batch (an encoded EntryBatch): none given"
        )
    if batch.producer_name:
        raise SendRejectedError(f"a {command} batch must not name a producer")
    return batch


def send_sequence_ids(
    messages: Sequence[pb.SingleMessage], first: int | None = None
) -> Sequence[int]:
    """The sequence ids of one send's messages, checked to increase (raises
    `SendRejectedError`); a ``range`` when they are consecutive.

    ``first``: the sender says the messages are numbered ``first``,
    ``first + 1``, ... (`CommandSend.first_sequence_id`, as Kafka's batch
    header gives a base sequence and a count). Only the first and the last
    message are then read, not every message's id. A sender that numbers
    the ones between otherwise is deduplicated by the range all the same.
    """
    n = len(messages)
    if not n:
        raise SendRejectedError("a send needs at least one message")
    if first is not None:
        low, high = messages[0].sequence_id, messages[n - 1].sequence_id
        if low != first or high - low + 1 != n:
            raise SendRejectedError(
                f"first_sequence_id {first} says the {n} messages are numbered {first} to "
                f"{first + n - 1}, but they run from {low} to {high}"
            )
        return range(first, first + n)
    seqs = [m.sequence_id for m in messages]
    if seqs[-1] - seqs[0] + 1 == n and seqs == list(range(seqs[0], seqs[0] + n)):
        return range(seqs[0], seqs[0] + n)
    for a, b in itertools.pairwise(seqs):
        if b <= a:
            raise SendRejectedError(f"sequence ids in one send must increase, got {a} then {b}")
    return seqs


def stored_sequence_ids(messages: Sequence[pb.SingleMessage]) -> Sequence[int]:
    """The sequence ids of a stored send's messages (non-empty), as
    `send_sequence_ids` took them: a send whose first and last ids span as
    many ids as it has messages counts as consecutive."""
    n = len(messages)
    low, high = messages[0].sequence_id, messages[n - 1].sequence_id
    if high - low + 1 == n:
        return range(low, high + 1)
    return [m.sequence_id for m in messages]


class DuplicateTooOldError(Exception):
    """A re-sent message is stored already, but too long ago to know its id."""


# The position answered for a re-sent plain message stored already, too long
# ago to know where (Pulsar answers such a duplicate with -1:-1).
DUPLICATE_POSITION: Position = (-1, -1)


@dataclass(frozen=True, slots=True)
class PublishResult:
    """Where the messages of one send are: ``ids[i]`` for message i.

    ``ids`` is None when they are one run: message i is then at
    ``(entry_id, first + i)``. A plain send stored now, as one entry, is
    ``(entry_id, None, 0)``; a transactional one ``(-1, None, first)``,
    where ``first + i`` is message i's place in its transaction on this
    partition (its batch index once the transaction is committed). A send
    that repeats messages stored earlier lists their ids (a plain message
    stored too long ago to know where: `DUPLICATE_POSITION`).
    """

    entry_id: int
    ids: list[Position] | None
    first: int = 0


def txn_places(first: int, n: int) -> list[Position]:
    """``(-1, first)`` .. ``(-1, first + n - 1)``: the ids of a transactional
    send's n messages from place ``first`` on (see `PublishResult`)."""
    return list(zip(itertools.repeat(-1, n), range(first, first + n), strict=True))


def txn_run_start(ids: list[Position]) -> int | None:
    """The first place if ``ids`` are what `txn_places` gives (one run of
    places), else None."""
    if not ids:
        return None
    first = ids[0][1]
    return first if ids == txn_places(first, len(ids)) else None
