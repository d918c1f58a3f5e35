"""Exactly-once consume-transform-produce on txnbuf, PostgreSQL and Redis, in one run.

    python -m bench.ctp [--messages 100000] [--rounds 3] [--workers 1,4]
                        [--per-txn 100] [--size 100] [--loops readme,fastest]
                        [--systems postgres,redis,txnbuf] [--baseline [NAME=]DIR]
                        [--results bench/results/ctp.md]

Each system is loaded with the same ``--messages`` inputs of ``--size`` bytes
(a number, then padding); its workers then copy them, transformed
(``bytes.upper``), to an output, ``--per-txn`` inputs per transaction,
until every input is consumed. The figure is msgs/s of that stage alone
(loading not counted); after it the output is read back and checked: one
output per input, each the input transformed, no duplicates (a run that
fails the check stops the benchmark).

- PostgreSQL (asyncpg): one transaction takes ``--per-txn`` rows with
  ``SELECT ... FOR UPDATE SKIP LOCKED LIMIT n`` and deletes them (one
  statement: ``DELETE ... WHERE id IN (SELECT ...) RETURNING``), inserts the
  transformed rows (one ``INSERT ... SELECT unnest($1)``) and commits;
  ``fsync=on``, ``synchronous_commit=on``.
- Redis Streams (redis-py, with hiredis when installed): ``XREADGROUP COUNT
  n``, then ``MULTI {XADD x n, XACK} EXEC``; ``appendonly yes``,
  ``appendfsync always``, ``save ""``.
- txnbuf, two loops, each against a broker of its own
  (`bench._brokers.BrokerProcess`):
  ``README loop``: what the README shows a user: receive a batch
  (``consumer.batch_receive(max_messages=--per-txn, timeout=0.1)``, as
  ``examples/consume_transform_produce.py`` does), then in
  ``async with client.transaction()`` per message ``await
  producer.send(..., txn=txn)`` and ``await consumer.acknowledge(msg,
  txn=txn)``; leaving the block commits. ``fastest loop``: the fewest calls
  the public client needs for the same work: the same batch, then
  `copy_in_one_txn` (``send_nowait`` per message, no await; the
  batch acknowledged in one call; commit).

Workers are OS processes (``multiprocessing``, each with a connection of its
own), 1 and 4 by default, for every system; for txnbuf also asyncio tasks
in one process (one client, a consumer and a producer per task) for each
worker count above 1 (one task in one process is the 1-process run). A round
runs every system and worker count once, each on a fresh server (PostgreSQL:
a cluster made once by ``initdb``, its tables made again for each run; Redis
and txnbuf: a new data folder), in an order that rotates from round to
round. Servers listen on free ports of 127.0.0.1 in a temporary folder and
are stopped at the end of their run; as root, PostgreSQL runs as the
``postgres`` user. ``bench/install-peers`` installs PostgreSQL, Redis and
their drivers; a peer not installed is reported as not run, and no ratio
is printed against it.

``--baseline [NAME=]DIR`` (as many as given): txnbuf's rows run once more
each round with another checkout's broker and client (``git archive main |
tar -x -C DIR`` makes one), in the same rotation as every other row, so a
branch is compared with main (and both with the peers) in one run. Such a
row runs in a process of this script started with that checkout first on
the path (its broker and its worker processes import that checkout's code;
this script and the bench helpers it imports are that checkout's too,
except this file). ``--loops`` limits txnbuf's loops. ``--stream``: txnbuf's workers connect to
the broker's raw TCP listener (``--stream-port``, ``txnbuf://``) instead of
the WebSocket.

Prints each run's msgs/s, the medians, CPU microseconds per message of the
client processes, the server (txnbuf: the broker's main process; PostgreSQL:
the postmaster and its children, those that exit during the run, such as
an autovacuum worker, not counted; Redis: redis-server) and txnbuf's ledger
writer thread, the ratio of each txnbuf row to the best peer with as many
workers, and of the README loop to the fastest loop; and appends the same to
``--results`` (with the date, ``uname -a``, the number of cores, Python's
version and the checkout). This machine's speed swings from day to day: only
figures of one run compare.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.util
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench._brokers import BrokerProcess, free_port
from bench._postgres import PostgresCluster, PostgresServer, postgres_bin
from bench._progress import Runs
from bench.txnpath import cpu_seconds
from client import Client, Consumer, Message, Producer, errors

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "ctp.md"
SYSTEMS = ("postgres", "redis", "txnbuf")
PEERS = ("postgres", "redis")
NAMES = {"postgres": "PostgreSQL", "redis": "Redis", "txnbuf": "txnbuf"}
LOOPS = {"readme": "README loop", "fastest": "fastest loop"}
DIGITS = 10  # a value starts with its input's number, this many digits
IDLE = 0.1  # s a worker waits for a first message before it looks whether the run is over
TIMEOUT = 1800.0  # s a run may take at most
IN, OUT, GROUP = "ctp-in", "ctp-out", "ctp"

Step = Callable[[], Awaitable[int]]  # one transaction: inputs copied (0: none to take)


def value_of(number: int, size: int) -> bytes:
    return b"%0*d" % (DIGITS, number) + b"m" * (size - DIGITS)


def transform(value: bytes) -> bytes:
    return value.upper()


class OutputError(Exception):
    """A run's output is not each input transformed exactly once."""


