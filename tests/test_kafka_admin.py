"""Kafka's admin APIs, compression codecs and ListOffsets by timestamp, with
unmodified clients against a real broker process: kafka-python's
KafkaAdminClient, confluent-kafka's AdminClient and aiokafka's
AIOKafkaAdminClient (each for what it offers), checked against what the
broker's own admin API shows; lz4, zstd, snappy and gzip from each client's
producer, read back by each client's consumer; offsets_for_times in each.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_kafka import (
    KAFKA_PYTHON_WARNINGS,
    KafkaBroker,
    aiokafka_read,
    confluent_read,
    kafka_python_read,
)

pytestmark = [pytest.mark.integration]

CODECS = ["gzip", "snappy", "lz4", "zstd"]


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


def admin_json(broker: KafkaBroker, path: str) -> Any:
    status, body = broker.admin("GET", path)
    assert status == 200, body
    return json.loads(body)


def topic_names(broker: KafkaBroker) -> set[str]:
    return {t["name"] for t in admin_json(broker, "/admin/v1/topics")["topics"]}


def subscriptions(broker: KafkaBroker, topic: str) -> set[str]:
    subs = admin_json(broker, f"/admin/v1/topics/{topic}/subscriptions")["subscriptions"]
    return {s["name"] for s in subs}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# -- kafka-python's KafkaAdminClient ------------------------------------------------------


@KAFKA_PYTHON_WARNINGS
def test_kafka_python_admin_client(kafka_broker: KafkaBroker) -> None:
    """Every admin API kafka-python has a call for, on the state the
    broker's admin API shows."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import (
        ConfigResource,
        ConfigResourceType,
        KafkaAdminClient,
        NewPartitions,
        NewTopic,
    )
    from kafka.errors import (
        InvalidConfigurationError,
        InvalidPartitionsError,
        InvalidReplicationFactorError,
        TopicAlreadyExistsError,
    )

    boot = kafka_broker.bootstrap
    admin = KafkaAdminClient(bootstrap_servers=boot)
    a, b, c = unique("kp-a"), unique("kp-b"), unique("kp-c")
    try:
        admin.create_topics(
            [NewTopic(a, 2, 1), NewTopic(b, 1, -1, topic_configs={"retention.ms": "60000"})]
        )
        assert {a, b} <= topic_names(kafka_broker)
        assert admin_json(kafka_broker, f"/admin/v1/topics/{b}")["retention"] == {
            "time_s": 60.0,
            "size_bytes": -1,
        }
        admin.create_topics([NewTopic(c, 3, 1)], validate_only=True)  # (checked, not made)
        assert c not in topic_names(kafka_broker)
        for refused, error in (
            (NewTopic(a, 1, 1), TopicAlreadyExistsError),
            (NewTopic(c, 1, 3), InvalidReplicationFactorError),
            (
                NewTopic(c, 1, 1, topic_configs={"cleanup.policy": "compact"}),
                InvalidConfigurationError,
            ),
            (NewTopic(c, 5000, 1), InvalidPartitionsError),
        ):
            with pytest.raises(error):
                admin.create_topics([refused])
        assert c not in topic_names(kafka_broker)

        admin.create_partitions({a: NewPartitions(3)})
        assert admin_json(kafka_broker, f"/admin/v1/topics/{a}")["partitions"] == 3
        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({a: NewPartitions(2)})

        configs = admin.describe_configs(
            [
                ConfigResource(ConfigResourceType.TOPIC, b),
                ConfigResource(ConfigResourceType.BROKER, "0"),
            ],
            config_filter="all",
        )
        assert configs["topic"][b]["retention.ms"]["value"] == "60000"
        assert configs["topic"][b]["retention.bytes"]["value"] == "-1"
        assert configs["broker"]["0"]["transaction.max.timeout.ms"]["value"] == "900000"

        cluster = admin.describe_cluster()
        assert cluster["cluster_id"] == "txnbuf"
        assert [b["broker_id"] for b in cluster["brokers"]] == [0]

        # A transaction open on partition 0 of `a`, a group consuming `a`.
        tid, group = unique("kp-tx"), unique("kp-g")
        producer = KafkaProducer(bootstrap_servers=boot, transactional_id=tid)
        consumer = KafkaConsumer(
            a, bootstrap_servers=boot, group_id=group, auto_offset_reset="earliest"
        )
        try:
            producer.init_transactions()
            producer.begin_transaction()
            producer.send(a, b"x", partition=0).get(10)
            deadline = time.monotonic() + 20
            while not consumer.assignment() and time.monotonic() < deadline:
                consumer.poll(200)
            consumer.commit({TopicPartition(a, i): _offset(0) for i in range(3)})

            listed = {g["group_id"]: g for g in admin.list_groups()}
            assert listed[group]["group_state"] == "Stable"
            assert listed[group]["protocol_type"] == "consumer"
            described = admin.describe_groups([group])[group]
            (member,) = described["members"]
            assert member["member_metadata"]["topics"] == [a]
            assert member["client_host"] == "127.0.0.1"
            assert group in subscriptions(kafka_broker, a)
            assert admin.delete_groups([group])[group] == "NonEmptyGroupError"
            offsets = [TopicPartition(a, i) for i in range(3)]
            assert set(admin.delete_group_offsets(group, offsets).values()) == {
                __import__("kafka.errors", fromlist=["x"]).GroupSubscribedToTopicError
            }

            (listing,) = [t for t in admin.list_transactions()[0] if t.transactional_id == tid]
            assert listing.state.value == "Ongoing"
            state = admin_json(kafka_broker, f"/admin/v1/producers/{tid}")
            assert listing.producer_id == state["producer_id"]
            txn = admin.describe_transactions([tid])[tid]
            assert (txn.state.value, txn.producer_epoch) == ("Ongoing", state["producer_epoch"])
            assert txn.topic_partitions == {TopicPartition(a, 0)}
            assert txn.transaction_start_time_ms > 0
            (active,) = admin.describe_producers([TopicPartition(a, 0)])[
                TopicPartition(a, 0)
            ].active_producers
            assert (active.producer_id, active.producer_epoch) == (
                state["producer_id"],
                state["producer_epoch"],
            )
            assert active.current_transaction_start_offset >= 0
            producer.commit_transaction()
            assert admin.describe_transactions([tid])[tid].state.value == "CompleteCommit"
        finally:
            producer.close()
            consumer.close()
        assert set(admin.delete_group_offsets(group, [TopicPartition(a, 0)]).values()) == {
            __import__("kafka.errors", fromlist=["x"]).InvalidRequestError
        }  # (a group's offsets on a topic go all at once)
        assert group in subscriptions(kafka_broker, a)
        admin.delete_group_offsets(group, [TopicPartition(a, i) for i in range(3)])
        assert group not in subscriptions(kafka_broker, a)
        consumer = KafkaConsumer(bootstrap_servers=boot, group_id=group)
        consumer.commit({TopicPartition(a, 0): _offset(0)})
        consumer.close()
        assert admin.delete_groups([group])[group] == "OK"
        assert group not in subscriptions(kafka_broker, a)
        assert group not in {g["group_id"] for g in admin.list_groups()}

        from kafka.errors import GroupIdNotFoundError

        with pytest.raises(GroupIdNotFoundError):
            admin.delete_group_offsets(unique("none"), [TopicPartition(a, 0)])
        admin.delete_topics([b])
        assert b not in topic_names(kafka_broker)
    finally:
        admin.close()


