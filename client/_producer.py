"""The producer: sequence ids, routing, batching, receipts.

Decisions written down here:

* Batching: each ``send`` queues its message on its partition's batch; all
  batches are framed (one SEND per partition) at the next event-loop turn
  (``loop.call_soon``), so a lone send is not delayed and concurrent sends
  share frames. A batch is framed at once when it reaches
  ``batching_max_messages`` (default 1000) or would pass
  ``batching_max_bytes`` (default 1 MiB, lowered to fit the broker's
  ``max_message_size``). A message too big for a batch goes in a
  frame of its own.
* Size: one limit, the broker's ``max_message_size`` (5 MiB,
  `proto.MAX_MESSAGE_SIZE`, announced in CONNECTED) on the encoded message
  (payload, key, properties). A message over it is refused before anything
  is sent, with ``MessageTooBigError`` naming the limit; messages are not
  chunked (the broker refuses one too, should a client send it).
* Routing: a message with a key goes to partition
  ``zlib.crc32(key.encode()) % partitions``; keyless messages go round-robin,
  one partition per event-loop turn (per batch).
* Partitions: the count comes with the producer's creation, and the
  producer asks again every ``partitions_update_interval`` seconds (default
  60, Pulsar's autoUpdatePartitionsInterval; None: never); once the topic
  grew, its messages are routed over the new partitions too (so a key may
  move to another partition: order per key holds only between growths).
  The broker gives the subscriptions of a grown topic the new partitions,
  read from their start.
* Sequence ids: one counter per producer across all partitions, starting
  after the broker's ``last_sequence_id`` for this producer name (the
  highest it stored for the name, on any partition). A ``sequence_id``
  given to ``send`` must be greater than every earlier one this producer
  object sent (else ``InvalidInputError``, a ``ValueError``, and nothing is
  sent); automatic numbering continues after the highest one.
* Deduplication across restarts (Pulsar's): a producer made again with the
  same name may send ids that an earlier instance sent (e.g. from
  ``last_sequence_id`` on, or all that it cannot tell were stored). The
  broker deduplicates per partition, so a re-sent message must go to the
  partition it went to (the same key on as many partitions, or one
  partition): it is answered with its original id where the broker still
  knows it (the last 10,000 entries of the producer; after a broker
  restart, the last 256 entries of the partition), else with an id whose
  ``is_duplicate`` is true (stored already, place unknown:
  ``MessageId(partition, -1, -1)``). Never stored twice, on that partition.
* At most ``max_pending_messages`` (default 50,000) messages wait for a
  receipt; ``send`` waits for room (within the operation timeout),
  ``send_nowait`` raises ``ProducerQueueFullError``.
* A SEND_ERROR fails the messages of that frame with the mapped error and
  is not retried automatically, even when retriable: later frames of the
  same partition may already be stored with higher sequence ids, so a
  re-send would be dropped as a duplicate. The application may send again
  (with a new sequence id).
* A frame that gets no receipt within ``operation_timeout`` of its first
  message's ``send`` fails with ``OperationTimeoutError`` and is no longer
  re-sent; the outcome of those messages is unknown.
* After a reconnect, every frame still awaiting its receipt is re-sent, in
  order, byte for byte (same request id and sequence ids).
* Transactions (``send(..., txn=txn)``): a transactional message is batched
  like the others, but only with messages of the same transaction and
  partition: a SEND frame never mixes transactions, nor transactional and
  plain messages. It carries the TxnID and ``transactional=true`` and uses
  the producer's sequence ids (the broker deduplicates transactional sends
  by (TxnID, producer name, sequence id)); the broker adds the partition to
  the transaction itself (see ``client._txn``).
* A transactional send is answered once queued, with no round trip of its
  own (Kafka's ``send`` in a transaction; ``commit()`` waits for the
  broker's answers and raises, aborting, if one failed). Its id is
  ``MessageId(partition, -1, index)``: -1 stands for the commit marker's
  entry id, known only at commit, and ``index`` is the message's place in
  the transaction on that partition, which the broker gives in the order
  it reads the transaction's sends there. The client counts the places per
  transaction and partition as messages are queued, and keeps the frames in
  that order: at most one batch of a transaction fills for a partition at
  a time (a second producer's send there frames the first's batch). The
  receipt names the places the broker gave; if they differ from the ones
  answered (e.g. frames of two producers re-sent in another order after a
  reconnect) the transaction fails with ``ProtocolError`` at ``commit()``.
  A transactional batch has one future, its transaction's, not one per
  message.
"""

