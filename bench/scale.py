"""Many topics and many connections on one broker: restart time, memory, latency.

    python -m bench.scale --topics 1000,10000 [--connections 100,1000,2000]
                          [--baseline DIR] [--results FILE]

Topics (for each count N): a fresh broker; N topics, each with one producer,
one subscription (``earliest``) and one message, made through the client
over ``--clients`` connections; each message is received on its
subscription and left unacknowledged, producer and consumer closed. Then
the broker is killed (SIGKILL) and started again on the same data, and
every subscription is read again: its message is redelivered and
acknowledged. Prints:

- restart to healthy: start of the process until ``/admin/v1/health`` answers,
- all read again: start of the process until every topic's message came back,
- broker RSS (``/proc``, the broker's process; a writer process apart, for
  an older checkout's broker that had one):
  empty, before the kill, once healthy again, and after everything was read,
  and the growth per topic once healthy (``(healthy - empty) / N``: topics
  not loaded yet, where a broker loads them on first use) and after every
  topic was read (``(after reads - empty) / N``: every topic loaded, idle),
- the data directory's size per topic.

Connections (for each count C): a fresh broker; C clients (one WebSocket
each), each with a producer and a consumer on a topic of its own. With all
of them open, p50 / p99 of a produce round trip (``send`` until its
receipt): quiet (one connection sends, the others are idle) and loaded
(every connection sends one message at a time, all at once). The open-file
limit is raised to its hard limit here (the broker inherits it); the
figures name it.

``--baseline DIR``: each count runs twice, with this checkout's broker and
then with one from DIR's code (the client stays this one's); both rows are
printed, named ``this`` and ``baseline`` (only figures of one run compare:
the machine's speed drifts). Every run appends a section to ``--results``
(``bench/results/scale.md``) with the date, the machine and the code each
side ran.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bench._brokers import BrokerProcess
from client import Client

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "scale.md"
SUBSCRIPTION = "s"
IN_FLIGHT = 64  # topics being set up (or read) at once per client connection


@dataclass
class TopicResult:
    side: str
    topics: int
    setup_s: float
    healthy_s: float | None  # None: no answer within --start-timeout
    read_s: float | None
    rss_empty_kb: int
    rss_before_kb: int
    rss_healthy_kb: int
    rss_read_kb: int
    writer_rss_kb: int
    data_bytes: int

    @property
    def growth_per_topic(self) -> float:
        """Bytes of RSS per topic once healthy again (nothing read yet)."""
        return (self.rss_healthy_kb - self.rss_empty_kb) * 1024 / self.topics

    @property
    def growth_per_read_topic(self) -> float:
        """Bytes of RSS per topic once every topic was read (loaded, idle)."""
        return (self.rss_read_kb - self.rss_empty_kb) * 1024 / self.topics


@dataclass
class ConnectionResult:
    side: str
    connections: int
    rss_kb: int
    quiet_p50_ms: float
    quiet_p99_ms: float
    loaded_p50_ms: float
    loaded_p99_ms: float
    sends: int


def rss_kb(pid: int) -> int:
    """Resident set size of process ``pid`` in KiB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except FileNotFoundError:
        return []


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def percentile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(len(sorted_values) * q))]


class Progress:
    """A line on stderr every ``every`` seconds: done / total and the rate."""

    def __init__(self, what: str, total: int, every: float = 2.0) -> None:
        self.what, self.total, self.every = what, total, every
        self.done = 0
        self.t0 = self.last = time.monotonic()

    def step(self) -> None:
        self.done += 1
        now = time.monotonic()
        if now - self.last >= self.every or self.done == self.total:
            self.last = now
            rate = self.done / max(now - self.t0, 1e-9)
            print(f"  {self.what}: {self.done}/{self.total} ({rate:,.0f}/s)", file=sys.stderr)


