"""The producer-epoch mode's commands on a connection (Kafka's transactional
producer: KIP-98, KIP-890, KIP-939).

INIT_PRODUCER_ID goes to the coordinator the transactional id hashes to
(`tc.coordinator_of`); PRODUCE, TXN_OFFSETS, PREPARE_PRODUCER_TXN and
END_PRODUCER_TXN to the coordinator that issued the producer id (its high
bits). A PRODUCE or TXN_OFFSETS begins the producer's transaction if it has
none and adds its partition or subscription (KIP-890 part 2): the
coordinator checks the producer id and epoch, then the partition checks the
epoch and the sequence (`buffer.TransactionBuffer.publish`). Each is
answered with PRODUCER_TXN_RESPONSE (INIT_PRODUCER_ID with its own answer);
a refusal carries Kafka's error name (`broker._errors.PRODUCER_EPOCH_CODES`)
and changes nothing. Each is checked against the ACL first (`broker._auth`):
``produce`` on the transactional id, and on the topic of a PRODUCE, consume
on the subscription of a TXN_OFFSETS (`_allow_producer`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError

from broker._errors import BrokerError, error_code, error_text
from buffer import PublishResult, Topic, check_topic_name, epoch_producer_name
from proto import txnbuf_pb2 as pb
from tc import TransactionCoordinator, coordinator_of

if TYPE_CHECKING:
    from broker._connection import Connection

__all__ = ["epoch_handlers"]

log = logging.getLogger(__name__)

T = pb.BaseCommand
_PID_SHIFT = 47  # (see tc._producers: a producer id carries its coordinator)


def epoch_handlers(conn: Connection) -> dict[int, Callable[[pb.BaseCommand], None]]:
    """The handlers of the producer-epoch commands, for ``conn``'s dispatch table."""
    return {
        T.INIT_PRODUCER_ID: lambda cmd: _init_producer_id(conn, cmd),
        T.PRODUCE: lambda cmd: _produce(conn, cmd),
        T.TXN_OFFSETS: lambda cmd: _txn_offsets(conn, cmd),
        T.PREPARE_PRODUCER_TXN: lambda cmd: _prepare(conn, cmd),
        T.END_PRODUCER_TXN: lambda cmd: _end(conn, cmd),
    }


def _coordinator_of_producer(conn: Connection, producer_id: int) -> TransactionCoordinator:
    tcid = producer_id >> _PID_SHIFT
    tc = conn.broker.coordinators.get(tcid)
    if tc is None:
        raise BrokerError(
            "INVALID_PRODUCER_ID_MAPPING",
            f"producer id {producer_id} belongs to coordinator {tcid}, which does not run here",
        )
    return tc


def _allow_producer(conn: Connection, producer_id: int) -> None:
    """Refuse a request carrying ``producer_id`` unless the connection may
    produce on the transactional id that holds it (Kafka's WRITE on the
    TransactionalId). A producer id nobody holds is left to the coordinator
    to refuse."""
    if conn.who.superuser:
        return
    tc = conn.broker.coordinators.get(producer_id >> _PID_SHIFT)
    entry = tc.producer_of(producer_id) if tc is not None else None
    if entry is not None:
        conn.broker.security.allow_transactional_id(conn.who, entry.transactional_id)


def _respond(
    conn: Connection,
    request_id: int,
    exc: BaseException | None = None,
    **fields: int,
) -> None:
    out = pb.BaseCommand(type=T.PRODUCER_TXN_RESPONSE)
    resp = out.producer_txn_response
    resp.request_id = request_id
    if exc is not None:
        resp.error = error_code(exc)
        resp.message = error_text(exc)
        if resp.error == pb.UNKNOWN_ERROR:
            log.error("connection %s: producer-epoch request failed", conn.peer, exc_info=exc)
    else:
        for name, value in fields.items():
            setattr(resp, name, value)
    conn.send(out)


def _when_done(
    future: asyncio.Future[Any],
    answer: Callable[[Any], None],
    fail: Callable[[BaseException], None],
) -> None:
    def done(f: asyncio.Future[Any]) -> None:
        if f.cancelled():
            fail(asyncio.CancelledError())
        elif (error := f.exception()) is not None:
            fail(error)
        else:
            answer(f.result())

    future.add_done_callback(done)


def _init_producer_id(conn: Connection, cmd: pb.BaseCommand) -> None:
    req = cmd.init_producer_id

    async def work() -> None:
        out = pb.BaseCommand(type=T.INIT_PRODUCER_ID_RESPONSE)
        resp = out.init_producer_id_response
        resp.request_id = req.request_id
        try:
            conn.broker.security.allow_transactional_id(
                conn.who, req.transactional_id, req.enable_2pc
            )
            coordinators = conn.broker.coordinators
            tc = coordinators[coordinator_of(req.transactional_id, list(coordinators))]
            pid, epoch, ongoing_pid, ongoing_epoch = await tc.init_producer(
                req.transactional_id,
                req.transaction_timeout_ms,
                req.enable_2pc,
                req.keep_prepared_txn,
            )
            resp.producer_id, resp.producer_epoch = pid, epoch
            resp.ongoing_txn_producer_id, resp.ongoing_txn_epoch = ongoing_pid, ongoing_epoch
        except Exception as exc:
            resp.error = error_code(exc)
            resp.message = error_text(exc)
        conn.send(out)

    conn._spawn(work())


