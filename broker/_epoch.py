"""The producer-epoch mode's commands on a connection (Kafka's transactional
producer: KIP-98, KIP-890, KIP-939).

INIT_PRODUCER_ID goes to the coordinator the transactional id hashes to
(`tc.coordinator_of`; in a cluster, the coordinator of the id's slot, at
its owner); PRODUCE, TXN_OFFSETS, PREPARE_PRODUCER_TXN and
END_PRODUCER_TXN to the coordinator that issued the producer id (its high
bits). In a cluster a PRODUCE (TXN_OFFSETS) goes to the owner of its
topic's slot, which checks it with that coordinator when it runs on
another broker (`broker._peers`) and answers it once durable. A PRODUCE or
TXN_OFFSETS begins the producer's transaction if it has
none and adds its partition or subscription (KIP-890 part 2): the
coordinator checks the producer id and epoch, then the partition checks the
epoch and the sequence (`buffer.TransactionBuffer.publish`). Each is
answered with PRODUCER_TXN_RESPONSE (INIT_PRODUCER_ID with its own answer);
a refusal carries Kafka's error name (the `tc.ProducerEpochError` classes
carry those codes, see `broker._errors`) and changes nothing. Each is
checked against the ACL first (`broker._auth`): ``produce`` on the
transactional id, and on the topic of a PRODUCE, consume on the
subscription of a TXN_OFFSETS (`_allow_producer`).

A client may write END_PRODUCER_TXN COMMIT or PREPARE_PRODUCER_TXN right
behind its PRODUCEs and TXN_OFFSETS without waiting for their answers
(`_Unanswered`): frames are read in order, so the broker has read them all;
it goes on once each is answered, and only if none failed (else it refuses
with TRANSACTION_ABORTABLE, changing nothing: the client aborts). A PRODUCE
stored at once (the usual case) is answered before the next frame is read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass

from broker._context import Context, Handlers
from broker._errors import error_code, error_text
from buffer import PublishResult, Topic, check_topic_name, decode_send, epoch_producer_name
from ledger import on_outcome
from proto import refusals
from proto import txnbuf_pb2 as pb
from tc import TransactionAbortableError, coordinator_of_producer

__all__ = ["epoch_handlers"]

log = logging.getLogger(__name__)

T = pb.BaseCommand


def epoch_handlers(conn: Context) -> Handlers:
    """The handlers of the producer-epoch commands, for ``conn``'s dispatch table."""
    unanswered = _Unanswered()
    return {
        T.INIT_PRODUCER_ID: lambda cmd: _init_producer_id(conn, cmd),
        T.PRODUCE: lambda cmd: _produce(conn, cmd, unanswered),
        T.TXN_OFFSETS: lambda cmd: _txn_offsets(conn, cmd, unanswered),
        T.PREPARE_PRODUCER_TXN: lambda cmd: _prepare(conn, cmd, unanswered),
        T.END_PRODUCER_TXN: lambda cmd: _end(conn, cmd, unanswered),
    }


@dataclass(slots=True)
class _Ops:
    """A producer identity's PRODUCEs and TXN_OFFSETS read on a connection:
    how many are not answered yet, and the first that failed."""

    epoch: int
    pending: int = 0
    failure: BaseException | None = None
    settled: asyncio.Future[None] | None = None  # done when pending drops to 0


