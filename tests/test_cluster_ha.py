"""Three cluster brokers over a PostgreSQL primary with a synchronous standby
(`bench._postgres`: ``initdb``, ``pg_basebackup -R -X stream``,
``synchronous_standby_names``), as real processes: a producer sends and a
transactional copy runs while the primary is SIGKILLed; every broker drops
what it holds and tries to open its store again (no server is writable
until the standby is promoted), the standby is promoted with ``pg_ctl
promote``, and the brokers reach it by themselves through the URL that
names both servers. Nothing acknowledged is lost, and a read-committed
subscription reads every input copied once. A broker that finds no
writable server for ``--store-wait`` seconds exits with status 1. Tests
wait for conditions, never for a length of time."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from bench._postgres import PostgresCluster, PostgresServer, synchronous_primary
from client import Client, errors
from tests._cluster import (
    cluster_broker,
    owner_id,
    owners,
    spread_over,
    topic_in,
    wait_for,
)
from tests.conftest import BrokerProcess, until

pytestmark = pytest.mark.integration

STANDBY = "s1"  # the standby's application_name
TTL = 2.0  # the brokers' lease
BEFORE = 150  # messages acknowledged before the primary goes
AFTER = 150  # and after the standby is promoted
REOPEN_FAILED = "cannot reopen the store at"
REOPENED = "reopened the store at"


class Replicated:
    """A primary and its synchronous standby, and the database ``txnbuf``."""

    def __init__(self) -> None:
        self.primary_data = PostgresCluster("txnbuf-primary-")
        self.primary = PostgresServer(self.primary_data, synchronous_primary(STANDBY))
        self.standby_data = PostgresCluster.standby_of(self.primary, STANDBY)
        self.standby = PostgresServer(self.standby_data)

    def url(self, query: str = "") -> str:
        """Both servers, the primary first (libpq's multi-host URL)."""
        hosts = f"{self.primary.address},{self.standby.address}"
        return f"postgresql://postgres@{hosts}/txnbuf{query}"

    def close(self) -> None:
        for server in (self.primary, self.standby):
            server.stop()
        for data in (self.primary_data, self.standby_data):
            data.remove()


async def synchronous(server: PostgresServer) -> bool:
    conn = await asyncpg.connect(server.url())
    try:
        states = await conn.fetch("SELECT sync_state FROM pg_stat_replication")
    finally:
        await conn.close()
    return [s[0] for s in states] == ["sync"]


@pytest.fixture
def replicated() -> Iterator[Replicated]:
    servers = Replicated()
    try:
        yield servers
    finally:
        servers.close()
        for name, data in (("primary", servers.primary_data), ("standby", servers.standby_data)):
            with contextlib.suppress(OSError), open(os.path.join(data.dir, "log")) as f:
                print(f"----- PostgreSQL {name} -----\n{f.read()[-3000:]}")


@pytest.fixture
def client_log() -> Iterator[None]:
    """The client's log (logger ``client``, INFO and up: reconnects, moves,
    retries), its last lines shown at the end with their times, to set
    beside the brokers' logs (pytest shows them when the test fails)."""
    lines: collections.deque[str] = collections.deque(maxlen=400)
    handler = logging.Handler(logging.INFO)
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.emit = lambda record: lines.append(formatter.format(record))  # type: ignore[method-assign]
    logger = logging.getLogger("client")
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False  # (shown here, with times; not twice)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate
        print("----- the client's log -----\n" + "\n".join(lines))


async def _produce(client: Client, topic: str, acked: list[bytes], stop: asyncio.Event) -> None:
    """Send one message at a time; record each acknowledged one."""
    producer = await client.create_producer(topic)
    i = 0
    while not stop.is_set():
        value = b"m%05d" % i
        i += 1
        await producer.send(value)  # (an error here reached the application: the test fails)
        acked.append(value)


async def _copy(
    client: Client, source: str, target: str, stop: asyncio.Event, failures: dict[str, int]
) -> None:
    """The consume-transform-produce loop: each batch copied in one
    transaction (on the coordinator of ``source``'s slot, `near`); a batch
    whose transaction fails comes back. ``failures`` counts the failed
    transactions by error, and keeps the last error's text."""
    consumer = await client.subscribe(source, "copy", initial_position="earliest")
    producer = await client.create_producer(target)
    while not stop.is_set():
        batch = await consumer.batch_receive(max_messages=20, timeout=0.2)
        if not batch:
            continue
        try:
            async with client.transaction(timeout=30, near=source) as txn:
                for message in batch:
                    await producer.send(message.value, txn=txn)
                    await consumer.acknowledge(message, txn=txn)
        except errors.TxnbufError as exc:  # (aborted, or its outcome unknown)
            failures[type(exc).__name__] = failures.get(type(exc).__name__, 0) + 1
            failures[repr(exc)] = 0  # (the last one's text)
            # The batch again (what the transaction acknowledged, if it did
            # commit, is not delivered again).
            with contextlib.suppress(errors.TxnbufError):
                await consumer.redeliver_unacknowledged()


def _state(task: asyncio.Future[None]) -> str:
    """What became of a task of the test (for a failure's message)."""
    if not task.done():
        return "running"
    if task.cancelled():
        return "cancelled"
    return f"ended by {task.exception()!r}"


async def _read_all(url: str, topic: str, subscription: str) -> list[bytes]:
    """Every message of ``topic`` from its start, by a new subscription."""
    values: list[bytes] = []
    async with Client(url, operation_timeout=60.0) as client:
        consumer = await client.subscribe(topic, subscription, initial_position="earliest")
        with contextlib.suppress(errors.OperationTimeoutError):
            while True:
                message = await consumer.receive(timeout=5.0)
                values.append(message.value)
                await consumer.acknowledge(message)
    return values


async def test_the_primary_sigkilled_and_its_synchronous_standby_promoted_loses_nothing(
    tmp_path: Path,
    replicated: Replicated,
    logs: list[BrokerProcess],
    client_log: None,
) -> None:
    ha = replicated
    await wait_for("the standby replicates synchronously", lambda: synchronous(ha.primary))
    admin = await asyncpg.connect(ha.primary.url())
    await admin.execute("CREATE DATABASE txnbuf")
    await admin.close()
    # Two brokers get txnbuf's default (read-write), one says primary itself.
    for i, query in enumerate(("", "", "?target_session_attrs=primary")):
        proc = cluster_broker(tmp_path, ha.url(query), f"b{i}", TTL)
        proc.args += ["--store-wait", "60"]
        logs.append(proc)
        proc.start()
    url = ha.url()
    await wait_for("slots spread over the 3 brokers", lambda: spread_over(url, logs))
    slot = min((await owners(url))[owner_id(logs[0])])
    source, target = topic_in(slot, "ha-in"), topic_in(slot, "ha-out")
    service = ", ".join(p.url for p in logs)
    acked: list[bytes] = []
    seen: list[bytes] = []  # what a read-committed consumer of the copy received
    sending, copying_on = asyncio.Event(), asyncio.Event()
    async with Client(service, operation_timeout=90.0) as client:
        # (Kept from the start: a message acknowledged by every subscription
        # may be trimmed.)
        for topic in (source, target):
            await (await client.subscribe(topic, "check", initial_position="earliest")).close()
        producing = asyncio.ensure_future(_produce(client, source, acked, sending))
        failures: dict[str, int] = {}
        copying = asyncio.ensure_future(_copy(client, source, target, copying_on, failures))
        watching = asyncio.ensure_future(_watch(client, target, seen))
        await until(lambda: len(acked) >= BEFORE or producing.done(), "sends before", 120)
        ha.primary.kill()
        killed = time.monotonic()
        at_kill = len(acked)
        # Every broker finds no writable server (the standby refuses writes
        # until promoted), and keeps trying.
        for proc in logs:
            await until(lambda p=proc: REOPEN_FAILED in p.log(), f"{proc.url} retries", 60)  # type: ignore[misc]
        assert all(p.proc is not None and p.proc.poll() is None for p in logs)
        ha.standby.promote()
        promoted = time.monotonic()
        await until(lambda: len(acked) >= at_kill + AFTER or producing.done(), "sends after", 120)
        resumed = time.monotonic()
        sending.set()
        await producing  # (raises what reached the application)
        stored = await _read_all(service, source, "check")
        read = time.monotonic()
        with contextlib.suppress(AssertionError):
            await until(lambda: set(seen) >= set(stored) or copying.done(), "the copy", 120)
        caught_up = time.monotonic()
        assert set(seen) >= set(stored), (
            f"the copy's consumer received {len(set(seen))} of {len(set(stored))} inputs; "
            f"missing {sorted(set(stored) - set(seen))[:10]}; failed transactions {failures}; "
            f"the copy task: {_state(copying)}; the watcher: {_state(watching)}"
        )
        copying_on.set()
        await copying
        watching.cancel()
    print(
        f"SIGKILL -> promotion {promoted - killed:.2f}s, promotion -> {AFTER} more sends "
        f"acknowledged {resumed - promoted:.2f}s, the input read back {read - resumed:.2f}s, "
        f"the copy seen whole {caught_up - read:.2f}s later; {len(acked)} sends acknowledged, "
        f"copy transactions failed {failures}, the copy's consumer received "
        f"{len(seen)} messages ({len(set(seen))} distinct)"
    )
    for proc in logs:
        assert REOPENED in proc.log(), proc.url
    # Served by the new primary alone now (the old one is dead).
    assert await spread_over(ha.standby.url("txnbuf"), logs)
    assert len(stored) == len(set(stored)), "an input stored twice"
    assert set(acked) <= set(stored), f"acknowledged and lost: {sorted(set(acked) - set(stored))}"
    copied = await _read_all(service, target, "check")
    assert len(copied) == len(set(copied)), "copied twice"
    assert sorted(copied) == sorted(stored), "the copy is not the input, once"


async def _watch(client: Client, topic: str, seen: list[bytes]) -> None:
    consumer = await client.subscribe(topic, "watch", initial_position="earliest")
    while True:
        with contextlib.suppress(errors.OperationTimeoutError):
            message = await consumer.receive(timeout=5.0)
            seen.append(message.value)
            await consumer.acknowledge(message)


async def test_a_broker_that_finds_no_writable_server_for_store_wait_exits_1(
    tmp_path: Path,
    logs: list[BrokerProcess],
) -> None:
    data = PostgresCluster()
    server = PostgresServer(data)
    try:
        admin = await asyncpg.connect(server.url())
        await admin.execute("CREATE DATABASE txnbuf")
        await admin.close()
        proc = cluster_broker(tmp_path, server.url("txnbuf"), "alone", 1.0)
        proc.args += ["--store-wait", "2"]
        logs.append(proc)
        proc.start()
        await wait_for(
            "the broker serves every slot", lambda: spread_over(server.url("txnbuf"), logs)
        )
        server.kill()  # (no standby: nothing will be writable again)
        assert proc.proc is not None
        await until(lambda: proc.proc is not None and proc.proc.poll() is not None, "exit", 60)
        assert proc.proc.returncode == 1
        log = proc.log()
        assert REOPEN_FAILED in log
        assert "no writable PostgreSQL server at" in log and "this broker stops (status 1)" in log
    finally:
        server.stop()
        data.remove()


def test_a_store_url_of_several_hosts_connects_to_the_writable_one() -> None:
    from ledger import LedgerError
    from ledger._postgres import connect_options

    two = "postgresql://u@h1:5432,h2:5432/db"
    assert connect_options("postgresql://u@h1:5432/db") == {}
    assert connect_options(two) == {"target_session_attrs": "read-write"}
    assert connect_options("postgresql://u@/db?host=h1,h2") == {
        "target_session_attrs": "read-write"
    }
    for given in ("read-write", "primary"):
        assert connect_options(f"{two}?target_session_attrs={given}") == {}
    assert connect_options("postgresql://u@h1/db?target_session_attrs=any") == {}
    for refused in ("standby", "read-only", "prefer-standby", "any"):
        with pytest.raises(LedgerError, match="a store writes"):
            connect_options(f"{two}?target_session_attrs={refused}")


def test_serve_refuses_a_store_url_that_may_pick_a_standby(tmp_path: Path) -> None:
    import subprocess
    import sys

    url = "postgresql://u:secret@h1:5432,h2:5432/db?target_session_attrs=standby"
    result = subprocess.run(
        [sys.executable, "-m", "broker", "serve", "--data-dir", str(tmp_path), "--store", url],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "target_session_attrs=standby" in result.stderr and "a store writes" in result.stderr
    assert "secret" not in result.stderr
