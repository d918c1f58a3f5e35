"""Transactions through the real broker: exactly-once consume-transform-produce,
and transactional vs plain produce.

    python -m bench.txn [--messages 100000] [--per-txn 100] [--size 100]
                        [--produce-messages 500000] [--produce-rounds 3] [--inflight 64]

Starts `txnbuf serve` as a subprocess (fresh data directory) and prints, side
by side:

1. consume-transform-produce: 1, 4 and 16 workers (asyncio tasks of one
   client process, each a sequential loop) on a shared subscription of
   a seeded input topic; each transaction takes 100 inputs, sends 100
   outputs and acknowledges the 100 inputs in the transaction, then commits.
   msgs/s (inputs copied per second), p50/p99 commit latency, and the CPU
   the client and the broker (with its ledger writer) spent per
   message copied (seeding the input topic not counted; the broker's only
   when this run started it).
2. produce: ``--produce-messages`` sent three ways, ``--produce-rounds``
   runs of each in rotation (see `produce`): plainly in windows of 2,000
   messages (the next window once the last of one is answered), plainly
   with as many messages in flight as the transactions have, and in
   transactions of 100 (``--inflight`` workers, each committing a
   transaction once its sends are queued, then opening the next: that many
   transactions open at once); the median msgs/s of each, and the ratio of
   transactional to each plain way, with each round's.
   (Until 24 November 2026 the transactional side ran a task per
   transaction behind a semaphore of ``--inflight``: the same load, but the
   tasks and the semaphore cost the client ~18 us of CPU per transaction,
   ~10% of its work, that the plain side's loop does not pay.)

3. ``--split``: where the README loop's CPU goes, fixed per transaction and
   per message: the loop (one worker process, `bench.ctp`'s README loop on
   a fresh broker, every output checked) at ``--split-sizes`` messages per
   transaction (20 to 1,000), ``--split-rounds`` rounds in rotation; per
   process (the worker, the broker, its ledger writer) the median CPU per
   transaction at each size, and a least-squares fit of it as fixed +
   per message x size.
4. ``--small``: transactions of 1 and of 10 messages, the README loop in
   this process against a fresh broker, rounds alternated: msgs/s, commit
   latency p50/p99 (leaving ``async with client.transaction()``: the one
   commit request and its answer) and CPU per message of this process and of
   the broker with its writer.

PostgreSQL and Redis run the same consume-transform-produce beside txnbuf,
in the same run, in `bench.ctp`.
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
from collections.abc import Callable

from bench._brokers import BrokerProcess
from bench._progress import Runs, legend
from bench._results import recorded
from bench.ctp import Variant, copy_in_one_txn, one_run
from bench.txnpath import cpu_seconds
from client import Client, Consumer, Message, MessageId, Producer, errors


def process_cpu(pid: int) -> float:
    """Seconds of CPU process ``pid`` and its children (the ledger's writer
    process) have used so far."""
    return cpu_seconds(pid)


async def take(consumer: Consumer, n: int, wait: float = 10) -> list[Message]:
    """Up to ``n`` messages; the first may take ``wait`` seconds to come
    (then ``OperationTimeoutError``), the rest only 10 ms each."""
    batch = [await consumer.receive(timeout=wait)]
    while len(batch) < n:
        try:
            batch.append(await consumer.receive(timeout=0.01))
        except errors.OperationTimeoutError:
            break
    return batch


async def ctp(
    url: str, workers: int, total: int, per_txn: int, size: int, broker_pid: int | None = None
) -> tuple[float, list[float], float, float | None]:
    """msgs/s, commit latencies, and client and broker CPU microseconds per message."""
    tag = f"{os.getpid()}-{workers}"
    src, dst = f"ctp-in-{tag}", f"ctp-out-{tag}"
    payload = os.urandom(size)
    async with Client(url) as client:
        # Entries of per_txn messages, so a shared subscription spreads them.
        seeder = await client.create_producer(src, batching_max_messages=per_txn)
        for first in range(0, total, 5000):
            futs = [seeder.send_nowait(payload) for _ in range(min(5000, total - first))]
            await asyncio.gather(*futs)
        latencies: list[float] = []
        done = 0

        async def worker() -> None:
            nonlocal done
            consumer = await client.subscribe(
                src, "ctp", "shared", initial_position="earliest", receiver_queue_size=2 * per_txn
            )
            producer = await client.create_producer(dst)
            while done < total:
                try:
                    batch = await take(consumer, per_txn)
                except errors.OperationTimeoutError:
                    continue
                latencies.append(await copy_in_one_txn(client, consumer, producer, batch))
                done += len(batch)

        cpu0 = time.process_time()
        broker0 = process_cpu(broker_pid) if broker_pid else 0.0
        start = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(workers)]
        while done < total:  # (workers share a counter; polling is simplest)
            await asyncio.sleep(0.01)
            for t in tasks:  # (a worker that failed would leave the count short forever)
                if t.done() and (error := t.exception()) is not None:
                    raise RuntimeError("a consume-transform-produce worker failed") from error
        elapsed = time.perf_counter() - start
        client_us = (time.process_time() - cpu0) * 1e6 / done
        broker_us = (process_cpu(broker_pid) - broker0) * 1e6 / done if broker_pid else None
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return done / elapsed, latencies, client_us, broker_us


async def send_pipelined(producer: Producer, payload: bytes, total: int, window: int) -> None:
    """Send ``total`` plain messages, at most ``window`` in flight (a sliding
    window), and wait for the last."""
    in_flight: collections.deque[asyncio.Future[MessageId]] = collections.deque()
    for _ in range(total):
        if len(in_flight) >= window:
            await in_flight.popleft()
        in_flight.append(producer.send_nowait(payload))
    await producer.flush()


async def send_in_transactions(
    client: Client,
    producer: Producer,
    payload: bytes,
    total: int,
    per_txn: int,
    inflight: int,
    full: bool = False,
) -> None:
    """Send ``total`` messages in transactions of ``per_txn``: ``inflight``
    workers, each committing its transactions back to back (``full``: each
    on the full path, `Transaction.flush` before its commit)."""
    sizes = [min(per_txn, total - s) for s in range(0, total, per_txn)]

    async def worker(mine: list[int]) -> None:
        for n in mine:
            txn = await client.new_transaction(timeout=60)
            for _ in range(n):
                producer.send_nowait(payload, txn=txn)
            if full:
                txn.flush()
            await txn.commit()

    await asyncio.gather(*(worker(sizes[w::inflight]) for w in range(inflight)))


async def produce(
    url: str, total: int, per_txn: int, size: int, inflight: int, rounds: int
) -> dict[str, list[float]]:
    """msgs/s of ``rounds`` runs of each way of producing, in rotation (each
    round starts with the next one): this machine's speed drifts within
    seconds, so a single run of each would compare moments as much as ways.

    ``plain``: windows of 2,000 messages, the next once the last of one is
    answered (the baseline of issue 3's target, as it has always been
    measured). ``pipelined``: plain, with as many messages in flight as
    the transactions have (``inflight`` x ``per_txn``), a sliding window:
    the like-for-like baseline. ``txn``: ``inflight`` workers, each
    committing transactions of ``per_txn`` back to back."""
    payload = os.urandom(size)
    async with Client(url) as client:
        plain = await client.create_producer(f"plain-{os.getpid()}")
        txnal: Producer = await client.create_producer(f"txn-{os.getpid()}")

        async def plain_run() -> float:
            start = time.perf_counter()
            for s in range(0, total, 2000):
                futs = [plain.send_nowait(payload) for _ in range(min(2000, total - s))]
                await futs[-1]
            await plain.flush()
            return total / (time.perf_counter() - start)

        async def pipelined_run() -> float:
            start = time.perf_counter()
            await send_pipelined(plain, payload, total, inflight * per_txn)
            return total / (time.perf_counter() - start)

        async def txn_run() -> float:
            start = time.perf_counter()
            await send_in_transactions(client, txnal, payload, total, per_txn, inflight)
            return total / (time.perf_counter() - start)

        ways = {"plain": plain_run, "pipelined": pipelined_run, "txn": txn_run}
        names = list(ways)
        results: dict[str, list[float]] = {name: [] for name in names}
        for r in range(rounds):
            for name in names[r % 3 :] + names[: r % 3]:
                results[name].append(await ways[name]())
    return results


def fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares ``y = a + b x`` through ``points``: (a, b)."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0
    return my - b * mx, b


def cost_split(sizes: list[int], rounds: int, messages: int, size: int) -> None:
    """``--split``: CPU per transaction of each process at each size, and
    its fit as fixed + per message (see the module docstring)."""
    import argparse as _argparse

    variant = Variant("txnbuf", 1, True, "readme")
    per_txn: dict[int, list[tuple[float, float, float, float]]] = {n: [] for n in sizes}
    with (
        tempfile.TemporaryDirectory() as tmp,
        asyncio.Runner(loop_factory=_loop_factory()) as runner,
        Runs(rounds * len(sizes), "txn split") as runs,
    ):
        for r in range(rounds):
            shift = r % len(sizes)
            for n in sizes[shift:] + sizes[:shift]:
                runs.start(f"round {r + 1}/{rounds}: {n} per transaction")
                total = max(messages, 40 * n)
                args = _argparse.Namespace(messages=total, per_txn=n, size=size)
                run = one_run(variant, args, tmp, None, runner)
                writer = run.writer or 0.0
                per_txn[n].append((run.rate, run.client * n, run.server * n, writer * n))
                runs.done(f"{run.rate:,.0f} msgs/s")
    print()
    print(f"where the README loop's CPU goes: {size} B messages, 1 worker process, median of "
          f"{rounds} rounds; CPU us per transaction")  # fmt: skip
    print(f"{'msgs/txn':>9} {'msgs/s':>9} {'client':>9} {'broker':>9} {'writer':>9} {'total':>9}")
    medians: dict[int, list[float]] = {}
    for n in sizes:
        cols = [statistics.median(run[i] for run in per_txn[n]) for i in range(4)]
        medians[n] = cols
        total_cpu = sum(cols[1:])
        print(f"{n:>9} {cols[0]:>9,.0f} {cols[1]:>9.0f} {cols[2]:>9.0f} {cols[3]:>9.0f} "
              f"{total_cpu:>9.0f}")  # fmt: skip
    print()
    print(f"{'fit':>9} {'fixed us/txn':>13} {'us/msg':>8}  (CPU per transaction = fixed + "
          "us/msg x messages)")  # fmt: skip
    for i, name in ((1, "client"), (2, "broker"), (3, "writer")):
        a, b = fit([(n, medians[n][i]) for n in sizes])
        print(f"{name:>9} {a:>13.0f} {b:>8.2f}")
    a, b = fit([(n, sum(medians[n][1:])) for n in sizes])
    print(f"{'total':>9} {a:>13.0f} {b:>8.2f}")
    legend(
        "client: the worker process; broker: txnbuf's broker process without its writer; "
        "writer: its ledger writer process",
    )


async def small_round(url: str, per_txn: int, txns: int) -> tuple[float, list[float], float]:
    """The README loop at ``per_txn`` messages per transaction for ``txns``
    transactions: msgs/s, commit latencies (s), this process's CPU us/msg."""
    tag = uuid_tag()
    src, dst = f"small-in-{tag}", f"small-out-{tag}"
    total = per_txn * txns
    async with Client(url) as client:
        seeder = await client.create_producer(src, batching_max_messages=per_txn)
        for first in range(0, total, 5000):
            futs = [
                seeder.send_nowait(b"%010d" % n) for n in range(first, min(total, first + 5000))
            ]
            await asyncio.gather(*futs)
        source = await client.subscribe(src, "s", initial_position="earliest")
        producer = await client.create_producer(dst)
        latencies: list[float] = []
        done = 0
        cpu0 = time.process_time()
        start = time.perf_counter()
        while done < total:
            batch = await source.batch_receive(max_messages=per_txn, timeout=0.1)
            if not batch:
                continue
            async with client.transaction(timeout=30) as txn:
                for msg in batch:
                    await producer.send(msg.value.upper(), txn=txn)
                    await source.acknowledge(msg, txn=txn)
                t0 = time.perf_counter()
            latencies.append(time.perf_counter() - t0)
            done += len(batch)
        elapsed = time.perf_counter() - start
        cpu = (time.process_time() - cpu0) * 1e6 / done
    return done / elapsed, latencies, cpu


