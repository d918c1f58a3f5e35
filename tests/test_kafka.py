"""Kafka's wire protocol: unmodified Kafka clients against a real broker process.

For each of aiokafka, kafka-python and confluent-kafka (librdkafka): a
transactional consume-transform-produce copier (`tests.kafka_copier`:
init_transactions, begin_transaction, send, send_offsets_to_transaction,
commit_transaction, every third transaction aborted) between two-partition
topics, then a read_committed group consumer that must see every input
exactly once; the same through SIGKILLs of the broker, and of the copier
process (restarted with the same transactional id); a zombie producer
fenced by a second one with its transactional id.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import signal
import sys
import threading
import time
import urllib.parse
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import pytest

from tests.conftest import BrokerProcess, free_port
from tests.kafka_copier import PLAINTEXT, Credentials

pytestmark = [pytest.mark.integration]

ROOT = Path(__file__).resolve().parent.parent
N = 40  # input messages
PER_TXN = 5

T = TypeVar("T")


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
    proc = KafkaBroker(tmp_path / "data", tmp_path / "broker.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        sys.stderr.write(f"----- broker log ({proc.log_path}) -----\n{proc.log()}\n")


# kafka-python reads its protocol specs with importlib.resources' legacy API.
KAFKA_PYTHON_WARNINGS = pytest.mark.filterwarnings(
    "ignore:(read_text|open_text) is deprecated:DeprecationWarning"
)


class Reading:
    """A read of a topic goes on until ``n`` messages came and then ``quiet``
    seconds more (nothing more may come), or until ``timeout``."""

    def __init__(self, n: int, quiet: float = 0.5, timeout: float = 20.0) -> None:
        self.n = n
        self.quiet = quiet
        self.deadline = time.monotonic() + timeout
        self.quiet_until: float | None = None

    def more(self, got: list[bytes]) -> bool:
        now = time.monotonic()
        if now >= self.deadline:
            return False
        if len(got) < self.n:
            return True
        self.quiet_until = self.quiet_until or now + self.quiet
        return now < self.quiet_until


@dataclass(frozen=True, slots=True)
class KafkaClient:
    """One Kafka client library's parts of the tests (its copier is
    `tests.kafka_copier`'s, run as a process)."""

    name: str  # (`tests.kafka_copier.COPIERS`)
    # (bootstrap, topic, values[, credentials])
    seed: Callable[..., Awaitable[None]]
    # (bootstrap, topic, n[, credentials[, group]]): read_committed, as a group
    # (``reader-<topic>`` unless given)
    read: Callable[..., Awaitable[list[bytes]]]
    restart_before_commit: bool = False  # (`check_copier`)


def in_thread(fn: Callable[..., T]) -> Callable[..., Awaitable[T]]:
    """``fn`` run in a daemon thread (one that hangs does not hold up the
    test process's exit)."""

    async def run(*args: Any) -> T:
        outcome: concurrent.futures.Future[T] = concurrent.futures.Future()

        def target() -> None:
            if not outcome.set_running_or_notify_cancel():
                return
            try:
                outcome.set_result(fn(*args))
            except BaseException as exc:
                outcome.set_exception(exc)

        threading.Thread(target=target, daemon=True).start()
        return await asyncio.wrap_future(outcome)

    return run