class _Unanswered:
    """A connection's `_Ops`, one per producer id (its current epoch): an
    entry lives while a request is unanswered, or until the END or PREPARE
    after a failure."""

    def __init__(self) -> None:
        self._by_pid: dict[int, _Ops] = {}

    def read(self, pid: int, epoch: int) -> _Ops:
        """A request of (``pid``, ``epoch``) is read; `answered` once it is answered."""
        ops = self._by_pid.get(pid)
        if ops is None or ops.epoch != epoch:
            ops = self._by_pid[pid] = _Ops(epoch)
        ops.pending += 1
        return ops

    def answered(self, pid: int, ops: _Ops, error: BaseException | None) -> None:
        ops.pending -= 1
        if error is not None and ops.failure is None:
            ops.failure = error
        if ops.pending == 0:
            if ops.settled is not None and not ops.settled.done():
                ops.settled.set_result(None)
            if ops.failure is None and self._by_pid.get(pid) is ops:
                del self._by_pid[pid]

    def failed(self, pid: int, epoch: int, error: BaseException) -> None:
        """A request of (``pid``, ``epoch``) refused as it was read."""
        self.answered(pid, self.read(pid, epoch), error)

    def waiting(self, pid: int, epoch: int) -> bool:
        """Whether a request of (``pid``, ``epoch``) is unanswered or failed."""
        ops = self._by_pid.get(pid)
        return ops is not None and ops.epoch == epoch

    async def settle(self, pid: int, epoch: int, what: str) -> None:
        """Wait until every request of (``pid``, ``epoch``) read so far is
        answered; raise `TransactionAbortableError` if one failed."""
        ops = self._by_pid.get(pid)
        if ops is None or ops.epoch != epoch:
            return
        if ops.pending:
            if ops.settled is None:
                ops.settled = asyncio.get_running_loop().create_future()
            await asyncio.shield(ops.settled)
        if ops.failure is not None:
            raise TransactionAbortableError(
                f"{what} refused: a send or acknowledgement of the transaction of producer "
                f"{pid} epoch {epoch} failed ({error_text(ops.failure)}); nothing changed: "
                "abort it"
            )

    def forget(self, pid: int, epoch: int) -> None:
        ops = self._by_pid.get(pid)
        if ops is not None and ops.epoch == epoch and not ops.pending:
            del self._by_pid[pid]


def _allow_producer(conn: Context, producer_id: int) -> None:
    """Refuse a request carrying ``producer_id`` unless the connection may
    produce on the transactional id that holds it (Kafka's WRITE on the
    TransactionalId). A producer id nobody holds is left to the coordinator
    to refuse."""
    if conn.who.superuser:
        return
    tc = conn.broker.coordinators.get(coordinator_of_producer(producer_id))
    entry = tc.producer_of(producer_id) if tc is not None else None
    if entry is not None:
        conn.broker.security.allow_transactional_id(conn.who, entry.transactional_id)


def _respond(
    conn: Context,
    request_id: int,
    exc: BaseException | None = None,
    **fields: int,
) -> None:
    out = pb.BaseCommand(type=T.PRODUCER_TXN_RESPONSE)
    resp = out.producer_txn_response
    resp.request_id = request_id
    if exc is not None:
        resp.error = error_code(exc, f"connection {conn.peer}: producer-epoch request")
        resp.message = error_text(exc)
    else:
        for name, value in fields.items():
            setattr(resp, name, value)
    conn.send(out)


def _init_producer_id(conn: Context, cmd: pb.BaseCommand) -> None:
    req = cmd.init_producer_id

    async def work() -> None:
        out = pb.BaseCommand(type=T.INIT_PRODUCER_ID_RESPONSE)
        resp = out.init_producer_id_response
        resp.request_id = req.request_id
        try:
            conn.broker.security.allow_transactional_id(
                conn.who, req.transactional_id, req.enable_2pc
            )
            tc = conn.broker.transactional_coordinator(req.transactional_id)
            pid, epoch, ongoing_pid, ongoing_epoch = await tc.init_producer(
                req.transactional_id,
                req.transaction_timeout_ms,
                req.enable_2pc,
                req.keep_prepared_txn,
            )
            resp.producer_id, resp.producer_epoch = pid, epoch
            resp.ongoing_txn_producer_id, resp.ongoing_txn_epoch = ongoing_pid, ongoing_epoch
        except Exception as exc:
            resp.error = error_code(exc, f"connection {conn.peer}: init producer id")
            resp.message = error_text(exc)
        conn.send(out)

    conn.spawn(work())