def check_output(values: list[bytes], total: int, size: int) -> None:
    """Raise `OutputError` unless ``values`` are the ``total`` inputs, each
    transformed, each once (in any order)."""
    numbers = sorted(int(v[:DIGITS]) for v in values)
    if numbers != list(range(total)):
        distinct = set(numbers)
        raise OutputError(
            f"{len(values):,} outputs for {total:,} inputs: "
            f"{len(values) - len(distinct):,} duplicates, "
            f"{len(set(range(total)) - distinct):,} inputs missing"
        )
    wrong = sum(1 for v in values if v != transform(value_of(int(v[:DIGITS]), size)))
    if wrong:
        raise OutputError(f"{wrong:,} outputs are not their input transformed")


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop  # type: ignore[no-any-return]


# --- what runs ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Variant:
    """One system with a number of workers: OS processes, or asyncio tasks of
    one process; for txnbuf, one of its loops."""

    system: str
    workers: int
    processes: bool = True
    loop: str = ""
    side: str = ""  # a baseline's name: txnbuf from that checkout

    @property
    def label(self) -> str:
        name = NAMES[self.system] + (f" ({self.side})" if self.side else "")
        name += f", {LOOPS[self.loop]}" if self.loop else ""
        unit = ("process", "processes") if self.processes else ("task", "tasks")
        return f"{name}, {self.workers} {unit[self.workers > 1]}"

    @property
    def kind(self) -> str:
        """How the workers run, e.g. ``4 processes``."""
        return self.label.rsplit(", ", 1)[1]


def plan(
    systems: list[str],
    workers: list[int],
    loops: Sequence[str] = tuple(LOOPS),
    sides: Sequence[str] = (),
) -> list[Variant]:
    variants = []
    for system in systems:
        for side in ("", *sides) if system == "txnbuf" else ("",):
            for loop in loops if system == "txnbuf" else ("",):
                variants += [Variant(system, n, True, loop, side) for n in workers]
                if system == "txnbuf":
                    variants += [Variant(system, n, False, loop, side) for n in workers if n > 1]
    return variants


def missing(system: str) -> str | None:
    """Why ``system`` cannot run here, or None."""
    if system == "postgres":
        if postgres_bin() is None:
            return "no postgres binary (bench/install-peers installs it)"
        if importlib.util.find_spec("asyncpg") is None:
            return "no asyncpg (pip install -e '.[bench]')"
    elif system == "redis":
        if shutil.which("redis-server") is None:
            return "no redis-server (bench/install-peers installs it)"
        if importlib.util.find_spec("redis") is None:
            return "no redis-py (pip install -e '.[bench]')"
    return None


@dataclass(frozen=True, slots=True)
class Run:
    """One run's msgs/s and CPU µs per message (``writer``: txnbuf only)."""

    rate: float
    client: float
    server: float
    writer: float | None


# --- the servers ----------------------------------------------------------------------


class Server:
    """A server process a run starts and stops, and what the parent does with it
    (``workers_url``: where the workers connect, if not ``address``)."""

    name = ""
    proc: subprocess.Popen[bytes]
    address = ""
    workers_url = ""

    async def load(self, total: int, size: int, per_txn: int) -> None:
        raise NotImplementedError

    async def outputs(self) -> list[bytes]:
        """Every output; raises `OutputError` if an input is left unconsumed."""
        raise NotImplementedError

    def cpu(self) -> tuple[float, float | None]:
        """CPU seconds so far of the server, and of its writer (txnbuf)."""
        return cpu_seconds(self.proc.pid), None

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _wait_until(server: Server, ready: Callable[[], bool], log: str) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            break
        if ready():
            return
        time.sleep(0.05)
    server.stop()
    with contextlib.suppress(OSError), open(log, errors="replace") as f:
        sys.stderr.write(f.read()[-5000:])
    raise RuntimeError(f"{server.name} did not start (log: {log})")


