"""What a partition's transaction buffer holds after many commits on a
partition that is never trimmed (one without subscriptions, as a pipeline's
output often is), in process and without the network.

    python -m bench.txnmemory [--commits 50000] [--per-txn 10] [--baseline DIR]

Commits ``--commits`` transactions of ``--per-txn`` 100-byte messages to
one partition (64 open at once), then prints: transactions left in the
buffer's index, the size of an index snapshot, one sweep's CPU time, and
the Python memory still allocated per commit (tracemalloc: what the buffer,
the partition and the ledger layer hold after the commits, less what they
held before). It checks that every transaction committed.

Each side runs in a fresh process; with ``--baseline`` another checkout
runs the same (in its own code). Memory and sizes do not drift with this
machine's speed; the sweep's time does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from bench._progress import Runs, legend
from bench._results import recorded


async def one_side(commits: int, per_txn: int) -> dict[str, float]:
    """Run in the checkout on ``sys.path``; the figures as a dict."""
    from buffer import Topics
    from ledger import LedgerStore
    from proto import txnbuf_pb2 as pb

    payload = os.urandom(100)
    with tempfile.TemporaryDirectory() as tmp:
        store = await LedgerStore.open(os.path.join(tmp, "broker.db"))
        try:
            part = (await (await Topics.load(store)).create("out", 1)).partitions[0]
            tb = await part.txn_buffer()
            room = asyncio.Semaphore(64)

            async def one(i: int) -> None:
                async with room:
                    key = (1 << 48, i)
                    sends = [
                        pb.SingleMessage(payload=payload, sequence_id=j) for j in range(per_txn)
                    ]
                    await tb.publish(key, "p", sends)
                    await tb.end(key, commit=True)

            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            await asyncio.gather(*(one(i) for i in range(commits)))
            await tb.settled()
            held = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            cpu = time.process_time()
            await tb.sweep()
            sweep = time.process_time() - cpu
            committed = sum(1 for e, _ in await part.ledger.read_meta() if part.is_marker(e))
            if committed != commits:
                raise SystemExit(f"{committed} of {commits} transactions committed")
            return {
                "index": len(tb.transactions()),
                "snapshot_bytes": len(tb._snapshot_record()),
                "sweep_ms": sweep * 1000,
                "held_per_commit": held / commits,
            }
        finally:
            await store.close()


def run_side(checkout: Path, commits: int, per_txn: int) -> dict[str, float]:
    """One side in a fresh process of ``checkout``'s code."""
    # (Imported here: the side's own process imports from that checkout,
    # whose bench package may predate this helper.)
    from bench.txnpath import run_in_checkout

    args = ["--one-side", "--commits", str(commits), "--per-txn", str(per_txn)]
    return run_in_checkout(__file__, checkout, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=50_000)
    parser.add_argument("--per-txn", type=int, default=10)
    parser.add_argument("--baseline", help="another checkout to compare with")
    parser.add_argument("--one-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one_side:
        print(json.dumps(asyncio.run(one_side(args.commits, args.per_txn))))
        return
    here = Path(__file__).resolve().parent.parent
    sides: list[tuple[str, Any]] = [("this", here)]
    if args.baseline:
        sides.append(("baseline", Path(args.baseline).resolve()))
    rows = []
    with Runs(len(sides), "txnmemory") as runs:
        for name, checkout in sides:
            runs.start(f"{name}: {args.commits:,} commits")
            rows.append((name, run_side(checkout, args.commits, args.per_txn)))
            runs.done()
    print()
    print(f"transaction buffer after {args.commits:,} commits of {args.per_txn} messages, "
          "partition never trimmed")  # fmt: skip
    print(f"{'side':>8} {'index':>8} {'snapshot B':>12} {'sweep ms':>9} {'held B/commit':>14}")
    for name, r in rows:
        print(
            f"{name:>8} {r['index']:>8,.0f} {r['snapshot_bytes']:>12,.0f} {r['sweep_ms']:>9.1f}"
            f" {r['held_per_commit']:>14,.0f}"
        )
    legend(
        "index: transactions left in the buffer's index; snapshot B: bytes of one index "
        "snapshot; sweep ms: CPU of one sweep",
        "held B/commit: Python memory still allocated per commit once they are all done",
    )


if __name__ == "__main__":
    if "--one-side" in sys.argv:  # (a run inside the benchmark: its caller records the figures)
        main()
    else:
        with recorded("txnmemory", " ".join(["python -m bench.txnmemory", *sys.argv[1:]])):
            main()
