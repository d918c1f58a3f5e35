"""The producer-epoch mode: Kafka's transactional producer (KIP-98), with an
epoch bump per transaction (KIP-890) and two-phase commit (KIP-939).

::

    p = await client.create_transactional_producer("copier-1", transaction_timeout=60.0)
    await p.init_transactions()
    await p.begin_transaction()
    await p.send("out", b"value", key="k")
    await p.send_offsets_to_transaction(consumer, [msg])   # transactional acks
    await p.commit_transaction()                           # or abort_transaction()

Decisions written down here:

* The producer's state is a table (`STATES`, applied by `_move`); a call not
  allowed in the current state raises `InvalidTxnStateError` and changes
  nothing. A fatal error (`ProducerFencedError`, `InvalidPidMappingError`)
  moves it to FATAL: only ``close()`` is left.
* ``send`` queues the message on its partition's batch and returns; a
  partition has at most one PRODUCE in flight, and what queues meanwhile
  goes in the next one (one frame per partition per round trip). Sequences
  are per partition and epoch, from 0. ``commit_transaction`` waits for
  every send and raises the first one that failed (the transaction is then
  ABORTABLE: only ``abort_transaction`` goes on), as Kafka's
  ``commitTransaction`` does.
* The broker begins the transaction on its first send or ack and adds each
  partition and subscription itself (KIP-890 part 2): ``begin_transaction``
  sends nothing. ``commit_transaction`` and ``abort_transaction`` answer the
  identity of the next transaction (the epoch bumped), which the producer
  takes.
* ``prepare_transaction`` (2PC only) waits for every send, then asks the
  broker to make the transaction PREPARED (durable; it survives a broker
  restart and never times out): an explicit step, because txnbuf answers
  sends before they are durable. ``complete_transaction(state)`` commits if
  ``state`` names the prepared transaction, else aborts; nothing ongoing,
  nothing to do.
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from proto import txnbuf_pb2 as pb

from ._connection import Command, Connection, Type, command
from ._consumer import Consumer, message_id_of
from ._message import Message, MessageId
from .errors import (
    ClosedError,
    InvalidInputError,
    InvalidTxnStateError,
    TxnbufError,
)

__all__ = ["PreparedTxnState", "ProducerState", "TransactionalProducer"]

BATCH_MAX_MESSAGES = 1000


class PreparedTxnState:
    """KIP-939's PreparedTxnState: which transaction was prepared, as a
    string an application stores with its own data (``str(state)``) and
    reads back (``PreparedTxnState(text)``). Empty (``""``): none."""

    __slots__ = ("epoch", "producer_id")

    def __init__(self, serialized: str | None = None) -> None:
        self.producer_id, self.epoch = -1, -1
        if serialized:
            pid, sep, epoch = serialized.partition(":")
            if not (sep and pid.isdigit() and epoch.isdigit()):
                raise InvalidInputError(
                    f"not a PreparedTxnState: {serialized[:100]!r} (expected 'producer_id:epoch')"
                )
            self.producer_id, self.epoch = int(pid), int(epoch)

    @classmethod
    def of(cls, producer_id: int, epoch: int) -> PreparedTxnState:
        return cls(f"{producer_id}:{epoch}" if producer_id >= 0 else None)

    @property
    def empty(self) -> bool:
        return self.producer_id < 0

    def __str__(self) -> str:
        return "" if self.empty else f"{self.producer_id}:{self.epoch}"

    def __repr__(self) -> str:
        return f"PreparedTxnState({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PreparedTxnState):
            return NotImplemented
        return (self.producer_id, self.epoch) == (other.producer_id, other.epoch)

    def __hash__(self) -> int:
        return hash((self.producer_id, self.epoch))


class ProducerState(enum.StrEnum):
    UNINITIALIZED = "uninitialized"
    READY = "ready"  # no transaction begun
    IN_TRANSACTION = "in transaction"
    PREPARED = "prepared"  # prepare_transaction, or init_transactions(keep_prepared_txn)
    ABORTABLE = "abortable"  # a send or ack failed: abort_transaction
    FATAL = "fatal"  # fenced, or the producer id is gone: close it
    CLOSED = "closed"


class _Call(enum.StrEnum):
    INIT = "init_transactions"
    BEGIN = "begin_transaction"
    SEND = "send"
    OFFSETS = "send_offsets_to_transaction"
    PREPARE = "prepare_transaction"
    COMMIT = "commit_transaction"
    ABORT = "abort_transaction"
    COMPLETE = "complete_transaction"


_S, _C = ProducerState, _Call
# (state, call) -> the state it moves to; a pair not here is refused.
STATES: dict[tuple[ProducerState, _Call], ProducerState] = {
    (_S.UNINITIALIZED, _C.INIT): _S.READY,
    (_S.READY, _C.INIT): _S.READY,
    (_S.READY, _C.BEGIN): _S.IN_TRANSACTION,
    (_S.READY, _C.COMPLETE): _S.READY,  # (nothing ongoing: a no-op)
    (_S.IN_TRANSACTION, _C.SEND): _S.IN_TRANSACTION,
    (_S.IN_TRANSACTION, _C.OFFSETS): _S.IN_TRANSACTION,
    (_S.IN_TRANSACTION, _C.PREPARE): _S.PREPARED,
    (_S.IN_TRANSACTION, _C.COMMIT): _S.READY,
    (_S.IN_TRANSACTION, _C.ABORT): _S.READY,
    (_S.PREPARED, _C.COMMIT): _S.READY,
    (_S.PREPARED, _C.ABORT): _S.READY,
    (_S.PREPARED, _C.COMPLETE): _S.READY,
    (_S.PREPARED, _C.INIT): _S.READY,
    (_S.ABORTABLE, _C.ABORT): _S.READY,
    (_S.ABORTABLE, _C.INIT): _S.READY,
}


@dataclass(slots=True)
class _Partition:
    """A partition's messages of the current transaction and epoch."""

    next_seq: int = 0
    queued: list[pb.SingleMessage] = field(default_factory=list)
    futures: list[asyncio.Future[MessageId]] = field(default_factory=list)
    flushing: asyncio.Task[None] | None = None


