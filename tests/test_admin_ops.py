"""The admin API's operations on the real broker: deleting topics and
subscriptions, resetting and skipping, retention, JSON errors, the
transaction list, and refusals that change nothing."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import pytest

from client import Client, Consumer, Message, errors
from tests.conftest import BrokerProcess, until

pytestmark = pytest.mark.integration


def call(
    broker: BrokerProcess, method: str, path: str, body: object | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    status, answer = broker.admin(method, path, data)
    return status, json.loads(answer)


def topic_names(broker: BrokerProcess) -> list[str]:
    return [t["name"] for t in call(broker, "GET", "/admin/v1/topics")[1]["topics"]]


def subscription(broker: BrokerProcess, topic: str, name: str) -> dict[str, Any]:
    status, body = call(broker, "GET", f"/admin/v1/topics/{topic}/subscriptions")
    assert status == 200, body
    (found,) = [s for s in body["subscriptions"] if s["name"] == name]
    return found  # type: ignore[no-any-return]


async def send_each(client: Client, topic: str, n: int, prefix: str = "m") -> None:
    """``n`` messages, one entry each (awaited one by one: no batching)."""
    producer = await client.create_producer(topic)
    for i in range(n):
        await producer.send(f"{prefix}{i}".encode())
    await producer.close()


async def take(consumer: Consumer, n: int, ack: bool = True) -> list[Message]:
    got = []
    for _ in range(n):
        msg = await consumer.receive(timeout=10)
        if ack:
            await consumer.acknowledge(msg)
        got.append(msg)
    return got


def first_entry(broker: BrokerProcess, topic: str) -> int:
    """The first entry not trimmed of ``topic``'s partition 0."""
    _, stats = call(broker, "GET", f"/admin/v1/topics/{topic}/stats")
    return int(stats["partitions"][0]["first_entry_id"])


async def retention_pass(client: Client, broker: BrokerProcess) -> None:
    """Return once a retention pass has run after this call began: a topic
    of its own (no retention: acknowledged entries go) gets 20 more entries,
    acknowledged, and is trimmed by a pass that started after them (a pass
    looks at every topic: one it trimmed saw every ack made before)."""
    witness = await client.subscribe("retention-witness", "w", initial_position="earliest")
    before = first_entry(broker, "retention-witness")
    await send_each(client, "retention-witness", 20, "w")
    await take(witness, 20)
    await witness.close()
    await until(lambda: first_entry(broker, "retention-witness") > before, "a retention pass")


async def through(consumer: Consumer, last: bytes) -> list[bytes]:
    """The values received up to and including ``last`` (each awaited as
    long as a hang allows: a busy broker may pause between deliveries)."""
    values: list[bytes] = []
    while not values or values[-1] != last:
        values.append((await consumer.receive(timeout=30)).value)
    return values


async def drain(consumer: Consumer, wait: float = 1.0) -> list[Message]:
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=wait))
        except errors.OperationTimeoutError:
            return got


# -- topics -------------------------------------------------------------------------


