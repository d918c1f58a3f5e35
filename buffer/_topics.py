"""Topics: named groups of partitions, created explicitly or on first use.

The topic list is itself a ledger (``__meta/topics``) of JSON records
``{"topic": name, "partitions": n, "retention": {...}}`` (retention left out
when there is none) or ``{"topic": name, "deleted": true}``; the last record
of a topic wins. A deletion is recorded before the topic's ledgers are
deleted: a start that finds a deleted topic's ledgers still there (a crash
in between) names them in `Topics.deleted` for the broker to delete.

In a cluster (`Topics.load` with ``slots``), each slot has a topic list of
its own, ``__meta/topics/{k}``, written by the slot's owner only: a broker
knows the topics of the slots it holds (`load_slot`, `drop_slot`), and
``gate`` refuses a topic of any other slot (`refusals.NotOwner`).
`get_or_create` (what a client's producer or consumer asks for) asks the
gate even of a loaded topic: a broker that is handing a slot over, or
dropping everything after its store failed, still holds the slot's loaded
topics for a moment, and must not take a new producer or consumer on them
(the consumer's acks would then be refused NOT_OWNER on a link it is
subscribed on). The list
of a single broker, ``__meta/topics``, is read as the first records of
every slot's list (a database that one broker served before it became a
cluster), and not written any more.

Loaded on first use: `Topics.load` reads the topic list only (a name, a
partition count and a retention per topic, ~150 bytes each); a topic's
partitions are loaded from their ledgers when it is first asked for
(`Topics.load_topic`, `get_or_create`, `after_load`), once however many ask
at the same time, and `Topics.unload` gives them back. Before a loaded
topic becomes visible, the ``prepare`` hook runs (the broker loads its
subscriptions there, and aborts the transactions a crash left open on it),
and then, in the same step, whatever `after_load` queued, in call order:
nothing reaches a topic before its recovery is done, and work queued for it
keeps its order.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from buffer._names import MAX_PARTITIONS, check_topic_name
from buffer._partition import Partition
from buffer._retention import NO_RETENTION, Retention
from buffer._sidecar import sidecar_ledger_name
from ledger import Ledger, LedgerStore
from proto import refusals

__all__ = ["PartitionCountError", "Topic", "Topics", "partition_ledger_prefixes"]

log = logging.getLogger(__name__)

_META_LEDGER = "__meta/topics"
LOAD_BATCH = 256  # topics loaded at once by `Topics.load_all`
_READ_CHUNK = 4096  # records of the topic list read at once on start
_T = TypeVar("_T")


class PartitionCountError(ValueError):
    """A partition count out of range, or lower than the topic has."""


@dataclass(slots=True)
class Topic:
    name: str
    partitions: list[Partition] = field(default_factory=list)
    retention: Retention = NO_RETENTION
    used: float = 0.0  # `time.monotonic()` when last handed out (see `Topics.idle_for`)


def partition_ledger_prefixes(topic: str) -> list[str]:
    """The name prefixes of a topic's partition ledgers: its partitions,
    their deduplication snapshots and their sidecar transaction logs."""
    sidecar = sidecar_ledger_name(topic, 0)
    return [f"p/{topic}/", f"d/{topic}/", sidecar[: len(sidecar) - 1]]


class Topics:
    """Every topic of one broker. Create with `Topics.load`."""

    def __init__(self, store: LedgerStore) -> None:
        self.store = store
        # Every topic: its partition count, and its retention if it has one.
        self._known: dict[str, int] = {}
        self._retention: dict[str, Retention] = {}
        # The loaded topics, and the loads under way.
        self._topics: dict[str, Topic] = {}
        self._loading: dict[str, asyncio.Future[Topic | None]] = {}
        self._load_tasks: set[asyncio.Task[None]] = set()
        self._after: dict[str, list[Callable[[Topic | None, BaseException | None], None]]] = {}
        self._lock = asyncio.Lock()
        self._meta: Ledger | None = None  # the topic list (one broker: set by `load`)
        # Topics deleted whose ledgers may still be there (see the module docstring).
        self.deleted: set[str] = set()
        # Run on a topic being loaded, before it becomes visible; and on a
        # topic whose load failed after ``prepare`` began, or that unloads.
        self.prepare: Callable[[Topic], Awaitable[None]] | None = None
        self.discard: Callable[[Topic], None] | None = None
        # A cluster: the number of slots and each topic's slot (0: one broker,
        # one topic list); the topic lists of the slots held; and ``gate``,
        # which raises `refusals.NotOwner` for a topic of a slot not held.
        self.slots = 0
        self.slot_of: Callable[[str], int] = lambda name: 0
        self._metas: dict[int, Ledger] = {}
        self._legacy: list[bytes] = []  # a cluster: the single broker's list, read once
        self.gate: Callable[[str], None] | None = None

    @classmethod
    async def load(
        cls,
        store: LedgerStore,
        *,
        lazy: bool = False,
        slots: int = 0,
        slot_of: Callable[[str], int] | None = None,
    ) -> Topics:
        """Read the topic list; with ``lazy`` that is all (each topic loads
        on first use), else every topic is loaded too. With ``slots`` (a
        cluster; ``slot_of``: a topic's slot) nothing is read: each slot's
        list is read when the slot is taken (`load_slot`)."""
        topics = cls(store)
        if slots:
            assert slot_of is not None
            topics.slots = slots
            topics.slot_of = slot_of
            legacy = store.get_ledger(_META_LEDGER)
            if legacy is not None:  # (read once, then given back: it is slot 0's ledger)
                topics._legacy = [e.data for e in await topics._entries(legacy)]
                store.release_ledger(legacy)
            return topics
        topics._meta = await store.open_ledger(_META_LEDGER)
        await topics._read_list(topics._meta)
        topics.deleted = {
            name
            for name in topics.deleted
            if any(store.ledger_names(p) for p in partition_ledger_prefixes(name))
        }
        if not lazy:
            await topics.load_all()
        return topics

    @staticmethod
    async def _entries(meta: Ledger) -> list[Any]:
        out = []
        for start in range(meta.first_entry_id, meta.last_entry_id + 1, _READ_CHUNK):
            out.extend(await meta.read(start, start + _READ_CHUNK - 1))
        return out

    async def _read_list(self, meta: Ledger) -> None:
        """Apply the records of the topic list ``meta``."""
        # (A chunk of records at a time: less memory left behind by a start.)
        for start in range(meta.first_entry_id, meta.last_entry_id + 1, _READ_CHUNK):
            self._apply([e.data for e in await meta.read(start, start + _READ_CHUNK - 1)])

    def _apply(self, records: list[bytes], slot: int | None = None) -> None:
        """Apply topic-list records (those of topics of ``slot`` only, if given)."""
        if records:
            for data in records:
                record = json.loads(data)
                if slot is not None and self.slot_of(record["topic"]) != slot:
                    continue
                # (Interned: the broker's other tables keyed by topic share it.)
                name = sys.intern(record["topic"])
                if record.get("deleted"):
                    self._known.pop(name, None)
                    self._retention.pop(name, None)
                    self.deleted.add(name)
                    continue
                self.deleted.discard(name)
                self._known[name] = int(record["partitions"])
                if record.get("retention") is not None:
                    self._retention[name] = Retention.from_json(record["retention"])
                else:
                    self._retention.pop(name, None)

    # -- slots (a cluster) -------------------------------------------------------------

    async def load_slot(self, slot: int) -> list[str]:
        """Read the topic list of ``slot`` (just taken: its ledgers are
        writable here); returns the deleted topics of the slot whose ledgers
        are still there (a deletion a failure interrupted)."""
        self._apply(self._legacy, slot)
        meta = self._metas[slot] = await self.store.open_ledger(f"{_META_LEDGER}/{slot}")
        await self._read_list(meta)
        leftovers = [
            name
            for name in self.deleted
            if self.slot_of(name) == slot
            and any(self.store.ledger_names(p) for p in partition_ledger_prefixes(name))
        ]
        return sorted(leftovers)

    def drop_slot(self, slot: int) -> list[str]:
        """Forget the topics of ``slot`` (handed over or lost): the loaded
        ones are dropped whatever is under way (``discard`` runs for each).
        Returns their names."""
        names = [n for n in self._known if self.slot_of(n) == slot]
        for name in names:
            self._known.pop(name, None)
            self._retention.pop(name, None)
            topic = self._topics.pop(name, None)
            if topic is not None:
                self._drop(topic)
        self.deleted = {n for n in self.deleted if self.slot_of(n) != slot}
        meta = self._metas.pop(slot, None)
        if meta is not None:
            self.store.release_ledger(meta)
        return names

    def _check_gate(self, name: str) -> None:
        if self.gate is not None:
            self.gate(name)

    def _meta_of(self, name: str) -> Ledger:
        if not self.slots:
            assert self._meta is not None  # set by load()
            return self._meta
        meta = self._metas.get(self.slot_of(name))
        if meta is None:
            raise refusals.NotOwner(f"topic {name!r}: its slot is not held here")
        return meta

    async def load_all(self, batch: int = LOAD_BATCH) -> None:
        """Load every topic not loaded yet, ``batch`` at a time, by name."""
        # Topics load independently (each reads its own ledgers): a batch
        # at a time keeps the store's reader busy instead of one read at a
        # time waiting for its round trip.
        todo = self.unloaded()
        for start in range(0, len(todo), batch):
            await asyncio.gather(*(self.load_topic(name) for name in todo[start : start + batch]))

    # -- what there is --------------------------------------------------------------

    def __contains__(self, name: str) -> bool:
        return name in self._known

    def __len__(self) -> int:
        return len(self._known)

    def names(self) -> list[str]:
        """Every topic's name, loaded or not, sorted."""
        return sorted(self._known)

    def unloaded(self) -> list[str]:
        """The names of the topics not loaded (nor loading), sorted."""
        return sorted(n for n in self._known if n not in self._topics and n not in self._loading)

    def partition_count(self, name: str) -> int | None:
        """How many partitions topic ``name`` has (None: no such topic), loaded or not."""
        return self._known.get(name)

    def retention_of(self, name: str) -> Retention:
        return self._retention.get(name, NO_RETENTION)

    def all(self) -> list[Topic]:
        """Every loaded topic."""
        return list(self._topics.values())

    def loaded_count(self) -> int:
        return len(self._topics)

    def get(self, name: str) -> Topic | None:
        """The topic ``name`` if it is loaded (None: not loaded, or no such
        topic; see `load_topic`)."""
        topic = self._topics.get(name)
        if topic is not None:
            topic.used = time.monotonic()
        return topic

    def peek(self, name: str) -> Topic | None:
        """`get` for the broker's own passes (retention, metrics): it does
        not count as a use."""
        return self._topics.get(name)

    def idle_for(self, topic: Topic) -> float:
        """Seconds since ``topic`` was last handed out."""
        return time.monotonic() - topic.used

    # -- loading --------------------------------------------------------------------

    async def load_topic(self, name: str) -> Topic | None:
        """The topic ``name``, loaded if it is not (None: no such topic)."""
        topic = self.get(name)
        if topic is not None:
            return topic
        self._check_gate(name)
        if name not in self._known:
            return None
        return await asyncio.shield(self._start_load(name))

    def request_load(self, name: str) -> None:
        """Start loading ``name`` if it exists and is not loaded (for a
        synchronous caller that answers "try again")."""
        if name in self._known and name not in self._topics:
            self._start_load(name)

    def after_load(self, name: str, work: Callable[[Topic], _T]) -> asyncio.Future[_T]:
        """``work(topic)``'s result: called now if ``name`` is loaded, else
        in the step that makes it visible, after the calls queued before it
        (so what it queues keeps the order of these calls). Fails with
        `refusals.TopicNotFound` if there is no such topic, or with what the
        load raised."""
        done: asyncio.Future[_T] = asyncio.get_running_loop().create_future()

        def run(topic: Topic | None, error: BaseException | None) -> None:
            if isinstance(error, asyncio.CancelledError):
                done.cancel()
            elif error is not None:
                done.set_exception(error)
            elif topic is None:
                done.set_exception(refusals.TopicNotFound(f"no topic {name!r}"))
            else:
                try:
                    done.set_result(work(topic))
                except Exception as exc:
                    done.set_exception(exc)

        topic = self.get(name)
        if topic is None:
            try:
                self._check_gate(name)
            except refusals.Refusal as exc:
                run(None, exc)
                return done
        if topic is not None or name not in self._known:
            run(topic, None)
            return done
        self._after.setdefault(name, []).append(run)
        self._start_load(name)
        return done

    def _start_load(self, name: str) -> asyncio.Future[Topic | None]:
        # (The topic list's string, interned: a name read from a request is
        # a copy, which the loaded topic, its partitions and the broker's
        # tables would keep.)
        name = sys.intern(name)
        loading = self._loading.get(name)
        if loading is None:
            loop = asyncio.get_running_loop()
            loading = self._loading[name] = loop.create_future()
            task = loop.create_task(self._load(name, loading))
            self._load_tasks.add(task)  # (the loop keeps only a weak reference)
            task.add_done_callback(self._load_tasks.discard)
        return loading

    async def _load(self, name: str, loading: asyncio.Future[Topic | None]) -> None:
        topic: Topic | None = None
        error: BaseException | None = None
        parts: list[Partition] = []
        try:
            for i in range(self._known[name]):
                parts.append(await Partition.load(self.store, name, i))
            topic = Topic(name, parts, self.retention_of(name), time.monotonic())
            if self.prepare is not None:
                await self.prepare(topic)
        except BaseException as exc:  # (cancelled too, by `close`: its waiters learn it)
            error = exc
            if not isinstance(exc, asyncio.CancelledError):
                log.error("loading topic %r failed: %s", name, exc)
            if topic is not None and self.discard is not None:
                self.discard(topic)
            for part in parts:
                part.release()
            topic = None
        del self._loading[name]
        if topic is not None and name not in self._known:
            self._drop(topic)  # (deleted meanwhile)
            topic = None
        if topic is not None:
            self._topics[name] = topic
        for run in self._after.pop(name, []):
            run(topic, error)
        if isinstance(error, asyncio.CancelledError):
            loading.cancel()
        elif error is not None:
            loading.set_exception(error)
            loading.exception()  # (retrieved: the callers that wait get it too)
        else:
            loading.set_result(topic)

    async def close(self) -> None:
        """Stop the loads under way (their callers get CancelledError)."""
        tasks = list(self._load_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def unload(self, name: str) -> bool:
        """Forget the loaded topic ``name`` (it loads again on next use):
        ``discard`` runs, and its partitions give their ledgers back. Only
        if every partition is `Partition.settled` (nothing under way); the
        caller checks that nothing else holds it (producers, consumers,
        transactions). False if not loaded or not settled."""
        topic = self._topics.get(name)
        if topic is None or not all(part.settled() for part in topic.partitions):
            return False
        del self._topics[name]
        self._drop(topic)
        return True

    def _drop(self, topic: Topic) -> None:
        if self.discard is not None:
            self.discard(topic)
        for part in topic.partitions:
            part.release()

    # -- changes --------------------------------------------------------------------

    async def get_or_create(self, name: str) -> Topic:
        """The topic ``name``, created with one partition if it does not
        exist; `refusals.NotOwner` if ``gate`` refuses it, loaded or not."""
        self._check_gate(name)
        topic = await self.load_topic(name)
        if topic is not None:
            return topic
        return await self.create(name, 1, exist_ok=True)

    async def create(self, name: str, partitions: int, *, exist_ok: bool = False) -> Topic:
        """Create ``name`` with ``partitions`` partitions, or grow it to that many.

        Raises `InvalidNameError` or `PartitionCountError` without changing
        anything. With ``exist_ok`` an existing topic is returned as it is.
        """
        check_topic_name(name)
        self._check_gate(name)
        if not isinstance(partitions, int) or not 1 <= partitions <= MAX_PARTITIONS:
            raise PartitionCountError(
                f"partitions must be an integer from 1 to {MAX_PARTITIONS}, got {partitions!r}"
            )
        async with self._lock:
            topic = await self.load_topic(name)
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
                    self._known[name] = i + 1
                return topic
            # A new topic becomes visible with its partitions (and prepared):
            # `get_or_create` does not take the lock, and a topic without
            # partitions would be handed out while they load (a producer's
            # create would fail).
            name = sys.intern(name)
            loaded = [await Partition.load(self.store, name, i) for i in range(partitions)]
            topic = Topic(name, loaded, NO_RETENTION, time.monotonic())
            if self.prepare is not None:
                await self.prepare(topic)
            self._known[name] = partitions
            self._topics[name] = topic
            return topic

    async def _record(self, name: str, partitions: int, retention: Retention) -> None:
        meta = self._meta_of(name)
        record: dict[str, Any] = {"topic": name, "partitions": partitions}
        if retention != NO_RETENTION:
            record["retention"] = retention.to_json()
        await meta.append(json.dumps(record).encode(), meta=0)

    async def set_retention(self, name: str, retention: Retention) -> Topic:
        """Give the existing topic ``name`` this retention (durably);
        `refusals.TopicNotFound` if there is none."""
        async with self._lock:
            topic = await self.load_topic(name)
            if topic is None:
                raise refusals.TopicNotFound(f"no topic {name!r}")
            if topic.retention != retention:
                await self._record(name, len(topic.partitions), retention)
                topic.retention = retention
                if retention == NO_RETENTION:
                    self._retention.pop(name, None)
                else:
                    self._retention[name] = retention
            return topic

    async def delete(self, name: str, first: Callable[[Topic], Awaitable[None]]) -> bool:
        """Delete topic ``name``: record the deletion (durably), forget it
        (a topic of that name created from now on is a new one: creation
        waits until this returns), await ``first(topic)`` (the broker
        deletes what it keeps of the topic), then delete its partition
        ledgers. False if there is no such topic."""
        async with self._lock:
            topic = await self.load_topic(name)
            if topic is None:
                return False
            meta = self._meta_of(name)
            await meta.append(json.dumps({"topic": name, "deleted": True}).encode(), meta=0)
            del self._topics[name]
            del self._known[name]
            self._retention.pop(name, None)
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
