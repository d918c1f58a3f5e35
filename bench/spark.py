"""The Spark pipeline: a streaming copy with a transform, exactly once, on
``local[2]``, beside Spark's own exactly-once file sink and the broker's
direct consume-transform-produce, in one run.

    python -m bench.spark [--messages 200000] [--batch 10000] [--size 100] [--rounds 2]
                          [--results bench/results/spark.md]

One broker process; ``--messages`` inputs of ``--size`` bytes loaded into
one topic (not timed). Then, in rotation for ``--rounds`` rounds:

- ``txnbuf sink``: ``readStream.format("txnbuf")`` (``maxMessagesPerBatch``
  ``--batch``), ``upper(value)``, ``writeStream.format("txnbuf")`` to
  another topic; Trigger.AvailableNow, so batches of ``--batch`` run back to
  back until the input is read;
- ``parquet sink``: the same job, the same source, writing to Spark's
  file sink (parquet, its own exactly-once commit log) instead;
- ``direct CTP``: the broker's own consume-transform-produce, no Spark
  (`bench.txn.ctp`: one worker, transactions of 100, sends queued, the
  batch acknowledged at once).

Each Spark run has a subscription and a checkpoint of its own, every
subscription made before the input is loaded (retention trims what every
subscription has acknowledged), so each run reads the whole input. Its
figure is the steady state: the batches after the first two (the first
plans, compiles and starts the Python workers),
msgs/s = their rows / their time, and the micro-batch latency p50 / p99
(Spark's ``triggerExecution``: from planning the batch to its commit in
the checkpoint, the sink's commit included). After each run its output is
checked: every input once, upper-cased. Prints the figures and the ratio
of the txnbuf sink to the parquet sink (target: 0.8 or more; a batch of
10,000 committed in under 1 s), and appends them to ``--results``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import os
import platform
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._brokers import BrokerProcess
from bench.txn import ctp
from client import Client, SubscriptionCursor

WARMUP_BATCHES = 2
TOPIC = "bench-in"


@dataclass
class Run:
    """One Spark run's steady-state batches: (rows, ms) each."""

    name: str
    batches: list[tuple[int, int]] = field(default_factory=list)

    @property
    def steady(self) -> list[tuple[int, int]]:
        return self.batches[WARMUP_BATCHES:]

    @property
    def rate(self) -> float:
        rows = sum(r for r, _ in self.steady)
        ms = sum(d for _, d in self.steady)
        return rows * 1000 / ms if ms else 0.0

    def latency(self, q: float) -> float:
        durations = sorted(d for _, d in self.steady)
        if not durations:
            return 0.0
        return float(durations[min(len(durations) - 1, int(q * len(durations)))])


def subscription(run: str) -> str:
    return f"bench-{run}"


def value_of(n: int, size: int) -> bytes:
    return (b"m%09d-" % n).ljust(size, b"x")


async def load(url: str, total: int, size: int, subscriptions: list[str]) -> None:
    """The input, with every run's subscription made first (retention then
    keeps the input until each run has read it)."""
    async with Client(url) as client:
        for name in subscriptions:
            await SubscriptionCursor(client, TOPIC, name, "earliest").positions()
        producer = await client.create_producer(TOPIC)
        for first in range(0, total, 5000):
            await asyncio.gather(
                *(producer.send(value_of(n, size)) for n in range(first, min(total, first + 5000)))
            )


async def read_values(url: str, topic: str) -> list[bytes]:
    async with Client(url) as client:
        reader = await client.create_reader(topic)
        out: list[bytes] = []
        while batch := await reader.read_batch(10_000):
            out.extend(m.value for m in batch)
        return out


def check(values: list[bytes], total: int, size: int, what: str) -> None:
    expected = collections.Counter(value_of(n, size).upper() for n in range(total))
    got = collections.Counter(values)
    if got != expected:
        missing = sum((expected - got).values())
        extra = sum((got - expected).values())
        raise RuntimeError(
            f"{what}: the output is not each input once, upper-cased: {len(values)} outputs, "
            f"{missing} inputs missing, {extra} outputs extra (e.g. {list(got - expected)[:3]})"
        )


