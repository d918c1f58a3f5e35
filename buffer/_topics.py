"""Topics: named groups of partitions, created explicitly or on first use.

The topic list is itself a ledger (``__meta/topics``) of JSON records
``{"topic": name, "partitions": n, "retention": {...}}`` (retention left out
when there is none) or ``{"topic": name, "deleted": true}``; the last record
of a topic wins. A deletion is recorded before the topic's ledgers are
deleted: a start that finds a deleted topic's ledgers still there (a crash
in between) names them in `Topics.deleted` for the broker to delete.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from buffer._names import MAX_PARTITIONS, check_topic_name
from buffer._partition import Partition
from buffer._retention import NO_RETENTION, Retention
from buffer._txnbuffer import sidecar_ledger_name
from ledger import LedgerStore

__all__ = ["PartitionCountError", "Topic", "Topics", "partition_ledger_prefixes"]

_META_LEDGER = "__meta/topics"
LOAD_BATCH = 256  # topics loaded at once on start


class PartitionCountError(ValueError):
    """A partition count out of range, or lower than the topic has."""


@dataclass(slots=True)
class Topic:
    name: str
    partitions: list[Partition] = field(default_factory=list)
    retention: Retention = NO_RETENTION


def partition_ledger_prefixes(topic: str) -> list[str]:
    """The name prefixes of a topic's partition ledgers: its partitions,
    their deduplication snapshots and their sidecar transaction logs."""
    sidecar = sidecar_ledger_name(topic, 0)
    return [f"p/{topic}/", f"d/{topic}/", sidecar[: len(sidecar) - 1]]


class Topics:
    """Every topic of one broker. Create with `Topics.load`."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        self._topics: dict[str, Topic] = {}
        self._lock = asyncio.Lock()
        self._meta = store.get_ledger(_META_LEDGER)
        # Topics deleted whose ledgers may still be there (see the module docstring).
        self.deleted: set[str] = set()

    @classmethod
    async def load(cls, store: LedgerStore) -> Topics:
        topics = cls(store)
        topics._meta = await store.open_ledger(_META_LEDGER)
        records: dict[str, dict[str, Any]] = {}
        meta = topics._meta
        for entry in await meta.read(meta.first_entry_id, meta.last_entry_id):
            record = json.loads(entry.data)
            records[record["topic"]] = record

        async def load_topic(name: str, record: dict[str, Any]) -> Topic:
            n = int(record["partitions"])
            return Topic(
                name,
                [await Partition.load(store, name, i) for i in range(n)],
                Retention.from_json(record.get("retention")),
            )

        todo = []
        for name, record in sorted(records.items()):
            if not record.get("deleted"):
                todo.append((name, record))
            elif any(store.ledger_names(p) for p in partition_ledger_prefixes(name)):
                topics.deleted.add(name)
        # Topics load independently (each reads its own ledgers): a batch
        # at a time keeps the store's reader busy instead of one read at a
        # time waiting for its round trip.
        for start in range(0, len(todo), LOAD_BATCH):
            batch = todo[start : start + LOAD_BATCH]
            for topic in await asyncio.gather(*(load_topic(name, r) for name, r in batch)):
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
            retention = topic.retention if topic is not None else NO_RETENTION
            await self._record(name, partitions, retention)
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

    async def _record(self, name: str, partitions: int, retention: Retention) -> None:
        assert self._meta is not None  # set by load()
        record: dict[str, Any] = {"topic": name, "partitions": partitions}
        if retention != NO_RETENTION:
            record["retention"] = retention.to_json()
        await self._meta.append(json.dumps(record).encode(), meta=0)

    async def set_retention(self, name: str, retention: Retention) -> Topic:
        """Give the existing topic ``name`` this retention (durably); KeyError if none."""
        async with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                raise KeyError(name)
            if topic.retention != retention:
                await self._record(name, len(topic.partitions), retention)
                topic.retention = retention
            return topic

    async def delete(self, name: str, first: Callable[[Topic], Awaitable[None]]) -> bool:
        """Delete topic ``name``: record the deletion (durably), forget it
        (a topic of that name created from now on is a new one: creation
        waits until this returns), await ``first(topic)`` (the broker
        deletes what it keeps of the topic), then delete its partition
        ledgers. False if there is no such topic."""
        async with self._lock:
            topic = self._topics.get(name)
            if topic is None:
                return False
            assert self._meta is not None  # set by load()
            await self._meta.append(json.dumps({"topic": name, "deleted": True}).encode(), meta=0)
            del self._topics[name]
            self.deleted.add(name)
            await first(topic)
            await self.delete_ledgers(name)
            return True

    async def delete_ledgers(self, name: str) -> None:
        """Delete the partition ledgers of the deleted topic ``name``."""
        for prefix in partition_ledger_prefixes(name):
            for ledger_name in self.store.ledger_names(prefix):
                await self.store.delete_ledger(ledger_name)
        self.deleted.discard(name)
