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
* ``send`` queues the message on its partition and returns; queued messages
  are framed at the next event-loop turn (or when the transaction ends), one
  PRODUCE per partition holding everything queued there, written and
  answered in a task. A partition has at
  most one PRODUCE in flight, and what queues meanwhile goes in the next one.
  Sequences are per partition and epoch, from 0.
* ``commit_transaction`` and ``prepare_transaction`` do not wait for the
  sends' answers first: they frame what is still queued and write the
  END_PRODUCER_TXN (or PREPARE_PRODUCER_TXN) right behind the PRODUCEs, on
  the same link. The broker reads frames in order, answers the sends first
  and goes on only if none of them (nor an acknowledgement of the
  transaction) failed; it refuses otherwise, changing nothing, and the call
  raises the first send that failed (the transaction is then ABORTABLE:
  only ``abort_transaction`` goes on), as Kafka's ``commitTransaction``
  does. This saves a round trip per transaction, and the sends share the
  commit's group commit. When that cannot be done (a partition's next
  PRODUCE waits behind one in flight, no link is ready, or the link dies
  before the answer), the call waits for every send, then sends the END or
  PREPARE the usual way (retried across reconnects).
* The broker begins the transaction on its first send or ack and adds each
  partition and subscription itself (KIP-890 part 2): ``begin_transaction``
  sends nothing. ``commit_transaction`` and ``abort_transaction`` answer the
  identity of the next transaction (the epoch bumped), which the producer
  takes. A transaction that sent and acknowledged nothing ends (or
  prepares) in the producer alone, keeping its identity, as Kafka's
  clients do; so a commit the broker finds nothing ongoing for is one a
  broker restart lost before any of it was durable, and it is refused
  (``TransactionAbortableError``), never reported done.
* ``prepare_transaction`` (2PC only) asks the broker to make the
  transaction PREPARED (durable; it survives a broker restart and never
  times out) once every send is answered (written behind them, as above):
  an explicit step, because txnbuf answers sends before they are durable.
  ``complete_transaction(state)`` commits if ``state`` names the prepared
  transaction, else aborts; nothing ongoing, nothing to do.
* In a cluster (docs/cluster.md) the producer talks to the owner of its
  transactional id's slot (``crc32(transactional id) % slots``), whose
  coordinator of that slot holds its producer ids, and follows it when it
  moves (`client._brokers`' ``Route``: looked up again and the request made
  again there; sends are deduplicated by partition, epoch and sequence,
  the END and PREPARE answer as done when repeated). The coordinator's
  recovery on a new owner aborts an ongoing transaction, as a restart
  does: its next send or commit raises, and ``abort_transaction`` goes on.
  A send to a topic served by another broker goes to that topic's owner
  (its own ``Route``), and ``send_offsets_to_transaction`` to the
  consumer's broker: that broker checks it with the producer's coordinator
  and answers it once durable; the commit is written only once every send
  is answered (not behind them on one link).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import time
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from proto import txnbuf_pb2 as pb

from ._brokers import Route
from ._connection import Command, Connection, Link, Type, command
from ._consumer import Consumer, message_id_of
from ._message import Message, MessageId, new_message_id
from ._producer import MAX_ENVELOPE, _check_size
from .errors import (
    ClosedError,
    InvalidInputError,
    InvalidTxnStateError,
    OperationTimeoutError,
    TxnbufError,
)

__all__ = ["PreparedTxnState", "ProducerState", "TransactionalProducer"]

BATCH_MAX_MESSAGES = 1000
BATCH_MAX_BYTES = 1024 * 1024  # payload bytes in one PRODUCE (one message may pass it alone)


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


_Entry = tuple[bytes, str | None, Mapping[str, str] | None]  # value, key, properties


@dataclass(slots=True)
class _Partition:
    """A partition's messages of the current transaction and epoch."""

    next_seq: int = 0
    queued: list[_Entry] = field(default_factory=list)
    futures: list[asyncio.Future[MessageId]] = field(default_factory=list)
    inflight: asyncio.Task[None] | None = None  # the PRODUCE awaiting its answer
    link: Link | None = None  # where that was written (None: not yet, or by the retrying path)
    route: Route | None = None  # its topic's owner, when not the producer's broker (a cluster)