class Copier:
    """A life of a copier process (`tests.kafka_copier`): its stdout read
    line by line (`lines`), its stderr appended to ``log``."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log
        self.lines: list[str] = []

    @classmethod
    async def start(cls, args: list[str], log: Path, creds: Credentials = PLAINTEXT) -> Copier:
        env = {**os.environ, "TXNBUF_TOKEN": creds.token}
        with _appending(log) as err:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.kafka_copier",
                *args,
                *creds.copier_args(),
                cwd=ROOT,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=err,
                env=env,
            )
        return cls(proc, log)

    def told(self) -> str:
        """What it printed, and its log (for a failure's message)."""
        log = self.log.read_text(errors="replace")[-5000:]
        return f"{self.lines}\n----- copier log -----\n{log}"

    async def wait_for(self, line: str, timeout: float = 30.0) -> None:
        """Reads stdout until ``line``; fails if the process ends first."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            while line not in self.lines:
                got = await self.proc.stdout.readline()
                assert got, f"the copier ended ({await self.proc.wait()}) before {line!r}: " + (
                    self.told()
                )
                self.lines.append(got.decode().strip())

    async def end(self, timeout: float = 60.0) -> tuple[int, str]:
        """Its exit status and last line, once it ended."""
        assert self.proc.stdout is not None
        async with asyncio.timeout(timeout):
            self.lines += (await self.proc.stdout.read()).decode().splitlines()
            status = await self.proc.wait()
        return status, self.lines[-1] if self.lines else ""

    def go_on(self) -> None:
        """A copier paused (``--pause-at``) commits."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"commit\n")

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()


def _appending(path: Path) -> BinaryIO:
    return open(path, "ab")


async def check_copier(
    broker: KafkaBroker,
    client: KafkaClient,
    tmp_path: Path,
    n: int,
    per_txn: int,
    broker_kills: int = 0,
    creds: Credentials = PLAINTEXT,
    topics: tuple[str, str] | None = None,
) -> None:
    """`client`'s copier copies ``n`` messages between two new topics
    (two partitions each) exactly once, read_committed by a group of
    `client`.

    With ``broker_kills``, that many lives of the copier each commit three
    transactions, abort one, and pause before their fourth commit with its
    transaction open (its messages stored, its offsets sent); the broker is
    SIGKILLed there and restarted (in the background while the copier
    commits, or before the commit with ``restart_before_commit``). The
    restart aborts the transaction and bumps its producer's epoch, so the
    commit fails with the client's fenced error and the life ends; the next
    life (a new producer, whose init_transactions rolls back what was left,
    and a new consumer, which starts from the group's committed offsets)
    goes on. The last one copies the rest.

    ``creds``: how every client connects (the seeder and the reader too);
    ``topics``: (source, destination), made here if not given."""
    src, dst = topics or (broker.topic("in"), broker.topic("out"))
    group = f"copier-{uuid.uuid4().hex[:6]}"
    values = [b"m%d" % i for i in range(n)]
    await client.seed(broker.bootstrap, src, values, creds)
    args = [client.name, broker.bootstrap, src, dst, group, "--per-txn", str(per_txn)]
    log = tmp_path / "copier.log"
    aborts = 0
    for _ in range(broker_kills):
        life = await Copier.start([*args, "--pause-at", "4"], log, creds)
        try:
            await life.wait_for("open")
            broker.kill()
            if client.restart_before_commit:
                broker.start()
            life.go_on()
            if not client.restart_before_commit:
                await asyncio.to_thread(broker.start)
            status, last = await life.end()
            assert (status, last.split(":")[0]) == (1, "failed fenced"), life.told()
            aborts += sum(line.startswith("aborted") for line in life.lines)
        finally:
            await life.kill()
    life = await Copier.start(args, log, creds)
    try:
        assert await life.end() == (0, "done"), life.told()
        aborts += sum(line.startswith("aborted") for line in life.lines)
    finally:
        await life.kill()
    got = await client.read(broker.bootstrap, dst, n, creds)
    assert Counter(got) == Counter(v.upper() for v in values)
    assert aborts > 0


# -- aiokafka -------------------------------------------------------------------------


async def aiokafka_seed(
    boot: str, topic: str, values: list[bytes], creds: Credentials = PLAINTEXT
) -> None:
    from aiokafka import AIOKafkaProducer

    seeder = AIOKafkaProducer(bootstrap_servers=boot, **creds.aiokafka())
    await seeder.start()
    try:
        await asyncio.gather(*(seeder.send_and_wait(topic, v, key=v) for v in values))
    finally:
        await seeder.stop()


async def aiokafka_read(
    boot: str, topic: str, n: int, creds: Credentials = PLAINTEXT, group: str | None = None
) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer

    reader = AIOKafkaConsumer(
        topic,
        bootstrap_servers=boot,
        group_id=group or f"reader-{topic}",
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **creds.aiokafka(),
    )
    await reader.start()
    got: list[bytes] = []
    reading = Reading(n)
    try:
        while reading.more(got):
            batch = await reader.getmany(timeout_ms=300)
            got += [r.value for rs in batch.values() for r in rs]
    finally:
        await reader.stop()
    return got


AIOKAFKA = KafkaClient("aiokafka", aiokafka_seed, aiokafka_read)


async def test_aiokafka_transactional_copier_exactly_once(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    await check_copier(kafka_broker, AIOKAFKA, tmp_path, N, PER_TXN)


# -- kafka-python -------------------------------------------------------------------------


def kafka_python_seed(
    boot: str, topic: str, values: list[bytes], creds: Credentials = PLAINTEXT
) -> None:
    from kafka import KafkaProducer

    seeder = KafkaProducer(bootstrap_servers=boot, **creds.kafka_python())
    for v in values:
        seeder.send(topic, v, key=v)
    seeder.flush()
    seeder.close()


def kafka_python_read(
    boot: str, topic: str, n: int, creds: Credentials = PLAINTEXT, group: str | None = None
) -> list[bytes]:
    from kafka import KafkaConsumer

    reader = KafkaConsumer(
        topic,
        bootstrap_servers=boot,
        group_id=group or f"reader-{topic}",
        auto_offset_reset="earliest",
        isolation_level="read_committed",
        **creds.kafka_python(),
    )
    got: list[bytes] = []
    reading = Reading(n)
    try:
        while reading.more(got):
            got += [r.value for rs in reader.poll(timeout_ms=300).values() for r in rs]
    finally:
        reader.close()
    return got


# kafka-python loses a transaction's EndTxn when the connection to the
# coordinator fails as the request is about to be sent (the sender looks the
# coordinator up again but does not queue the request again), and
# commit_transaction() then waits for ever: its copier commits only once the
# broker is back (see docs/kafka.md).
KAFKA_PYTHON = KafkaClient(
    "kafka-python",
    in_thread(kafka_python_seed),
    in_thread(kafka_python_read),
    restart_before_commit=True,
)


@KAFKA_PYTHON_WARNINGS
async def test_kafka_python_transactional_copier_exactly_once(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    await check_copier(kafka_broker, KAFKA_PYTHON, tmp_path, N, PER_TXN)


# -- confluent-kafka (librdkafka) ---------------------------------------------------------


def confluent_seed(
    boot: str, topic: str, values: list[bytes], creds: Credentials = PLAINTEXT
) -> None:
    from confluent_kafka import Producer

    seeder = Producer({"bootstrap.servers": boot, **creds.confluent()})
    for v in values:
        seeder.produce(topic, v, key=v)
    assert seeder.flush(30) == 0


def confluent_read(
    boot: str, topic: str, n: int, creds: Credentials = PLAINTEXT, group: str | None = None
) -> list[bytes]:
    from confluent_kafka import Consumer

    reader = Consumer(
        {
            **creds.confluent(),
            "bootstrap.servers": boot,
            "group.id": group or f"reader-{topic}",
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    reader.subscribe([topic])
    got: list[bytes] = []
    reading = Reading(n)
    try:
        while reading.more(got):
            got += [r.value() for r in reader.consume(100, 0.3) if r.error() is None]
    finally:
        reader.close()
    return got


CONFLUENT_KAFKA = KafkaClient(
    "confluent-kafka", in_thread(confluent_seed), in_thread(confluent_read)
)


async def test_confluent_kafka_transactional_copier_exactly_once(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    await check_copier(kafka_broker, CONFLUENT_KAFKA, tmp_path, N, PER_TXN)


# -- fencing ----------------------------------------------------------------------------
#
# A producer whose transactional id a second instance initialized can neither
# write nor commit; what it wrote in its open transaction is aborted, and only
# the second instance's transaction is read.


async def test_aiokafka_zombie_is_fenced_by_a_second_producer(kafka_broker: KafkaBroker) -> None:
    from aiokafka import AIOKafkaProducer
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
    assert await aiokafka_read(boot, dst, 1) == [b"winner"]


@KAFKA_PYTHON_WARNINGS
@pytest.mark.parametrize("next_op", ["send", "send-to-new-partition", "send-offsets", "commit"])
def test_kafka_python_zombie_is_fenced_by_a_second_producer(
    kafka_broker: KafkaBroker, next_op: str
) -> None:
    """The zombie's next transactional operation after a second instance
    initialized its transactional id fails with kafka-python's fenced error,
    the producer is then in its fatal state, and nothing of the zombie's is
    read: neither what it wrote before (its transaction was aborted) nor
    after, nor are its group's offsets committed."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.errors import InvalidProducerEpochError, KafkaError, ProducerFencedError
    from kafka.structs import OffsetAndMetadata

    boot = kafka_broker.bootstrap
    src, dst = kafka_broker.topic("in", partitions=1), kafka_broker.topic("out")
    kafka_python_seed(boot, src, [b"in-0"])
    group = f"zombie-{uuid.uuid4().hex[:6]}"
    tid = f"tx-{uuid.uuid4().hex[:6]}"
    zombie = KafkaProducer(bootstrap_servers=boot, transactional_id=tid)
    winner = KafkaProducer(bootstrap_servers=boot, transactional_id=tid)
    try:
        zombie.init_transactions()
        zombie.begin_transaction()
        zombie.send(dst, b"zombie-1", partition=0).get(10)
        winner.init_transactions()  # fences the zombie, aborts its open transaction
        winner.begin_transaction()
        winner.send(dst, b"winner", partition=0)
        winner.commit_transaction()

        if next_op == "send":
            # A Produce to a partition of the transaction: Kafka's
            # INVALID_PRODUCER_EPOCH, fatal to a transactional kafka-python
            # producer (no epoch bump through InitProducerId v3+ here).
            with pytest.raises(InvalidProducerEpochError):
                zombie.send(dst, b"zombie-2", partition=0).get(10)
        elif next_op == "send-to-new-partition":  # (AddPartitionsToTxn first)
            with pytest.raises(ProducerFencedError):
                zombie.send(dst, b"zombie-2", partition=1).get(10)
        elif next_op == "send-offsets":
            offsets = {TopicPartition(src, 0): OffsetAndMetadata(1, "", -1)}
            with pytest.raises(ProducerFencedError):
                zombie.send_offsets_to_transaction(offsets, group)
        else:
            with pytest.raises(ProducerFencedError):
                zombie.commit_transaction()
        with pytest.raises(KafkaError, match="error state"):
            zombie.commit_transaction()
        with pytest.raises(KafkaError, match=r"previous transactional .* request has failed"):
            zombie.send(dst, b"zombie-3", partition=0)
    finally:
        winner.close()
        zombie.close()
    assert sorted(kafka_python_read(boot, dst, 1)) == [b"winner"]
    reader = KafkaConsumer(bootstrap_servers=boot, group_id=group)
    try:
        assert reader.committed(TopicPartition(src, 0)) is None
    finally:
        reader.close()


def test_confluent_kafka_zombie_is_fenced_by_a_second_producer(kafka_broker: KafkaBroker) -> None:
    from confluent_kafka import KafkaException, Producer

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
    assert confluent_read(boot, dst, 1) == [b"winner"]


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
CRASH_PER_TXN = 10
CRASH_KILLS = 2
CLIENTS = [
    pytest.param(AIOKAFKA, id="aiokafka"),
    pytest.param(KAFKA_PYTHON, id="kafka-python", marks=KAFKA_PYTHON_WARNINGS),
    pytest.param(CONFLUENT_KAFKA, id="confluent-kafka"),
]


@pytest.mark.crash
@pytest.mark.parametrize("client", CLIENTS)
async def test_copier_exactly_once_through_broker_kills(
    kafka_broker: KafkaBroker, tmp_path: Path, client: KafkaClient
) -> None:
    await check_copier(kafka_broker, client, tmp_path, CRASH_N, CRASH_PER_TXN, CRASH_KILLS)


def producer_state(broker: KafkaBroker, tid: str) -> dict[str, Any]:
    status, body = broker.admin("GET", f"/admin/v1/producers/{urllib.parse.quote(tid)}")
    assert status == 200, body
    state: dict[str, Any] = json.loads(body)
    return state


def transaction_state(broker: KafkaBroker, txnid: str) -> dict[str, Any]:
    status, body = broker.admin("GET", f"/admin/v1/transactions/{urllib.parse.quote(txnid)}")
    assert status == 200, body
    state: dict[str, Any] = json.loads(body)
    return state


@pytest.mark.crash
@pytest.mark.parametrize("client", CLIENTS)
async def test_copier_process_sigkilled_and_restarted_copies_exactly_once(
    kafka_broker: KafkaBroker, tmp_path: Path, client: KafkaClient
) -> None:
    """A copier process is SIGKILLed twice and started again with the same
    transactional id: first with a transaction open (its records stored at
    the broker, its offsets sent), then wherever it is after its second
    commit. Each new life's init_transactions fences the killed one and
    aborts what it left open, and its consumer starts from the group's
    committed offsets; the output holds every input exactly once."""
    boot = kafka_broker.bootstrap
    src, dst = kafka_broker.topic("in"), kafka_broker.topic("out")
    group = f"copier-{uuid.uuid4().hex[:6]}"
    tid = f"{group}-tx"
    values = [b"p%d" % i for i in range(CRASH_N)]
    await client.seed(boot, src, values)
    args = [client.name, boot, src, dst, group, "--per-txn", str(CRASH_PER_TXN)]
    log = tmp_path / "copier.log"

    # Life 1 commits two transactions, aborts one, and is killed in its fourth.
    life = await Copier.start([*args, "--pause-at", "3"], log)
    try:
        await life.wait_for("open")
    finally:
        await life.kill()
    assert life.lines == ["committed 1", "committed 2", "aborted 1", "open"]
    left = producer_state(kafka_broker, tid)
    assert left["ongoing_txnid"] is not None
    zombie_txn = transaction_state(kafka_broker, left["ongoing_txnid"])
    assert zombie_txn["status"] == "OPEN"
    assert {p["topic"] for p in zombie_txn["partitions"]} == {dst}
    assert zombie_txn["subscriptions"] == [{"topic": src, "subscription": group}]

    # Life 2 rolls it back, and is killed wherever it is after two commits.
    life = await Copier.start(args, log)
    try:
        await life.wait_for("committed 2")
    finally:
        await life.kill()
    assert transaction_state(kafka_broker, left["ongoing_txnid"])["status"] == "ABORTED"
    assert producer_state(kafka_broker, tid)["producer_epoch"] > left["producer_epoch"]

    # Life 3 copies the rest.
    life = await Copier.start(args, log)
    try:
        assert await life.end() == (0, "done"), life.told()
    finally:
        await life.kill()

    got = await client.read(boot, dst, CRASH_N)
    assert Counter(got) == Counter(v.upper() for v in values)


@pytest.mark.crash
async def test_a_transaction_begun_before_a_broker_crash_is_aborted_and_its_producer_told(
    kafka_broker: KafkaBroker,
) -> None:
    """The broker dies (SIGKILL, `ledger.faults`) right after it answered
    the AddPartitionsToTxn that began a producer's transaction. Restarted,
    it knows that transaction (its begin was durable before the answer): it
    aborted it and bumped the producer's epoch, so the producer's send and
    commit fail fenced. Had the crash forgotten the transaction, the
    producer's EndTxn would have found nothing ongoing and succeeded: a
    commit of nothing, of sends it had been told were stored."""
    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError, ProducerFenced

    boot = kafka_broker.bootstrap
    dst = kafka_broker.topic("out", partitions=1)
    tid = f"tx-{uuid.uuid4().hex[:6]}"
    kafka_broker.stop()
    kafka_broker.env = {"TXNBUF_FAULT": "kafka.after_answer.add_partitions_to_txn"}
    kafka_broker.start()
    producer = AIOKafkaProducer(bootstrap_servers=boot, transactional_id=tid)
    await producer.start()
    try:
        await producer.begin_transaction()
        sent = await producer.send(dst, b"lost")  # (AddPartitionsToTxn, then the Produce)
        assert kafka_broker.proc is not None
        assert await asyncio.to_thread(kafka_broker.proc.wait, 10) == -signal.SIGKILL
        assert "SIGKILL at kafka.after_answer.add_partitions_to_txn" in kafka_broker.log()
        kafka_broker.env = {}
        kafka_broker.start()
        state = producer_state(kafka_broker, tid)
        assert (state["producer_epoch"], state["bumped_by"]) == (1, "coordinator"), state
        assert state["ongoing_txnid"] is None
        with pytest.raises(KafkaError):
            await sent
        with pytest.raises(ProducerFenced):
            await producer.commit_transaction()
    finally:
        await producer.stop()
    assert await aiokafka_read(boot, dst, 0) == []


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