def _offset(n: int) -> Any:
    from kafka.structs import OffsetAndMetadata

    return OffsetAndMetadata(n, "", -1)


# -- confluent-kafka's AdminClient -----------------------------------------------------------


def test_confluent_kafka_admin_client(kafka_broker: KafkaBroker) -> None:
    from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
    from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic

    boot = kafka_broker.bootstrap
    admin = AdminClient({"bootstrap.servers": boot})
    a, b = unique("cf-a"), unique("cf-b")
    for f in admin.create_topics(
        [NewTopic(a, 2, 1), NewTopic(b, 1, 1, config={"retention.bytes": "1000000"})]
    ).values():
        f.result(20)
    assert {a, b} <= topic_names(kafka_broker)
    with pytest.raises(KafkaException) as refused:
        admin.create_topics([NewTopic(a, 2, 1)])[a].result(20)
    assert refused.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS
    admin.create_partitions([NewPartitions(a, 4)])[a].result(20)
    assert admin_json(kafka_broker, f"/admin/v1/topics/{a}")["partitions"] == 4
    configs = admin.describe_configs([ConfigResource("topic", b)])
    (entries,) = [f.result(20) for f in configs.values()]
    assert entries["retention.bytes"].value == "1000000"
    cluster = admin.describe_cluster().result(20)
    assert cluster.cluster_id == "txnbuf" and [n.id for n in cluster.nodes] == [0]

    group = unique("cf-g")
    consumer = Consumer(
        {"bootstrap.servers": boot, "group.id": group, "auto.offset.reset": "earliest"}
    )
    try:
        consumer.subscribe([a])
        deadline = time.monotonic() + 20
        while not consumer.assignment() and time.monotonic() < deadline:
            consumer.poll(0.2)
        consumer.commit(offsets=[TopicPartition(a, i, 0) for i in range(4)], asynchronous=False)
        listed = admin.list_consumer_groups().result(20)
        assert group in {g.group_id for g in listed.valid}
        (described,) = [f.result(20) for f in admin.describe_consumer_groups([group]).values()]
        assert described.state.name == "STABLE" and len(described.members) == 1
        with pytest.raises(KafkaException) as refused:
            admin.delete_consumer_groups([group])[group].result(20)
        assert refused.value.args[0].code() == KafkaError.NON_EMPTY_GROUP
    finally:
        consumer.close()
    admin.delete_consumer_groups([group])[group].result(20)
    assert group not in subscriptions(kafka_broker, a)
    admin.delete_topics([b])[b].result(20)
    assert b not in topic_names(kafka_broker)


