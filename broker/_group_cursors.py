"""A Kafka consumer group's offsets at the owner of their topic: GROUP_CURSORS.

A Kafka group's committed offset on a partition is the cursor of the
txnbuf subscription of the group's name there (`broker.kafka._group_apis`),
written by the owner of the topic's slot. In a cluster the group's
coordinator (the owner of the group's slot) serves OffsetCommit,
TxnOffsetCommit and OffsetFetch for every partition: those of topics it
serves itself, and the others by GROUP_CURSORS to their topic's owner over
the brokers' channel (`broker._peers.Peers.group_cursors`). This module is
the owner's side; offsets travel as positions (`broker.kafka._offsets`:
one to one), so nothing here is Kafka's.

- Who may: the ``cluster`` role only (AUTHORIZATION_ERROR, nothing changed,
  to anyone else on every listener). The coordinator checked the Kafka
  client's rights (consume on the topic as the group, produce on the
  transactional id) before forwarding; the owner checks what only it can:
  that it serves each topic's slot (else NOT_OWNER for that partition),
  that the topic and partition exist (TOPIC_NOT_FOUND), and for a
  transactional commit the producer with its transaction coordinator: the
  transactional id the request names must hold the producer id
  (AUTHORIZATION_ERROR), and the producer must have a transaction ongoing
  (INVALID_TXN_STATE; refused by the coordinator, when it is on another
  broker, as a transactional ack of the producer-epoch mode is).
- A commit acknowledges cumulatively every message before the position:
  the cursor only moves forward (a position at or before it changes
  nothing, so a retry whose answer was lost is harmless), and is answered
  once durable. A transactional one holds the messages PENDING_ACK in the
  producer's transaction until its END reaches this broker (the
  coordinator's tells), as Kafka's group coordinator writes a
  transaction's offsets: an abort leaves the cursor where it was.
- A fetch answers each partition's first position not acknowledged, or
  ``none`` where the group has no cursor (it never committed there).

Why not CURSOR (`broker._reader`): CURSOR creates the subscription on every
partition of the topic at a starting position and answers all of them,
takes no transaction, and checks the client's own role against the topic
and subscription; a group's commit creates a cursor on the partitions it
commits only, a fetch creates nothing, a transactional commit is a
participant checked with the producer's coordinator, and the caller is a
broker acting for a Kafka client it has checked.
"""

from __future__ import annotations

import asyncio

from broker._context import Context, Handlers
from broker._errors import error_code, error_text
from broker._reader import first_unacknowledged
from broker._transactions import CLUSTER_ROLE
from buffer import Position, Topic, check_subscription_name, check_topic_name, quoted
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions import PartitionSubscription
from tc import TxnID, coordinator_of_producer

__all__ = ["ack_bound", "first_unacknowledged", "group_cursor_handlers"]

T = pb.BaseCommand


def group_cursor_handlers(conn: Context) -> Handlers:
    """The handler of GROUP_CURSORS for ``conn``'s dispatch table."""
    return {T.GROUP_CURSORS: lambda cmd: conn.spawn(_group_cursors(conn, cmd.group_cursors))}


def ack_bound(sub: PartitionSubscription, pos: Position) -> Position | None:
    """The last message before ``pos`` (an index past an entry's messages
    stands for its end, an entry past the partition's for its end), if
    after the subscription's mark-delete position: what acknowledging
    everything before ``pos`` acknowledges."""
    partition = sub.partition
    last = partition.ledger.last_entry_id
    entry_id, index = pos
    if entry_id > last:
        entry_id, index = last + 1, 0
    if index > 0:
        bound = (entry_id, min(index, partition.count(entry_id)) - 1)
    else:
        bound = (entry_id - 1, partition.count(entry_id - 1) - 1)
    if bound[1] < 0 or bound <= sub.cursor.mark_delete:
        return None
    return bound


async def _group_cursors(conn: Context, req: pb.CommandGroupCursors) -> None:
    out = pb.BaseCommand(type=T.GROUP_CURSORS_RESPONSE)
    resp = out.group_cursors_response
    resp.request_id = req.request_id
    try:
        conn.require_role(CLUSTER_ROLE, "GROUP_CURSORS")
        name = check_subscription_name(req.subscription)
        if req.commit and req.all:
            raise refusals.InvalidArgument("GROUP_CURSORS: a commit names its partitions")
        if req.HasField("producer_id") and not req.commit:
            raise refusals.InvalidArgument("GROUP_CURSORS: a producer id goes with a commit")
        if req.all:
            answers = await _every_cursor(conn, name)
        else:
            answers = list(
                await asyncio.gather(*(_one(conn, req, name, at) for at in req.positions))
            )
        resp.positions.extend(answers)
    except Exception as exc:
        del resp.positions[:]
        resp.error = error_code(exc, f"GROUP_CURSORS from {conn.peer}")
        resp.message = error_text(exc)
    conn.send(out)


