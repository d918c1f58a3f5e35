"""A local transaction in one frame: COMMIT_TXN (docs/architecture.md).

A transaction whose coordinator, partitions and subscriptions all live in
this broker (always, with one broker) and that wrote nothing the full way
yet commits with one COMMIT_TXN: its sends (per producer and partition, as
a SEND carries them), its acknowledgements (ranges, per consumer), the
commit and the ask for the next transaction. `LocalCommits.on_commit_txn`
answers it once, with TXN_RESPONSE.

Everything is checked first, in the turn of the loop that reads the frame,
before anything is written (a refusal changes nothing; the transaction
stays OPEN and the client aborts it): the transaction is OPEN at its
coordinator, not past its timeout and wrote nothing the full way
(`tc.TransactionCoordinator.local_commit_check`); every producer and
consumer is this connection's, with the permissions a SEND or ACK needs,
on a topic whose slot this broker holds (a cluster: else NOT_OWNER);
every batch is a well-formed EntryBatch; every acknowledged message is
stored and PENDING in its subscription, and no record in flight there can
change that. Then, in the same turn, it is written as one group commit:
the coordinator's record (OPEN -> COMMITTED, naming the participants), per
partition one COMMITTED_TXN entry holding the transaction's messages in the
order of the frame (`buffer.Partition.append_committed`), per subscription
one TXN_ACKED record of its ranges (locked in PENDING_ACK in memory while
it is written: a concurrent transaction's ack of them conflicts). Append
order is durability order and the three go in one storage transaction: a
crash leaves all of them or none. The answer goes once they are durable
and applied: the messages visible, the acknowledgements DELETED.

A retry of a commit whose answer was lost finds the transaction COMMITTED
at its coordinator, under the number the client drew for the commit
(``commit_id``, kept in the coordinator's record), and is answered once
that is durable: nothing is written twice. Another COMMIT_TXN of a
committed transaction (another number: someone else's, or a client's
second commit) is refused, never answered as done.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf.message import DecodeError

from broker._broker import ConnectedProducer
from broker._context import Context
from broker._transactions import Transactions
from buffer import Partition, SendRejectedError, send_sequence_ids
from ledger import faults, unawaited
from proto import MAX_MESSAGE_SIZE, oversized, refusals
from proto import txnbuf_pb2 as pb
from subscriptions import PartitionSubscription, attached
from tc import TransactionCoordinator, TxnID, wire_txnid

__all__ = ["LocalCommits"]

Range = tuple[int, int, int]  # (entry id, first index, last index), inclusive
_WHAT = "commit transaction"


@dataclass(slots=True)
class _PartitionWrite:
    """What a local transaction writes to one partition: one entry."""

    partition: Partition
    producer: str = ""  # the name the entry carries (the last producer's)
    batches: list[bytes] = field(default_factory=list)
    count: int = 0


@dataclass(slots=True)
class _AckWrite:
    """What a local transaction acknowledges on one subscription's partition."""

    sub: PartitionSubscription
    ranges: list[Range]


class Producers(Context, Protocol):
    """A connection as COMMIT_TXN sees it: a `Context` and its producers."""

    @property
    def producers(self) -> dict[int, ConnectedProducer]:
        """The producers the client created on this connection, by id."""