from __future__ import annotations

import asyncio
import logging
import time
import zlib
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proto import TxnID, oversized
from proto import txnbuf_pb2 as pb

from ._connection import (
    BusyClock,
    Command,
    Connection,
    Link,
    Type,
    command,
    copy_error,
    fail_all,
    wait_until,
)
from ._message import Entry, MessageId, encode_batch, new_message_id
from ._txn import _OPEN, Transaction, check_txn
from .errors import (
    ConnectionLostError,
    InvalidInputError,
    MessageTooBigError,
    OperationTimeoutError,
    ProducerBusyError,
    ProducerClosedError,
    ProducerNotFoundError,
    ProducerQueueFullError,
    ProtocolError,
    TxnbufError,
    from_wire,
)

log = logging.getLogger("client")

MAX_SEQUENCE_ID = 2**64 - 1
# Upper bounds of the protobuf encoding, so a frame never passes the
# broker's max_message_size: a SingleMessage beyond its payload and key bytes
# (field tags, lengths, sequence id, publish time) is at most 30 bytes, a
# property entry beyond its strings at most 12, the BaseCommand / CommandSend
# envelope (type, ids, partition) at most 36.
MESSAGE_OVERHEAD = 32
# More than a message's encoding adds to its payload, key (4 bytes a
# character at most) and properties: below the limit by this much, a message
# needs no exact check.
MAX_ENVELOPE = 1024
PROPERTY_OVERHEAD = 12
FRAME_OVERHEAD = 64

_Entry = Entry


@dataclass(slots=True)
class _Batch:
    """Messages of one partition (and transaction, or none) waiting to be framed."""

    deadline: float
    txn: Transaction | None
    entries: list[_Entry] = field(default_factory=list)
    # Plain sends: one future per message. A transactional batch has none:
    # ``tracker``, one future that the transaction waits on, stands for all.
    futures: list[asyncio.Future[MessageId]] = field(default_factory=list)
    size: int = 0
    tracker: asyncio.Future[None] | None = None
    first_index: int = 0  # transactional: its first message's place in the transaction


@dataclass(slots=True)
class _Frame:
    """A SEND frame awaiting its receipt."""

    request_id: int
    data: bytes
    futures: list[asyncio.Future[MessageId]]
    deadline: float
    count: int  # messages in it
    tracker: asyncio.Future[None] | None = None  # transactional: the transaction's view of it
    first_index: int = 0
    txn: Transaction | None = None  # transactional: its transaction


def _resolve(
    futures: list[asyncio.Future[MessageId]], partition: int, entry_id: int, first_index: int
) -> None:
    """Answer message i of a frame with ``(partition, entry_id, first_index + i)``."""
    for index, future in enumerate(futures, first_index):
        if not future.done():
            future.set_result(new_message_id((partition, entry_id, index)))


