"""The broker's side of a transaction, in process and without the network:
coordinator, transaction buffer, pending acks and the ledger (with its
writer thread). CPU microseconds per transaction.

    python -m bench.txnpath [--txns 2000] [--per-txn 100] [--concurrency 1 4]
                            [--rounds 3] [--baseline DIR]

Each transaction is what a consume-transform-produce worker asks of the
broker: NEW; a send of ``--per-txn`` 100-byte messages that adds its
partition (KIP-890 part 2, as the client does); an ack of as many input
messages in the transaction, adding the subscription; END with commit.
``--concurrency`` runs that many such loops at once (workers). Printed: the
broker without its ledger writer, and the writer, CPU microseconds per
transaction (median of the rounds, min in brackets), and wall time per
transaction.

Every round runs in a fresh process and data directory. With
``--baseline`` another checkout's broker runs the same rounds, alternating
with this one (this machine's speed drifts: only interleaved figures
compare). The client's work, framing and aiohttp are not measured here
(`bench.txn` measures everything end to end).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import inspect
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._progress import Runs, legend
from bench._results import recorded

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int, itself: bool = True) -> float:
    """CPU seconds (user + system) process ``pid`` (unless not ``itself``)
    and its children still running have used (a broker before its ledger
    writer became a thread had one: its writer process)."""
    total = 0.0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # (gone meanwhile)
        if (itself and int(entry) == pid) or int(fields[1]) == pid:  # (fields[1]: the parent)
            total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def children_cpu() -> float:
    """CPU seconds of this process's children still running (the ledger writer)."""
    return cpu_seconds(os.getpid(), itself=False)


WRITER_THREAD = "txnbuf-writer"  # (the name `ledger._sqlite` gives a writer thread)


def writer_thread_cpu(pid: int | str = "self") -> float:
    """CPU seconds of the threads of process ``pid`` named `WRITER_THREAD`
    (from their schedstat: nanoseconds)."""
    total = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0.0
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                if comm.read().strip() != WRITER_THREAD:
                    continue
            with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                total += int(stat.read().split()[0])
        except OSError:
            continue
    return total / 1e9


def writer_seconds(pid: int) -> float:
    """CPU seconds of broker ``pid``'s ledger writer: its thread (or, in an
    older checkout's broker, its writer process)."""
    return cpu_seconds(pid, itself=False) + writer_thread_cpu(pid)


def writer_cpu() -> float:
    """`writer_seconds` of this process."""
    return children_cpu() + writer_thread_cpu()


async def one_round(txns: int, per_txn: int, concurrency: int) -> dict[str, float]:
    """Run ``txns`` transactions in a fresh broker; CPU and wall time per transaction."""
    from broker import Broker
    from proto import txnbuf_pb2 as pb
    from subscriptions import Consumer, SubType

    payload = os.urandom(100)
    with tempfile.TemporaryDirectory() as tmp:
        broker = await Broker.open(tmp)
        try:
            tc = broker.coordinators[0]
            src = await broker.topics.create("in", 1)
            out = (await broker.topics.create("out", 1)).partitions[0]
            # The input: one entry of per_txn messages per transaction.
            seeds = [
                src.partitions[0].publish(
                    "seeder",
                    [
                        pb.SingleMessage(payload=payload, sequence_id=i * per_txn + j)
                        for j in range(per_txn)
                    ],
                )
                for i in range(txns)
            ]
            entry_ids = [(await s).entry_id for s in seeds]
            consumer = Consumer(1, "c", "in", "s", SubType.SHARED, push=lambda c, e: None)
            await broker.subscriptions.subscribe(src, "s", consumer, earliest=True)
            # The sends, encoded as a client encodes them (CommandSend.batch),
            # with their first sequence id where the broker takes it (a baseline
            # checkout may be older).
            takes_first = "first_seq" in inspect.signature(broker.publish_txn).parameters

            def first(i: int) -> tuple[int, ...]:
                return (i * per_txn,) if takes_first else ()

            sends = [
                pb.EntryBatch(
                    messages=[
                        pb.SingleMessage(payload=payload, sequence_id=i * per_txn + j)
                        for j in range(per_txn)
                    ]
                ).SerializeToString()
                for i in range(txns)
            ]

            # A coordinator whose requests are answered at once (this code),
            # or one of an older checkout (a baseline), which awaits them.
            answers_at_once = not inspect.iscoroutinefunction(tc.new_txn)
            at_once = getattr(tc, "end_txn_at_once", None)

            async def worker(mine: list[int]) -> None:
                for i in mine:
                    if answers_at_once:
                        txnid = tc.new_txn(60_000)
                        tc.add_partition(txnid, "out", 0)
                        early = True
                    else:
                        txnid = await tc.new_txn(60_000)
                        early = tc.participants_answer_early
                        waiting = tc.join_partition(txnid, "out", 0)
                        if waiting is not None:
                            await waiting
                    key = txnid
                    batch = pb.EntryBatch.FromString(sends[i])
                    published = broker.publish_txn(
                        out, key, f"p{mine[0]}", batch.messages, sends[i], early, *first(i)
                    )
                    if answers_at_once:
                        tc.add_subscription(txnid, "in", "s")
                    else:
                        waiting = tc.join_subscription(txnid, "in", "s")
                        if waiting is not None:
                            await waiting
                    positions = [(entry_ids[i], j) for j in range(per_txn)]
                    await broker.subscriptions.ack_positions(
                        consumer, {0: positions}, False, key, early
                    )
                    await published
                    # END as the broker's connection does it.
                    if answers_at_once:
                        await tc.end_txn(txnid, True)
                        continue
                    answered = at_once(txnid, True) if at_once is not None else None
                    await (answered if answered is not None else tc.end_txn(txnid, True))

            # Each worker its own producer (sequence ids increase per producer).
            shares = [list(range(w, txns, concurrency)) for w in range(concurrency)]
            thread0, writer0, wall0 = writer_thread_cpu(), writer_cpu(), time.perf_counter()
            cpu0 = time.process_time()
            await asyncio.gather(*(worker(share) for share in shares))
            wall = time.perf_counter() - wall0
            cpu = time.process_time() - cpu0 - (writer_thread_cpu() - thread0)
            writer = writer_cpu() - writer0
            await asyncio.sleep(0.2)  # (the last records, written after END's answer)
            check(broker, txns)
        finally:
            await broker.close()
    return {
        "main_us": cpu * 1e6 / txns,
        "writer_us": writer * 1e6 / txns,
        "wall_us": wall * 1e6 / txns,
    }


