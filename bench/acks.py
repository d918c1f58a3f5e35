"""A subscription's ack bookkeeping alone: `subscriptions.Cursor` applying
transactional acks and commits, in CPU microseconds per message.

    python -m bench.acks [--entries 2000] [--per-entry 100] [--baseline DIR]

Each transaction acknowledges every message of one entry (a TXN_ACK record),
then commits (TXN_COMMIT), as a consume-transform-produce worker does. Two
orders: entries in order (one worker), and shuffled in windows of 4 (four
workers on a shared subscription, whose commits land out of order, so the
messages wait in ``acked`` until the gap before them closes). ``--baseline``
names another checkout: its cursor runs interleaved with this one, round by
round, and both are printed side by side (this machine's speed drifts, so
only interleaved figures compare).
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType

import subscriptions._cursor as this_cursor
from bench._progress import Runs, legend
from bench._results import recorded


def load_cursor(checkout: str) -> ModuleType:
    """``subscriptions/_cursor.py`` of another checkout, as a module of its own."""
    path = Path(checkout) / "subscriptions" / "_cursor.py"
    spec = importlib.util.spec_from_file_location("baseline_cursor", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"no cursor module at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def entry_order(entries: int, window: int, seed: int = 1) -> list[int]:
    """Entry ids in order, shuffled within consecutive windows of ``window``."""
    rng = random.Random(seed)
    order = []
    for base in range(0, entries, window):
        chunk = list(range(base, min(base + window, entries)))
        rng.shuffle(chunk)
        order += chunk
    return order


def run(cursor_module: ModuleType, order: list[int], per_entry: int) -> float:
    """CPU microseconds per message to lock and commit every message of ``order``."""
    last = len(order) - 1
    cursor = cursor_module.Cursor((-1, cursor_module.WHOLE_ENTRY))

    def count(_entry_id: int) -> int:
        return per_entry

    start = time.process_time()
    for i, entry_id in enumerate(order):
        txn = (1, i)
        positions = [(entry_id, j) for j in range(per_entry)]
        cursor.apply(cursor_module.TXN_ACK, positions, count, last, txn)
        cursor.apply(cursor_module.TXN_COMMIT, (), count, last, txn)
    elapsed = time.process_time() - start
    if cursor.mark_delete != (last, cursor_module.WHOLE_ENTRY) or cursor.acked:
        raise SystemExit(f"the cursor did not end past every message: {cursor!r}")
    return elapsed * 1e6 / (len(order) * per_entry)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=2000)
    parser.add_argument("--per-entry", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--baseline", help="a checkout to compare with, interleaved")
    args = parser.parse_args()
    sides = {"this": this_cursor}
    if args.baseline:
        sides["baseline"] = load_cursor(args.baseline)
    orders = {
        "in order (1 worker)": entry_order(args.entries, 1),
        "windows of 4 (4 workers)": entry_order(args.entries, 4),
    }
    results: dict[tuple[str, str], list[float]] = {}
    with Runs(args.rounds * len(orders) * len(sides), "acks") as runs:
        for n in range(args.rounds):
            for order_name, order in orders.items():
                for side, module in sides.items():
                    runs.start(f"round {n + 1}: {order_name}, {side}")
                    results.setdefault((order_name, side), []).append(
                        run(module, order, args.per_entry)
                    )
                    runs.done()
    print(f"TXN_ACK + TXN_COMMIT of whole entries of {args.per_entry} messages, "
          f"{args.entries} entries, CPU us per message, median (min) of {args.rounds}")  # fmt: skip
    print(f"{'order':<26}" + "".join(f"{side:>18}" for side in sides))
    for order_name in orders:
        cells = []
        for side in sides:
            values = results[order_name, side]
            cells.append(f"{statistics.median(values):>9.2f} ({min(values):.2f})")
        print(f"{order_name:<26}" + "".join(f"{c:>18}" for c in cells))
    legend(
        "each cell: CPU microseconds per message to apply a TXN_ACK and its TXN_COMMIT, "
        "median of the rounds (the fastest in brackets)",
        "windows of 4: commits land out of order, as four workers' do: messages wait in "
        "the acked set until the gap before them closes",
    )


if __name__ == "__main__":
    with recorded("acks", " ".join(["python -m bench.acks", *sys.argv[1:]])):
        main()