async def over_clients(
    url: str, names: list[str], clients: int, work: Callable[[Client, str], Awaitable[None]]
) -> None:
    """``work(client, name)`` for every name, over ``clients`` connections,
    ``IN_FLIGHT`` names at once on each."""
    shares = [names[i::clients] for i in range(clients)]

    async def run(share: list[str]) -> None:
        async with Client(url, operation_timeout=600.0) as client:
            todo = iter(share)

            async def worker() -> None:
                for name in todo:
                    await work(client, name)

            await asyncio.gather(*(worker() for _ in range(IN_FLIGHT)))

    await asyncio.gather(*(run(share) for share in shares if share))


async def set_up_topics(url: str, names: list[str], clients: int) -> None:
    progress = Progress("topics set up", len(names))

    async def one(client: Client, name: str) -> None:
        producer = await client.create_producer(name, "p")
        consumer = await client.subscribe(
            name, SUBSCRIPTION, initial_position="earliest", receiver_queue_size=10
        )
        await producer.send(name.encode())
        message = await consumer.receive()
        if message.value != name.encode():
            raise SystemExit(f"{name}: received {message.value!r}")
        await producer.close()
        await consumer.close()  # (unacknowledged: redelivered after the restart)
        progress.step()

    await over_clients(url, names, clients, one)


async def read_again(url: str, names: list[str], clients: int) -> None:
    progress = Progress("topics read again", len(names))

    async def one(client: Client, name: str) -> None:
        consumer = await client.subscribe(name, SUBSCRIPTION, receiver_queue_size=10)
        message = await consumer.receive()
        if message.value != name.encode():
            raise SystemExit(f"{name}: read {message.value!r} again, not its own message")
        await consumer.acknowledge(message)
        await consumer.close()
        progress.step()

    await over_clients(url, names, clients, one)


def run_topics(
    side: str, n: int, work: Path, clients: int, root: str | None, start_timeout: float
) -> TopicResult:
    data = work / f"topics-{n}-{side}"
    log = str(work / f"topics-{n}-{side}.log")
    names = [f"t{i}" for i in range(n)]
    broker = BrokerProcess(str(data), port=None, root=root, log=log)
    try:
        time.sleep(0.5)  # (settled)
        rss_empty = rss_kb(broker.proc.pid)
        print(f"{n} topics: setting up ({clients} connections) ...", file=sys.stderr)
        t0 = time.monotonic()
        asyncio.run(set_up_topics(broker.url, names, clients))
        setup_s = time.monotonic() - t0
        rss_before = rss_kb(broker.proc.pid)
        writer_rss = sum(rss_kb(c) for c in children(broker.proc.pid))
        data_bytes = dir_bytes(data)
    finally:
        broker.proc.send_signal(signal.SIGKILL)
        broker.proc.wait()
    print(f"{n} topics: killed; restarting ...", file=sys.stderr)
    t0 = time.monotonic()
    healthy_s = read_s = None
    rss_healthy = rss_read = 0
    try:
        broker = BrokerProcess(
            str(data), port=broker.port, root=root, log=log, timeout=start_timeout
        )
    except RuntimeError:
        print(f"{n} topics: no answer within {start_timeout:.0f} s", file=sys.stderr)
    else:
        try:
            healthy_s = broker.started_in
            rss_healthy = rss_kb(broker.proc.pid)
            print(
                f"{n} topics: healthy after {healthy_s:.2f} s; reading again ...", file=sys.stderr
            )
            asyncio.run(read_again(broker.url, names, clients))
            read_s = time.monotonic() - t0
            rss_read = rss_kb(broker.proc.pid)
        finally:
            broker.stop()
    shutil.rmtree(data, ignore_errors=True)
    return TopicResult(
        side,
        n,
        setup_s,
        healthy_s,
        read_s,
        rss_empty,
        rss_before,
        rss_healthy,
        rss_read,
        writer_rss,
        data_bytes,
    )


