"""Credentials, permissions and TLS on the Kafka port, against real broker
processes that authenticate (`broker.kafka._session`, docs/security.md).

No credentials, a wrong password, an expired token, a token of another
role than the one named: refused, nothing stored. A token that expires ends
its connection. A role gets what the ACL grants it, with the Kafka error
code each refusal calls for, and a refusal changes nothing. The three
clients (aiokafka, kafka-python, confluent-kafka) run the exactly-once
copier (`tests.kafka_copier`) over SASL_SSL as a role with only the grants
it needs. A Kafka address beyond loopback without authentication is
refused at start.
"""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import socket
import ssl
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_response_schema
from kio.serial import entity_reader, entity_writer

from broker.kafka._codec import Api
from tests.conftest import free_port
from tests.kafka_copier import Credentials
from tests.test_kafka import (
    AIOKAFKA,
    CONFLUENT_KAFKA,
    KAFKA_PYTHON,
    KAFKA_PYTHON_WARNINGS,
    KafkaBroker,
    KafkaClient,
    check_copier,
)
from tests.test_security import grant, self_signed, txnbuf

pytestmark = [pytest.mark.integration]

APP = "app"  # the role the tests grant things to


class SecureKafkaBroker(KafkaBroker):
    """A broker with a Kafka listener that authenticates (and serves TLS
    with ``tls``): `creds` makes a client's settings for a role."""

    def __init__(self, data_dir: Path, log_path: Path, tls: bool) -> None:
        super().__init__(data_dir, log_path)
        self.enable_auth()
        if tls:
            cert, key = self_signed(data_dir.parent)
            self.tls = (cert, key, cert)

    def creds(
        self, role: str = APP, mechanism: str = "OAUTHBEARER", token: str | None = None
    ) -> Credentials:
        protocol = "SASL_SSL" if self.tls is not None else "SASL_PLAINTEXT"
        cafile = str(self.tls[2]) if self.tls is not None else None
        token = token if token is not None else self.make_token(role)
        return Credentials(protocol, mechanism, role, token, cafile)

    def grant(self, permission: str, resource: str, role: str = APP) -> None:
        grant(self, role, permission, resource)

    def topics(self) -> set[str]:
        status, body = self.admin("GET", "/admin/v1/topics")
        assert status == 200
        return {t["name"] for t in json.loads(body)["topics"]}

    def messages(self, topic: str) -> int:
        status, body = self.admin("GET", f"/admin/v1/topics/{topic}/stats")
        assert status == 200, body
        return sum(int(p["messages"]) for p in json.loads(body)["partitions"])


def _broker(tmp_path: Path, tls: bool) -> Iterator[SecureKafkaBroker]:
    proc = SecureKafkaBroker(tmp_path / "data", tmp_path / "broker.log", tls)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        sys.stderr.write(f"----- broker log ({proc.log_path}) -----\n{proc.log()}\n")


@pytest.fixture
def sasl_broker(tmp_path: Path) -> Iterator[SecureKafkaBroker]:
    """SASL_PLAINTEXT."""
    yield from _broker(tmp_path, tls=False)


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[SecureKafkaBroker]:
    """SASL_SSL, with a self-signed certificate."""
    yield from _broker(tmp_path, tls=True)