class TransactionalProducer:
    """Create with ``Client.create_transactional_producer``; see the module docstring."""

    def __init__(
        self,
        route: Route,
        transactional_id: str,
        transaction_timeout: float,
        enable_2pc: bool,
    ) -> None:
        self._route = route  # (the owner of the transactional id's coordinator)
        self.transactional_id = transactional_id
        self.transaction_timeout = transaction_timeout
        self.enable_2pc = enable_2pc
        self.producer_id = -1
        self.epoch = -1
        self.state = ProducerState.UNINITIALIZED
        self._prepared = PreparedTxnState()  # the prepared (or kept) transaction
        self._partitions: dict[tuple[str, int], _Partition] = {}
        self._topics: dict[str, int] = {}  # topic -> its partitions
        self._elsewhere: dict[str, Route] = {}  # topics whose owner is another broker's
        self._round_robin = itertools.count()
        self._failure: TxnbufError | None = None  # the first send or ack that failed
        self._framing = False  # a frame-what-is-queued call is scheduled
        self._began = False  # this transaction sent or acknowledged something

    @property
    def _conn(self) -> Connection:
        return self._route.conn

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
        try:
            return await self._route.request(_with_id(build), expect, what)
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
        self._began = not self._prepared.empty

    def _new_identity(self, producer_id: int, epoch: int) -> None:
        self.producer_id, self.epoch = producer_id, epoch
        self._partitions.clear()  # sequences start again at 0 with each epoch
        self._failure = None

    async def begin_transaction(self) -> None:
        """Begin a transaction (sends nothing: the broker begins it on the first send)."""
        self.state = self._move(_C.BEGIN)
        self._began = False

    async def close(self) -> None:
        """Abandon the producer (an ongoing transaction is left to its
        timeout or to the next instance's init_transactions)."""
        for part in self._partitions.values():
            if part.inflight is not None:
                part.inflight.cancel()
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
        if self.state is not ProducerState.IN_TRANSACTION:
            self._move(_C.SEND)  # (raises: a send is allowed only in a transaction)
        self._began = True
        if type(value) is not bytes:
            if not isinstance(value, bytearray | memoryview):
                raise InvalidInputError(f"value must be bytes, not {type(value).__name__}")
            value = bytes(value)
        rough = len(value) + MAX_ENVELOPE  # (at least its size encoded)
        if key is not None:
            rough += 4 * len(key)
        if properties:
            rough += _properties_bytes(properties)
        if rough > self._conn.max_message_size:
            _check_size(value, key, properties, 0, self._conn.max_message_size)
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
            part.route = self._elsewhere.get(topic)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[MessageId] = loop.create_future()
        part.queued.append((value, key, properties))
        part.futures.append(future)
        if not self._framing:
            self._framing = True
            loop.call_soon(self._frame_queued)
        return future

    async def _partitions_of(self, topic: str) -> int:
        """How many partitions ``topic`` has, asked once; in a cluster, at
        the topic's owner, which must be the producer's broker (see the
        module docstring)."""
        route = Route(self._route.brokers, topic=topic)
        reply = await route.request(
            lambda rid: command(
                Type.PARTITIONED_METADATA, "partitioned_metadata", request_id=rid, topic=topic
            ),
            Type.PARTITIONED_METADATA_RESPONSE,
            f"partitions of {topic!r}",
        )
        if route.conn is not self._conn:
            # (its sends go to its owner, which checks them with the
            # producer's coordinator: docs/cluster.md)
            self._elsewhere[topic] = route
        self._topics[topic] = reply.partitioned_metadata_response.partitions
        return self._topics[topic]

    def _frame_queued(self) -> None:
        """Write a PRODUCE for each partition with messages queued and none in flight."""
        self._framing = False
        for (topic, index), part in self._partitions.items():
            if part.queued and part.inflight is None:
                self._produce(topic, index, part)

    def _produce(self, topic: str, index: int, part: _Partition) -> None:
        """Frame what is queued on a partition (up to `BATCH_MAX_MESSAGES`
        and `BATCH_MAX_BYTES`, at least one message)
        as one PRODUCE, write it now if a link is ready, and await its
        answer in a task."""
        count, size = 0, 0
        for value, _, _ in part.queued[:BATCH_MAX_MESSAGES]:
            size += len(value)
            if count and size > BATCH_MAX_BYTES:
                break
            count += 1
        entries = part.queued[:count]
        futures = part.futures[:count]
        del part.queued[:count], part.futures[:count]
        first = part.next_seq
        part.next_seq += len(entries)
        batch = pb.EntryBatch()
        add = batch.messages.add
        now_ms = time.time_ns() // 1_000_000
        for seq, (value, key, properties) in enumerate(entries, first):
            # Field by field: cheaper than keyword arguments (per message).
            message = add()
            message.payload = value
            message.sequence_id = seq
            message.publish_time_ms = now_ms
            if key is not None:
                message.key = key
            if properties:
                message.properties.update(properties)
        cmd = command(
            Type.PRODUCE,
            "produce",
            topic=topic,
            partition=index,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            first_sequence=first,
            batch=batch.SerializeToString(),
        )
        conn = self._conn if part.route is None else part.route.conn
        part.inflight = asyncio.get_running_loop().create_task(
            self._produced(topic, index, part, cmd, futures, conn.ready_link())
        )

    async def _produced(
        self,
        topic: str,
        index: int,
        part: _Partition,
        cmd: Command,
        futures: list[asyncio.Future[MessageId]],
        link: Link | None,
    ) -> None:
        """Write a PRODUCE (on ``link`` if given), settle its futures with
        its answer; then frame what queued meanwhile."""
        try:
            reply = await self._answer(part, cmd, link, f"send to {topic}/{index}")
        except TxnbufError as exc:
            if self._failure is None:
                self._failure = exc
            _fail_all(futures, exc)
        else:
            first = reply.producer_txn_response.first_batch_index
            for i, f in enumerate(futures, first):
                if not f.done():
                    f.set_result(new_message_id((index, -1, i)))
        finally:
            part.inflight = part.link = None
        if part.queued and self.state is not ProducerState.CLOSED:
            self._produce(topic, index, part)

    async def _answer(
        self, part: _Partition, cmd: Command, link: Link | None, what: str
    ) -> Command:
        """The answer to ``cmd``, written on ``link`` first if one is given
        (``part.link`` says so while it is in flight there); a retriable
        failure there (the link died, the broker was busy), or no link, makes
        it the retrying way."""
        conn = self._conn if part.route is None else part.route.conn
        if link is not None:
            part.link = link  # (request_on writes before it first waits)
            try:
                return await conn.request_on(
                    link, _with_id(cmd), Type.PRODUCER_TXN_RESPONSE, what, conn.deadline()
                )
            except TxnbufError as exc:
                if not exc.retriable or isinstance(exc, OperationTimeoutError):
                    raise self._fail(exc) from None
            part.link = None
        if part.route is not None:  # (at its topic's owner, found again if it moved)
            try:
                return await part.route.request(_with_id(cmd), Type.PRODUCER_TXN_RESPONSE, what)
            except TxnbufError as exc:
                raise self._fail(exc) from None
        return await self._request(cmd, Type.PRODUCER_TXN_RESPONSE, what)

    async def _sent(self) -> None:
        """Wait until every queued send is answered; raise the first failure."""
        self._frame_queued()
        while True:
            pending = [p.inflight for p in self._partitions.values() if p.inflight is not None]
            if not pending:
                break
            await asyncio.wait(pending)
        if self._failure is not None:
            raise self._failure

    async def _behind_sends(self, cmd: Command, what: str) -> Command:
        """``cmd`` (END_PRODUCER_TXN COMMIT or PREPARE_PRODUCER_TXN) written
        right behind the transaction's PRODUCEs, and its answer; see the
        module docstring. Raises the first send or ack that failed, else the
        broker's refusal (through `_fail`)."""
        link = await self._pipelined_link()
        refused: TxnbufError | None = None
        if link is not None:
            try:
                return await self._conn.request_on(
                    link, _with_id(cmd), Type.PRODUCER_TXN_RESPONSE, what, self._conn.deadline()
                )
            except TxnbufError as exc:
                refused = exc
        try:
            await self._sent()  # (when refused: the sends' answers came first)
        except TxnbufError as exc:
            raise self._fail(exc) from None
        if refused is not None and (
            not refused.retriable or isinstance(refused, OperationTimeoutError)
        ):
            raise self._fail(refused) from None
        return await self._request(cmd, Type.PRODUCER_TXN_RESPONSE, what)

    async def _pipelined_link(self) -> Link | None:
        """The link an END or PREPARE can follow the sends on: every queued
        message framed now and written on it (else None)."""
        self._frame_queued()
        if any(p.inflight is not None and p.link is None for p in self._partitions.values()):
            # The PRODUCE tasks just made run first (tasks start in the order
            # they were made) and write their frames before they wait.
            await asyncio.sleep(0)
        link = self._conn.ready_link()
        if link is None or self._failure is not None:
            return None
        for part in self._partitions.values():
            if part.queued or (part.inflight is not None and part.link is not link):
                return None
        return link

    async def send_offsets_to_transaction(
        self, consumer: Consumer, messages: Iterable[Message | MessageId]
    ) -> None:
        """Acknowledge ``messages`` (received by ``consumer`` of this client)
        in the ongoing transaction: PENDING_ACK until it commits, back to
        pending if it aborts (Kafka's sendOffsetsToTransaction)."""
        self._move(_C.OFFSETS)
        conn = consumer._conn
        if conn is not self._conn and (conn.router is None or conn.router is not self._conn.router):
            raise InvalidInputError("the consumer must belong to the producer's client")
        positions: list[int] = []
        for m in messages:
            mid = message_id_of(m)
            positions += (mid.partition, mid.entry_id, mid.batch_index)
        if not positions:
            return
        self._began = True
        request = command(
            Type.TXN_OFFSETS,
            "txn_offsets",
            consumer_id=consumer.consumer_id,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
        )
        request.txn_offsets.positions.extend(positions)
        try:
            if conn is self._conn:
                await self._request(
                    request, Type.PRODUCER_TXN_RESPONSE, "send_offsets_to_transaction"
                )
            else:  # (on the consumer's connection: its topic's owner, which checks it
                # with the producer's coordinator and answers once durable)
                try:
                    await conn.request(
                        _with_id(request),
                        Type.PRODUCER_TXN_RESPONSE,
                        "send_offsets_to_transaction",
                    )
                except TxnbufError as exc:
                    raise self._fail(exc) from None
        except TxnbufError as exc:
            if self._failure is None:
                self._failure = exc
            raise

    # -- ending -----------------------------------------------------------------------

    async def commit_transaction(self) -> None:
        """Commit: every send answered (raising the first failure, after
        which only ``abort_transaction`` goes on), then commit and take the
        next identity (see the module docstring)."""
        after = self._move(_C.COMMIT)
        if not self._began:  # (nothing to commit: the identity stays)
            self.state = after
            self._prepared = PreparedTxnState()
            return
        end = self._end_command(pb.COMMIT)
        if self.state is ProducerState.IN_TRANSACTION:
            reply = await self._behind_sends(end, "commit_transaction")
        else:
            reply = await self._request(end, Type.PRODUCER_TXN_RESPONSE, "commit_transaction")
        self._ended(reply)
        self.state = after

    async def abort_transaction(self) -> None:
        """Abort the ongoing transaction (what is still queued is dropped)."""
        after = self._move(_C.ABORT)
        dropped = InvalidTxnStateError("abort_transaction() dropped this send before it was sent")
        for part in self._partitions.values():
            _fail_all(part.futures, dropped)
            part.queued.clear()
            part.futures.clear()
        try:
            await self._sent()
        except TxnbufError:
            pass  # (aborting anyway)
        if not self._began:  # (nothing to abort: the identity stays)
            self.state = after
            self._prepared = PreparedTxnState()
            self._failure = None
            return
        end = self._end_command(pb.ABORT)
        self._ended(await self._request(end, Type.PRODUCER_TXN_RESPONSE, "abort_transaction"))
        self.state = after

    def _end_command(self, action: pb.TxnAction) -> Command:
        return command(
            Type.END_PRODUCER_TXN,
            "end_producer_txn",
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            txn_action=action,
        )

    def _ended(self, reply: Command) -> None:
        answer = reply.producer_txn_response
        self._new_identity(answer.producer_id, answer.producer_epoch)
        self._prepared = PreparedTxnState()

    async def prepare_transaction(self) -> PreparedTxnState:
        """KIP-939: wait for every send, make the transaction PREPARED
        (durable; it survives a broker restart and never times out), and
        return its state to store with the application's own data."""
        after = self._move(_C.PREPARE)
        if not self._began:  # (nothing to prepare: completing it commits nothing)
            self._prepared = PreparedTxnState.of(self.producer_id, self.epoch)
            self.state = after
            return self._prepared
        reply = await self._behind_sends(
            command(
                Type.PREPARE_PRODUCER_TXN,
                "prepare_producer_txn",
                producer_id=self.producer_id,
                producer_epoch=self.epoch,
            ),
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


def _fail_all(futures: list[asyncio.Future[MessageId]], exc: TxnbufError) -> None:
    for f in futures:
        if not f.done():
            f.set_exception(exc)
            f.exception()  # (commit_transaction reports it: never "unretrieved")


def _with_id(cmd: Command) -> Callable[[int], Command]:
    """``cmd`` with a request id, as `Connection.request` builds a request."""

    def build(request_id: int) -> Command:
        getattr(cmd, cmd.WhichOneof("command")).request_id = request_id
        return cmd

    return build


def _properties_bytes(properties: Mapping[str, str]) -> int:
    """At least as many bytes as ``properties`` take encoded."""
    return sum(4 * (len(k) + len(v)) + 12 for k, v in properties.items())
