"""Pieces of the Kafka listener alone: record batches (checked against
kafka-python's own record reader and writer), the group state machine, the
response builder, and bad requests against a real broker process."""

from __future__ import annotations

import asyncio
import io
import socket
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from broker.kafka._codec import Api, build, encode_response, read_request
from broker.kafka._groups import (
    ILLEGAL_GENERATION,
    MEMBER_ID_REQUIRED,
    REBALANCE_IN_PROGRESS,
    UNKNOWN_MEMBER_ID,
    GroupError,
    Groups,
)
from broker.kafka._offsets import offset_of, position_of
from broker.kafka._records import (
    CORRUPT_MESSAGE,
    INVALID_RECORD,
    UNSUPPORTED_COMPRESSION_TYPE,
    RecordError,
    control_batch,
    data_batch,
    read_batches,
)
from proto import txnbuf_pb2 as pb
from tests.test_kafka import KafkaBroker

pytestmark = pytest.mark.filterwarnings("ignore:(read_text|open_text) is deprecated")


def kafka_python_batch(
    records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]],
    compression: int = 0,
    transactional: bool = False,
) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, compression, transactional, 7, 3, 10, 8 << 20)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, 1_700_000_000_000 + i, key, value, headers)
    return bytes(builder.build())


def read_with_kafka_python(data: bytes) -> list[object]:
    from kafka.record.default_records import DefaultRecordBatch

    batches = []
    pos = 0
    while pos < len(data):
        (length,) = struct.unpack_from(">i", data, pos + 8)
        batch = DefaultRecordBatch(data[pos : pos + 12 + length])
        assert batch.validate_crc()
        batches.append(batch)
        pos += 12 + length
    return batches


# -- record batches --------------------------------------------------------------------