class RawKafka:
    """Kafka requests on a bare socket (TLS with ``cafile``): `call` sends one
    (a kio request object) and decodes its answer."""

    def __init__(self, port: int, cafile: str | None = None) -> None:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        if cafile is not None:
            sock = ssl.create_default_context(cafile=cafile).wrap_socket(
                sock, server_hostname="127.0.0.1"
            )
        self.sock = sock
        self._ids = iter(range(1, 1 << 30))

    def close(self) -> None:
        self.sock.close()

    def send(self, api: int, version: int, req: object) -> int:
        correlation_id = next(self._ids)
        out = io.BytesIO()
        entity_writer(type(req))(out, req)
        head = struct.pack(">hhih", api, version, correlation_id, 4) + b"test"
        if type(req).__flexible__:  # type: ignore[attr-defined]
            head += b"\0"  # (request header v2: no tagged fields)
        frame = head + out.getvalue()
        self.sock.sendall(struct.pack(">i", len(frame)) + frame)
        return correlation_id

    def call(self, api: int, version: int, req: object) -> Any:
        correlation_id = self.send(api, version, req)
        (size,) = struct.unpack(">i", self._recv(4))
        answer = self._recv(size)
        assert struct.unpack_from(">i", answer) == (correlation_id,)
        cls = load_response_schema(api, version)
        start = 5 if cls.__flexible__ and api != Api.API_VERSIONS else 4  # (header v1, v0)
        body, _ = entity_reader(cls)(answer, start)
        return body

    def _recv(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the broker closed the connection")
            out += chunk
        return out

    def closed(self, timeout: float = 10.0) -> bool:
        """True once the broker has closed the connection (within ``timeout``)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionError, ssl.SSLError):
            return True

    def authenticate(self, mechanism: str, auth: bytes, version: int = 1) -> Any:
        from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

        shook = self.call(Api.SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism=mechanism))
        assert shook.error_code == 0 and set(shook.mechanisms) == {"PLAIN", "OAUTHBEARER"}
        return self.call(Api.SASL_AUTHENTICATE, version, SaslAuthenticateRequest(auth_bytes=auth))

    def metadata(self, *topics: str, create: bool = False) -> Any:
        from kio.schema.metadata.v8 import request as m

        req = m.MetadataRequest(
            topics=tuple(m.MetadataRequestTopic(name=t) for t in topics),
            allow_auto_topic_creation=create,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        )
        return self.call(Api.METADATA, 8, req)


def bearer(token: str, authzid: str = "") -> bytes:
    header = f"n,a={authzid}," if authzid else "n,,"
    return f"{header}\x01auth=Bearer {token}\x01\x01".encode()


def plain(user: str, token: str) -> bytes:
    return f"\0{user}\0{token}".encode()


# -- the start-up rule --------------------------------------------------------------------


def test_serve_refuses_a_kafka_address_beyond_loopback_without_authentication(
    tmp_path: Path,
) -> None:
    """The data plane on loopback, the Kafka listener on every interface:
    refused without a key (or --insecure), before anything is created."""
    result = txnbuf("serve", "--port", str(free_port()), "--kafka-port", str(free_port()),
                    "--kafka-host", "0.0.0.0", "--data-dir", str(tmp_path / "d"))  # fmt: skip
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "txnbuf: refusing to listen for Kafka on 0.0.0.0 without authentication: give "
        "--auth-secret-key-file or --auth-public-key-file, or --insecure to let anyone who "
        "reaches the port do anything"
    ]
    assert not (tmp_path / "d").exists()


# -- authentication -----------------------------------------------------------------------


async def test_a_connection_that_has_not_authenticated_is_served_nothing(
    sasl_broker: SecureKafkaBroker,
) -> None:
    """ApiVersions and the SASL exchange only: any other request closes the
    connection unanswered, and creates nothing. A client without
    credentials cannot even start."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError
    from kio.schema.api_versions.v3.request import ApiVersionsRequest
    from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest
    from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest

    before = sasl_broker.topics()
    raw = RawKafka(sasl_broker.kafka_port)
    try:
        versions = raw.call(
            Api.API_VERSIONS,
            3,
            ApiVersionsRequest(client_software_name="t", client_software_version="1"),
        )
        assert {Api.SASL_HANDSHAKE, Api.SASL_AUTHENTICATE} <= {k.api_key for k in versions.api_keys}
        raw.send(Api.METADATA, 8, _metadata_request("not-created"))
        assert raw.closed()
    finally:
        raw.close()
    raw = RawKafka(sasl_broker.kafka_port)
    try:  # SaslAuthenticate before a handshake
        answer = raw.call(Api.SASL_AUTHENTICATE, 1, SaslAuthenticateRequest(auth_bytes=b"x"))
        assert answer.error_code == 34  # ILLEGAL_SASL_STATE
        assert raw.closed()
    finally:
        raw.close()
    raw = RawKafka(sasl_broker.kafka_port)
    try:  # a mechanism not served
        answer = raw.call(Api.SASL_HANDSHAKE, 1, SaslHandshakeRequest(mechanism="SCRAM-SHA-256"))
        assert answer.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
        assert set(answer.mechanisms) == {"OAUTHBEARER", "PLAIN"}
        assert raw.closed()
    finally:
        raw.close()
    producer = AIOKafkaProducer(bootstrap_servers=sasl_broker.bootstrap)
    with pytest.raises(KafkaConnectionError):
        await producer.start()
    await producer.stop()
    assert sasl_broker.topics() == before
    assert "METADATA before SASL authentication" in sasl_broker.log()


def _metadata_request(topic: str) -> Any:
    from kio.schema.metadata.v8 import request as m

    return m.MetadataRequest(
        topics=(m.MetadataRequestTopic(name=topic),),
        allow_auto_topic_creation=True,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


def test_bad_credentials_are_refused_with_the_reason(sasl_broker: SecureKafkaBroker) -> None:
    """Each refused SaslAuthenticate is SASL_AUTHENTICATION_FAILED saying
    why, and closes the connection: a wrong password (PLAIN), an expired
    token, a token of another role than the user (PLAIN) or authorization
    id (OAUTHBEARER) names, credentials that do not parse. A good one is
    served, and told its session's lifetime (none: the token does not
    expire)."""
    app = sasl_broker.make_token(APP)
    expired = sasl_broker.make_token(APP, expires_in=-10)
    cases = [
        ("PLAIN", plain(APP, app[:-4] + "AAAA"), "the token is not valid"),
        ("OAUTHBEARER", bearer(expired), "the token has expired"),
        ("PLAIN", plain("other", app), "the token is role 'app''s, not 'other''s"),
        ("OAUTHBEARER", bearer(app, authzid="other"), "the token is role 'app''s"),
        ("OAUTHBEARER", b"Bearer " + app.encode(), "OAUTHBEARER credentials are"),
        ("PLAIN", app.encode(), "PLAIN credentials are authzid NUL user NUL password"),
    ]
    for mechanism, auth, reason in cases:
        raw = RawKafka(sasl_broker.kafka_port)
        try:
            answer = raw.authenticate(mechanism, auth)
            assert answer.error_code == 58, (mechanism, auth)  # SASL_AUTHENTICATION_FAILED
            assert reason in answer.error_message
            assert raw.closed()
        finally:
            raw.close()
    for mechanism, auth in (("PLAIN", plain(APP, app)), ("OAUTHBEARER", bearer(app, APP))):
        raw = RawKafka(sasl_broker.kafka_port)
        try:
            answer = raw.authenticate(mechanism, auth)
            assert (answer.error_code, answer.session_lifetime) == (0, datetime.timedelta(0))
            # authenticated: served (and told it may not see the topic)
            assert raw.metadata("anything").topics[0].error_code == 29
        finally:
            raw.close()


def _refused_aiokafka(boot: str, creds: Credentials) -> str:
    from aiokafka.conn import create_conn
    from aiokafka.errors import SaslAuthenticationFailed

    # (a producer's start() says only that it could not bootstrap, and logs
    # the reason: its connection, which start() makes, raises it)
    host, port = boot.split(":")

    async def run() -> str:
        with pytest.raises(SaslAuthenticationFailed) as refused:
            await create_conn(host, int(port), **creds.aiokafka())
        await asyncio.sleep(0.1)  # (its socket, closed, goes before the loop does)
        return str(refused.value)

    return asyncio.run(run())


_KAFKA_PYTHON_REFUSED = """
import logging, sys, warnings
warnings.simplefilter("ignore")
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError
from tests.kafka_copier import Credentials
said = []
handler = logging.Handler()
handler.emit = lambda record: said.append(record.getMessage())
logging.getLogger("kafka").addHandler(handler)
protocol, mechanism, role, token, cafile, boot = sys.argv[1:]
creds = Credentials(protocol, mechanism, role, token, cafile)
try:
    KafkaProducer(bootstrap_servers=boot, bootstrap_timeout_ms=1500, **creds.kafka_python())
except KafkaTimeoutError as exc:
    print("refused:", exc)
print("\\n".join(m for m in said if "SaslAuthenticationFailedError" in m))
"""


def _refused_kafka_python(boot: str, creds: Credentials) -> str:
    # kafka-python retries a refused bootstrap until its timeout and then
    # says only that it could not bootstrap; it logs the broker's reason.
    # (In a process of its own: a constructor that fails leaves its sockets
    # and its thread behind.)
    result = subprocess.run(
        [sys.executable, "-c", _KAFKA_PYTHON_REFUSED, creds.security_protocol, creds.mechanism,
         creds.role, creds.token, creds.cafile or "", boot],
        cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert "refused: KafkaTimeoutError: Unable to bootstrap" in result.stdout, result
    return result.stdout


def _refused_confluent(boot: str, creds: Credentials) -> str:
    from confluent_kafka import KafkaError, Producer

    errors: list[KafkaError] = []
    producer = Producer({"bootstrap.servers": boot, "error_cb": errors.append, **creds.confluent()})
    producer.produce("refused", b"x")
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not any(
        e.code() == KafkaError._AUTHENTICATION for e in errors
    ):
        producer.poll(0.1)
    refused = [e for e in errors if e.code() == KafkaError._AUTHENTICATION]
    producer.purge()
    producer.flush(0)
    assert refused, errors
    return str(refused[0].str())


REFUSED = {
    "aiokafka": _refused_aiokafka,
    "kafka-python": _refused_kafka_python,
    "confluent-kafka": _refused_confluent,
}


@pytest.mark.parametrize(
    "client",
    [
        "aiokafka",
        pytest.param("kafka-python", marks=KAFKA_PYTHON_WARNINGS),
        "confluent-kafka",
    ],
)
def test_each_client_with_a_wrong_password_or_an_expired_token_is_refused(
    tls_broker: SecureKafkaBroker, client: str
) -> None:
    """Over SASL_SSL: PLAIN with a wrong password and OAUTHBEARER with an
    expired token are refused (the client says why, where it can), and
    nothing is stored."""
    before = tls_broker.topics()
    wrong = tls_broker.creds(mechanism="PLAIN", token=tls_broker.make_token(APP)[:-4] + "AAAA")
    expired = tls_broker.creds(token=tls_broker.make_token(APP, expires_in=-10))
    assert "the token is not valid" in REFUSED[client](tls_broker.bootstrap, wrong)
    assert "the token has expired" in REFUSED[client](tls_broker.bootstrap, expired)
    log = tls_broker.log()
    assert "PLAIN authentication failed: the token is not valid" in log
    assert "OAUTHBEARER authentication failed: the token has expired" in log
    assert tls_broker.topics() == before


def test_a_token_that_expires_ends_its_kafka_connection(sasl_broker: SecureKafkaBroker) -> None:
    """SaslAuthenticate tells the client its session's lifetime (the
    token's); the connection is served until then and closed at the
    token's expiry. A client that re-authenticates in time with a fresh
    token of the same role keeps its connection; one of another role is
    refused and closed."""
    # A connection on a token with 3 s to live: served, then closed.
    raw = RawKafka(sasl_broker.kafka_port)
    try:
        answer = raw.authenticate("OAUTHBEARER", bearer(sasl_broker.make_token(APP, 3)))
        assert answer.error_code == 0
        assert (
            datetime.timedelta(seconds=1) < answer.session_lifetime <= datetime.timedelta(seconds=3)
        )
        assert raw.metadata("x").topics[0].error_code == 29  # (served: no permission there)
        assert raw.closed(timeout=15)
    finally:
        raw.close()
    assert "the token has expired; closing the connection" in sasl_broker.log()
    # Re-authenticated before the expiry with a token that does not expire: kept.
    raw = RawKafka(sasl_broker.kafka_port)
    try:
        assert raw.authenticate("PLAIN", plain(APP, sasl_broker.make_token(APP, 3))).error_code == 0
        again = raw.authenticate("PLAIN", plain(APP, sasl_broker.make_token(APP)))
        assert (again.error_code, again.session_lifetime) == (0, datetime.timedelta(0))
        time.sleep(4)  # (past the first token's expiry)
        assert raw.metadata("x").topics[0].error_code == 29
    finally:
        raw.close()
    raw = RawKafka(sasl_broker.kafka_port)
    try:
        assert raw.authenticate("PLAIN", plain(APP, sasl_broker.make_token(APP))).error_code == 0
        other = raw.authenticate("PLAIN", plain("other", sasl_broker.make_token("other")))
        assert other.error_code == 58
        assert "this connection is role 'app'; it cannot become another" in other.error_message
        assert raw.closed()
    finally:
        raw.close()


# -- permissions ------------------------------------------------------------------------------


async def test_a_role_gets_on_kafka_what_the_acl_grants_and_refusals_change_nothing(
    sasl_broker: SecureKafkaBroker,
) -> None:
    """aiokafka as a role: each refusal is the error Kafka's clients expect
    for its resource, and leaves no trace (no topic created, no message
    stored, no producer registered, no offset committed); once granted,
    the same calls go through."""
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.errors import (
        GroupAuthorizationFailedError,
        TopicAuthorizationFailedError,
        TransactionalIdAuthorizationFailed,
    )

    broker = sasl_broker
    boot = broker.bootstrap
    topic = broker.topic("granted", partitions=1)
    creds = broker.creds().aiokafka()

    # Nothing granted: a produce is refused, and stores nothing.
    producer = AIOKafkaProducer(bootstrap_servers=boot, **creds)
    try:
        await producer.start()
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait(topic, b"refused")
        with pytest.raises(TopicAuthorizationFailedError):
            await producer.send_and_wait("never-created", b"refused")
        assert broker.messages(topic) == 0
        assert "never-created" not in broker.topics()
        broker.grant("produce", f"topic:{topic}")  # (takes effect at the next request)
        await producer.send_and_wait(topic, b"granted")
        assert broker.messages(topic) == 1
    finally:
        await producer.stop()

    # A transactional id not granted: InitProducerId refused, nothing registered.
    tid = f"tx-{uuid.uuid4().hex[:6]}"
    txn = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=tid, **creds)
    with pytest.raises(TransactionalIdAuthorizationFailed):
        await txn.start()
    await txn.stop()
    assert broker.admin("GET", f"/admin/v1/producers/{tid}")[0] == 404
    broker.grant("produce", f"transactional-id:{tid}")
    txn = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=tid, **creds)
    try:
        await txn.start()
        async with txn.transaction():
            await txn.send_and_wait(topic, b"in a transaction")
    finally:
        await txn.stop()

    # Consuming: the topic first, then a subscription someone else is granted.
    async def consume(group: str) -> list[bytes]:
        consumer = AIOKafkaConsumer(
            topic, bootstrap_servers=boot, group_id=group, auto_offset_reset="earliest", **creds
        )
        try:
            await consumer.start()
            got: list[bytes] = []
            deadline = time.monotonic() + 20
            while len(got) < 2 and time.monotonic() < deadline:
                batch = await consumer.getmany(timeout_ms=300)
                got += [r.value for rs in batch.values() for r in rs]
            await consumer.commit()
            return got
        finally:
            await consumer.stop()

    # (a consumer with no group: the Fetch is refused)
    lone = AIOKafkaConsumer(bootstrap_servers=boot, **creds)
    try:
        await lone.start()
        lone.assign([TopicPartition(topic, 0)])
        lone.seek(TopicPartition(topic, 0), 0)
        with pytest.raises(TopicAuthorizationFailedError):
            await lone.getmany(timeout_ms=5000)
    finally:
        await lone.stop()
    # (a group member subscribing to it: its JoinGroup is refused)
    with pytest.raises(GroupAuthorizationFailedError):
        await consume("readers")
    broker.grant("consume", f"topic:{topic}")
    assert await consume("readers") == [b"granted", b"in a transaction"]
    broker.grant("consume", f"subscription:{topic}/audit", role="auditor")
    with pytest.raises(GroupAuthorizationFailedError):
        await consume("audit")
    status, subs = broker.admin("GET", f"/admin/v1/topics/{topic}/subscriptions")
    assert status == 200 and b"audit" not in subs
    committed = AIOKafkaConsumer(bootstrap_servers=boot, group_id="readers", **creds)
    try:
        await committed.start()
        assert await committed.committed(TopicPartition(topic, 0)) is not None
    finally:
        await committed.stop()


def test_a_transactional_request_needs_the_producer_ids_transactional_id(
    sasl_broker: SecureKafkaBroker,
) -> None:
    """A role may not act on another's producer id by naming a
    transactional id of its own: AddPartitionsToTxn and EndTxn with the
    other's producer id are TRANSACTIONAL_ID_AUTHORIZATION_FAILED, and the
    other's transaction goes on untouched; a topic it may not produce on
    is TOPIC_AUTHORIZATION_FAILED (the rest OPERATION_NOT_ATTEMPTED), and
    no transaction begins."""
    from kio.schema.add_partitions_to_txn.v0 import request as add
    from kio.schema.end_txn.v0.request import EndTxnRequest
    from kio.schema.init_producer_id.v1.request import InitProducerIdRequest

    broker = sasl_broker
    mine, theirs = broker.topic("mine", partitions=1), broker.topic("theirs", partitions=1)
    broker.grant("produce", f"topic:{mine}")
    broker.grant("produce", "transactional-id:app-tx")
    broker.grant("produce", f"topic:{theirs}", role="owner")
    broker.grant("produce", "transactional-id:owner-tx", role="owner")

    def session(role: str) -> RawKafka:
        raw = RawKafka(broker.kafka_port)
        assert raw.authenticate("PLAIN", plain(role, broker.make_token(role))).error_code == 0
        return raw

    def init(raw: RawKafka, tid: str) -> tuple[int, int]:
        req = InitProducerIdRequest(
            transactional_id=tid, transaction_timeout=datetime.timedelta(seconds=60)
        )
        answer = raw.call(Api.INIT_PRODUCER_ID, 1, req)
        assert answer.error_code == 0
        return answer.producer_id, answer.producer_epoch

    def add_partitions(raw: RawKafka, tid: str, pid: int, epoch: int, *topics: str) -> list[int]:
        req = add.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id=tid,
            v3_and_below_producer_id=pid,
            v3_and_below_producer_epoch=epoch,
            v3_and_below_topics=tuple(
                add.AddPartitionsToTxnTopic(name=t, partitions=(0,)) for t in topics
            ),
        )
        answer = raw.call(Api.ADD_PARTITIONS_TO_TXN, 0, req)
        return [
            p.partition_error_code
            for t in answer.results_by_topic_v3_and_below
            for p in t.results_by_partition
        ]

    owner, app = session("owner"), session(APP)
    try:
        owner_pid, owner_epoch = init(owner, "owner-tx")
        assert add_partitions(owner, "owner-tx", owner_pid, owner_epoch, theirs) == [0]
        app_pid, app_epoch = init(app, "app-tx")
        # The owner's producer id under app's own transactional id: refused.
        assert add_partitions(app, "app-tx", owner_pid, owner_epoch, mine) == [53]
        end = EndTxnRequest(
            transactional_id="app-tx",
            producer_id=owner_pid,
            producer_epoch=owner_epoch,
            committed=False,
        )
        assert app.call(Api.END_TXN, 0, end).error_code == 53
        # Its own producer with a topic it may not produce on: nothing added.
        assert add_partitions(app, "app-tx", app_pid, app_epoch, mine, theirs) == [55, 29]
        status, body = broker.admin("GET", "/admin/v1/producers/app-tx")
        assert status == 200 and json.loads(body)["ongoing_txnid"] is None
        status, body = broker.admin("GET", "/admin/v1/producers/owner-tx")
        state = json.loads(body)
        assert state["ongoing_txnid"] is not None and state["producer_epoch"] == owner_epoch
        status, body = broker.admin("GET", f"/admin/v1/transactions/{state['ongoing_txnid']}")
        assert json.loads(body)["status"] == "OPEN"
        # The owner ends its own transaction.
        end = EndTxnRequest(
            transactional_id="owner-tx",
            producer_id=owner_pid,
            producer_epoch=owner_epoch,
            committed=True,
        )
        assert owner.call(Api.END_TXN, 0, end).error_code == 0
    finally:
        owner.close()
        app.close()


