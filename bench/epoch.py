"""The producer-epoch mode beside the PIP-31 API, doing the same work in one run.

    python -m bench.epoch [--messages 100000] [--per-txn 100] [--rounds 3]
                          [--workers 1 4] [--size 100] [--write-txns 200]
                          [--results bench/results/epoch.md]

Two workloads, each done through both APIs, with each of ``--workers``
workers (asyncio tasks of this process, one client, each worker with a
producer of its own, and in the producer-epoch mode a transactional id of
its own):

1. transactional produce: ``--messages`` messages of ``--size`` bytes to one
   topic, in transactions of ``--per-txn``; the transactions are dealt
   out to the workers in turn, and each worker commits its own back to back.
   ``PIP-31``: `bench.txn.send_in_transactions` (new_transaction, the sends
   queued, commit), one per worker. ``epoch``: ``create_transactional_producer``
   and ``init_transactions`` first, then per transaction
   ``begin_transaction``, ``send`` x ``--per-txn`` (queued: ``send`` returns
   a future), ``commit_transaction``. ``epoch 2PC``: the same with
   ``enable_2pc``, ending each transaction with ``prepare_transaction`` and
   ``complete_transaction`` of the state it returned. After the run the
   topic's stats must count ``--messages`` committed messages.
2. consume-transform-produce: the input topic is loaded with ``--messages``
   numbered inputs (`bench.ctp`'s, not timed); the workers share a
   subscription of it and copy each input, transformed, to an output topic,
   ``--per-txn`` per transaction. ``PIP-31``: `bench.ctp.fastest_loop`
   (bench.txn's: `bench.txn.take`, then `bench.ctp.copy_in_one_txn`).
   ``epoch``: take a batch the same way, ``begin_transaction``, ``send``
   each transformed, ``send_offsets_to_transaction(consumer, batch)``,
   ``commit_transaction``. Afterwards the output is read back and checked:
   each input transformed exactly once, none left unacknowledged
   (`bench.ctp.check_output`); a run that fails the check stops the benchmark.

Every run is on a broker process of its own (fresh data directory,
``txnbuf serve --allow-2pc`` for every run alike); a round runs each
(workload, API, workers) once, the order rotated (and reversed every other
round), so that each API runs before and after the other. Timed: the
workload alone (producers created and initialized before). Printed for
each: msgs/s of each round, the median and the spread (lowest-highest),
CPU microseconds per message of this process (the client), the broker
process without its ledger writer and the writer (medians); the ratio epoch / PIP-31
of the medians per workload and worker count, with each round's, against
the target of 0.9 (2PC's ratio too, whose target is the durable writes).

Durable writes per transaction: in each round one more broker runs
``--write-txns`` transactions of ``--per-txn`` messages one after another
(one worker, so no group commit holds two transactions) with each of
PIP-31, epoch and epoch 2PC (after a few to warm up), reading
``txnbuf_ledger_commits_total`` (group commits: one fsync each) and
``txnbuf_ledger_appends_total`` from ``/metrics`` before and after;
printed per transaction, with whether prepare + complete costs at most one
group commit more than a plain commit.

The report is printed and appended to ``--results`` (with the date, ``uname
-a``, the number of cores, Python's version, the checkout and the load
average). The machine is shared and noisy: compare only figures of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench._progress import Runs
from bench.ctp import (
    DIGITS,
    GROUP,
    IDLE,
    IN,
    OUT,
    OutputError,
    Step,
    Txnbuf,
    _loop_factory,
    check_output,
    fastest_loop,
    machine,
    transform,
)
from bench.txn import send_in_transactions, take
from client import Client, Consumer, Producer, TransactionalProducer, errors

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "epoch.md"
APIS = {"pip31": "PIP-31", "epoch": "epoch", "2pc": "epoch 2PC"}
WORKLOADS = {"produce": "transactional produce", "ctp": "consume-transform-produce"}
TARGET = 0.9  # the epoch mode's figures at least this share of PIP-31's
SERVE_OPTIONS = ("--allow-2pc",)
WARM_UP_TXNS = 5  # transactions before the durable writes are counted
TOPIC = "produce"


@dataclass(frozen=True, slots=True)
class Variant:
    workload: str  # "produce" / "ctp"
    api: str  # "pip31" / "epoch" / "2pc"
    workers: int

    @property
    def label(self) -> str:
        unit = "worker" if self.workers == 1 else "workers"
        return f"{WORKLOADS[self.workload]}, {APIS[self.api]}, {self.workers} {unit}"


@dataclass(frozen=True, slots=True)
class Run:
    """One run's msgs/s and CPU microseconds per message."""

    rate: float
    client: float
    broker: float
    writer: float