def _settle_txn_frame(
    frame: _Frame, tracker: asyncio.Future[None], receipt: pb.CommandSendReceipt
) -> None:
    """Settle a transactional frame's ``tracker`` from its receipt: done if
    the broker placed its messages where the client said they are (the
    ids ``send`` answered), else failed with ``ProtocolError``."""
    if tracker.done():
        return
    first = frame.first_index
    if receipt.HasField("first_batch_index"):
        placed = receipt.first_batch_index == first
        where = f"from place {receipt.first_batch_index}"
    elif receipt.message_ids:  # (messages re-sent: each where it was stored first)
        ids = receipt.message_ids
        placed = len(ids) == frame.count and all(
            data.entry_id == -1 and data.batch_index == first + i for i, data in enumerate(ids)
        )
        where = f"at {[(d.entry_id, d.batch_index) for d in ids[:5]]}"
    else:
        tracker.set_exception(ProtocolError("the receipt of a transactional send has no ids"))
        return
    if placed:
        tracker.set_result(None)
    else:
        tracker.set_exception(
            ProtocolError(
                f"the broker placed {frame.count} messages of the transaction {where}; "
                f"the client had answered places from {first}"
            )
        )


def partition_for_key(key: str, partitions: int) -> int:
    """The partition of a keyed message: ``crc32(key) % partitions``."""
    return zlib.crc32(key.encode()) % partitions


def build_send(
    producer_id: int,
    request_id: int,
    partition: int,
    entries: list[_Entry],
    now_ms: int,
    txn_id: TxnID | None = None,
) -> Command:
    """The SEND frame for one batch (every message stamped ``now_ms``), in
    transaction ``txn_id`` if given. The messages go as one serialized
    EntryBatch in ``batch``, which the broker stores without encoding them
    again."""
    cmd = Command(type=Command.SEND)  # (Command.SEND: Type.SEND is a slow lookup)
    send = cmd.send
    send.producer_id = producer_id
    send.request_id = request_id
    send.partition = partition
    if txn_id is not None:
        send.txnid_most_bits, send.txnid_least_bits = txn_id
        send.transactional = True
    send.batch = encode_batch(entries, now_ms)
    # (A producer's ids increase, so ends that span as many ids as there are
    # messages mean consecutive ones: the broker need not read the others.)
    first = entries[0][3]
    if entries[-1][3] - first + 1 == len(entries):
        send.first_sequence_id = first
    return cmd