class LocalCommits:
    """COMMIT_TXN on the connection ``conn``, whose transaction commands
    ``txns`` handles (see the module docstring)."""

    def __init__(self, conn: Producers, txns: Transactions) -> None:
        self.conn = conn
        self.txns = txns
        self.broker = conn.broker

    def on_commit_txn(self, cmd: pb.BaseCommand) -> None:
        req = cmd.commit_txn
        txns = self.txns
        read_at = time.perf_counter()
        try:
            txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
            if not req.commit_id:
                raise refusals.InvalidArgument("a COMMIT_TXN needs a commit_id (not 0)")
            tc = self.broker.coordinator(txnid)
            committed = tc.local_commit_check(txnid, req.commit_id)
            if committed is None:
                parts, acks = self._checked(req, txnid)
        except Exception as exc:
            txns._txn_respond(req, _WHAT, exc)
            return
        following = txns._open_next(req) if req.HasField("next_txn_ttl_ms") else None
        if committed is not None:  # (a retry: answered once the commit is durable)
            committed.add_done_callback(lambda f: self._answer(req, f, following, read_at))
            return
        try:
            last = self._write(tc, txnid, req.commit_id, parts, acks)
        except Exception as exc:  # (refused before anything was written: see _write)
            txns._abort_following(following)
            txns._txn_respond(req, _WHAT, exc)
            return
        last.add_done_callback(lambda f: self._answer(req, f, following, read_at))

    # -- checks (nothing is written) ------------------------------------------------

    def _checked(
        self, req: pb.CommandCommitTxn, txnid: TxnID
    ) -> tuple[list[_PartitionWrite], list[_AckWrite]]:
        """Every send and ack of ``req``, checked; raises a refusal if one
        may not be written (nothing changes)."""
        conn, security, cluster = self.conn, self.broker.security, self.broker.cluster
        parts: dict[Partition, _PartitionWrite] = {}
        for send in req.sends:
            producer = conn.producers.get(send.producer_id)
            if producer is None:
                raise refusals.ProducerNotFound(
                    f"no producer {send.producer_id} on this connection (closed, or never created)"
                )
            topic = producer.topic
            security.allow_produce(conn.who, topic.name)
            if cluster is not None:  # (its slot moved since the producer was made)
                cluster.gate(topic.name)
            if send.partition >= len(topic.partitions):
                raise refusals.InvalidArgument(
                    f"topic {topic.name!r} has no partition {send.partition}"
                )
            partition = topic.partitions[send.partition]
            if partition.ledger.released or partition.ledger.deleted:
                raise refusals.TopicNotFound(f"topic {topic.name!r} is gone")
            write = parts.get(partition)
            if write is None:
                write = parts[partition] = _PartitionWrite(partition)
            write.batches.append(send.batch)
            write.count += _messages_in(send)
            write.producer = producer.name
        ranges: dict[PartitionSubscription, list[Range]] = {}
        for held in req.acks:
            consumer = conn.consumers.get(held.consumer_id)
            if consumer is None:
                raise refusals.ConsumerNotFound(
                    f"no consumer {held.consumer_id} on this connection"
                )
            security.allow_consume(conn.who, consumer.topic, consumer.subscription)
            if cluster is not None:
                cluster.gate(consumer.topic)
            flat = held.ranges
            if not flat or len(flat) % 4:
                raise refusals.InvalidArgument(
                    "acknowledgements come as (partition, entry_id, first_index, last_index) "
                    f"ranges, at least one; got {len(flat)} numbers"
                )
            subs = {s.partition.index: s for s in attached(consumer)}
            for i in range(0, len(flat), 4):
                sub = subs.get(flat[i])
                if sub is None:
                    raise refusals.UnknownMessageId(
                        f"no partition {flat[i]} on topic {consumer.topic!r} "
                        f"(subscription {consumer.subscription!r})"
                    )
                ranges.setdefault(sub, []).append((flat[i + 1], flat[i + 2], flat[i + 3]))
        acks = []
        for sub, its in ranges.items():
            merged = merge_ranges(its)
            sub.check_acked(txnid, merged)
            acks.append(_AckWrite(sub, merged))
        return list(parts.values()), acks

    # -- the write (one group commit) -----------------------------------------------

    def _write(
        self,
        tc: TransactionCoordinator,
        txnid: TxnID,
        commit_id: int,
        parts: list[_PartitionWrite],
        acks: list[_AckWrite],
    ) -> asyncio.Future[Any]:
        """Queue the transaction's records, all in this turn of the loop
        (one group commit); the result is the one queued last, done once
        everything is durable and applied. The coordinator's record goes
        first: its append is the only one that may refuse (it checks the
        transaction again), and then nothing else was queued. The others
        cannot fail here (their ledgers were checked to be in use; a store
        that failed refused the first append)."""
        written = tc.commit_local(
            txnid,
            [(w.partition.topic, w.partition.index) for w in parts],
            list(dict.fromkeys((w.sub.partition.topic, w.sub.name) for w in acks)),
            commit_id,
        )
        last: asyncio.Future[Any] = written
        key = (txnid.most_bits, txnid.least_bits)
        for w in parts:
            last = w.partition.append_committed(key, w.producer, w.batches, w.count)
            last.add_done_callback(unawaited)
        for a in acks:
            last = a.sub.queue_acked(txnid, a.ranges)
            last.add_done_callback(unawaited)
        if last is not written:
            return _after(last, written)
        return written

    def _answer(
        self,
        req: pb.CommandCommitTxn,
        done: asyncio.Future[Any],
        following: TxnID | None,
        read_at: float,
    ) -> None:
        txns = self.txns
        if done.cancelled() or done.exception() is not None:
            txns._abort_following(following)
            error = asyncio.CancelledError() if done.cancelled() else done.exception()
            txns._txn_respond(req, _WHAT, error)
            return
        faults.hit("broker.after_local_commit")  # (durable, not answered)
        txns._txn_respond(req, _WHAT, None, following)
        self.broker.metrics.commit_seconds.observe(time.perf_counter() - read_at)


def merge_ranges(ranges: list[Range]) -> list[Range]:
    """``ranges`` sorted, and those that overlap or touch merged."""
    ranges.sort()
    out: list[Range] = []
    for entry_id, first, last in ranges:
        if out and out[-1][0] == entry_id and first <= out[-1][2] + 1:
            if last > out[-1][2]:
                out[-1] = (entry_id, out[-1][1], last)
            continue
        out.append((entry_id, first, last))
    return out


def _messages_in(send: pb.TxnSendData) -> int:
    """How many messages ``send`` carries, checked as a SEND's are; raises
    a refusal (MALFORMED_FRAME, INVALID_ARGUMENT) for a bad batch."""
    try:
        batch = pb.EntryBatch.FromString(send.batch)
    except DecodeError:
        raise refusals.MalformedFrame("a send's batch is not a valid EntryBatch") from None
    messages = batch.messages
    if not messages:
        raise refusals.InvalidArgument("a send carries at least one message")
    if batch.producer_name or batch.txnid_most_bits or batch.txnid_least_bits:
        raise refusals.InvalidArgument("a send's batch names no producer and no transaction")
    if len(send.batch) > MAX_MESSAGE_SIZE and (too_big := oversized(messages)):
        raise refusals.InvalidArgument(too_big)
    first = send.first_sequence_id if send.HasField("first_sequence_id") else None
    try:
        send_sequence_ids(messages, first)
    except SendRejectedError as exc:
        raise refusals.InvalidArgument(str(exc)) from None
    return len(messages)


def _after(last: asyncio.Future[Any], first: asyncio.Future[Any]) -> asyncio.Future[Any]:
    """Done when ``last`` is (whatever its outcome), with ``first``'s
    outcome (``first`` is done by then: it was queued before ``last``)."""
    result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    def settle(_: object) -> None:
        if result.done():
            return
        if first.cancelled():
            result.cancel()
        elif (error := first.exception()) is not None:
            result.set_exception(error)
        else:
            result.set_result(first.result())

    last.add_done_callback(settle)
    return result
