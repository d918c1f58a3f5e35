"""The broker's Prometheus metrics (``GET /metrics``), with prometheus_client.

One `CollectorRegistry` per broker, holding one collector that reads the
live state when scraped: nothing is counted twice and no metric object has
to be kept in step with topics, subscriptions or coordinators coming and
going. The hot paths only add to plain numbers (a partition's
``messages_in``, a subscription's ``messages_out``, a coordinator's
``txns_committed``, the `ledger.Buckets` of send and commit latency); the
collector turns them into metric families.

Counters that survive restarts: messages and bytes in and out, redeliveries,
transactions begun / committed / aborted / timed out and failed participant
ends. The live objects count from 0 at each start; their totals are kept in
the ledger ``__meta/counters`` of the broker's store, one JSON record of
every such series, written every `SNAPSHOT_INTERVAL` seconds, when the broker
stops, and before a scrape is answered (only when something changed; the
record before it is trimmed). On start the last record is the base each
series adds to. So a scrape never shows a value that a later start could
show lower: after a crash a counter goes on from the last record written,
at least what any scrape showed (the counts between that record and the
crash are lost: it is an undercount, never a reset). A deleted topic's
series are dropped.

Topics load on first use (`broker._broker`): the counters of a topic not
loaded are its base, shown as they are; a topic that unloads adds what its
objects counted to the base first (`fold_topic`). The gauges of topics and
subscriptions (backlog, unacked, consumers) are the loaded topics' only: a
scrape loads nothing. ``txnbuf_topics`` counts every topic, loaded or not.

Not kept across restarts (process figures, as in any exporter): uptime,
connections, the ledger's commits and appends, and the histograms.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Iterable, Iterator, Sized
from pathlib import Path
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from buffer import Topic, Topics
from ledger import Buckets, Ledger, LedgerError, LedgerStore
from subscriptions import Subscriptions
from tc import TransactionCoordinator, TxnStatus

__all__ = ["LATENCY_BOUNDS", "BrokerMetrics", "Observed"]

log = logging.getLogger(__name__)

COUNTERS_LEDGER = "__meta/counters"
SNAPSHOT_INTERVAL = 10.0  # seconds between records of the counters' totals
# Upper bounds (seconds) of the buckets of the send and commit latency histograms.
LATENCY_BOUNDS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
_NOT_ENDED = (TxnStatus.OPEN, TxnStatus.PREPARED, TxnStatus.COMMITTING, TxnStatus.ABORTING)

# The counters kept across restarts: name -> (help, label names). Values are
# keyed by their label values joined with a tab (no name may hold one).
COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "txnbuf_messages_in": (
        "Messages stored in a partition (a transaction's messages when it commits)",
        ("topic", "partition"),
    ),
    "txnbuf_bytes_in": (
        "Bytes of the entries stored in a partition (a committed transaction's "
        "entry is its commit marker)",
        ("topic", "partition"),
    ),
    "txnbuf_messages_out": (
        "Messages delivered to the consumers of a subscription, redeliveries included",
        ("topic", "subscription"),
    ),
    "txnbuf_bytes_out": (
        "Bytes of the entries delivered to the consumers of a subscription",
        ("topic", "subscription"),
    ),
    "txnbuf_redeliveries": (
        "Messages delivered again (negatively acknowledged, left unacknowledged by a consumer "
        "that went, or released by an aborted transaction)",
        ("topic", "subscription"),
    ),
    "txnbuf_transactions_begun": ("Transactions opened on a coordinator", ("tc_id",)),
    "txnbuf_transactions_committed": ("Transactions a coordinator committed", ("tc_id",)),
    "txnbuf_transactions_aborted": (
        "Transactions a coordinator aborted (on request, timed out, or unused ones "
        "the client opened in advance and aborted)",
        ("tc_id",),
    ),
    "txnbuf_transactions_timed_out": (
        "Transactions a coordinator aborted because they passed their timeout",
        ("tc_id",),
    ),
    "txnbuf_participant_end_failures": (
        "Failed attempts to end a transaction on a partition or subscription",
        (),
    ),
}

Totals = dict[str, dict[str, float]]
# What tells a record's totals apart from others without a copy of them
# (`BrokerMetrics._fingerprint`).
Fingerprint = tuple[int, tuple[tuple[int, float], ...]]


def _count(value: object) -> float:
    """A stored counter value: an int when it is whole (a small one costs no
    object of its own, and sums of ints are exact), else a float."""
    number = float(value)  # type: ignore[arg-type]
    return int(number) if number.is_integer() else number


def _key(*values: object) -> str:
    return "\t".join(str(v) for v in values)


def _histogram(name: str, doc: str, buckets: Buckets) -> HistogramMetricFamily:
    return HistogramMetricFamily(
        name,
        doc,
        buckets=[
            ("+Inf" if bound == float("inf") else repr(float(bound)), count)
            for bound, count in buckets.cumulative()
        ],
        sum_value=buckets.sum,
    )


@runtime_checkable
class ClusterFigures(Protocol):
    """What a cluster broker's host (`broker._cluster.ClusterHost`) tells
    the metrics, when scraped."""

    def figures(self) -> dict[str, float | None]:
        """``slots_owned``, ``slots_loading``, ``loads``, ``unloads``,
        ``handovers``, ``failovers``, ``drops``, ``not_owner_refusals``, ``renewals`` and
        ``renewal_age`` (seconds; None before the first); the peers'
        ``peer_tells``, ``peer_checks`` and ``stale_end_refusals``; the
        nudges' ``nudges_sent``, ``nudge_failures`` and ``nudges_received``."""
        ...

    def labeled_figures(self) -> dict[str, dict[str, int]]:
        """The peers' figures by reason (`CLUSTER_LABELED`): key -> reason -> count."""
        ...


