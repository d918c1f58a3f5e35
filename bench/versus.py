"""One benchmark on two checkouts, interleaved in one run: before and after a change.

    python -m bench.versus BASE [--rounds 3] -- txn --no-produce --workers 1 4 16
    python -m bench.versus BASE [--rounds 3] -- ctp --systems txnbuf --rounds 1

Runs ``python -m bench.<name> ARGS`` in the checkout ``BASE`` (with its own
``BASE/.venv``, so that the brokers it starts run that checkout's code) and
in this one, ``--rounds`` times each, alternating (the side that goes first
alternates too), so that both sides see the same machine: this machine's
speed moves by tens of percent within an hour, and only runs made next to
each other compare. Each run's own results go to a temporary folder; this
prints every run's figures, then, for `bench.txn` and `bench.ctp`, each
row's median on both sides and their ratio (this checkout over BASE), and
appends the same to ``bench/results/versus.md``.

Rows compared: `bench.txn`'s consume-transform-produce rows (msgs/s, commit
p50 and p99, client and broker CPU µs per message) and `bench.ctp`'s
txnbuf rows (msgs/s of each run, client, server and writer CPU µs per
message). CPU per message is the steadier figure on a busy machine.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._results import recorded

ROOT = Path(__file__).resolve().parents[1]

# bench.txn: "workers msgs/s p50 p99 client_us broker_us"
_TXN_ROW = re.compile(r"^\s*(\d+)\s+([\d,]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+|-)\s*$")
_TXN_COLUMNS = ("msgs/s", "commit p50 ms", "commit p99 ms", "client us/msg", "broker us/msg")


def rows_of(name: str, output: str) -> dict[str, dict[str, float]]:
    """The rows of a run's output: label -> column -> figure (`bench.txn`
    and `bench.ctp` only; empty for another benchmark)."""
    rows: dict[str, dict[str, float]] = {}
    if name == "txn":
        for line in output.splitlines():
            m = _TXN_ROW.match(line)
            if m is None:
                continue
            figures = [m.group(i).replace(",", "") for i in range(2, 7)]
            rows[f"{m.group(1)} worker(s)"] = {
                col: float(v) for col, v in zip(_TXN_COLUMNS, figures, strict=True) if v != "-"
            }
    elif name == "ctp":
        for line in output.splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) < 6 or not cells[0].startswith("txnbuf"):
                continue
            # | label | round 1 .. round n | median | client | server | writer | ratio |
            runs = [float(c.replace(",", "")) for c in cells[1:-5]]
            client, server, writer = (float(c) if c != "-" else None for c in cells[-4:-1])
            row = {"msgs/s": statistics.median(runs)}
            for col, value in (("client us", client), ("server us", server), ("writer us", writer)):
                if value is not None:
                    row[col] = value
            rows[cells[0]] = row
    return rows


def python_of(checkout: Path) -> str:
    venv = checkout / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def run_once(checkout: Path, name: str, args: list[str], results: Path) -> str:
    env = {**os.environ, "TXNBUF_BENCH_RESULTS": str(results)}
    if name == "ctp" and "--results" not in args:  # (bench.ctp names its own file)
        args = [*args, "--results", str(results / "ctp.md")]
    proc = subprocess.run(
        [python_of(checkout), "-m", f"bench.{name}", *args],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(f"bench.{name} failed in {checkout}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def main() -> None:
    argv = sys.argv[1:]
    bench_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", type=Path, help="the other checkout (with its .venv)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(own)
    if not bench_args:
        parser.error("name the benchmark after --, e.g. -- txn --no-produce")
    name, rest = bench_args[0], bench_args[1:]
    sides = {"base": args.base.resolve(), "this": ROOT}
    figures: dict[str, dict[str, dict[str, list[float]]]] = {"base": {}, "this": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = ["base", "this"] if round_ % 2 == 0 else ["this", "base"]
            for side in order:
                print(f"-- round {round_ + 1}, {side} ({sides[side]})", file=sys.stderr, flush=True)
                out = run_once(sides[side], name, rest, Path(tmp) / side)
                print(f"\n### round {round_ + 1}: {side}\n\n{out.strip()}")
                for label, row in rows_of(name, out).items():
                    for col, value in row.items():
                        figures[side].setdefault(label, {}).setdefault(col, []).append(value)
    print(f"\nbench.{name} {' '.join(rest)}: base = {sides['base']}, this = {ROOT}")
    print(f"medians of {args.rounds} runs each, interleaved; ratio = this / base")
    for label, cols in figures["this"].items():
        base_cols = figures["base"].get(label, {})
        parts = []
        for col, values in cols.items():
            mine = statistics.median(values)
            theirs = statistics.median(base_cols[col]) if col in base_cols else None
            ratio = f" ({mine / theirs:.3f})" if theirs else ""
            parts.append(f"{col} {theirs if theirs is not None else '-'} -> {mine}{ratio}")
        print(f"  {label}: " + "; ".join(parts))


if __name__ == "__main__":
    with recorded("versus", " ".join(["python -m bench.versus", *sys.argv[1:]])):
        main()