class Postgres(Server):
    name = "PostgreSQL"

    def __init__(self, cluster: PostgresCluster) -> None:
        self.server = PostgresServer(cluster)
        self.proc = self.server.proc
        self.address = self.server.address

    async def _connect(self) -> Any:
        import asyncpg

        host, port = self.address.split(":")
        return await asyncpg.connect(host=host, port=int(port), user="postgres")

    async def load(self, total: int, size: int, per_txn: int) -> None:
        conn = await self._connect()
        try:
            await conn.execute("""
                DROP TABLE IF EXISTS ctp_in, ctp_out;
                CREATE TABLE ctp_in (id bigint PRIMARY KEY, v bytea NOT NULL);
                CREATE TABLE ctp_out (id bigserial PRIMARY KEY, v bytea NOT NULL);
            """)  # fmt: skip
            await conn.copy_records_to_table(
                "ctp_in", records=((n, value_of(n, size)) for n in range(total))
            )
            await conn.execute("VACUUM ANALYZE ctp_in")
        finally:
            await conn.close()

    async def outputs(self) -> list[bytes]:
        conn = await self._connect()
        try:
            if left := await conn.fetchval("SELECT count(*) FROM ctp_in"):
                raise OutputError(f"{left:,} inputs left in ctp_in")
            return [row[0] for row in await conn.fetch("SELECT v FROM ctp_out")]
        finally:
            await conn.close()

    def stop(self) -> None:
        self.server.stop()


class Redis(Server):
    name = "Redis"

    def __init__(self, tmp: str) -> None:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        folder = os.path.join(tmp, f"redis-{port}")
        os.mkdir(folder)
        log = os.path.join(folder, "log")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", folder,
             "--appendonly", "yes", "--appendfsync", "always", "--save", "",
             "--logfile", log],
            stdout=subprocess.DEVNULL,
        )  # fmt: skip

        def ready() -> bool:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
            except OSError:
                return False

        _wait_until(self, ready, log)

    def _connect(self) -> Any:
        import redis.asyncio

        host, port = self.address.split(":")
        return redis.asyncio.Redis(host=host, port=int(port))

    async def load(self, total: int, size: int, per_txn: int) -> None:
        r = self._connect()
        try:
            for first in range(0, total, 1000):
                pipe = r.pipeline(transaction=False)
                for n in range(first, min(total, first + 1000)):
                    pipe.xadd(IN, {"v": value_of(n, size)})
                await pipe.execute()
            await r.xgroup_create(IN, GROUP, id="0")
        finally:
            await r.aclose()

    async def outputs(self) -> list[bytes]:
        r = self._connect()
        try:
            pending = await r.xpending(IN, GROUP)
            groups = await r.xinfo_groups(IN)
            lag = groups[0].get("lag", groups[0].get(b"lag"))
            if pending["pending"] or lag:
                raise OutputError(f"{pending['pending']} inputs pending, {lag} never read")
            return [fields[b"v"] for _id, fields in await r.xrange(OUT)]
        finally:
            await r.aclose()