def _produce(conn: Context, cmd: pb.BaseCommand, unanswered: _Unanswered) -> None:
    req = cmd.produce
    pid, epoch = req.producer_id, req.producer_epoch
    try:
        conn.broker.security.allow_produce(conn.who, check_topic_name(req.topic))
        _allow_producer(conn, req.producer_id)
        if conn.broker.cluster is not None:  # (NOT_OWNER: the client looks its owner up)
            conn.broker.cluster.gate(req.topic)
        partitions = conn.broker.topics.partition_count(req.topic)  # (loaded or not)
        if partitions is None:
            raise refusals.TopicNotFound(f"no topic {req.topic!r}")
        if req.partition >= partitions:
            raise refusals.InvalidArgument(f"topic {req.topic!r} has no partition {req.partition}")
        batch = decode_send(req.batch, "PRODUCE")
        if conn.broker.cluster is not None and coordinator_of_producer(pid) not in (
            conn.broker.coordinators
        ):
            _produce_elsewhere(conn, req, batch, unanswered)
            return
        tc = conn.broker.producer_coordinator(pid)
        txnid = tc.producer_add_partition(pid, epoch, req.topic, req.partition)

        def publish(topic: Topic) -> Awaitable[PublishResult]:
            return conn.broker.publish_txn(
                topic.partitions[req.partition],
                txnid,
                epoch_producer_name(pid, epoch),
                batch.messages,
                req.batch,
                True,
                req.first_sequence,
                (pid, epoch),
            )

        loaded = conn.broker.topics.get(req.topic)
        if loaded is not None:
            pending = publish(loaded)
        else:  # (queued in order with the other sends waiting for the topic to load)
            pending = _flattened(conn.broker.topics.after_load(req.topic, publish))
    except Exception as exc:
        unanswered.failed(pid, epoch, exc)
        _respond(conn, req.request_id, exc)
        return

    def answer(result: PublishResult) -> None:
        first = result.first if result.ids is None else result.ids[0][1]
        _respond(conn, req.request_id, first_batch_index=first)

    if isinstance(pending, asyncio.Future) and pending.done() and not pending.cancelled():
        # Stored at once (queued: the send is answered before it is durable).
        if (error := pending.exception()) is None:
            answer(pending.result())
        else:
            unanswered.failed(pid, epoch, error)
            _respond(conn, req.request_id, error)
        return
    ops = unanswered.read(pid, epoch)

    def fail(exc: BaseException) -> None:
        unanswered.answered(pid, ops, exc)
        _respond(conn, req.request_id, exc)

    def succeed(result: PublishResult) -> None:
        unanswered.answered(pid, ops, None)
        answer(result)

    on_outcome(asyncio.ensure_future(pending), succeed, fail)


def _produce_elsewhere(
    conn: Context, req: pb.CommandProduce, batch: pb.EntryBatch, unanswered: _Unanswered
) -> None:
    """A PRODUCE whose producer id's coordinator is on another broker of
    the cluster: checked with it first (the producer's transaction, begun
    there if it had none, this partition added, the registration logged:
    `broker._peers.Peers.register_producer`), the connection's permission
    on the transactional id holding the producer id checked, then stored and
    answered once durable (never once queued: a commit decided there must
    not overtake it)."""
    pid, epoch = req.producer_id, req.producer_epoch
    cluster = conn.broker.cluster
    assert cluster is not None
    ops = unanswered.read(pid, epoch)

    async def work() -> None:
        try:
            txnid, holder = await cluster.peers.register_producer(
                (pid, epoch), req.topic, partition=req.partition
            )
            if not conn.who.superuser:
                conn.broker.security.allow_transactional_id(conn.who, holder)

            def publish(topic: Topic) -> Awaitable[PublishResult]:
                return conn.broker.publish_txn(
                    topic.partitions[req.partition],
                    txnid,
                    epoch_producer_name(pid, epoch),
                    batch.messages,
                    req.batch,
                    False,
                    req.first_sequence,
                    (pid, epoch),
                )

            loaded = conn.broker.topics.get(req.topic)
            if loaded is not None:
                result = await publish(loaded)
            else:
                result = await _flattened(conn.broker.topics.after_load(req.topic, publish))
        except Exception as exc:
            unanswered.answered(pid, ops, exc)
            _respond(conn, req.request_id, exc)
            return
        unanswered.answered(pid, ops, None)
        first = result.first if result.ids is None else result.ids[0][1]
        _respond(conn, req.request_id, first_batch_index=first)

    conn.spawn(work())


async def _flattened(outer: Awaitable[Awaitable[PublishResult]]) -> PublishResult:
    return await (await outer)