async def test_a_group_member_belongs_to_the_role_that_joined_it(
    sasl_broker: SecureKafkaBroker,
) -> None:
    """A JoinGroup needs consume on every topic the member subscribes to as
    the group (else GROUP_AUTHORIZATION_FAILED, nothing joined); another
    role may not heartbeat, sync or leave as a member it did not join."""
    from kio.schema.heartbeat.v3.request import HeartbeatRequest
    from kio.schema.join_group.v5 import request as join
    from kio.schema.leave_group.v2.request import LeaveGroupRequest

    broker = sasl_broker
    topic = broker.topic("grouped", partitions=1)
    secret = broker.topic("secret", partitions=1)
    for role in (APP, "other"):
        broker.grant("consume", f"topic:{topic}", role=role)

    def subscription(*topics: str) -> bytes:
        out = struct.pack(">hi", 0, len(topics))
        for t in topics:
            out += struct.pack(">h", len(t)) + t.encode()
        return out + struct.pack(">i", -1)

    def join_request(member_id: str, *topics: str) -> Any:
        return join.JoinGroupRequest(
            group_id="g",
            session_timeout=datetime.timedelta(seconds=10),
            rebalance_timeout=datetime.timedelta(seconds=10),
            member_id=member_id,
            group_instance_id=None,
            protocol_type="consumer",
            protocols=(
                join.JoinGroupRequestProtocol(name="range", metadata=subscription(*topics)),
            ),
        )

    app, other = RawKafka(broker.kafka_port), RawKafka(broker.kafka_port)
    try:
        for raw, role in ((app, APP), (other, "other")):
            assert raw.authenticate("PLAIN", plain(role, broker.make_token(role))).error_code == 0
        assert app.call(Api.JOIN_GROUP, 5, join_request("", topic, secret)).error_code == 30
        first = app.call(Api.JOIN_GROUP, 5, join_request("", topic))
        assert first.error_code == 79  # MEMBER_ID_REQUIRED
        joined = app.call(Api.JOIN_GROUP, 5, join_request(first.member_id, topic))
        assert joined.error_code == 0 and joined.leader == first.member_id
        beat = HeartbeatRequest(
            group_id="g",
            generation_id=joined.generation_id,
            member_id=joined.member_id,
            group_instance_id=None,
        )
        assert other.call(Api.HEARTBEAT, 3, beat).error_code == 30
        leave = LeaveGroupRequest(group_id="g", member_id=joined.member_id)
        assert other.call(Api.LEAVE_GROUP, 2, leave).error_code == 30
        assert app.call(Api.HEARTBEAT, 3, beat).error_code == 0  # (still a member)
        assert app.call(Api.LEAVE_GROUP, 2, leave).error_code == 0
    finally:
        app.close()
        other.close()