def _produce(conn: Connection, cmd: pb.BaseCommand) -> None:
    req = cmd.produce
    try:
        conn.broker.security.allow_produce(conn.who, check_topic_name(req.topic))
        _allow_producer(conn, req.producer_id)
        partitions = conn.broker.topics.partition_count(req.topic)  # (loaded or not)
        if partitions is None:
            raise BrokerError("TOPIC_NOT_FOUND", f"no topic {req.topic!r}")
        if req.partition >= partitions:
            raise BrokerError(
                "INVALID_ARGUMENT", f"topic {req.topic!r} has no partition {req.partition}"
            )
        try:
            batch = pb.EntryBatch.FromString(req.batch)
        except DecodeError:
            raise BrokerError(
                "MALFORMED_FRAME", "PRODUCE batch is not a valid EntryBatch"
            ) from None
        if not batch.messages or batch.producer_name:
            raise BrokerError(
                "INVALID_ARGUMENT", "a PRODUCE batch holds messages and names no producer"
            )
        pid, epoch = req.producer_id, req.producer_epoch
        tc = _coordinator_of_producer(conn, pid)
        txnid = tc.producer_add_partition(pid, epoch, req.topic, req.partition)

        def publish(topic: Topic) -> Awaitable[PublishResult]:
            return conn.broker.publish_txn(
                topic.partitions[req.partition],
                (txnid.most_bits, txnid.least_bits),
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
        _respond(conn, req.request_id, exc)
        return

    def answer(result: PublishResult) -> None:
        first = result.first if result.ids is None else result.ids[0][1]
        _respond(conn, req.request_id, first_batch_index=first)

    def fail(exc: BaseException) -> None:
        _respond(conn, req.request_id, exc)

    future = asyncio.ensure_future(pending)
    _when_done(future, answer, fail)


async def _flattened(outer: Awaitable[Awaitable[PublishResult]]) -> PublishResult:
    return await (await outer)


def _txn_offsets(conn: Connection, cmd: pb.BaseCommand) -> None:
    req = cmd.txn_offsets

    async def work() -> None:
        try:
            consumer = conn.consumers.get(req.consumer_id)
            if consumer is None:
                raise BrokerError(
                    "CONSUMER_NOT_FOUND", f"no consumer {req.consumer_id} on this connection"
                )
            conn.broker.security.allow_consume(conn.who, consumer.topic, consumer.subscription)
            _allow_producer(conn, req.producer_id)
            flat = list(req.positions)
            if not flat or len(flat) % 3:
                raise BrokerError(
                    "INVALID_ARGUMENT", "TXN_OFFSETS names messages as (partition, entry, index)"
                )
            by_part: dict[int, list[tuple[int, int]]] = {}
            for partition, entry_id, index in zip(flat[0::3], flat[1::3], flat[2::3], strict=True):
                by_part.setdefault(partition, []).append((entry_id, index))
            tc = _coordinator_of_producer(conn, req.producer_id)
            txnid = tc.producer_add_subscription(
                req.producer_id, req.producer_epoch, consumer.topic, consumer.subscription
            )
            await conn.broker.subscriptions.ack_positions(
                consumer, by_part, False, (txnid.most_bits, txnid.least_bits), True
            )
        except Exception as exc:
            _respond(conn, req.request_id, exc)
            return
        _respond(conn, req.request_id)

    conn._spawn(work())


def _prepare(conn: Connection, cmd: pb.BaseCommand) -> None:
    req = cmd.prepare_producer_txn

    async def work() -> None:
        try:
            _allow_producer(conn, req.producer_id)
            tc = _coordinator_of_producer(conn, req.producer_id)
            pid, epoch = await tc.prepare_producer_txn(req.producer_id, req.producer_epoch)
        except Exception as exc:
            _respond(conn, req.request_id, exc)
            return
        _respond(conn, req.request_id, producer_id=pid, producer_epoch=epoch)

    conn._spawn(work())


def _end(conn: Connection, cmd: pb.BaseCommand) -> None:
    req = cmd.end_producer_txn
    try:
        _allow_producer(conn, req.producer_id)
        tc = _coordinator_of_producer(conn, req.producer_id)
        ended = tc.end_producer_txn(
            req.producer_id, req.producer_epoch, req.txn_action == pb.COMMIT
        )
    except Exception as exc:
        _respond(conn, req.request_id, exc)
        return

    def answer(identity: tuple[int, int]) -> None:
        _respond(conn, req.request_id, producer_id=identity[0], producer_epoch=identity[1])

    _when_done(ended, answer, lambda exc: _respond(conn, req.request_id, exc))
