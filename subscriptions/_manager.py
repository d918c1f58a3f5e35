"""Every subscription of a broker: attach consumers, route acks, trim.

A subscription on a topic is one `PartitionSubscription` (one cursor) per
partition. Retention: a partition ledger is trimmed up to the first entry
that some subscription has not fully acknowledged, less what its topic's
`buffer.Retention` keeps of the acknowledged entries; a partition with no
subscription keeps everything (so that a later ``earliest`` subscriber
reads it).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Iterable
from typing import Any

from buffer import MessageId, Partition, Position, Topic, Topics
from proto import TxnID, refusals
from subscriptions._dispatch import Consumer
from subscriptions._subscription import PartitionSubscription, attached

__all__ = ["Subscriptions"]

log = logging.getLogger(__name__)

TRIM_INTERVAL = 1.0  # seconds between retention passes
TRIM_SLACK = 16  # leave this many consumed entries (cheap re-reads, fewer deletes)
LOAD_BATCH = 256  # partitions whose subscriptions load at once on start


class Subscriptions:
    """Create with `Subscriptions.load`; `close` stops dispatch and trimming."""

    def __init__(self, topics: Topics) -> None:
        self.topics = topics
        # topic -> its partition subscriptions, by subscription name and then
        # partition: what looks up one topic's subscriptions (ending a
        # transaction, stats, the sweep's floor) looks there, not through
        # every subscription of the broker. (A tuple, replaced on a change:
        # most topics have one subscription on one partition, and a broker
        # holds this for every loaded topic.)
        self._by_topic: dict[str, tuple[PartitionSubscription, ...]] = {}
        self._lock = asyncio.Lock()
        self._trim_task: asyncio.Task[None] | None = None
        self._order = 0
        self.removed = 0  # subscriptions removed since start (their counters go)

    @classmethod
    async def load(cls, topics: Topics) -> Subscriptions:
        """The subscriptions of every loaded topic (a topic loaded later
        brings its own: `load_topic`)."""
        subs = cls(topics)
        loaded = topics.all()
        for start in range(0, len(loaded), LOAD_BATCH):
            await asyncio.gather(*(subs.load_topic(t) for t in loaded[start : start + LOAD_BATCH]))
        subs._trim_task = asyncio.get_running_loop().create_task(subs._trim_loop())
        return subs

    async def load_topic(self, topic: Topic) -> None:
        """Load the subscriptions of ``topic`` (being loaded) from their
        cursor ledgers."""
        store = self.topics.store

        async def load_partition(part: Partition) -> list[PartitionSubscription]:
            # (One at a time: they add listeners to the partition in name order.)
            prefix = PartitionSubscription.ledger_name(part.topic, part.index, "")
            loaded = []
            for ledger_name in store.ledger_names(prefix):
                ledger = store.get_ledger(ledger_name)
                assert ledger is not None
                # (Interned: many topics' subscriptions share a name, and this
                # string lives as long as the subscription.)
                sub_name = sys.intern(ledger_name[len(prefix) :])
                loaded.append(await PartitionSubscription.load(part, sub_name, ledger))
            return loaded

        parts = topic.partitions
        if len(parts) == 1:  # (the usual case: no task)
            results = [await load_partition(parts[0])]
        else:
            results = await asyncio.gather(*(load_partition(part) for part in parts))
        self._add(topic.name, (sub for loaded in results for sub in loaded))

    def settled(self, topic: str) -> bool:
        """Nothing under way on ``topic``'s subscriptions: no consumer, no
        transaction holding acknowledgements, every record durable and
        applied (see `PartitionSubscription.settled`)."""
        return all(sub.settled() for sub in self._by_topic.get(topic, ()))

    def unload_topic(self, topic: str) -> None:
        """Forget ``topic``'s subscriptions (unloaded: they load again with
        it), giving their ledgers back to the store."""
        for sub in self._by_topic.pop(topic, ()):
            sub.release()

    async def close(self) -> None:
        if self._trim_task is not None:
            self._trim_task.cancel()
        for sub in self.all():
            await sub.close()

    def _add(self, topic: str, subs: Iterable[PartitionSubscription]) -> None:
        merged = tuple(sorted((*self._by_topic.get(topic, ()), *subs), key=_order))
        if merged:
            self._by_topic[topic] = merged

    def _named(self, topic: str, name: str) -> list[PartitionSubscription]:
        """Subscription ``name``'s partition subscriptions on ``topic``, by partition."""
        return [sub for sub in self._by_topic.get(topic, ()) if sub.name == name]

    def _of_partition(self, topic: str, index: int) -> dict[str, PartitionSubscription]:
        """Subscription name -> its partition subscription on partition ``index``."""
        return {
            sub.name: sub for sub in self._by_topic.get(topic, ()) if sub.partition.index == index
        }

    async def remove(self, topic: str, name: str) -> bool:
        """Delete subscription ``name`` of ``topic``: stop it, delete its
        ledgers. Its consumers (the caller detached them) get nothing more.
        False if there is no such subscription."""
        async with self._lock:
            subs = self._named(topic, name)
            rest = tuple(sub for sub in self._by_topic.get(topic, ()) if sub.name != name)
            if rest:
                self._by_topic[topic] = rest
            else:
                self._by_topic.pop(topic, None)
            if subs:
                self.removed += 1
            for sub in subs:
                for consumer in list(sub.consumers):
                    sub.remove_consumer(consumer)
                await sub.delete()
            return bool(subs)

    async def delete_leftovers(self, topic: str) -> None:
        """Delete the cursor ledgers a deleted topic left behind (a crash in
        the middle of its deletion): they were never loaded."""
        store = self.topics.store
        for sample in (
            PartitionSubscription.ledger_name(topic, 0, ""),
            PartitionSubscription.uncommitted_ledger_name(topic, 0, ""),
        ):
            prefix = sample[: -len("0/")]  # ("c/<topic>/": every partition)
            for ledger_name in store.ledger_names(prefix):
                await store.delete_ledger(ledger_name)

    def all(self) -> list[PartitionSubscription]:
        """Every partition subscription."""
        return [sub for subs in self._by_topic.values() for sub in subs]

    def of_topic(self, topic: str) -> dict[str, list[PartitionSubscription]]:
        """Subscription name -> its partition subscriptions (by partition),
        for one topic, by name."""
        out: dict[str, list[PartitionSubscription]] = {}
        for sub in self._by_topic.get(topic, ()):
            out.setdefault(sub.name, []).append(sub)
        return out

    # -- consumers ------------------------------------------------------------------

    async def subscribe(self, topic: Topic, name: str, consumer: Consumer, earliest: bool) -> None:
        """Attach ``consumer`` to subscription ``name`` on every partition.

        Creates the subscription (its cursors) if needed. Raises
        a `refusals.Refusal` (nothing attached) if the subscription refuses it.
        """
        async with self._lock:
            # The partitions as of now: the topic may grow while cursors are
            # created, and `extend` (behind this lock) attaches the consumers.
            parts = list(topic.partitions)
            existing = self._existing(topic, parts, name)
            for sub in existing:
                if sub is not None:
                    sub.check_can_add(consumer)
            subs = []
            for part, sub in zip(parts, existing, strict=True):
                if sub is None:
                    sub = await PartitionSubscription.create(
                        part, name, earliest, consumer.read_uncommitted
                    )
                    self._add(topic.name, (sub,))
                subs.append(sub)
            self._order += 1
            consumer.order = self._order
            for sub in subs:
                sub.add_consumer(consumer)

    def _existing(
        self, topic: Topic, parts: list[Partition], name: str
    ) -> list[PartitionSubscription | None]:
        """Subscription ``name`` on each of ``parts`` of ``topic`` (None where it has none)."""
        by_index = {sub.partition.index: sub for sub in self._named(topic.name, name)}
        return [by_index.get(part.index) for part in parts]

    async def ensure(self, topic: Topic, name: str, earliest: bool) -> list[PartitionSubscription]:
        """Subscription ``name`` on every partition of ``topic``, created
        where missing (at the earliest or latest position, durably) with no
        consumer: a cursor its owner moves by position (a stream source's
        progress, see `broker._reader`). Raises `refusals.NotAllowed`
        (nothing created) if it exists as a read_uncommitted one."""
        async with self._lock:
            parts = list(topic.partitions)
            existing = self._existing(topic, parts, name)
            for sub in existing:
                if sub is not None and sub.read_uncommitted:
                    raise refusals.NotAllowed(
                        f"subscription {name!r} on {topic.name!r} reads uncommitted messages; "
                        "a cursor moved by position reads committed ones",
                    )
            out = []
            for part, sub in zip(parts, existing, strict=True):
                if sub is None:
                    sub = await PartitionSubscription.create(part, name, earliest)
                    self._add(topic.name, (sub,))
                    sub.start()
                out.append(sub)
            return out

    def get(self, topic: str, index: int, name: str) -> PartitionSubscription | None:
        """Subscription ``name`` on partition ``index`` of ``topic``, if it exists."""
        for sub in self._by_topic.get(topic, ()):
            if sub.partition.index == index and sub.name == name:
                return sub
        return None

    async def cursor_of(self, topic: Topic, index: int, name: str) -> PartitionSubscription:
        """Subscription ``name`` on partition ``index`` of ``topic``, created
        at the earliest position (with no consumer) if it does not exist: a
        reader that keeps its own position (a Kafka consumer group) acks
        through it."""
        async with self._lock:
            sub = self.get(topic.name, index, name)
            if sub is None:
                sub = await PartitionSubscription.create(topic.partitions[index], name, True)
                self._add(topic.name, (sub,))
                sub.start()
            return sub

    async def extend(self, topic: Topic) -> None:
        """After a topic grew: give every subscription a cursor on the new partitions.

        New partitions are read from their start (as in Pulsar) and the
        connected consumers of each subscription are attached to them.
        """
        async with self._lock:
            for name, subs in self.of_topic(topic.name).items():
                consumers = list(subs[0].consumers)
                have = {sub.partition.index for sub in subs}
                for part in topic.partitions:
                    if part.index in have:
                        continue
                    sub = await PartitionSubscription.create(
                        part, name, earliest=True, read_uncommitted=subs[0].read_uncommitted
                    )
                    self._add(topic.name, (sub,))
                    for consumer in consumers:
                        sub.add_consumer(consumer)

    def detach(self, consumer: Consumer) -> None:
        """Detach ``consumer`` everywhere; its unacked messages are redelivered."""
        for sub in list(attached(consumer)):
            sub.remove_consumer(consumer)

    def redeliver(self, consumer: Consumer, ids: list[MessageId] | None) -> None:
        """Negative ack of ``ids`` (all unacked messages of ``consumer`` if None)."""
        for sub in attached(consumer):
            if ids is None:
                sub.redeliver_unacked(consumer, None)
            else:
                mine = [m.position for m in ids if m.partition == sub.partition.index]
                if mine:
                    sub.redeliver_unacked(consumer, mine)

    async def ack(
        self,
        consumer: Consumer,
        ids: list[MessageId],
        cumulative: bool,
        txn: TxnID | None = None,
    ) -> None:
        """Acknowledge ``ids`` on ``consumer``'s subscription, durably.

        Every id is checked first: an id naming no message raises
        `refusals.UnknownMessageId` and nothing is acknowledged.
        With ``txn`` (most_bits, least_bits) the messages become PENDING_ACK
        in that transaction (see `PartitionSubscription.ack`); the caller
        registers the subscription with the TC first. Partitions are acked
        concurrently: on TRANSACTION_CONFLICT another partition may hold
        locks of ``txn`` already, which the client's abort releases.
        """
        by_part: dict[int, list[Position]] = {}
        for mid in ids:
            by_part.setdefault(mid.partition, []).append((mid.entry_id, mid.batch_index))
        await self.ack_positions(consumer, by_part, cumulative, txn)

    async def ack_positions(
        self,
        consumer: Consumer,
        by_part: dict[int, list[Position]],
        cumulative: bool,
        txn: TxnID | None = None,
        early: bool = False,
    ) -> None:
        """`ack` of positions grouped by partition (what the wire gives);
        ``early``: see `PartitionSubscription.ack`."""
        if not by_part or not any(by_part.values()):
            raise refusals.InvalidArgument("an acknowledgement needs message ids")
        subs = {s.partition.index: s for s in attached(consumer)}
        for partition, positions in by_part.items():
            sub = subs.get(partition)
            if not positions:
                continue
            pos = positions[0] if sub is None else sub.first_unknown(positions)
            if pos is not None:
                raise refusals.UnknownMessageId(
                    f"no message {partition}:{pos[0]}:{pos[1]} on topic {consumer.topic!r} "
                    f"(subscription {consumer.subscription!r})",
                )
        if cumulative and len(by_part) > 1:
            raise refusals.InvalidArgument("a cumulative acknowledgement names one partition")
        if len(by_part) == 1:  # (the usual case: no task per partition)
            ((partition, positions),) = by_part.items()
            await subs[partition].ack(positions, cumulative, txn, early)
            return
        await asyncio.gather(
            *(subs[p].ack(pos, cumulative, txn, early) for p, pos in by_part.items())
        )

    async def end_txn(
        self, topic: str, subscription: str, txn: TxnID, commit: bool, early: bool = False
    ) -> None:
        """EndTxnOnSubscription: commit or abort ``txn``'s acks on every partition.

        Durable when it returns (``early``: queued, see `end_txn_early`);
        harmless to repeat. Nothing to do if the subscription does not exist
        (or holds nothing of ``txn``).
        """
        if early:
            self.end_txn_early(topic, subscription, txn, commit)
            return
        subs = self._named(topic, subscription)
        if len(subs) == 1:
            await subs[0].end_txn(txn, commit)
            return
        await asyncio.gather(*(sub.end_txn(txn, commit) for sub in subs))

    def end_txn_early(self, topic: str, subscription: str, txn: TxnID, commit: bool) -> None:
        """`end_txn` answered before it is durable, without a turn of the loop."""
        for sub in self._named(topic, subscription):
            sub.end_txn_early(txn, commit)

    def uncommitted_floor(self, topic: str, index: int) -> int | None:
        """The first sidecar entry of a partition that a read_uncommitted
        subscription still needs (None if it has none): its sweep keeps it."""
        floors = [
            f
            for sub in self._of_partition(topic, index).values()
            if (f := sub.uncommitted_floor()) is not None
        ]
        return min(floors) if floors else None

    # -- retention ------------------------------------------------------------------

    async def _trim_loop(self) -> None:
        while True:
            await asyncio.sleep(TRIM_INTERVAL)
            try:
                await self.trim_once()
            except Exception:
                log.exception("retention pass failed")

    async def trim_once(self) -> None:
        """Trim each partition up to ``TRIM_SLACK`` entries before the first
        entry some subscription has not fully acknowledged.

        A partition that holds ``TRIM_SLACK`` entries or fewer is passed
        over without looking at its cursors (a cursor is at most one past
        the last entry, so nothing would be trimmed): on a broker of many
        quiet topics, the pass costs a comparison per subscription.
        """
        floor: dict[Partition, int] = {}
        for subs in self._by_topic.values():
            for sub in subs:
                part = sub.partition
                ledger = part.ledger
                if ledger.last_entry_id - ledger.first_entry_id < TRIM_SLACK:
                    continue
                first_open = sub.cursor.first_open_entry()
                floor[part] = min(floor.get(part, first_open), first_open)
        now_ms = time.time_ns() // 1_000_000
        for part, first_open in floor.items():
            before = first_open - TRIM_SLACK
            topic = self.topics.peek(part.topic)
            if topic is None or before <= part.ledger.first_entry_id:
                continue  # (deleted or unloaded meanwhile, or nothing to trim)
            before = await part.retained_from(topic.retention, before, now_ms)
            ledger = part.ledger
            if before > ledger.first_entry_id and not (ledger.deleted or ledger.released):
                await part.ledger.trim(before)
                part.trimmed(before)

    # -- stats ------------------------------------------------------------------------

    def stats(self, topic: str, index: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, sub in sorted(self._of_partition(topic, index).items()):
            out[name] = {
                "type": sub.sub_type.value if sub.sub_type else None,
                "backlog": sub.backlog(),
                "consumers": len(sub.consumers),
                "unacked": len(sub.pending),
                "pending_ack": len(sub.cursor.pending_ack),
                "read_uncommitted": sub.read_uncommitted,
                "mark_delete": list(sub.cursor.mark_delete),
            }
        return out


def _order(sub: PartitionSubscription) -> tuple[str, int]:
    return (sub.name, sub.partition.index)