def _kafka_python_refusals(boot: str, creds: Credentials, topic: str) -> None:
    from kafka import KafkaProducer
    from kafka.errors import TopicAuthorizationFailedError, TransactionalIdAuthorizationFailedError

    producer = KafkaProducer(bootstrap_servers=boot, max_block_ms=5000, **creds.kafka_python())
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            producer.send(topic, b"refused").get(10)
    finally:
        producer.close()
    txn = KafkaProducer(bootstrap_servers=boot, transactional_id="no-tx", **creds.kafka_python())
    try:
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            txn.init_transactions()
    finally:
        txn.close()


def _confluent_refusals(boot: str, creds: Credentials, topic: str) -> None:
    from confluent_kafka import KafkaError, KafkaException, Producer

    producer = Producer({"bootstrap.servers": boot, **creds.confluent()})
    delivered: list[KafkaError | None] = []
    producer.produce(topic, b"refused", on_delivery=lambda err, _msg: delivered.append(err))
    producer.flush(20)
    assert delivered and delivered[0] is not None
    assert delivered[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    txn = Producer({"bootstrap.servers": boot, "transactional.id": "no-tx", **creds.confluent()})
    with pytest.raises(KafkaException) as refused:
        txn.init_transactions(20)
    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


@pytest.mark.parametrize(
    "client",
    [pytest.param("kafka-python", marks=KAFKA_PYTHON_WARNINGS), "confluent-kafka"],
)
def test_each_client_is_told_what_its_role_may_not_do(
    tls_broker: SecureKafkaBroker, client: str
) -> None:
    """kafka-python and librdkafka (aiokafka: the test above) over
    SASL_SSL: a produce to a topic not granted is the client's topic
    authorization error, init_transactions on a transactional id not
    granted its transactional-id authorization error; nothing is stored."""
    topic = tls_broker.topic("forbidden", partitions=1)
    creds = tls_broker.creds(mechanism="PLAIN" if client == "kafka-python" else "OAUTHBEARER")
    if client == "kafka-python":
        _kafka_python_refusals(tls_broker.bootstrap, creds, topic)
    else:
        _confluent_refusals(tls_broker.bootstrap, creds, topic)
    assert tls_broker.messages(topic) == 0
    assert tls_broker.admin("GET", "/admin/v1/producers/no-tx")[0] == 404


# -- the copier over SASL_SSL ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("client", "mechanism"),
    [
        pytest.param(AIOKAFKA, "OAUTHBEARER", id="aiokafka-oauthbearer"),
        pytest.param(KAFKA_PYTHON, "PLAIN", id="kafka-python-plain", marks=KAFKA_PYTHON_WARNINGS),
        pytest.param(CONFLUENT_KAFKA, "OAUTHBEARER", id="confluent-kafka-oauthbearer"),
    ],
)
async def test_the_copier_copies_exactly_once_over_sasl_ssl(
    tls_broker: SecureKafkaBroker, tmp_path: Path, client: KafkaClient, mechanism: str
) -> None:
    """The transactional copier (`tests.kafka_copier`) over SASL_SSL as a
    role holding only what it needs: produce and consume on its topics,
    produce on its transactional ids (the seeder and the reader run as the
    same role)."""
    broker = tls_broker
    src, dst = broker.topic("in"), broker.topic("out")
    for topic in (src, dst):
        broker.grant("produce", f"topic:{topic}")
        broker.grant("consume", f"topic:{topic}")
    broker.grant("produce", "transactional-id:copier-*")
    await check_copier(
        broker, client, tmp_path, 20, 5, creds=broker.creds(mechanism=mechanism), topics=(src, dst)
    )
    assert broker.messages(dst) == 20