class Producer:
    """Sends messages to one topic (all its partitions).

    Made by ``Client.create_producer``; use ``await send(...)`` and
    ``await close()``. See the module docstring of ``client._producer`` for
    batching, routing and sequence-id rules.
    """

    def __init__(
        self,
        conn: Connection,
        topic: str,
        name: str,
        *,
        max_pending_messages: int = 50_000,
        batching_max_messages: int = 1000,
        batching_max_bytes: int = 1024 * 1024,
        partitions_update_interval: float | None = 60.0,
    ) -> None:
        if max_pending_messages < 1:
            raise InvalidInputError("max_pending_messages must be at least 1")
        if batching_max_messages < 1:
            raise InvalidInputError("batching_max_messages must be at least 1")
        if batching_max_bytes < 1024:
            raise InvalidInputError("batching_max_bytes must be at least 1024")
        interval = partitions_update_interval
        if interval is not None and (
            isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0
        ):
            raise InvalidInputError(
                f"partitions_update_interval must be seconds > 0 or None, not {interval!r}"
            )
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self.topic = topic
        self.name = name
        self.producer_id = conn.next_producer_id()
        self.partitions = 1
        self._next_sequence_id = 0
        self._last_sent = -1  # the highest sequence id this object sent
        self._max_pending = max_pending_messages
        self._max_batch_messages = batching_max_messages
        self._batching_max_bytes = batching_max_bytes
        self._max_batch_bytes = batching_max_bytes  # also bounded by the broker, see _created
        self._pending = 0
        self._batches: dict[tuple[int, Transaction | None], _Batch] = {}
        self._flush_scheduled = False
        self._round_robin = 0
        self._inflight: dict[int, _Frame] = {}
        self._room_waiters: deque[asyncio.Future[None]] = deque()
        self._gen = 0
        self._closing = False
        self._closed = False
        self._reason: TxnbufError | None = None
        self._busy = BusyClock()
        self._partitions_update_interval = interval
        self._watcher: asyncio.Task[None] | None = None
        # The transactions holding sends of this producer (client._txn's
        # local path): they send them before the producer closes.
        self._held_in: dict[Transaction, None] = {}

    def __repr__(self) -> str:
        return f"<Producer {self.name!r} topic={self.topic!r} id={self.producer_id}>"

    @property
    def last_sequence_id(self) -> int:
        """The highest sequence id given out so far (-1 if none)."""
        return self._next_sequence_id - 1

    @property
    def pending(self) -> int:
        """Messages sent but not yet answered by the broker."""
        return self._pending

    # --- creation and re-creation ------------------------------------------

    def _producer_command(self, request_id: int) -> Command:
        return command(
            Type.PRODUCER,
            "producer",
            request_id=request_id,
            producer_id=self.producer_id,
            topic=self.topic,
            producer_name=self.name,
        )

    def _created(self, success: pb.CommandProducerSuccess, partitions: int, gen: int) -> None:
        partitions = success.partitions or partitions
        if partitions < 1:
            raise ProtocolError(f"topic {self.topic!r} has {partitions} partitions")
        self.partitions = partitions
        self._round_robin %= partitions
        self._max_batch_bytes = min(
            self._batching_max_bytes, self._conn.max_message_size - FRAME_OVERHEAD
        )
        self._next_sequence_id = max(self._next_sequence_id, success.last_sequence_id + 1)
        self._gen = gen

    async def _create(self) -> None:
        """Make the topic exist, create the producer on the broker, register."""
        deadline = self._conn.deadline()
        partitions = await self._partition_count(deadline)
        reply = await self._conn.request(
            self._producer_command,
            Type.PRODUCER_SUCCESS,
            f"create producer on {self.topic!r}",
            deadline,
        )
        self._created(reply.producer_success, partitions, self._conn.gen)
        self._conn.producers[self.producer_id] = self
        if self._partitions_update_interval is not None:
            self._watcher = self._loop.create_task(
                self._watch_partitions(self._partitions_update_interval),
                name=f"txnbuf-partitions-{self.producer_id}",
            )

    async def _watch_partitions(self, interval: float) -> None:
        """Ask the broker how many partitions the topic has every
        ``interval`` seconds; route over the new ones once it grew."""
        while not self._closing:
            await asyncio.sleep(interval)
            try:
                count = await self._partition_count()
            except TxnbufError as exc:
                log.debug("partitions of %r: %s", self.topic, exc)
                continue
            if count > self.partitions:
                log.info("topic %r grew to %d partitions", self.topic, count)
                self.partitions = count

    async def _partition_count(self, deadline: float | None = None) -> int:
        """How many partitions the topic has (the broker creates it if missing)."""
        reply = await self._conn.request(
            lambda request_id: command(
                Type.PARTITIONED_METADATA,
                "partitioned_metadata",
                request_id=request_id,
                topic=self.topic,
            ),
            Type.PARTITIONED_METADATA_RESPONSE,
            f"metadata of topic {self.topic!r}",
            deadline,
        )
        return int(reply.partitioned_metadata_response.partitions)

    async def reattach(self, link: Link) -> None:
        if self._closed:
            return
        try:
            reply = await self._conn.request_on(
                link,
                self._producer_command,
                Type.PRODUCER_SUCCESS,
                f"re-create producer {self.name!r}",
                self._conn.deadline(),
            )
        except ProducerBusyError as exc:
            # The broker may still hold the producer of the dead socket.
            if self._busy.still_waiting(self._loop.time(), self._conn.operation_timeout):
                raise
            self._fail(exc)
            return
        except TxnbufError as exc:
            if exc.retriable:
                raise
            self._fail(exc)
            return
        self._busy.reset()
        if self._closed:  # closed while we were re-creating it
            link.write(self._close_command(self._conn.next_request_id()).SerializeToString())
            return
        self._created(reply.producer_success, self.partitions, link.gen)
        for frame in self._inflight.values():  # (in order: the broker deduplicates)
            link.write(frame.data)

    # --- sending -------------------------------------------------------------

    async def send(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        sequence_id: int | None = None,
        *,
        txn: Transaction | None = None,
    ) -> MessageId:
        """Send one message and return its id once the broker has stored it.

        ``key`` routes the message (same key, same partition); ``properties``
        are string pairs carried along; ``sequence_id`` overrides the
        automatic numbering and must exceed every earlier one.

        ``txn``: send it in that transaction. It returns once the message
        is queued, with the id ``MessageId(partition, -1, index in the
        transaction)`` (the commit marker's entry id replaces -1); whether
        the broker took it is the transaction's outcome: ``txn.commit()``
        raises (and aborts) if any of its sends failed. The message is
        visible to readers only once committed.

        Waits for room when ``max_pending_messages`` are unanswered. Raises
        ``InvalidInputError`` for bad arguments (nothing sent),
        ``InvalidTxnStatusError`` if ``txn`` is no longer open,
        ``ProducerClosedError``, ``OperationTimeoutError`` or the broker's
        ``ServerError``.
        """
        if (
            txn is not None
            and key is None
            and properties is None
            and sequence_id is None
            and type(value) is bytes
            and type(txn) is Transaction
            and txn._holding
            and txn._state is _OPEN
            and txn._conn is self._conn
            and not self._closing
        ):
            # The README loop's case, inline (a call per check costs more per
            # message): a keyless message held by its transaction.
            size = len(value) + MESSAGE_OVERHEAD
            if size <= self._max_batch_bytes:
                seq = self._next_sequence_id
                self._last_sent = seq
                self._next_sequence_id = seq + 1
                return txn._hold_send(self, self._round_robin, value, seq, size)
        if self._pending >= self._max_pending:
            await self._wait_for_room()
        queued = self._enqueue(value, key, properties, sequence_id, txn)
        if isinstance(queued, MessageId):
            return queued
        return await queued

    def send_nowait(
        self,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
        sequence_id: int | None = None,
        *,
        txn: Transaction | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue one message at once and return the future of its id (the
        cheapest way to have many sends in flight); with ``txn`` the future
        is done at once, as ``send`` returns at once. Raises
        ``ProducerQueueFullError`` when ``max_pending_messages`` are unanswered."""
        if self._pending >= self._max_pending and not self._closing:
            raise ProducerQueueFullError(
                f"{self._pending} messages await a receipt (max_pending_messages)"
            )
        queued = self._enqueue(value, key, properties, sequence_id, txn)
        if isinstance(queued, MessageId):
            future: asyncio.Future[MessageId] = self._loop.create_future()
            future.set_result(queued)
            return future
        return queued

    async def flush(self) -> None:
        """Frame every queued message now and wait until every message sent
        so far is answered or has failed (each plain send reports its own
        outcome, a transactional one its transaction's commit). Raises
        ``OperationTimeoutError`` after the operation timeout."""
        self._flush()
        futures: list[asyncio.Future[Any]] = []
        for frame in self._inflight.values():
            futures += frame.futures
            if frame.tracker is not None:
                futures.append(frame.tracker)
        if futures:
            await wait_until(asyncio.wait(futures), self._conn.deadline(), "flush")

    def _enqueue(
        self,
        value: bytes,
        key: str | None,
        properties: Mapping[str, str] | None,
        sequence_id: int | None,
        txn: Transaction | None,
    ) -> asyncio.Future[MessageId] | MessageId:
        """Queue one message: the future of a plain send's id, or a
        transactional send's id (known now)."""
        if self._closing:
            self._raise_closed()
        if txn is not None and (
            type(txn) is not Transaction or txn._conn is not self._conn or txn._state is not _OPEN
        ):  # (the usual case checked inline: a call costs more per message)
            check_txn(txn, self._conn)
        if type(value) is not bytes:
            if not isinstance(value, bytearray | memoryview):
                raise InvalidInputError(f"value must be bytes, not {type(value).__name__}")
            value = bytes(value)
        size = len(value) + MESSAGE_OVERHEAD
        if key is None:
            partition = self._round_robin
        else:
            if not isinstance(key, str):
                raise InvalidInputError(f"key must be a str or None, not {type(key).__name__}")
            encoded = key.encode()
            size += len(encoded)
            partition = zlib.crc32(encoded) % self.partitions
        if properties:
            size += _properties_size(properties)
            properties = dict(properties)
        if sequence_id is None:
            sequence_id = self._next_sequence_id
        else:
            self._check_sequence_id(sequence_id)
        max_bytes = self._max_batch_bytes
        alone = size > max_bytes  # (a frame of its own, if not too big)
        if alone:
            _check_size(value, key, properties, sequence_id, self._conn.max_message_size)
        # Every check passed: from here on the message is sent.
        self._last_sent = sequence_id
        if sequence_id >= self._next_sequence_id:
            self._next_sequence_id = sequence_id + 1
        if txn is not None and txn._holding:  # (held by the transaction: client._txn)
            extra = None if key is None and not properties else (key, properties)
            return txn._hold_send(self, partition, value, sequence_id, size, extra)
        where = (partition, txn)
        batch = self._batches.get(where)
        if batch is not None and (alone or batch.size + size > max_bytes):
            self._frame(partition, self._batches.pop(where))
            batch = None
        if batch is None:
            batch = self._batches[where] = self._new_batch(partition, txn)
        entries = batch.entries
        entries.append((value, key, properties, sequence_id))
        batch.size += size
        self._pending += 1
        queued: asyncio.Future[MessageId] | MessageId
        if txn is None:
            queued = self._loop.create_future()
            batch.futures.append(queued)
        else:
            queued = new_message_id((partition, -1, batch.first_index + len(entries) - 1))
        if alone or len(entries) >= self._max_batch_messages:
            self._frame(partition, self._batches.pop(where))
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)
        return queued

    def _new_batch(self, partition: int, txn: Transaction | None) -> _Batch:
        batch = _Batch(self._loop.time() + self._conn.operation_timeout, txn)
        if txn is None:
            return batch
        # A transaction's messages on a partition are placed in the order the
        # broker reads them; the ids answered now count them in the order
        # they are queued. So at most one batch of the transaction fills for
        # a partition at a time: another producer's goes out first.
        spot = (self.topic, partition)
        filling = txn._filling.get(spot)
        if filling is not None:
            filling._frame_filling(partition, txn)
        txn._filling[spot] = self
        batch.first_index = txn._places.get(spot, 0)
        batch.tracker = self._loop.create_future()
        txn._track(batch.tracker)
        txn._flushes[self._flush] = None
        return batch

    def _frame_held(
        self, partition: int, txn: Transaction, entries: list[_Entry], first_index: int
    ) -> None:
        """Frame messages ``txn`` held for ``partition`` (it leaves the
        local path), whose first has place ``first_index`` there."""
        batch = _Batch(self._loop.time() + self._conn.operation_timeout, txn, entries)
        batch.first_index = first_index
        batch.tracker = self._loop.create_future()
        txn._track(batch.tracker)
        txn._flushes[self._flush] = None
        self._pending += len(entries)
        self._frame(partition, batch)

    def _frame_filling(self, partition: int, txn: Transaction) -> None:
        """Frame this producer's batch of ``txn`` for ``partition`` now:
        another producer's is to follow it."""
        batch = self._batches.pop((partition, txn), None)
        if batch is not None:
            self._frame(partition, batch)
        else:
            txn._filling.pop((self.topic, partition), None)

    def _check_sequence_id(self, sequence_id: int) -> None:
        if type(sequence_id) is not int:
            raise InvalidInputError(
                f"sequence_id must be an int or None, not {type(sequence_id).__name__}"
            )
        if sequence_id <= self._last_sent:
            raise InvalidInputError(
                f"sequence_id {sequence_id} must be greater than the last one this "
                f"producer sent ({self._last_sent})"
            )
        if sequence_id > MAX_SEQUENCE_ID:
            raise InvalidInputError(f"sequence_id {sequence_id} does not fit in 64 bits")

    def _flush(self) -> None:
        """Frame every queued batch (runs one loop turn after the first send)."""
        self._flush_scheduled = False
        if not self._batches:
            return
        batches, self._batches = self._batches, {}
        for (partition, _), batch in batches.items():
            self._frame(partition, batch)
        self._round_robin = (self._round_robin + 1) % self.partitions

    def _frame(self, partition: int, batch: _Batch) -> None:
        request_id = self._conn.next_request_id()
        txn = batch.txn
        entries = batch.entries
        data = build_send(
            self.producer_id,
            request_id,
            partition,
            entries,
            time.time_ns() // 1_000_000,
            None if txn is None else txn.id,
        ).SerializeToString()
        frame = _Frame(
            request_id,
            data,
            batch.futures,
            batch.deadline,
            len(entries),
            batch.tracker,
            batch.first_index,
            txn,
        )
        if txn is not None:
            spot = (self.topic, partition)
            txn._places[spot] = batch.first_index + len(entries)
            if txn._filling.get(spot) is self:
                del txn._filling[spot]
        self._inflight[request_id] = frame
        if self._conn.is_current(self._gen):
            self._conn.write(data)
        elif txn is not None:
            txn._unwritten()

    # --- answers -------------------------------------------------------------

    def on_receipt(self, receipt: pb.CommandSendReceipt) -> None:
        frame = self._inflight.pop(receipt.request_id, None)
        if frame is None:
            return  # timed out already, or a late duplicate
        if frame.tracker is not None:
            _settle_txn_frame(frame, frame.tracker, receipt)
            self._released(frame.count)
            return
        futures = frame.futures
        ids = receipt.message_ids
        if ids:  # (messages re-sent: each where it was stored first)
            for future, data in zip(futures, ids, strict=False):
                if not future.done():
                    future.set_result(
                        new_message_id((data.partition, data.entry_id, data.batch_index))
                    )
            if len(ids) < len(futures):
                fail_all(
                    futures[len(ids) :],
                    ProtocolError(f"receipt has {len(ids)} ids for {len(futures)} messages"),
                )
        else:
            _resolve(futures, receipt.partition, receipt.entry_id, 0)
        self._released(frame.count)

    def on_send_error(self, error: pb.CommandSendError) -> None:
        frame = self._inflight.get(error.request_id)
        if (
            error.error == pb.NOT_OWNER
            and frame is not None
            and frame.tracker is None
            and self._conn.router is not None
        ):
            # (A cluster: the topic moved. The frame stays in flight, re-sent
            # at its new owner, deduplicated there by its sequence ids. A
            # transaction's send fails: its coordinator is not there.)
            if self._conn.producers.get(self.producer_id) is self:
                self._conn.hand_over(self)
            return
        self.fail_request(error.request_id, from_wire(error.error, error.message))

    def fail_request(self, request_id: int, exc: TxnbufError) -> bool:
        frame = self._inflight.pop(request_id, None)
        if frame is None:
            return False
        if frame.tracker is not None and not frame.tracker.done():
            frame.tracker.set_exception(exc)
        fail_all(frame.futures, exc)
        self._released(frame.count)
        return True

    def expire(self, now: float) -> None:
        expired = [rid for rid, frame in self._inflight.items() if frame.deadline <= now]
        for request_id in expired:
            self.fail_request(
                request_id,
                OperationTimeoutError(
                    f"send to {self.topic!r} got no receipt within {self._conn.operation_timeout} s"
                ),
            )

    def on_disconnect(self) -> None:
        # Frames awaiting receipts stay in _inflight; reattach re-sends them.
        # Until then an END of their transaction must not overtake them.
        for frame in self._inflight.values():
            if frame.txn is not None:
                frame.txn._unwritten()

    @property
    def closed(self) -> bool:
        return self._closed

    def move_to(self, conn: Connection) -> None:
        self._conn = conn

    def leave(self, link: Link) -> None:
        if self._gen == link.gen:
            self._conn.request_unawaited(link, self._close_command)
            self._gen = 0  # (nothing more on that link: kept until re-created)

    def _released(self, count: int) -> None:
        self._pending -= count
        room = self._max_pending - self._pending
        waiters = self._room_waiters
        while room > 0 and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                room -= 1

    async def _wait_for_room(self) -> None:
        deadline = self._conn.deadline()
        while self._pending >= self._max_pending:
            if self._closing:
                self._raise_closed()
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._room_waiters.append(waiter)
            await wait_until(waiter, deadline, "send (waiting for room in the producer queue)")

    # --- closing -------------------------------------------------------------

    def _close_command(self, request_id: int) -> Command:
        return command(
            Type.CLOSE_PRODUCER,
            "close_producer",
            request_id=request_id,
            producer_id=self.producer_id,
        )

    async def close(self) -> None:
        """Send what is queued, wait for the answers (within the operation
        timeout), then close the producer on the broker. Idempotent."""
        if self._closing:
            return
        self._closing = True
        self._stop_watching()
        for txn in list(self._held_in):  # (their sends go now, the full way)
            txn.flush()
        try:
            await self.flush()
        except OperationTimeoutError:
            pass  # what is left fails below
        finally:
            self._closed = True
            self._conn.producers.pop(self.producer_id, None)
            self._wake_room_waiters()
            for request_id in list(self._inflight):
                self.fail_request(
                    request_id,
                    OperationTimeoutError(
                        f"producer {self.name!r} closed before the broker answered"
                    ),
                )
        link = self._conn.link
        if link is not None and self._conn.is_current(self._gen):
            try:
                await self._conn.request_on(
                    link,
                    self._close_command,
                    Type.SUCCESS,
                    f"close producer {self.name!r}",
                    self._conn.deadline(),
                )
            except (ConnectionLostError, ProducerNotFoundError):
                pass  # the broker dropped it already

    def _fail(self, reason: TxnbufError) -> None:
        """Close the producer after a fatal error; pending sends fail with it."""
        self._reason = reason
        self._closing = self._closed = True
        self._stop_watching()
        self._conn.producers.pop(self.producer_id, None)
        frames, self._inflight = self._inflight, {}
        batches, self._batches = self._batches, {}
        parts: list[_Frame | _Batch] = [*frames.values(), *batches.values()]
        for part in parts:
            fail_all(part.futures, reason)
            if part.tracker is not None and not part.tracker.done():
                part.tracker.set_exception(copy_error(reason))
        self._released(self._pending)
        self._wake_room_waiters()

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()
            self._watcher = None

    def _wake_room_waiters(self) -> None:
        while self._room_waiters:
            waiter = self._room_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _raise_closed(self) -> None:
        raise ProducerClosedError(f"producer {self.name!r} is closed") from self._reason


def _check_size(
    value: bytes,
    key: str | None,
    properties: Mapping[str, str] | None,
    sequence_id: int,
    limit: int,
) -> None:
    """Raise ``MessageTooBigError`` if the message, encoded, is over
    ``limit`` (the broker's ``max_message_size``)."""
    single = pb.SingleMessage(payload=value, sequence_id=sequence_id, publish_time_ms=2**41)
    if key is not None:
        single.key = key
    if properties:
        single.properties.update(properties)
    too_big = oversized([single], limit)
    if too_big is not None:
        raise MessageTooBigError(f"cannot send: {too_big}")


def _properties_size(properties: Mapping[str, str]) -> int:
    if not isinstance(properties, Mapping):
        raise InvalidInputError(f"properties must be a mapping, not {type(properties).__name__}")
    size = 0
    for name, value in properties.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise InvalidInputError("properties must map str to str")
        size += len(name.encode()) + len(value.encode()) + PROPERTY_OVERHEAD
    return size