def uuid_tag() -> str:
    return f"{os.getpid()}-{time.monotonic_ns()}"


def small_transactions(txns: int, rounds: int) -> None:
    """``--small``: transactions of 1 and 10 messages (see the module docstring)."""
    results: dict[int, list[tuple[float, list[float], float, float]]] = {1: [], 10: []}
    with tempfile.TemporaryDirectory() as tmp:
        broker = BrokerProcess(os.path.join(tmp, "data"))
        try:
            with asyncio.Runner(loop_factory=_loop_factory()) as runner:
                for r in range(rounds):
                    for n in (1, 10) if r % 2 == 0 else (10, 1):
                        b0 = process_cpu(broker.proc.pid)
                        rate, lat, cpu = runner.run(small_round(broker.url, n, txns))
                        b1 = process_cpu(broker.proc.pid)
                        results[n].append((rate, lat, cpu, (b1 - b0) * 1e6 / (n * txns)))
        finally:
            broker.stop()
    print()
    print(f"small transactions: the README loop, {txns} transactions per round, {rounds} rounds "
          "alternated; medians")  # fmt: skip
    print(f"{'msgs/txn':>9} {'msgs/s':>9} {'txn/s':>9} {'commit p50 ms':>14} {'commit p99 ms':>14} "
          f"{'client us/msg':>14} {'broker us/msg':>14}")  # fmt: skip
    for n, rows in results.items():
        rate = statistics.median(row[0] for row in rows)
        lat = [x for row in rows for x in row[1]]
        client_us = statistics.median(row[2] for row in rows)
        broker_us = statistics.median(row[3] for row in rows)
        print(f"{n:>9} {rate:>9,.0f} {rate / n:>9,.0f} {statistics.median(lat) * 1000:>14.2f} "
              f"{pct(lat, 0.99):>14.2f} {client_us:>14.1f} {broker_us:>14.1f}")  # fmt: skip
    legend(
        "commit: leaving the transaction block (one COMMIT_TXN and its answer); broker us/msg: "
        "the broker with its ledger writer",
    )


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument(
        "--inflight", type=int, default=64, help="transactions open at once (produce)"
    )
    parser.add_argument("--url", help="use this running broker instead of a new one")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--no-produce", action="store_true", help="skip the produce comparison")
    parser.add_argument("--no-ctp", action="store_true", help="skip the worker-count runs")
    parser.add_argument(
        "--split", action="store_true", help="where the README loop's CPU goes (see above)"
    )
    parser.add_argument(
        "--split-sizes",
        type=lambda t: [int(x) for x in t.split(",")],
        default=[20, 50, 100, 200, 500, 1000],
        help="messages per transaction of the split's runs",
    )
    parser.add_argument("--split-rounds", type=int, default=2)
    parser.add_argument("--split-messages", type=int, default=20_000)
    parser.add_argument("--small", action="store_true", help="transactions of 1 and 10 messages")
    parser.add_argument("--small-txns", type=int, default=2000)
    parser.add_argument("--small-rounds", type=int, default=4)
    parser.add_argument(
        "--produce-rounds", type=int, default=3, help="runs of each way, in rotation"
    )
    parser.add_argument(
        "--produce-messages",
        type=int,
        default=500_000,
        help="messages a produce run sends (runs of 100,000 took 0.2 s: one hiccup of "
        "this machine moved a ratio by half)",
    )
    args = parser.parse_args()
    if args.split:
        cost_split(args.split_sizes, args.split_rounds, args.split_messages, args.size)
    if args.small:
        small_transactions(args.small_txns, args.small_rounds)
    if args.no_ctp:
        return
    loop_factory = _loop_factory()

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        broker = None if args.url else BrokerProcess(os.path.join(tmp, "data"))
        url = args.url or broker.url  # type: ignore[union-attr]
        try:
            total = len(args.workers) + (0 if args.no_produce else 1)
            with asyncio.Runner(loop_factory=loop_factory) as runner, Runs(total, "txn") as runs:
                for workers in args.workers:
                    runs.start(f"consume-transform-produce, {workers} worker(s)")
                    pid = broker.proc.pid if broker is not None else None
                    rate, lat, client_us, broker_us = runner.run(
                        ctp(url, workers, args.messages, args.per_txn, args.size, pid)
                    )
                    p50, p99 = statistics.median(lat) * 1000, pct(lat, 0.99)
                    rows.append((workers, rate, p50, p99, client_us, broker_us))
                    runs.done(f"{rate:,.0f} msgs/s")
                produced: dict[str, list[float]] = {}
                if not args.no_produce:
                    runs.start("produce, plain vs transactional")
                    produced = runner.run(
                        produce(
                            url,
                            args.produce_messages,
                            args.per_txn,
                            args.size,
                            args.inflight,
                            args.produce_rounds,
                        )
                    )
                    runs.done()
        finally:
            if broker is not None:
                broker.stop()

    print()
    print(f"consume-transform-produce, {args.per_txn} msgs/txn, {args.size} B messages")
    print(
        f"{'workers':>7} {'msgs/s':>9} {'commit p50 ms':>14} {'commit p99 ms':>14}"
        f" {'client us/msg':>14} {'broker us/msg':>14}"
    )
    for workers, rate, p50, p99, client_us, broker_us in rows:
        broker_cpu = f"{broker_us:>14.1f}" if broker_us is not None else f"{'-':>14}"
        print(
            f"{workers:>7} {rate:>9,.0f} {p50:>14.1f} {p99:>14.1f} {client_us:>14.1f} {broker_cpu}"
        )
    print("peers (PostgreSQL, Redis) in the same run: python -m bench.ctp")
    legend(
        "msgs/s: inputs copied per second (each transaction: receive, send transformed, "
        "acknowledge in the transaction, commit)",
        "commit p50/p99 ms: commit() called -> answered",
        "client/broker us/msg: CPU per message copied, of this process / of the broker and "
        "its ledger writer ('-': a broker this run did not start)",
    )
    if args.no_produce:
        return
    plains, pipelined, txns = produced["plain"], produced["pipelined"], produced["txn"]
    plain, piped, txn = (statistics.median(v) for v in (plains, pipelined, txns))
    each = ", ".join(f"{t / p:.2f}" for p, t in zip(plains, txns, strict=True))
    each_piped = ", ".join(f"{t / p:.2f}" for p, t in zip(pipelined, txns, strict=True))
    window = args.inflight * args.per_txn
    print()
    print(f"produce {args.produce_messages} x {args.size} B, median of {len(plains)} runs of each "
          f"(in rotation):")  # fmt: skip
    ways = [
        ("plain, windows of 2,000", plain),
        (f"plain, {window:,} in flight", piped),
        (f"transactional, {args.per_txn}/txn, {args.inflight} open", txn),
    ]
    width = max(len(label) for label, _ in ways)
    for label, rate in ways:
        print(f"  {label:<{width}}  {rate:>9,.0f} msgs/s")
    print(f"  ratio to plain in windows {txn / plain:.2f} (each round: {each}); to plain with as "
          f"many in flight {txn / piped:.2f} (each round: {each_piped})")  # fmt: skip
    legend(
        "ratio: transactional msgs/s over plain msgs/s (1.00: transactions cost nothing); "
        "'each round' compares runs made next to each other",
    )


if __name__ == "__main__":
    with recorded("txn", " ".join(["python -m bench.txn", *sys.argv[1:]])):
        main()
