"""One client connection: a WebSocket of `BaseCommand` frames.

The read loop decodes each frame and hands it to the handler of its type.
Work that must keep the order of frames (queueing a send's append, granting
permits) happens in the read loop; work that waits (durable acks, receipts,
topic creation) runs in tasks, so one slow request never stalls the others.
Answers go through one writer task, in order; the answers ready at once go
as one BATCH frame (one write, one wake-up on each side), and a BATCH from
the client is handled command by command.

The connection serves the commands of the data plane itself (CONNECT,
PRODUCER, SEND, SUBSCRIBE, FLOW, ACK, ...) and pulls in the handler tables
of the other modules: `broker._transactions` (one `Transactions` per
connection), `broker._epoch`, `broker._reader`, `broker._groups`,
`broker._seek`. Each table takes the connection as a
`broker._context.Context` and none imports this module; a command type has
one handler, whatever order the tables come in (`merge_handlers`).

The connection speaks one protocol version, `PROTOCOL_VERSION` (see
proto/txnbuf.proto): a CONNECT asking for another is answered with an ERROR
naming both, and the connection is closed.

Bad input (an undecodable frame, an unknown command, an illegal name, a send
on a closed producer, an ack of an unknown message) is answered with an
error and changes nothing; the connection stays up. A handler refuses by
raising a `proto.refusals.Refusal`; whatever else it raises is a bug,
answered UNKNOWN_ERROR and logged (`broker._errors`).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Coroutine, Sequence
from itertools import repeat
from typing import Any, Protocol

from aiohttp import WSMsgType, web
from google.protobuf.message import DecodeError

from broker._auth import ANONYMOUS, NOBODY, Principal
from broker._broker import Broker, ConnectedProducer
from broker._context import Handlers, command, merge_handlers, success
from broker._epoch import epoch_handlers
from broker._errors import REFUSALS, error_code, error_text
from broker._group_cursors import group_cursor_handlers
from broker._groups import group_handlers
from broker._local import LocalCommits
from broker._reader import reader_handlers
from broker._seek import seek_handlers
from broker._transactions import CLUSTER_ROLE, Transactions
from buffer import (
    MessageId,
    Partition,
    PublishResult,
    SendRejectedError,
    check_consumer_name,
    check_producer_name,
    check_subscription_name,
    check_topic_name,
    decode_send,
)
from proto import MAX_MESSAGE_SIZE, next_frame, refusals
from proto import txnbuf_pb2 as pb
from subscriptions import Consumer, SubType
from tc import TxnID, wire_txnid

__all__ = ["CLUSTER_ROLE", "PROTOCOL_VERSION", "Connection", "Socket"]

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 7  # the only one served (proto/txnbuf.proto)
SERVER_VERSION = "txnbuf/0.1.0"

T = pb.BaseCommand
_BODY_TYPE = {name.lower(): value for name, value in T.Type.items()}
_MAX_RANGE = 1 << 20  # messages in one ACK range (an entry holds fewer: a frame is 5 MiB)
_SUB_TYPES = {
    pb.CommandSubscribe.EXCLUSIVE: SubType.EXCLUSIVE,
    pb.CommandSubscribe.SHARED: SubType.SHARED,
    pb.CommandSubscribe.FAILOVER: SubType.FAILOVER,
}


class Socket(Protocol):
    """What a connection writes to: aiohttp's WebSocket, or a stream
    listener's socket (`broker._stream`)."""

    @property
    def closed(self) -> bool: ...

    async def send_bytes(self, data: bytes) -> None: ...

    async def close(self) -> bool | None: ...


