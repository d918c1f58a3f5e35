"""Kafka's wire protocol: unmodified Kafka clients against a real broker process.

For each of aiokafka, kafka-python and confluent-kafka (librdkafka): a
transactional consume-transform-produce copier (init_transactions,
begin_transaction, send, send_offsets_to_transaction, commit_transaction,
every third transaction aborted) between two-partition topics, then a
read_committed group consumer that must see every input exactly once, and
the copier group's committed offsets at the end of the input.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess, free_port

pytestmark = [pytest.mark.integration]

N = 40  # input messages
PER_TXN = 5
ABORT_EVERY = 3


class KafkaBroker(BrokerProcess):
    """A broker with a Kafka listener (``bootstrap``)."""

    def __init__(self, data_dir: Path, log_path: Path) -> None:
        super().__init__(data_dir, log_path)
        self.kafka_port = free_port()
        self.args = ["--kafka-port", str(self.kafka_port)]

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    def topic(self, prefix: str, partitions: int = 2) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        body = b'{"partitions": %d}' % partitions
        status, _ = self.admin("PUT", f"/admin/v1/topics/{name}", body)
        assert status == 200
        return name


@pytest.fixture
def kafka_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    import sys

    proc = KafkaBroker(tmp_path / "data", tmp_path / "broker.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        sys.stderr.write(f"----- broker log ({proc.log_path}) -----\n{proc.log()}\n")


def inputs() -> list[bytes]:
    return [b"m%d" % i for i in range(N)]


def expected_output() -> Counter[bytes]:
    return Counter(v.upper() for v in inputs())


# -- aiokafka -------------------------------------------------------------------------


async def test_aiokafka_transactional_copier_exactly_once(kafka_broker: KafkaBroker) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    boot = kafka_broker.bootstrap
    src, dst = kafka_broker.topic("in"), kafka_broker.topic("out")
    group = f"copier-{uuid.uuid4().hex[:6]}"
    seeder = AIOKafkaProducer(bootstrap_servers=boot)
    await seeder.start()
    try:
        await asyncio.gather(*(seeder.send_and_wait(src, v, key=v) for v in inputs()))
    finally:
        await seeder.stop()

    consumer = AIOKafkaConsumer(
        src,
        bootstrap_servers=boot,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    producer = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=f"{group}-tx")
    await consumer.start()
    await producer.start()  # (init_transactions)
    try:
        copied = attempts = 0
        while copied < N:
            batch = await consumer.getmany(timeout_ms=1000, max_records=PER_TXN)
            records = [r for rs in batch.values() for r in rs]
            if not records:
                continue
            attempts += 1
            await producer.begin_transaction()
            for r in records:
                await producer.send(dst, r.value.upper(), key=r.key)
            offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
            await producer.send_offsets_to_transaction(offsets, group)
            if attempts % ABORT_EVERY == 0:
                await producer.abort_transaction()
                for tp in batch:
                    committed = await consumer.committed(tp)
                    consumer.seek(tp, 0 if committed is None else committed)
            else:
                await producer.commit_transaction()
                copied += len(records)
        ends = await consumer.end_offsets(list(consumer.assignment()))
        for tp, end in ends.items():
            assert await consumer.committed(tp) == end
    finally:
        await producer.stop()
        await consumer.stop()

    reader = AIOKafkaConsumer(
        dst,
        bootstrap_servers=boot,
        group_id=f"reader-{group}",
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await reader.start()
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < N and time.monotonic() < deadline:
            batch = await reader.getmany(timeout_ms=500)
            got += [r.value for rs in batch.values() for r in rs]
        await asyncio.sleep(0.5)  # nothing more may come
        got += [r.value for rs in (await reader.getmany(timeout_ms=200)).values() for r in rs]
    finally:
        await reader.stop()
    assert Counter(got) == expected_output()
    assert attempts >= N // PER_TXN + 1  # some transactions were aborted


# -- kafka-python -------------------------------------------------------------------------


# kafka-python reads its protocol specs with importlib.resources' legacy API.
KAFKA_PYTHON_WARNINGS = pytest.mark.filterwarnings(
    "ignore:(read_text|open_text) is deprecated:DeprecationWarning"
)


@KAFKA_PYTHON_WARNINGS
def test_kafka_python_transactional_copier_exactly_once(kafka_broker: KafkaBroker) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    boot = kafka_broker.bootstrap
    src, dst = kafka_broker.topic("in"), kafka_broker.topic("out")
    group = f"copier-{uuid.uuid4().hex[:6]}"
    seeder = KafkaProducer(bootstrap_servers=boot)
    for v in inputs():
        seeder.send(src, v, key=v)
    seeder.flush()
    seeder.close()

    consumer = KafkaConsumer(
        src,
        bootstrap_servers=boot,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    producer = KafkaProducer(bootstrap_servers=boot, transactional_id=f"{group}-tx")
    try:
        producer.init_transactions()
        copied = attempts = 0
        while copied < N:
            batch = consumer.poll(timeout_ms=1000, max_records=PER_TXN)
            records = [r for rs in batch.values() for r in rs]
            if not records:
                continue
            attempts += 1
            producer.begin_transaction()
            for r in records:
                producer.send(dst, r.value.upper(), key=r.key)
            offsets = {
                TopicPartition(r.topic, r.partition): OffsetAndMetadata(r.offset + 1, "", -1)
                for r in records
            }
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            if attempts % ABORT_EVERY == 0:
                producer.abort_transaction()
                for tp in batch:
                    committed = consumer.committed(tp)
                    consumer.seek(tp, 0 if committed is None else committed)
            else:
                producer.commit_transaction()
                copied += len(records)
        ends = consumer.end_offsets(list(consumer.assignment()))
        for tp, end in ends.items():
            assert consumer.committed(tp) == end
    finally:
        producer.close()
        consumer.close()

    reader = KafkaConsumer(
        dst,
        bootstrap_servers=boot,
        group_id=f"reader-{group}",
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        consumer_timeout_ms=3000,
    )
    got = [r.value for r in reader]
    reader.close()
    assert Counter(got) == expected_output()
    assert attempts >= N // PER_TXN + 1


# -- confluent-kafka (librdkafka) ---------------------------------------------------------


def test_confluent_kafka_transactional_copier_exactly_once(kafka_broker: KafkaBroker) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    boot = kafka_broker.bootstrap
    src, dst = kafka_broker.topic("in"), kafka_broker.topic("out")
    group = f"copier-{uuid.uuid4().hex[:6]}"
    seeder = Producer({"bootstrap.servers": boot})
    for v in inputs():
        seeder.produce(src, v, key=v)
    assert seeder.flush(30) == 0

    consumer = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([src])
    producer = Producer({"bootstrap.servers": boot, "transactional.id": f"{group}-tx"})
    try:
        producer.init_transactions(30)
        copied = attempts = 0
        while copied < N:
            records = [r for r in consumer.consume(PER_TXN, 1.0) if r.error() is None]
            if not records:
                continue
            attempts += 1
            producer.begin_transaction()
            for r in records:
                producer.produce(dst, r.value().upper(), key=r.key())
            offsets: dict[tuple[str, int], int] = {}
            for r in records:
                offsets[(r.topic(), r.partition())] = r.offset() + 1
            producer.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                consumer.consumer_group_metadata(),
                30,
            )
            if attempts % ABORT_EVERY == 0:
                producer.abort_transaction(30)
                parts = [TopicPartition(t, p) for t, p in offsets]
                for tp in consumer.committed(parts, 10):
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
            else:
                producer.commit_transaction(30)
                copied += len(records)
        for tp in consumer.committed(consumer.assignment(), 10):
            _, high = consumer.get_watermark_offsets(tp, 10)
            assert tp.offset == high
    finally:
        consumer.close()

    reader = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"reader-{group}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    reader.subscribe([dst])
    got: list[bytes] = []
    deadline = time.monotonic() + 20
    quiet_until = None
    while time.monotonic() < deadline:
        batch = [r.value() for r in reader.consume(100, 0.5) if r.error() is None]
        got += batch
        if len(got) >= N:
            quiet_until = quiet_until or time.monotonic() + 1.0  # nothing more may come
            if time.monotonic() > quiet_until:
                break
    reader.close()
    assert Counter(got) == expected_output()
    assert attempts >= N // PER_TXN + 1


# -- fencing ----------------------------------------------------------------------------


async def test_aiokafka_zombie_is_fenced_by_a_second_producer(kafka_broker: KafkaBroker) -> None:
    """A producer whose transactional id a second instance initialized can
    neither write nor commit; what it wrote in its open transaction is
    aborted, and only the second instance's transaction is read."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka.errors import KafkaError

    boot = kafka_broker.bootstrap
    dst = kafka_broker.topic("out", partitions=1)
    tid = f"tx-{uuid.uuid4().hex[:6]}"
    zombie = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=tid)
    await zombie.start()
    await zombie.begin_transaction()
    await zombie.send_and_wait(dst, b"zombie-1")
    winner = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=tid)
    await winner.start()  # fences the zombie, aborts its open transaction
    try:
        async with winner.transaction():
            await winner.send_and_wait(dst, b"winner")
        with pytest.raises(KafkaError):
            await zombie.send_and_wait(dst, b"zombie-2")
            await zombie.commit_transaction()
    finally:
        await winner.stop()
        await zombie.stop()

    reader = AIOKafkaConsumer(
        dst,
        bootstrap_servers=boot,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await reader.start()
    try:
        got: list[bytes] = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            batch = await reader.getmany(timeout_ms=300)
            got += [r.value for rs in batch.values() for r in rs]
    finally:
        await reader.stop()
    assert got == [b"winner"]


def test_confluent_kafka_zombie_is_fenced_by_a_second_producer(kafka_broker: KafkaBroker) -> None:
    from confluent_kafka import Consumer, KafkaException, Producer

    boot = kafka_broker.bootstrap
    dst = kafka_broker.topic("out", partitions=1)
    tid = f"tx-{uuid.uuid4().hex[:6]}"
    zombie = Producer({"bootstrap.servers": boot, "transactional.id": tid})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce(dst, b"zombie-1")
    assert zombie.flush(30) == 0
    winner = Producer({"bootstrap.servers": boot, "transactional.id": tid})
    winner.init_transactions(30)
    winner.begin_transaction()
    winner.produce(dst, b"winner")
    winner.commit_transaction(30)
    with pytest.raises(KafkaException) as fenced:
        zombie.produce(dst, b"zombie-2")
        zombie.commit_transaction(30)
    assert fenced.value.args[0].fatal()

    reader = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"reader-{tid}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    reader.subscribe([dst])
    got: list[bytes] = []
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        got += [r.value() for r in reader.consume(100, 0.3) if r.error() is None]
    reader.close()
    assert got == [b"winner"]


# -- one topic, both protocols -----------------------------------------------------------------


async def test_txnbuf_client_and_kafka_client_see_the_same_committed_messages(
    kafka_broker: KafkaBroker,
) -> None:
    """Committed transactions of a txnbuf producer and of a Kafka producer on
    one topic, and an aborted one of each: a txnbuf subscription and a Kafka
    read_committed consumer read the same messages (key, value, properties
    as headers), and neither reads the aborted ones."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    from client import Client, errors

    boot = kafka_broker.bootstrap
    topic = kafka_broker.topic("shared", partitions=1)
    async with Client(kafka_broker.url) as client:
        consumer = await client.subscribe(topic, "native", initial_position="earliest")
        native = await client.create_producer(topic)
        async with client.transaction() as txn:
            for i in range(3):
                await native.send(
                    b"native-%d" % i, key=f"n{i}", properties={"from": "txnbuf"}, txn=txn
                )
        txn = await client.new_transaction()
        await native.send(b"native-aborted", key="nx", txn=txn)
        await txn.abort()
        await native.send(b"native-plain", key="np", properties={"from": "txnbuf"})

        kafka = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=f"tx-{topic}")
        await kafka.start()
        try:
            async with kafka.transaction():
                for i in range(3):
                    await kafka.send(
                        topic, b"kafka-%d" % i, key=b"k%d" % i, headers=[("from", b"kafka")]
                    )
            await kafka.begin_transaction()
            await kafka.send_and_wait(topic, b"kafka-aborted", key=b"kx")
            await kafka.abort_transaction()
        finally:
            await kafka.stop()

        def as_tuple(key: str | None, value: bytes, props: dict[str, str]) -> tuple[object, ...]:
            return (key, value, tuple(sorted(props.items())))

        native_seen = []
        while True:
            try:
                msg = await consumer.receive(timeout=1.0)
            except errors.OperationTimeoutError:
                break
            native_seen.append(as_tuple(msg.key, msg.value, dict(msg.properties)))
            await consumer.acknowledge(msg)

    reader = AIOKafkaConsumer(
        topic,
        bootstrap_servers=boot,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    await reader.start()
    try:
        kafka_seen = []
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            for rs in (await reader.getmany(timeout_ms=300)).values():
                for r in rs:
                    key = None if r.key is None else r.key.decode()
                    props = {k: v.decode() for k, v in r.headers}
                    kafka_seen.append(as_tuple(key, r.value, props))
    finally:
        await reader.stop()
    expected = {
        *(as_tuple(f"n{i}", b"native-%d" % i, {"from": "txnbuf"}) for i in range(3)),
        as_tuple("np", b"native-plain", {"from": "txnbuf"}),
        *(as_tuple(f"k{i}", b"kafka-%d" % i, {"from": "kafka"}) for i in range(3)),
    }
    assert kafka_seen == native_seen  # the same messages, in the same order
    assert set(kafka_seen) == expected and len(kafka_seen) == len(expected)


# -- crashes -------------------------------------------------------------------------------

CRASH_N = 150
CRASH_KILLS = 2


@pytest.mark.crash
async def test_aiokafka_copier_exactly_once_through_broker_kills(kafka_broker: KafkaBroker) -> None:
    """The aiokafka copier while the broker is SIGKILLed and restarted
    twice: a restart aborts the open transactions (their producers are
    fenced: the copier starts a new producer and consumer, as a restarted
    process would), and the output holds every input exactly once."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import KafkaError

    boot = kafka_broker.bootstrap
    src, dst = kafka_broker.topic("in"), kafka_broker.topic("out")
    group = f"copier-{uuid.uuid4().hex[:6]}"
    values = [b"c%d" % i for i in range(CRASH_N)]
    seeder = AIOKafkaProducer(bootstrap_servers=boot)
    await seeder.start()
    try:
        await asyncio.gather(*(seeder.send_and_wait(src, v, key=v) for v in values))
    finally:
        await seeder.stop()

    committed_txns = 0
    progress = asyncio.Event()  # set on each commit
    copied: set[bytes] = set()  # inputs whose transaction commit_transaction() confirmed
    restarts = 0

    async def copy_once() -> bool:
        """One copier life; True when every input has been copied."""
        nonlocal committed_txns
        consumer = AIOKafkaConsumer(
            src,
            bootstrap_servers=boot,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
            request_timeout_ms=10_000,
        )
        producer = AIOKafkaProducer(
            bootstrap_servers=boot, transactional_id=f"{group}-tx", request_timeout_ms=10_000
        )
        try:
            await consumer.start()
            await producer.start()
            attempts = 0
            while True:
                ends = await consumer.end_offsets([TopicPartition(src, 0), TopicPartition(src, 1)])
                positions = {tp: await consumer.committed(tp) for tp in ends}
                if all(positions[tp] == end for tp, end in ends.items()):
                    return True
                batch = await consumer.getmany(timeout_ms=500, max_records=10)
                records = [r for rs in batch.values() for r in rs]
                if not records:
                    continue
                attempts += 1
                await producer.begin_transaction()
                for r in records:
                    await producer.send(dst, r.value.upper(), key=r.key)
                offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
                await producer.send_offsets_to_transaction(offsets, group)
                if attempts % ABORT_EVERY == 0:
                    await producer.abort_transaction()
                    for tp in batch:
                        c = await consumer.committed(tp)
                        consumer.seek(tp, 0 if c is None else c)
                else:
                    await producer.commit_transaction()
                    committed_txns += 1
                    progress.set()
                    copied.update(r.value for r in records)
        except (TimeoutError, KafkaError, OSError):
            return False
        finally:
            for part in (producer, consumer):
                try:
                    await asyncio.wait_for(part.stop(), 15)
                except Exception:
                    pass

    async def killer() -> None:
        nonlocal restarts
        for kill in range(CRASH_KILLS):
            while committed_txns < 4 * (kill + 1):
                progress.clear()
                await progress.wait()
            await asyncio.to_thread(kafka_broker.kill)
            await asyncio.to_thread(kafka_broker.start)
            restarts += 1

    killing = asyncio.ensure_future(killer())
    deadline = time.monotonic() + 150
    while not await copy_once():
        assert time.monotonic() < deadline, "the copier did not finish"
        await asyncio.sleep(0.2)
    await killing
    assert restarts == CRASH_KILLS
    assert copied == set(values)

    reader = AIOKafkaConsumer(
        dst, bootstrap_servers=boot, auto_offset_reset="earliest", isolation_level="read_committed"
    )
    await reader.start()
    try:
        got: list[bytes] = []
        quiet_until = time.monotonic() + 2
        while time.monotonic() < quiet_until or len(got) < CRASH_N:
            batch = await reader.getmany(timeout_ms=300)
            got += [r.value for rs in batch.values() for r in rs]
            assert time.monotonic() < deadline, f"read {len(got)} of {CRASH_N}"
    finally:
        await reader.stop()
    assert Counter(got) == Counter(v.upper() for v in values)


async def test_a_fetch_reads_every_entry_of_a_long_partition(kafka_broker: KafkaBroker) -> None:
    """More entries than one read of the ledger takes (`READ_ENTRIES`) in
    one fetch: every message, in order, once."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    boot = kafka_broker.bootstrap
    topic = kafka_broker.topic("long", partitions=1)
    producer = AIOKafkaProducer(bootstrap_servers=boot)
    await producer.start()
    try:
        for i in range(300):  # one entry each
            await producer.send_and_wait(topic, b"%d." % i)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(bootstrap_servers=boot)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        got: list[int] = []
        deadline = time.monotonic() + 20
        while len(got) < 300 and time.monotonic() < deadline:
            for r in (await consumer.getmany(tp, timeout_ms=500)).get(tp, []):
                got.append(int(r.value.split(b".")[0]))
    finally:
        await consumer.stop()
    assert got == list(range(300))