@dataclass(frozen=True, slots=True)
class Writes:
    """Group commits and appends of the ledger per transaction."""

    commits: float
    appends: float


def plan(workers: list[int]) -> list[Variant]:
    variants = []
    for n in workers:
        variants += [Variant("produce", api, n) for api in ("pip31", "epoch", "2pc")]
        variants += [Variant("ctp", api, n) for api in ("pip31", "epoch")]
    return variants


def round_order(items: list[Variant], r: int, rounds: int) -> list[Variant]:
    """Round ``r``'s order: rotated by a share of the list per round, and
    reversed every other round."""
    shift = r * len(items) // rounds
    order = items[shift:] + items[:shift]
    return order[::-1] if r % 2 else order


def deal(total: int, per_txn: int, workers: int) -> list[list[int]]:
    """The sizes of the transactions each worker commits: ``total`` messages
    in transactions of ``per_txn``, dealt out in turn."""
    sizes = [min(per_txn, total - s) for s in range(0, total, per_txn)]
    return [sizes[w::workers] for w in range(workers)]


# --- the workers ------------------------------------------------------------------------


async def epoch_producer(client: Client, name: str, two_phase: bool) -> TransactionalProducer:
    p = await client.create_transactional_producer(name, enable_2pc=two_phase)
    await p.init_transactions()
    return p


async def epoch_transactions(
    p: TransactionalProducer, topic: str, payload: bytes, sizes: list[int]
) -> None:
    """Commit a transaction of ``n`` sends for each ``n`` of ``sizes``, one
    after another (with 2PC: prepare, then complete)."""
    for n in sizes:
        await p.begin_transaction()
        for _ in range(n):
            await p.send(topic, payload)
        if p.enable_2pc:
            await p.complete_transaction(await p.prepare_transaction())
        else:
            await p.commit_transaction()


async def pip31_transactions(
    client: Client, producer: Producer, payload: bytes, sizes: list[int]
) -> None:
    """`bench.txn.send_in_transactions` of one worker: its transactions one
    after another."""
    if sizes:
        await send_in_transactions(client, producer, payload, sum(sizes), sizes[0], 1)


async def producers_for(
    client: Client, variant: Variant, topic: str, tag: str
) -> list[Callable[[bytes, list[int]], Awaitable[None]]]:
    """Each worker's way to commit transactions of the given sizes (its
    producer created, and initialized, now)."""
    plain = await client.create_producer(topic)  # (creates the topic before the clock runs)
    workers: list[Callable[[bytes, list[int]], Awaitable[None]]] = []
    for w in range(variant.workers):
        if variant.api == "pip31":
            producer = plain if w == 0 else await client.create_producer(topic)
            workers.append(functools.partial(pip31_transactions, client, producer))
        else:
            p = await epoch_producer(client, f"{tag}-{w}", variant.api == "2pc")
            workers.append(functools.partial(epoch_transactions, p, topic))
    return workers


def epoch_loop(p: TransactionalProducer, consumer: Consumer, per_txn: int) -> Step:
    """Consume-transform-produce in the producer-epoch mode: a batch taken as
    `bench.ctp.fastest_loop` takes it, its outputs queued, its inputs
    acknowledged with send_offsets_to_transaction, commit."""

    async def step() -> int:
        try:
            batch = await take(consumer, per_txn, wait=IDLE)
        except errors.OperationTimeoutError:
            return 0
        await p.begin_transaction()
        for m in batch:
            await p.send(OUT, transform(m.value))
        await p.send_offsets_to_transaction(consumer, batch)
        await p.commit_transaction()
        return len(batch)

    return step


