"""Authentication, the ACL, TLS and the limits on one client, against real
broker processes (docs/security.md, `broker._auth`).

The ``broker`` fixture authenticates here (the module is marked ``auth``):
``TXNBUF_TOKEN`` and `BrokerProcess.token` hold a superuser's token, and
`BrokerProcess.make_token` makes one for any role.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from broker._connection import PROTOCOL_VERSION
from client import Client, Consumer, errors
from proto import txnbuf_pb2 as pb
from tests.conftest import BrokerProcess, RawConnection, free_port, send_command

pytestmark = [pytest.mark.integration, pytest.mark.auth]

T = pb.BaseCommand


def admin_json(
    broker: BrokerProcess, method: str, path: str, body: Any = None, token: str | None = None
) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    status, raw = broker.admin(method, path, data, token)
    return status, json.loads(raw)


def change_acl(
    broker: BrokerProcess, action: str, role: str, permission: str, resource: str
) -> None:
    """POST /admin/v1/acl/grant or /revoke (``action``), which must succeed."""
    body = {"role": role, "permission": permission, "resource": resource}
    status, answer = admin_json(broker, "POST", f"/admin/v1/acl/{action}", body)
    assert status == 200, answer


def grant(broker: BrokerProcess, role: str, permission: str, resource: str) -> None:
    change_acl(broker, "grant", role, permission, resource)


def revoke(broker: BrokerProcess, role: str, permission: str, resource: str) -> None:
    change_acl(broker, "revoke", role, permission, resource)


def topic_names(broker: BrokerProcess) -> set[str]:
    status, body = admin_json(broker, "GET", "/admin/v1/topics")
    assert status == 200
    return {t["name"] for t in body["topics"]}


async def nothing_more(consumer: Consumer, wait: float = 0.5) -> None:
    with pytest.raises(errors.OperationTimeoutError):
        msg = await consumer.receive(timeout=wait)
        pytest.fail(f"unexpected message {msg.value!r}")


async def refused_and_closed(url: str, frames: list[T]) -> T:
    """Send ``frames`` on a fresh socket; the broker's first answer, after
    checking that the broker then closed the socket."""
    async with aiohttp.ClientSession() as session, session.ws_connect(url + "/ws") as ws:
        for frame in frames:
            await ws.send_bytes(frame.SerializeToString())
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.BINARY, msg
        answer = T.FromString(msg.data)
        closing = await ws.receive(timeout=10)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED), closing
        return answer


def frame(kind: int, field: str, body: Any) -> T:
    cmd = T(type=kind)  # type: ignore[arg-type]
    getattr(cmd, field).CopyFrom(body)
    return cmd


def connect(token: str = "", method: str = "token") -> T:
    hello = pb.CommandConnect(protocol_version=PROTOCOL_VERSION)
    if token:
        hello.auth_method = method
        hello.auth_data = token.encode()
    return frame(T.CONNECT, "connect", hello)


# Every command a client may send, as one would send it without CONNECT.
COMMANDS = [
    (T.PARTITIONED_METADATA, "partitioned_metadata",
     pb.CommandPartitionedMetadata(request_id=1, topic="secret")),
    (T.LOOKUP, "lookup", pb.CommandLookupTopic(request_id=2, topic="secret")),
    (T.PRODUCER, "producer",
     pb.CommandProducer(request_id=3, producer_id=1, topic="secret", producer_name="p")),
    (T.SEND, "send",
     send_command(pb.SingleMessage(payload=b"x"), producer_id=1, request_id=4)),
    (T.CLOSE_PRODUCER, "close_producer", pb.CommandCloseProducer(request_id=5, producer_id=1)),
    (T.SUBSCRIBE, "subscribe",
     pb.CommandSubscribe(request_id=6, consumer_id=1, topic="secret", subscription="s")),
    (T.FLOW, "flow", pb.CommandFlow(consumer_id=1, permits=10)),
    (T.ACK, "ack", pb.CommandAck(consumer_id=1, request_id=7)),
    (T.REDELIVER_UNACKNOWLEDGED, "redeliver_unacknowledged",
     pb.CommandRedeliverUnacknowledged(consumer_id=1)),
    (T.CLOSE_CONSUMER, "close_consumer", pb.CommandCloseConsumer(request_id=8, consumer_id=1)),
    (T.PING, "ping", pb.CommandPing()),
    (T.NEW_TXN, "new_txn", pb.CommandNewTxn(request_id=9, txn_ttl_ms=60_000)),
    (T.ADD_PARTITION_TO_TXN, "add_partition_to_txn",
     pb.CommandAddPartitionToTxn(request_id=10, txnid_least_bits=1,
                                 partitions=[pb.PartitionRef(topic="secret")])),
    (T.ADD_SUBSCRIPTION_TO_TXN, "add_subscription_to_txn",
     pb.CommandAddSubscriptionToTxn(request_id=11, txnid_least_bits=1,
                                    subscriptions=[pb.SubscriptionRef(topic="secret",
                                                                      subscription="s")])),
    (T.END_TXN, "end_txn", pb.CommandEndTxn(request_id=12, txnid_least_bits=1)),
    (T.END_TXN_ON_PARTITION, "end_txn_on_partition",
     pb.CommandEndTxnOnPartition(request_id=13, txnid_least_bits=1,
                                 partition=pb.PartitionRef(topic="secret"))),
    (T.END_TXN_ON_SUBSCRIPTION, "end_txn_on_subscription",
     pb.CommandEndTxnOnSubscription(request_id=14, txnid_least_bits=1,
                                    subscription=pb.SubscriptionRef(topic="secret",
                                                                    subscription="s"))),
    (T.GROUP_CURSORS, "group_cursors",
     pb.CommandGroupCursors(request_id=15, subscription="s", commit=True,
                            positions=[pb.CursorAt(topic="secret", entry_id=1)])),
]  # fmt: skip


async def test_every_command_is_refused_without_a_token(broker: BrokerProcess) -> None:
    assert "tokens required" in broker.log()  # (the module's `auth` mark)
    for kind, field, body in COMMANDS:
        # Without CONNECT, and after a CONNECT without a token.
        for frames in ([frame(kind, field, body)], [connect(), frame(kind, field, body)]):
            answer = await refused_and_closed(broker.url, frames)
            assert answer.type == T.ERROR, (kind, answer)
            assert answer.error.error == pb.AUTHENTICATION_ERROR, (kind, answer)
    answer = await refused_and_closed(broker.url, [connect()])
    assert "needs a token" in answer.error.message
    # The client: refused at once, not retried until its timeout.
    started = time.monotonic()
    with pytest.raises(errors.AuthenticationError, match="needs a token"):
        async with Client(broker.url, token="", operation_timeout=20):
            pass
    assert time.monotonic() - started < 5
    # Nothing was created, nothing opened.
    assert "secret" not in topic_names(broker)
    status, body = admin_json(broker, "GET", "/admin/v1/transactions")
    assert status == 200 and body["transactions"] == []
    assert "Traceback" not in broker.log()


async def test_a_bad_or_expired_token_is_refused(broker: BrokerProcess, tmp_path: Path) -> None:
    expired = broker.make_token("admin", expires_in=-10)
    stranger = BrokerProcess(tmp_path / "other", tmp_path / "other.log", auth=True).token
    assert stranger is not None
    for token, why in (
        (expired, "expired"),
        (stranger, "Signature verification failed"),
        ("not-a-jwt", "not valid"),
    ):
        answer = await refused_and_closed(broker.url, [connect(token)])
        assert answer.error.error == pb.AUTHENTICATION_ERROR and why in answer.error.message
        with pytest.raises(errors.AuthenticationError, match=why):
            async with Client(broker.url, token=token):
                pass
        status, body = admin_json(broker, "GET", "/admin/v1/topics", token=token)
        assert status == 401 and why in body["error"], body
    answer = await refused_and_closed(broker.url, [connect(broker.token or "", method="basic")])
    assert "unknown auth_method 'basic'" in answer.error.message
    # A token in TXNBUF_TOKEN (set by the fixture) is what Client uses by default.
    async with Client(broker.url) as client:
        producer = await client.create_producer("fine")
        await producer.send(b"x")


async def test_the_admin_api_needs_a_superuser(broker: BrokerProcess) -> None:
    app = broker.make_token("app")
    for method, path in (
        ("GET", "/admin/v1/topics"),
        ("PUT", "/admin/v1/topics/t"),
        ("GET", "/admin/v1/transactions"),
        ("POST", "/admin/v1/transactions/(0,1)/abort"),
        ("GET", "/admin/v1/acl"),
        ("POST", "/admin/v1/acl/grant"),
        ("GET", "/metrics"),
    ):
        status, body = admin_json(broker, method, path, token="")
        assert status == 401 and "needs a token" in body["error"], (path, body)
        status, body = admin_json(broker, method, path, token=app)
        assert status == 403 and "lacks the 'admin' role" in body["error"], (path, body)
    req_status, raw = broker.admin("GET", "/admin/v1/health", token="")
    assert req_status == 200 and json.loads(raw) == {"status": "ok"}
    status, _ = broker.admin("GET", "/metrics")
    assert status == 200
    assert "t" not in topic_names(broker)  # the refused PUT created nothing
    # Bad grants are refused with what is wrong, and change nothing.
    for body, message in (
        ({"role": "app", "permission": "produce"}, "body must be"),
        ({"role": "a b", "permission": "produce", "resource": "topic:x"}, "invalid role"),
        ({"role": "app", "permission": "write", "resource": "topic:x"}, "unknown permission"),
        ({"role": "app", "permission": "produce", "resource": "queue:x"}, "unknown resource"),
        ({"role": "app", "permission": "produce", "resource": "subscription:x/y"}, "cannot be"),
        ({"role": "app", "permission": "consume", "resource": "subscription:x"}, "must be"),
        ({"role": "app", "permission": "consume", "resource": "topic:" + "x" * 5000}, "invalid"),
    ):
        status, answer = admin_json(broker, "POST", "/admin/v1/acl/grant", body)
        assert status == 400 and message in answer["error"], (body, answer)
        assert len(answer["error"]) < 600
    status, answer = admin_json(
        broker,
        "POST",
        "/admin/v1/acl/revoke",
        {"role": "app", "permission": "produce", "resource": "topic:x"},
    )
    assert status == 404 and "no such grant" in answer["error"]
    assert admin_json(broker, "GET", "/admin/v1/acl")[1] == {"acl": []}


async def test_a_role_gets_what_the_acl_grants_and_loses_what_is_revoked(
    broker: BrokerProcess,
) -> None:
    app = broker.make_token("app")
    async with Client(broker.url, token=app) as client:
        # Nothing granted: no produce, no consume, and nothing created.
        with pytest.raises(errors.AuthorizationError, match="'produce'"):
            await client.create_producer("orders-1")
        with pytest.raises(errors.AuthorizationError, match="'consume'"):
            await client.subscribe("orders-1", "billing")
        assert "orders-1" not in topic_names(broker)
        # produce on orders-*: produce there, nowhere else, and no consume.
        grant(broker, "app", "produce", "topic:orders-*")
        producer = await client.create_producer("orders-1")
        await producer.send(b"one")
        with pytest.raises(errors.AuthorizationError, match="'produce'"):
            await client.create_producer("payments")
        with pytest.raises(errors.AuthorizationError, match="lacks the 'consume' permission"):
            await client.subscribe("orders-1", "billing", initial_position="earliest")
        grant(broker, "app", "consume", "topic:orders-*")
        consumer = await client.subscribe("orders-1", "billing", initial_position="earliest")
        msg = await consumer.receive(timeout=10)
        assert msg.value == b"one"
        # Revoked: the next send and the next ack are refused.
        revoke(broker, "app", "produce", "topic:orders-*")
        with pytest.raises(errors.AuthorizationError, match="'produce' permission on topic"):
            await producer.send(b"two")
        revoke(broker, "app", "consume", "topic:orders-*")
        with pytest.raises(errors.AuthorizationError, match="'consume'"):
            await consumer.acknowledge(msg)
        with pytest.raises(errors.AuthorizationError, match="'consume'"):
            await consumer.seek(0)
        with pytest.raises(errors.AuthorizationError, match="'consume'"):
            await consumer.unsubscribe()
    # The ACL is in the data directory: it survives a restart.
    grant(broker, "app", "produce", "topic:orders-*")
    broker.restart()
    status, body = admin_json(broker, "GET", "/admin/v1/acl?role=app")
    assert status == 200
    assert body == {"acl": [{"role": "app", "permission": "produce", "resource": "topic:orders-*"}]}
    async with Client(broker.url, token=app) as client:
        producer = await client.create_producer("orders-2")
        await producer.send(b"three")
    async with Client(broker.url) as client:  # (the superuser's token)
        reader = await client.subscribe("orders-1", "audit", initial_position="earliest")
        assert (await reader.receive(timeout=10)).value == b"one"
        await nothing_more(reader)  # "two" was refused


async def test_a_subscription_someone_is_granted_is_closed_to_the_others(
    broker: BrokerProcess,
) -> None:
    for role in ("billing", "audit"):
        grant(broker, role, "consume", "topic:orders")
    grant(broker, "billing", "consume", "subscription:orders/bill*")
    async with Client(broker.url, token=broker.make_token("audit")) as audit:
        with pytest.raises(errors.AuthorizationError, match="subscription 'billing'"):
            await audit.subscribe("orders", "billing")
        await audit.subscribe("orders", "audit-log")  # nobody named it: open
    async with Client(broker.url, token=broker.make_token("billing")) as billing:
        await billing.subscribe("orders", "billing")


async def test_transactions_need_what_they_touch_and_participants_the_cluster_role(
    broker: BrokerProcess,
) -> None:
    for role in ("writer", "driver"):
        grant(broker, role, "produce", "topic:out")
    grant(broker, "writer", "consume", "topic:out")
    writer_token = broker.make_token("writer")
    async with Client(broker.url, token=writer_token) as writer:
        sink = await writer.subscribe("out", "reader", initial_position="earliest")
        producer = await writer.create_producer("out")
        txn = await writer.new_transaction(timeout=60)
        txn.flush()  # (the full path: its send is written, "out" is its participant)
        await producer.send(b"in-txn", txn=txn)
        most, least = txn.id
        end = pb.CommandEndTxn(request_id=1, txnid_most_bits=most, txnid_least_bits=least)
        forged = pb.CommandEndTxnOnPartition(
            request_id=2,
            txnid_most_bits=most,
            txnid_least_bits=least,
            partition=pb.PartitionRef(topic="out", partition=0),
            txn_action=pb.COMMIT,
        )
        add = pb.CommandAddPartitionToTxn(
            request_id=3,
            txnid_most_bits=most,
            txnid_least_bits=least,
            partitions=[pb.PartitionRef(topic="out", partition=0)],
        )
        # A role with nothing on "out" can neither end it nor add to it; a
        # superuser without the cluster role cannot end it on the partition.
        async with RawConnection(broker.url, token=broker.make_token("stranger")) as raw:
            for kind, field, body in (
                (T.END_TXN, "end_txn", end),
                (T.ADD_PARTITION_TO_TXN, "add_partition_to_txn", add),
            ):
                answer = await raw.request(kind, field, body)
                assert answer.txn_response.error == pb.AUTHORIZATION_ERROR, answer
                assert "'produce' permission on topic 'out'" in answer.txn_response.message
        async with RawConnection(broker.url) as raw:
            answer = await raw.request(T.END_TXN_ON_PARTITION, "end_txn_on_partition", forged)
            assert answer.txn_response.error == pb.AUTHORIZATION_ERROR
            assert "'cluster' role" in answer.txn_response.message
        status, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert meta["status"] == "OPEN"
        await nothing_more(sink)
        # The driver may write where the transaction wrote: it may end it by id.
        end.txn_action = pb.ABORT
        async with RawConnection(broker.url, token=broker.make_token("driver")) as raw:
            answer = await raw.request(T.END_TXN, "end_txn", end)
            assert not answer.txn_response.HasField("error"), answer
        status, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert status == 200 and meta["status"] in ("ABORTING", "ABORTED")
        await nothing_more(sink)
        # And a transaction of the writer's own commits as usual.
        async with writer.transaction() as txn2:
            await producer.send(b"committed", txn=txn2)
        assert (await sink.receive(timeout=10)).value == b"committed"


async def test_the_producer_epoch_mode_needs_its_transactional_id(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.args = ["--allow-2pc"]
    broker.start()
    try:
        grant(broker, "copier", "produce", "topic:out")
        grant(broker, "copier", "consume", "topic:out")
        grant(broker, "stranger", "produce", "topic:out")
        async with Client(broker.url, token=broker.make_token("copier")) as client:
            reader = await client.subscribe("out", "reader", initial_position="earliest")
            producer = await client.create_transactional_producer("copier-1")
            with pytest.raises(
                errors.AuthorizationError, match="'produce' permission on transactional id"
            ):
                await producer.init_transactions()
            grant(broker, "copier", "produce", "transactional-id:copier-*")
            await producer.init_transactions()
            await producer.begin_transaction()
            await producer.send("out", b"kept")
            # Another role that may write to "out" but not as copier-1 can
            # neither end nor write into copier-1's transaction.
            pid, epoch = producer.producer_id, producer.epoch
            async with RawConnection(broker.url, token=broker.make_token("stranger")) as raw:
                for kind, field, body in (
                    (T.END_PRODUCER_TXN, "end_producer_txn", pb.CommandEndProducerTxn(
                        request_id=1, producer_id=pid, producer_epoch=epoch,
                        txn_action=pb.ABORT)),
                    (T.PREPARE_PRODUCER_TXN, "prepare_producer_txn",
                     pb.CommandPrepareProducerTxn(request_id=2, producer_id=pid,
                                                  producer_epoch=epoch)),
                    (T.PRODUCE, "produce", pb.CommandProduce(
                        request_id=3, topic="out", producer_id=pid, producer_epoch=epoch,
                        first_sequence=1, batch=pb.EntryBatch(
                            messages=[pb.SingleMessage(payload=b"forged")]
                        ).SerializeToString())),
                ):  # fmt: skip
                    answer = await raw.request(kind, field, body)
                    assert answer.producer_txn_response.error == pb.AUTHORIZATION_ERROR, answer
                    assert "transactional id 'copier-1'" in answer.producer_txn_response.message
            await producer.commit_transaction()
            assert (await reader.receive(timeout=10)).value == b"kept"
            await nothing_more(reader)
            # Two-phase commit needs two_phase_commit as well.
            two_phase = await client.create_transactional_producer("copier-2pc", enable_2pc=True)
            with pytest.raises(errors.AuthorizationError, match="'two_phase_commit'"):
                await two_phase.init_transactions()
            grant(broker, "copier", "two_phase_commit", "transactional-id:copier-2pc")
            await two_phase.init_transactions()
    finally:
        broker.stop()
        sys.stderr.write(broker.log())


async def test_a_token_that_expires_ends_its_connection(broker: BrokerProcess) -> None:
    short = broker.make_token("admin", expires_in=2)
    async with RawConnection(broker.url, token=short) as raw:
        answer = await raw.request(T.PING, "ping", pb.CommandPing())
        assert answer.type == T.PONG
        answer = await raw.receive(timeout=10)
        assert answer.error.error == pb.AUTHENTICATION_ERROR
        assert "expired" in answer.error.message
        closing = await raw.ws.receive(timeout=10)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


async def test_a_connection_keeps_its_role(broker: BrokerProcess) -> None:
    async with RawConnection(broker.url, token=broker.make_token("app")) as raw:
        await raw.send(T.CONNECT, "connect", connect(broker.token or "").connect)
        answer = await raw.receive()
        assert answer.error.error == pb.AUTHENTICATION_ERROR
        assert "this connection is role 'app'; a CONNECT cannot change it" in answer.error.message
        closing = await raw.ws.receive(timeout=10)
        assert closing.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost, signed by its own key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "txnbuf test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


async def test_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.tls = (cert, key, cert)
    broker.start()
    try:
        assert broker.url.startswith("https://")
        async with Client(broker.url, token=broker.token, tls_ca=cert) as client:
            consumer = await client.subscribe("secure", "s", initial_position="earliest")
            producer = await client.create_producer("secure")
            await producer.send(b"over tls")
            assert (await consumer.receive(timeout=10)).value == b"over tls"
        status, _ = broker.admin("GET", "/admin/v1/topics")  # https, with the CA
        assert status == 200
        # Without the CA the certificate is not trusted: at once, and clearly.
        started = time.monotonic()
        with pytest.raises(errors.BrokerConnectionError, match="certificate is not trusted"):
            async with Client(broker.url, token=broker.token, operation_timeout=20):
                pass
        assert time.monotonic() - started < 5
        with pytest.raises(errors.InvalidInputError, match="tls_ca"):
            Client(broker.url, tls_ca=tmp_path / "missing.pem")
        with pytest.raises(errors.InvalidInputError, match="https"):
            Client(broker.url.replace("https", "http"), tls_ca=cert)
    finally:
        broker.stop()
        sys.stderr.write(broker.log())


async def test_limits_on_connections_producers_and_consumers(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.args = [
        "--max-connections", "2",
        "--max-producers-per-connection", "2",
        "--max-consumers-per-connection", "1",
    ]  # fmt: skip
    broker.start()
    try:
        async with Client(broker.url, token=broker.token) as client:
            for i in range(2):
                await client.create_producer("limited", f"p{i}")
            with pytest.raises(errors.NotAllowedError, match="max-producers-per-connection 2"):
                await client.create_producer("limited", "p2")
            await client.subscribe("limited", "s0")
            with pytest.raises(errors.NotAllowedError, match="max-consumers-per-connection 1"):
                await client.subscribe("limited", "s1")
            async with RawConnection(broker.url, token=broker.token):
                answer = await refused_and_closed(broker.url, [connect(broker.token or "")])
                assert answer.error.error == pb.TOO_MANY_REQUESTS
                assert "--max-connections 2" in answer.error.message
            status, stats = admin_json(broker, "GET", "/admin/v1/topics/limited/stats")
            assert status == 200 and stats["producers"] == 2
    finally:
        broker.stop()
        sys.stderr.write(broker.log())


def txnbuf(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


def test_serve_refuses_an_open_address_without_authentication(tmp_path: Path) -> None:
    result = txnbuf("serve", "--host", "0.0.0.0", "--port", str(free_port()),
                    "--data-dir", str(tmp_path / "d"))  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "txnbuf: refusing to listen on 0.0.0.0 without authentication: give "
        "--auth-secret-key-file or --auth-public-key-file, or --insecure to let anyone who "
        "reaches the port do anything"
    ]
    assert not (tmp_path / "d").exists()
    for args, message in (
        (["--auth-secret-key-file", str(tmp_path / "none")], "cannot read the secret key file"),
        (["--tls-cert", str(tmp_path / "c.pem")], "--tls-cert and --tls-key go together"),
    ):
        result = txnbuf("serve", "--data-dir", str(tmp_path / "d"), *args)
        assert result.returncode == 1 and message in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr


async def test_token_and_acl_commands(broker: BrokerProcess, tmp_path: Path) -> None:
    key = tmp_path / "secret.key"
    assert txnbuf("token", "create-secret-key", "--output", str(key)).returncode == 0
    again = txnbuf("token", "create-secret-key", "--output", str(key))
    assert again.returncode == 1 and "exists already" in again.stderr
    made = txnbuf("token", "create", "--subject", "app", "--secret-key-file", str(key),
                  "--expires", "1h")  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert made.stdout.count(".") == 2  # header.claims.signature
    bad = txnbuf("token", "create", "--subject", "app", "--secret-key-file", str(key),
                 "--expires", "soon")  # fmt: skip
    assert bad.returncode == 1 and "not a duration: 'soon'" in bad.stderr
    # acl over the admin API: the token from TXNBUF_TOKEN, or --token.
    url = ["--url", broker.url]
    granted = txnbuf("acl", "grant", "--role", "app", "--permission", "produce",
                     "--topic", "orders-*", *url)  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    txnbuf("acl", "grant", "--role", "app", "--permission", "consume",
           "--subscription", "orders-*/billing", *url)  # fmt: skip
    listed = txnbuf("acl", "list", *url)
    assert listed.stdout.splitlines() == [
        "app\tconsume\tsubscription:orders-*/billing",
        "app\tproduce\ttopic:orders-*",
    ]
    refused = txnbuf("acl", "list", *url, "--token", broker.make_token("app"))
    assert refused.returncode == 1
    assert refused.stderr.startswith("txnbuf: the broker refused (403): role 'app' lacks")
    anonymous = txnbuf("acl", "list", *url, env={"TXNBUF_TOKEN": ""})
    assert anonymous.returncode == 1 and "(401)" in anonymous.stderr
    wrong = txnbuf("acl", "grant", "--role", "app", "--permission", "two_phase_commit",
                   "--topic", "x", *url)  # fmt: skip
    assert wrong.returncode == 1
    assert "two_phase_commit cannot be granted on a topic" in wrong.stderr
    revoked = txnbuf("acl", "revoke", "--role", "app", "--permission", "produce",
                     "--topic", "orders-*", *url)  # fmt: skip
    assert revoked.returncode == 0, revoked.stderr
    assert txnbuf("acl", "list", "--role", "app", *url).stdout.splitlines() == [
        "app\tconsume\tsubscription:orders-*/billing"
    ]
    gone = txnbuf("acl", "revoke", "--role", "app", "--permission", "produce",
                  "--topic", "orders-*", *url)  # fmt: skip
    assert gone.returncode == 1 and "no such grant" in gone.stderr


async def test_a_broker_with_a_public_key_accepts_tokens_of_its_private_key(
    tmp_path: Path,
) -> None:
    private, public = tmp_path / "private.pem", tmp_path / "public.pem"
    made = txnbuf("token", "create-key-pair", "--private-key-file", str(private),
                  "--public-key-file", str(public), "--algorithm", "ES256")  # fmt: skip
    assert made.returncode == 0, made.stderr
    token = txnbuf("token", "create", "--subject", "admin",
                   "--private-key-file", str(private)).stdout.strip()  # fmt: skip
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.args = ["--auth-public-key-file", str(public)]
    broker.token = token
    broker.start()
    try:
        async with Client(broker.url, token=token) as client:
            producer = await client.create_producer("signed")
            await producer.send(b"x")
        other = BrokerProcess(tmp_path / "o", tmp_path / "o.log", auth=True).token
        with pytest.raises(errors.AuthenticationError, match="not valid"):
            async with Client(broker.url, token=other):  # an HS256 token: not accepted here
                pass
    finally:
        broker.stop()
        sys.stderr.write(broker.log())


async def test_without_a_key_every_connection_may_do_all_but_the_cluster_role(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.start()
    try:
        async with Client(broker.url, token="") as client:
            producer = await client.create_producer("open")
            await producer.send(b"x")
        status, _ = broker.admin("GET", "/admin/v1/topics")
        assert status == 200
        async with RawConnection(broker.url, token="") as raw:
            answer = await raw.request(
                T.END_TXN_ON_PARTITION,
                "end_txn_on_partition",
                pb.CommandEndTxnOnPartition(request_id=1, partition=pb.PartitionRef(topic="open")),
            )
            assert answer.txn_response.error == pb.AUTHORIZATION_ERROR
            # A Kafka group's commit as a group coordinator forwards it: the
            # brokers' own; refused, and no cursor made or moved.
            answer = await raw.request(
                T.GROUP_CURSORS,
                "group_cursors",
                pb.CommandGroupCursors(
                    request_id=2,
                    subscription="g",
                    commit=True,
                    positions=[pb.CursorAt(topic="open", partition=0, entry_id=1)],
                ),
            )
            reply = answer.group_cursors_response
            assert reply.error == pb.AUTHORIZATION_ERROR and "'cluster' role" in reply.message
            assert not reply.positions
        async with Client(broker.url, token="") as client:
            group = await client.subscribe("open", "g", initial_position="earliest")
            assert (await group.receive(timeout=30)).value == b"x"
    finally:
        broker.stop()