async def measure_connections(
    url: str, n: int, quiet_sends: int, rounds: int
) -> tuple[list[float], list[float]]:
    opened = Progress("connections open", n)
    clients: list[Client] = []
    pairs = []
    readers: list[asyncio.Task[None]] = []

    async def reader(consumer) -> None:  # type: ignore[no-untyped-def]
        while True:
            await consumer.acknowledge(await consumer.receive())

    async def connect(i: int) -> None:
        client = Client(url, operation_timeout=600.0)
        clients.append(client)
        producer = await client.create_producer(f"c{i}")
        consumer = await client.subscribe(f"c{i}", SUBSCRIPTION, receiver_queue_size=10)
        pairs.append(producer)
        readers.append(asyncio.create_task(reader(consumer)))
        opened.step()

    sem = asyncio.Semaphore(IN_FLIGHT)

    async def bounded(i: int) -> None:
        async with sem:
            await connect(i)

    try:
        await asyncio.gather(*(bounded(i) for i in range(n)))
        loop = asyncio.get_running_loop()

        async def timed_sends(producer, count: int, out: list[float]) -> None:  # type: ignore[no-untyped-def]
            for _ in range(count):
                t0 = loop.time()
                await producer.send(b"x" * 100)
                out.append(loop.time() - t0)

        print(f"{n} connections: quiet round trips ...", file=sys.stderr)
        quiet: list[float] = []
        await timed_sends(pairs[0], quiet_sends, quiet)
        print(f"{n} connections: loaded round trips ...", file=sys.stderr)
        loaded: list[float] = []
        await asyncio.gather(*(timed_sends(p, rounds, loaded) for p in pairs))
    finally:
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    return sorted(quiet), sorted(loaded)


def run_connections(
    side: str, n: int, work: Path, root: str | None, quiet_sends: int, rounds: int
) -> ConnectionResult:
    data = work / f"connections-{n}-{side}"
    broker = BrokerProcess(str(data), root=root, log=str(work / f"connections-{n}-{side}.log"))
    try:
        holder: list[int] = []

        async def run() -> tuple[list[float], list[float]]:
            task = asyncio.ensure_future(measure_connections(broker.url, n, quiet_sends, rounds))
            # RSS with every connection open: sampled while the sends run.
            while not task.done():
                holder.append(rss_kb(broker.proc.pid))
                await asyncio.sleep(0.2)
            return await task

        quiet, loaded = asyncio.run(run())
    finally:
        broker.stop()
    shutil.rmtree(data, ignore_errors=True)
    ms = 1000.0
    return ConnectionResult(
        side=side,
        connections=n,
        rss_kb=max(holder, default=0),
        quiet_p50_ms=statistics.median(quiet) * ms,
        quiet_p99_ms=percentile(quiet, 0.99) * ms,
        loaded_p50_ms=statistics.median(loaded) * ms,
        loaded_p99_ms=percentile(loaded, 0.99) * ms,
        sends=len(loaded),
    )


