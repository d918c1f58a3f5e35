"""Bad input gets a clear error, changes nothing, and breaks nobody else.

Each test sends something wrong, checks the error, then checks that the
same connection (and another client) still works and that nothing was
stored.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest

from broker._connection import PROTOCOL_VERSION
from client import Client, errors
from proto import txnbuf_pb2 as pb
from tests.conftest import BrokerProcess, RawConnection, send_command

pytestmark = pytest.mark.integration

T = pb.BaseCommand


async def still_works(raw: RawConnection) -> None:
    pong = await raw.request(T.PING, "ping", pb.CommandPing())
    assert pong.type == T.PONG


def topics(broker: BrokerProcess) -> list[str]:
    status, body = broker.admin("GET", "/admin/v1/topics")
    assert status == 200
    return [t["name"] for t in json.loads(body)["topics"]]


async def test_malformed_frame(broker: BrokerProcess) -> None:
    async with RawConnection(broker.url) as raw:
        await raw.send_raw(b"\xff\xff\xff not a protobuf")
        answer = await raw.receive()
        assert answer.type == T.ERROR
        assert answer.error.error == pb.MALFORMED_FRAME
        assert "BaseCommand" in answer.error.message
        await still_works(raw)
        await raw.ws.send_str("text frame")
        answer = await raw.receive()
        assert answer.error.error == pb.MALFORMED_FRAME
        await still_works(raw)
    assert topics(broker) == []


async def test_unknown_command(broker: BrokerProcess) -> None:
    async with RawConnection(broker.url) as raw:
        cmd = pb.BaseCommand(type=63)  # type: ignore[arg-type]  # reserved, not served
        await raw.send_raw(cmd.SerializeToString())
        answer = await raw.receive()
        assert answer.error.error == pb.UNKNOWN_COMMAND
        # A type that does not match its body is refused the same way.
        await raw.send(T.SEND, "ping", pb.CommandPing())
        answer = await raw.receive()
        assert answer.error.error == pb.UNKNOWN_COMMAND
        assert "SEND" in answer.error.message
        # A command only the broker sends.
        await raw.send(T.SEND_RECEIPT, "send_receipt", pb.CommandSendReceipt())
        assert (await raw.receive()).error.error == pb.UNKNOWN_COMMAND
        await still_works(raw)


@pytest.mark.parametrize("name", ["bad topic", "a/b", "-dash", "x" * 201, "é", "a\x00b"])
async def test_illegal_topic_name(broker: BrokerProcess, name: str) -> None:
    async with Client(broker.url) as client:
        with pytest.raises(errors.InvalidTopicNameError, match="invalid topic name"):
            await client.create_producer(name)
        with pytest.raises(errors.InvalidTopicNameError):
            await client.subscribe(name, "s")
        producer = await client.create_producer("fine")  # the client is still usable
        await producer.send(b"x")
    assert topics(broker) == ["fine"]
    status, body = broker.admin("PUT", "/admin/v1/topics/bad%20topic", b'{"partitions": 2}')
    assert status == 400 and b"invalid topic name" in body
    assert topics(broker) == ["fine"]


async def test_empty_names_are_refused_before_sending(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        with pytest.raises(errors.InvalidInputError, match="non-empty"):
            await client.create_producer("")
        with pytest.raises(errors.InvalidInputError, match="non-empty"):
            await client.subscribe("t", "")
    assert topics(broker) == []


async def test_illegal_subscription_name(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        with pytest.raises(errors.InvalidArgumentError, match="invalid subscription name"):
            await client.subscribe("t", "bad sub")


async def test_producer_and_consumer_names_follow_the_name_rule(broker: BrokerProcess) -> None:
    long = "n" * 10_000
    async with Client(broker.url) as client:
        for name in (long, "bad name", "a/b"):
            with pytest.raises(errors.InvalidArgumentError, match="invalid producer name") as info:
                await client.create_producer("names", name)
            assert len(str(info.value)) < 400  # (at most 200 characters of it quoted)
            with pytest.raises(errors.InvalidArgumentError, match="invalid consumer name") as info:
                await client.subscribe("names", "s", consumer_name=name)
            assert len(str(info.value)) < 400
        with pytest.raises(errors.InvalidArgumentError, match="10000 characters") as info:
            await client.subscribe("names", long)
        assert len(str(info.value)) < 400
        producer = await client.create_producer("names", "n" * 200)
        await producer.send(b"x")
    assert topics(broker) == ["names"]
    status, body = broker.admin("PUT", "/admin/v1/topics/t", json.dumps({long: 1}).encode())
    assert status == 400 and len(body) < 400 and b"unknown field" in body
    status, body = broker.admin("GET", "/admin/v1/transactions/" + "9" * 5000)
    assert status == 400 and len(body) < 400 and b"not a TxnID" in body


async def test_send_to_closed_producer(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("closed")
        await producer.send(b"kept")
        await producer.close()
        with pytest.raises(errors.ProducerClosedError):
            await producer.send(b"lost")
    # On the wire: a SEND naming a closed producer id.
    async with RawConnection(broker.url) as raw:
        await raw.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(request_id=1, producer_id=7, topic="closed", producer_name="p"),
        )
        closed = await raw.request(
            T.CLOSE_PRODUCER, "close_producer", pb.CommandCloseProducer(request_id=2, producer_id=7)
        )
        assert closed.type == T.SUCCESS
        msg = pb.SingleMessage(payload=b"lost", sequence_id=1)
        answer = await raw.request(T.SEND, "send", send_command(msg, producer_id=7, request_id=3))
        assert answer.type == T.SEND_ERROR
        assert answer.send_error.error == pb.PRODUCER_NOT_FOUND
        assert answer.send_error.request_id == 3
        await still_works(raw)
    _, body = broker.admin("GET", "/admin/v1/topics/closed/stats")
    assert json.loads(body)["partitions"][0]["messages"] == 1


async def test_a_producer_id_in_use_is_refused_unless_it_is_the_same_producer_again(
    broker: BrokerProcess,
) -> None:
    # (The same producer created again under its id: a cluster's client moves
    # a producer refused NOT_OWNER, and the lookup may name this broker again.)
    async with RawConnection(broker.url) as raw:

        async def create(request_id: int, topic: str, name: str) -> Any:
            return await raw.request(
                T.PRODUCER,
                "producer",
                pb.CommandProducer(
                    request_id=request_id, producer_id=1, topic=topic, producer_name=name
                ),
            )

        first = await create(1, "again", "p")
        assert first.type == T.PRODUCER_SUCCESS
        msg = pb.SingleMessage(payload=b"one", sequence_id=1)
        sent = await raw.request(T.SEND, "send", send_command(msg, producer_id=1, request_id=2))
        assert sent.type == T.SEND_RECEIPT
        again = await create(3, "again", "p")
        assert again.type == T.PRODUCER_SUCCESS
        assert again.producer_success.last_sequence_id == 1
        for topic, name in (("again", "other"), ("elsewhere", "p")):
            refused = await create(4, topic, name)
            assert refused.type == T.ERROR, refused
            assert refused.error.error == pb.INVALID_ARGUMENT
            assert "producer id 1 is in use" in refused.error.message
        await still_works(raw)


async def test_send_with_bad_sequence_ids_or_partition(broker: BrokerProcess) -> None:
    async with RawConnection(broker.url) as raw:
        await raw.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(request_id=1, producer_id=1, topic="seq", producer_name="p"),
        )
        msgs = [pb.SingleMessage(payload=b"a", sequence_id=5), pb.SingleMessage(sequence_id=4)]
        answer = await raw.request(T.SEND, "send", send_command(*msgs, producer_id=1, request_id=2))
        assert answer.send_error.error == pb.INVALID_ARGUMENT
        assert "must increase" in answer.send_error.message
        answer = await raw.request(
            T.SEND, "send", send_command(*msgs, producer_id=1, request_id=3, partition=9)
        )
        assert answer.send_error.error == pb.INVALID_ARGUMENT
        empty = await raw.request(T.SEND, "send", pb.CommandSend(producer_id=1, request_id=4))
        assert empty.send_error.error == pb.INVALID_ARGUMENT
        ends = [pb.SingleMessage(payload=b"a", sequence_id=4), pb.SingleMessage(sequence_id=6)]
        claim = send_command(*ends, producer_id=1, request_id=5, first_sequence_id=4)
        answer = await raw.request(T.SEND, "send", claim)
        assert answer.send_error.error == pb.INVALID_ARGUMENT
        assert "first_sequence_id 4 says the 2 messages" in answer.send_error.message
        await still_works(raw)
    _, body = broker.admin("GET", "/admin/v1/topics/seq/stats")
    assert json.loads(body)["partitions"][0]["entries"] == 0


async def test_ack_of_unknown_message_id(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("acks", "s", initial_position="earliest")
        producer = await client.create_producer("acks")
        await producer.send(b"one")
        msg = await consumer.receive(timeout=5)
        from client import MessageId

        for bad in (
            MessageId(msg.message_id.partition, msg.message_id.entry_id + 5, 0),
            MessageId(msg.message_id.partition, msg.message_id.entry_id, 3),
            MessageId(4, 0, 0),
        ):
            with pytest.raises(errors.UnknownMessageIdError, match="no message"):
                await consumer.acknowledge(bad)
        # Nothing changed: the message is still unacked, then acks fine.
        _, body = broker.admin("GET", "/admin/v1/topics/acks/stats")
        assert json.loads(body)["partitions"][0]["subscriptions"]["s"]["backlog"] == 1
        await consumer.acknowledge(msg)
        _, body = broker.admin("GET", "/admin/v1/topics/acks/stats")
        assert json.loads(body)["partitions"][0]["subscriptions"]["s"]["backlog"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"not json", "must be JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"partitions": "three"}', "partitions must be an integer"),
        (b'{"partitions": 0}', "partitions must be an integer from 1"),
        (b'{"partitions": 100000}', "partitions must be an integer from 1"),
        (b'{"partitions": true}', "partitions must be an integer"),
        (b'{"partitons": 2}', "unknown field"),
    ],
)
async def test_admin_rejects_bad_bodies(broker: BrokerProcess, body: bytes, message: str) -> None:
    status, answer = broker.admin("PUT", "/admin/v1/topics/adm", body)
    assert status == 400
    assert message in json.loads(answer)["error"]
    assert topics(broker) == []
    assert broker.admin("GET", "/admin/v1/health") == (200, b'{"status": "ok"}')


async def test_admin_partition_count_cannot_shrink(broker: BrokerProcess) -> None:
    assert broker.admin("PUT", "/admin/v1/topics/grow", b'{"partitions": 3}')[0] == 200
    status, answer = broker.admin("PUT", "/admin/v1/topics/grow", b'{"partitions": 2}')
    assert status == 400 and b"can grow but not shrink" in answer
    status, answer = broker.admin("PUT", "/admin/v1/topics/grow", b'{"partitions": 4}')
    assert (status, json.loads(answer)["partitions"]) == (200, 4)
    status, answer = broker.admin("GET", "/admin/v1/topics/nope/stats")
    assert status == 404


async def test_ack_ranges_must_be_whole_quadruples(broker: BrokerProcess) -> None:
    """CommandAck.ranges: whole (partition, entry, first, last) quadruples,
    at least one, none empty or absurdly long; a refused ACK acks nothing."""
    async with Client(broker.url) as client:
        producer = await client.create_producer("triples")
        await producer.send(b"one")
    async with RawConnection(broker.url) as raw:
        subscribed = await raw.request(
            T.SUBSCRIBE,
            "subscribe",
            pb.CommandSubscribe(
                request_id=1,
                consumer_id=1,
                topic="triples",
                subscription="s",
                initial_position=pb.CommandSubscribe.EARLIEST,
            ),
        )
        assert subscribed.type == T.SUCCESS
        await raw.send(T.FLOW, "flow", pb.CommandFlow(consumer_id=1, permits=10))
        delivered = await raw.receive()
        assert delivered.type == T.MESSAGE
        entry = delivered.message.entries[0]
        bad = [
            pb.CommandAck(consumer_id=1, request_id=2, ranges=[0, entry.entry_id, 0]),
            pb.CommandAck(consumer_id=1, request_id=3),  # names no message
            pb.CommandAck(consumer_id=1, request_id=5, ranges=[0, entry.entry_id, 1, 0]),
            pb.CommandAck(consumer_id=1, request_id=6, ranges=[0, entry.entry_id, 0, 2**40]),
        ]
        for ack in bad:
            answer = await raw.request(T.ACK, "ack", ack)
            assert answer.ack_response.error == pb.INVALID_ARGUMENT, answer
            assert "quadruples" in answer.ack_response.message or "range" in (
                answer.ack_response.message
            )
        _, body = broker.admin("GET", "/admin/v1/topics/triples/stats")
        assert json.loads(body)["partitions"][0]["subscriptions"]["s"]["backlog"] == 1
        good = pb.CommandAck(consumer_id=1, request_id=4, ranges=[0, entry.entry_id, 0, 0])
        answer = await raw.request(T.ACK, "ack", good)
        assert answer.type == T.ACK_RESPONSE and not answer.ack_response.HasField("error")
        _, body = broker.admin("GET", "/admin/v1/topics/triples/stats")
        assert json.loads(body)["partitions"][0]["subscriptions"]["s"]["backlog"] == 0


async def test_send_batch_is_checked_and_stored_as_sent(broker: BrokerProcess) -> None:
    """CommandSend.batch: a valid EntryBatch of at least one message,
    without a producer name; refused ones store nothing."""
    msg = pb.SingleMessage(payload=b"kept", sequence_id=1, key="k")
    good = pb.EntryBatch(messages=[msg]).SerializeToString()
    async with RawConnection(broker.url) as raw:
        await raw.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(request_id=1, producer_id=1, topic="encoded", producer_name="p"),
        )
        bad = [
            (pb.CommandSend(producer_id=1, request_id=2, batch=b"\xff\xff"), pb.MALFORMED_FRAME),
            (pb.CommandSend(producer_id=1, request_id=3), pb.INVALID_ARGUMENT),  # no messages
            (
                pb.CommandSend(
                    producer_id=1,
                    request_id=4,
                    batch=pb.EntryBatch(messages=[msg], producer_name="x").SerializeToString(),
                ),
                pb.INVALID_ARGUMENT,
            ),
        ]
        for send, code in bad:
            answer = await raw.request(T.SEND, "send", send)
            assert answer.type == T.SEND_ERROR and answer.send_error.error == code, answer
        answer = await raw.request(
            T.SEND, "send", pb.CommandSend(producer_id=1, request_id=5, batch=good)
        )
        assert answer.type == T.SEND_RECEIPT
    async with Client(broker.url) as client:
        consumer = await client.subscribe("encoded", "s", initial_position="earliest")
        got = await consumer.receive(timeout=10)
        assert (got.value, got.key) == (b"kept", "k")
    _, body = broker.admin("GET", "/admin/v1/topics/encoded/stats")
    assert json.loads(body)["partitions"][0]["messages"] == 1


async def test_connect_with_another_protocol_version_is_refused(broker: BrokerProcess) -> None:
    """A CONNECT asking for another wire protocol version is answered with
    an ERROR naming both versions; nothing after it is served and the broker
    closes the connection. Other connections are served as ever."""
    hello = pb.BaseCommand(type=T.CONNECT, connect=pb.CommandConnect(protocol_version=5))
    ping = pb.BaseCommand(type=T.PING, ping=pb.CommandPing())
    async with aiohttp.ClientSession() as session, session.ws_connect(broker.url + "/ws") as ws:
        await ws.send_bytes(hello.SerializeToString())
        await ws.send_bytes(ping.SerializeToString())  # right behind: not answered
        answer = pb.BaseCommand.FromString((await ws.receive(timeout=10)).data)
        assert answer.type == T.ERROR and answer.error.error == pb.INVALID_ARGUMENT
        assert "CONNECT asks for wire protocol version 5" in answer.error.message
        assert f"speaks version {PROTOCOL_VERSION} only" in answer.error.message
        closing = await ws.receive(timeout=10)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closing
    async with RawConnection(broker.url) as raw:
        await still_works(raw)