# The cluster's figures (`ClusterFigures`): key -> (name, help, counter or gauge).
CLUSTER_FIGURES: dict[str, tuple[str, str, bool]] = {
    "slots_owned": (
        "txnbuf_cluster_slots_owned",
        "Slots this broker holds (taken in the cluster tables), loaded or loading",
        False,
    ),
    "slots_loading": (
        "txnbuf_cluster_slots_loading",
        "Slots this broker took and is still loading (topics, coordinator recovery)",
        False,
    ),
    "loads": ("txnbuf_cluster_slot_loads", "Slots loaded by this broker since start", True),
    "unloads": (
        "txnbuf_cluster_slot_unloads",
        "Slots this broker handed over since start (to balance the cluster, or draining)",
        True,
    ),
    "handovers": (
        "txnbuf_cluster_slot_handovers",
        "Slots this broker handed over while draining on SIGTERM (part of the unloads)",
        True,
    ),
    "failovers": (
        "txnbuf_cluster_slot_failovers",
        "Slots this broker took over from a broker whose lease had run out",
        True,
    ),
    "drops": (
        "txnbuf_cluster_store_drops",
        "Times this broker dropped everything and started again from the store (a write "
        "fenced, a commit's outcome unknown, or its lease lost)",
        True,
    ),
    "not_owner_refusals": (
        "txnbuf_cluster_not_owner_refusals",
        "Commands and lookups refused NOT_OWNER (their slot is not served here)",
        True,
    ),
    "renewals": (
        "txnbuf_cluster_lease_renewals",
        "Joins and lease renewals the cluster database answered, since start",
        True,
    ),
    "renewal_age": (
        "txnbuf_cluster_lease_renewal_age_seconds",
        "Seconds since this broker's last lease renewal was answered (by its own clock)",
        False,
    ),
    "peer_tells": (
        "txnbuf_cluster_peer_tells",
        "Decisions this broker's coordinators told participants on other brokers, answered "
        "done (END_TXN_ON_PARTITION / _SUBSCRIPTION)",
        True,
    ),
    "peer_checks": (
        "txnbuf_cluster_peer_checks",
        "Checks this broker's participants asked of a coordinator on another broker before "
        "taking a transaction's first send or ack (ADD_*_TO_TXN from_participant)",
        True,
    ),
    "stale_end_refusals": (
        "txnbuf_cluster_stale_end_refusals",
        "ENDs from a coordinator on another broker refused here: their coordinator slot "
        "epoch is older than the cluster tables', or none (a broker that lost the slot)",
        True,
    ),
    "nudges_sent": (
        "txnbuf_cluster_nudges_sent",
        "Nudges this broker sent to the other live brokers (asking them to look at the "
        "cluster tables now) after it joined, released slots or left",
        True,
    ),
    "nudge_failures": (
        "txnbuf_cluster_nudge_failures",
        "Nudges sent that were not answered within their timeout (1 s) or were refused "
        "(part of the nudges sent; the other broker looks at its next interval instead)",
        True,
    ),
    "nudges_received": (
        "txnbuf_cluster_nudges_received",
        "Nudges from other brokers taken by this broker (each wakes its membership loop; "
        "several coalesce into one look)",
        True,
    ),
}

