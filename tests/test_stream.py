"""The data plane on raw TCP (`broker._stream`, ``txnbuf://`` and
``txnbufs://`` URLs), against real broker processes: the client works on
it as on the WebSocket, and the listener checks the same tokens,
permissions, limits and TLS on every command."""

from __future__ import annotations

import asyncio
import struct
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Client, errors
from client._connection import stream_address
from proto import FrameTooLargeError, StreamFrames, stream_frame
from proto import txnbuf_pb2 as pb
from tests.conftest import BrokerProcess, free_port
from tests.test_security import (
    COMMANDS,
    connect,
    frame,
    grant,
    self_signed,
    topic_names,
    txnbuf,
)

pytestmark = [pytest.mark.integration, pytest.mark.auth]

T = pb.BaseCommand


@pytest.fixture
def streaming(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BrokerProcess]:
    """A broker that authenticates, with its stream listener."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.stream_port = free_port()
    assert broker.token is not None
    monkeypatch.setenv("TXNBUF_TOKEN", broker.token)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
        sys.stderr.write(f"----- broker log ({broker.log_path}) -----\n{broker.log()}\n")


class RawStream:
    """A bare connection to the stream listener, frame by frame."""

    async def open(self, port: int) -> RawStream:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", port)
        return self

    def send(self, cmd: Any) -> None:
        self.writer.write(stream_frame(cmd.SerializeToString()))

    async def receive(self) -> Any:
        """The next command (those of a BATCH one by one are not needed here)."""
        async with asyncio.timeout(10):
            (n,) = struct.unpack(">I", await self.reader.readexactly(4))
            return T.FromString(await self.reader.readexactly(n))

    async def closed(self) -> bool:
        """Does the broker close the connection (EOF) within 10 s?"""
        async with asyncio.timeout(10):
            return await self.reader.read() == b""

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()


async def refused_and_closed(port: int, frames: list[Any]) -> Any:
    raw = await RawStream().open(port)
    try:
        for cmd in frames:
            raw.send(cmd)
        answer = await raw.receive()
        assert await raw.closed()
        return answer
    finally:
        await raw.close()


async def test_the_client_works_over_the_stream_and_reconnects(
    streaming: BrokerProcess,
) -> None:
    async with Client(streaming.stream_url) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        out = await client.subscribe("out", "reader", initial_position="earliest")
        seeder = await client.create_producer("in")
        producer = await client.create_producer("out")
        for i in range(3):
            await seeder.send(b"in-%d" % i)
        batch = await source.batch_receive(max_messages=3, timeout=10)
        assert [m.value for m in batch] == [b"in-0", b"in-1", b"in-2"]
        async with client.transaction() as txn:
            for m in batch:
                await producer.send(m.value.replace(b"in", b"out"), txn=txn)
                await source.acknowledge(m, txn=txn)
        got = [(await out.receive(timeout=10)).value for _ in range(3)]
        assert got == [b"out-0", b"out-1", b"out-2"]
        streaming.restart()  # the client reconnects on the stream, and carries on
        await seeder.send(b"after")
        assert (await source.receive(timeout=20)).value == b"after"
        assert client.connections >= 2


async def test_every_command_is_refused_without_a_token_on_the_stream(
    streaming: BrokerProcess,
) -> None:
    port = streaming.stream_port
    assert port is not None
    for kind, field, body in COMMANDS:
        for frames in ([frame(kind, field, body)], [connect(), frame(kind, field, body)]):
            answer = await refused_and_closed(port, frames)
            assert answer.type == T.ERROR, (kind, answer)
            assert answer.error.error == pb.AUTHENTICATION_ERROR, (kind, answer)
    expired = streaming.make_token("admin", expires_in=-10)
    answer = await refused_and_closed(port, [connect(expired)])
    assert answer.error.error == pb.AUTHENTICATION_ERROR and "expired" in answer.error.message
    started = time.monotonic()
    with pytest.raises(errors.AuthenticationError, match="needs a token"):
        async with Client(streaming.stream_url, token="", operation_timeout=20):
            pass
    assert time.monotonic() - started < 5
    assert "secret" not in topic_names(streaming)
    assert "Traceback" not in streaming.log()


async def test_a_role_gets_only_what_the_acl_grants_on_the_stream(
    streaming: BrokerProcess,
) -> None:
    app = streaming.make_token("app")
    async with Client(streaming.stream_url, token=app) as client:
        with pytest.raises(errors.AuthorizationError, match="'produce'"):
            await client.create_producer("orders")
        with pytest.raises(errors.AuthorizationError, match="'consume'"):
            await client.subscribe("orders", "billing")
        assert "orders" not in topic_names(streaming)  # (the refusals created nothing)
        grant(streaming, "app", "produce", "topic:orders")
        producer = await client.create_producer("orders")
        await producer.send(b"one")
    raw = await RawStream().open(streaming.stream_port or 0)
    try:
        raw.send(connect(app))
        assert (await raw.receive()).type == T.CONNECTED
        # A participant's command needs the cluster role, on every listener.
        raw.send(
            frame(
                T.END_TXN_ON_PARTITION,
                "end_txn_on_partition",
                pb.CommandEndTxnOnPartition(request_id=1, partition=pb.PartitionRef(topic="x")),
            )
        )
        answer = await raw.receive()
        assert answer.txn_response.error == pb.AUTHORIZATION_ERROR, answer
    finally:
        await raw.close()


async def test_a_token_that_expires_ends_its_stream(streaming: BrokerProcess) -> None:
    raw = await RawStream().open(streaming.stream_port or 0)
    try:
        raw.send(connect(streaming.make_token("admin", expires_in=2)))
        assert (await raw.receive()).type == T.CONNECTED
        raw.send(frame(T.PING, "ping", pb.CommandPing()))
        assert (await raw.receive()).type == T.PONG
        answer = await raw.receive()  # (within 10 s: the token ends after 2)
        assert answer.error.error == pb.AUTHENTICATION_ERROR and "expired" in answer.error.message
        assert await raw.closed()
    finally:
        await raw.close()


async def test_a_frame_over_the_limit_or_not_a_frame_closes_the_stream_and_a_lookup_names_it(
    streaming: BrokerProcess,
) -> None:
    port = streaming.stream_port or 0
    raw = await RawStream().open(port)
    raw.writer.write(struct.pack(">I", 1 << 30))  # (a length over the limit)
    assert await raw.closed()
    await raw.close()
    raw = await RawStream().open(port)
    raw.writer.write(b"GET /ws HTTP/1.1\r\nHost: x\r\n\r\n")  # (HTTP, on the wrong port)
    assert await raw.closed()
    await raw.close()
    raw = await RawStream().open(port)  # an undecodable frame: answered, the stream stays
    raw.writer.write(stream_frame(b"\xff\xff\xff"))
    answer = await raw.receive()
    assert answer.error.error == pb.MALFORMED_FRAME
    raw.send(connect(streaming.token or ""))
    assert (await raw.receive()).type == T.CONNECTED
    # A lookup on the stream names the stream listener.
    raw.send(frame(T.LOOKUP, "lookup", pb.CommandLookupTopic(request_id=1, topic="t")))
    answer = await raw.receive()
    assert answer.lookup_response.broker_service_url == streaming.stream_url
    await raw.close()


async def test_tls_on_the_stream(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.tls = (cert, key, cert)
    broker.stream_port = free_port()
    broker.start()
    try:
        assert broker.stream_url.startswith("txnbufs://")
        async with Client(broker.stream_url, token=broker.token, tls_ca=cert) as client:
            consumer = await client.subscribe("secure", "s", initial_position="earliest")
            producer = await client.create_producer("secure")
            await producer.send(b"over tls")
            assert (await consumer.receive(timeout=10)).value == b"over tls"
        started = time.monotonic()
        with pytest.raises(errors.BrokerConnectionError, match="certificate is not trusted"):
            async with Client(broker.stream_url, token=broker.token, operation_timeout=20):
                pass
        assert time.monotonic() - started < 5
        # Plain TCP to the TLS listener: nothing is served.
        plain = broker.stream_url.replace("txnbufs://", "txnbuf://")
        with pytest.raises(errors.BrokerConnectionError):
            async with Client(plain, token=broker.token, operation_timeout=3):
                pass
    finally:
        broker.stop()
        sys.stderr.write(broker.log())


async def test_the_connection_limit_counts_stream_connections(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.args = ["--max-connections", "1"]
    broker.stream_port = free_port()
    broker.start()
    try:
        async with Client(broker.stream_url, token=broker.token):
            answer = await refused_and_closed(broker.stream_port, [connect(broker.token or "")])
            assert answer.error.error == pb.TOO_MANY_REQUESTS
            assert "--max-connections 1" in answer.error.message
    finally:
        broker.stop()
        sys.stderr.write(broker.log())


def test_serve_refuses_a_stream_beyond_loopback_without_authentication(tmp_path: Path) -> None:
    """The stream listener listens on ``--host``: the start-up rule that
    refuses another address than loopback without authentication (or
    --insecure) covers it, before anything is created or listened on."""
    ports = ["--port", str(free_port()), "--stream-port", str(free_port())]
    result = txnbuf("serve", "--host", "0.0.0.0", *ports, "--data-dir", str(tmp_path / "d"))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "txnbuf: refusing to listen on 0.0.0.0 without authentication: give "
        "--auth-secret-key-file or --auth-public-key-file, or --insecure to let anyone who "
        "reaches the port do anything"
    ]
    assert not (tmp_path / "d").exists()


# -- units ----------------------------------------------------------------------------


def test_stream_frames_cut_what_was_read_into_frames() -> None:
    frames = StreamFrames(limit=10)
    a, b = stream_frame(b"abc"), stream_frame(b"")
    assert frames.feed(a) == [b"abc"]
    data = a + b + stream_frame(b"0123456789")
    assert frames.feed(data[:5]) == []
    assert frames.feed(data[5:11]) == [b"abc", b""]
    assert frames.feed(data[11:]) == [b"0123456789"]
    with pytest.raises(FrameTooLargeError, match="11 bytes"):
        frames.feed(stream_frame(b"x" * 11))


@pytest.mark.parametrize(
    ("url", "address"),
    [
        ("http://h:1", None),
        ("https://h:1", None),
        ("txnbuf://127.0.0.1:6651", ("127.0.0.1", 6651, False)),
        ("txnbufs://broker.example:443", ("broker.example", 443, True)),
    ],
)
def test_stream_urls(url: str, address: tuple[str, int, bool] | None) -> None:
    assert stream_address(url) == address


@pytest.mark.parametrize(
    "url", ["tcp://h:1", "txnbuf://h", "txnbuf://h:1/ws", "txnbuf://:1", "txnbuf://h:x", "h:1"]
)
def test_bad_stream_urls_are_refused(url: str) -> None:
    with pytest.raises(errors.InvalidInputError):
        stream_address(url)
    with pytest.raises(errors.InvalidInputError):
        Client(url)


async def test_a_listener_told_to_stop_accepting_refuses_new_connections_and_keeps_open_ones(
    tmp_path: Path,
) -> None:
    """What a draining broker (SIGTERM) does on the stream and Kafka listeners:
    a client connecting is refused (and looks elsewhere at once), a
    connection already open is served on."""
    from broker import Broker
    from broker._stream import StreamListener
    from broker.kafka import KafkaListener

    brk = await Broker.open(tmp_path / "data")
    stream = StreamListener(brk, "127.0.0.1", 0)
    kafka = KafkaListener(brk, "127.0.0.1", 0)
    await stream.start()
    await kafka.start()
    try:
        async with Client(f"txnbuf://127.0.0.1:{stream.port}") as client:
            producer = await client.create_producer("t")
            await producer.send(b"before")
            _, kafka_writer = await asyncio.open_connection("127.0.0.1", kafka.port)
            stream.stop_accepting()
            kafka.stop_accepting()
            for port in (stream.port, kafka.port):
                with pytest.raises(ConnectionRefusedError):
                    await asyncio.open_connection("127.0.0.1", port)
            await producer.send(b"after")  # (the open stream goes on)
            assert not kafka_writer.is_closing()
            kafka_writer.close()
    finally:
        await kafka.close()
        await stream.close()
        await brk.close()