# -- aiokafka's AIOKafkaAdminClient -------------------------------------------------------


async def test_aiokafka_admin_client(kafka_broker: KafkaBroker) -> None:
    from aiokafka import AIOKafkaConsumer
    from aiokafka.admin import AIOKafkaAdminClient, NewPartitions, NewTopic
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    boot = kafka_broker.bootstrap
    admin = AIOKafkaAdminClient(bootstrap_servers=boot)
    await admin.start()
    a, b = unique("aio-a"), unique("aio-b")
    try:
        created = await admin.create_topics(
            [NewTopic(a, 2, 1), NewTopic(b, 1, 1, topic_configs={"retention.ms": "-1"})]
        )
        assert [e[1] for e in created.topic_errors] == [0, 0]
        assert {a, b} <= set(await admin.list_topics())
        refused = await admin.create_topics([NewTopic(a, 2, 1)])
        assert refused.topic_errors[0][1] == 36  # TOPIC_ALREADY_EXISTS
        grown = await admin.create_partitions({a: NewPartitions(3)})
        assert grown.topic_errors[0][1] == 0
        assert admin_json(kafka_broker, f"/admin/v1/topics/{a}")["partitions"] == 3
        (configs,) = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, b)])
        entries = {e[0]: e[1] for e in configs.resources[0][4]}
        assert entries["retention.ms"] == "-1"
        assert (await admin.describe_cluster())["cluster_id"] == "txnbuf"

        group = unique("aio-g")
        consumer = AIOKafkaConsumer(a, bootstrap_servers=boot, group_id=group)
        await consumer.start()
        try:
            deadline = time.monotonic() + 20
            while not consumer.assignment() and time.monotonic() < deadline:
                await consumer.getmany(timeout_ms=200)
            assert (group, "consumer") in await admin.list_consumer_groups()
            # (one group per call: aiokafka reads a DescribeGroups v3 answer
            # as v2, which holds for the last group only)
            (described,) = await admin.describe_consumer_groups([group])
            (row,) = described.groups
            assert (row[1], row[2], row[3], len(row[5])) == (group, "Stable", "consumer", 1)
        finally:
            await consumer.stop()
        deleted = await admin.delete_topics([b])
        assert deleted.topic_error_codes[0][1] == 0
        assert b not in topic_names(kafka_broker)
    finally:
        await admin.close()


# -- compression --------------------------------------------------------------------------


def _kafka_python_produce(boot: str, topic: str, codec: str, values: list[bytes]) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=boot, compression_type=codec, linger_ms=20)
    for v in values:
        producer.send(topic, v)
    producer.flush()
    producer.close()


async def _aiokafka_produce(boot: str, topic: str, codec: str, values: list[bytes]) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=boot, compression_type=codec, linger_ms=20)
    await producer.start()
    try:
        await asyncio.gather(*[await producer.send(topic, v) for v in values])
    finally:
        await producer.stop()


def _confluent_produce(boot: str, topic: str, codec: str, values: list[bytes]) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": boot, "compression.type": codec, "linger.ms": 20})
    for v in values:
        producer.produce(topic, v)
    assert producer.flush(30) == 0