def raise_nofile() -> tuple[int, int]:
    """Raise the soft open-file limit to the hard one (the broker, started
    from here, inherits it); returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _git(where: str, *args: str) -> str:
    run = subprocess.run(["git", "-C", where, *args], capture_output=True, text=True, check=True)
    return run.stdout.strip()


def code_under_test(root: str | None) -> str:
    where = root or str(ROOT)
    try:
        head = _git(where, "log", "-1", "--format=%h (%<(60,trunc)%s")
        dirty = _git(where, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return where
    return f"{where} at {head.rstrip()}){' with uncommitted changes' if dirty else ''}"


def uname() -> str:
    try:
        return subprocess.run(["uname", "-a"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return " ".join(os.uname())


def mib(kb: int) -> str:
    return f"{kb / 1024:,.1f}"


def topic_table(results: Iterable[TopicResult]) -> list[str]:
    lines = [
        "| broker | topics | setup s | restart to healthy s | all read again s "
        "| RSS empty MiB | RSS before kill MiB | RSS healthy MiB | RSS after reads MiB "
        "| RSS growth/topic B | RSS growth/topic read B | writer RSS MiB | data/topic B |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.healthy_s is None:
            restarted = ["no answer", "-", "-", "-", "-", "-"]
        else:
            read = "-" if r.read_s is None else f"{r.read_s:.2f}"
            per_read = "-" if r.read_s is None else f"{r.growth_per_read_topic:,.0f}"
            restarted = [f"{r.healthy_s:.2f}", read, mib(r.rss_healthy_kb), mib(r.rss_read_kb),
                         f"{r.growth_per_topic:,.0f}", per_read]  # fmt: skip
        cells = [r.side, f"{r.topics:,}", f"{r.setup_s:.1f}", *restarted[:2],
                 mib(r.rss_empty_kb), mib(r.rss_before_kb), *restarted[2:],
                 mib(r.writer_rss_kb) if r.writer_rss_kb else "-",
                 f"{r.data_bytes / r.topics:,.0f}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def connection_table(results: Iterable[ConnectionResult]) -> list[str]:
    lines = [
        "| broker | connections | broker RSS MiB | quiet p50 ms | quiet p99 ms "
        "| loaded p50 ms | loaded p99 ms | loaded sends |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        cells = [r.side, f"{r.connections:,}", mib(r.rss_kb), f"{r.quiet_p50_ms:.2f}",
                 f"{r.quiet_p99_ms:.2f}", f"{r.loaded_p50_ms:.2f}", f"{r.loaded_p99_ms:.2f}",
                 f"{r.sends:,}"]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def counts(text: str) -> list[int]:
    try:
        values = [int(part.replace("_", "")) for part in text.split(",") if part]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a list of counts: {text!r} (e.g. 1000,10000)"
        ) from None
    if any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"counts must be positive: {text!r}")
    return values


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=counts, default=[], help="topic counts, e.g. 1000,10000")
    parser.add_argument("--connections", type=counts, default=[], help="e.g. 100,1000,2000")
    parser.add_argument("--clients", type=int, default=4, help="connections that set topics up")
    parser.add_argument("--rounds", type=int, default=5, help="loaded sends per connection")
    parser.add_argument("--quiet-sends", type=int, default=200)
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=1800.0,
        help="seconds a restart may take before the run gives up",
    )
    parser.add_argument("--baseline", help="also run a broker from this checkout's code")
    parser.add_argument("--results", default=str(RESULTS), help="append the figures here")
    parser.add_argument("--work-dir", help="where the data directories go (a temporary one)")
    args = parser.parse_args(argv)
    if not args.topics and not args.connections:
        parser.error("give --topics and/or --connections")
    sides: dict[str, str | None] = {"this": None}
    if args.baseline:
        sides["baseline"] = str(Path(args.baseline).resolve())
    soft, hard = raise_nofile()
    print(f"open files limit: {soft} (hard {hard})", file=sys.stderr)
    load = "/".join(f"{x:.2f}" for x in os.getloadavg())

    topic_results: list[TopicResult] = []
    conn_results: list[ConnectionResult] = []
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        work = Path(tmp)
        for n in args.topics:
            for side, root in sides.items():
                print(f"-- {side}", file=sys.stderr)
                topic_results.append(
                    run_topics(side, n, work, args.clients, root, args.start_timeout)
                )
                print("\n".join(topic_table(topic_results[-1:])), file=sys.stderr)
        for n in args.connections:
            for side, root in sides.items():
                print(f"-- {side}", file=sys.stderr)
                conn_results.append(
                    run_connections(side, n, work, root, args.quiet_sends, args.rounds)
                )
                print("\n".join(connection_table(conn_results[-1:])), file=sys.stderr)

    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## {now}: {' '.join(['python -m bench.scale', *(argv or sys.argv[1:])])}",
        "",
        f"- machine: `{uname()}`, nproc {len(os.sched_getaffinity(0))} "
        "(the client runs on the same machine)",
        *(f"- broker code, {side}: {code_under_test(root)}" for side, root in sides.items()),
        f"- open files limit: {soft} (hard {hard}); load average at the start {load} (1/5/15 min)",
        "",
    ]
    if topic_results:
        lines += [*topic_table(topic_results), ""]
    if conn_results:
        lines += [*connection_table(conn_results), ""]
    print()
    print("\n".join(lines))
    results = Path(args.results)
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a") as f:
        f.write("\n".join(lines) + "\n")
    print(f"appended to {results}", file=sys.stderr)


if __name__ == "__main__":
    main()