def _txn_offsets(conn: Context, cmd: pb.BaseCommand, unanswered: _Unanswered) -> None:
    req = cmd.txn_offsets
    ops = unanswered.read(req.producer_id, req.producer_epoch)

    async def work() -> None:
        try:
            consumer = conn.consumers.get(req.consumer_id)
            if consumer is None:
                raise refusals.ConsumerNotFound(f"no consumer {req.consumer_id} on this connection")
            conn.broker.security.allow_consume(conn.who, consumer.topic, consumer.subscription)
            _allow_producer(conn, req.producer_id)
            flat = list(req.positions)
            if not flat or len(flat) % 3:
                raise refusals.InvalidArgument(
                    "TXN_OFFSETS names messages as (partition, entry, index)"
                )
            by_part: dict[int, list[tuple[int, int]]] = {}
            for partition, entry_id, index in zip(flat[0::3], flat[1::3], flat[2::3], strict=True):
                by_part.setdefault(partition, []).append((entry_id, index))
            cluster = conn.broker.cluster
            if cluster is not None and coordinator_of_producer(req.producer_id) not in (
                conn.broker.coordinators
            ):
                # (checked with its coordinator elsewhere, answered once durable)
                txnid, holder = await cluster.peers.register_producer(
                    (req.producer_id, req.producer_epoch),
                    consumer.topic,
                    subscription=consumer.subscription,
                )
                if not conn.who.superuser:
                    conn.broker.security.allow_transactional_id(conn.who, holder)
                early = False
            else:
                tc = conn.broker.producer_coordinator(req.producer_id)
                txnid = tc.producer_add_subscription(
                    req.producer_id, req.producer_epoch, consumer.topic, consumer.subscription
                )
                early = True
            await conn.broker.subscriptions.ack_positions(consumer, by_part, False, txnid, early)
        except Exception as exc:
            unanswered.answered(req.producer_id, ops, exc)
            _respond(conn, req.request_id, exc)
            return
        unanswered.answered(req.producer_id, ops, None)
        _respond(conn, req.request_id)

    conn.spawn(work())


def _prepare(conn: Context, cmd: pb.BaseCommand, unanswered: _Unanswered) -> None:
    req = cmd.prepare_producer_txn
    pid, epoch = req.producer_id, req.producer_epoch

    def answer(identity: tuple[int, int]) -> None:
        _respond(conn, req.request_id, producer_id=identity[0], producer_epoch=identity[1])

    try:
        _allow_producer(conn, pid)
    except Exception as exc:
        _respond(conn, req.request_id, exc)
        return

    def start_prepare() -> None:
        # (The PREPARED record is queued in this turn: in the sends' group commit.)
        try:
            tc = conn.broker.producer_coordinator(pid)
            prepared = tc.prepare_producer_txn(pid, epoch)
        except Exception as exc:
            _respond(conn, req.request_id, exc)
            return
        unanswered.forget(pid, epoch)
        on_outcome(prepared, answer, lambda exc: _respond(conn, req.request_id, exc))

    if not unanswered.waiting(pid, epoch):
        start_prepare()
        return

    async def after_ops() -> None:
        try:
            await unanswered.settle(pid, epoch, "prepare")
        except Exception as exc:
            _respond(conn, req.request_id, exc)
            return
        start_prepare()

    conn.spawn(after_ops())


def _end(conn: Context, cmd: pb.BaseCommand, unanswered: _Unanswered) -> None:
    req = cmd.end_producer_txn
    pid, epoch, commit = req.producer_id, req.producer_epoch, req.txn_action == pb.COMMIT
    try:
        _allow_producer(conn, pid)
    except Exception as exc:
        _respond(conn, req.request_id, exc)
        return
    if not commit:
        unanswered.forget(pid, epoch)  # (an abort waits for nothing)
    elif unanswered.waiting(pid, epoch):

        async def after_ops() -> None:
            try:
                await unanswered.settle(pid, epoch, "commit")
            except Exception as exc:
                _respond(conn, req.request_id, exc)
                return
            _start_end(conn, req, unanswered)

        conn.spawn(after_ops())
        return
    _start_end(conn, req, unanswered)


def _start_end(conn: Context, req: pb.CommandEndProducerTxn, unanswered: _Unanswered) -> None:
    try:
        tc = conn.broker.producer_coordinator(req.producer_id)
        ended = tc.end_producer_txn(
            req.producer_id, req.producer_epoch, req.txn_action == pb.COMMIT
        )
    except Exception as exc:
        _respond(conn, req.request_id, exc)
        return
    unanswered.forget(req.producer_id, req.producer_epoch)

    def answer(identity: tuple[int, int]) -> None:
        _respond(conn, req.request_id, producer_id=identity[0], producer_epoch=identity[1])

    on_outcome(ended, answer, lambda exc: _respond(conn, req.request_id, exc))
