"""How a group commit reaches SQLite from the store's writer thread, while
the broker's event loop keeps the interpreter busy: the statement shapes
side by side, in one run.

    python -m bench.sqlitecommit [--commits 300] [--rows 3,100] [--rounds 3]

Each round opens a fresh database as the store's writer does
(`ledger._writer.connect`: WAL, ``synchronous=FULL``) and runs, in a
thread, ``--commits`` group commits of each size in ``--rows`` (rows of
100 B, keys increasing), in each shape:

- ``one statement``: what the store does (`ledger._writer.commit`): one
  multi-row INSERT in autocommit mode, the insert and its COMMIT (with the
  fsync) one call into SQLite;
- ``executemany``: BEGIN IMMEDIATE, ``executemany`` of a one-row INSERT,
  COMMIT;
- ``row by row``: BEGIN IMMEDIATE, one ``execute`` per row, COMMIT.

Python's sqlite3 lets go of the interpreter lock inside each step into
SQLite, and takes it again on the way back; with another thread running
Python code (here: the main thread, in a pure-Python loop, as a busy event
loop) getting it back can take up to the switch interval (5 ms) each time.
Each shape runs once with the main thread idle and once with it busy; the
shapes alternate within a round. Printed: wall time and the writer
thread's CPU per group commit (its own clock), and, when busy, the main
thread's work done per second as a share of what it does alone (the
writer's cost to the event loop). Medians of the rounds.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from bench._results import recorded
from ledger import _writer

Rows = list[tuple[int, int, bytes]]
SHAPES = ("one statement", "executemany", "row by row")


def one_statement(raw: sqlite3.Connection, rows: Rows) -> None:
    _writer.commit(raw, rows, [])


def executemany(raw: sqlite3.Connection, rows: Rows) -> None:
    raw.execute("BEGIN IMMEDIATE")
    raw.executemany("INSERT INTO entries(id, meta, data) VALUES (?,?,?)", rows)
    raw.execute("COMMIT")


def row_by_row(raw: sqlite3.Connection, rows: Rows) -> None:
    raw.execute("BEGIN IMMEDIATE")
    for row in rows:
        raw.execute("INSERT INTO entries(id, meta, data) VALUES (?,?,?)", row)
    raw.execute("COMMIT")


COMMIT: dict[str, Callable[[sqlite3.Connection, Rows], None]] = {
    "one statement": one_statement,
    "executemany": executemany,
    "row by row": row_by_row,
}


def _spin(stop: threading.Event) -> int:
    """Pure-Python work until ``stop``: the units done."""
    done = 0
    while not stop.is_set():
        for _ in range(200):
            done += 1
    return done


def spin_rate(seconds: float) -> float:
    """The main thread's work per second with no writer."""
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    started = time.perf_counter()
    timer.start()
    done = _spin(stop)
    return done / (time.perf_counter() - started)


def one_case(shape: str, rows: int, commits: int, busy: bool) -> dict[str, float]:
    """``commits`` group commits of ``rows`` rows in ``shape`` on a writer
    thread, the main thread busy or idle: wall and thread CPU µs per commit,
    and the main thread's work per second (busy only)."""
    fn = COMMIT[shape]
    payload = os.urandom(100)
    with tempfile.TemporaryDirectory(prefix="txnbuf-sqlitecommit-") as tmp:
        raw = _writer.connect(os.path.join(tmp, "broker.db"))
        try:
            batches = [
                [(_writer.key(1, c * rows + i), 0, payload) for i in range(rows)]
                for c in range(commits)
            ]
            figures: dict[str, float] = {}
            stop = threading.Event()

            def writer() -> None:
                cpu0, wall0 = time.thread_time(), time.perf_counter()
                for batch in batches:
                    fn(raw, batch)
                figures["wall_us"] = (time.perf_counter() - wall0) / commits * 1e6
                figures["cpu_us"] = (time.thread_time() - cpu0) / commits * 1e6
                stop.set()

            thread = threading.Thread(target=writer, name="txnbuf-writer")
            started = time.perf_counter()
            thread.start()
            if busy:
                done = _spin(stop)
                figures["spin_rate"] = done / (time.perf_counter() - started)
            thread.join()
            (count,) = raw.execute("SELECT count(*) FROM entries").fetchone()
            assert count == rows * commits, (shape, count)
        finally:
            raw.close()
    return figures


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sqlitecommit", description=__doc__)
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--rows", default="3,100", help="rows per group commit, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sizes = [int(x) for x in args.rows.split(",")]
    command = "python -m bench.sqlitecommit " + " ".join(argv if argv is not None else sys.argv[1:])
    with recorded("sqlitecommit", command):
        print(
            f"group commits from a writer thread: {args.commits} per case, rows of 100 B, "
            f"{args.rounds} round(s), shapes alternating; switch interval "
            f"{sys.getswitchinterval() * 1000:g} ms\n"
        )
        results: dict[tuple[str, int, bool], list[dict[str, float]]] = {}
        alone: list[float] = []
        for r in range(args.rounds):
            alone.append(spin_rate(0.5))
            order = SHAPES if r % 2 == 0 else tuple(reversed(SHAPES))
            for rows in sizes:
                for busy in (False, True):
                    for shape in order:
                        got = one_case(shape, rows, args.commits, busy)
                        results.setdefault((shape, rows, busy), []).append(got)
        base = statistics.median(alone)
        print(
            "| rows | shape | idle: wall µs | idle: writer CPU µs | busy: wall µs "
            "| busy: writer CPU µs | busy: main thread's work |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|")
        for rows in sizes:
            for shape in SHAPES:
                idle, busy_ = results[(shape, rows, False)], results[(shape, rows, True)]

                def med(runs: list[dict[str, float]], key: str) -> float:
                    return statistics.median(f[key] for f in runs)

                share = med(busy_, "spin_rate") / base
                print(
                    f"| {rows} | {shape} | {med(idle, 'wall_us'):,.0f} | "
                    f"{med(idle, 'cpu_us'):,.0f} | {med(busy_, 'wall_us'):,.0f} | "
                    f"{med(busy_, 'cpu_us'):,.0f} | {share:.0%} |"
                )
        print(
            "\nPer group commit, medians of the rounds: wall time and the writer "
            "thread's CPU (thread_time), with the main thread idle and busy in a "
            "pure-Python loop; the main thread's work per second while the writer "
            "ran, as a share of its rate alone."
        )


if __name__ == "__main__":
    main()
