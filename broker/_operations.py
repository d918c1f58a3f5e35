"""What an operator does to topics and subscriptions through the admin API:
delete a topic or a subscription, reset a subscription, skip messages.

Each operation checks everything first and raises `AdminError` (an HTTP
status and what was wrong) without changing anything when it refuses.

Deleting a topic or a subscription is refused (409) while producers or
consumers are connected to it, or while a transaction not ended holds it (a
partition of the topic, the subscription, registered with its coordinator
or holding writes or PENDING_ACK acknowledgements there). With ``force``:
every such OPEN transaction is aborted first (and awaited), ones being
committed or aborted are waited for (`END_WAIT` seconds at most), a
PREPARED one (two-phase commit) still refuses (terminate its producer
first: POST /admin/v1/producers/{id}/terminate); then the producers and
consumers are dropped: their connections stay up, a dropped producer's next
send fails with PRODUCER_NOT_FOUND and a dropped consumer receives nothing
more. A client that creates them again creates the topic again (topics are
created on first use).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from broker._errors import REFUSALS
from buffer import Partition, Position
from subscriptions import WHOLE_ENTRY, PartitionSubscription
from tc import TxnID, TxnMeta, TxnStatus

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = [
    "AdminError",
    "check_not_in_use",
    "delete_subscription",
    "delete_topic",
    "first_published_at_or_after",
    "holding_transactions",
    "reset_subscription",
    "skip_messages",
    "subscriptions_json",
]

log = logging.getLogger(__name__)

END_WAIT = 10.0  # seconds a forced deletion waits for transactions to end
_NOT_ENDED = (TxnStatus.OPEN, TxnStatus.PREPARED, TxnStatus.COMMITTING, TxnStatus.ABORTING)


class AdminError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _connected(broker: Broker, topic: str, subscription: str | None = None) -> tuple[int, int]:
    """(producers, consumers) connected to ``topic`` (to ``subscription`` only, if given)."""
    producers = 0 if subscription is not None else broker.producer_count(topic)
    consumers = 0
    for name, subs in broker.subscriptions.of_topic(topic).items():
        if subscription is None or name == subscription:
            consumers += len(subs[0].consumers) if subs else 0
    return producers, consumers


def _holding(broker: Broker, topic: str, subscription: str | None = None) -> list[TxnID]:
    """Transactions not ended that hold ``topic`` (or only its
    ``subscription``): registered with their coordinator, or with writes or
    PENDING_ACK acknowledgements there."""
    found: set[TxnID] = set()
    for tc in broker.coordinators.values():
        for meta in tc.transactions():
            if meta.status in _NOT_ENDED and _touches(meta, topic, subscription):
                found.add(meta.txnid)
    keys: set[tuple[int, int]] = set()
    found_topic = broker.topics.get(topic)
    if subscription is None and found_topic is not None:
        for part in found_topic.partitions:
            if part.transaction_buffer is not None:
                keys.update(part.transaction_buffer.open_transactions())
    for name, subs in broker.subscriptions.of_topic(topic).items():
        if subscription is None or name == subscription:
            for sub in subs:
                keys.update(sub.cursor.txn_acks)
    found.update(TxnID(*key) for key in keys)
    return sorted(found, key=lambda t: (t.most_bits, t.least_bits))


def holding_transactions(
    broker: Broker, topic: str, subscription: str | None = None
) -> list[TxnID]:
    """The transactions not ended that hold ``topic`` (or only its
    ``subscription``), as a deletion finds them."""
    return _holding(broker, topic, subscription)


def _touches(meta: TxnMeta, topic: str, subscription: str | None) -> bool:
    if subscription is None and any(t == topic for t, _ in meta.partitions):
        return True
    return any(
        t == topic and (subscription is None or s == subscription) for t, s in meta.subscriptions
    )


def _names(txnids: list[TxnID]) -> str:
    shown = ", ".join(map(str, txnids[:10]))
    return shown + (f" and {len(txnids) - 10} more" if len(txnids) > 10 else "")


async def _end_holders(broker: Broker, txnids: list[TxnID], what: str) -> None:
    """Abort the OPEN ones of ``txnids``, wait for the decided ones to end;
    AdminError 409 (nothing changed by this call beyond those aborts) for a
    PREPARED one, or one still not ended after `END_WAIT` seconds."""
    prepared = [
        t
        for t in txnids
        if (tc := broker.coordinators.get(t.tcid)) is not None
        and (m := tc.get(t)) is not None
        and m.status is TxnStatus.PREPARED
    ]
    if prepared:
        raise AdminError(
            409,
            f"cannot delete {what}: prepared (two-phase) transaction(s) {_names(prepared)} "
            "hold it; terminate their producers first (POST /admin/v1/producers/{id}/terminate)",
        )
    waits = []
    for txnid in txnids:
        tc = broker.coordinators.get(txnid.tcid)
        meta = tc.get(txnid) if tc is not None else None
        if tc is None or meta is None or meta.status.ended:
            continue
        if meta.status is TxnStatus.OPEN:
            log.info("aborting transaction %s to delete %s", txnid, what)
        # An abort of one being aborted is answered once it has ended; of one
        # being committed it is refused, and repeating its commit is
        # answered once that has ended (a producer's transaction refuses
        # that too: it is only checked at the end).
        for commit in (False, True):
            try:
                waits.append(tc.end_txn(txnid, commit=commit))
                break
            except Exception as exc:
                log.debug("ending %s to delete %s: %s", txnid, what, exc)
    if waits:
        _, pending = await asyncio.wait(waits, timeout=END_WAIT)
        for fut in pending:
            fut.cancel()
    left = _holders_not_ended(broker, txnids)
    if left:
        raise AdminError(
            409,
            f"cannot delete {what}: transaction(s) {_names(left)} holding it did not end within "
            f"{END_WAIT:.0f} s (see GET /admin/v1/transactions?state=STUCK)",
        )


def _holders_not_ended(broker: Broker, txnids: list[TxnID]) -> list[TxnID]:
    out = []
    for txnid in txnids:
        tc = broker.coordinators.get(txnid.tcid)
        meta = tc.get(txnid) if tc is not None else None
        if meta is not None and not meta.status.ended:
            out.append(txnid)
    return out


def _refuse_or_force(
    broker: Broker, topic: str, subscription: str | None, force: bool, what: str
) -> list[TxnID]:
    producers, consumers = _connected(broker, topic, subscription)
    holders = _holding(broker, topic, subscription)
    if force:
        return holders
    reasons = []
    if producers:
        reasons.append(f"{producers} producer(s) connected")
    if consumers:
        reasons.append(f"{consumers} consumer(s) connected")
    if holders:
        reasons.append(f"transaction(s) {_names(holders)} not ended hold it")
    if reasons:
        raise AdminError(
            409,
            f"{what} is in use ({'; '.join(reasons)}): nothing was deleted; "
            "add ?force=true to abort those transactions and drop those clients",
        )
    return holders


def check_not_in_use(broker: Broker, topic: str, subscription: str | None, what: str) -> None:
    """AdminError 409 if deleting ``topic`` (or only its ``subscription``)
    without ``force`` would be refused: a check of several before any
    is deleted."""
    _refuse_or_force(broker, topic, subscription, False, what)


def _drop_clients(broker: Broker, topic: str, subscription: str | None = None) -> None:
    """Forget the producers (with no subscription named) and consumers of
    ``topic`` on every connection (see the module docstring)."""
    for conn in list(broker.connections):
        if subscription is None:
            for producer_id, producer in list(conn.producers.items()):
                if producer.topic.name == topic:
                    del conn.producers[producer_id]
                    broker.release_producer(topic, producer.name, conn)
        for consumer_id, consumer in list(conn.consumers.items()):
            if consumer.topic == topic and subscription in (None, consumer.subscription):
                del conn.consumers[consumer_id]
                broker.subscriptions.detach(consumer)


async def delete_topic(broker: Broker, name: str, force: bool) -> dict[str, Any]:
    """Delete topic ``name``, its partitions, subscriptions, transaction
    logs and deduplication state (see the module docstring)."""
    topic = await broker.topics.load_topic(name)
    if topic is None:
        raise AdminError(404, f"no topic {name!r}")
    what = f"topic {name!r}"
    holders = _refuse_or_force(broker, name, None, force, what)
    if holders:
        await _end_holders(broker, holders, what)
    _drop_clients(broker, name)
    subscriptions = list(broker.subscriptions.of_topic(name))

    async def first(_topic: object) -> None:
        for sub in subscriptions:
            await broker.subscriptions.remove(name, sub)
        broker.metrics.forget_topic(name)

    if not await broker.topics.delete(name, first):
        raise AdminError(404, f"no topic {name!r}")
    log.info("deleted topic %r (%d subscriptions)", name, len(subscriptions))
    return {
        "deleted": name,
        "partitions": len(topic.partitions),
        "subscriptions": subscriptions,
        "aborted_transactions": [str(t) for t in holders],
    }


async def _loaded(broker: Broker, topic: str) -> None:
    """Load ``topic`` (an operation on it is a use); AdminError 404 if there is none."""
    if await broker.topics.load_topic(topic) is None:
        raise AdminError(404, f"no topic {topic!r}")


async def _subscription(broker: Broker, topic: str, name: str) -> list[PartitionSubscription]:
    await _loaded(broker, topic)
    subs = broker.subscriptions.of_topic(topic).get(name)
    if not subs:
        raise AdminError(404, f"no subscription {name!r} on topic {topic!r}")
    return subs


async def delete_subscription(broker: Broker, topic: str, name: str, force: bool) -> dict[str, Any]:
    await _subscription(broker, topic, name)
    what = f"subscription {name!r} of topic {topic!r}"
    holders = _refuse_or_force(broker, topic, name, force, what)
    if holders:
        await _end_holders(broker, holders, what)
    _drop_clients(broker, topic, name)
    await broker.subscriptions.remove(topic, name)
    log.info("deleted subscription %r of topic %r", name, topic)
    return {"deleted": name, "topic": topic, "aborted_transactions": [str(t) for t in holders]}


async def subscriptions_json(broker: Broker, topic: str) -> list[dict[str, Any]]:
    await _loaded(broker, topic)
    out = []
    for name, subs in broker.subscriptions.of_topic(topic).items():
        first = subs[0]
        out.append(
            {
                "name": name,
                "type": first.sub_type.value if first.sub_type else None,
                "consumers": len(first.consumers),
                "backlog": sum(s.backlog() for s in subs),
                "unacked": sum(len(s.pending) for s in subs),
                "pending_ack": sum(len(s.cursor.pending_ack) for s in subs),
                "read_uncommitted": first.read_uncommitted,
                "partitions": [
                    {
                        "partition": s.partition.index,
                        "mark_delete": list(s.cursor.mark_delete),
                        "backlog": s.backlog(),
                    }
                    for s in subs
                ],
            }
        )
    return out


def _position_of(body: dict[str, Any]) -> tuple[str, Any]:
    """What a reset asks for: ("earliest"|"latest", None), ("time", ms) or
    ("message", (partition, entry id, batch index)); AdminError 400 if not one."""
    usage = (
        'body must be {"position": "earliest" | "latest"}, {"position": {"partition": P, '
        '"entry_id": E, "batch_index": I}} or {"time_ms": T}'
    )
    if set(body) not in ({"position"}, {"time_ms"}):
        raise AdminError(400, usage)
    if "time_ms" in body:
        t = body["time_ms"]
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise AdminError(400, f"time_ms must be milliseconds since the epoch, not {t!r}")
        return "time", t
    position = body["position"]
    if position in ("earliest", "latest"):
        return str(position), None
    if isinstance(position, dict) and {"partition", "entry_id"} <= set(position) <= {
        "partition",
        "entry_id",
        "batch_index",
    }:
        values = (position["partition"], position["entry_id"], position.get("batch_index", 0))
        if all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
            return "message", values
    raise AdminError(400, usage)


async def reset_subscription(
    broker: Broker, topic: str, name: str, body: dict[str, Any]
) -> dict[str, Any]:
    """Reset subscription ``name`` to the earliest or latest message, to a
    message id (the next message delivered on its partition is that one;
    the other partitions stay as they are) or to a time (on every
    partition, the first entry published at or after it: the producer's
    clock, as Pulsar's reset by time). A position before the first message
    kept goes to the first one kept."""
    subs = await _subscription(broker, topic, name)
    kind, value = _position_of(body)
    if kind == "message" and value[0] >= len(subs):
        raise AdminError(400, f"topic {topic!r} has no partition {value[0]}")
    targets: list[tuple[PartitionSubscription, Position]] = []
    for sub in subs:
        ledger = sub.partition.ledger
        first, last = ledger.first_entry_id, ledger.last_entry_id
        if kind == "earliest":
            md: Position = (first - 1, WHOLE_ENTRY)
        elif kind == "latest":
            md = (last, WHOLE_ENTRY)
        elif kind == "message":
            partition, entry_id, index = value
            if sub.partition.index != partition:
                continue
            if entry_id < first:
                md = (first - 1, WHOLE_ENTRY)
            elif entry_id > last:
                md = (last, WHOLE_ENTRY)
            else:
                md = (entry_id - 1, WHOLE_ENTRY) if index == 0 else (entry_id, index - 1)
        else:
            md = (await first_published_at_or_after(sub.partition, value) - 1, WHOLE_ENTRY)
        targets.append((sub, md))
    for sub, _ in targets:  # (refuse before anything moves)
        try:
            sub.check_no_txn_acks("reset")
        except REFUSALS as exc:
            raise AdminError(409, str(exc)) from None
    for sub, md in targets:
        try:
            await sub.reset(md)
        except REFUSALS as exc:
            raise AdminError(409, str(exc)) from None
    return {
        "topic": topic,
        "subscription": name,
        "partitions": [
            {"partition": sub.partition.index, "mark_delete": list(md), "backlog": sub.backlog()}
            for sub, md in targets
        ],
    }


async def first_published_at_or_after(part: Partition, time_ms: int) -> int:
    """The first entry of the partition whose first message was published
    at or after ``time_ms`` (binary search: publish times grow with entry
    ids, near enough); the next entry id if none was."""
    low, high = part.ledger.first_entry_id, part.ledger.last_entry_id + 1
    while low < high:
        mid = (low + high) // 2
        published = await part.publish_time(mid)
        if published is not None and published >= time_ms:
            high = mid
        else:
            low = mid + 1
    return low


async def skip_messages(
    broker: Broker, topic: str, name: str, count: int, partition: int | None
) -> dict[str, Any]:
    """Acknowledge the next ``count`` messages not acknowledged yet (and not
    held by a transaction) on each partition, or on ``partition`` only."""
    subs = await _subscription(broker, topic, name)
    if partition is not None and partition >= len(subs):
        raise AdminError(400, f"topic {topic!r} has no partition {partition}")
    skipped = []
    for sub in subs:
        if partition is None or sub.partition.index == partition:
            n = await sub.skip(count)
            skipped.append({"partition": sub.partition.index, "skipped": n})
    return {"topic": topic, "subscription": name, "partitions": skipped}