@KAFKA_PYTHON_WARNINGS
async def test_every_client_produces_with_every_codec_and_every_client_reads_it(
    kafka_broker: KafkaBroker,
) -> None:
    """Batches of several records compressed with gzip, snappy, lz4 and zstd
    by each client's producer (linger: several records a batch), stored as
    they were sent; read back, uncompressed, by each client's consumer."""
    boot = kafka_broker.bootstrap
    topic = kafka_broker.topic("codecs", partitions=1)
    sent = []
    for codec in CODECS:
        for client in ("kafka-python", "aiokafka", "confluent"):
            values = [b"%s %s %d " % (client.encode(), codec.encode(), i) * 30 for i in range(15)]
            sent += values
            if client == "aiokafka":
                await _aiokafka_produce(boot, topic, codec, values)
            elif client == "kafka-python":
                await asyncio.to_thread(_kafka_python_produce, boot, topic, codec, values)
            else:
                await asyncio.to_thread(_confluent_produce, boot, topic, codec, values)
    stats = admin_json(kafka_broker, f"/admin/v1/topics/{topic}/stats")["partitions"][0]
    assert stats["messages"] == len(sent)
    assert stats["entries"] < len(sent)  # (batches of several records)
    for read in (aiokafka_read, asyncio_thread(kafka_python_read), asyncio_thread(confluent_read)):
        assert sorted(await read(boot, topic, len(sent))) == sorted(sent)
        # (each reader's group starts from the start: the one before it goes)
        status, _ = kafka_broker.admin(
            "DELETE", f"/admin/v1/topics/{topic}/subscriptions/reader-{topic}"
        )
        assert status == 200


def asyncio_thread(fn: Any) -> Any:
    async def run(*args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    return run


# -- ListOffsets by timestamp -------------------------------------------------------------


@KAFKA_PYTHON_WARNINGS
async def test_offsets_for_times_in_every_client(kafka_broker: KafkaBroker) -> None:
    """The first offset of a message published at or after a time, on the
    publish times the producer gave: in a batch of several (the second
    of three), at an entry's start, before everything; none after the
    last (None, or -1 in librdkafka)."""
    from aiokafka import AIOKafkaConsumer
    from confluent_kafka import Consumer
    from confluent_kafka import TopicPartition as ConfluentPartition
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    boot = kafka_broker.bootstrap
    topic = kafka_broker.topic("times", partitions=1)
    base = 1_700_000_000_000
    # (a long linger: each flush sends the three records before it as one batch)
    producer = KafkaProducer(bootstrap_servers=boot, linger_ms=60_000)
    for i in range(9):  # three entries of three messages, one second apart
        producer.send(topic, b"%d" % i, partition=0, timestamp_ms=base + i * 1000)
        if i % 3 == 2:
            producer.flush()
    producer.close()
    tp = TopicPartition(topic, 0)
    reader = KafkaConsumer(bootstrap_servers=boot)
    try:
        offsets = {t: reader.offsets_for_times({tp: t})[tp] for t in (base + 4500, base + 3000, 0)}
        assert reader.offsets_for_times({tp: base + 9000})[tp] is None
    finally:
        reader.close()
    at = {t: (o.offset, o.timestamp) for t, o in offsets.items()}
    assert at[base + 3000][1] == base + 3000 and at[base + 4500][1] == base + 5000
    assert at[0] == (0, base)
    assert at[base + 4500][0] == at[base + 3000][0] + 2  # (the same entry, 2 on)
    # Each message read from the offset found is the one published then.
    aio = AIOKafkaConsumer(bootstrap_servers=boot)
    await aio.start()
    try:
        found = await aio.offsets_for_times({tp: base + 4500})
        assert (found[tp].offset, found[tp].timestamp) == at[base + 4500]
        aio.assign([tp])
        aio.seek(tp, found[tp].offset)
        first = await aio.getone()
        assert (first.value, first.timestamp) == (b"5", base + 5000)
    finally:
        await aio.stop()
    confluent = Consumer({"bootstrap.servers": boot, "group.id": unique("times")})
    try:
        (found_cf,) = confluent.offsets_for_times([ConfluentPartition(topic, 0, base + 4500)], 20)
        assert found_cf.offset == at[base + 4500][0]
        (none_cf,) = confluent.offsets_for_times([ConfluentPartition(topic, 0, base + 9000)], 20)
        assert none_cf.offset == -1
    finally:
        confluent.close()