class Connection:
    @classmethod
    def admit(
        cls, broker: Broker, ws: Socket, peer: str, url: str | None = None
    ) -> Connection | bytes:
        """A new connection of ``broker`` over ``ws``, counted in
        ``broker.connections`` until its `run` or `run_fed` ends; or, when
        ``broker`` serves its ``--max-connections`` already, the ERROR frame
        (TOO_MANY_REQUESTS: the client tries again later) that the listener
        sends before it closes ``ws``. Every data-plane listener admits its
        connections here."""
        refusal = broker.security.refuse_connection(len(broker.connections))
        if refusal is not None:
            return refusal
        conn = cls(broker, ws, peer, url)
        broker.connections.add(conn)
        return conn

    def __init__(self, broker: Broker, ws: Socket, peer: str, url: str | None = None) -> None:
        self.broker = broker
        self.ws = ws
        self.peer = peer
        # The URL of the listener this connection came on, if not the
        # broker's (LOOKUP answers it).
        self._url = url
        self.producers: dict[int, ConnectedProducer] = {}
        self.consumers: dict[int, Consumer] = {}
        # Who this connection is (`broker._auth`): until it authenticates,
        # NOBODY, which may send nothing but CONNECT; the anonymous
        # principal if the broker authenticates nobody. ``roles``: what
        # `require_role` looks for.
        self.who: Principal = broker.security.anonymous
        self.roles: frozenset[str] = self.who.roles
        self._connected = False  # a CONNECT was answered (a later one keeps the role)
        self._expiry: asyncio.TimerHandle | None = None  # the token's end
        self._hangup = False  # close the socket once the answers queued are written
        self._out: collections.deque[bytes] = collections.deque()
        self._out_ready = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        self.txns = txns = Transactions(self)
        own: Handlers = {
            T.CONNECT: self._on_connect,
            T.PARTITIONED_METADATA: self._on_partitioned_metadata,
            T.LOOKUP: self._on_lookup,
            T.PRODUCER: self._on_producer,
            T.CLOSE_PRODUCER: self._on_close_producer,
            T.SEND: self._on_send,
            T.SUBSCRIBE: self._on_subscribe,
            T.FLOW: self._on_flow,
            T.ACK: self._on_ack,
            T.REDELIVER_UNACKNOWLEDGED: self._on_redeliver,
            T.CLOSE_CONSUMER: self._on_close_consumer,
            T.PING: self._on_ping,
            T.PONG: lambda cmd: None,
            T.COMMIT_TXN: LocalCommits(self, txns).on_commit_txn,  # (the local path)
            T.BATCH: self._on_batch,
        }
        self._handlers = merge_handlers(
            own,
            txns.handlers(),  # (PIP-31 transactions)
            epoch_handlers(self),  # (the producer-epoch mode)
            reader_handlers(self),  # (reading by position)
            group_handlers(self),  # (transaction groups)
            seek_handlers(self),  # (a consumer's seek and unsubscribe)
            group_cursor_handlers(self),  # (a Kafka group's offsets, from its coordinator)
        )

    # -- the loops ------------------------------------------------------------------

    async def run(self) -> None:
        """Serve the WebSocket's frames until it closes."""
        ws = self.ws
        assert isinstance(ws, web.WebSocketResponse)
        writer = asyncio.get_running_loop().create_task(self._write_loop())
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    self.on_frame(msg.data)
                elif msg.type == WSMsgType.TEXT:
                    self._error(0, pb.MALFORMED_FRAME, "frames must be binary BaseCommand messages")
                elif msg.type == WSMsgType.ERROR:
                    log.info("connection %s failed: %s", self.peer, ws.exception())
                    break
        finally:
            await self._ended(writer)

    async def run_fed(self, gone: asyncio.Future[None]) -> None:
        """Serve a socket that hands each frame to `on_frame` as it reads
        it (`broker._stream`), until ``gone`` is done."""
        writer = asyncio.get_running_loop().create_task(self._write_loop())
        try:
            await gone
        finally:
            await self._ended(writer)

    async def _ended(self, writer: asyncio.Task[None]) -> None:
        """Close, let ``writer`` finish, and leave the broker's count (`admit`)."""
        try:
            self.close()
            self._out_ready.set()
            await writer
        finally:
            self.broker.connections.discard(self)

    async def _write_loop(self) -> None:
        while True:
            await self._out_ready.wait()
            self._out_ready.clear()
            while self._out:
                if self.ws.closed:
                    self._out.clear()
                    break
                try:
                    await self.ws.send_bytes(next_frame(self._out))
                except (ConnectionError, RuntimeError) as exc:
                    log.info("connection %s: write failed: %s", self.peer, exc)
                    self._out.clear()
                    break
            if self._hangup and not self.ws.closed:
                await self.ws.close()
            if self._closed:
                return

    def send(self, cmd: pb.BaseCommand) -> None:
        if self._closed:
            return
        self._out.append(cmd.SerializeToString())
        self._out_ready.set()

    def close(self) -> None:
        """Forget this connection's producers and consumers (unacked -> redelivery)."""
        if self._closed:
            return
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()
        for consumer in self.consumers.values():
            self.broker.subscriptions.detach(consumer)
        self.consumers.clear()
        for producer in self.producers.values():
            self.broker.release_producer(producer.topic.name, producer.name, self)
        self.producers.clear()
        # Tasks still running (receipts, acks) are left to finish: an ack or
        # a send already queued to the ledger completes, and its answer is
        # dropped (the client retries it on its next connection).

    async def shut(self) -> None:
        """`close`, and close the socket (the broker stops)."""
        self.close()
        await self.ws.close()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- dispatch -------------------------------------------------------------------

    def on_frame(self, data: bytes) -> None:
        """Handle one frame read off the socket (`run` calls it for the
        WebSocket's messages, a stream listener for each frame it cuts)."""
        try:
            cmd = pb.BaseCommand.FromString(data)
        except DecodeError:
            self._error(0, pb.MALFORMED_FRAME, "frame is not a valid BaseCommand")
            return
        self._handle(cmd)

    def _on_batch(self, cmd: pb.BaseCommand) -> None:
        for inner in cmd.batch.commands:
            if inner.type == T.BATCH:
                self._error(0, pb.MALFORMED_FRAME, "a BATCH may not hold a BATCH")
            else:
                self._handle(inner)

    def _handle(self, cmd: pb.BaseCommand) -> None:
        if self.who is NOBODY and cmd.type != T.CONNECT:
            self._refuse_unauthenticated(cmd)
            return
        handler = self._handlers.get(cmd.type)
        body = cmd.WhichOneof("command")
        if handler is None or body is None or _BODY_TYPE.get(body) != cmd.type:
            name = T.Type.Name(cmd.type) if cmd.type in T.Type.values() else str(cmd.type)
            self._error(
                0, pb.UNKNOWN_COMMAND, f"unknown command type {name} (body {body or 'missing'})"
            )
            return
        try:
            handler(cmd)
        except Exception as exc:
            what = f"connection {self.peer}: {body}"
            self._error(_request_id(cmd), error_code(exc, what), error_text(exc))

    def _error(self, request_id: int, code: pb.ServerError, message: str) -> None:
        self.send(
            command(
                T.ERROR,
                "error",
                pb.CommandError(request_id=request_id, error=code, message=message),
            )
        )

    def answer(self, request_id: int, work: Awaitable[pb.BaseCommand | None], what: str) -> None:
        """Run ``work`` in a task; send its answer, or an ERROR if it raises."""

        async def run() -> None:
            try:
                answer = await work
            except Exception as exc:
                code = error_code(exc, f"connection {self.peer}: {what}")
                self._error(request_id, code, error_text(exc))
                return
            if answer is not None:
                self.send(answer)

        self.spawn(run())

    # -- handlers -------------------------------------------------------------------

    def _on_connect(self, cmd: pb.BaseCommand) -> None:
        version = cmd.connect.protocol_version
        if version != PROTOCOL_VERSION:
            self._error(
                0,
                pb.INVALID_ARGUMENT,
                f"CONNECT asks for wire protocol version {version}, but this broker "
                f"({SERVER_VERSION}) speaks version {PROTOCOL_VERSION} only: use a client "
                "that speaks it",
            )
            self._hang_up()
            return
        if not self._authenticate(cmd.connect):
            return
        self.send(
            command(
                T.CONNECTED,
                "connected",
                pb.CommandConnected(
                    server_version=SERVER_VERSION,
                    protocol_version=PROTOCOL_VERSION,
                    max_message_size=MAX_MESSAGE_SIZE,
                    tc_ids=sorted(self.broker.coordinators),
                    slots=self.broker.store.slot_count if self.broker.cluster is not None else 0,
                ),
            )
        )

    def _on_ping(self, cmd: pb.BaseCommand) -> None:
        self.send(command(T.PONG, "pong", pb.CommandPong()))

    def _on_partitioned_metadata(self, cmd: pb.BaseCommand) -> None:
        req = cmd.partitioned_metadata

        async def work() -> pb.BaseCommand:
            resp = pb.CommandPartitionedMetadataResponse(request_id=req.request_id)
            try:
                name = check_topic_name(req.topic)
                self.broker.security.allow_lookup(self.who, name)
                count = self.broker.topics.partition_count(name)  # (loaded or not)
                if count is None:
                    count = len((await self.broker.topics.get_or_create(name)).partitions)
                resp.partitions = count
            except REFUSALS as exc:  # (a bad name, no permission, another broker's slot)
                resp.error = error_code(exc)
                resp.message = str(exc)
            return command(T.PARTITIONED_METADATA_RESPONSE, "partitioned_metadata_response", resp)

        self.answer(req.request_id, work(), "partitioned metadata")

    def _on_lookup(self, cmd: pb.BaseCommand) -> None:
        """Pulsar's lookup: CONNECT (served here) or REDIRECT to the owner of
        the topic's or coordinator's slot (a cluster); NOT_OWNER while no
        live broker owns it."""
        req = cmd.lookup
        cluster = self.broker.cluster

        async def work() -> pb.BaseCommand:
            resp = pb.CommandLookupTopicResponse(
                request_id=req.request_id,
                broker_service_url=self._url or self.broker.url,
                authoritative=True,
            )
            try:
                if req.HasField("tc_id"):
                    if cluster is not None:
                        owner = await cluster.coordinator_owner(req.tc_id)
                    elif req.tc_id in self.broker.coordinators:
                        owner = ""
                    else:
                        raise refusals.TransactionCoordinatorNotFound(
                            f"no coordinator {req.tc_id} here "
                            f"(coordinators: {sorted(self.broker.coordinators)})"
                        )
                else:
                    check_topic_name(req.topic)
                    self.broker.security.allow_lookup(self.who, req.topic)
                    owner = "" if cluster is None else await cluster.topic_owner(req.topic)
                if owner:
                    resp.response = pb.CommandLookupTopicResponse.REDIRECT
                    resp.broker_service_url = owner
            except REFUSALS as exc:
                resp.error = error_code(exc)
                resp.message = str(exc)
            return command(T.LOOKUP_RESPONSE, "lookup_response", resp)

        self.answer(req.request_id, work(), "lookup")

    def _on_producer(self, cmd: pb.BaseCommand) -> None:
        req = cmd.producer

        async def work() -> pb.BaseCommand:
            name = check_topic_name(req.topic)
            self.broker.security.allow_produce(self.who, name)
            if not req.producer_name:
                raise refusals.InvalidArgument("producer_name is required")
            check_producer_name(req.producer_name)
            topic = await self.broker.topics.get_or_create(name)
            if self._closed:
                # Closed while the topic loaded (a slot handed over, the
                # broker dropping everything): `close` released this
                # connection's producers already, so a name claimed now
                # would stay claimed by a dead connection, and the client's
                # producer be refused PRODUCER_BUSY on every connection.
                raise refusals.ServiceNotReady("this connection closed; connect again")
            held = self.producers.get(req.producer_id)
            if held is None:
                self.broker.security.allow_another("producer", len(self.producers))
            elif (held.name, held.topic.name) != (req.producer_name, topic.name):
                raise refusals.InvalidArgument(
                    f"producer id {req.producer_id} is in use on this connection"
                )
            # (A producer created again under its id: a cluster's client moves
            # a producer whose send was refused NOT_OWNER, and the lookup may
            # name this broker again. Answered as a creation.)
            self.broker.claim_producer(topic.name, req.producer_name, self)
            self.producers[req.producer_id] = ConnectedProducer(
                req.producer_id, req.producer_name, topic
            )
            last = max(p.dedup.last_sequence_id(req.producer_name) for p in topic.partitions)
            return command(
                T.PRODUCER_SUCCESS,
                "producer_success",
                pb.CommandProducerSuccess(
                    request_id=req.request_id,
                    producer_name=req.producer_name,
                    last_sequence_id=last,
                    partitions=len(topic.partitions),
                ),
            )

        self.answer(req.request_id, work(), "create producer")

    def _on_close_producer(self, cmd: pb.BaseCommand) -> None:
        req = cmd.close_producer
        producer = self.producers.pop(req.producer_id, None)
        if producer is None:
            self._error(
                req.request_id,
                pb.PRODUCER_NOT_FOUND,
                f"no producer {req.producer_id} on this connection",
            )
            return
        self.broker.release_producer(producer.topic.name, producer.name, self)
        self.send(success(req.request_id))

    def _on_send(self, cmd: pb.BaseCommand) -> None:
        """Handle a SEND. A transactional one adds its partition to the
        transaction (KIP-890 part 2), and is counted among its transaction's
        unanswered operations while it waits, so that END_TXN after_ops
        waits for it; one answered at once is never counted, unless it
        failed (the END learns why)."""
        req = cmd.send
        producer = self.producers.get(req.producer_id)
        counted = False
        read_at = time.perf_counter()

        def fail(code: pb.ServerError, message: str) -> None:
            if req.transactional:
                if not counted:
                    self.txns.op_read(req)
                self.txns.op_answered(req, message, code)
            self.send(
                command(
                    T.SEND_ERROR,
                    "send_error",
                    pb.CommandSendError(
                        producer_id=req.producer_id,
                        request_id=req.request_id,
                        error=code,
                        message=message,
                    ),
                )
            )

        if producer is None:
            fail(
                pb.PRODUCER_NOT_FOUND,
                f"no producer {req.producer_id} on this connection (closed, or never created)",
            )
            return
        try:  # (a grant revoked since the producer was created)
            self.broker.security.allow_produce(self.who, producer.topic.name)
        except refusals.Refusal as exc:
            fail(exc.code, str(exc))
            return
        if req.partition >= len(producer.topic.partitions):
            fail(
                pb.INVALID_ARGUMENT,
                f"topic {producer.topic.name!r} has no partition {req.partition}",
            )
            return
        partition = producer.topic.partitions[req.partition]
        try:
            messages = decode_send(req.batch, "SEND").messages
        except SendRejectedError as exc:
            fail(error_code(exc), str(exc))
            return
        first_seq = req.first_sequence_id if req.HasField("first_sequence_id") else None
        pending: Awaitable[PublishResult]
        try:
            if req.transactional and self.broker.remote_coordinator(
                txnid := wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
            ):
                # Its coordinator is on another broker: checked with it first
                # (it registers this partition, or refuses a transaction not
                # OPEN), then answered once durable (docs/cluster.md).
                pending = self._send_elsewhere_coordinated(
                    partition, txnid, producer.name, messages, req.batch, first_seq
                )
            elif req.transactional:
                # KIP-890's defense, part 2: the coordinator adds this
                # partition to the transaction, or refuses one not OPEN.
                self.broker.coordinator(txnid).add_partition(
                    txnid, producer.topic.name, req.partition
                )
                # Answered once queued: a crash that loses it aborts the
                # transaction (a lost send is never committed, see `tc`).
                pending = self.broker.publish_txn(
                    partition, txnid, producer.name, messages, req.batch, True, first_seq
                )
            else:
                pending = partition.publish(producer.name, messages, req.batch, first_seq)
        except Exception as exc:
            fail(error_code(exc, f"connection {self.peer}: send"), error_text(exc))
            return

        def answer(result: PublishResult) -> None:
            if counted:
                self.txns.op_answered(req, None)
            out = pb.BaseCommand(type=T.SEND_RECEIPT)
            ack = out.send_receipt  # (filled in place: no copy)
            ack.producer_id = req.producer_id
            ack.request_id = req.request_id
            ack.partition = req.partition
            ack.entry_id = result.entry_id
            ids = result.ids
            if ids is None:
                if req.transactional:  # (a plain send's run is the entry, from 0)
                    ack.first_batch_index = result.first
            else:
                for entry_id, index in ids:
                    ack.message_ids.add(
                        partition=req.partition, entry_id=entry_id, batch_index=index
                    )
            self.send(out)
            self.broker.metrics.send_seconds.observe(time.perf_counter() - read_at)

        if isinstance(pending, asyncio.Future) and pending.done() and not pending.cancelled():
            # Answered already (an early transactional send): no task, no
            # turn of the loop to wait for.
            error = pending.exception()
            if error is None:
                answer(pending.result())
            else:
                fail(error_code(error, f"connection {self.peer}: send"), error_text(error))
            return
        if req.transactional and not counted:
            self.txns.op_read(req)
            counted = True

        async def receipt() -> None:
            try:
                result: PublishResult = await pending
            except Exception as exc:
                fail(error_code(exc, f"connection {self.peer}: send"), error_text(exc))
                return
            answer(result)

        self.spawn(receipt())

    async def _send_elsewhere_coordinated(
        self,
        partition: Partition,
        txnid: TxnID,
        producer: str,
        messages: Sequence[pb.SingleMessage],
        encoded: bytes,
        first_seq: int | None,
    ) -> PublishResult:
        """A transactional send whose coordinator is on another broker:
        checked with (and registered at) the coordinator, then stored and
        answered once durable (never once queued: a commit decided there
        must not overtake it)."""
        cluster = self.broker.cluster
        assert cluster is not None
        await cluster.peers.register(txnid, partition.topic, partition=partition.index)
        return await self.broker.publish_txn(
            partition, txnid, producer, messages, encoded, False, first_seq
        )

    def _on_subscribe(self, cmd: pb.BaseCommand) -> None:
        req = cmd.subscribe

        async def work() -> pb.BaseCommand:
            topic_name = check_topic_name(req.topic)
            sub_name = check_subscription_name(req.subscription)
            self.broker.security.allow_consume(self.who, topic_name, sub_name)
            if req.consumer_name:
                check_consumer_name(req.consumer_name)
            if req.sub_type not in _SUB_TYPES:
                raise refusals.InvalidArgument(f"unknown subscription type {req.sub_type}")
            if req.consumer_id in self.consumers:
                raise refusals.InvalidArgument(
                    f"consumer id {req.consumer_id} is in use on this connection"
                )
            self.broker.security.allow_another("consumer", len(self.consumers))
            topic = await self.broker.topics.get_or_create(topic_name)
            consumer = Consumer(
                consumer_id=req.consumer_id,
                name=req.consumer_name or f"{self.peer}-{req.consumer_id}",
                topic=topic.name,
                subscription=sub_name,
                sub_type=_SUB_TYPES[req.sub_type],
                push=self._push,
                on_active_change=self._active_change,
                read_uncommitted=req.read_uncommitted,
            )
            earliest = req.initial_position == pb.CommandSubscribe.EARLIEST
            await self.broker.subscriptions.subscribe(topic, sub_name, consumer, earliest)
            if self._closed:
                self.broker.subscriptions.detach(consumer)
                return success(req.request_id)
            self.consumers[req.consumer_id] = consumer
            return success(req.request_id)

        self.answer(req.request_id, work(), "subscribe")

    def _push(self, consumer: Consumer, entries: list[pb.DeliveredEntry]) -> None:
        self.send(
            command(
                T.MESSAGE,
                "message",
                pb.CommandMessage(consumer_id=consumer.consumer_id, entries=entries),
            )
        )

    def _active_change(self, consumer: Consumer, active: bool) -> None:
        self.send(
            command(
                T.ACTIVE_CONSUMER_CHANGE,
                "active_consumer_change",
                pb.CommandActiveConsumerChange(consumer_id=consumer.consumer_id, is_active=active),
            )
        )

    def _on_flow(self, cmd: pb.BaseCommand) -> None:
        consumer = self.consumers.get(cmd.flow.consumer_id)
        if consumer is None:
            self._error(0, pb.CONSUMER_NOT_FOUND, f"no consumer {cmd.flow.consumer_id}")
            return
        if not self._may_consume(consumer):
            return
        consumer.add_permits(cmd.flow.permits)

    def _on_ack(self, cmd: pb.BaseCommand) -> None:
        req = cmd.ack
        consumer = self.consumers.get(req.consumer_id)
        if req.transactional:
            self.txns.op_read(req)

        async def work() -> None:
            resp = pb.CommandAckResponse(consumer_id=req.consumer_id, request_id=req.request_id)
            try:
                if consumer is None:
                    raise refusals.ConsumerNotFound(
                        f"no consumer {req.consumer_id} on this connection"
                    )
                self.broker.security.allow_consume(self.who, consumer.topic, consumer.subscription)
                by_part = _ack_positions(req)
                cumulative = req.ack_type == pb.CommandAck.CUMULATIVE
                key = None
                early = False
                if req.transactional:
                    txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
                    key = txnid
                    cluster = self.broker.cluster
                    if cluster is not None and self.broker.remote_coordinator(txnid):
                        # (checked with its coordinator elsewhere, answered once durable)
                        await cluster.peers.register(
                            txnid, consumer.topic, subscription=consumer.subscription
                        )
                    else:
                        self.broker.coordinator(txnid).add_subscription(  # (as for a send)
                            txnid, consumer.topic, consumer.subscription
                        )
                        early = True  # (answered once queued, as a send)
                await self.broker.subscriptions.ack_positions(
                    consumer, by_part, cumulative, key, early
                )
            except Exception as exc:
                resp.error = error_code(exc, f"connection {self.peer}: ack")
                resp.message = error_text(exc)
            if req.transactional:
                failed = resp.HasField("error")
                self.txns.op_answered(req, resp.message if failed else None, resp.error)
            self.send(command(T.ACK_RESPONSE, "ack_response", resp))

        self.spawn(work())

    def _on_redeliver(self, cmd: pb.BaseCommand) -> None:
        req = cmd.redeliver_unacknowledged
        consumer = self.consumers.get(req.consumer_id)
        if consumer is None:
            self._error(0, pb.CONSUMER_NOT_FOUND, f"no consumer {req.consumer_id}")
            return
        if not self._may_consume(consumer):
            return
        ids = [MessageId(m.partition, m.entry_id, m.batch_index) for m in req.message_ids]
        self.broker.subscriptions.redeliver(consumer, ids or None)

    def _on_close_consumer(self, cmd: pb.BaseCommand) -> None:
        req = cmd.close_consumer
        consumer = self.consumers.pop(req.consumer_id, None)
        if consumer is None:
            self._error(
                req.request_id,
                pb.CONSUMER_NOT_FOUND,
                f"no consumer {req.consumer_id} on this connection",
            )
            return
        self.broker.subscriptions.detach(consumer)
        self.send(success(req.request_id))

    def require_role(self, role: str, what: str) -> None:
        """Refuse ``what`` (AUTHORIZATION_ERROR, nothing changes) unless this
        connection holds ``role``."""
        if role not in self.roles:
            raise refusals.AuthorizationError(
                f"{what} needs the {role!r} role, which this connection does not hold "
                "(only the cluster's brokers send it to each other)",
            )

    # -- authentication and authorization (`broker._auth`) ---------------------------

    def _authenticate(self, req: pb.CommandConnect) -> bool:
        """CONNECT's credentials make the connection's principal (a repeated
        CONNECT must keep the role). False if refused: AUTHENTICATION_ERROR
        is answered and the connection closed."""
        try:
            who = self.broker.security.authenticate(req.auth_method, req.auth_data)
            first = self.who is NOBODY or (self.who is ANONYMOUS and not self._connected)
            if not first and who.role != self.who.role:
                raise refusals.AuthenticationError(
                    f"this connection is {self.who.name}; a CONNECT cannot change it",
                )
        except refusals.Refusal as exc:
            self._error(0, exc.code, str(exc))
            self._hang_up()
            return False
        self.who, self.roles = who, who.roles
        self._connected = True
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        if who.expires is not None:
            delay = max(0.0, who.expires - time.time())
            self._expiry = asyncio.get_running_loop().call_later(delay, self._token_expired)
        return True

    def _token_expired(self) -> None:
        self._error(0, pb.AUTHENTICATION_ERROR, "the token has expired: connect with a new one")
        self._hang_up()

    def _refuse_unauthenticated(self, cmd: pb.BaseCommand) -> None:
        if not self._hangup:
            name = T.Type.Name(cmd.type) if cmd.type in T.Type.values() else str(cmd.type)
            self._error(
                _request_id(cmd),
                pb.AUTHENTICATION_ERROR,
                f"{name} before a CONNECT with a valid token: this broker serves only "
                "authenticated connections",
            )
            self._hang_up()

    def _hang_up(self) -> None:
        """Serve nothing more; close the socket once the answers queued are out."""
        self.who = NOBODY
        self.roles = frozenset()
        self._hangup = True
        self._out_ready.set()

    def _may_consume(self, consumer: Consumer) -> bool:
        """FLOW and REDELIVER (no answer of their own): False, after an
        ERROR, if the connection may no longer consume there."""
        try:
            self.broker.security.allow_consume(self.who, consumer.topic, consumer.subscription)
        except refusals.Refusal as exc:
            self._error(0, exc.code, str(exc))
            return False
        return True


