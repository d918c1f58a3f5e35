"""Topics: named groups of partitions, created explicitly or on first use.

The topic list is itself a ledger (``__meta/topics``) of JSON records
``{"topic": name, "partitions": n}``; the last record of a topic wins.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from buffer._names import MAX_PARTITIONS, check_topic_name
from buffer._partition import Partition
from ledger import LedgerStore

__all__ = ["PartitionCountError", "Topic", "Topics"]

_META_LEDGER = "__meta/topics"
LOAD_BATCH = 256  # topics loaded at once on start


class PartitionCountError(ValueError):
    """A partition count out of range, or lower than the topic has."""


@dataclass(slots=True)
class Topic:
    name: str
    partitions: list[Partition] = field(default_factory=list)


class Topics:
    """Every topic of one broker. Create with `Topics.load`."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self._topics: dict[str, Topic] = {}
        self._lock = asyncio.Lock()
        self._meta = store.get_ledger(_META_LEDGER)

    @classmethod
    async def load(cls, store: LedgerStore) -> Topics:
        topics = cls(store)
        topics._meta = await store.open_ledger(_META_LEDGER)
        counts: dict[str, int] = {}
        meta = topics._meta
        for entry in await meta.read(meta.first_entry_id, meta.last_entry_id):
            record = json.loads(entry.data)
            counts[record["topic"]] = int(record["partitions"])

        async def load_topic(name: str, n: int) -> Topic:
            return Topic(name, [await Partition.load(store, name, i) for i in range(n)])

        # Topics load independently (each reads its own ledgers): a batch
        # at a time keeps the store's reader busy instead of one read at a
        # time waiting for its round trip.
        todo = sorted(counts.items())
        for start in range(0, len(todo), LOAD_BATCH):
            batch = todo[start : start + LOAD_BATCH]
            for topic in await asyncio.gather(*(load_topic(name, n) for name, n in batch)):
                topics._topics[topic.name] = topic
        return topics

    def __contains__(self, name: str) -> bool:
        return name in self._topics

    def names(self) -> list[str]:
        return sorted(self._topics)

    def all(self) -> list[Topic]:
        """Every topic, in the order they were loaded (by name) and created."""
        return list(self._topics.values())

    def get(self, name: str) -> Topic | None:
        return self._topics.get(name)

    async def get_or_create(self, name: str) -> Topic:
        """The topic ``name``, created with one partition if it does not exist."""
        topic = self._topics.get(name)
        if topic is not None:
            return topic
        return await self.create(name, 1, exist_ok=True)

    async def create(self, name: str, partitions: int, *, exist_ok: bool = False) -> Topic:
        """Create ``name`` with ``partitions`` partitions, or grow it to that many.

        Raises `InvalidNameError` or `PartitionCountError` without changing
        anything. With ``exist_ok`` an existing topic is returned as it is.
        """
        check_topic_name(name)
        if not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise PartitionCountError(
                f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}"
            )
        async with self._lock:
            topic = self._topics.get(name)
            if topic is not None and (exist_ok or len(topic.partitions) == partitions):
                return topic
            if topic is not None and partitions < len(topic.partitions):
                raise PartitionCountError(
                    f"topic {name!r} has {len(topic.partitions)} partitions; "
                    "the count can grow but not shrink"
                )
            assert self._meta is not None  # set by load()
            record = {"topic": name, "partitions": partitions}
            await self._meta.append(json.dumps(record).encode(), meta=0)
            if topic is not None:  # growing: each partition appears once loaded
                for i in range(len(topic.partitions), partitions):
                    topic.partitions.append(await Partition.load(self.store, name, i))
                return topic
            # A new topic becomes visible with its partitions: `get_or_create`
            # does not take the lock, and a topic without partitions would be
            # handed out while they load (a producer's create then failed).
            loaded = [await Partition.load(self.store, name, i) for i in range(partitions)]
            topic = self._topics[name] = Topic(name, loaded)
            return topic
