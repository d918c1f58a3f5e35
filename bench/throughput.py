"""Produce + consume throughput through the real broker, beside the disk's limit.

    python -m bench.throughput [--messages 200000] [--size 100] [--window 2000]

Starts `txnbuf serve` as a subprocess on a free port with a fresh data
directory, then, for 1 and 4 concurrent producers on one topic (one
partition), sends ``--messages`` messages of ``--size`` bytes while one
exclusive consumer receives them all (acknowledging cumulatively every 500
messages). Each producer keeps up to ``--window`` sends in flight, sent in
chunks of 100. Prints:

- end-to-end msgs/s (first send until the consumer has every message),
- produce-only msgs/s (until the last receipt),
- p50 / p99 send latency (send() called -> receipt; the last send of each
  chunk is timed),
- the raw SQLite rate (WAL, synchronous=FULL, 100-row transactions) measured
  in the same run, and the ratio broker / raw.

The client runs in this process and the broker in its own: on 2 cores each
gets about one. Figures from a noisy VM: compare only within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass

from bench._brokers import BrokerProcess
from bench._progress import Runs, counter, legend
from bench._raw import sqlite_rows_per_second
from bench._results import recorded
from client import Client

CHUNK = 100


@dataclass
class Result:
    producers: int
    messages: int
    e2e_rate: float
    produce_rate: float
    p50_ms: float
    p99_ms: float


async def run_case(
    url: str, topic: str, producers: int, total: int, size: int, window: int
) -> Result:
    payload = os.urandom(size)
    per_producer = total // producers
    total = per_producer * producers
    latencies: list[float] = []
    async with Client(url) as client:
        consumer = await client.subscribe(topic, "bench", initial_position="earliest",
                                          receiver_queue_size=5000)  # fmt: skip
        prods = [await client.create_producer(topic) for _ in range(producers)]

        async def consume() -> float:
            with counter(total, "received") as received:
                for n in range(1, total + 1):
                    msg = await consumer.receive()
                    if n % 500 == 0 or n == total:
                        await consumer.acknowledge_cumulative(msg)
                        received.update(500 if n % 500 == 0 else n % 500)
            return time.perf_counter()

        async def produce(producer) -> None:  # type: ignore[no-untyped-def]
            # Chunks of CHUNK sends; the latency of each chunk's last message
            # is sampled (a callback per message would cost more than a send).
            loop = asyncio.get_running_loop()
            inflight: collections.deque[asyncio.Future[object]] = collections.deque()
            sent = 0
            while sent < per_producer:
                n = min(CHUNK, per_producer - sent)
                t0 = loop.time()
                for _ in range(n - 1):
                    producer.send_nowait(payload)
                last = producer.send_nowait(payload)
                last.add_done_callback(lambda f, t0=t0: latencies.append(loop.time() - t0))
                inflight.append(last)
                sent += n
                if len(inflight) * CHUNK >= window:
                    await inflight.popleft()
            await producer.flush()

        start = time.perf_counter()
        consumer_task = asyncio.create_task(consume())
        await asyncio.gather(*(produce(p) for p in prods))
        produced = time.perf_counter()
        consumed = await consumer_task
    latencies.sort()
    return Result(
        producers=producers,
        messages=total,
        e2e_rate=total / (consumed - start),
        produce_rate=total / (produced - start),
        p50_ms=statistics.median(latencies) * 1000,
        p99_ms=latencies[int(len(latencies) * 0.99)] * 1000,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--window", type=int, default=2000, help="sends in flight per producer")
    parser.add_argument(
        "--url", help="use this running broker (for profiling) instead of a new one"
    )
    parser.add_argument("--producers", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None  # type: ignore[assignment]

    results = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = None if args.url else BrokerProcess(os.path.join(tmp, "data"))
        url = args.url or broker.url  # type: ignore[union-attr]
        tag = os.getpid()
        try:
            with Runs(len(args.producers), "throughput") as runs:
                for producers in args.producers:
                    runs.start(f"{producers} producer(s), {args.messages} x {args.size} B")
                    with asyncio.Runner(loop_factory=loop_factory) as runner:
                        results.append(runner.run(run_case(
                            url, f"bench-{tag}-{producers}", producers, args.messages,
                            args.size, args.window)))  # fmt: skip
                    runs.done(f"{results[-1].e2e_rate:,.0f} msgs/s end to end")
        finally:
            if broker is not None:
                broker.stop()
    print("measuring raw SQLite (WAL, synchronous=FULL, 100 rows/txn) ...", file=sys.stderr)
    raw = sqlite_rows_per_second(100, seconds=3.0, size=args.size)

    print()
    print(f"{'producers':>9} {'messages':>9} {'e2e msgs/s':>11} {'produce msgs/s':>15} "
          f"{'send p50 ms':>12} {'send p99 ms':>12} {'e2e/raw':>8}")  # fmt: skip
    for r in results:
        print(f"{r.producers:>9} {r.messages:>9} {r.e2e_rate:>11,.0f} {r.produce_rate:>15,.0f} "
              f"{r.p50_ms:>12.1f} {r.p99_ms:>12.1f} {r.e2e_rate / raw:>8.2f}")  # fmt: skip
    print(f"raw SQLite WAL synchronous=FULL, 100 rows/txn: {raw:,.0f} rows/s")
    legend(
        "e2e msgs/s: from the first send until the consumer holds every message",
        "produce msgs/s: from the first send until the last receipt",
        "send p50/p99 ms: send() called -> its receipt (the last send of each chunk of 100)",
        "e2e/raw: the end-to-end rate over raw SQLite's rows/s (the disk's limit), this run",
    )


if __name__ == "__main__":
    with recorded("throughput", " ".join(["python -m bench.throughput", *sys.argv[1:]])):
        main()