def check(broker: Any, txns: int) -> None:
    """Every transaction committed: its send is in the output partition, its
    acks deleted every input message."""
    out = broker.topics.get("out").partitions[0].transaction_buffer
    committed = out.stats()["committed"] if out is not None else 0
    (sub,) = broker.subscriptions.of_topic("in")["s"]
    if committed != txns or sub.backlog() != 0:
        raise SystemExit(
            f"{committed} of {txns} transactions committed, {sub.backlog()} inputs not deleted"
        )


def run_in_checkout(script: str, checkout: Path, args: list[str]) -> dict[str, float]:
    """Run benchmark ``script`` with ``args`` in a fresh process of
    ``checkout``'s code; the JSON object it prints last."""
    # The script runs there, so the baseline needs no copy of it; PYTHONPATH
    # puts that checkout's packages first. run_path, not `python script`:
    # the script's folder must not come first on the path, where
    # bench/cluster.py would hide the package `cluster`.
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    code = (
        f"import runpy, sys; sys.argv = [{script!r}, *{args!r}]; "
        f"runpy.run_path({script!r}, run_name='__main__')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=checkout, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"the run in {checkout} failed:\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_checkout(checkout: Path, args: argparse.Namespace, concurrency: int) -> dict[str, float]:
    """One round in a fresh process of ``checkout``'s code."""
    round_args = ["--one-round", str(concurrency), "--txns", str(args.txns)]
    return run_in_checkout(__file__, checkout, [*round_args, "--per-txn", str(args.per_txn)])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txns", type=int, default=2000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", help="another checkout to compare with, interleaved")
    parser.add_argument("--one-round", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_round is not None:
        # The event loop and the garbage collector as `txnbuf serve` has them.
        from broker import cli

        gc.freeze()
        gc.set_threshold(getattr(cli, "GC_GEN0_THRESHOLD", 700), *gc.get_threshold()[1:])
        with asyncio.Runner(loop_factory=cli._event_loop_factory()) as runner:
            result = runner.run(one_round(args.txns, args.per_txn, args.one_round))
        print(json.dumps(result))
        return
    sides = {"this": Path(__file__).resolve().parents[1]}
    if args.baseline:
        sides["baseline"] = Path(args.baseline).resolve()
    results: dict[tuple[int, str], list[dict[str, float]]] = {}
    total = len(args.concurrency) * args.rounds * len(sides)
    with Runs(total, "txnpath") as runs:
        for concurrency in args.concurrency:
            for r in range(args.rounds):
                order = list(sides.items())
                if r % 2:
                    order.reverse()
                for name, checkout in order:
                    runs.start(f"concurrency {concurrency}, round {r + 1}: {name}")
                    result = run_checkout(checkout, args, concurrency)
                    results.setdefault((concurrency, name), []).append(result)
                    runs.done()
    print()
    print(
        f"the broker's side of a transaction ({args.per_txn} msgs sent + {args.per_txn} acked),"
        f" {args.txns} transactions a round, median of {args.rounds} (min)"
    )
    heads = ("main us/txn", "writer us/txn", "wall us/txn")
    print(f"{'workers':>7} {'side':>9} " + " ".join(f"{h:>16}" for h in heads))
    for (concurrency, name), rows in results.items():
        cells = []
        for k in ("main_us", "writer_us", "wall_us"):
            values = [row[k] for row in rows]
            cells.append(f"{statistics.median(values):>8.0f} ({min(values):.0f})")
        print(f"{concurrency:>7} {name:>9} " + " ".join(f"{c:>16}" for c in cells))
    legend(
        "main / writer: CPU microseconds per transaction of the broker's process without its "
        "ledger writer / of its writer (process or thread); wall: elapsed time per transaction",
        "each cell: the median of the rounds, the fastest in brackets",
    )


if __name__ == "__main__":
    if "--one-round" in sys.argv:  # (a run inside the benchmark: its caller records the figures)
        main()
    else:
        with recorded("txnpath", " ".join(["python -m bench.txnpath", *sys.argv[1:]])):
            main()
