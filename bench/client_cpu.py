"""Client and broker CPU per message in the consume-transform-produce loop.

    python -m bench.client_cpu [--messages 100000] [--workers 1 4] [--rounds 1]

The loop of ``bench.txn`` (each worker: receive 100, send 100 in a
transaction, acknowledge the 100 in it, commit), with the CPU time the client
process and the broker process spent while the workers ran (seeding the
input topic not counted): msgs/s, client and broker microseconds of CPU per
message copied.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

from bench.throughput import BrokerProcess
from bench.txn import take
from client import Client, errors

TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) process ``pid`` has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def run(
    url: str, broker_pid: int | None, workers: int, total: int, per_txn: int, size: int
) -> tuple[float, float, float]:
    tag = f"{os.getpid()}-{workers}-{time.monotonic_ns()}"
    src, dst = f"cpu-in-{tag}", f"cpu-out-{tag}"
    payload = os.urandom(size)
    async with Client(url) as client:
        seeder = await client.create_producer(src, batching_max_messages=per_txn)
        for start in range(0, total, 5000):
            futs = [seeder.send_nowait(payload) for _ in range(min(5000, total - start))]
            await asyncio.gather(*futs)
        done = 0

        async def worker() -> None:
            nonlocal done
            consumer = await client.subscribe(
                src, "cpu", "shared", initial_position="earliest", receiver_queue_size=2 * per_txn
            )
            producer = await client.create_producer(dst)
            while done < total:
                try:
                    batch = await take(consumer, per_txn)
                except errors.OperationTimeoutError:
                    continue
                txn = await client.new_transaction(timeout=60)
                for m in batch:
                    producer.send_nowait(m.value, txn=txn)
                await consumer.acknowledge(batch, txn=txn)
                await txn.commit()
                done += len(batch)

        cpu0 = time.process_time()
        broker0 = process_cpu(broker_pid) if broker_pid else 0.0
        start = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        while done < total:  # noqa: ASYNC110 - workers share a counter; polling is simplest
            await asyncio.sleep(0.01)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu0
        broker = process_cpu(broker_pid) - broker0 if broker_pid else 0.0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return done / elapsed, cpu * 1e6 / done, broker * 1e6 / done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=1, help="repeat every case this often")
    args = parser.parse_args()
    try:
        import uvloop

        loop_factory = uvloop.new_event_loop
    except ImportError:
        loop_factory = None  # type: ignore[assignment]

    print(f"{'workers':>7} {'msgs/s':>9} {'client us/msg':>14} {'broker us/msg':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(os.path.join(tmp, "data"))
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                for _ in range(args.rounds):
                    for workers in args.workers:
                        rate, client_us, broker_us = runner.run(
                            run(
                                broker.url,
                                broker.proc.pid,
                                workers,
                                args.messages,
                                args.per_txn,
                                args.size,
                            )
                        )
                        print(
                            f"{workers:>7} {rate:>9,.0f} {client_us:>14.1f} {broker_us:>14.1f}",
                            flush=True,
                        )
        finally:
            broker.stop()
    sys.stdout.flush()


if __name__ == "__main__":
    main()
