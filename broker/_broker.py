"""The broker: storage, topics, subscriptions and coordinators, and what
connects them.

The broker runs the transaction coordinators named by ``tc_ids`` (each with
its own log, a ledger in the broker's store) and is their `tc.Participant`:
ending a transaction on a partition goes to the partition's transaction
buffer, on a subscription to the subscription's pending acks. What a
coordinator tells it (`tc.TxnEnd`) carries everything it needs: the broker
never asks a coordinator back on that path. END_TXN_ON_PARTITION /
_SUBSCRIPTION read off the wire are checked against the decision of their
coordinator first (`decided_end`): anyone holding the cluster role could
send one. In a cluster, a participant whose slot another broker owns is
told there (`tc.ParticipantElsewhere`, `broker._peers`), and an END from
a coordinator on another broker is taken at its slot's current epoch only
(`_told_end`); a transactional send or ack whose coordinator is on another
broker is checked with it first and answered once durable
(`remote_coordinator`, docs/cluster.md).

Topics load on first use (see `buffer.Topics`): a start reads the topic
list, opens the coordinators (which recover their own logs) and serves;
each topic's partitions, transaction buffers and subscriptions are loaded
when a client, the admin API or a coordinator first needs them, or by the
background pass that loads every topic after the start (``preload``). A
topic is prepared before anyone sees it (`_prepare_topic`): once every
coordinator is open, its subscriptions are loaded and the transactions a
crash left open on it that their coordinator did not decide to commit are
aborted (`_abort_orphans`). A topic left alone for ``unload_after`` seconds
with nothing under way (no producer, consumer, transaction not ended,
write not yet durable) is unloaded (`_unload_idle`): everything it holds is
in its ledgers, and it loads again on next use. docs/decisions.md says why.

The client connections (`broker._connection`) are known here as `Client`:
what the broker and the admin API do to one (drop its producers and
consumers, close it). Nothing here imports the connection, the admin API or
the server: they import this.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from aiohttp import web

from broker._auth import AuthConfig, Security
from broker._metrics import BrokerMetrics
from broker._slots import slot_of, slot_of_key
from buffer import Partition, PublishResult, Topic, Topics, TransactionBuffer
from ledger import LedgerError, LedgerStore, faults
from proto import refusals, txn_text
from proto import txnbuf_pb2 as pb
from subscriptions import Consumer, Subscriptions
from tc import (
    ParticipantElsewhere,
    ProducerSettings,
    TransactionCoordinator,
    TxnEnd,
    TxnID,
    TxnNotFoundError,
    TxnStatus,
    coordinator_of,
    coordinator_of_producer,
)

__all__ = [
    "BROKER_KEY",
    "UNLOAD_AFTER",
    "Broker",
    "Client",
    "ClusterGate",
    "ConnectedProducer",
    "broker_id",
    "open_cluster_store",
]

log = logging.getLogger(__name__)

BROKER_KEY: web.AppKey[Broker] = web.AppKey("broker")
SWEEP_INTERVAL = 5.0  # seconds between transaction buffer sweeps (and unload passes)
PRELOAD_BATCH = 32  # topics the background pass loads at once (a client's load waits behind)
UNLOAD_AFTER = 600.0  # seconds a topic is left alone, nothing under way, before it unloads


@dataclass(slots=True)
class ConnectedProducer:
    """A producer a client created on its connection (PRODUCER)."""

    producer_id: int
    name: str
    topic: Topic


class Client(Protocol):
    """A client connection, as the broker and the admin API see it."""

    @property
    def producers(self) -> dict[int, ConnectedProducer]: ...

    @property
    def consumers(self) -> dict[int, Consumer]: ...

    def close(self) -> None:
        """Forget its producers and consumers, and send nothing more (the
        socket stays open until `shut`)."""

    async def shut(self) -> None:
        """Forget its producers and consumers, and close it."""


class Broker:
    """Create with `Broker.open`; `close` stops everything in order."""

    def __init__(
        self,
        data_dir: Path | None,
        store: LedgerStore,
        topics: Topics,
        subs: Subscriptions,
        url: str,
        security: Security | None = None,
        unload_after: float | None = UNLOAD_AFTER,
    ) -> None:
        self.data_dir = data_dir  # (None: the store is PostgreSQL, no data directory)
        # Authentication, the ACL and the limits on one client (`broker._auth`).
        if security is None:
            assert data_dir is not None
            security = Security.load(data_dir)
        self.security = security
        self.store = store
        self.topics = topics
        self.subscriptions = subs
        self.url = url
        self.connections: set[Client] = set()
        self.coordinators: dict[int, TransactionCoordinator] = {}
        # Done once every coordinator is open: topics load after that (their
        # orphan aborts ask every coordinator what it decided).
        self._coordinators_open: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.unload_after = unload_after  # (None: topics stay loaded)
        self.unloaded = 0  # topics unloaded since start, for stats
        self._sweeper: asyncio.Task[None] | None = None
        self._preloader: asyncio.Task[None] | None = None
        self._producer_owners: dict[tuple[str, str], Client] = {}
        self._producers_of: dict[str, int] = {}  # topic -> its connected producers
        # Transactional sends waiting for their partition's buffer to be created.
        self._awaiting_buffer: dict[Partition, list[_TxnSend]] = {}
        self.started = time.time()
        self.metrics = BrokerMetrics(self)
        # A cluster broker (`broker._cluster`): which slots it serves, and the
        # refusal of what it does not (None: one broker, every slot).
        self.cluster: ClusterGate | None = None
        self.store_owner = ""  # the name its PostgreSQL store writes as (`broker_id`)

    @classmethod
    async def open(
        cls,
        data_dir: str | Path,
        url: str = "",
        tc_ids: tuple[int, ...] = (0,),
        auth: AuthConfig | None = None,
        producer_settings: ProducerSettings | None = None,
        preload: bool = True,
        unload_after: float | None = UNLOAD_AFTER,
        store_url: str | None = None,
        cluster: bool = False,
    ) -> Broker:
        """``auth``: authentication, superusers and limits (none, the
        default: see `broker._auth`). ``preload``: load every topic in the
        background after the start; ``unload_after``: seconds a topic is
        left alone before it unloads (None: never; see the module
        docstring). ``store_url``: a PostgreSQL database instead of
        ``data_dir`` (`open_cluster_store`); with ``cluster`` it takes no
        slot and no coordinator: `broker._cluster.ClusterHost` loads them as
        the cluster gives them to it."""
        t0 = time.perf_counter()
        where: Path | str
        folder: Path | None = None
        if store_url is None:
            where = folder = Path(data_dir)
            folder.mkdir(parents=True, exist_ok=True)
            security = Security.load(folder, auth)
            store = await LedgerStore.open(folder / "broker.db")
        elif cluster:
            store = await LedgerStore.open(store_url, owner=broker_id(url), slot_of=slot_of)
            where = store.location
            tc_ids = ()
            try:
                security = await Security.load_cluster(store, auth)
            except BaseException:
                await store.close()
                raise
        else:
            store = await open_cluster_store(store_url, broker_id(url))
            where = store.location
            try:
                security = await Security.load_from_store(store, auth)
            except BaseException:
                await store.close()
                raise
        if cluster:
            count = store.slot_count
            topics = await Topics.load(
                store, lazy=True, slots=count, slot_of=lambda name: slot_of_key(name, count)
            )
        else:
            topics = await Topics.load(store, lazy=True)
        subs = await Subscriptions.load(topics)
        for name in sorted(topics.deleted):  # (a deletion that a crash interrupted)
            await subs.delete_leftovers(name)
            await topics.delete_ledgers(name)
        broker = cls(folder, store, topics, subs, url, security, unload_after)
        if store_url is not None:
            broker.store_owner = broker_id(url)
        topics.prepare = broker._prepare_topic
        topics.discard = broker._discard_topic
        log.info(
            "found %d topics (%d ledgers) in %s in %.2fs",
            len(topics),
            len(store.ledger_names()),
            where,
            time.perf_counter() - t0,
        )
        try:
            if not cluster:  # (a cluster's brokers do not keep the counters: docs/cluster.md)
                await broker.metrics.load(store)
            for tcid in tc_ids:
                broker.coordinators[tcid] = await broker._open_coordinator(tcid, producer_settings)
        except BaseException:
            await broker.close()
            raise
        broker._coordinators_open.set_result(None)
        loop = asyncio.get_running_loop()
        broker._sweeper = loop.create_task(broker._sweep_loop())
        if preload:
            broker._preloader = loop.create_task(broker._preload())
        broker.metrics.start()
        return broker

    async def _open_coordinator(
        self, tcid: int, settings: ProducerSettings | None = None
    ) -> TransactionCoordinator:
        """Coordinator ``tcid`` keeps its log in the broker's store, next to
        the partitions and subscriptions it ends transactions on, so that
        they write right behind its records (see `tc`)."""
        if self.data_dir is not None and (self.data_dir / f"tc-{tcid}.db").exists():
            raise LedgerError(
                f"{self.data_dir / f'tc-{tcid}.db'} is a coordinator log in a separate file, "
                "which this version of txnbuf does not read (coordinators log in broker.db)"
            )
        tc = await TransactionCoordinator.open(tcid, self.store, self, settings)
        # (In a cluster a participant's topic may end up on another broker
        # than the coordinator: registrations are logged, see `tc`.)
        tc.log_registrations = self.cluster is not None
        return tc

    # -- loading and unloading topics ----------------------------------------------

    async def _prepare_topic(self, topic: Topic) -> None:
        """`buffer.Topics.prepare`: what a topic being loaded needs before
        anyone sees it. Once every coordinator is open (they recover first,
        and the orphan aborts ask them): its subscriptions, then the aborts
        of what a crash left open on it."""
        await asyncio.shield(self._coordinators_open)
        await self.subscriptions.load_topic(topic)
        await self._abort_orphans([topic])

    def _discard_topic(self, topic: Topic) -> None:
        """`buffer.Topics.discard`: a topic unloads (or its load failed): its
        counters go to the metrics' base, its subscriptions go."""
        self.metrics.fold_topic(topic)
        self.subscriptions.unload_topic(topic.name)

    async def _preload(self) -> None:
        """The background pass: load every topic not loaded yet, a few at a
        time (a client's first use of a topic loads it at once, ahead of
        the pass, or waits for the load under way)."""
        t0 = time.perf_counter()
        todo = self.topics.unloaded()
        loaded = 0
        for start in range(0, len(todo), PRELOAD_BATCH):
            batch = todo[start : start + PRELOAD_BATCH]
            results = await asyncio.gather(
                *(self.topics.load_topic(name) for name in batch), return_exceptions=True
            )
            loaded += sum(1 for r in results if not isinstance(r, BaseException))
        if todo:
            log.info(
                "loaded %d topics in the background in %.2fs", loaded, time.perf_counter() - t0
            )

    def _unload_idle(self) -> int:
        """Unload every topic left alone for `unload_after` seconds that
        has nothing under way: no producer or consumer connected, no
        transaction not ended that its coordinator knows of or that holds
        writes or acknowledgements there, every write durable (see
        `buffer.Topics.unload`). Returns how many went."""
        if self.unload_after is None:
            return 0
        candidates = [t for t in self.topics.all() if self.topics.idle_for(t) >= self.unload_after]
        if not candidates:
            return 0
        in_txn = {
            topic
            for tc in self.coordinators.values()
            for meta in tc.transactions()
            if not meta.status.ended
            for topic, _ in (*meta.partitions, *meta.subscriptions)
        }
        waiting = {part.topic for part in self._awaiting_buffer}
        unloaded = 0
        for topic in candidates:
            name = topic.name
            if (
                name in in_txn
                or name in waiting
                or self._producers_of.get(name)
                or not self.subscriptions.settled(name)
            ):
                continue
            if self.topics.unload(name):
                unloaded += 1
        if unloaded:
            self.unloaded += unloaded
            log.info("unloaded %d idle topics (%d loaded)", unloaded, self.topics.loaded_count())
        return unloaded

    async def _abort_orphans(self, topics: Sequence[Topic]) -> None:
        """Abort, on the partitions and subscriptions of ``topics`` (being
        loaded) that hold it, every transaction left open by a crash that
        its coordinator will not end.

        A coordinator whose participants answer early does not log
        registrations (see `tc`): after a restart it aborts the transactions
        it found OPEN without knowing where they wrote. Their participants
        know: each one still holding a transaction its coordinator has not
        decided to commit (ABORTING, ABORTED, or forgotten) aborts it here.
        A committing one is left to its coordinator, whose decision record
        names every participant. Transactions of a coordinator not running
        here are left alone."""
        held: list[tuple[TxnID, str, Callable[[], Awaitable[None]]]] = []

        def decided_abort(key: TxnID) -> bool:
            txnid = TxnID(*key)
            tc = self.coordinators.get(txnid.tcid)
            if tc is None:
                return False
            meta = tc.get(txnid)
            return meta is None or meta.status in (TxnStatus.ABORTING, TxnStatus.ABORTED)

        for topic in topics:
            for part in topic.partitions:
                buffer = part.transaction_buffer
                if buffer is None:
                    continue
                for key in buffer.open_transactions():
                    if decided_abort(key):
                        end = functools.partial(buffer.end, key, commit=False)
                        held.append((key, part.name, end))
        subs = [
            sub
            for topic in topics
            for parts in self.subscriptions.of_topic(topic.name).values()
            for sub in parts
        ]
        for sub in subs:
            for key in list(sub.cursor.txn_acks):
                if decided_abort(key):
                    where = f"subscription {sub.name!r} of {sub.partition.name}"
                    held.append((key, where, functools.partial(sub.end_txn, key, commit=False)))
        if not held:
            return
        # All at once: they share group commits.
        results = await asyncio.gather(*(end() for _, _, end in held), return_exceptions=True)
        for (key, where, _), result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                # (It stays open there, never committed; the next start tries again.)
                log.error("aborting transaction %s on %s failed: %s", txn_text(key), where, result)
            else:
                log.debug("aborted transaction %s left open on %s", txn_text(key), where)
        log.info(
            "aborted %d transactions left open by the restart on %d partitions and "
            "subscriptions of %s",
            len({key for key, _, _ in held}),
            len({where for _, where, _ in held}),
            ", ".join(repr(t.name) for t in topics[:3]) + (" ..." if len(topics) > 3 else ""),
        )

    async def _sweep_loop(self) -> None:
        """Reclaim sidecar entries of aborted transactions and of committed ones
        whose markers were trimmed (PIP-31 §Retention Cursor), on the loaded
        topics; then unload the idle ones (in this task: never in the middle
        of a sweep)."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            for name, part, buffer in self._buffers():
                if part.ledger.released:
                    continue  # (unloaded meanwhile)
                if self.store.failure.done():
                    break  # (the store failed: the broker stops or reopens it)
                try:
                    await buffer.sweep(self.subscriptions.uncommitted_floor(name, part.index))
                except Exception as exc:
                    if self.store.failure.done():  # (failed meanwhile: the store said so)
                        log.info("sweeping %s stopped: the store failed (%s)", part.name, exc)
                        break
                    log.exception("sweeping the transaction buffer of %s failed", part.name)
            try:
                self._unload_idle()
            except Exception:
                log.exception("unloading idle topics failed")

    def _buffers(self) -> list[tuple[str, Partition, TransactionBuffer]]:
        """(topic name, partition, its transaction buffer) of every partition
        that has one."""
        return [
            (topic.name, part, part.transaction_buffer)
            for topic in self.topics.all()
            for part in topic.partitions
            if part.transaction_buffer is not None
        ]

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._preloader is not None:
            self._preloader.cancel()
        if not self._coordinators_open.done():
            self._coordinators_open.cancel()
        for conn in list(self.connections):
            await conn.shut()
        await self.topics.close()
        for tc in self.coordinators.values():
            await tc.close()
        await self.metrics.close()
        await self.subscriptions.close()
        await self.store.close()

    # -- transactions ------------------------------------------------------------

    def coordinator(self, txnid: TxnID) -> TransactionCoordinator:
        """The coordinator that owns ``txnid`` (its TCID), if it runs here."""
        tc = self.coordinators.get(txnid.tcid)
        if tc is None and self.cluster is not None:
            raise self.cluster.coordinator_not_here(txnid.tcid)
        if tc is None:
            raise TxnNotFoundError(
                f"transaction {txnid} belongs to coordinator {txnid.tcid}, which does not run "
                f"here (coordinators: {sorted(self.coordinators)})"
            )
        return tc

    def transactional_coordinator(self, transactional_id: str) -> TransactionCoordinator:
        """The coordinator of a transactional id (the producer-epoch mode's
        INIT_PRODUCER_ID): a stable hash over this broker's coordinators
        (`tc.coordinator_of`); in a cluster, the one of the id's slot, whose
        owner alone may answer (else `refusals.NotOwner`, naming it)."""
        if self.cluster is None:
            return self.coordinators[coordinator_of(transactional_id, list(self.coordinators))]
        tcid = slot_of_key(transactional_id, self.store.slot_count)
        tc = self.coordinators.get(tcid)
        if tc is None:
            raise self.cluster.coordinator_not_here(tcid)
        return tc

    def producer_coordinator(self, producer_id: int) -> TransactionCoordinator:
        """The coordinator that issued ``producer_id`` (the producer-epoch
        mode: its requests go there), if it runs here."""
        tcid = coordinator_of_producer(producer_id)
        tc = self.coordinators.get(tcid)
        if tc is None and self.cluster is not None:
            raise self.cluster.coordinator_not_here(tcid)
        if tc is None:
            raise refusals.InvalidProducerIdMapping(
                f"producer id {producer_id} belongs to coordinator {tcid}, which does not run here",
            )
        return tc

    def publish_txn(
        self,
        partition: Partition,
        txn: TxnID,
        producer: str,
        messages: Sequence[pb.SingleMessage],
        encoded: bytes | None = None,
        early: bool = False,
        first_seq: int | None = None,
        epoch_producer: tuple[int, int] | None = None,
    ) -> Awaitable[PublishResult]:
        """Queue a transactional send to ``partition``'s transaction buffer.

        Sends are queued in call order even while the buffer (and its sidecar
        ledger) is being created by the first of them. ``early`` and
        ``epoch_producer``: see `TransactionBuffer.publish` (``early`` not
        for a send that creates the buffer).
        """
        buffer = partition.transaction_buffer
        if buffer is not None and partition not in self._awaiting_buffer:
            return buffer.publish(
                txn, producer, messages, encoded, early, first_seq, epoch_producer
            )
        fut: asyncio.Future[Awaitable[PublishResult]] = asyncio.get_running_loop().create_future()
        waiting = self._awaiting_buffer.setdefault(partition, [])
        waiting.append(_TxnSend(txn, producer, messages, first_seq, fut, epoch_producer))
        if len(waiting) == 1:
            asyncio.get_running_loop().create_task(self._create_buffer(partition))
        return _published(fut)

    async def _create_buffer(self, partition: Partition) -> None:
        try:
            buffer = await partition.txn_buffer()
        except Exception as exc:
            for job in self._awaiting_buffer.pop(partition):
                job.future.set_exception(exc)
            return
        for job in self._awaiting_buffer.pop(partition):
            try:
                job.future.set_result(
                    buffer.publish(
                        job.txn,
                        job.producer,
                        job.messages,
                        first_seq=job.first_seq,
                        epoch_producer=job.epoch_producer,
                    )
                )
            except Exception as exc:
                job.future.set_exception(exc)

    # -- the coordinators' participant (`tc.Participant`) ----------------------------

    def end_txn_on_partition(
        self, topic: str, partition: int, end: TxnEnd
    ) -> Awaitable[None] | None:
        """`tc.Participant`: commit (marker) or abort the transaction on a
        partition, as ``end`` (from its coordinator) says: queued at once
        where its transaction buffer exists and no other END of it is under
        way there, else once it can be."""
        faults.refuse("broker.end_txn_on_participant")
        cluster = self.cluster
        if cluster is not None and not cluster.serves(topic):
            raise ParticipantElsewhere(
                f"partition {topic}/{partition}",
                functools.partial(cluster.peers.end_on_partition, topic, partition, end),
            )
        if not self._has_partition(topic, partition, end.txnid):
            return None
        found = self.topics.get(topic)
        if found is None:  # (not loaded: it is, then the end is queued)
            return self._end_on_partition(topic, partition, end, True)
        buffer = found.partitions[partition].transaction_buffer
        if buffer is not None and buffer.end_early(end.txnid, end.commit, end.producer):
            return None
        return self._end_on_partition(topic, partition, end, True)

    def end_txn_on_subscription(
        self, topic: str, subscription: str, end: TxnEnd
    ) -> Awaitable[None] | None:
        """`tc.Participant`: commit or abort the transaction's pending acks,
        as ``end`` says, queued at once (once the topic is loaded, if it is
        not)."""
        faults.refuse("broker.end_txn_on_participant")
        cluster = self.cluster
        if cluster is not None and not cluster.serves(topic):
            raise ParticipantElsewhere(
                f"subscription {topic}/{subscription}",
                functools.partial(cluster.peers.end_on_subscription, topic, subscription, end),
            )
        if self.topics.get(topic) is None and topic in self.topics:
            return self._end_on_subscription(topic, subscription, end, True)
        self.subscriptions.end_txn_early(topic, subscription, end.txnid, end.commit)
        return None

    def _has_partition(self, topic: str, partition: int, txnid: TxnID) -> bool:
        if self.cluster is not None:  # (elsewhere: the coordinator tries again, never "done")
            self.cluster.gate(topic)
        count = self.topics.partition_count(topic)
        if count is None or partition >= count:
            log.warning("end %s on %s/%d: no such partition", txnid, topic, partition)
            return False
        return True

    async def _end_on_partition(self, topic: str, partition: int, end: TxnEnd, early: bool) -> None:
        found = await self.topics.load_topic(topic)  # (loaded, and prepared, first)
        if found is None or partition >= len(found.partitions):
            log.warning("end %s on %s/%d: no such partition", end.txnid, topic, partition)
            return
        buffer = await found.partitions[partition].txn_buffer()
        await buffer.end(end.txnid, end.commit, early, end.producer)

    async def _end_on_subscription(
        self, topic: str, subscription: str, end: TxnEnd, early: bool
    ) -> None:
        await self.topics.load_topic(topic)  # (loaded, and prepared, first)
        await self.subscriptions.end_txn(topic, subscription, end.txnid, end.commit, early)

    async def end_locally_on_partition(self, topic: str, partition: int, end: TxnEnd) -> None:
        """``end`` applied here, durably (a participant whose slot came to
        this broker while its coordinator's tell was under way)."""
        if self._has_partition(topic, partition, end.txnid):
            await self._end_on_partition(topic, partition, end, False)

    async def end_locally_on_subscription(self, topic: str, subscription: str, end: TxnEnd) -> None:
        """As `end_locally_on_partition`, on a subscription."""
        if self.cluster is not None:
            self.cluster.gate(topic)
        await self._end_on_subscription(topic, subscription, end, False)

    def remote_coordinator(self, txnid: TxnID) -> bool:
        """True if ``txnid``'s coordinator is on another broker of the
        cluster (its sends and acks here are checked with it first, and
        answered once durable: docs/cluster.md)."""
        return self.cluster is not None and txnid.tcid not in self.coordinators

    # -- END_TXN_ON_PARTITION / _SUBSCRIPTION from the wire -------------------------------

    def decided_end(self, txnid: TxnID, commit: bool) -> TxnEnd:
        """What a participant would be told of ``txnid``, for an END read
        off the wire (anyone with the cluster role could send one): raise
        (nothing changes) unless ``txnid``'s coordinator runs here and has
        decided to commit (``commit``) or to abort it."""
        tc = self.coordinators.get(txnid.tcid)
        if tc is None and self.cluster is not None:
            raise self.cluster.coordinator_not_here(txnid.tcid)
        if tc is None:
            raise refusals.NotAllowed(
                f"transaction {txnid} belongs to coordinator {txnid.tcid}, which does not run "
                "here: its decision cannot be checked, so nothing was changed",
            )
        end = tc.decision(txnid)
        if end is None or end.commit != commit:
            meta = tc.get(txnid)
            state = "unknown" if meta is None else meta.status.name
            raise refusals.InvalidTxnStatus(
                f"cannot {'commit' if commit else 'abort'} transaction {txnid} on a participant: "
                f"its coordinator {txnid.tcid} did not decide so (it is {state} there); "
                "nothing was changed",
            )
        return end

    async def _told_end(
        self,
        txnid: TxnID,
        commit: bool,
        told: pb.CommandEndTxnOnPartition | pb.CommandEndTxnOnSubscription | None,
    ) -> TxnEnd:
        """The decision an END off the wire carries: checked with the
        coordinator if it runs here (`decided_end`); in a cluster, when it
        runs on another broker, taken as the END says if it comes at the
        coordinator slot's epoch of the cluster tables (not an older one: a
        broker that lost the slot; not a newer one: made up), else refused,
        nothing changed (`ClusterGate.fence_coordinator`)."""
        cluster = self.cluster
        if cluster is None or told is None or txnid.tcid in self.coordinators:
            return self.decided_end(txnid, commit)
        await cluster.fence_coordinator(txnid.tcid, told.coordinator_slot_epoch, str(txnid))
        producer = (told.producer_id, told.producer_epoch) if told.HasField("producer_id") else None
        return TxnEnd(txnid, commit, producer, told.coordinator_epoch)

    async def end_txn_on_partition_durably(
        self,
        topic: str,
        partition: int,
        txnid: TxnID,
        commit: bool,
        told: pb.CommandEndTxnOnPartition | None = None,
    ) -> None:
        """END_TXN_ON_PARTITION from the wire: checked (`_told_end`), then
        applied as `end_txn_on_partition`, returning once what it wrote is
        durable (a repeat of an END applied already is answered done)."""
        end = await self._told_end(txnid, commit, told)
        if self._has_partition(topic, partition, txnid):
            await self._end_on_partition(topic, partition, end, False)
        if self.cluster is not None:
            self.cluster.peers.forget(txnid, f"{topic}/{partition}")

    async def end_txn_on_subscription_durably(
        self,
        topic: str,
        subscription: str,
        txnid: TxnID,
        commit: bool,
        told: pb.CommandEndTxnOnSubscription | None = None,
    ) -> None:
        """END_TXN_ON_SUBSCRIPTION from the wire: checked (`_told_end`),
        then applied, returning once what it wrote is durable."""
        end = await self._told_end(txnid, commit, told)
        if self.cluster is not None:
            self.cluster.gate(topic)
        await self._end_on_subscription(topic, subscription, end, False)
        if self.cluster is not None:
            self.cluster.peers.forget(txnid, f"{topic}/{subscription}")

    def reset_connections_state(self) -> None:
        """Forget the producers of the connections (all closed: a cluster
        broker that starts again from its store)."""
        self._producer_owners.clear()
        self._producers_of.clear()
        self._awaiting_buffer.clear()

    def producer_count(self, topic: str) -> int:
        return self._producers_of.get(topic, 0)

    def producer_counts(self) -> dict[str, int]:
        """Topic -> its connected producers, for the topics that have some."""
        return dict(self._producers_of)

    def claim_producer(self, topic: str, name: str, conn: Client) -> None:
        """Producer names are unique per topic among connected producers."""
        owner = self._producer_owners.get((topic, name))
        if owner is not None and owner is not conn:
            raise refusals.ProducerBusy(
                f"producer {name!r} is already connected to topic {topic!r}"
            )
        if owner is None:
            self._producers_of[topic] = self._producers_of.get(topic, 0) + 1
        self._producer_owners[(topic, name)] = conn

    def release_producer(self, topic: str, name: str, conn: Client) -> None:
        if self._producer_owners.get((topic, name)) is conn:
            del self._producer_owners[(topic, name)]
            left = self._producers_of[topic] - 1
            if left:
                self._producers_of[topic] = left
            else:
                del self._producers_of[topic]


class PeerRequests(Protocol):
    """What a cluster broker asks of the others (`broker._peers.Peers`)."""

    async def end_on_partition(self, topic: str, partition: int, end: TxnEnd) -> None: ...

    async def end_on_subscription(self, topic: str, subscription: str, end: TxnEnd) -> None: ...

    async def register(
        self, txnid: TxnID, topic: str, partition: int | None = None, subscription: str = ""
    ) -> None: ...

    async def register_producer(
        self,
        producer: tuple[int, int],
        topic: str,
        partition: int | None = None,
        subscription: str = "",
        verify_only: bool = False,
        keep: bool = True,
    ) -> tuple[TxnID, str]: ...

    def forget(self, txnid: TxnID, participant: str) -> None: ...

    async def topic_owner(self, topic: str) -> str: ...

    async def group_cursors(
        self, url: str, fill: Callable[[pb.CommandGroupCursors], None], what: str
    ) -> pb.CommandGroupCursorsResponse: ...


class ClusterGate(Protocol):
    """What a cluster broker's host (`broker._cluster.ClusterHost`) answers
    for the slots it does not serve."""

    def gate(self, topic: str) -> None:
        """Raise `refusals.NotOwner` unless ``topic``'s slot is served here."""
        ...

    def coordinator_not_here(self, tcid: int) -> refusals.Refusal:
        """The refusal of a command for coordinator ``tcid``, not served here."""
        ...

    async def topic_owner(self, topic: str) -> str:
        """LOOKUP: "" if ``topic``'s slot is served here, else the URL of
        its owner; `refusals.NotOwner` while no live broker owns it."""
        ...

    async def coordinator_owner(self, tcid: int) -> str:
        """LOOKUP of coordinator ``tcid``: as `topic_owner`, for its slot."""
        ...

    @property
    def peers(self) -> PeerRequests:
        """The requests to the other brokers (`broker._peers.Peers`)."""
        ...

    def serves(self, topic: str) -> bool:
        """True if ``topic``'s slot is served here."""
        ...

    async def fence_coordinator(self, tcid: int, epoch: int, what: str) -> None:
        """Refuse (nothing changes) an END told by coordinator ``tcid`` at
        its slot epoch ``epoch`` unless that is the slot's epoch now."""
        ...


def broker_id(url: str) -> str:
    """The name a broker writes to its store as (and joins a cluster as):
    its URL and process id, unique among the brokers of a database."""
    return f"{url or 'broker'} pid {os.getpid()}"


async def open_cluster_store(url: str, owner: str) -> LedgerStore:
    """The broker's store in the PostgreSQL database ``url``, as ``owner``,
    holding every slot of the database: each slot's epoch goes up, so a
    broker that held them before is fenced from its next write on (it
    stops: `broker.cli`). Ownership shared between brokers is not built
    yet: the last broker started on a database is the one that serves it.
    Each ledger's slot: `broker._slots`."""
    store = await LedgerStore.open(url, owner=owner, slot_of=slot_of)
    try:
        epochs = await store.take_slots(range(store.slot_count))
    except BaseException:
        await store.close()
        raise
    log.info(
        "took all %d slots of %s as %r (epochs %d..%d)",
        len(epochs),
        store.location,
        owner,
        min(epochs.values(), default=0),
        max(epochs.values(), default=0),
    )
    return store


@dataclass(slots=True)
class _TxnSend:
    txn: TxnID
    producer: str
    messages: Sequence[pb.SingleMessage]
    first_seq: int | None
    future: asyncio.Future[Awaitable[PublishResult]]
    epoch_producer: tuple[int, int] | None


async def _published(fut: asyncio.Future[Awaitable[PublishResult]]) -> PublishResult:
    return await (await fut)
