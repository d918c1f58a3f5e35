"""The Kafka listener in a cluster: three brokers over one PostgreSQL, each
with a Kafka listener, as real processes; and the listener's view of the
cluster (`broker.kafka._cluster`) on fakes of the membership.

With real processes: Metadata at every broker lists the three brokers, each
partition's leader (its slot's owner) and leader epoch (its slot's epoch)
as the slots table has them, and the owner of slot 0 as the controller;
FindCoordinator answers the owner of a group's and a transactional id's
slot; at a broker that does not own a slot, Produce, Fetch and ListOffsets
are refused NOT_LEADER_OR_FOLLOWER and the group and transaction APIs
NOT_COORDINATOR, changing nothing; plain Kafka producers and consumer
groups bootstrapped at one broker reach the topics of every broker; a
group whose coordinator is another broker than its topic's owner commits
and fetches its offsets there (forwarded, GROUP_CURSORS); and each of the
three Kafka clients' transactional copier copies every input record
exactly once across a SIGKILL of the broker owning its partitions and its
coordinator (two of them with their group away from their source). Tests
wait for conditions, never for a length of time.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import signal
import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from kio.schema.add_partitions_to_txn.v1 import request as add_partitions
from kio.schema.create_topics.v7 import request as create_topics
from kio.schema.describe_groups.v0 import request as describe_groups
from kio.schema.fetch.v11 import request as fetch
from kio.schema.find_coordinator.v1 import request as find_coordinator
from kio.schema.find_coordinator.v4 import request as find_coordinator_v4
from kio.schema.heartbeat.v0 import request as heartbeat
from kio.schema.init_producer_id.v1 import request as init_producer_id
from kio.schema.list_offsets.v5 import request as list_offsets
from kio.schema.metadata.v8 import request as metadata
from kio.schema.produce.v8 import request as produce

from broker._auth import create_secret_key
from broker._slots import slot_of_key
from broker.kafka._cluster import (
    COORDINATOR_LOAD_IN_PROGRESS,
    COORDINATOR_NOT_AVAILABLE,
    LEADER_NOT_AVAILABLE,
    NOT_COORDINATOR,
    NOT_LEADER_OR_FOLLOWER,
    KafkaCluster,
    node_id,
)
from broker.kafka._codec import Api
from broker.kafka._records import data_batch
from broker.kafka._session import KafkaError
from client import Client, errors
from cluster import SlotRow, View, kafka_address, service_url
from proto import txnbuf_pb2 as pb
from tc import producer_id
from tests.conftest import BrokerProcess, free_port
from tests.kafka_copier import PLAINTEXT
from tests.test_cluster_brokers import (
    SLOTS,
    logs,  # noqa: F401 (a fixture)
    owner_id,
    owners,
    slots,
    wait_for,
)
from tests.test_cluster_clients import settled
from tests.test_kafka import (
    AIOKAFKA,
    CONFLUENT_KAFKA,
    KAFKA_PYTHON,
    KAFKA_PYTHON_WARNINGS,
    Copier,
    KafkaClient,
)
from tests.test_kafka_security import RawKafka, bearer
from tests.test_kafka_unit import kafka_python_batch
from tests.test_security import grant

pytestmark = pytest.mark.integration

TOPIC_AUTHORIZATION_FAILED = 29
INVALID_REQUEST = 42
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
TTL = 2.0  # seconds of lease: a SIGKILLed broker's slots move within it and a look


# -- the listener's view, on fakes ------------------------------------------------------


def _fake(served: set[int], held: dict[int, int], view: View, kafka: dict[str, str]) -> Any:
    async def fresh() -> None:  # (the tables read again: nothing changed)
        host.reads += 1

    host = SimpleNamespace(
        me="me",
        served=served,
        member=SimpleNamespace(held=held),
        membership=SimpleNamespace(last_view=view, last_kafka=kafka),
        reads=0,
        _fresh=fresh,
    )
    broker = SimpleNamespace(store=SimpleNamespace(slot_count=4), coordinators={0: object()})
    return KafkaCluster(broker, host, "h:1")  # type: ignore[arg-type]


def key_in(slot: int, slots: int, prefix: str) -> str:
    i = 0
    while slot_of_key(f"{prefix}{i}", slots) != slot:
        i += 1
    return f"{prefix}{i}"


async def test_the_listener_answers_leaders_and_coordinators_from_the_last_look() -> None:
    # Slot 0 served here (epoch 3); slot 1 taken, loading; slot 2 owned by a
    # live broker b; slot 3 by c, whose lease ran out.
    view = View(
        100.0,
        {"me": 105.0, "b": 105.0, "c": 99.0},
        (SlotRow("me", 3), SlotRow("me", 5), SlotRow("b", 7), SlotRow("c", 2)),
    )
    kc = _fake({0}, {0: 3, 1: 5}, view, {"me": "h:1", "b": "hb:2", "c": "hc:3"})
    me, b = node_id("h:1"), node_id("hb:2")
    assert kc.brokers() == [(me, "h", 1), (b, "hb", 2)]  # (c is not live)
    assert kc.controller() == me
    t = [key_in(k, 4, "t") for k in range(4)]
    assert [kc.leader(name) for name in t] == [(me, 3), None, (b, 7), None]
    kc.check_leader(t[0])
    for name in t[1:]:
        with pytest.raises(KafkaError) as refused:
            kc.check_leader(name)
        assert refused.value.code == NOT_LEADER_OR_FOLLOWER
    # Coordinators: here; loading here; at b; nobody (being taken over).
    assert kc.check_coordinator(t[0], "group") == 0
    assert await kc.coordinator(t[0]) == (me, "h", 1)
    with pytest.raises(KafkaError) as refused:
        kc.check_coordinator(t[1], "group")
    assert refused.value.code == COORDINATOR_LOAD_IN_PROGRESS
    assert await kc.coordinator(t[1]) == (me, "h", 1)
    with pytest.raises(KafkaError) as refused:
        kc.check_coordinator(t[2], "transactional id", tcid=True)
    assert refused.value.code == NOT_COORDINATOR
    assert await kc.coordinator(t[2]) == (b, "hb", 2)
    with pytest.raises(KafkaError) as refused:
        await kc.coordinator(t[3])
    assert refused.value.code == COORDINATOR_NOT_AVAILABLE
    assert kc.host.reads == 1  # (no live owner: the tables were read again first)
    # A slot served whose transaction coordinator is not open yet: loading.
    kc = _fake({0, 1}, {0: 3, 1: 5}, view, {"me": "h:1"})
    assert kc.check_coordinator(t[1], "group") == 1
    with pytest.raises(KafkaError) as refused:
        kc.check_coordinator(t[1], "transactional id", tcid=True)
    assert refused.value.code == COORDINATOR_LOAD_IN_PROGRESS
    # A Kafka transaction's participant here: its coordinator here, on
    # another broker (checked with over the peers' channel), or loading here.
    kc = _fake({0, 1}, {0: 3, 1: 5}, view, {"me": "h:1"})
    assert kc.coordinator_here(producer_id(0, 7), "partition t-0") is True
    assert kc.coordinator_here(producer_id(2, 7), "partition t-0") is False
    with pytest.raises(KafkaError) as refused:
        kc.coordinator_here(producer_id(1, 7), "partition t-0")
    assert refused.value.code == COORDINATOR_LOAD_IN_PROGRESS
    # A broker restarted at its address (a second row, the first one's lease
    # still running) is one node.
    twice = View(100.0, {"me": 105.0, "b": 105.0, "b2": 105.0}, view.slots)
    kc = _fake({0}, {0: 3}, twice, {"me": "h:1", "b": "hb:2", "b2": "hb:2"})
    assert kc.brokers() == [(me, "h", 1), (b, "hb", 2)]
    # A live owner without a Kafka listener leads nothing Kafka clients reach.
    kc = _fake(set(), {}, view, {"me": "h:1"})
    assert kc.leader(t[2]) is None and kc.brokers() == [(me, "h", 1)]


def test_a_membership_rows_urls_hold_the_service_url_and_the_kafka_address() -> None:
    assert service_url("http://a:6650,kafka://a:9092") == "http://a:6650"
    assert kafka_address("http://a:6650,kafka://a:9092") == "a:9092"
    assert (service_url("http://a:6650"), kafka_address("http://a:6650")) == (
        "http://a:6650",
        None,
    )


# -- three brokers ---------------------------------------------------------------------


class KafkaClusterBroker(BrokerProcess):
    """A cluster broker (`--cluster`) with a Kafka listener; ``key``: it
    authenticates tokens signed with that secret key (shared by the
    cluster's brokers)."""

    def __init__(self, tmp_path: Path, url: str, name: str, key: Path | None = None) -> None:
        super().__init__(tmp_path / name, tmp_path / f"{name}.log", store=url)
        if key is not None:
            self.secret_key_file = key
            self.token = self.make_token("admin")
        self.kafka_port = free_port()
        self.args = ["--cluster", "--lease-ttl", str(TTL), "--kafka-port", str(self.kafka_port)]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def node(self) -> int:
        return node_id(self.address)


def start_kafka_cluster(
    tmp_path: Path, url: str, procs: list[BrokerProcess], key: Path | None = None
) -> list[Any]:
    for i in range(3):
        proc = KafkaClusterBroker(tmp_path, url, f"b{i}", key)
        procs.append(proc)
        proc.start()
    return list(procs)


def bootstrap(procs: list[Any]) -> str:
    return ",".join(p.address for p in procs)


async def owner_of(url: str, slot: int, procs: list[Any]) -> Any:
    found = await owners(url)
    for proc in procs:
        if slot in found.get(owner_id(proc), set()):
            return proc
    raise AssertionError(f"slot {slot} is owned by none of the brokers: {found}")


def create_topic(owner: BrokerProcess, name: str, partitions: int = 2) -> None:
    """Create ``name`` at the owner of its slot (which writes its topic list)."""
    status, body = owner.admin(
        "PUT", f"/admin/v1/topics/{name}", b'{"partitions": %d}' % partitions
    )
    assert status == 200, body


def spread_names(
    src_slot: int, dst_slot: int, tx_slot: int, group_slot: int | None = None
) -> tuple[str, str, str]:
    """(source topic, destination topic, group): the source in ``src_slot``,
    the group in ``group_slot`` (by default the source's: the group's
    offsets are the cursors of the source's partitions, kept by its owner),
    the destination in ``dst_slot``, the copier's transactional id
    (``<group>-tx``, `tests.kafka_copier`) in ``tx_slot``."""
    src = key_in(src_slot, SLOTS, f"in-{uuid.uuid4().hex[:4]}-")
    dst = key_in(dst_slot, SLOTS, f"out-{uuid.uuid4().hex[:4]}-")
    prefix = f"copier-{uuid.uuid4().hex[:4]}-"
    group_slot = src_slot if group_slot is None else group_slot
    i = 0
    while not (
        slot_of_key(f"{prefix}{i}", SLOTS) == group_slot
        and slot_of_key(f"{prefix}{i}-tx", SLOTS) == tx_slot
    ):
        i += 1
    return src, dst, f"{prefix}{i}"


async def metadata_matches(proc: Any, procs: list[Any], url: str, topics: list[str]) -> bool:
    """Metadata at ``proc`` names the brokers, leaders, leader epochs and
    controller the slots table has now."""
    table = {slot: (owner, epoch) for slot, owner, epoch in await slots(url)}
    nodes = {owner_id(p): p for p in procs}
    req = metadata.MetadataRequest(
        topics=tuple(metadata.MetadataRequestTopic(name=t) for t in topics),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    body = await asyncio.to_thread(_ask, proc, Api.METADATA, 8, req)
    brokers = sorted((b.node_id, b.host, b.port) for b in body.brokers)
    if brokers != sorted((p.node, "127.0.0.1", p.kafka_port) for p in procs):
        return False
    owner0 = table[0][0]
    if owner0 not in nodes or body.controller_id != nodes[owner0].node:
        return False
    for topic in body.topics:
        owner, epoch = table[slot_of_key(topic.name, SLOTS)]
        if topic.error_code or owner not in nodes or len(topic.partitions) != 2:
            return False
        for part in topic.partitions:
            if (part.error_code, part.leader_id, part.leader_epoch) != (
                0,
                nodes[owner].node,
                epoch,
            ):
                return False
    return True


def _describe_cluster(boot: str) -> Any:
    from kafka import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=boot)
    try:
        return admin.describe_cluster()
    finally:
        admin.close()


def _ask(proc: Any, api: Api, version: int, req: object) -> Any:
    """One request (a kio request object) at ``proc``'s Kafka listener, on a
    connection of its own; its decoded answer."""
    raw = RawKafka(proc.kafka_port)
    try:
        return raw.call(api, version, req)
    finally:
        raw.close()


@KAFKA_PYTHON_WARNINGS
async def test_metadata_coordinators_and_refusals_follow_the_slots_table(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    procs = start_kafka_cluster(tmp_path, pg_url, logs)
    await wait_for("slots placed on the 3 brokers", lambda: settled(pg_url, procs))
    found = await owners(pg_url)
    mine = {p.node: min(found[owner_id(p)]) for p in procs}  # a slot of each broker
    topics = [key_in(mine[p.node], SLOTS, "k") for p in procs]
    for proc, topic in zip(procs, topics, strict=True):
        create_topic(proc, topic)
    for proc in procs:
        await wait_for(
            f"Metadata at {proc.address} as the slots table",
            lambda proc=proc: metadata_matches(proc, procs, pg_url, topics),
        )
    # Every topic, asked at one broker: those of every broker's slots.
    every = metadata.MetadataRequest(
        topics=None,
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )
    body = await asyncio.to_thread(_ask, procs[0], Api.METADATA, 8, every)
    assert {t.name for t in body.topics} == set(topics)
    # DescribeCluster (kafka-python's admin client): the same brokers and controller.
    table = await slots(pg_url)
    controller = next(p.node for p in procs if owner_id(p) == table[0][1])
    described = await asyncio.to_thread(_describe_cluster, procs[2].address)
    assert described["controller_id"] == controller
    assert sorted((b["broker_id"], b["port"]) for b in described["brokers"]) == sorted(
        (p.node, p.kafka_port) for p in procs
    )
    # FindCoordinator: the owner of the group's or transactional id's slot,
    # at every broker.
    for owner in procs:
        key = key_in(mine[owner.node], SLOTS, "g")
        for asked in procs:
            for key_type in (0, 1):
                req = find_coordinator.FindCoordinatorRequest(key=key, key_type=key_type)
                body = await asyncio.to_thread(_ask, asked, Api.FIND_COORDINATOR, 1, req)
                assert (body.error_code, body.node_id, body.port) == (
                    0,
                    owner.node,
                    owner.kafka_port,
                )
    # FindCoordinator v4: several keys in one request.
    keys = tuple(key_in(mine[p.node], SLOTS, "g") for p in procs)
    batch = find_coordinator_v4.FindCoordinatorRequest(key_type=0, coordinator_keys=keys)
    body = await asyncio.to_thread(_ask, procs[0], Api.FIND_COORDINATOR, 4, batch)
    assert [(c.key, c.error_code, c.node_id) for c in body.coordinators] == [
        (k, 0, p.node) for k, p in zip(keys, procs, strict=True)
    ]
    # At a broker that does not own the slot: refused, nothing changed.
    a, b = procs[0], procs[1]
    topic = topics[1]  # (b's)
    records = kafka_python_batch([(b"k", b"v", [])])
    produced = produce.ProduceRequest(
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=5),
        topic_data=(
            produce.TopicProduceData(
                name=topic, partition_data=(produce.PartitionProduceData(index=0, records=records),)
            ),
        ),
    )
    body = await asyncio.to_thread(_ask, a, Api.PRODUCE, 8, produced)
    assert body.responses[0].partition_responses[0].error_code == NOT_LEADER_OR_FOLLOWER
    fetched = fetch.FetchRequest(
        replica_id=-1,
        max_wait=datetime.timedelta(0),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=1,
        session_id=0,
        session_epoch=-1,
        topics=(
            fetch.FetchTopic(
                topic=topic,
                partitions=(
                    fetch.FetchPartition(
                        partition=0,
                        current_leader_epoch=-1,
                        fetch_offset=0,
                        log_start_offset=-1,
                        partition_max_bytes=1 << 20,
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
    body = await asyncio.to_thread(_ask, a, Api.FETCH, 11, fetched)
    assert body.responses[0].partitions[0].error_code == NOT_LEADER_OR_FOLLOWER
    listed = list_offsets.ListOffsetsRequest(
        replica_id=-1,
        isolation_level=1,
        topics=(
            list_offsets.ListOffsetsTopic(
                name=topic,
                partitions=(
                    list_offsets.ListOffsetsPartition(
                        partition_index=0, current_leader_epoch=-1, timestamp=-1
                    ),
                ),
            ),
        ),
    )
    body = await asyncio.to_thread(_ask, a, Api.LIST_OFFSETS, 5, listed)
    assert body.topics[0].partitions[0].error_code == NOT_LEADER_OR_FOLLOWER
    body = await asyncio.to_thread(_ask, b, Api.LIST_OFFSETS, 5, listed)  # (its leader)
    part = body.topics[0].partitions[0]
    assert (part.error_code, part.offset) == (0, 0)
    assert part.leader_epoch == (await slots(pg_url))[slot_of_key(topic, SLOTS)][2]
    group = key_in(mine[b.node], SLOTS, "g")
    beat = heartbeat.HeartbeatRequest(group_id=group, generation_id=1, member_id="m")
    body = await asyncio.to_thread(_ask, a, Api.HEARTBEAT, 0, beat)
    assert body.error_code == NOT_COORDINATOR
    described = describe_groups.DescribeGroupsRequest(groups=(group,))
    body = await asyncio.to_thread(_ask, a, Api.DESCRIBE_GROUPS, 0, described)
    assert body.groups[0].error_code == NOT_COORDINATOR
    init = init_producer_id.InitProducerIdRequest(
        transactional_id=group, transaction_timeout=datetime.timedelta(seconds=10)
    )
    body = await asyncio.to_thread(_ask, a, Api.INIT_PRODUCER_ID, 1, init)
    assert body.error_code == NOT_COORDINATOR
    # CreateTopics at a for a topic of b's slot: refused, saying where; not created.
    new_topic = key_in(mine[b.node], SLOTS, "new-")
    created = create_topics.CreateTopicsRequest(
        topics=(
            create_topics.CreatableTopic(
                name=new_topic, num_partitions=1, replication_factor=-1, assignments=(), configs=()
            ),
        ),
        timeout=datetime.timedelta(seconds=5),
        validate_only=False,
    )
    body = await asyncio.to_thread(_ask, a, Api.CREATE_TOPICS, 7, created)
    assert (body.topics[0].error_code, "owner of its slot" in body.topics[0].error_message) == (
        INVALID_REQUEST,
        True,
    )
    assert b.admin("GET", f"/admin/v1/topics/{new_topic}/stats")[0] == 404
    # A transaction of a's coordinator adding a partition of b's: recorded
    # (b checks each of its sends with a's coordinator); nothing stored yet.
    init = init_producer_id.InitProducerIdRequest(
        transactional_id=key_in(mine[a.node], SLOTS, "tx"),
        transaction_timeout=datetime.timedelta(seconds=10),
    )
    body = await asyncio.to_thread(_ask, a, Api.INIT_PRODUCER_ID, 1, init)
    assert body.error_code == 0
    add = add_partitions.AddPartitionsToTxnRequest(
        v3_and_below_transactional_id=init.transactional_id,
        v3_and_below_producer_id=body.producer_id,
        v3_and_below_producer_epoch=body.producer_epoch,
        v3_and_below_topics=(add_partitions.AddPartitionsToTxnTopic(name=topic, partitions=(0,)),),
    )
    body = await asyncio.to_thread(_ask, a, Api.ADD_PARTITIONS_TO_TXN, 1, add)
    result = body.results_by_topic_v3_and_below[0].results_by_partition[0]
    assert result.partition_error_code == 0
    status, stats = b.admin("GET", f"/admin/v1/topics/{topic}/stats")
    assert status == 200 and b'"messages": 0' in stats.replace(b'"messages":0', b'"messages": 0')
    # Its transactional Produce at b is checked with a's coordinator: a
    # partition not added is refused (INVALID_TXN_STATE), the added one taken.
    pid, epoch = add.v3_and_below_producer_id, add.v3_and_below_producer_epoch

    def txn_produce(index: int) -> int:
        batch = data_batch(0, [pb.SingleMessage(payload=b"t", publish_time_ms=1)], (pid, epoch))
        req = produce.ProduceRequest(
            transactional_id=init.transactional_id,
            acks=-1,
            timeout=datetime.timedelta(seconds=5),
            topic_data=(
                produce.TopicProduceData(
                    name=topic,
                    partition_data=(produce.PartitionProduceData(index=index, records=batch),),
                ),
            ),
        )
        body = _ask(b, Api.PRODUCE, 8, req)
        return int(body.responses[0].partition_responses[0].error_code)

    assert await asyncio.to_thread(txn_produce, 1) == 48
    assert await asyncio.to_thread(txn_produce, 0) == 0
    _ = LEADER_NOT_AVAILABLE  # (a slot without a live owner: the unit test above)


@KAFKA_PYTHON_WARNINGS
async def test_plain_producers_and_groups_reach_every_brokers_topics(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    """Each client, bootstrapped at one broker only, produces to a topic of
    each broker and reads each back as a consumer group (the group in the
    topic's slot: its offsets are the cursors of that topic's partitions)."""
    procs = start_kafka_cluster(tmp_path, pg_url, logs)
    await wait_for("slots placed on the 3 brokers", lambda: settled(pg_url, procs))
    found = await owners(pg_url)
    first = procs[0]
    for client in (AIOKAFKA, KAFKA_PYTHON, CONFLUENT_KAFKA):
        for owner in procs:
            slot = max(found[owner_id(owner)])
            topic = key_in(slot, SLOTS, f"plain-{client.name}-")
            create_topic(owner, topic)
            values = [b"%s-%d" % (topic.encode(), i) for i in range(10)]
            await client.seed(first.address, topic, values)
            group = key_in(slot, SLOTS, f"r-{uuid.uuid4().hex[:4]}-")
            got = await client.read(first.address, topic, len(values), PLAINTEXT, group)
            assert Counter(got) == Counter(values), (client.name, owner.address)
    await check_one_mapping_of_transactional_ids(procs, found)
    await check_a_group_whose_offsets_are_elsewhere(procs, found)


async def check_a_group_whose_offsets_are_elsewhere(
    procs: list[Any], found: dict[str, set[int]]
) -> None:
    """An aiokafka consumer group whose coordinator is one broker and whose
    topic is another's: its commits and fetches are forwarded to the
    topic's owner (the offsets are the cursors there). It commits, stops,
    and a new member resumes from the committed offsets; a commit behind
    them changes nothing; an admin client lists them (OffsetFetch of all
    of the group's offsets, asked of every broker)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.structs import OffsetAndMetadata

    topic_owner, group_owner = procs[0], procs[1]
    topic = key_in(max(found[owner_id(topic_owner)]), SLOTS, "elsewhere-")
    group = key_in(max(found[owner_id(group_owner)]), SLOTS, f"g-{uuid.uuid4().hex[:4]}-")
    create_topic(topic_owner, topic)
    boot = bootstrap(procs)
    first = [b"a%d" % i for i in range(10)]
    await AIOKAFKA.seed(boot, topic, first)
    parts = [TopicPartition(topic, i) for i in range(2)]

    async def member() -> AIOKafkaConsumer:
        consumer = AIOKafkaConsumer(
            topic,
            bootstrap_servers=boot,
            group_id=group,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await consumer.start()
        return consumer

    async def read(consumer: AIOKafkaConsumer, n: int) -> list[bytes]:
        got: list[bytes] = []
        async with asyncio.timeout(60):
            while len(got) < n:
                batch = await consumer.getmany(timeout_ms=300)
                got += [r.value for rs in batch.values() for r in rs]
        return got

    consumer = await member()
    try:
        assert Counter(await read(consumer, len(first))) == Counter(first)
        await consumer.commit()  # (OffsetCommit at the group's broker, stored at the topic's)
        committed = {tp: await consumer.committed(tp) for tp in parts}
        positions = {tp: await consumer.position(tp) for tp in parts}
        # (an offset past an entry's last message is answered as the next
        # entry's first: `broker.kafka._offsets`)
        assert any(positions.values()), positions
        assert all(committed[tp] >= positions[tp] for tp in parts), (committed, positions)
        # A commit behind the committed offsets is taken and changes nothing.
        behind = next(tp for tp in parts if committed[tp])
        await consumer.commit({behind: OffsetAndMetadata(0, "")})
        assert await consumer.committed(behind) == committed[behind]
    finally:
        await consumer.stop()
    admin = AIOKafkaAdminClient(bootstrap_servers=boot)
    await admin.start()
    try:
        listed = await admin.list_consumer_group_offsets(group)  # (OffsetFetch, topics null)
    finally:
        await admin.close()
    assert {(tp.topic, tp.partition): o.offset for tp, o in listed.items()} == {
        (topic, tp.partition): o for tp, o in committed.items()
    }
    second = [b"b%d" % i for i in range(10)]
    await AIOKAFKA.seed(boot, topic, second)
    consumer = await member()  # (a new member: it starts from the committed offsets)
    try:
        got = await read(consumer, len(second))
        assert Counter(got) == Counter(second), got
    finally:
        await consumer.stop()


async def check_one_mapping_of_transactional_ids(
    procs: list[Any], found: dict[str, set[int]]
) -> None:
    """A txnbuf producer of the producer-epoch mode and a Kafka producer
    with one transactional id (its coordinator on another broker than the
    client's first) fence each other: one registry, the id's slot's."""
    owner = procs[2]
    tid = key_in(max(found[owner_id(owner)]), SLOTS, f"both-{uuid.uuid4().hex[:4]}-")
    topic = key_in(max(found[owner_id(owner)]), SLOTS, "fence-")
    create_topic(owner, topic)
    init = init_producer_id.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=10)
    )
    async with Client(procs[0].url, operation_timeout=30.0) as client:
        txnbuf = await client.create_transactional_producer(tid)
        await txnbuf.init_transactions()
        assert txnbuf._conn.url == owner.url
        # Kafka's InitProducerId (at the owner of the id's slot) bumps the same
        # producer id's epoch: the txnbuf producer is fenced.
        kafka = await asyncio.to_thread(_ask, owner, Api.INIT_PRODUCER_ID, 1, init)
        assert kafka.error_code == 0
        assert (kafka.producer_id, kafka.producer_epoch) == (txnbuf.producer_id, txnbuf.epoch + 1)
        await txnbuf.begin_transaction()
        await txnbuf.send(topic, b"fenced")
        with pytest.raises((errors.ProducerFencedError, errors.InvalidProducerEpochError)):
            await txnbuf.commit_transaction()
        # And back: a txnbuf producer's init fences the Kafka producer.
        again = await client.create_transactional_producer(tid)
        await again.init_transactions()
        assert (again.producer_id, again.epoch) == (kafka.producer_id, kafka.producer_epoch + 1)
        add = add_partitions.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=kafka.producer_id,
            v3_and_below_producer_epoch=kafka.producer_epoch,
            v3_and_below_topics=(
                add_partitions.AddPartitionsToTxnTopic(name=topic, partitions=(0,)),
            ),
        )
        body = await asyncio.to_thread(_ask, owner, Api.ADD_PARTITIONS_TO_TXN, 1, add)
        code = body.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
        assert code in (47, 90)  # (INVALID_PRODUCER_EPOCH, PRODUCER_FENCED)
        # The admin API's view of the id, asked at another broker: the same
        # registry (forwarded to the id's slot's owner).
        status, body = procs[0].admin("GET", f"/admin/v1/producers/{tid}")
        assert status == 200, body
        entry = json.loads(body)
        assert (entry["tc_id"], entry["producer_id"], entry["producer_epoch"]) == (
            slot_of_key(tid, SLOTS),
            again.producer_id,
            again.epoch,
        )
        await again.close()


async def named_by_all(key: str, procs: list[Any]) -> bool:
    """FindCoordinator (TRANSACTION) for ``key`` at each of ``procs`` names
    one of them."""
    nodes = {p.node for p in procs}
    for proc in procs:
        req = find_coordinator.FindCoordinatorRequest(key=key, key_type=1)
        body = await asyncio.to_thread(_ask, proc, Api.FIND_COORDINATOR, 1, req)
        if body.error_code or body.node_id not in nodes:
            return False
    return True


async def check_copier_across_a_kill(
    client: KafkaClient,
    tmp_path: Path,
    pg_url: str,
    procs: list[Any],
    how: signal.Signals = signal.SIGKILL,
    victim_is: str = "coordinator",
    group_with: str = "source",
) -> None:
    """``client``'s copier (`tests.kafka_copier`) copies 40 records exactly
    once, its transactions across three brokers: its transactional id's
    coordinator on one, its source topic and group on another, its
    destination topic on the third (asserted). With ``group_with``
    "destination" its group is on the destination's broker instead: the
    group's coordinator forwards its TxnOffsetCommit and OffsetFetch to
    the source's broker (the offsets are the source's cursors there), and
    an aborted transaction leaves them where they were (else records
    would be lost). With a transaction open,
    the broker of its coordinator (``victim_is`` "coordinator") or of its
    source and group ("input") is SIGKILLed (or SIGTERMed: it hands its
    slots over). The coordinator's: its slot's new owner aborts the
    transaction (telling the other brokers) and fences the producer, the
    copier's commit fails fenced. The source's: the coordinator commits
    (the offsets, stored once durable at the dead broker, are committed by
    its slot's new owner) or the copier fails. Either way the next copier
    goes on from the group's committed offsets, and every record is in the
    destination once."""
    await wait_for("slots placed on the 3 brokers", lambda: settled(pg_url, procs))
    found = await owners(pg_url)
    victim = procs[1]
    others = [procs[0], procs[2]]
    vslot = min(found[owner_id(victim)])
    oslots = [min(found[owner_id(p)]) for p in others]
    if victim_is == "coordinator":
        src_slot, dst_slot, tx_slot = oslots[1], oslots[0], vslot
    else:
        src_slot, dst_slot, tx_slot = vslot, oslots[0], oslots[1]
    group_slot = src_slot if group_with == "source" else dst_slot
    src, dst, group = spread_names(src_slot, dst_slot, tx_slot, group_slot)
    brokers_of = {slot: o for o, mine in found.items() for slot in mine}
    assert len({brokers_of[src_slot], brokers_of[dst_slot], brokers_of[tx_slot]}) == 3
    assert slot_of_key(group, SLOTS) == group_slot
    assert slot_of_key(f"{group}-tx", SLOTS) == tx_slot
    by_id = {owner_id(p): p for p in procs}
    create_topic(by_id[brokers_of[src_slot]], src)
    create_topic(by_id[brokers_of[dst_slot]], dst)
    boot = bootstrap(procs)
    values = [b"m%d" % i for i in range(40)]
    await client.seed(boot, src, values)
    args = [client.name, boot, src, dst, group, "--per-txn", "5", "--timeout", "120"]
    log = tmp_path / "copier.log"
    life = await Copier.start([*args, "--pause-at", "4"], log)
    try:
        await life.wait_for("open", timeout=60)
        if how == signal.SIGKILL:
            victim.kill()
        else:
            assert await asyncio.to_thread(victim.stop) == 0
        survivors = [p for p in procs if p is not victim]

        async def moved() -> bool:
            owner = dict((s, o) for s, o, _ in await slots(pg_url)).get(vslot)
            return owner in {owner_id(p) for p in survivors}

        if client.restart_before_commit:
            # (kafka-python drops a request whose connection fails as it goes
            # out, docs/kafka.md: it would go to the dead broker's node
            # first. Once the slot has a new owner that every broker names,
            # the dead broker is started again at its address, so its node
            # answers: NOT_COORDINATOR, and the client finds the new one.)
            await wait_for(f"slot {vslot} taken over", moved)
            key = f"{group}-tx" if victim_is == "coordinator" else group
            await wait_for(
                "every broker names the new coordinator", lambda: named_by_all(key, survivors)
            )
            await asyncio.to_thread(victim.start)
            # (It rejoins and takes its share back: slots of the copier may
            # move again. A move under the commit can cost kafka-python
            # another request lost as its connection closes, which it never
            # answers: the commit waits for the cluster to settle first.)
            await wait_for("the restarted broker took its share", lambda: settled(pg_url, procs))
        life.go_on()
        status, last = await life.end(timeout=120)
        if victim_is == "coordinator":
            assert (status, last.split(":")[0]) == (1, "failed fenced"), life.told()
        else:
            assert status in (0, 1), life.told()
        aborts = sum(line.startswith("aborted") for line in life.lines)
    finally:
        await life.kill()
    life = await Copier.start(args, log)
    try:
        assert await life.end(timeout=120) == (0, "done"), life.told()
        aborts += sum(line.startswith("aborted") for line in life.lines)
    finally:
        await life.kill()
    reader = key_in(dst_slot, SLOTS, f"reader-{uuid.uuid4().hex[:4]}-")
    got = await client.read(bootstrap(survivors), dst, len(values), PLAINTEXT, reader)
    assert Counter(got) == Counter(v.upper() for v in values)
    assert aborts > 0


async def test_aiokafka_copier_across_a_kill_of_its_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    await check_copier_across_a_kill(
        AIOKAFKA,
        tmp_path,
        pg_url,
        start_kafka_cluster(tmp_path, pg_url, logs),
        group_with="destination",
    )


@KAFKA_PYTHON_WARNINGS
async def test_kafka_python_copier_across_a_kill_of_its_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    await check_copier_across_a_kill(
        KAFKA_PYTHON,
        tmp_path,
        pg_url,
        start_kafka_cluster(tmp_path, pg_url, logs),
        victim_is="input",
        group_with="destination",
    )


async def test_confluent_kafka_copier_across_a_kill_of_its_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    await check_copier_across_a_kill(
        CONFLUENT_KAFKA, tmp_path, pg_url, start_kafka_cluster(tmp_path, pg_url, logs)
    )


def test_a_cluster_broker_needs_a_kafka_port_number(tmp_path: Path) -> None:
    """Its Kafka address is recorded when it joins, before its listener
    binds: port 0 (any port) is refused, saying why, and nothing starts."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--store",
            "postgresql://nobody@127.0.0.1:1/none",
            "--cluster",
            "--kafka-port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "--cluster needs a --kafka-port number, not 0" in result.stderr
    assert not (tmp_path / "data").exists()


async def test_aiokafka_copier_across_a_sigterm_handover(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    procs = start_kafka_cluster(tmp_path, pg_url, logs)
    await check_copier_across_a_kill(AIOKAFKA, tmp_path, pg_url, procs, signal.SIGTERM)


async def test_confluent_kafka_copier_across_a_sigterm_handover(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    procs = start_kafka_cluster(tmp_path, pg_url, logs)
    await check_copier_across_a_kill(CONFLUENT_KAFKA, tmp_path, pg_url, procs, signal.SIGTERM)


def _authenticated(proc: Any, token: str) -> RawKafka:
    raw = RawKafka(proc.kafka_port)
    assert raw.authenticate("OAUTHBEARER", bearer(token)).error_code == 0
    return raw


@KAFKA_PYTHON_WARNINGS
async def test_every_listener_checks_permissions_before_ownership(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    """With authentication, a role refused a topic, a transactional id or a
    group is told so by every broker, the owner of its slot or not (the
    ACL is checked first); where it is allowed, a non-owner answers
    NOT_LEADER_OR_FOLLOWER or NOT_COORDINATOR."""
    key = tmp_path / "secret.key"
    key.write_text(create_secret_key())
    procs = start_kafka_cluster(tmp_path, pg_url, logs, key)
    await wait_for("slots placed on the 3 brokers", lambda: settled(pg_url, procs))
    found = await owners(pg_url)
    a, b = procs[0], procs[1]
    slot = min(found[owner_id(b)])
    allowed, refused = key_in(slot, SLOTS, "ok-"), key_in(slot, SLOTS, "no-")
    create_topic(b, allowed)
    create_topic(b, refused)
    acl_owner = await owner_of(pg_url, 0, procs)  # (slot 0's owner writes the ACL)
    grant(acl_owner, "app", "produce", f"topic:{allowed}")
    token = a.make_token("app")

    def produce_at(proc: Any, topic: str) -> int:
        raw = _authenticated(proc, token)
        try:
            req = produce.ProduceRequest(
                transactional_id=None,
                acks=-1,
                timeout=datetime.timedelta(seconds=5),
                topic_data=(
                    produce.TopicProduceData(
                        name=topic,
                        partition_data=(
                            produce.PartitionProduceData(
                                index=0, records=kafka_python_batch([(b"k", b"v", [])])
                            ),
                        ),
                    ),
                ),
            )
            body = raw.call(Api.PRODUCE, 8, req)
            return int(body.responses[0].partition_responses[0].error_code)
        finally:
            raw.close()

    async def granted(proc: Any, code: int) -> bool:
        # (a broker that does not own slot 0 reads the ACL again every third
        # of the lease)
        return await asyncio.to_thread(produce_at, proc, allowed) == code

    await wait_for("the grant applies at a", lambda: granted(a, NOT_LEADER_OR_FOLLOWER))
    await wait_for("the grant applies at b", lambda: granted(b, 0))  # (stored once)
    assert await asyncio.to_thread(produce_at, a, refused) == TOPIC_AUTHORIZATION_FAILED
    assert await asyncio.to_thread(produce_at, b, refused) == TOPIC_AUTHORIZATION_FAILED

    def init_at(proc: Any) -> int:
        raw = _authenticated(proc, token)
        try:
            req = init_producer_id.InitProducerIdRequest(
                transactional_id=key_in(slot, SLOTS, "tx-"),
                transaction_timeout=datetime.timedelta(seconds=10),
            )
            return int(raw.call(Api.INIT_PRODUCER_ID, 1, req).error_code)
        finally:
            raw.close()

    assert await asyncio.to_thread(init_at, a) == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert await asyncio.to_thread(init_at, b) == TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    status, stats = b.admin("GET", f"/admin/v1/topics/{refused}/stats")
    assert status == 200 and b'"messages": 0' in stats.replace(b'"messages":0', b'"messages": 0')