async def drain(steps: list[Step], total: int) -> float:
    """Run every step (a worker's transaction) over and over until ``total``
    inputs are copied; when the last was (perf_counter)."""
    done, end = 0, 0.0

    async def worker(step: Step) -> None:
        nonlocal done, end
        while done < total:
            copied = await step()
            if copied:
                done += copied
                if done >= total and not end:
                    end = time.perf_counter()
            else:  # (nothing to take: the rest is in other workers' transactions)
                await asyncio.sleep(0.001)

    await asyncio.gather(*(worker(s) for s in steps))
    return end


# --- one run ------------------------------------------------------------------------------


class Server(Txnbuf):
    """A broker process of its own (`bench.ctp`'s), two-phase commit allowed."""

    def __init__(self, tmp: str) -> None:
        super().__init__(tmp, SERVE_OPTIONS)

    async def metric(self, *names: str) -> list[float]:
        """The values of these unlabelled metrics on ``/metrics``."""
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{self.address}/metrics") as reply:
                text = await reply.text()
        values = dict(line.split(" ", 1) for line in text.splitlines() if line[:1] != "#")
        return [float(values[name]) for name in names]

    def committed(self, topic: str) -> int:
        """Messages committed to ``topic`` (its stats)."""
        with urllib.request.urlopen(f"{self.address}/admin/v1/topics/{topic}/stats") as reply:
            stats = json.load(reply)
        return sum(int(p["messages"]) for p in stats["partitions"])


async def timed(server: Server, work: Callable[[], Awaitable[float | None]]) -> tuple[float, ...]:
    """Run ``work``; its seconds (until the time it returns, else until it
    ends) and the CPU seconds of this process, the broker and its writer."""
    broker0, writer0 = server.cpu()
    client0, start = time.process_time(), time.perf_counter()
    end = await work() or time.perf_counter()
    client1 = time.process_time()
    broker1, writer1 = server.cpu()
    assert writer0 is not None and writer1 is not None
    return end - start, client1 - client0, broker1 - broker0, writer1 - writer0


async def produce_run(server: Server, variant: Variant, args: argparse.Namespace) -> Run:
    payload = os.urandom(args.size)
    async with Client(server.address) as client:
        workers = await producers_for(client, variant, TOPIC, "produce")
        shares = deal(args.messages, args.per_txn, variant.workers)

        async def work() -> None:
            await asyncio.gather(*(w(payload, s) for w, s in zip(workers, shares, strict=True)))

        seconds, *cpu = await timed(server, work)
    if (committed := server.committed(TOPIC)) != args.messages:
        raise SystemExit(f"{variant.label}: {committed:,} messages committed, not "
                         f"{args.messages:,}")  # fmt: skip
    return make_run(args.messages, seconds, cpu)


async def ctp_run(server: Server, variant: Variant, args: argparse.Namespace) -> Run:
    await server.load(args.messages, args.size, args.per_txn)
    async with Client(server.address) as client:
        steps = []
        for w in range(variant.workers):
            consumer = await client.subscribe(IN, GROUP, "shared", initial_position="earliest",
                                              receiver_queue_size=2 * args.per_txn)  # fmt: skip
            if variant.api == "pip31":
                producer = await client.create_producer(OUT)
                steps.append(fastest_loop(client, consumer, producer, args.per_txn))
            else:
                p = await epoch_producer(client, f"ctp-{w}", False)
                steps.append(epoch_loop(p, consumer, args.per_txn))
        seconds, *cpu = await timed(server, lambda: drain(steps, args.messages))
    try:
        check_output(await server.outputs(), args.messages, args.size)
    except OutputError as e:
        raise SystemExit(f"{variant.label}: the output check failed: {e}") from None
    return make_run(args.messages, seconds, cpu)