def _ack_positions(req: pb.CommandAck) -> dict[int, list[tuple[int, int]]]:
    """An ACK's messages, ``partition -> [(entry_id, batch_index), ...]``,
    from its ``ranges`` quadruples (partition, entry_id, first_index,
    last_index). A cumulative ack names one range: its last message is the
    bound."""
    flat = req.ranges
    if not flat or len(flat) % 4:
        raise refusals.InvalidArgument(
            "ACK ranges come as (partition, entry_id, first_index, last_index) quadruples, at "
            f"least one; got {len(flat)} numbers",
        )
    if req.ack_type == pb.CommandAck.CUMULATIVE:
        if len(flat) != 4:
            raise refusals.InvalidArgument("a cumulative ACK names one range: its bound")
        return {flat[0]: [(flat[1], flat[3])]}
    by_part: dict[int, list[tuple[int, int]]] = {}
    for i in range(0, len(flat), 4):
        partition, entry_id, first, last = flat[i], flat[i + 1], flat[i + 2], flat[i + 3]
        if last < first or last - first >= _MAX_RANGE:
            raise refusals.InvalidArgument(
                f"ACK range {partition}:{entry_id}:{first}..{last} is empty or too long",
            )
        positions = by_part.get(partition)
        if positions is None:
            positions = by_part[partition] = []
        n = last - first + 1
        positions.extend(zip(repeat(entry_id, n), range(first, last + 1), strict=True))
    return by_part


def _request_id(cmd: pb.BaseCommand) -> int:
    body = cmd.WhichOneof("command")
    if body is None:
        return 0
    return int(getattr(getattr(cmd, body), "request_id", 0))