async def test_delete_topic_refused_while_in_use_then_deleted_with_everything(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("gone", "s", initial_position="earliest")
        producer = await client.create_producer("gone")
        for i in range(5):
            await producer.send(f"old{i}".encode())
        status, body = call(broker, "DELETE", "/admin/v1/topics/gone")
        assert status == 409
        assert "1 producer(s) connected" in body["error"]
        assert "1 consumer(s) connected" in body["error"]
        # Nothing changed: the topic, its data and its clients are all there.
        assert "gone" in topic_names(broker)
        assert [m.value for m in await take(consumer, 5)] == [f"old{i}".encode() for i in range(5)]
        await producer.send(b"still works")
        await take(consumer, 1)
        await producer.close()
        await consumer.close()
    status, body = call(broker, "DELETE", "/admin/v1/topics/gone")
    assert (status, body["deleted"], body["subscriptions"]) == (200, "gone", ["s"])
    assert "gone" not in topic_names(broker)
    assert call(broker, "GET", "/admin/v1/topics/gone/stats")[0] == 404
    assert call(broker, "DELETE", "/admin/v1/topics/gone")[0] == 404
    _, metrics = broker.admin("GET", "/metrics")
    assert b'topic="gone"' not in metrics
    broker.restart()  # (SIGKILL: the deletion was durable when it answered)
    assert "gone" not in topic_names(broker)
    # Created again under the same name, it is a new topic: none of the old data.
    async with Client(broker.url) as client:
        consumer = await client.subscribe("gone", "s", initial_position="earliest")
        await send_each(client, "gone", 1, "new")
        assert [m.value for m in await take(consumer, 1)] == [b"new0"]
        assert await drain(consumer, 0.5) == []
    broker.stop()  # (check-data reads a stopped broker's data: nothing left dangling)
    checked = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "broker", "check-data", str(broker.data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0 and checked.stdout.rstrip().endswith("result: clean"), (
        checked.stdout + checked.stderr
    )


async def test_force_delete_aborts_transactions_and_drops_clients(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("held")
        await producer.send(b"plain")
        txn = await client.new_transaction(timeout=60)
        await producer.send(b"in txn", txn=txn)
        await producer.close()
        status, body = call(broker, "DELETE", "/admin/v1/topics/held")
        assert status == 409 and str(txn.id) in body["error"], body
        assert "held" in topic_names(broker)
        status, body = call(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert body["status"] == "OPEN"

        other = await client.create_producer("held")
        status, body = call(broker, "DELETE", "/admin/v1/topics/held?force=true")
        assert status == 200, body
        assert body["aborted_transactions"] == [str(txn.id)]
        _, meta = call(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert meta["status"] == "ABORTED"
        with pytest.raises(errors.TxnbufError):
            await txn.commit()
        with pytest.raises(errors.ProducerNotFoundError):
            await other.send(b"after")
    assert "held" not in topic_names(broker)


async def test_retention_keeps_acknowledged_messages_for_a_later_subscription(
    broker: BrokerProcess,
) -> None:
    status, body = call(broker, "PUT", "/admin/v1/topics/kept", {"retention": {"time_s": 3600}})
    assert status == 200 and body["retention"] == {"time_s": 3600, "size_bytes": -1}
    async with Client(broker.url) as client:
        for topic in ("kept", "trimmed"):
            first = await client.subscribe(topic, "first", initial_position="earliest")
            await send_each(client, topic, 240)
            await take(first, 240)
            await first.close()
        # A retention pass after "trimmed"'s acks (and so after "kept"'s) trims it.
        await until(lambda: first_entry(broker, "trimmed") > 0, "trimmed's retention pass")
        late = await client.subscribe("kept", "late", initial_position="earliest")
        assert len(await take(late, 240)) == 240
        assert await drain(late, 0.5) == []
        late = await client.subscribe("trimmed", "late", initial_position="earliest")
        assert len(await drain(late)) < 240  # without retention, acknowledged data goes
    _, stats = call(broker, "GET", "/admin/v1/topics/kept/stats")
    assert stats["retention"] == {"time_s": 3600, "size_bytes": -1}
    assert stats["partitions"][0]["first_entry_id"] == 0


async def test_retention_by_size_keeps_the_newest_acknowledged_entries(
    broker: BrokerProcess,
) -> None:
    keep_all = {"retention": {"size_bytes": 10_000_000, "time_s": -1}}
    status, _ = call(broker, "PUT", "/admin/v1/topics/sized", keep_all)
    assert status == 200
    async with Client(broker.url) as client:
        first = await client.subscribe("sized", "first", initial_position="earliest")
        await send_each(client, "sized", 100)
        await take(first, 100)
        await retention_pass(client, broker)
        assert first_entry(broker, "sized") == 0  # (all 100 fit in 10 MB: kept)
        status, _ = call(broker, "PUT", "/admin/v1/topics/sized", {"retention": {"size_bytes": 1}})
        assert status == 200
        await until(lambda: first_entry(broker, "sized") >= 99 - 16, "the trim")  # (trim slack)
        status, _ = call(broker, "PUT", "/admin/v1/topics/sized", keep_all)
        assert status == 200
        await send_each(client, "sized", 50, "n")
        await take(first, 50)
        await retention_pass(client, broker)
        late = await client.subscribe("sized", "late", initial_position="earliest")
        values = await through(late, b"n49")
        assert [f"n{i}".encode() for i in range(50)] == values[-50:]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"retention": {"time_s": -5}}, "time_s must be a number >= 0, or -1"),
        ({"retention": {"size_bytes": 1.5}}, "whole number"),
        ({"retention": {}}, "needs time_s, size_bytes or both"),
        ({"retention": {"days": 1}}, "unknown retention field"),
        ({"retention": "forever"}, "retention must be an object"),
        ({"retention": {"time_s": 10}, "partitions": 0}, "partitions must be an integer"),
    ],
)
async def test_bad_retention_is_refused_and_creates_nothing(
    broker: BrokerProcess, body: dict[str, Any], message: str
) -> None:
    status, answer = call(broker, "PUT", "/admin/v1/topics/bad", body)
    assert status == 400 and message in answer["error"], answer
    assert topic_names(broker) == []


# -- subscriptions ------------------------------------------------------------------


async def test_subscriptions_listed_reset_skipped_and_deleted(broker: BrokerProcess) -> None:
    call(broker, "PUT", "/admin/v1/topics/subs", {"retention": {"time_s": -1, "size_bytes": -1}})
    async with Client(broker.url) as client:
        consumer = await client.subscribe("subs", "s", initial_position="earliest")
        before = int(time.time() * 1000)
        await send_each(client, "subs", 30)
        got = await take(consumer, 30)
        listed = subscription(broker, "subs", "s")
        assert (listed["consumers"], listed["backlog"], listed["type"]) == (1, 0, "exclusive")

        # Reset to earliest: everything comes again, in order, to the connected consumer.
        status, body = call(
            broker, "POST", "/admin/v1/topics/subs/subscriptions/s/reset", {"position": "earliest"}
        )
        assert status == 200 and body["partitions"][0]["backlog"] == 30, body
        again = await take(consumer, 30)
        assert [m.value for m in again] == [m.value for m in got]

        # To a message id: that message is the next one.
        target = got[20].message_id
        position = {"partition": target.partition, "entry_id": target.entry_id}
        status, body = call(
            broker, "POST", "/admin/v1/topics/subs/subscriptions/s/reset", {"position": position}
        )
        assert status == 200, body
        assert [m.value for m in await take(consumer, 10)] == [
            f"m{i}".encode() for i in range(20, 30)
        ]

        # To a time: from the first message published at or after it.
        status, _ = call(
            broker, "POST", "/admin/v1/topics/subs/subscriptions/s/reset", {"time_ms": before}
        )
        assert status == 200
        assert len(await take(consumer, 30)) == 30

        # Latest: nothing left; then skip over new messages.
        status, body = call(
            broker, "POST", "/admin/v1/topics/subs/subscriptions/s/reset", {"position": "latest"}
        )
        assert (status, body["partitions"][0]["backlog"]) == (200, 0)
        await consumer.close()
        await send_each(client, "subs", 10, "n")
        assert subscription(broker, "subs", "s")["backlog"] == 10
        status, body = call(
            broker, "POST", "/admin/v1/topics/subs/subscriptions/s/skip", {"messages": 4}
        )
        assert (status, body["partitions"]) == (200, [{"partition": 0, "skipped": 4}])
        assert subscription(broker, "subs", "s")["backlog"] == 6
        consumer = await client.subscribe("subs", "s")
        assert [m.value for m in await take(consumer, 6)] == [
            f"n{i}".encode() for i in range(4, 10)
        ]

        # Deleting it is refused while its consumer is connected.
        status, body = call(broker, "DELETE", "/admin/v1/topics/subs/subscriptions/s")
        assert status == 409 and "1 consumer(s) connected" in body["error"]
        assert subscription(broker, "subs", "s")["consumers"] == 1
        await consumer.close()
    status, body = call(broker, "DELETE", "/admin/v1/topics/subs/subscriptions/s")
    assert (status, body["deleted"]) == (200, "s")
    _, body = call(broker, "GET", "/admin/v1/topics/subs/subscriptions")
    assert body["subscriptions"] == []
    assert call(broker, "DELETE", "/admin/v1/topics/subs/subscriptions/s")[0] == 404
    broker.restart()
    _, body = call(broker, "GET", "/admin/v1/topics/subs/subscriptions")
    assert body["subscriptions"] == []


async def test_reset_is_refused_while_a_transaction_holds_acks(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("locked", "s", initial_position="earliest")
        await send_each(client, "locked", 3)
        msgs = await take(consumer, 3, ack=False)
        txn = await client.new_transaction(timeout=60)
        txn.flush()  # (the full path: the ack is written before the commit)
        await consumer.acknowledge(msgs[0], txn=txn)  # (returns once queued)
        await until(lambda: subscription(broker, "locked", "s")["pending_ack"] == 1, "PENDING_ACK")
        status, body = call(
            broker, "POST", "/admin/v1/topics/locked/subscriptions/s/reset", {"position": "latest"}
        )
        assert status == 409 and "PENDING_ACK" in body["error"], body
        assert subscription(broker, "locked", "s")["backlog"] == 3  # nothing moved
        status, body = call(broker, "DELETE", "/admin/v1/topics/locked/subscriptions/s?force=true")
        assert status == 200 and body["aborted_transactions"] == [str(txn.id)]


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("reset", {"position": "middle"}, 400, "body must be"),
        ("reset", {"position": {"partition": 0}}, 400, "body must be"),
        ("reset", {"position": {"partition": 3, "entry_id": 0}}, 400, "no partition 3"),
        ("reset", {"time_ms": -1}, 400, "time_ms must be"),
        ("reset", {"position": "earliest", "time_ms": 1}, 400, "body must be"),
        ("skip", {"messages": 0}, 400, "messages must be"),
        ("skip", {"messages": 1, "partition": 9}, 400, "no partition 9"),
        ("skip", {"count": 1}, 400, "body must be"),
    ],
)
async def test_bad_reset_and_skip_change_nothing(
    broker: BrokerProcess, path: str, body: dict[str, Any], status: int, message: str
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("rs", "s", initial_position="earliest")
        await send_each(client, "rs", 3)
        await consumer.close()
    got_status, answer = call(broker, "POST", f"/admin/v1/topics/rs/subscriptions/s/{path}", body)
    assert got_status == status and message in answer["error"], answer
    assert subscription(broker, "rs", "s")["backlog"] == 3
    assert (
        call(broker, "POST", "/admin/v1/topics/rs/subscriptions/nope/skip", {"messages": 1})[0]
        == 404
    )
    assert call(broker, "GET", "/admin/v1/topics/nope/subscriptions")[0] == 404
    assert topic_names(broker) == ["rs"]


async def test_a_refused_subscribe_creates_no_topic(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        with pytest.raises(errors.InvalidArgumentError, match="invalid subscription name"):
            await client.subscribe("fresh", "bad sub")
    assert topic_names(broker) == []


# -- errors and the transaction list ------------------------------------------------


async def test_every_route_answers_errors_in_json(broker: BrokerProcess) -> None:
    status, body = call(broker, "GET", "/no/such/route")
    assert status == 404 and "no route" in body["error"]
    status, body = call(broker, "POST", "/admin/v1/topics")
    assert status == 405 and "allowed: GET" in body["error"]
    status, body = call(broker, "GET", "/admin/v1/topics/" + "a" * 9000)
    assert status == 414 and "longer than" in body["error"]
    status, body = call(broker, "DELETE", "/admin/v1/topics/t?force=maybe")
    assert status == 400 and "force must be" in body["error"]
    assert " ERROR " not in broker.log()
    assert topic_names(broker) == []


async def test_transaction_list_shows_running_ones_and_hides_unused_spares(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("tl")
        async with client.transaction() as done:
            await producer.send(b"x", txn=done)
        running = await client.new_transaction(timeout=60)
        await producer.send(b"y", txn=running)
        await producer.flush()  # (a transactional send returns once queued)
        await asyncio.sleep(0.05)
        _, body = call(broker, "GET", "/admin/v1/transactions?running_longer_than_ms=1")
        assert [t["txnid"] for t in body["transactions"]] == [str(running.id)]
        _, listed = call(broker, "GET", "/admin/v1/transactions")
        statuses = {t["txnid"]: t["status"] for t in listed["transactions"]}
        assert statuses == {str(done.id): "COMMITTED", str(running.id): "OPEN"}
        _, everything = call(broker, "GET", "/admin/v1/transactions?all=true")
        spares = [
            t
            for t in everything["transactions"]
            if t["status"] == "ABORTED" and not t["partitions"] and not t["subscriptions"]
        ]
        assert len(everything["transactions"]) == 2 + len(spares)
        await running.abort()
