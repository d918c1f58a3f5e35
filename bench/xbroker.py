"""A transaction across a cluster's brokers against a local one, in one run.

Three `txnbuf serve --store URL --cluster` processes over a private
PostgreSQL server. The README's consume-transform-produce loop (one client
process, one transaction at a time: receive up to ``--per-txn`` messages,
send a copy of each and acknowledge it in the transaction, commit), in two
placements, interleaved round by round:

- *local*: the coordinator, the input topic and the output topic in one
  slot of one broker (the one-frame commit, COMMIT_TXN);
- *across*: the coordinator on broker a, the input on b, the output on c
  (each broker's first send or ack checked with the coordinator, answered
  once durable; END_TXN once all are answered; the coordinator tells b and
  c over the wire).

Prints per round and the medians: messages copied per second, and the
latency of a transaction (from asking for it to its commit returning),
p50 and p99. Every round's output is checked (each input once).
``bench/results/xbroker.md`` keeps the figures with the date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench._brokers import cluster_brokers, owners, spread, topic_in, wait_until
from bench._postgres import private_postgres
from bench._results import recorded
from client import Client


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def copy_round(
    home: str, anchor: str, into: str, out: str, messages: int, per_txn: int
) -> tuple[float, list[float]]:
    """Produce ``messages`` to ``into``, copy them to ``out`` in transactions
    coordinated near ``anchor``; (msgs/s, per-transaction seconds)."""
    async with Client(home, operation_timeout=60.0) as client:
        source = await client.create_producer(into)
        consumer = await client.subscribe(into, "copy", initial_position="earliest")
        producer = await client.create_producer(out)
        check = await client.subscribe(out, "check", initial_position="earliest")
        await asyncio.gather(*(source.send(b"m%06d" % i) for i in range(messages)))
        latencies: list[float] = []
        copied = 0
        t0 = time.perf_counter()
        while copied < messages:
            started = time.perf_counter()
            txn = await client.new_transaction(near=anchor)
            for _ in range(min(per_txn, messages - copied)):
                message = await consumer.receive(timeout=60)
                await producer.send(message.value, txn=txn)
                await consumer.acknowledge(message, txn=txn)
                copied += 1
            await txn.commit()
            latencies.append(time.perf_counter() - started)
        rate = messages / (time.perf_counter() - t0)
        seen = set()
        for _ in range(messages):
            message = await check.receive(timeout=60)
            seen.add(message.value)
            await check.acknowledge(message)
        if seen != {b"m%06d" % i for i in range(messages)}:
            raise RuntimeError("the copy lost or changed messages")
        return rate, latencies


async def run(url: str, folder: Path, rounds: int, messages: int, per_txn: int) -> None:
    brokers = cluster_brokers(folder, url)
    try:
        await wait_until(lambda: spread(url, brokers))
        found = await owners(url)
        mine = {b.owner: sorted(s for s, o in found.items() if o == b.owner) for b in brokers}
        a, b, c = (mine[x.owner][0] for x in brokers)
        home = brokers[0].url
        figures: dict[str, list[tuple[float, list[float]]]] = {"local": [], "across": []}
        for r in range(rounds):
            for name in ("local", "across"):
                tag = f"{name[0]}{r}"
                anchor = topic_in(a, f"anchor{tag}-")
                if name == "local":
                    into, out = topic_in(a, f"in{tag}-"), topic_in(a, f"out{tag}-")
                else:
                    into, out = topic_in(b, f"in{tag}-"), topic_in(c, f"out{tag}-")
                rate, lat = await copy_round(home, anchor, into, out, messages, per_txn)
                figures[name].append((rate, lat))
                print(
                    f"round {r + 1} {name}: {rate:,.0f} msgs/s, transaction p50 "
                    f"{_pct(lat, 0.5) * 1000:.1f} ms p99 {_pct(lat, 0.99) * 1000:.1f} ms",
                    flush=True,
                )
        print()
        print(f"| placement | msgs/s (median of {rounds}) | transaction p50 ms | p99 ms |")
        print("|---|---:|---:|---:|")
        for name, rows in figures.items():
            rate = statistics.median(x[0] for x in rows)
            lat = [v for x in rows for v in x[1]]
            print(
                f"| {name} | {rate:,.0f} | {_pct(lat, 0.5) * 1000:.1f} | "
                f"{_pct(lat, 0.99) * 1000:.1f} |"
            )
        local = statistics.median(x[0] for x in figures["local"])
        across = statistics.median(x[0] for x in figures["across"])
        print(f"\nacross / local rate: {across / local:.2f}")
    finally:
        for broker in brokers:
            broker.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=2000, help="per round and placement")
    parser.add_argument("--per-txn", type=int, default=10, help="messages per transaction")
    parser.add_argument("--results", type=Path, default=None, help="(default bench/results/)")
    args = parser.parse_args()
    command = "python -m bench.xbroker " + " ".join(sys.argv[1:])
    with (
        private_postgres("xbroker-bench-") as server,
        recorded("xbroker", command.strip(), args.results),
        tempfile.TemporaryDirectory() as tmp,
    ):
        print(
            f"3 brokers over PostgreSQL {server.cluster.version}, {args.messages} messages of "
            f"7 B per round and placement, {args.per_txn} per transaction, one client "
            f"process; {os.cpu_count()} cores shared by PostgreSQL, the brokers and "
            "the client"
        )
        asyncio.run(run(server.url(), Path(tmp), args.rounds, args.messages, args.per_txn))


if __name__ == "__main__":
    main()