class TransactionalProducer:
    """Create with ``Client.create_transactional_producer``; see the module docstring."""

    def __init__(
        self,
        conn: Connection,
        transactional_id: str,
        transaction_timeout: float,
        enable_2pc: bool,
    ) -> None:
        self._conn = conn
        self.transactional_id = transactional_id
        self.transaction_timeout = transaction_timeout
        self.enable_2pc = enable_2pc
        self.producer_id = -1
        self.epoch = -1
        self.state = ProducerState.UNINITIALIZED
        self._prepared = PreparedTxnState()  # the prepared (or kept) transaction
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._topics: dict[str, int] = {}  # topic -> its partitions
        self._round_robin = itertools.count()
        self._failure: TxnbufError | None = None  # the first send or ack that failed

    def __repr__(self) -> str:
        return (
            f"<TransactionalProducer {self.transactional_id!r} producer {self.producer_id} "
            f"epoch {self.epoch} {self.state.value}>"
        )

    def _move(self, call: _Call) -> ProducerState:
        """The state after ``call``; raises `InvalidTxnStateError` (nothing
        changes) if the current state does not allow it."""
        if self.state is ProducerState.CLOSED:
            raise ClosedError(f"producer {self.transactional_id!r} is closed")
        after = STATES.get((self.state, call))
        if after is None:
            hint = " (a fatal error: close it)" if self.state is ProducerState.FATAL else ""
            raise InvalidTxnStateError(
                f"{call.value}() is not allowed: producer {self.transactional_id!r} is "
                f"{self.state.value}{hint}"
            )
        return after

    def _fail(self, exc: TxnbufError) -> TxnbufError:
        """Note a failed request: fatal ones end the producer, others make
        the transaction abortable."""
        if exc.fatal:
            self.state = ProducerState.FATAL
        elif self.state is ProducerState.IN_TRANSACTION:
            self.state = ProducerState.ABORTABLE
        return exc

    async def _request(self, build: Command, expect: Type, what: str) -> Command:
        def with_id(request_id: int) -> Command:
            getattr(build, build.WhichOneof("command")).request_id = request_id
            return build

        try:
            return await self._conn.request(with_id, expect, what, link_bound=False)
        except TxnbufError as exc:
            raise self._fail(exc) from None

    # -- lifecycle ------------------------------------------------------------------

    async def init_transactions(self, keep_prepared_txn: bool = False) -> None:
        """InitProducerId: fence every older instance of this transactional
        id, and roll its unfinished transaction back or forward; with
        ``keep_prepared_txn`` keep it (KIP-939), and only commit, abort or
        complete it next."""
        after = self._move(_C.INIT)
        reply = await self._request(
            command(
                Type.INIT_PRODUCER_ID,
                "init_producer_id",
                transactional_id=self.transactional_id,
                transaction_timeout_ms=round(self.transaction_timeout * 1000),
                enable_2pc=self.enable_2pc,
                keep_prepared_txn=keep_prepared_txn,
            ),
            Type.INIT_PRODUCER_ID_RESPONSE,
            f"init_transactions {self.transactional_id!r}",
        )
        answer = reply.init_producer_id_response
        self._new_identity(answer.producer_id, answer.producer_epoch)
        self._prepared = PreparedTxnState.of(
            answer.ongoing_txn_producer_id, answer.ongoing_txn_epoch
        )
        self.state = ProducerState.PREPARED if not self._prepared.empty else after

    def _new_identity(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.epoch = producer_id, epoch
        self._partitions.clear()  # sequences start again at 0 with each epoch
        self._failure = None

    async def begin_transaction(self) -> None:
        """Begin a transaction (sends nothing: the broker begins it on the first send)."""
        self.state = self._move(_C.BEGIN)

    async def close(self) -> None:
        """Abandon the producer (an ongoing transaction is left to its
        timeout or to the next instance's init_transactions)."""
        for part in self._partitions.values():
            if part.flushing is not None:
                part.flushing.cancel()
        self.state = ProducerState.CLOSED

    # -- sends and acks -------------------------------------------------------------

    async def send(
        self,
        topic: str,
        value: bytes,
        key: str | None = None,
        properties: Mapping[str, str] | None = None,
    ) -> asyncio.Future[MessageId]:
        """Queue ``value`` for ``topic`` in the ongoing transaction; the
        result is the future of its id (``MessageId(partition, -1, i)``, as
        for a PIP-31 transactional send). ``commit_transaction`` waits for
        every send and raises the first failure."""
        self._move(_C.SEND)
        if not isinstance(value, bytes | bytearray | memoryview):
            raise InvalidInputError(f"value must be bytes, not {type(value).__name__}")
        partitions = self._topics.get(topic)
        if partitions is None:
            partitions = await self._partitions_of(topic)
        if key is not None:
            index = zlib.crc32(key.encode()) % partitions
        else:
            index = next(self._round_robin) % partitions
        part = self._partitions.get((topic, index))
        if part is None:
            part = self._partitions[(topic, index)] = _Partition()
        message = pb.SingleMessage(
            payload=bytes(value),
            sequence_id=part.next_seq,
            publish_time_ms=time.time_ns() // 1_000_000,
        )
        if key is not None:
            message.key = key
        if properties:
            message.properties.update(properties)
        part.next_seq += 1
        future: asyncio.Future[MessageId] = asyncio.get_running_loop().create_future()
        future.add_done_callback(_retrieved)  # (a failure is reported by commit_transaction)
        part.queued.append(message)
        part.futures.append(future)
        if part.flushing is None:
            part.flushing = asyncio.get_running_loop().create_task(self._flush(topic, index, part))
        return future

    async def _partitions_of(self, topic: str) -> int:
        reply = await self._conn.request(
            lambda rid: command(
                Type.PARTITIONED_METADATA, "partitioned_metadata", request_id=rid, topic=topic
            ),
            Type.PARTITIONED_METADATA_RESPONSE,
            f"partitions of {topic!r}",
        )
        self._topics[topic] = reply.partitioned_metadata_response.partitions
        return self._topics[topic]

    async def _flush(self, topic: str, index: int, part: _Partition) -> None:
        """Send what is queued on a partition, one PRODUCE in flight at a
        time, until nothing is left."""
        try:
            while part.queued:
                messages = part.queued[:BATCH_MAX_MESSAGES]
                futures = part.futures[:BATCH_MAX_MESSAGES]
                del part.queued[:BATCH_MAX_MESSAGES], part.futures[:BATCH_MAX_MESSAGES]
                cmd = command(
                    Type.PRODUCE,
                    "produce",
                    topic=topic,
                    partition=index,
                    producer_id=self.producer_id,
                    producer_epoch=self.epoch,
                    first_sequence=messages[0].sequence_id,
                    batch=pb.EntryBatch(messages=messages).SerializeToString(),
                )
                try:
                    reply = await self._request(
                        cmd, Type.PRODUCER_TXN_RESPONSE, f"send to {topic}/{index}"
                    )
                except TxnbufError as exc:
                    if self._failure is None:
                        self._failure = exc
                    for f in futures:
                        if not f.done():
                            f.set_exception(exc)
                    continue
                first = reply.producer_txn_response.first_batch_index
                for i, f in enumerate(futures):
                    if not f.done():
                        f.set_result(MessageId(index, -1, first + i))
        finally:
            part.flushing = None

    async def _sent(self) -> None:
        """Wait until every queued send is answered; raise the first failure."""
        while True:
            pending = [p.flushing for p in self._partitions.values() if p.flushing is not None]
            if not pending:
                break
            await asyncio.wait(pending)
        if self._failure is not None:
            raise self._failure

    async def send_offsets_to_transaction(
        self, consumer: Consumer, messages: Iterable[Message | MessageId]
    ) -> None:
        """Acknowledge ``messages`` (received by ``consumer`` of this client)
        in the ongoing transaction: PENDING_ACK until it commits, back to
        pending if it aborts (Kafka's sendOffsetsToTransaction)."""
        self._move(_C.OFFSETS)
        if consumer._conn is not self._conn:
            raise InvalidInputError("the consumer must belong to the producer's client")
        positions: list[int] = []
        for m in messages:
            mid = message_id_of(m)
            positions += (mid.partition, mid.entry_id, mid.batch_index)
        if not positions:
            return
        request = command(
            Type.TXN_OFFSETS,
            "txn_offsets",
            consumer_id=consumer.consumer_id,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
        )
        request.txn_offsets.positions.extend(positions)
        try:
            await self._request(request, Type.PRODUCER_TXN_RESPONSE, "send_offsets_to_transaction")
        except TxnbufError as exc:
            if self._failure is None:
                self._failure = exc
            raise

    # -- ending -----------------------------------------------------------------------

    async def commit_transaction(self) -> None:
        """Commit: wait for every send (raising the first failure, after
        which only ``abort_transaction`` goes on), then commit and take the
        next identity."""
        after = self._move(_C.COMMIT)
        if self.state is ProducerState.IN_TRANSACTION:
            try:
                await self._sent()
            except TxnbufError as exc:
                raise self._fail(exc) from None
        await self._end(pb.COMMIT, "commit_transaction")
        self.state = after

    async def abort_transaction(self) -> None:
        """Abort the ongoing transaction (what is still queued is dropped)."""
        after = self._move(_C.ABORT)
        for part in self._partitions.values():
            part.queued.clear()
        try:
            await self._sent()
        except TxnbufError:
            pass  # (aborting anyway)
        await self._end(pb.ABORT, "abort_transaction")
        self.state = after

    async def _end(self, action: pb.TxnAction, what: str) -> None:
        reply = await self._request(
            command(
                Type.END_PRODUCER_TXN,
                "end_producer_txn",
                producer_id=self.producer_id,
                producer_epoch=self.epoch,
                txn_action=action,
            ),
            Type.PRODUCER_TXN_RESPONSE,
            what,
        )
        answer = reply.producer_txn_response
        self._new_identity(answer.producer_id, answer.producer_epoch)
        self._prepared = PreparedTxnState()

    async def prepare_transaction(self) -> PreparedTxnState:
        """KIP-939: wait for every send, make the transaction PREPARED
        (durable; it survives a broker restart and never times out), and
        return its state to store with the application's own data."""
        after = self._move(_C.PREPARE)
        try:
            await self._sent()
        except TxnbufError as exc:
            raise self._fail(exc) from None
        reply = await self._request(
            command(
                Type.PREPARE_PRODUCER_TXN,
                "prepare_producer_txn",
                producer_id=self.producer_id,
                producer_epoch=self.epoch,
            ),
            Type.PRODUCER_TXN_RESPONSE,
            "prepare_transaction",
        )
        answer = reply.producer_txn_response
        self._prepared = PreparedTxnState.of(answer.producer_id, answer.producer_epoch)
        self.state = after
        return self._prepared

    async def complete_transaction(self, state: PreparedTxnState) -> None:
        """KIP-939: commit the prepared transaction if ``state`` names it,
        else abort it; nothing ongoing (after init_transactions found none),
        nothing to do."""
        if not isinstance(state, PreparedTxnState):
            raise InvalidInputError("complete_transaction takes a PreparedTxnState")
        self._move(_C.COMPLETE)
        if self.state is ProducerState.READY:
            return
        if state == self._prepared:
            await self.commit_transaction()
        else:
            await self.abort_transaction()


def _retrieved(future: asyncio.Future[MessageId]) -> None:
    if not future.cancelled():
        future.exception()
