"""/metrics on the real broker: parsed with prometheus_client's own parser,
HELP and TYPE on every family, counters that move, and counters that go
on across a clean stop and a SIGKILL."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from client import Client
from ledger import Buckets
from tests.conftest import BrokerProcess

pytestmark = pytest.mark.integration

EXPECTED = {
    "txnbuf_messages_in": "counter",
    "txnbuf_bytes_in": "counter",
    "txnbuf_messages_out": "counter",
    "txnbuf_bytes_out": "counter",
    "txnbuf_redeliveries": "counter",
    "txnbuf_transactions_begun": "counter",
    "txnbuf_transactions_committed": "counter",
    "txnbuf_transactions_aborted": "counter",
    "txnbuf_transactions_timed_out": "counter",
    "txnbuf_participant_end_failures": "counter",
    "txnbuf_backlog_messages": "gauge",
    "txnbuf_unacked_messages": "gauge",
    "txnbuf_pending_ack_messages": "gauge",
    "txnbuf_transactions_open": "gauge",
    "txnbuf_transactions_spare": "gauge",
    "txnbuf_transaction_oldest_open_seconds": "gauge",
    "txnbuf_transactions_stuck": "gauge",
    "txnbuf_active_transaction_open_time_max_seconds": "gauge",
    "txnbuf_send_latency_seconds": "histogram",
    "txnbuf_commit_latency_seconds": "histogram",
    "txnbuf_ledger_group_commit_size": "histogram",
    "txnbuf_ledger_fsync_seconds": "histogram",
    "txnbuf_data_dir_bytes": "gauge",
    "txnbuf_topics": "gauge",
    "txnbuf_topics_loaded": "gauge",
}


def scrape(broker: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, keyed by (sample name, sorted labels); checks HELP and TYPE."""
    status, body = broker.admin("GET", "/metrics")
    assert status == 200
    text = body.decode()
    samples = {}
    types = {}
    for family in text_string_to_metric_families(text):
        assert family.documentation, f"{family.name} has no HELP"
        assert f"# TYPE {family.name}" in text or f"# TYPE {family.name}_total" in text
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    for name, kind in EXPECTED.items():
        assert types.get(name) == kind, (name, types.get(name))
    return samples


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


async def test_metrics_move_and_survive_restarts(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("m", "s", initial_position="earliest")
        producer = await client.create_producer("m")
        for _ in range(20):
            await producer.send(b"x" * 100)
        for _ in range(20):
            msg = await consumer.receive(timeout=10)
            await consumer.acknowledge(msg)
        async with client.transaction() as txn:
            await producer.send(b"t", txn=txn)
        msg = await consumer.receive(timeout=10)
        await consumer.negative_acknowledge(msg)
        again = await consumer.receive(timeout=10)
        await consumer.acknowledge(again)
        open_txn = await client.new_transaction(timeout=60)
        await producer.send(b"open", txn=open_txn)
        first = scrape(broker)
        assert value(first, "txnbuf_messages_in_total", topic="m", partition="0") == 21
        assert value(first, "txnbuf_bytes_in_total", topic="m", partition="0") > 2000
        assert value(first, "txnbuf_messages_out_total", topic="m", subscription="s") == 22
        assert value(first, "txnbuf_redeliveries_total", topic="m", subscription="s") == 1
        assert value(first, "txnbuf_transactions_committed_total", tc_id="0") == 1
        assert value(first, "txnbuf_transactions_begun_total", tc_id="0") >= 2
        assert value(first, "txnbuf_transactions_open", tc_id="0") >= 1
        assert value(first, "txnbuf_transaction_oldest_open_seconds", tc_id="0") > 0
        assert value(first, "txnbuf_send_latency_seconds_count") >= 20  # (plain SENDs)
        assert value(first, "txnbuf_commit_latency_seconds_count") >= 1
        assert value(first, "txnbuf_ledger_group_commit_size_count") > 0
        assert value(first, "txnbuf_ledger_fsync_seconds_sum") > 0
        assert value(first, "txnbuf_data_dir_bytes") > 0
        assert value(first, "txnbuf_backlog_messages", topic="m", subscription="s") == 0
        await open_txn.abort()

    # A SIGKILL right after the scrape: nothing it showed goes backwards.
    broker.restart()
    second = scrape(broker)
    for name in ("txnbuf_messages_in_total", "txnbuf_bytes_in_total"):
        assert value(second, name, topic="m", partition="0") >= value(
            first, name, topic="m", partition="0"
        )
    assert value(second, "txnbuf_messages_out_total", topic="m", subscription="s") == 22
    assert value(second, "txnbuf_transactions_committed_total", tc_id="0") == 1
    async with Client(broker.url) as client:
        producer = await client.create_producer("m")
        await producer.send(b"after")
    # A clean stop writes the totals: exact across it.
    broker.stop()
    broker.start()
    third = scrape(broker)
    assert value(third, "txnbuf_messages_in_total", topic="m", partition="0") == 22


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str) -> float:
    """The sum of every series of ``name``."""
    return sum(v for (n, _), v in samples.items() if n == name)


async def test_a_spare_is_not_counted_open(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transaction a client opened ahead and has not used (a spare) is
    not an open transaction: not in txnbuf_transactions_open, nor in the
    coordinators' OPEN count of the admin API (``spares`` instead)."""
    import json

    import client._spares

    monkeypatch.setattr(client._spares, "MAX_AGE", 120.0)  # (the spare waits for the scrape)
    async with Client(broker.url) as client:
        producer = await client.create_producer("sp")
        async with client.transaction(timeout=600) as txn:  # (its END opens a spare)
            await producer.send(b"x", txn=txn)
        samples = scrape(broker)
        assert total(samples, "txnbuf_transactions_open") == 0
        assert total(samples, "txnbuf_transactions_spare") == 1
        assert total(samples, "txnbuf_transaction_oldest_open_seconds") == 0
        _, body = broker.admin("GET", "/admin/v1/coordinators")
        coordinators = json.loads(body)["coordinators"]
        assert sum(c["transactions"]["OPEN"] for c in coordinators) == 0
        assert sum(c["spares"] for c in coordinators) == 1
        running = await client.new_transaction(timeout=60)
        await producer.send(b"y", txn=running)
        await producer.flush()
        assert total(scrape(broker), "txnbuf_transactions_open") == 1
        await running.abort()


def test_buckets_count_at_or_below_each_bound() -> None:
    b = Buckets([1, 2, 4])
    for v in (0.5, 1, 1.5, 4, 9):
        b.observe(v)
    assert b.cumulative() == [(1, 2), (2, 3), (4, 4), (float("inf"), 5)]
    assert (b.count, b.sum) == (5, 16.0)
    with pytest.raises(ValueError, match="increase"):
        Buckets([2, 1])