async def test_a_plaintext_client_cannot_talk_to_the_tls_listener(
    tls_broker: SecureKafkaBroker,
) -> None:
    """The listener speaks TLS only: a client without it gets nowhere, and
    stores nothing."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError

    before = tls_broker.topics()
    producer = AIOKafkaProducer(bootstrap_servers=tls_broker.bootstrap)
    try:
        with pytest.raises(KafkaConnectionError):
            await producer.start()
    finally:
        await producer.stop()
    assert tls_broker.topics() == before


# -- the admin APIs ---------------------------------------------------------------------------


@KAFKA_PYTHON_WARNINGS
def test_the_admin_apis_need_a_superuser(tls_broker: SecureKafkaBroker) -> None:
    """kafka-python's KafkaAdminClient over SASL_SSL: as a role, each admin
    API is refused with the authorization error of the resource it names,
    and nothing changes; as the superuser the same calls go through."""
    from kafka import TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
    from kafka.errors import (
        ClusterAuthorizationFailedError,
        GroupAuthorizationFailedError,
        TopicAuthorizationFailedError,
        TransactionalIdAuthorizationFailedError,
    )

    broker = tls_broker
    existing = broker.topic("kept", partitions=1)
    broker.grant("produce", "topic:*")  # (a role with every topic still is no admin)
    role = KafkaAdminClient(bootstrap_servers=broker.bootstrap, **broker.creds().kafka_python())
    try:
        with pytest.raises(TopicAuthorizationFailedError):
            role.create_topics([NewTopic("made-by-app", 1, 1)])
        with pytest.raises(TopicAuthorizationFailedError):
            role.delete_topics([existing])
        # (kafka-python drops DescribeConfigs' per-resource errors: no configs)
        described = role.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, existing)], config_filter="all"
        )
        assert described == {"topic": {existing: {}}}
        with pytest.raises(ClusterAuthorizationFailedError):
            role.list_groups()
        # (kafka-python reports DescribeGroups' per-group error as text)
        assert (
            GroupAuthorizationFailedError.__name__ in role.describe_groups(["any"])["any"]["error"]
        )
        with pytest.raises(ClusterAuthorizationFailedError):
            role.describe_cluster()
        with pytest.raises(ClusterAuthorizationFailedError):
            role.list_transactions()
        with pytest.raises(TransactionalIdAuthorizationFailedError):
            role.describe_transactions(["any"])
        with pytest.raises(TopicAuthorizationFailedError):
            role.describe_producers([TopicPartition(existing, 0)])
    finally:
        role.close()
    assert existing in broker.topics() and "made-by-app" not in broker.topics()
    admin = KafkaAdminClient(
        bootstrap_servers=broker.bootstrap,
        **broker.creds("admin", mechanism="PLAIN").kafka_python(),
    )
    try:
        admin.create_topics([NewTopic("made-by-admin", 1, 1)])
        assert admin.describe_cluster()["cluster_id"] == "txnbuf"
        admin.delete_topics([existing])
    finally:
        admin.close()
    assert "made-by-admin" in broker.topics() and existing not in broker.topics()


def test_connections_beyond_the_limit_are_closed(tmp_path: Path) -> None:
    """--max-connections holds on the Kafka listener too: one connection
    more is closed at once, unanswered; one of those open is served."""
    from kio.schema.api_versions.v0.request import ApiVersionsRequest

    broker = KafkaBroker(tmp_path / "data", tmp_path / "broker.log")
    broker.args += ["--max-connections", "2"]
    broker.start()
    try:
        first, second = RawKafka(broker.kafka_port), RawKafka(broker.kafka_port)
        assert first.call(Api.API_VERSIONS, 0, ApiVersionsRequest()).error_code == 0
        second.call(Api.API_VERSIONS, 0, ApiVersionsRequest())
        third = RawKafka(broker.kafka_port)
        try:
            assert third.closed()
        finally:
            third.close()
        assert first.call(Api.API_VERSIONS, 0, ApiVersionsRequest()).error_code == 0
        first.close()
        second.close()
    finally:
        broker.stop()
        sys.stderr.write(broker.log())
    assert "refused: 2 connections open, the limit (--max-connections 2)" in broker.log()


async def test_ssl_without_authentication(tmp_path: Path) -> None:
    """A broker with a certificate and no key: its Kafka listener speaks
    SSL; a client trusting the certificate produces and consumes, one
    that does not trust it is refused at the handshake."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaConnectionError
    from aiokafka.helpers import create_ssl_context

    from tests.test_kafka import aiokafka_read

    broker = KafkaBroker(tmp_path / "data", tmp_path / "broker.log")
    cert, key = self_signed(tmp_path)
    broker.tls = (cert, key, cert)
    broker.start()
    try:
        assert f"Kafka listener on 127.0.0.1:{broker.kafka_port} (SSL)" in broker.log()
        creds = Credentials("SSL", cafile=str(cert))
        topic = broker.topic("ssl", partitions=1)
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap, **creds.aiokafka())
        try:
            await producer.start()
            await producer.send_and_wait(topic, b"over tls")
        finally:
            await producer.stop()
        assert await aiokafka_read(broker.bootstrap, topic, 1, creds) == [b"over tls"]
        untrusting = AIOKafkaProducer(
            bootstrap_servers=broker.bootstrap,
            security_protocol="SSL",
            ssl_context=create_ssl_context(),
        )
        try:
            with pytest.raises(KafkaConnectionError):
                await untrusting.start()
        finally:
            await untrusting.stop()
    finally:
        broker.stop()
        sys.stderr.write(broker.log())