# The peers' figures by reason (`ClusterFigures.labeled_figures`): key ->
# (name, help); counters with the label ``reason``.
CLUSTER_LABELED: dict[str, tuple[str, str]] = {
    "peer_tell_retries": (
        "txnbuf_cluster_peer_tell_retries",
        "Tries of a tell to another broker not answered done and made again, by reason "
        "(not_owner, unreachable, timeout, service_not_ready)",
    ),
    "peer_tell_failures": (
        "txnbuf_cluster_peer_tell_failures",
        "Tells refused by the participant's broker (e.g. not_allowed), handed back to the "
        "coordinator, which lists the participant as stuck and tries again later, by reason",
    ),
    "peer_check_retries": (
        "txnbuf_cluster_peer_check_retries",
        "Tries of a check with a coordinator on another broker made again, by reason "
        "(not_owner, unreachable, timeout, moved_here)",
    ),
    "peer_check_refusals": (
        "txnbuf_cluster_peer_check_refusals",
        "Checks with a coordinator on another broker answered no (the transaction is not "
        "OPEN there: transaction_not_found, invalid_txn_status, ...) or not in time "
        "(no_answer); the send or ack is refused",
    ),
}


class Observed(Protocol):
    """What the metrics read of a broker (`broker._broker.Broker`), when scraped."""

    @property
    def topics(self) -> Topics: ...

    @property
    def subscriptions(self) -> Subscriptions: ...

    @property
    def coordinators(self) -> dict[int, TransactionCoordinator]: ...

    @property
    def connections(self) -> Sized: ...

    @property
    def store(self) -> LedgerStore: ...

    @property
    def data_dir(self) -> Path | None:
        """(None: the store is PostgreSQL, no data directory.)"""

    @property
    def started(self) -> float: ...

    def producer_counts(self) -> dict[str, int]: ...


