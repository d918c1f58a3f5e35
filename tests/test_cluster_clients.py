"""The client in a cluster (`client._brokers`), against real broker processes
sharing one PostgreSQL database: given one broker's URL it reaches topics
owned by every broker (LOOKUP: connect here, or redirect to the owner); a
producer and a consumer keep working across a SIGKILL of the owner of their
topic (nothing lost, nothing stored twice) and across a SIGTERM handover
(no error reaches the application); a transaction near its topic goes to
that topic's broker; a client whose first URL is a SIGSTOPped broker
reaches the cluster at the next one within its connect timeout. A single
broker is never asked a LOOKUP. Tests wait for conditions, never for a
length of time."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import pytest

from client import Client, errors
from client._brokers import Brokers
from proto import txnbuf_pb2 as pb
from tests._cluster import owner_id, start_placed, topic_on, wait_for
from tests._cluster import settled as settled  # (tests/test_kafka_cluster.py imports it from here)
from tests.conftest import BrokerProcess, RawConnection, until

pytestmark = pytest.mark.integration

COUNT = 120  # messages per run


async def test_a_single_broker_is_never_asked_a_lookup(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def no_lookup(*args: object, **kwargs: object) -> None:
        raise AssertionError("a single broker was asked a LOOKUP")

    monkeypatch.setattr(Brokers, "lookup", no_lookup)
    async with Client(f"{broker.url}, {broker.url}") as client:
        producer = await client.create_producer("solo")
        consumer = await client.subscribe("solo", "s", initial_position="earliest")
        async with client.transaction(near="solo") as txn:
            await producer.send(b"one", txn=txn)
        assert (await consumer.receive(timeout=30)).value == b"one"
        assert not client._brokers.cluster
        assert client._brokers.connections() == [client._conn]


async def test_one_url_reaches_the_topics_of_every_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    found = await start_placed(tmp_path, pg_url, logs)
    topics = {proc.url: topic_on(found, proc, "every") for proc in logs}
    home = logs[0]
    redirect = pb.CommandLookupTopicResponse.REDIRECT

    async def lookup(topic: str = "", tc_id: int | None = None) -> pb.CommandLookupTopicResponse:
        ask = pb.CommandLookupTopic(request_id=1, topic=topic)
        if tc_id is not None:
            ask.tc_id = tc_id
        async with RawConnection(home.url) as raw:
            return (await raw.request(pb.BaseCommand.LOOKUP, "lookup", ask)).lookup_response

    async def redirects() -> bool:  # (once home's last look saw every owner where it is now)
        answers = [await lookup(t) for t in topics.values()]
        return all(
            (a.response, a.broker_service_url) == (redirect, url)
            for a, url in zip(answers[1:], list(topics)[1:], strict=True)
        )

    await wait_for("home redirects to the owners", redirects)
    for proc, topic in zip(logs, topics.values(), strict=True):
        answer = await lookup(topic)
        assert not answer.HasField("error") and answer.authoritative
        if proc is home:
            assert answer.response == pb.CommandLookupTopicResponse.CONNECT
        else:
            assert (answer.response, answer.broker_service_url) == (redirect, proc.url)
        answer = await lookup(tc_id=min(found[owner_id(proc)]))
        assert answer.response == (redirect if proc is not home else 0)
        assert answer.broker_service_url == proc.url
    async with Client(home.url, operation_timeout=30.0) as client:
        for url, topic in topics.items():
            producer = await client.create_producer(topic)
            consumer = await client.subscribe(topic, "s", initial_position="earliest")
            assert producer._conn.url == url and consumer._conn.url == url
            await producer.send(topic.encode())
            message = await consumer.receive(timeout=30)
            assert message.value == topic.encode()
            await consumer.acknowledge(message)
        assert sorted(c.url for c in client._brokers.connections()) == sorted(topics)
        assert client._conn.slots == 64
        # near= puts a transaction's coordinator on its topic's broker (one
        # across brokers: tests/test_cluster_txn.py).
        elsewhere = topics[logs[1].url]
        producer = await client.create_producer(elsewhere)
        async with client.transaction(near=elsewhere) as txn:
            assert txn._conn.url == logs[1].url
            await producer.send(b"in a transaction", txn=txn)
        consumer = await client.subscribe(elsewhere, "t", initial_position="earliest")
        values = [(await consumer.receive(timeout=30)).value for _ in range(2)]
        assert values == [elsewhere.encode(), b"in a transaction"]
    # A first URL whose broker accepts connections and never answers (its
    # kernel does, the process is stopped): left after the connect timeout,
    # the client reaches the cluster at the next URL well within its
    # operation timeout (30 s).
    assert home.proc is not None
    home.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        urls = [home.url, logs[1].url]
        async with Client(urls, operation_timeout=30.0, connect_timeout=2.0) as client:
            assert client._conn.url == logs[1].url
            waited = time.monotonic() - started
            producer = await client.create_producer(elsewhere)
            await producer.send(b"past a paused broker")
        print(f"connected past a SIGSTOPped broker in {waited:.1f} s")
        assert waited < 10.0
    finally:
        home.proc.send_signal(signal.SIGCONT)


async def _produce(producer: object, sent: list[bytes], start: asyncio.Event) -> None:
    for i in range(COUNT):
        if i == COUNT // 3:
            start.set()  # (the owner goes now; the rest is sent across the change)
        value = b"m%04d" % i
        await producer.send(value)  # type: ignore[attr-defined]
        sent.append(value)


async def _consume(consumer: object, got: set[bytes], seen: list[bytes]) -> None:
    while len(got) < COUNT:
        message = await consumer.receive(timeout=60)  # type: ignore[attr-defined]
        seen.append(message.value)
        got.add(message.value)
        await consumer.acknowledge(message)  # type: ignore[attr-defined]


async def _follow(
    tmp_path: Path, pg_url: str, procs: list[BrokerProcess], ttl: float, how: signal.Signals
) -> tuple[list[bytes], list[bytes]]:
    """Produce and consume a topic of one broker's while it is sent ``how``;
    what the consumer saw, and what a fresh subscription reads after."""
    found = await start_placed(tmp_path, pg_url, procs, ttl=ttl)
    victim, home = procs[0], procs[1]
    topic = topic_on(found, victim, "moving")
    async with Client(home.url, operation_timeout=60.0) as client:
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "live", initial_position="earliest")
        # (Kept from the start: acknowledged by every subscription, a message
        # may be trimmed.)
        await (await client.subscribe(topic, "check", initial_position="earliest")).close()
        assert producer._conn.url == victim.url
        sent: list[bytes] = []
        got: set[bytes] = set()
        seen: list[bytes] = []
        go = asyncio.Event()
        producing = asyncio.ensure_future(_produce(producer, sent, go))
        consuming = asyncio.ensure_future(_consume(consumer, got, seen))
        await go.wait()
        assert victim.proc is not None
        victim.proc.send_signal(how)
        await asyncio.gather(producing, consuming)  # (an error here reached the application)
        assert producer._conn.url != victim.url and consumer._conn.url != victim.url
        assert sent == [b"m%04d" % i for i in range(COUNT)]
        assert got == set(sent)
        check = await client.subscribe(topic, "check")
        stored = [(await check.receive(timeout=30)).value for _ in range(COUNT)]
        with pytest.raises(errors.OperationTimeoutError):
            extra = await check.receive(timeout=1.0)
            stored.append(extra.value)
    return seen, stored


async def test_a_producer_and_consumer_follow_a_sigkill_of_their_topics_owner(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    seen, stored = await _follow(tmp_path, pg_url, logs, 2.0, signal.SIGKILL)
    assert sorted(stored) == [b"m%04d" % i for i in range(COUNT)], "lost or stored twice"
    print(f"consumer saw {len(seen)} deliveries of {COUNT} messages (redeliveries after the kill)")


async def test_a_sigterm_handover_is_followed_without_errors(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    _seen, stored = await _follow(tmp_path, pg_url, logs, 30.0, signal.SIGTERM)
    assert sorted(stored) == [b"m%04d" % i for i in range(COUNT)], "lost or stored twice"
    victim = logs[0]
    assert victim.proc is not None
    await until(lambda: victim.proc is not None and victim.proc.poll() is not None, "a stopped")
    assert victim.proc.returncode == 0