def make_run(messages: int, seconds: float, cpu: list[float]) -> Run:
    per = 1e6 / messages
    return Run(messages / seconds, cpu[0] * per, cpu[1] * per, cpu[2] * per)


async def count_writes(server: Server, api: str, args: argparse.Namespace) -> Writes:
    """Group commits and appends per transaction of ``--write-txns``
    transactions one after another (after `WARM_UP_TXNS`)."""
    payload = os.urandom(args.size)
    topic = f"writes-{api}"
    async with Client(server.address) as client:
        [worker] = await producers_for(client, Variant("produce", api, 1), topic, topic)
        await worker(payload, [args.per_txn] * WARM_UP_TXNS)
        names = ("txnbuf_ledger_commits_total", "txnbuf_ledger_appends_total")
        commits0, appends0 = await server.metric(*names)
        await worker(payload, [args.per_txn] * args.write_txns)
        commits1, appends1 = await server.metric(*names)
    n = args.write_txns
    return Writes((commits1 - commits0) / n, (appends1 - appends0) / n)


def one_run(variant: Variant, args: argparse.Namespace, tmp: str, runner: asyncio.Runner) -> Run:
    server = Server(tmp)
    try:
        work = produce_run if variant.workload == "produce" else ctp_run
        return runner.run(work(server, variant, args))
    finally:
        server.stop()


def writes_run(
    args: argparse.Namespace, tmp: str, runner: asyncio.Runner, r: int
) -> dict[str, Writes]:
    """One broker; each API's writes per transaction, the order rotated by round."""
    apis = list(APIS)
    apis = apis[r % 3 :] + apis[: r % 3]
    server = Server(tmp)
    try:
        return {api: runner.run(count_writes(server, api, args)) for api in apis}
    finally:
        server.stop()


# --- the report ---------------------------------------------------------------------------