class BrokerMetrics:
    """The metrics of one broker: open with `load`, then `start`; `close`
    writes the counters' totals one last time."""

    def __init__(self, broker: Observed) -> None:
        self.broker = broker
        # A SEND read -> its receipt queued; an END_TXN read -> answered.
        self.send_seconds = Buckets(LATENCY_BOUNDS)
        self.commit_seconds = Buckets(LATENCY_BOUNDS)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))
        self._base: Totals = {}  # the totals of the last record, as loaded at start
        # Which totals the last record holds (None: unknown, write the next).
        self._written: Fingerprint | None = None
        self._ledger: Ledger | None = None
        self._task: asyncio.Task[None] | None = None
        self._write_lock = asyncio.Lock()
        self._totals: Totals = {}  # computed for the scrape being rendered

    async def load(self, store: LedgerStore) -> None:
        """Read the last record of the counters' totals (the base to add to)."""
        ledger = self._ledger = await store.open_ledger(COUNTERS_LEDGER)
        ledger.no_tail_cache()  # (a record holds every series: read on start only)
        if ledger.last_entry_id < ledger.first_entry_id:
            return
        (entry,) = await ledger.read(ledger.last_entry_id, ledger.last_entry_id)
        try:
            record = json.loads(entry.data)
            self._base = {
                name: {str(k): _count(v) for k, v in series.items()}
                for name, series in record.items()
                if name in COUNTERS and isinstance(series, dict)
            }
        except (ValueError, TypeError, AttributeError) as exc:
            log.error("%s: unreadable counters record, counting from 0: %s", ledger.name, exc)
        self._written = self._fingerprint(self._base)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._snapshot_loop())

    async def close(self) -> None:
        """Stop the periodic record and write the totals as they are now."""
        if self._task is not None:
            self._task.cancel()
        try:
            await self.write_totals()
        except LedgerError as exc:
            log.warning("writing the counters' totals on close failed: %s", exc)

    def fold_topic(self, topic: Topic) -> None:
        """``topic`` unloads: add what its partitions and subscriptions
        counted to the base (its series go on from there when it loads again)."""
        live: Totals = {name: {} for name in COUNTERS}
        self._count_topic(topic, live)
        for name, series in live.items():  # (the totals stay what they are)
            base = self._base.setdefault(name, {})
            for key, value in series.items():
                if value:
                    base[key] = base.get(key, 0) + value

    def forget_topic(self, topic: str) -> None:
        """A deleted topic: its series go (from the base too, so that a topic
        created again under its name counts from 0)."""
        for series in self._base.values():
            for key in [k for k in series if k.split("\t", 1)[0] == topic]:
                del series[key]
        self._written = None  # (series went: the next write compares with nothing)

    async def _snapshot_loop(self) -> None:
        while True:
            await asyncio.sleep(SNAPSHOT_INTERVAL)
            try:
                await self.write_totals()
            except LedgerError as exc:
                log.warning("writing the counters' totals failed: %s", exc)

    # -- totals ---------------------------------------------------------------------

    def _live(self) -> Totals:
        """What the live objects counted since start."""
        live: Totals = {name: {} for name in COUNTERS}
        broker = self.broker
        for topic in broker.topics.all():
            self._count_topic(topic, live)
        failures = 0
        for tcid, tc in broker.coordinators.items():
            live["txnbuf_transactions_begun"][_key(tcid)] = tc.txns_begun
            live["txnbuf_transactions_committed"][_key(tcid)] = tc.txns_committed
            live["txnbuf_transactions_aborted"][_key(tcid)] = tc.txns_aborted
            live["txnbuf_transactions_timed_out"][_key(tcid)] = tc.txns_timed_out
            failures += tc.participant_failures
        live["txnbuf_participant_end_failures"][""] = failures
        return live

    def _count_topic(self, topic: Topic, live: Totals) -> None:
        for part in topic.partitions:
            live["txnbuf_messages_in"][_key(topic.name, part.index)] = part.messages_in
            live["txnbuf_bytes_in"][_key(topic.name, part.index)] = part.bytes_in
        for sub_name, subs in self.broker.subscriptions.of_topic(topic.name).items():
            key = _key(topic.name, sub_name)
            live["txnbuf_messages_out"][key] = sum(s.dispatch.messages_out for s in subs)
            live["txnbuf_bytes_out"][key] = sum(s.dispatch.bytes_out for s in subs)
            live["txnbuf_redeliveries"][key] = sum(s.dispatch.redelivered for s in subs)

    def totals(self) -> Totals:
        """Each counter: the base loaded at start plus what was counted since.
        A series of the base with nothing live (a topic deleted by another
        broker's run, a coordinator not run here now) is still shown."""
        out: Totals = {}
        live = self._live()
        for name in COUNTERS:
            series = dict(self._base.get(name, {}))
            for key, value in live[name].items():
                series[key] = series.get(key, 0) + value
            out[name] = series
        return out

    async def write_totals(self, totals: Totals | None = None) -> Totals:
        """Make ``totals`` (now's if None) the durable record, unless it
        holds them already; return them."""
        async with self._write_lock:
            if totals is None:
                totals = self.totals()
            ledger = self._ledger
            written = self._fingerprint(totals)
            if ledger is None or written == self._written:
                return totals
            first_new = ledger.next_entry_id
            await ledger.append(json.dumps(totals, separators=(",", ":")).encode(), meta=0)
            self._written = written
            ledger.trim(first_new)  # (the records before it; lazy: nobody waits)
            return totals

    def _fingerprint(self, totals: Totals) -> Fingerprint:
        """How many subscriptions were removed, and per counter how many
        series ``totals`` hold and their sum: equal for two totals only if
        they are equal, as long as neither predates a topic's deletion
        (`forget_topic` forgets the record's).

        (Kept instead of a copy of the totals, which would cost as much as
        the base again.) A series only appears or grows: counters count
        up, a topic that unloads moves its counts to the base
        (`fold_topic`: the totals stay), and a removed subscription's live
        series (which go, or drop to the base) is counted. So with as many
        series and the same sum, each series is as it was."""
        return (
            self.broker.subscriptions.removed,
            tuple((len(s), sum(s.values())) for s in (totals.get(n, {}) for n in COUNTERS)),
        )

    async def scrape(self) -> bytes:
        """The exposition text: the counters' totals are made durable first."""
        self._totals = await self.write_totals()
        try:
            return generate_latest(self.registry)
        finally:
            self._totals = {}

    # -- what the collector reads ---------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        totals = self._totals or self.totals()
        for name, (doc, labels) in COUNTERS.items():
            family = CounterMetricFamily(name, doc, labels=labels)
            for key, value in sorted(totals.get(name, {}).items()):
                family.add_metric(key.split("\t") if labels else [], value)
            yield family
        yield GaugeMetricFamily(
            "txnbuf_uptime_seconds",
            "Seconds since this broker process started",
            value=time.time() - broker.started,
        )
        yield GaugeMetricFamily(
            "txnbuf_connections", "Open client connections", value=len(broker.connections)
        )
        yield from self._subscription_gauges()
        yield from self._transaction_gauges()
        yield from self._cluster_figures()
        store = broker.store
        yield CounterMetricFamily(
            "txnbuf_ledger_commits",
            "Group commits of the broker's store since start (one fsync each)",
            value=store.commits,
        )
        yield CounterMetricFamily(
            "txnbuf_ledger_appends",
            "Entries appended to the broker's store since start",
            value=store.appends,
        )
        yield _histogram(
            "txnbuf_ledger_group_commit_size",
            "Entries written by one group commit",
            store.commit_sizes,
        )
        yield _histogram(
            "txnbuf_ledger_fsync_seconds",
            "Duration of one group commit in the store's writer: its inserts and "
            "trims and the COMMIT with its fsync (WAL, synchronous=FULL)",
            store.commit_seconds,
        )
        yield _histogram(
            "txnbuf_send_latency_seconds",
            "From a SEND read off the connection to its receipt queued to the client "
            "(a plain send once durable, a transactional one once in its transaction buffer)",
            self.send_seconds,
        )
        yield _histogram(
            "txnbuf_commit_latency_seconds",
            "From an END_TXN (commit or abort) read off the connection to its answer queued: "
            "the decision durable and applied by every participant",
            self.commit_seconds,
        )
        if broker.data_dir is not None:  # (none with a PostgreSQL store)
            yield GaugeMetricFamily(
                "txnbuf_data_dir_bytes",
                "Bytes of the files in the broker's data directory (database, WAL)",
                value=_dir_bytes(broker.data_dir),
            )

    def _subscription_gauges(self) -> Iterable[Metric]:
        broker = self.broker
        labels = ["topic", "subscription"]
        backlog = GaugeMetricFamily(
            "txnbuf_backlog_messages",
            "Messages of a subscription not acknowledged yet (PENDING and PENDING_ACK)",
            labels=labels,
        )
        unacked = GaugeMetricFamily(
            "txnbuf_unacked_messages",
            "Messages delivered to a subscription's consumers and not acknowledged yet",
            labels=labels,
        )
        pending_ack = GaugeMetricFamily(
            "txnbuf_pending_ack_messages",
            "Messages of a subscription acknowledged in a transaction not ended yet (PENDING_ACK)",
            labels=labels,
        )
        consumers = GaugeMetricFamily(
            "txnbuf_consumers", "Consumers attached to a subscription", labels=labels
        )
        producers = GaugeMetricFamily(
            "txnbuf_producers", "Producers connected to a topic", labels=["topic"]
        )
        for name, count in sorted(broker.producer_counts().items()):
            producers.add_metric([name], count)
        for name in sorted(t.name for t in broker.topics.all()):
            for sub, parts in broker.subscriptions.of_topic(name).items():
                backlog.add_metric([name, sub], sum(p.backlog() for p in parts))
                unacked.add_metric([name, sub], sum(len(p.pending) for p in parts))
                pending_ack.add_metric([name, sub], sum(len(p.cursor.pending_ack) for p in parts))
                consumers.add_metric([name, sub], len(parts[0].consumers) if parts else 0)
        topics = GaugeMetricFamily(
            "txnbuf_topics",
            "Topics of this broker, loaded in memory or not",
            value=len(broker.topics),
        )
        loaded = GaugeMetricFamily(
            "txnbuf_topics_loaded",
            "Topics loaded in memory (the others load on first use)",
            value=broker.topics.loaded_count(),
        )
        return [backlog, unacked, pending_ack, consumers, producers, topics, loaded]

    def _cluster_figures(self) -> Iterable[Metric]:
        """In a cluster only (`ClusterFigures`): the broker's slots and moves."""
        host = getattr(self.broker, "cluster", None)
        if not isinstance(host, ClusterFigures):
            return []
        out: list[Metric] = []
        for key, value in host.figures().items():
            if key not in CLUSTER_FIGURES or value is None:
                continue
            name, doc, counter = CLUSTER_FIGURES[key]
            family = CounterMetricFamily if counter else GaugeMetricFamily
            out.append(family(name, doc, value=value))
        labeled = host.labeled_figures()
        for key, (name, doc) in CLUSTER_LABELED.items():
            metric = CounterMetricFamily(name, doc, labels=["reason"])
            for reason, count in sorted(labeled.get(key, {}).items()):
                metric.add_metric([reason], count)
            out.append(metric)
        return out

    def _transaction_gauges(self) -> Iterable[Metric]:
        broker = self.broker
        now_ms = time.time_ns() // 1_000_000
        open_txns = GaugeMetricFamily(
            "txnbuf_transactions_open",
            "Transactions of a coordinator not ended yet (OPEN, PREPARED, COMMITTING, ABORTING), "
            "not counting the spares clients opened ahead and have not used",
            labels=["tc_id"],
        )
        oldest = GaugeMetricFamily(
            "txnbuf_transaction_oldest_open_seconds",
            "Age of a coordinator's oldest transaction not ended yet, spares not used left "
            "out (0 if none)",
            labels=["tc_id"],
        )
        spare = GaugeMetricFamily(
            "txnbuf_transactions_spare",
            "Transactions a client opened ahead on a coordinator (spares) not used yet",
            labels=["tc_id"],
        )
        for tcid, tc in sorted(broker.coordinators.items()):
            starts = []
            spares = 0
            for m in tc.transactions():
                if m.status not in _NOT_ENDED:
                    continue
                if tc.is_spare(m.txnid):
                    spares += 1
                else:
                    starts.append(m.start_ms)
            open_txns.add_metric([str(tcid)], len(starts))
            oldest.add_metric([str(tcid)], (now_ms - min(starts)) / 1000 if starts else 0.0)
            spare.add_metric([str(tcid)], spares)
        stuck = sum(len(tc.stuck()) for tc in broker.coordinators.values())
        open_max = max(
            (tc.active_open_time_max_ms() for tc in broker.coordinators.values()), default=0
        )
        return [
            open_txns,
            oldest,
            spare,
            GaugeMetricFamily(
                "txnbuf_transactions_stuck",
                "Decided transactions a participant has not applied yet after failing to "
                "(GET /admin/v1/transactions?state=STUCK)",
                value=stuck,
            ),
            GaugeMetricFamily(
                "txnbuf_active_transaction_open_time_max_seconds",
                "The longest a transaction not yet decided (open or prepared) has been open "
                "(KIP-939)",
                value=open_max / 1000,
            ),
        ]


class _Collector(Collector):
    def __init__(self, metrics: BrokerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics.collect()


def _dir_bytes(path: os.PathLike[str] | str) -> int:
    """Bytes of the regular files directly in ``path`` (a stat each: the
    data directory holds the database, its WAL and lock files)."""
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    continue
    except OSError:
        return 0
    return total
