"""The record of the counters' totals (`broker._metrics`), in process on a
real store: written when a total changed and only then, and what it holds
comes back after a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker import Broker
from proto import txnbuf_pb2 as pb
from subscriptions import Consumer, SubType
from tests.conftest import until


async def _publish(broker: Broker, topic: str, seq: int) -> None:
    found = await broker.topics.get_or_create(topic)
    message = pb.SingleMessage(sequence_id=seq, payload=b"m")
    await found.partitions[0].publish("p", [message])


async def _read(broker: Broker, topic: str, sub: str, messages: int) -> None:
    """Subscribe ``sub`` (earliest), take ``messages`` deliveries, leave."""
    pushed: list[pb.DeliveredEntry] = []
    consumer = Consumer(1, "c", topic, sub, SubType.EXCLUSIVE, push=lambda c, e: pushed.extend(e))
    found = await broker.topics.get_or_create(topic)
    await broker.subscriptions.subscribe(found, sub, consumer, True)
    consumer.add_permits(10)
    await until(lambda: len(pushed) >= messages, f"{messages} deliveries")
    assert len(pushed) == messages
    broker.subscriptions.detach(consumer)
    await asyncio.sleep(0)  # (its dispatch task ends)


def _records(broker: Broker) -> int:
    ledger = broker.metrics._ledger
    assert ledger is not None
    return ledger.next_entry_id


async def test_a_record_is_written_when_a_total_changed_and_only_then(tmp_path: Path) -> None:
    broker = await Broker.open(tmp_path, preload=False, unload_after=None)
    try:
        await _publish(broker, "t", 0)
        await broker.metrics.write_totals()
        written = _records(broker)
        await broker.metrics.write_totals()
        assert _records(broker) == written  # nothing changed
        await _publish(broker, "t", 1)
        await broker.metrics.write_totals()
        assert _records(broker) == written + 1
        # A topic that unloads moves its counts to the base: the totals stay.
        broker.unload_after = 0.0
        assert broker._unload_idle() == 1
        await broker.metrics.write_totals()
        assert _records(broker) == written + 1
        assert broker.metrics.totals()["txnbuf_messages_in"]["t\t0"] == 2
    finally:
        await broker.close()
    broker = await Broker.open(tmp_path, preload=False, unload_after=None)
    try:
        assert broker.metrics.totals()["txnbuf_messages_in"]["t\t0"] == 2
    finally:
        await broker.close()


async def test_a_removed_subscription_is_a_change_even_when_the_sums_stay(
    tmp_path: Path,
) -> None:
    broker = await Broker.open(tmp_path, preload=False, unload_after=None)
    try:
        await _publish(broker, "t", 0)
        await _read(broker, "t", "a", 1)
        topic = await broker.topics.get_or_create("t")
        await broker.subscriptions.ensure(topic, "b", True)  # (no consumer: nothing out)
        await broker.metrics.write_totals()
        assert broker.metrics.totals()["txnbuf_messages_out"] == {"t\ta": 1, "t\tb": 0}
        written = _records(broker)
        # "a" goes and comes back (counting from 0) while "b" reads the
        # message: as many series as before, with the same sum.
        assert await broker.subscriptions.remove("t", "a")
        await broker.subscriptions.ensure(topic, "a", True)
        await _read(broker, "t", "b", 1)
        await broker.metrics.write_totals()
        assert _records(broker) == written + 1
    finally:
        await broker.close()
    broker = await Broker.open(tmp_path, preload=False, unload_after=None)
    try:
        assert broker.metrics.totals()["txnbuf_messages_out"] == {"t\ta": 0, "t\tb": 1}
    finally:
        await broker.close()