async def _topic(conn: Context, name: str) -> Topic:
    """Topic ``name``, served here and loaded (NOT_OWNER, TOPIC_NOT_FOUND)."""
    broker = conn.broker
    check_topic_name(name)
    if broker.cluster is not None:
        broker.cluster.gate(name)
    topic = await broker.topics.load_topic(name)
    if topic is None:
        raise refusals.TopicNotFound(f"no topic {quoted(name)}")
    return topic


async def _one(
    conn: Context, req: pb.CommandGroupCursors, name: str, at: pb.CursorAt
) -> pb.CursorAt:
    """One partition's commit or fetch; its refusal in its answer."""
    answer = pb.CursorAt(topic=at.topic, partition=at.partition)
    try:
        topic = await _topic(conn, at.topic)
        if at.partition >= len(topic.partitions):
            raise refusals.TopicNotFound(
                f"no partition {at.partition} of topic {quoted(at.topic)} "
                f"({len(topic.partitions)} partitions)"
            )
        subs = conn.broker.subscriptions
        sub: PartitionSubscription | None
        if req.commit:
            sub = await subs.cursor_of(topic, at.partition, name)
            bound = ack_bound(sub, (at.entry_id, at.index))
            if bound is not None:
                if req.HasField("producer_id"):
                    txnid = await _participant(conn, req, topic.name, name)
                    await sub.ack([bound], True, txnid)  # (answered once durable)
                else:
                    await sub.ack([bound], True)
        else:
            sub = subs.get(topic.name, at.partition, name)
        if sub is None:
            answer.none = True
        else:
            answer.entry_id, answer.index = first_unacknowledged(sub)
    except Exception as exc:
        answer.error = error_code(exc, f"GROUP_CURSORS on {at.topic}/{at.partition}")
        answer.message = error_text(exc)
    return answer


async def _participant(conn: Context, req: pb.CommandGroupCursors, topic: str, name: str) -> TxnID:
    """The producer's ongoing transaction, with the subscription added to
    it (checked with its coordinator: here, or over the peers' channel,
    answered once logged there). The ack is then answered once durable,
    wherever the coordinator is (never queued early: the group's
    coordinator answers the Kafka client on this answer)."""
    broker = conn.broker
    pid, epoch = req.producer_id, req.producer_epoch
    tc = broker.coordinators.get(coordinator_of_producer(pid))
    if tc is not None:
        entry = tc.producer_of(pid)
        if entry is not None and entry.transactional_id != req.transactional_id:
            raise refusals.AuthorizationError(
                f"producer id {pid} is held by another transactional id than "
                f"{quoted(req.transactional_id)}"
            )
        if entry is not None and entry.identity == (pid, epoch) and entry.ongoing is None:
            raise refusals.InvalidTxnState(
                f"offsets of group {quoted(name)} refused: {quoted(entry.transactional_id)} "
                "has no ongoing transaction (AddOffsetsToTxn begins one)"
            )
        return tc.producer_add_subscription(pid, epoch, topic, name)
    if broker.cluster is None:
        raise refusals.TransactionCoordinatorNotFound(
            f"no transaction coordinator of producer id {pid} here"
        )
    txnid, holder = await broker.cluster.peers.register_producer(
        (pid, epoch), topic, subscription=name, keep=False
    )
    if holder != req.transactional_id:
        raise refusals.AuthorizationError(
            f"producer id {pid} is held by another transactional id than "
            f"{quoted(req.transactional_id)}"
        )
    return txnid


async def _every_cursor(conn: Context, name: str) -> list[pb.CursorAt]:
    """A fetch of every cursor of subscription ``name`` on the topics served
    here (a topic not loaded has its cursors in the store only: loaded)."""
    broker = conn.broker
    known, store = broker.topics, broker.store
    cluster = broker.cluster
    for t in known.names():
        if (
            known.get(t) is None
            and (cluster is None or cluster.serves(t))
            and store.has_ledger(PartitionSubscription.ledger_name(t, 0, name))
        ):
            await known.load_topic(t)
    out = []
    for t in known.names():
        if cluster is not None and not cluster.serves(t):
            continue
        for sub in broker.subscriptions.of_topic(t).get(name, []):
            entry_id, index = first_unacknowledged(sub)
            out.append(
                pb.CursorAt(topic=t, partition=sub.partition.index, entry_id=entry_id, index=index)
            )
    return out