def spark_run(
    spark: Any, url: str, sink: str, n: int, batch: int, tmp: Path, total: int, size: int
) -> Run:
    name = f"{sink}-{n}"
    stream = (
        spark.readStream.format("txnbuf")
        .option("service_url", url)
        .option("topic", TOPIC)
        .option("subscription", subscription(name))
        .option("startingOffsets", "earliest")
        .option("maxMessagesPerBatch", str(batch))
        .load()
        .selectExpr("key", "upper(cast(value as string)) as value")
    )
    writer = stream.writeStream.option("checkpointLocation", str(tmp / f"ckpt-{name}"))
    if sink == "txnbuf":
        writer = writer.format("txnbuf").option("service_url", url).option("topic", f"out-{name}")
    else:
        writer = writer.format("parquet").option("path", str(tmp / f"out-{name}"))
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"{name} failed: {query.exception()}")
    run = Run(name)
    for progress in query.recentProgress:
        if progress["numInputRows"]:
            run.batches.append(
                (progress["numInputRows"], progress["durationMs"]["triggerExecution"])
            )
    if sink == "txnbuf":
        values = asyncio.run(read_values(url, f"out-{name}"))
    else:
        parquet = spark.read.parquet(str(tmp / f"out-{name}"))
        values = [r.value.encode() for r in parquet.collect()]
    if sum(r for r, _ in run.batches) != total:
        raise RuntimeError(
            f"{name}: read {sum(r for r, _ in run.batches)} of {total} inputs: {run.batches}"
        )
    check(values, total, size, name)
    return run


def checkout() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def report(args: argparse.Namespace, runs: dict[str, list[Run]], direct: list[float]) -> str:
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"## {now}",
        "",
        f"Spark streaming copy with a transform (upper(value)), exactly once, local[2]: "
        f"{args.messages:,} inputs of {args.size} B, batches of {args.batch:,} "
        f"(Trigger.AvailableNow); {args.rounds} round(s) in rotation; steady state = the "
        f"batches after the first {WARMUP_BATCHES}",
        "",
        f"- {now}; `{' '.join(platform.uname())}`; {os.cpu_count()} cores; load average "
        f"{os.getloadavg()[0]:.1f} at the end; Python {platform.python_version()}; "
        f"txnbuf {checkout()}",
        "",
        "| | rounds (msgs/s) | median msgs/s | batch p50 ms | batch p99 ms |",
        "|---|---|---:|---:|---:|",
    ]
    medians = {}
    for name, label in (("txnbuf", "Spark, txnbuf sink"), ("parquet", "Spark, parquet sink")):
        these = runs[name]
        medians[name] = statistics.median(r.rate for r in these)
        p50 = statistics.median(r.latency(0.5) for r in these)
        p99 = max(r.latency(0.99) for r in these)
        rounds = ", ".join(f"{r.rate:,.0f}" for r in these)
        lines.append(f"| {label} | {rounds} | {medians[name]:,.0f} | {p50:,.0f} | {p99:,.0f} |")
    lines.append(
        f"| direct CTP (bench.txn, 1 worker, 100/txn) | {', '.join(f'{d:,.0f}' for d in direct)} "
        f"| {statistics.median(direct):,.0f} | | |"
    )
    ratio = medians["txnbuf"] / medians["parquet"] if medians["parquet"] else 0.0
    each = ", ".join(
        f"{t.rate / p.rate:.2f}" for t, p in zip(runs["txnbuf"], runs["parquet"], strict=True)
    )
    steady_p50 = statistics.median(r.latency(0.5) for r in runs["txnbuf"])
    lines += [
        "",
        f"txnbuf sink / parquet sink: {ratio:.2f} (each round: {each}); target 0.8.",
        f"A steady batch of {args.batch:,} committed in {steady_p50:,.0f} ms (p50) through "
        "the txnbuf sink; target under 1,000 ms.",
        "Every run's output was checked: each input once, upper-cased.",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--results", default="bench/results/spark.md")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    broker = BrokerProcess(str(tmp / "data"))
    spark = None
    try:
        names = [
            subscription(f"{s}-{n}") for s in ("txnbuf", "parquet") for n in range(args.rounds)
        ]
        asyncio.run(load(broker.url, args.messages, args.size, names))
        from pipelines import spark_session

        spark = spark_session("local[2]", "bench.spark")
        spark.sparkContext.setLogLevel("ERROR")
        runs: dict[str, list[Run]] = {"txnbuf": [], "parquet": []}
        direct: list[float] = []
        for n in range(args.rounds):
            order = ["txnbuf", "parquet", "direct"]
            for what in order[n % 3 :] + order[: n % 3]:
                t0 = time.perf_counter()
                if what == "direct":
                    rate, _, _, _ = asyncio.run(
                        ctp(broker.url, 1, args.messages, 100, args.size, broker.proc.pid)
                    )
                    direct.append(rate)
                    print(f"round {n + 1}: direct CTP {rate:,.0f} msgs/s", flush=True)
                    continue
                run = spark_run(
                    spark, broker.url, what, n, args.batch, tmp, args.messages, args.size
                )
                runs[what].append(run)
                print(
                    f"round {n + 1}: {what} sink {run.rate:,.0f} msgs/s steady, batch p50 "
                    f"{run.latency(0.5):,.0f} ms p99 {run.latency(0.99):,.0f} ms "
                    f"({len(run.batches)} batches, {time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
        text = report(args, runs, direct)
        print(text)
        if args.results:
            with open(args.results, "a") as out:
                out.write("\n" + text)
    finally:
        if spark is not None:
            spark.stop()
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
