"""End to end: the real broker as a subprocess, driven through the client.

Each test gets its own broker process (fixture `broker` in conftest.py),
data directory and port; crash tests SIGKILL it and start it again on the
same data.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest

from client import Client, Consumer, Message, errors
from proto import txnbuf_pb2 as pb
from tests.conftest import BrokerProcess, RawConnection, both_stores, send_command

T = pb.BaseCommand

pytestmark = pytest.mark.integration


async def receive_all(consumer: Consumer, n: int, timeout: float = 15.0) -> list[Message]:
    out = []
    for _ in range(n):
        out.append(await consumer.receive(timeout=timeout))
    return out


async def assert_nothing_more(consumer: Consumer, wait: float = 0.5) -> None:
    with pytest.raises(errors.OperationTimeoutError):
        msg = await consumer.receive(timeout=wait)
        pytest.fail(f"unexpected message {msg.value!r} {msg.message_id}")


def stats(broker: BrokerProcess, topic: str) -> dict:  # type: ignore[type-arg]
    status, body = broker.admin("GET", f"/admin/v1/topics/{topic}/stats")
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def stored_stats(broker: BrokerProcess, topic: str) -> dict:  # type: ignore[type-arg]
    """`stats` without the process's own figures (``messages_in``: stored
    by this broker process since the topic loaded, for rates)."""
    figures = stats(broker, topic)
    for partition in figures["partitions"]:
        partition.pop("messages_in")
    return figures


@both_stores
async def test_everything_sent_to_three_partitions_is_delivered(broker: BrokerProcess) -> None:
    status, body = broker.admin("PUT", "/admin/v1/topics/orders", b'{"partitions": 3}')
    assert (status, json.loads(body)) == (200, {"topic": "orders", "partitions": 3})
    async with Client(broker.url) as client:
        consumer = await client.subscribe("orders", "all", initial_position="earliest")
        producer = await client.create_producer("orders")
        sent = [f"m{i}".encode() for i in range(3000)]
        ids = await asyncio.gather(
            *(producer.send(v, key=f"k{i % 50}") for i, v in enumerate(sent))
        )
        assert len(set(ids)) == 3000
        assert {m.partition for m in ids} == {0, 1, 2}
        got = await receive_all(consumer, 3000)
        assert Counter(m.value for m in got) == Counter(sent)
        assert {m.message_id for m in got} == set(ids)
        # Per key, order is kept (one key -> one partition).
        by_key: dict[str | None, list[int]] = {}
        for m in got:
            by_key.setdefault(m.key, []).append(int(m.value[1:]))
        assert all(v == sorted(v) for v in by_key.values())
        await asyncio.gather(*(consumer.acknowledge(m) for m in got))
        await assert_nothing_more(consumer)
    s = stats(broker, "orders")
    assert [p["subscriptions"]["all"]["backlog"] for p in s["partitions"]] == [0, 0, 0]
    assert sum(p["messages"] for p in s["partitions"]) == 3000


@both_stores
async def test_acked_never_redelivered_unacked_redelivered_after_sigkill(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("crash", "s", initial_position="earliest")
        producer = await client.create_producer("crash")
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(200)))
        got = await receive_all(consumer, 200)
        acked = {m.value for m in got[::2]}  # ack every other one
        await asyncio.gather(*(consumer.acknowledge(m) for m in got[::2]))
    broker.kill()
    broker.start()
    async with Client(broker.url) as client:
        consumer = await client.subscribe("crash", "s", initial_position="earliest")
        again = await receive_all(consumer, 100)
        assert {m.value for m in again} == {m.value for m in got[1::2]}
        assert not acked & {m.value for m in again}
        await assert_nothing_more(consumer)


@both_stores
async def test_duplicate_sequence_ids_not_stored_twice_across_restart(
    broker: BrokerProcess,
) -> None:
    # Through the client: a named producer's numbering continues after a restart.
    async with Client(broker.url) as client:
        producer = await client.create_producer("dedup", producer_name="writer-1")
        first = [await producer.send(b"v%d" % i, sequence_id=i) for i in range(10)]
    broker.kill()
    broker.start()
    async with Client(broker.url) as client:
        producer = await client.create_producer("dedup", producer_name="writer-1")
        assert producer.last_sequence_id == 9
        # Re-sent: answered with its original id, not stored again.
        assert await producer.send(b"v0", sequence_id=0) == first[0]
        with pytest.raises(ValueError):
            await producer.send(b"v0", sequence_id=0)  # not above what this producer sent
    # On the wire: the same SEND re-sent after the restart is answered with the
    # original ids and stores nothing.
    entries = stats(broker, "dedup")["partitions"][0]["entries"]
    async with RawConnection(broker.url) as raw:
        await raw.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(
                request_id=1, producer_id=1, topic="dedup", producer_name="writer-1"
            ),
        )
        msgs = [pb.SingleMessage(payload=b"v%d" % i, sequence_id=i) for i in range(8, 12)]
        receipt = await raw.request(
            T.SEND, "send", send_command(*msgs, producer_id=1, request_id=2, partition=0)
        )
    ids = [(m.entry_id, m.batch_index) for m in receipt.send_receipt.message_ids]
    assert ids[:2] == [(m.entry_id, m.batch_index) for m in first[8:10]]
    assert ids[2:] == [(entries, 0), (entries, 1)]  # 10 and 11 are new: one new entry
    assert stats(broker, "dedup")["partitions"][0]["entries"] == entries + 1
    async with Client(broker.url) as client:
        consumer = await client.subscribe("dedup", "s", initial_position="earliest")
        got = await receive_all(consumer, 12)
        await assert_nothing_more(consumer)
        assert [m.value for m in got] == [b"v%d" % i for i in range(12)]


async def test_shared_subscription_spreads_over_two_consumers(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        c1 = await client.subscribe(
            "work", "pool", subscription_type="shared", receiver_queue_size=10
        )
        c2 = await client.subscribe(
            "work", "pool", subscription_type="shared", receiver_queue_size=10
        )
        producer = await client.create_producer("work")
        for i in range(200):  # one send per entry, so entries alternate consumers
            await producer.send(b"%d" % i)
        seen: dict[int, list[bytes]] = {1: [], 2: []}

        async def drain(consumer: Consumer, who: int) -> None:
            while True:
                try:
                    m = await consumer.receive(timeout=1.0)
                except errors.OperationTimeoutError:
                    return
                seen[who].append(m.value)
                await consumer.acknowledge(m)

        await asyncio.gather(drain(c1, 1), drain(c2, 2))
        assert len(seen[1]) + len(seen[2]) == 200
        assert set(seen[1]) | set(seen[2]) == {b"%d" % i for i in range(200)}
        assert len(seen[1]) >= 40 and len(seen[2]) >= 40
        with pytest.raises(errors.NotAllowedError):
            await c1.acknowledge_cumulative(await _one_more(producer, c1, c2))


async def _one_more(producer, c1: Consumer, c2: Consumer) -> Message:  # type: ignore[no-untyped-def]
    await producer.send(b"extra")
    done, pending = await asyncio.wait(
        [asyncio.ensure_future(c.receive(timeout=5)) for c in (c1, c2)],
        return_when=asyncio.FIRST_COMPLETED,
    )
    for p in pending:
        p.cancel()
    return next(iter(done)).result()  # type: ignore[no-any-return]


async def test_cumulative_ack(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("cumul", "s", initial_position="earliest")
        producer = await client.create_producer("cumul")
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(50)))
        got = await receive_all(consumer, 50)
        await consumer.acknowledge_cumulative(got[29])
        s = stats(broker, "cumul")["partitions"][0]["subscriptions"]["s"]
        assert s["backlog"] == 20
    async with Client(broker.url) as client:
        consumer = await client.subscribe("cumul", "s", initial_position="earliest")
        again = await receive_all(consumer, 20)
        assert [m.value for m in again] == [b"%d" % i for i in range(30, 50)]
        await assert_nothing_more(consumer)


async def test_negative_ack_redelivers(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("nack", "s", initial_position="earliest")
        producer = await client.create_producer("nack")
        await producer.send(b"a")
        await producer.send(b"b")
        a = await consumer.receive(timeout=5)
        b = await consumer.receive(timeout=5)
        assert (a.value, b.value) == (b"a", b"b")
        await consumer.acknowledge(b)
        await consumer.negative_acknowledge(a)
        again = await consumer.receive(timeout=5)
        assert again.value == b"a"
        assert again.message_id == a.message_id
        assert again.redelivery_count == 1
        await consumer.acknowledge(again)
        await assert_nothing_more(consumer)


async def test_closing_a_consumer_redelivers_its_unacked_messages(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        c1 = await client.subscribe("handover", "s", subscription_type="failover")
        c2 = await client.subscribe("handover", "s", subscription_type="failover")
        producer = await client.create_producer("handover")
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(10)))
        active, standby = (c1, c2) if c1.is_active else (c2, c1)
        got = await receive_all(active, 10)
        await active.acknowledge(got[0])
        await active.close()
        again = await receive_all(standby, 9)
        assert [m.value for m in again] == [b"%d" % i for i in range(1, 10)]


async def test_exclusive_subscription_refuses_a_second_consumer(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        await client.subscribe("excl", "s")
        with pytest.raises(errors.ConsumerBusyError):
            await client.subscribe("excl", "s")
        with pytest.raises(errors.SubscriptionTypeMismatchError):
            await client.subscribe("excl", "s", subscription_type="shared")
        # The connection is still fine.
        other = await client.subscribe("excl", "other")
        producer = await client.create_producer("excl")
        await producer.send(b"x")
        assert (await other.receive(timeout=5)).value == b"x"


async def test_producer_and_consumer_survive_a_broker_restart(broker: BrokerProcess) -> None:
    async with Client(broker.url, operation_timeout=60.0) as client:
        consumer = await client.subscribe("survive", "s", initial_position="earliest")
        producer = await client.create_producer("survive")
        await producer.send(b"before")
        assert (await consumer.receive(timeout=5)).value == b"before"
        sends = [asyncio.ensure_future(producer.send(b"%d" % i)) for i in range(500)]
        await asyncio.sleep(0)
        await asyncio.to_thread(broker.restart)
        ids = await asyncio.gather(*sends)
        assert len(set(ids)) == 500
        values: list[bytes] = []
        while True:
            try:
                m = await consumer.receive(timeout=3)
            except errors.OperationTimeoutError:
                break
            values.append(m.value)
            await consumer.acknowledge(m)
        # At-least-once delivery around the restart, but nothing stored twice:
        assert set(values) >= {b"%d" % i for i in range(500)}
    s = stats(broker, "survive")
    assert s["partitions"][0]["messages"] == 501


async def test_sigterm_stops_cleanly(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("term")
        await producer.send(b"x")
    assert broker.stop() == 0
    assert "stopped" in broker.log()


async def test_ctrl_c_to_the_process_group_stops_cleanly(tmp_path: Path) -> None:
    """Ctrl-C in a terminal signals the broker's whole process group: the
    broker stops cleanly, writing what it queued."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.new_session = True
    broker.start()
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer("ctrl-c")
            await asyncio.gather(*(producer.send_nowait(b"%d" % i) for i in range(500)))
        assert broker.proc is not None
        os.killpg(broker.proc.pid, signal.SIGINT)
        assert broker.proc.wait(timeout=15) == 0
        log = broker.log()
        assert "stopped" in log
        assert "Traceback" not in log and "refuses writes" not in log, log
        broker.start()
        async with Client(broker.url) as client:
            consumer = await client.subscribe(
                "ctrl-c", "check", "exclusive", initial_position="earliest"
            )
            got = {(await consumer.receive(timeout=10)).value for _ in range(500)}
        assert got == {b"%d" % i for i in range(500)}
    finally:
        broker.stop()