def test_a_kafka_python_batch_becomes_messages() -> None:
    data = kafka_python_batch(
        [(b"k1", b"v1", [("h", b"x")]), (None, b"v2", []), (b"k3", b"", [("a", b""), ("b", b"y")])],
        transactional=True,
    )
    (batch,) = read_batches(data)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 3, 10)
    assert batch.transactional and batch.count == 3
    messages = batch.messages(first_seq=5)
    assert [m.payload for m in messages] == [b"v1", b"v2", b""]
    assert [m.key if m.HasField("key") else None for m in messages] == ["k1", None, "k3"]
    assert [dict(m.properties) for m in messages] == [{"h": "x"}, {}, {"a": "", "b": "y"}]
    assert [m.sequence_id for m in messages] == [5, 6, 7]
    assert [m.publish_time_ms for m in messages] == [1_700_000_000_000 + i for i in range(3)]


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_batch_is_read(codec: int) -> None:
    """kafka-python's own compression (python-snappy, xerial framing; lz4;
    zstandard) of a batch larger than the first output buffer tried."""
    values = [bytes([i % 251]) * 50_000 + b"%d" % i for i in range(40)]  # 2 MB
    data = kafka_python_batch([(b"k%d" % i, v, [("h", b"x")]) for i, v in enumerate(values)], codec)
    assert len(data) < 200_000
    (batch,) = read_batches(data)
    assert [m.payload for m in batch.messages(0)] == values


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_batch_that_would_inflate_too_far_is_refused(codec: str) -> None:
    import cramjam

    from broker.kafka._records import inflate

    mod = getattr(cramjam, codec)
    plain = b"\0" * 3_000_000
    packed = bytes(mod.compress_raw(plain) if codec == "snappy" else mod.compress(plain))
    number = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}[codec]
    assert inflate(number, packed, limit=3_000_000) == plain
    with pytest.raises(RecordError, match="larger than 2000000 bytes") as refused:
        inflate(number, packed, limit=2_000_000)
    assert refused.value.code == CORRUPT_MESSAGE
    with pytest.raises(RecordError, match="does not decompress") as refused:
        inflate(number, packed[: len(packed) // 2] + b"junk", limit=3_000_000)
    assert refused.value.code == CORRUPT_MESSAGE


@pytest.mark.parametrize(
    ("records", "code", "words"),
    [
        ([(b"\xff\xfe", b"v", [])], INVALID_RECORD, "key is not UTF-8"),
        ([(b"k", b"v", [("h", b"\xff")])], INVALID_RECORD, "not UTF-8"),
        ([(b"k", b"v", [("h", b"1"), ("h", b"2")])], INVALID_RECORD, "appears twice"),
    ],
)
def test_records_txnbuf_cannot_hold_are_refused(
    records: list[tuple[bytes | None, bytes, list[tuple[str, bytes]]]], code: int, words: str
) -> None:
    (batch,) = read_batches(kafka_python_batch(records))
    with pytest.raises(RecordError, match=words) as refused:
        batch.messages(0)
    assert refused.value.code == code


def test_a_batch_with_a_bad_crc_or_codec_is_refused() -> None:
    data = bytearray(kafka_python_batch([(b"k", b"v", [])]))
    data[-1] ^= 1
    with pytest.raises(RecordError, match="CRC") as refused:
        read_batches(bytes(data))
    assert refused.value.code == CORRUPT_MESSAGE
    unknown = bytearray(kafka_python_batch([(b"k", b"v", [])]))
    unknown[22] |= 5  # (attributes: codec 5), its CRC made right again
    from crc32c import crc32c

    struct.pack_into(">I", unknown, 17, crc32c(bytes(unknown[21:])))
    with pytest.raises(RecordError) as refused:
        read_batches(bytes(unknown))
    assert refused.value.code == UNSUPPORTED_COMPRESSION_TYPE
    with pytest.raises(RecordError) as refused:
        read_batches(bytes(data[:30]))
    assert refused.value.code == CORRUPT_MESSAGE


def test_a_control_batch_from_a_producer_is_refused() -> None:
    with pytest.raises(RecordError, match="control") as refused:
        read_batches(control_batch(0, (7, 3), True, 0))
    assert refused.value.code == INVALID_RECORD


def test_fetched_batches_read_back_in_kafka_python() -> None:
    messages = [
        pb.SingleMessage(payload=b"a", key="k", properties={"p": "q"}, publish_time_ms=1000),
        pb.SingleMessage(payload=b"b", publish_time_ms=1005),
    ]
    base = offset_of(42, 0)
    data = data_batch(base, messages, (9, 2)) + control_batch(base + 2, (9, 2), True, 1005)
    txn, marker = read_with_kafka_python(data)
    assert txn.is_transactional and not txn.is_control_batch
    assert (txn.producer_id, txn.producer_epoch) == (9, 2)
    records = list(txn)  # type: ignore[call-overload]
    assert [(r.offset, r.key, r.value, r.timestamp) for r in records] == [
        (base, b"k", b"a", 1000),
        (base + 1, None, b"b", 1005),
    ]
    assert records[0].headers == [("p", b"q")]
    assert marker.is_control_batch and marker.base_offset == base + 2
    (control,) = list(marker)  # type: ignore[call-overload]
    assert struct.unpack(">hh", control.key) == (0, 1)  # version 0, COMMIT
    plain = read_with_kafka_python(data_batch(base, messages[:1]))[0]
    assert not plain.is_transactional


def test_offsets_and_positions_map_one_to_one() -> None:
    for entry_id, index in [(0, 0), (0, 5), (123456, 0), (123456, (1 << 20) - 1)]:
        assert position_of(offset_of(entry_id, index)) == (entry_id, index)
    assert offset_of(1, 0) > offset_of(0, (1 << 20) - 1)


# -- responses ---------------------------------------------------------------------------


def test_a_built_response_decodes_to_what_was_given() -> None:
    data = {
        "throttle_time": 0,
        "error_code": 0,
        "session_id": 0,
        "responses": [
            {
                "topic": "t",
                "partitions": [
                    {
                        "partition_index": 1,
                        "error_code": 0,
                        "high_watermark": 5,
                        "last_stable_offset": 5,
                        "log_start_offset": 0,
                        "aborted_transactions": [],
                        "preferred_read_replica": -1,
                        "records": b"xyz",
                    }
                ],
            }
        ],
    }
    for version in (4, 11):
        frame = encode_response(
            read_request(_request(Api.API_VERSIONS, 0, {}, correlation_id=9))[0],
            Api.FETCH,
            version,
            build(Api.FETCH, version, data),
        )
        assert struct.unpack_from(">ii", frame) == (len(frame) - 4, 9)
        body, _ = entity_reader(load_response_schema(Api.FETCH, version))(frame, 8)
        part = body.responses[0].partitions[0]
        assert (part.partition_index, part.high_watermark, bytes(part.records)) == (1, 5, b"xyz")


def test_an_api_version_not_served_reads_as_no_body() -> None:
    header, body = read_request(_request(Api.API_VERSIONS, 4, None))
    assert (header.api_key, header.api_version, body) == (Api.API_VERSIONS, 4, None)
    _, body = read_request(_request(Api.PRODUCE, 2, None))
    assert body is None


def _request(
    api: int, version: int, fields: dict[str, object] | None, correlation_id: int = 1
) -> bytes:
    head = struct.pack(">hhih", api, version, correlation_id, 4) + b"test"
    if fields is None:
        return head + b"\0" * 8
    cls = load_request_schema(api, version)
    out = io.BytesIO()
    entity_writer(cls)(out, cls(**fields))
    return head + out.getvalue()


# -- groups ----------------------------------------------------------------------------------


async def join(groups: Groups, member_id: str, protocols: list[str] | None = None) -> object:
    return await groups.join(
        "g",
        member_id,
        None,
        "client",
        "consumer",
        [(p, p.encode()) for p in (protocols or ["range"])],
        10_000,
        1_000,
        True,
    )


async def test_a_group_assigns_through_its_leader_and_rebalances_on_leave() -> None:
    groups = Groups()
    try:
        with pytest.raises(GroupError) as required:
            await join(groups, "")
        assert required.value.code == MEMBER_ID_REQUIRED
        a = required.value.member_id
        with pytest.raises(GroupError) as required:
            await join(groups, "")
        b = required.value.member_id
        first, second = await asyncio.gather(join(groups, a), join(groups, b))
        assert first.generation == second.generation == 1
        leader = first.leader
        assert leader == a and len(first.members) == 2 and second.members == []
        follower_sync = groups.sync("g", b, 1, [])
        assert not follower_sync.done()
        leader_sync = groups.sync("g", a, 1, [(a, b"A"), (b, b"B")])
        assert await leader_sync == b"A" and await follower_sync == b"B"
        groups.heartbeat("g", b, 1)
        with pytest.raises(GroupError) as wrong:
            groups.heartbeat("g", b, 0)
        assert wrong.value.code == ILLEGAL_GENERATION
        groups.leave("g", a)
        with pytest.raises(GroupError) as rebalancing:
            groups.heartbeat("g", b, 1)
        assert rebalancing.value.code == REBALANCE_IN_PROGRESS
        again = await join(groups, b)
        assert (again.generation, again.leader) == (2, b)
        with pytest.raises(GroupError) as gone:
            groups.heartbeat("g", a, 2)
        assert gone.value.code == UNKNOWN_MEMBER_ID
    finally:
        groups.close()


async def test_a_member_that_stops_heartbeating_is_removed() -> None:
    groups = Groups()
    try:
        with pytest.raises(GroupError) as required:
            await join(groups, "")
        a = required.value.member_id
        await join(groups, a)
        groups._groups["g"].members[a].session_timeout_ms = 50
        await asyncio.sleep(1.2)
        with pytest.raises(GroupError) as gone:
            groups.heartbeat("g", a, 1)
        assert gone.value.code == UNKNOWN_MEMBER_ID
        groups.check_member("g", "", -1)  # empty again: a commit from outside is allowed
    finally:
        groups.close()


# -- bad requests against a real broker -------------------------------------------------------


@pytest.fixture
def kafka_broker(tmp_path: Path) -> Iterator[KafkaBroker]:
    proc = KafkaBroker(tmp_path / "data", tmp_path / "broker.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def _roundtrip(sock: socket.socket, frame: bytes) -> bytes:
    sock.sendall(struct.pack(">i", len(frame)) + frame)
    (size,) = struct.unpack(">i", _recv(sock, 4))
    return _recv(sock, size)


def _recv(sock: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError("closed")
        out += chunk
    return out


@pytest.mark.integration
def test_bad_kafka_requests_get_clear_errors_and_change_nothing(kafka_broker: KafkaBroker) -> None:
    topic = kafka_broker.topic("bad", partitions=1)
    with socket.create_connection(("127.0.0.1", kafka_broker.kafka_port), timeout=10) as sock:
        # ApiVersions at a version not served: a v0 body, UNSUPPORTED_VERSION, the ranges.
        answer = _roundtrip(sock, _request(Api.API_VERSIONS, 4, None, correlation_id=5))
        assert struct.unpack_from(">i", answer) == (5,)
        body, _ = entity_reader(load_response_schema(Api.API_VERSIONS, 0))(answer, 4)
        assert body.error_code == 35
        assert {k.api_key for k in body.api_keys} >= {0, 1, 22, 24, 25, 26, 28}
        # A Produce whose batch fails its CRC: CORRUPT_MESSAGE, nothing stored.
        bad = bytearray(kafka_python_batch([(b"k", b"v", [])]))
        bad[-1] ^= 1
        from kio.schema.produce.v8 import request as produce

        req = produce.ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=__import__("datetime").timedelta(seconds=5),
            topic_data=(
                produce.TopicProduceData(
                    name=topic,
                    partition_data=(produce.PartitionProduceData(index=0, records=bytes(bad)),),
                ),
            ),
        )
        out = io.BytesIO()
        entity_writer(type(req))(out, req)
        head = struct.pack(">hhih", Api.PRODUCE, 8, 6, 4) + b"test"
        answer = _roundtrip(sock, head + out.getvalue())
        resp, _ = entity_reader(load_response_schema(Api.PRODUCE, 8))(answer, 4)
        part = resp.responses[0].partition_responses[0]
        assert part.error_code == CORRUPT_MESSAGE and "CRC" in part.error_message
        # An API not served closes the connection.
        sock.sendall(struct.pack(">i", 12) + struct.pack(">hhih", 99, 0, 7, -1) + b"\0\0")
        assert sock.recv(10) == b""
    status, stats = kafka_broker.admin("GET", f"/admin/v1/topics/{topic}/stats")
    assert status == 200 and b'"messages": 0' in stats.replace(b'"messages":0', b'"messages": 0')


def _call(sock: socket.socket, api: Api, version: int, req: object, correlation_id: int) -> Any:
    """One request (a kio request object) and its decoded response body."""
    out = io.BytesIO()
    entity_writer(type(req))(out, req)
    head = struct.pack(">hhih", api, version, correlation_id, 4) + b"test"
    answer = _roundtrip(sock, head + out.getvalue())
    assert struct.unpack_from(">i", answer) == (correlation_id,)
    body, _ = entity_reader(load_response_schema(api, version))(answer, 4)
    return body


@pytest.mark.integration
def test_offsets_outside_a_transaction_are_refused_and_commit_nothing(
    kafka_broker: KafkaBroker,
) -> None:
    """A TxnOffsetCommit from a producer with no ongoing transaction (no
    AddOffsetsToTxn before it) is INVALID_TXN_STATE: nothing begins a
    transaction implicitly, and the group commits nothing."""
    import datetime

    from kio.schema.init_producer_id.v1 import request as init
    from kio.schema.txn_offset_commit.v2 import request as commit

    from tests.test_kafka import kafka_python_seed

    topic = kafka_broker.topic("offsets", partitions=1)
    kafka_python_seed(kafka_broker.bootstrap, topic, [b"a", b"b"])
    with socket.create_connection(("127.0.0.1", kafka_broker.kafka_port), timeout=10) as sock:
        begun = _call(
            sock,
            Api.INIT_PRODUCER_ID,
            1,
            init.InitProducerIdRequest(
                transactional_id="lone-offsets", transaction_timeout=datetime.timedelta(seconds=60)
            ),
            1,
        )
        assert begun.error_code == 0
        req = commit.TxnOffsetCommitRequest(
            transactional_id="lone-offsets",
            group_id="lone-group",
            producer_id=begun.producer_id,
            producer_epoch=begun.producer_epoch,
            topics=(
                commit.TxnOffsetCommitRequestTopic(
                    name=topic,
                    partitions=(
                        commit.TxnOffsetCommitRequestPartition(
                            partition_index=0,
                            committed_offset=1,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        ),
                    ),
                ),
            ),
        )
        answer = _call(sock, Api.TXN_OFFSET_COMMIT, 2, req, 2)
        assert answer.topics[0].partitions[0].error_code == 48
    status, subs = kafka_broker.admin("GET", f"/admin/v1/topics/{topic}/subscriptions")
    assert status == 200 and b"lone-group" not in subs


@pytest.mark.integration
def test_a_broker_stopping_with_kafka_connections_open_logs_no_error(
    kafka_broker: KafkaBroker,
) -> None:
    with socket.create_connection(("127.0.0.1", kafka_broker.kafka_port), timeout=10) as sock:
        answer = _roundtrip(sock, _request(Api.API_VERSIONS, 0, {}, correlation_id=3))
        assert struct.unpack_from(">i", answer) == (3,)  # (the connection is served)
        assert kafka_broker.stop() == 0
    log = kafka_broker.log()
    assert "txnbuf: stopped" in log and " ERROR " not in log, log


# -- SASL credentials and a member's subscription ----------------------------------------------


@pytest.mark.parametrize(
    ("mechanism", "data", "expected"),
    [
        ("PLAIN", b"\0app\0tok", ("app", "tok")),
        ("PLAIN", b"app\0app\0tok", ("app", "tok")),
        ("OAUTHBEARER", b"n,,\x01auth=Bearer tok\x01\x01", (None, "tok")),
        ("OAUTHBEARER", b"n,a=app,\x01auth=Bearer tok\x01\x01", ("app", "tok")),
        ("OAUTHBEARER", b"n,a=a=2Cb,\x01auth=bearer  tok \x01\x01", ("a,b", "tok")),
        # (extensions, KIP-342, are read past)
        ("OAUTHBEARER", b"n,,\x01auth=Bearer tok\x01traceId=7\x01\x01", (None, "tok")),
    ],
)
def test_sasl_credentials_are_read(
    mechanism: str, data: bytes, expected: tuple[str | None, str]
) -> None:
    from broker.kafka._session import sasl_credentials

    assert sasl_credentials(mechanism, data) == expected


@pytest.mark.parametrize(
    ("mechanism", "data", "words"),
    [
        ("PLAIN", b"app\0tok", "authzid NUL user NUL password"),
        ("PLAIN", b"\0\0tok", "need a user"),
        ("PLAIN", b"other\0app\0tok", "is not the user"),
        ("PLAIN", b"\0app\0\xff", "not UTF-8"),
        ("OAUTHBEARER", b"\x01", "gave up"),
        ("OAUTHBEARER", b"Bearer tok", "OAUTHBEARER credentials are"),
        ("OAUTHBEARER", b"p=tls,,\x01auth=Bearer tok\x01\x01", "GS2 header"),
        ("OAUTHBEARER", b"n,,\x01user=app\x01\x01", "without auth=Bearer"),
        ("OAUTHBEARER", b"n,,\x01auth=Basic tok\x01\x01", "must be 'Bearer <token>'"),
        ("PLAIN", b"\0app\0" + b"t" * 20000, "bytes of SASL credentials"),
    ],
)
def test_bad_sasl_credentials_are_refused_saying_why(
    mechanism: str, data: bytes, words: str
) -> None:
    from broker.kafka._session import SaslError, sasl_credentials

    with pytest.raises(SaslError, match=words):
        sasl_credentials(mechanism, data)


def test_a_consumer_subscription_is_read_for_its_topics() -> None:
    from kafka.protocol.old.consumer_protocol import ConsumerProtocolMemberMetadata_v0

    from broker.kafka._groups import subscribed_topics

    meta = ConsumerProtocolMemberMetadata_v0(0, ["orders", "payments"], b"x").encode()
    assert subscribed_topics(bytes(meta)) == ["orders", "payments"]
    with pytest.raises(ValueError):
        subscribed_topics(b"\0\0\0\0\0\x05\0\x03ab")


async def test_a_group_offset_forwarded_to_an_owner_that_cannot_answer_is_retriable() -> None:
    """`_Forward` (a group's offsets on other brokers' topics), on a fake of
    the brokers' channel: a topic whose owner is moving, an owner that
    cannot be reached, and an owner that no longer serves the topic are
    COORDINATOR_LOAD_IN_PROGRESS (the client asks again; the owner is
    looked up again); an owner's refusal keeps its Kafka code; the answers
    of one owner come from one request with all of its partitions."""
    from types import SimpleNamespace

    from broker.kafka._cluster import COORDINATOR_LOAD_IN_PROGRESS
    from broker.kafka._group_apis import _Forward
    from broker.kafka._session import KafkaError
    from proto import refusals

    asked: list[Any] = []

    async def topic_owner(topic: str) -> str:
        if topic == "moving":
            raise refusals.NotOwner("slot 3 is being taken over")
        return {"lost": "http://gone", "fine": "http://b"}[topic]

    async def group_cursors(url: str, fill: Any, what: str) -> Any:
        req = pb.CommandGroupCursors()
        fill(req)
        asked.append((url, req))
        if url == "http://gone":
            raise refusals.ServiceNotReady(f"{what}: connection lost")
        resp = pb.CommandGroupCursorsResponse()
        for at in req.positions:
            answer = resp.positions.add(topic=at.topic, partition=at.partition)
            if at.partition == 0:
                answer.error, answer.message = pb.NOT_OWNER, "slot moved"
            elif at.partition == 1:
                answer.error, answer.message = pb.AUTHORIZATION_ERROR, "not the holder"
            else:
                answer.entry_id, answer.index = at.entry_id, at.index
        return resp

    peers = SimpleNamespace(topic_owner=topic_owner, group_cursors=group_cursors)
    broker: Any = SimpleNamespace(cluster=SimpleNamespace(peers=peers))
    forward = _Forward(broker, "g", True, (7, 1, "tx"))
    jobs = {
        ("moving", 0): forward.add("moving", 0, (1, 0)),
        ("lost", 2): forward.add("lost", 2, (1, 0)),
        ("fine", 0): forward.add("fine", 0, (1, 0)),
        ("fine", 1): forward.add("fine", 1, (1, 0)),
        ("fine", 2): forward.add("fine", 2, (4, 2)),
    }
    forward.send()
    codes = {}
    for key, job in jobs.items():
        try:
            await job
            codes[key] = 0
        except KafkaError as exc:
            codes[key] = exc.code
    assert codes == {
        ("moving", 0): COORDINATOR_LOAD_IN_PROGRESS,
        ("lost", 2): COORDINATOR_LOAD_IN_PROGRESS,
        ("fine", 0): COORDINATOR_LOAD_IN_PROGRESS,
        ("fine", 1): 53,  # (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        ("fine", 2): 0,
    }
    (fine,) = [req for url, req in asked if url == "http://b"]
    assert [(p.partition, p.entry_id, p.index) for p in fine.positions] == [
        (0, 1, 0),
        (1, 1, 0),
        (2, 4, 2),
    ]
    assert (fine.commit, fine.producer_id, fine.producer_epoch, fine.transactional_id) == (
        True,
        7,
        1,
        "tx",
    )
    # A fetch: the cursor as a Kafka offset.
    fetch = _Forward(broker, "g", False)
    job = fetch.fetch("fine", 2)
    fetch.send()
    assert await job == offset_of(0, 0)  # (the fake answers the position it was sent)
    assert asked[-1][1].commit is False and not asked[-1][1].HasField("producer_id")