class Txnbuf(Server):
    """A broker of this checkout (``root``: of that one), given ``options`` of
    ``txnbuf serve`` and ``env``; with ``stream``, the workers connect to its
    raw TCP listener with ``scheme``, loading and checking go through the
    WebSocket."""

    name = "txnbuf"

    def __init__(
        self,
        tmp: str,
        options: Sequence[str] = (),
        stream: bool = False,
        *,
        scheme: str = "txnbuf",
        root: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        port = free_port() if stream else 0
        options = [*options, "--stream-port", str(port)] if stream else list(options)
        data = tempfile.mkdtemp(dir=tmp, prefix="txnbuf-")
        self.broker = BrokerProcess(data, root=root, env=env, options=options)
        self.proc = self.broker.proc
        self.address = self.broker.url
        if stream:
            self.workers_url = f"{scheme}://127.0.0.1:{port}"

    def cpu(self) -> tuple[float, float | None]:
        return self.broker.cpu()

    async def load(self, total: int, size: int, per_txn: int) -> None:
        async with Client(self.address) as client:
            # Entries of per_txn messages, so a shared subscription spreads them.
            seeder = await client.create_producer(IN, batching_max_messages=per_txn)
            for first in range(0, total, 5000):
                last = min(total, first + 5000)
                await asyncio.gather(*(seeder.send_nowait(value_of(n, size))
                                       for n in range(first, last)))  # fmt: skip

    async def outputs(self) -> list[bytes]:
        stats_url = f"{self.address}/admin/v1/topics/{IN}/stats"
        async with aiohttp.ClientSession() as session, session.get(stats_url) as reply:
            stats = await reply.json()
        for partition in stats["partitions"]:
            sub = partition["subscriptions"][GROUP]
            if sub["backlog"] or sub["unacked"] or sub["pending_ack"]:
                raise OutputError(f"inputs left: {sub}")
        values = []
        async with Client(self.address) as client:
            reader = await client.subscribe(OUT, "check", initial_position="earliest",
                                            receiver_queue_size=5000)  # fmt: skip
            with contextlib.suppress(errors.OperationTimeoutError):
                while True:
                    values.append((await reader.receive(timeout=1.0)).value)
        return values

    def stop(self) -> None:
        self.broker.stop()


def start_server(
    system: str, tmp: str, cluster: PostgresCluster | None, stream: bool = False
) -> Server:
    if system == "postgres":
        assert cluster is not None
        return Postgres(cluster)
    return Redis(tmp) if system == "redis" else Txnbuf(tmp, stream=stream)


# --- the workers (each in a process of its own) ---------------------------------------


class Sync:
    """What a run's worker processes share with the parent: barriers before
    and after the measured stage, the count of inputs copied, when the last
    was, and each process's CPU seconds in the stage."""

    def __init__(self, ctx: Any, processes: int) -> None:
        self.start = ctx.Barrier(processes + 1)
        self.stop = ctx.Barrier(processes + 1)
        self.release = ctx.Event()
        self.done = ctx.Value("q", 0)
        self.end = ctx.Value("d", 0.0)
        self.cpu = ctx.Array("d", processes)

    def abort(self) -> None:
        self.start.abort()
        self.stop.abort()


@dataclass(frozen=True, slots=True)
class Job:
    variant: Variant
    address: str
    total: int
    per_txn: int
    index: int  # the process's number in its run


TAKE_ROWS = """DELETE FROM ctp_in WHERE id IN
    (SELECT id FROM ctp_in ORDER BY id FOR UPDATE SKIP LOCKED LIMIT $1) RETURNING v"""
PUT_ROWS = "INSERT INTO ctp_out (v) SELECT unnest($1::bytea[])"


async def postgres_steps(job: Job, stack: contextlib.AsyncExitStack) -> list[Step]:
    import asyncpg

    host, port = job.address.split(":")
    conn = await asyncpg.connect(host=host, port=int(port), user="postgres")
    stack.push_async_callback(conn.close)
    per_txn = job.per_txn

    async def step() -> int:
        async with conn.transaction():
            rows = await conn.fetch(TAKE_ROWS, per_txn)
            if rows:
                await conn.execute(PUT_ROWS, [transform(row[0]) for row in rows])
        return len(rows)

    return [step]


async def redis_steps(job: Job, stack: contextlib.AsyncExitStack) -> list[Step]:
    import redis.asyncio

    host, port = job.address.split(":")
    r = redis.asyncio.Redis(host=host, port=int(port))
    stack.push_async_callback(r.aclose)
    await r.ping()
    name, per_txn = f"worker-{job.index}", job.per_txn

    async def step() -> int:
        reply = await r.xreadgroup(GROUP, name, {IN: ">"}, count=per_txn)
        if not reply:
            return 0
        entries = next(iter(reply.values())) if isinstance(reply, dict) else reply[0][1]
        if not entries:
            return 0
        pipe = r.pipeline(transaction=True)
        for _id, fields in entries:
            pipe.xadd(OUT, {"v": transform(fields[b"v"])})
        pipe.xack(IN, GROUP, *(entry_id for entry_id, _ in entries))
        await pipe.execute()
        return len(entries)

    return [step]


def readme_loop(client: Client, consumer: Consumer, producer: Producer, per_txn: int) -> Step:
    """The README's consume-transform-produce, as a user writes it."""

    async def step() -> int:
        batch = await consumer.batch_receive(max_messages=per_txn, timeout=0.1)
        if not batch:
            return 0
        async with client.transaction(timeout=30) as txn:
            for msg in batch:
                await producer.send(transform(msg.value), txn=txn)
                await consumer.acknowledge(msg, txn=txn)
        return len(batch)

    return step


async def copy_in_one_txn(
    client: Client,
    consumer: Consumer,
    producer: Producer,
    batch: list[Message],
    transform: Callable[[bytes], bytes] | None = None,
) -> float:
    """Send ``batch``'s values (through ``transform`` if given) and acknowledge
    ``batch`` in one transaction, then commit it; the commit's latency in
    seconds. The fastest consume-transform-produce loop this client has:
    the sends are queued without waiting for their receipts and the acks go
    as one request, so commit() is the only wait."""
    txn = await client.new_transaction(timeout=60)
    if transform is None:
        for m in batch:
            producer.send_nowait(m.value, txn=txn)
    else:
        for m in batch:
            producer.send_nowait(transform(m.value), txn=txn)
    await consumer.acknowledge(batch, txn=txn)
    t0 = time.perf_counter()
    await txn.commit()
    return time.perf_counter() - t0


def fastest_loop(client: Client, consumer: Consumer, producer: Producer, per_txn: int) -> Step:
    """The fewest calls: a batch, sends not awaited, the batch acknowledged
    at once, commit."""

    async def step() -> int:
        batch = await consumer.batch_receive(max_messages=per_txn, timeout=IDLE)
        if not batch:
            return 0
        await copy_in_one_txn(client, consumer, producer, batch, transform)
        return len(batch)

    return step


async def txnbuf_steps(job: Job, stack: contextlib.AsyncExitStack) -> list[Step]:
    variant = job.variant
    client = await stack.enter_async_context(Client(job.address))
    steps = []
    for _ in range(1 if variant.processes else variant.workers):
        if variant.loop == "readme":  # (the subscription as the README makes one)
            consumer = await client.subscribe(IN, GROUP, "shared", initial_position="earliest")
        else:  # (as bench.txn makes one)
            consumer = await client.subscribe(IN, GROUP, "shared", initial_position="earliest",
                                              receiver_queue_size=2 * job.per_txn)  # fmt: skip
        producer = await client.create_producer(OUT)
        loop = readme_loop if variant.loop == "readme" else fastest_loop
        steps.append(loop(client, consumer, producer, job.per_txn))
    return steps


STEPS = {"postgres": postgres_steps, "redis": redis_steps, "txnbuf": txnbuf_steps}


async def drain(step: Step, total: int, sync: Sync) -> None:
    """Run transactions until ``total`` inputs are copied (by all workers)."""
    done = sync.done
    while done.value < total:
        copied = await step()
        if copied:
            with done.get_lock():
                done.value += copied
                if done.value >= total:
                    sync.end.value = time.perf_counter()
        else:  # (nothing to take: the rest is in other workers' transactions)
            await asyncio.sleep(0.001)


async def work(job: Job, sync: Sync) -> None:
    async with contextlib.AsyncExitStack() as stack:
        steps = await STEPS[job.variant.system](job, stack)
        await asyncio.to_thread(sync.start.wait, TIMEOUT)
        cpu0 = time.process_time()
        await asyncio.gather(*(drain(step, job.total, sync) for step in steps))
        sync.cpu[job.index] = time.process_time() - cpu0
        await asyncio.to_thread(sync.stop.wait, TIMEOUT)
        await asyncio.to_thread(sync.release.wait, TIMEOUT)  # (the server's CPU is read)


def worker_process(job: Job, sync: Sync) -> None:
    try:
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            runner.run(work(job, sync))
    except BaseException:
        sync.abort()  # (the parent and the other workers stop waiting)
        raise


# --- the parent -----------------------------------------------------------------------


def copy_stage(
    server: Server,
    variant: Variant,
    args: argparse.Namespace,
    label: str,
    at_start: Callable[[], Any],
    at_stop: Callable[[], Any],
) -> tuple[Sync, float, Any, Any]:
    """Copy every input of the loaded ``server`` with ``variant``'s worker
    processes: ``at_start()`` once all are ready, ``at_stop()`` once the last
    input is copied (the stage measured between); the workers' `Sync`, the
    stage's start (``perf_counter``) and what the two calls gave."""
    ctx = multiprocessing.get_context("spawn")
    processes = variant.workers if variant.processes else 1
    sync = Sync(ctx, processes)
    jobs = [Job(variant, server.workers_url or server.address, args.messages, args.per_txn, i)
            for i in range(processes)]  # fmt: skip
    workers = [ctx.Process(target=worker_process, args=(job, sync)) for job in jobs]
    for w in workers:
        w.start()
    try:
        sync.start.wait(TIMEOUT)
        start, first = time.perf_counter(), at_start()
        sync.stop.wait(TIMEOUT)
        last = at_stop()
        sync.release.set()
        for w in workers:
            w.join(60)
    except threading.BrokenBarrierError:
        for w in workers:
            w.join(5)
        codes = [w.exitcode for w in workers]
        raise RuntimeError(f"{label}: a worker failed (exit codes {codes})") from None
    finally:
        for w in workers:
            if w.is_alive():
                w.kill()
                w.join()
    return sync, start, first, last


def one_run(
    variant: Variant,
    args: argparse.Namespace,
    tmp: str,
    cluster: PostgresCluster | None,
    runner: asyncio.Runner,
    make_server: Callable[[], Server] | None = None,
) -> Run:
    """Load a fresh server (``variant``'s, or ``make_server()``), copy every
    input with ``variant``'s workers, check the output."""
    stream = getattr(args, "stream", False)
    server = make_server() if make_server else start_server(variant.system, tmp, cluster, stream)
    try:
        runner.run(server.load(args.messages, args.size, args.per_txn))
        sync, start, (server0, writer0), (server1, writer1) = copy_stage(
            server, variant, args, variant.label, server.cpu, server.cpu
        )
        runner.run(check(server, args.messages, args.size, variant))
    finally:
        server.stop()
    per = 1e6 / args.messages
    writer = None if writer0 is None or writer1 is None else (writer1 - writer0) * per
    return Run(
        rate=args.messages / (sync.end.value - start),
        client=sum(sync.cpu) * per,
        server=(server1 - server0) * per,
        writer=writer,
    )


async def check(server: Server, total: int, size: int, variant: Variant) -> None:
    try:
        check_output(await server.outputs(), total, size)
    except OutputError as e:
        raise SystemExit(f"{variant.label}: the output check failed: {e}") from None


def versions(systems: list[str], cluster: PostgresCluster | None) -> list[str]:
    lines = []
    if "postgres" in systems and cluster is not None:
        import asyncpg

        lines.append(
            f"PostgreSQL {cluster.version} (asyncpg {asyncpg.__version__}): SELECT ... FOR UPDATE "
            f"SKIP LOCKED LIMIT n with DELETE (one statement), INSERT of n rows (one "
            f"statement), COMMIT; fsync=on, synchronous_commit=on"
        )
    if "redis" in systems:
        import redis
        from redis.utils import HIREDIS_AVAILABLE

        server = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        version = next((w[2:] for w in server.stdout.split() if w.startswith("v=")), "?")
        parser = "hiredis" if HIREDIS_AVAILABLE else "no hiredis"
        lines.append(
            f"Redis {version} (redis-py {redis.__version__}, {parser}): XREADGROUP COUNT n, "
            f'MULTI {{XADD x n, XACK}} EXEC; appendonly yes, appendfsync always, save ""'
        )
    if "txnbuf" in systems:
        lines.append(
            "txnbuf: README loop: batch_receive, then per message await send(txn=) and await "
            "acknowledge(msg, txn=), commit on leaving client.transaction(); fastest loop: "
            "batch_receive, then send_nowait(txn=) per message, the batch acknowledged at once, "
            "commit"
        )
    return lines


def machine() -> str:
    def out(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
        except OSError:
            return ""

    commit = out("git", "rev-parse", "--short", "HEAD") or "?"
    if out("git", "status", "--porcelain", "--untracked-files=no"):
        commit += " with uncommitted changes"
    return (
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; `{out('uname', '-a') or '?'}`; "
        f"{os.cpu_count()} cores; Python {platform.python_version()}; txnbuf {commit}"
    )


def report(
    args: argparse.Namespace,
    variants: list[Variant],
    runs: dict[Variant, list[Run]],
    absent: dict[str, str],
    header: list[str],
) -> str:
    rounds = args.rounds
    lines = [
        f"consume-transform-produce, exactly once: {args.messages:,} inputs of {args.size} B, "
        f"{args.per_txn} per transaction; {rounds} round(s), each runs every row once on a "
        f"fresh server, in rotation",
        "",
        *(f"- {line}" for line in header),
        "",
    ]
    lines += [f"{NAMES[system]}: not run: {why}" for system, why in absent.items()]
    lines += [""] if absent else []
    medians = {v: statistics.median(run.rate for run in runs[v]) for v in variants}
    best: dict[int, tuple[float, str]] = {}  # workers -> the best peer's median
    for v in variants:
        if v.system in PEERS and medians[v] > best.get(v.workers, (0.0, ""))[0]:
            best[v.workers] = (medians[v], NAMES[v.system])
    rounds_head = " | ".join(f"round {r + 1}" for r in range(rounds))
    lines += [
        f"| | {rounds_head} | median msgs/s | client | server | writer | ratio to best peer |",
        "|---|" + "---:|" * rounds + "---:|---:|---:|---:|---|",
    ]
    for v in variants:
        each = " | ".join(f"{run.rate:,.0f}" for run in runs[v])
        cpu = [statistics.median(getattr(run, c) for run in runs[v]) for c in ("client", "server")]
        writers = [run.writer for run in runs[v] if run.writer is not None]
        writer = f"{statistics.median(writers):.2f}" if writers else "-"
        if v.system in PEERS:
            ratio = "-"
        elif v.workers in best:
            ratio = f"{medians[v] / best[v.workers][0]:.2f} ({best[v.workers][1]})"
        else:
            ratio = "no peer ran"
        lines.append(
            f"| {v.label} | {each} | {medians[v]:,.0f} | {cpu[0]:.2f} | {cpu[1]:.2f} "
            f"| {writer} | {ratio} |"
        )
    lines += [
        "",
        "CPU µs per message: client = the worker processes; server = txnbuf's broker process "
        "(without its writer), PostgreSQL's postmaster and its children, redis-server; "
        "writer = txnbuf's ledger writer thread.",
        f"Every run's output was checked: {args.messages:,} outputs, each input transformed "
        f"exactly once, every input consumed.",
    ]
    pairs = [(v, w) for v in variants for w in variants
             if v.loop == "readme" and w.loop == "fastest" and v.kind == w.kind
             and v.side == w.side]  # fmt: skip
    if pairs:
        lines.append("")
        lines.append("txnbuf README loop / fastest loop:")
        for readme, fastest in pairs:
            each = ", ".join(
                f"{a.rate / b.rate:.2f}" for a, b in zip(runs[readme], runs[fastest], strict=True)
            )
            side = f" ({readme.side})" if readme.side else ""
            lines.append(
                f"- {readme.kind}{side}: {medians[readme] / medians[fastest]:.2f} "
                f"(each round: {each})"
            )
    pairs = [(v, w) for v in variants for w in variants
             if v.system == w.system == "txnbuf" and not v.side and w.side
             and (v.loop, v.workers, v.processes) == (w.loop, w.workers, w.processes)]  # fmt: skip
    if pairs:
        lines.append("")
        lines.append("txnbuf, this checkout / a baseline, the same row of the same round:")
        for this, other in pairs:
            each = ", ".join(
                f"{a.rate / b.rate:.2f}" for a, b in zip(runs[this], runs[other], strict=True)
            )
            lines.append(
                f"- {this.label} / {other.side}: {medians[this] / medians[other]:.2f} "
                f"(each round: {each})"
            )
    return "\n".join(lines)


def _systems(text: str) -> list[str]:
    systems = [s for s in text.split(",") if s]
    if not systems or any(s not in SYSTEMS for s in systems):
        raise argparse.ArgumentTypeError(f"systems are a list of {', '.join(SYSTEMS)}: {text!r}")
    return systems


def _workers(text: str) -> list[int]:
    try:
        workers = [int(n) for n in text.split(",")]
    except ValueError:
        workers = []
    if not workers or min(workers) < 1:
        raise argparse.ArgumentTypeError(f"workers are a list of numbers above 0: {text!r}")
    return workers


def _baseline(text: str) -> tuple[str, Path]:
    name, sep, folder = text.rpartition("=")
    path = Path(folder).resolve()
    if not (path / "client" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"not a txnbuf checkout: {folder!r}")
    return (name if sep else path.name), path


def _loops(text: str) -> list[str]:
    loops = [s for s in text.split(",") if s]
    if not loops or any(s not in LOOPS for s in loops):
        raise argparse.ArgumentTypeError(f"loops are a list of {', '.join(LOOPS)}: {text!r}")
    return loops


def run_in_checkout(variant: Variant, args: argparse.Namespace, checkout: Path) -> Run:
    """`one_run` of ``variant`` in a process of this script that has
    ``checkout`` first on its path (so its broker and its workers run that
    checkout's code); the run it prints."""
    options = {"messages": args.messages, "per_txn": args.per_txn, "size": args.size,
               "stream": args.stream}  # fmt: skip
    one = json.dumps({"variant": [variant.workers, variant.processes, variant.loop], **options})
    # run_path, not -m: this file, with none of its folder's modules in the
    # way of the checkout's packages (bench/cluster.py and cluster/).
    code = f"import runpy, sys; sys.argv = [{__file__!r}, '--one-run', {one!r}]; " \
           f"runpy.run_path({__file__!r}, run_name='__main__')"  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(checkout), "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", code], cwd=checkout, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"{variant.label}: the run in {checkout} failed:\n{done.stderr[-5000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    return Run(result["rate"], result["client"], result["server"], result["writer"])


def one_run_here(spec: str) -> None:
    """``--one-run``: one txnbuf run in this process (see `run_in_checkout`)."""
    given = json.loads(spec)
    workers, processes, loop = given.pop("variant")
    args = argparse.Namespace(**given)
    with (
        tempfile.TemporaryDirectory() as tmp,
        asyncio.Runner(loop_factory=_loop_factory()) as runner,
    ):
        run = one_run(Variant("txnbuf", workers, processes, loop), args, tmp, None, runner)
    print(json.dumps({"rate": run.rate, "client": run.client, "server": run.server,
                      "writer": run.writer}))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=_workers, default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--systems", type=_systems, default=list(SYSTEMS),
                        help="of postgres,redis,txnbuf")  # fmt: skip
    parser.add_argument("--loops", type=_loops, default=list(LOOPS), help="of readme,fastest")
    parser.add_argument("--stream", action="store_true",
                        help="txnbuf's workers on the raw TCP listener (txnbuf://)")  # fmt: skip
    parser.add_argument("--baseline", type=_baseline, action="append", default=[],
                        help="[NAME=]DIR: txnbuf's rows with that checkout's code too")  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the file a section of results is appended to")  # fmt: skip
    parser.add_argument("--one-run", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_run is not None:
        one_run_here(args.one_run)
        return
    if args.messages < 1 or args.rounds < 1 or args.per_txn < 1:
        parser.error("--messages, --rounds and --per-txn must be above 0")
    if args.size < DIGITS:
        parser.error(f"--size must be at least {DIGITS} (a value starts with its number)")

    absent = {s: why for s in args.systems if s in PEERS and (why := missing(s))}
    for system, why in absent.items():
        print(f"{NAMES[system]}: not run: {why}", file=sys.stderr)
    systems = [s for s in args.systems if s not in absent]
    sides = dict(args.baseline)
    variants = plan(systems, args.workers, args.loops, list(sides))
    runs: dict[Variant, list[Run]] = {v: [] for v in variants}
    cluster = PostgresCluster() if "postgres" in systems else None
    try:
        header = [machine(), *versions(systems, cluster)]
        if args.stream and "txnbuf" in systems:
            header.append("txnbuf's workers connect to the raw TCP listener (--stream-port, "
                          "txnbuf://); loading and checking go through the WebSocket")  # fmt: skip
        header += [f"baseline {name}: txnbuf's rows again with the code of {folder}"
                   for name, folder in sides.items()]  # fmt: skip
        with (
            tempfile.TemporaryDirectory() as tmp,
            asyncio.Runner(loop_factory=_loop_factory()) as runner,
        ):
            with Runs(args.rounds * len(variants), "ctp") as progress:
                for r in range(args.rounds):
                    shift = r * len(variants) // args.rounds
                    for v in variants[shift:] + variants[:shift]:
                        progress.start(f"round {r + 1}/{args.rounds}: {v.label}")
                        if v.side:
                            run = run_in_checkout(v, args, sides[v.side])
                        else:
                            run = one_run(v, args, tmp, cluster, runner)
                        progress.done(f"{run.rate:,.0f} msgs/s, output checked")
                        runs[v].append(run)
    finally:
        if cluster is not None:
            cluster.remove()
    text = report(args, variants, runs, absent, header)
    print(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as results:
        results.write(f"\n## {header[0].split(';')[0]}\n\n{text}\n")


if __name__ == "__main__":
    main()
