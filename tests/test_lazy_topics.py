"""Topics load on first use and unload when idle (see `broker._server`).

In-process tests on a real store: an unloaded topic holds no objects and
comes back as it was; unloading waits for everything under way; work
queued for a topic that is loading keeps its order. Process tests with
SIGKILL (``--no-preload``, so that nothing loads a topic before the test
touches it): a restart with many topics, an OPEN transaction on one
partition and PENDING_ACK acknowledgements on one subscription, both
recovered correctly when first touched (aborted: the reader never sees the
uncommitted send, the locked message comes again); and a decided
transaction whose participants had not applied it, finished after a restart
by its coordinator, which loads the topics it names.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from pathlib import Path

import pytest

from broker import Broker
from broker._connection import PROTOCOL_VERSION, Connection
from buffer import COMMIT_MARKER, entry_kind
from client import Client, errors
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions import Consumer, SubType
from tests.conftest import BrokerProcess, until
from tests.test_metrics import scrape


def _consumer(topic: str, pushed: list[pb.DeliveredEntry] | None = None) -> Consumer:
    def push(_c: Consumer, entries: list[pb.DeliveredEntry]) -> None:
        if pushed is not None:
            pushed.extend(entries)

    return Consumer(1, "c", topic, "s", SubType.EXCLUSIVE, push=push)


def _message(seq: int) -> list[pb.SingleMessage]:
    return [pb.SingleMessage(sequence_id=seq, payload=b"m%d" % seq)]


async def _make_topic(broker: Broker, name: str, messages: int) -> None:
    """``name`` with subscription "s" (earliest) and ``messages`` messages."""
    topic = await broker.topics.get_or_create(name)
    consumer = _consumer(name)
    await broker.subscriptions.subscribe(topic, "s", consumer, True)
    broker.subscriptions.detach(consumer)
    for seq in range(messages):
        await topic.partitions[0].publish("p", _message(seq))


async def test_a_start_loads_no_topic_and_a_first_use_loads_it_as_it_was(tmp_path: Path) -> None:
    broker = await Broker.open(tmp_path, preload=False)
    try:
        for i in range(20):
            await _make_topic(broker, f"t{i}", 2)
        topic = broker.topics.get("t3")
        assert topic is not None
        (sub,) = broker.subscriptions.of_topic("t3")["s"]
        await sub.ack([(topic.partitions[0].ledger.first_entry_id, 0)], cumulative=False)
    finally:
        await broker.close()

    broker = await Broker.open(tmp_path, preload=False)
    try:
        assert len(broker.topics) == 20 and broker.topics.loaded_count() == 0
        assert broker.topics.get("t3") is None and "t3" in broker.topics
        assert broker.topics.partition_count("t3") == 1
        assert broker.subscriptions.all() == []
        topic = await broker.topics.load_topic("t3")
        assert topic is not None and broker.topics.loaded_count() == 1
        (sub,) = broker.subscriptions.of_topic("t3")["s"]
        assert sub.backlog() == 1  # (one of its two messages was acknowledged)
        assert topic.partitions[0].dedup.last_sequence_id("p") == 1
        assert await broker.topics.load_topic("nope") is None
    finally:
        await broker.close()


async def test_get_or_create_asks_the_gate_even_of_a_loaded_topic(tmp_path: Path) -> None:
    """A cluster broker handing a slot over, or dropping everything after
    its store failed, still holds the slot's loaded topics for a moment:
    a producer or consumer asking for one then (`get_or_create`) is refused
    NOT_OWNER, as for a topic not loaded, and nothing changes."""
    broker = await Broker.open(tmp_path, preload=False)
    try:
        await _make_topic(broker, "t", 1)
        loaded = broker.topics.get("t")
        assert loaded is not None

        def gate(name: str) -> None:  # (the cluster host's: slot 7 not served here)
            raise refusals.NotOwner(f"topic {name!r} is in slot 7, not served here", 7)

        broker.topics.gate = gate
        with pytest.raises(refusals.NotOwner, match="slot 7"):
            await broker.topics.get_or_create("t")
        assert broker.topics.get("t") is loaded
        broker.topics.gate = None
        assert await broker.topics.get_or_create("t") is loaded
    finally:
        await broker.close()


class _Socket:
    """Enough of a WebSocket for a broker connection driven by `on_frame`
    (its answers stay queued: nothing writes them)."""

    closed = False

    async def send_bytes(self, data: bytes) -> None:
        raise AssertionError("not written in this test")

    async def close(self) -> None:
        self.closed = True


def _frames(conn: Connection, *commands: pb.BaseCommand) -> list[pb.BaseCommand]:
    """Feed ``commands`` to ``conn``; the answers it queued so far."""
    for cmd in commands:
        conn.on_frame(cmd.SerializeToString())
    return [pb.BaseCommand.FromString(data) for data in conn._out]


async def test_a_producer_created_as_its_connection_closes_leaves_its_name_free(
    tmp_path: Path,
) -> None:
    """A PRODUCER whose topic loads while its connection closes (a cluster
    broker closes every connection when it hands a slot over or drops
    everything) claims nothing: the producer's name is free for its
    client's next connection (it was refused PRODUCER_BUSY there, by a
    dead connection, until the client gave the producer up)."""
    broker = await Broker.open(tmp_path, preload=False)
    try:
        await _make_topic(broker, "t", 1)
    finally:
        await broker.close()
    broker = await Broker.open(tmp_path, preload=False)
    try:
        hello = pb.BaseCommand(type=pb.BaseCommand.CONNECT)
        hello.connect.protocol_version = PROTOCOL_VERSION

        def producer(request_id: int) -> pb.BaseCommand:
            cmd = pb.BaseCommand(type=pb.BaseCommand.PRODUCER)
            cmd.producer.topic, cmd.producer.producer_name = "t", "p"
            cmd.producer.producer_id, cmd.producer.request_id = 1, request_id
            return cmd

        first = Connection.admit(broker, _Socket(), "first")
        assert isinstance(first, Connection)
        _frames(first, hello, producer(1))  # ("t" is not loaded: the PRODUCER waits for it)
        assert broker.topics.get("t") is None
        first.close()
        await asyncio.gather(*first._tasks)
        assert broker.producer_count("t") == 0

        second = Connection.admit(broker, _Socket(), "second")
        assert isinstance(second, Connection)
        _frames(second, hello, producer(2))
        await asyncio.gather(*second._tasks)
        answers = [c for c in _frames(second) if c.type != pb.BaseCommand.CONNECTED]
        assert [pb.BaseCommand.Type.Name(c.type) for c in answers] == ["PRODUCER_SUCCESS"]
        assert broker.producer_count("t") == 1
    finally:
        await broker.close()


async def test_the_background_pass_loads_every_topic(tmp_path: Path) -> None:
    broker = await Broker.open(tmp_path, preload=False)
    try:
        for i in range(50):
            await _make_topic(broker, f"t{i}", 1)
    finally:
        await broker.close()
    broker = await Broker.open(tmp_path)  # (preload: the default)
    try:
        await until(lambda: broker.topics.loaded_count() == 50, "50 topics loaded")
        assert len(broker.subscriptions.all()) == 50
    finally:
        await broker.close()


async def test_an_idle_topic_unloads_freeing_its_objects_and_comes_back(tmp_path: Path) -> None:
    broker = await Broker.open(tmp_path, preload=False, unload_after=0.0)
    try:
        await broker.topics.create("t", 2)
        await _make_topic(broker, "t", 3)
        # A committed transaction too: the partition has a transaction buffer.
        tc = broker.coordinators[0]
        txnid = tc.new_txn()
        tc.add_partition(txnid, "t", 1)
        topic = broker.topics.get("t")
        assert topic is not None
        await broker.publish_txn(topic.partitions[1], (txnid.most_bits, txnid.least_bits), "x",
                                 _message(0))  # fmt: skip
        await tc.end_txn(txnid, commit=True)
        await until(
            lambda: all(p.settled() for p in topic.partitions),  # (its TXN_COMMIT is lazy)
            "the commit's writes durable",
        )
        before = {
            "backlog": [s.backlog() for s in broker.subscriptions.of_topic("t")["s"]],
            "last": [p.ledger.last_entry_id for p in topic.partitions],
        }
        assert before["backlog"] == [3, 1]
        ledgers = broker.store.loaded_ledgers()
        part = weakref.ref(topic.partitions[1])
        sub = weakref.ref(broker.subscriptions.of_topic("t")["s"][1])
        del topic
        gc.disable()  # (freed by reference counting alone: no cycle keeps them)
        try:
            assert broker._unload_idle() == 1
            assert part() is None and sub() is None
        finally:
            gc.enable()
        assert broker.topics.get("t") is None and broker.topics.partition_count("t") == 2
        assert broker.subscriptions.of_topic("t") == {}
        # p and c ledgers of both partitions, and the sidecar of one (a loaded
        # partition gave its d ledger back already: it writes none yet).
        assert broker.store.loaded_ledgers() == ledgers - 5

        pushed: list[pb.DeliveredEntry] = []
        topic = await broker.topics.load_topic("t")
        assert topic is not None
        subs = broker.subscriptions.of_topic("t")["s"]
        assert [s.backlog() for s in subs] == before["backlog"]
        assert [p.ledger.last_entry_id for p in topic.partitions] == before["last"]
        assert entry_kind((await topic.partitions[1].ledger.read(0, 0))[0].meta) == COMMIT_MARKER
        # Deduplication came back: a re-sent message is not stored again.
        await topic.partitions[0].publish("p", _message(2))
        assert topic.partitions[0].ledger.last_entry_id == before["last"][0]
        # Dispatch works again: both partitions deliver what is pending.
        consumer = _consumer("t", pushed)
        await broker.subscriptions.subscribe(topic, "s", consumer, False)
        consumer.add_permits(10)
        await until(lambda: sum(max(len(e.indexes), 1) for e in pushed) == 4, "4 messages")
        assert sorted((e.partition, e.entry_id) for e in pushed) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    finally:
        await broker.close()


async def test_a_topic_does_not_unload_while_something_is_under_way(tmp_path: Path) -> None:
    broker = await Broker.open(tmp_path, preload=False, unload_after=0.0)
    try:
        await _make_topic(broker, "t", 1)
        topic = broker.topics.get("t")
        assert topic is not None
        part = topic.partitions[0]

        # A consumer attached.
        consumer = _consumer("t")
        await broker.subscriptions.subscribe(topic, "s", consumer, True)
        assert broker._unload_idle() == 0
        broker.subscriptions.detach(consumer)
        await asyncio.sleep(0)  # (its dispatch task ends)

        # A producer connected.
        conn = object()
        broker.claim_producer("t", "p", conn)  # type: ignore[arg-type]
        assert broker._unload_idle() == 0
        broker.release_producer("t", "p", conn)  # type: ignore[arg-type]

        # An append not durable yet: unloaded once it is.
        appended = part.publish("p", _message(5))
        assert broker._unload_idle() == 0
        await appended

        # A transaction not ended, with a write there.
        tc = broker.coordinators[0]
        txnid = tc.new_txn()
        tc.add_partition(txnid, "t", 0)
        await broker.publish_txn(part, (txnid.most_bits, txnid.least_bits), "x", _message(0))
        assert broker._unload_idle() == 0
        await tc.end_txn(txnid, commit=False)
        await until(lambda: part.settled(), "the abort's writes durable")

        # Used lately.
        broker.unload_after = 60.0
        assert broker._unload_idle() == 0
        broker.unload_after = 0.0
        assert broker._unload_idle() == 1
    finally:
        await broker.close()


async def test_work_queued_for_a_loading_topic_keeps_its_order(tmp_path: Path) -> None:
    broker = await Broker.open(tmp_path, preload=False)
    try:
        await _make_topic(broker, "t", 0)
    finally:
        await broker.close()
    broker = await Broker.open(tmp_path, preload=False)
    try:
        seen: list[object] = []

        def send(seq: int) -> object:
            def work(topic: object) -> object:
                # Visible, and prepared (its subscriptions loaded), when called.
                assert broker.topics.get("t") is topic
                assert broker.subscriptions.of_topic("t")
                seen.append(seq)
                return broker.topics.get("t").partitions[0].publish("p", _message(seq))  # type: ignore[union-attr]

            return work

        first = broker.topics.after_load("t", send(0))
        second = broker.topics.after_load("t", send(1))
        assert seen == [] and broker.topics.get("t") is None
        loaded = await broker.topics.load_topic("t")
        assert seen == [0, 1]
        assert [(await (await f)).entry_id for f in (first, second)] == [0, 1]  # type: ignore[attr-defined]
        assert loaded is broker.topics.get("t")
        with pytest.raises(refusals.TopicNotFound, match="no topic 'nope'"):
            await broker.topics.after_load("nope", send(2))
    finally:
        await broker.close()


# -- with a real broker process and SIGKILL ------------------------------------------------

N_TOPICS = 120


def _loaded(broker: BrokerProcess) -> tuple[float, float]:
    metrics = scrape(broker)
    return metrics[("txnbuf_topics", ())], metrics[("txnbuf_topics_loaded", ())]


async def _set_up(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        sem = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with sem:
                producer = await client.create_producer(f"t{i}")
                consumer = await client.subscribe(f"t{i}", "s", initial_position="earliest")
                await producer.send(b"m%d" % i)
                await producer.close()
                await consumer.close()

        await asyncio.gather(*(one(i) for i in range(N_TOPICS)))


@pytest.mark.integration
@pytest.mark.crash
async def test_a_restart_recovers_each_topic_when_first_touched(broker: BrokerProcess) -> None:
    broker.args = ["--no-preload"]
    broker.restart()
    await _set_up(broker)
    async with Client(broker.url) as client:
        # One transaction, left OPEN by the crash: a send on t7's partition,
        # a PENDING_ACK acknowledgement on t8's subscription (the full path:
        # written as they come, not held by the client until a commit).
        txn = await client.new_transaction(timeout=120)
        txn.flush()
        producer = await client.create_producer("t7", producer_name="txn-writer")
        await producer.send(b"uncommitted", txn=txn)
        reader = await client.subscribe("t8", "s", initial_position="earliest")
        locked = await reader.receive(timeout=10)
        await reader.acknowledge(locked, txn=txn)

        def durable() -> bool:  # (answered once queued: durable in a moment)
            _, body = broker.admin("GET", "/admin/v1/topics/t7/stats")
            buffer = json.loads(body)["partitions"][0]["transaction_buffer"]
            _, body = broker.admin("GET", "/admin/v1/topics/t8/subscriptions")
            (sub,) = json.loads(body)["subscriptions"]
            return bool(buffer and buffer["open"] == 1 and sub["pending_ack"] == 1)

        await until(durable, "the send and the ack durable")
    broker.kill()
    broker.start()

    assert _loaded(broker) == (N_TOPICS, 0)  # nothing loaded a topic yet
    async with Client(broker.url) as client:
        # t7's first reader: its own message, never the uncommitted send.
        consumer = await client.subscribe("t7", "s")
        assert (await consumer.receive(timeout=10)).value == b"m7"
        with pytest.raises(errors.OperationTimeoutError):
            await consumer.receive(timeout=1.5)
        _, body = broker.admin("GET", "/admin/v1/topics/t7/stats")
        buffer = json.loads(body)["partitions"][0]["transaction_buffer"]
        assert buffer["open"] == 0 and buffer["aborted"] == 1, buffer
        # t8's first reader: the message its transaction held comes again.
        consumer = await client.subscribe("t8", "s")
        message = await consumer.receive(timeout=10)
        assert message.value == b"m8" and message.message_id == locked.message_id
        await consumer.acknowledge(message)
        _, body = broker.admin("GET", "/admin/v1/topics/t8/subscriptions")
        assert json.loads(body)["subscriptions"][0]["pending_ack"] == 0
        assert _loaded(broker) == (N_TOPICS, 2)

        # Every other topic reads as it was.
        sem = asyncio.Semaphore(16)

        async def read(i: int) -> None:
            async with sem:
                consumer = await client.subscribe(f"t{i}", "s")
                message = await consumer.receive(timeout=10)
                assert message.value == b"m%d" % i
                await consumer.acknowledge(message)
                await consumer.close()

        await asyncio.gather(*(read(i) for i in range(N_TOPICS) if i not in (7, 8)))
    assert _loaded(broker) == (N_TOPICS, N_TOPICS)
    assert "aborted 1 transactions left open by the restart" in broker.log()


@pytest.mark.integration
@pytest.mark.crash
async def test_a_decided_transaction_reaches_a_participant_not_loaded(
    broker: BrokerProcess,
) -> None:
    # Participants refuse every END: the commit is decided (durable), not applied.
    broker.env["TXNBUF_REFUSE"] = "broker.end_txn_on_participant"
    broker.args = ["--no-preload"]
    broker.restart()
    async with Client(broker.url) as client:
        producer = await client.create_producer("in")
        await producer.send(b"input")
        source = await client.subscribe("in", "s", initial_position="earliest")
        await (await client.subscribe("out", "s", initial_position="earliest")).close()
        message = await source.receive(timeout=10)
        txn = await client.new_transaction(timeout=120)
        txn.flush()  # (the full path: its participants are told the decision)
        sink = await client.create_producer("out", producer_name="copier")
        await sink.send(b"output", txn=txn)
        await source.acknowledge(message, txn=txn)
        await txn.commit()  # (answered once the decision is durable, after END_WAIT)
    _, body = broker.admin("GET", "/admin/v1/transactions?state=COMMITTING")
    assert len(json.loads(body)["transactions"]) == 1
    broker.kill()
    broker.env.pop("TXNBUF_REFUSE")
    broker.start()

    # The coordinator finishes it: it loads "in" and "out" to tell them.
    await until(
        lambda: json.loads(broker.admin("GET", "/admin/v1/transactions?state=COMMITTED")[1])[
            "transactions"
        ],
        "the decided transaction finished",
    )
    assert _loaded(broker) == (2, 2)
    async with Client(broker.url) as client:
        out = await client.subscribe("out", "s")
        assert (await out.receive(timeout=10)).value == b"output"
        source = await client.subscribe("in", "s")
        with pytest.raises(errors.OperationTimeoutError):  # (its ack was committed)
            await source.receive(timeout=1.5)
    _, body = broker.admin("GET", "/admin/v1/transactions?state=COMMITTING")
    assert json.loads(body)["transactions"] == []