def test_a_second_broker_on_the_same_data_is_refused(broker: BrokerProcess, tmp_path: Path) -> None:
    """One broker per data directory: its ledger writer holds broker.db.lock,
    and a second broker gives up after 10 s with a clear message."""
    second = BrokerProcess(broker.data_dir, tmp_path / "second.log")
    with pytest.raises(RuntimeError, match="exited with 1"):
        second.start(timeout=60)
    assert "is in use by another process" in second.log()
    assert "Traceback" not in second.log()
    assert broker.proc is not None and broker.proc.poll() is None  # the first one runs on


async def test_growing_a_topic_extends_its_subscriptions(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("grows", "s")
        status, _ = broker.admin("PUT", "/admin/v1/topics/grows", b'{"partitions": 3}')
        assert status == 200
        producer = await client.create_producer("grows")  # sees 3 partitions
        ids = await asyncio.gather(*(producer.send(b"%d" % i, key=f"k{i}") for i in range(60)))
        assert {m.partition for m in ids} == {0, 1, 2}
        got = await receive_all(consumer, 60)
        assert {m.message_id for m in got} == set(ids)
    s = stats(broker, "grows")
    assert [sorted(p["subscriptions"]) for p in s["partitions"]] == [["s"], ["s"], ["s"]]


@both_stores
async def test_a_restart_recovers_every_topic_and_subscription(broker: BrokerProcess) -> None:
    """300 topics whose names are prefixes of each other (t1, t10, t100),
    some with a second subscription whose name sorts around "/" ("s-x"),
    and 10 topics of 3 partitions: after a SIGKILL every topic comes back
    with its partitions, and every subscription with its cursor (the same
    stats; the acked message stays acked, the unacked one comes again)."""
    names = [f"t{i}" for i in range(300)]
    partitioned = [f"p{i}" for i in range(10)]
    limit = asyncio.Semaphore(32)

    async def set_up(client: Client, name: str) -> None:
        async with limit:
            consumer = await client.subscribe(name, "s", initial_position="earliest")
            if name.endswith("3"):
                await (await client.subscribe(name, "s-x", initial_position="earliest")).close()
            producer = await client.create_producer(name)
            await producer.send(b"acked")
            await producer.send(b"unacked")
            first, second = await receive_all(consumer, 2)
            assert (first.value, second.value) == (b"acked", b"unacked")
            await consumer.acknowledge(first)
            await asyncio.gather(producer.close(), consumer.close())

    for name in partitioned:
        assert broker.admin("PUT", f"/admin/v1/topics/{name}", b'{"partitions": 3}')[0] == 200
    async with Client(broker.url) as client:
        await asyncio.gather(*(set_up(client, name) for name in names))
        for name in partitioned:
            await (await client.subscribe(name, "s")).close()
    before = {name: stored_stats(broker, name) for name in names + partitioned}

    await asyncio.to_thread(broker.restart)
    status, body = broker.admin("GET", "/admin/v1/topics")
    assert status == 200, body
    listed = {t["name"]: t["partitions"] for t in json.loads(body)["topics"]}
    assert listed == {**{n: 1 for n in names}, **{n: 3 for n in partitioned}}
    after = {name: stored_stats(broker, name) for name in names + partitioned}
    assert after == before
    assert set(after["t13"]["partitions"][0]["subscriptions"]) == {"s", "s-x"}
    assert [set(p["subscriptions"]) for p in after["p1"]["partitions"]] == [{"s"}] * 3

    async def read_again(client: Client, name: str) -> bytes:
        async with limit:
            consumer = await client.subscribe(name, "s")
            message = await consumer.receive(timeout=15)
            await consumer.close()
            return message.value

    async with Client(broker.url) as client:
        again = await asyncio.gather(*(read_again(client, name) for name in names))
    assert again == [b"unacked"] * len(names)