def spread(values: list[float], fmt: str = ",.0f") -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def report(
    args: argparse.Namespace,
    variants: list[Variant],
    runs: dict[Variant, list[Run]],
    writes: list[dict[str, Writes]],
    header: str,
) -> str:
    rounds = args.rounds
    lines = [
        f"producer-epoch mode vs PIP-31: {args.messages:,} messages of {args.size} B, "
        f"{args.per_txn} per transaction, workers {', '.join(map(str, args.workers))} "
        f"(asyncio tasks of one client); {rounds} round(s), each runs every row once on a "
        f"fresh broker (txnbuf serve {' '.join(SERVE_OPTIONS)}), in rotation",
        "",
        f"- {header}",
        "",
        "| | " + " | ".join(f"round {r + 1}" for r in range(rounds))
        + " | median msgs/s | spread | client | broker | writer |",
        "|---|" + "---:|" * rounds + "---:|---:|---:|---:|---:|",
    ]  # fmt: skip
    median = {v: statistics.median(run.rate for run in runs[v]) for v in variants}
    for v in variants:
        each = " | ".join(f"{run.rate:,.0f}" for run in runs[v])
        cpu = " | ".join(
            f"{statistics.median(getattr(run, c) for run in runs[v]):.2f}"
            for c in ("client", "broker", "writer")
        )
        rates = [run.rate for run in runs[v]]
        lines.append(f"| {v.label} | {each} | {median[v]:,.0f} | {spread(rates)} | {cpu} |")
    lines += [
        "",
        "CPU µs per message (medians): client = this process (every worker); broker = the "
        "broker process without its ledger writer; writer = the ledger writer thread.",
        f"Every consume-transform-produce run's output was checked: {args.messages:,} outputs, "
        "each input transformed exactly once, none left unacknowledged; every produce run "
        f"committed {args.messages:,} messages.",
        "",
        f"Ratio to PIP-31 (target of the epoch mode: at least {TARGET}):",
        "",
    ]
    for v in variants:
        if v.api == "pip31":
            continue
        base = Variant(v.workload, "pip31", v.workers)
        ratio = median[v] / median[base]
        each = ", ".join(f"{a.rate / b.rate:.2f}" for a, b in zip(runs[v], runs[base], strict=True))
        if v.api == "2pc":  # (its target is the durable writes, below)
            verdict = "two-phase commit: one group commit more, see below"
        else:
            verdict = "meets the target" if ratio >= TARGET else "below the target"
        lines.append(f"- {v.label}: {ratio:.2f} (each round: {each}); {verdict}")
    lines += [
        "",
        f"Durable writes per transaction: {args.write_txns} transactions of {args.per_txn} "
        f"messages one after another (1 worker; after {WARM_UP_TXNS} to warm up), one broker per "
        "round; group commits (fsyncs) and appends of the ledger from /metrics:",
        "",
        "| | " + " | ".join(f"round {r + 1}" for r in range(len(writes)))
        + " | median commits/txn | median appends/txn |",
        "|---|" + "---:|" * len(writes) + "---:|---:|",
    ]  # fmt: skip
    med: dict[str, Writes] = {}
    for api in APIS:
        each = " | ".join(f"{w[api].commits:.2f} / {w[api].appends:.2f}" for w in writes)
        med[api] = Writes(
            statistics.median(w[api].commits for w in writes),
            statistics.median(w[api].appends for w in writes),
        )
        lines.append(f"| {APIS[api]} | {each} | {med[api].commits:.2f} | {med[api].appends:.2f} |")
    extra = med["2pc"].commits - med["epoch"].commits
    verdict = "at most one more: meets the target" if extra <= 1.0 else "more than one more"
    lines += [
        "",
        "(each round: commits / appends per transaction)",
        f"2PC (prepare + complete) costs {extra:+.2f} group commits per transaction beside a "
        f"plain epoch commit ({med['2pc'].commits:.2f} vs {med['epoch'].commits:.2f}): "
        f"{verdict}; PIP-31: {med['pip31'].commits:.2f}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--write-txns", type=int, default=200,
                        help="transactions counted for the durable writes")  # fmt: skip
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the file a section of results is appended to")  # fmt: skip
    args = parser.parse_args()
    if min(args.messages, args.per_txn, args.rounds, args.write_txns, *args.workers) < 1:
        parser.error("--messages, --per-txn, --rounds, --write-txns and --workers must be above 0")
    if args.size < DIGITS:
        parser.error(f"--size must be at least {DIGITS} (an input starts with its number)")

    variants = plan(args.workers)
    runs: dict[Variant, list[Run]] = {v: [] for v in variants}
    writes: list[dict[str, Writes]] = []
    load0 = os.getloadavg()
    header = machine()
    with (
        tempfile.TemporaryDirectory() as tmp,
        asyncio.Runner(loop_factory=_loop_factory()) as runner,
    ):
        with Runs(args.rounds * (len(variants) + 1), "epoch") as progress:
            for r in range(args.rounds):
                for v in round_order(variants, r, args.rounds):
                    progress.start(f"round {r + 1}/{args.rounds}: {v.label}")
                    run = one_run(v, args, tmp, runner)
                    checked = ", output checked" if v.workload == "ctp" else ""
                    progress.done(f"{run.rate:,.0f} msgs/s{checked}")
                    runs[v].append(run)
                progress.start(f"round {r + 1}/{args.rounds}: durable writes per transaction")
                writes.append(writes_run(args, tmp, runner, r))
                progress.done(
                    ", ".join(f"{APIS[api]} {w.commits:.2f}" for api, w in writes[-1].items())
                    + " group commits per transaction"
                )
    load1 = os.getloadavg()
    header += (f"; load average {load0[0]:.1f} at the start, {load1[0]:.1f} at the end "
               f"(a machine shared with other work)")  # fmt: skip
    text = report(args, variants, runs, writes, header)
    print()
    print(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as results:
        results.write(f"\n## {header.split(';')[0]}\n\n{text}\n")


if __name__ == "__main__":
    main()
