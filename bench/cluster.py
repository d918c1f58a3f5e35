"""One broker on PostgreSQL beside one broker on SQLite, in one run.

    python -m bench.cluster [--messages 30000] [--rounds 3] [--workers 1,4]
                            [--per-txn 100] [--size 100] [--results bench/results/cluster.md]

The README's consume-transform-produce loop (`bench.ctp`'s ``README loop``:
``batch_receive``, then per message ``await send(txn=)`` and ``await
acknowledge(msg, txn=)``, commit on leaving ``client.transaction()``), with
1 and 4 worker processes, against a broker whose store is SQLite in a data
directory (the default) and one whose store is a PostgreSQL database
(``txnbuf serve --store postgresql://...``), each run on a fresh store, in
an order that rotates from round to round. The PostgreSQL server is a
private one (`bench._postgres`: ``initdb`` in a temporary folder,
``fsync=on``, ``synchronous_commit=on``), one database per run.

Per message copied, on PostgreSQL: rows written (``n_tup_ins + n_tup_upd +
n_tup_del`` of the tables of the schema ``txnbuf``, from
``pg_stat_user_tables``) and WAL bytes (``pg_current_wal_lsn()``), from
the start of the copy to the stop of the broker. To count only the copy,
the broker is restarted after the inputs are loaded (its connections end,
which flushes their counts), and the figures start then (its restart
counted), and end once the broker's connections are gone after its stop;
they include
the output check's reads (no writes but a subscription) and the broker's
stop.

Prints each run's msgs/s and the medians, CPU µs per message of the client
processes, of the broker process (SQLite: without its writer thread) and
of SQLite's writer thread, the ratio of PostgreSQL to SQLite for each
number of workers, and the rows and bytes per message; appends the same to
``--results``. Only figures of one run compare.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._postgres import PostgresServer, private_postgres
from bench._progress import Runs
from bench.ctp import DIGITS, Run, Txnbuf, Variant, _loop_factory, _workers, machine, one_run
from bench.txnpath import cpu_seconds

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "cluster.md"
STORES = ("SQLite", "PostgreSQL")

_TABLE_WRITES = (
    "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0)::bigint, "
    "coalesce(sum(n_tup_ins), 0)::bigint FROM pg_stat_user_tables WHERE schemaname = 'txnbuf'"
)


@dataclass(frozen=True, slots=True)
class Row:
    store: str
    workers: int

    @property
    def label(self) -> str:
        return f"{self.store}, {self.workers} process{'es' if self.workers > 1 else ''}"


@dataclass(slots=True)
class Written:
    """What a run wrote to PostgreSQL."""

    rows: int = 0
    inserted: int = 0
    wal: int = 0


async def _query(url: str, sql: str) -> Any:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        return await conn.fetchrow(sql)
    finally:
        await conn.close()


async def _snapshot(url: str, settled: bool = False) -> tuple[int, int, int]:
    """Rows written and inserted, and the WAL position. ``settled``: once
    the broker's connections have ended (a backend's counts are flushed
    when it exits), up to 10 s."""
    for _ in range(500 if settled else 0):
        others = await _query(
            url,
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid()",
        )
        if others[0] == 0:
            break
        await asyncio.sleep(0.02)
    writes, inserted = await _query(url, _TABLE_WRITES)
    wal = (await _query(url, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint"))[0]
    return int(writes), int(inserted), int(wal)


class PostgresTxnbuf(Txnbuf):
    """`bench.ctp`'s txnbuf server with ``--store`` a fresh database, which
    counts what the copy writes (see the module docstring)."""

    def __init__(self, tmp: str, server: PostgresServer, database: str, written: Written) -> None:
        asyncio.run(_admin(server.url(), f"CREATE DATABASE {database}"))
        self.pg_url = server.url(database)
        self.pg_server = server
        self.written = written
        self.tmp = tmp
        super().__init__(tmp, ["--store", self.pg_url])
        self._start: tuple[int, int, int] | None = None

    async def load(self, total: int, size: int, per_txn: int) -> None:
        await super().load(total, size, per_txn)
        self.broker.stop()
        self._start = await _snapshot(self.pg_url, settled=True)
        Txnbuf.__init__(self, self.tmp, ["--store", self.pg_url])  # (the same store, anew)

    def cpu(self) -> tuple[float, float | None]:
        """CPU seconds of the broker, and of PostgreSQL's server (the
        postmaster and its children: the broker's backends, the WAL writer,
        the checkpointer, autovacuum)."""
        return self.broker.cpu()[0], cpu_seconds(self.pg_server.proc.pid)

    def stop(self) -> None:
        super().stop()
        if self._start is not None:
            end = asyncio.run(_snapshot(self.pg_url, settled=True))
            self.written.rows += end[0] - self._start[0]
            self.written.inserted += end[1] - self._start[1]
            self.written.wal += end[2] - self._start[2]


async def _admin(url: str, sql: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


def report(
    args: argparse.Namespace,
    rows: list[Row],
    runs: dict[Row, list[Run]],
    written: dict[int, Written],
    header: list[str],
) -> str:
    n = args.messages
    lines = [
        f"consume-transform-produce (the README loop), exactly once: {n:,} inputs of "
        f"{args.size} B, {args.per_txn} per transaction; {args.rounds} round(s), each runs every "
        "row once on a fresh store, in rotation",
        "",
        *(f"- {line}" for line in header),
        "",
    ]
    rounds_head = " | ".join(f"round {r + 1}" for r in range(args.rounds))
    lines += [
        f"| | {rounds_head} | median msgs/s | client | broker | writer / PostgreSQL |",
        "|---|" + "---:|" * args.rounds + "---:|---:|---:|---:|",
    ]
    medians = {r: statistics.median(run.rate for run in runs[r]) for r in rows}
    for r in rows:
        each = " | ".join(f"{run.rate:,.0f}" for run in runs[r])
        cpu = [statistics.median(getattr(run, c) for run in runs[r]) for c in ("client", "server")]
        writers = [run.writer for run in runs[r] if run.writer is not None]
        writer = f"{statistics.median(writers):.2f}" if writers else "-"
        lines.append(
            f"| {r.label} | {each} | {medians[r]:,.0f} | {cpu[0]:.2f} | {cpu[1]:.2f} | {writer} |"
        )
    lines += ["", "PostgreSQL / SQLite:"]
    for workers in args.workers:
        pg, lite = Row("PostgreSQL", workers), Row("SQLite", workers)
        pairs = zip(runs[pg], runs[lite], strict=True)
        each = ", ".join(f"{a.rate / b.rate:.2f}" for a, b in pairs)
        lines.append(
            f"- {workers} process{'es' if workers > 1 else ''}: "
            f"{medians[pg] / medians[lite]:.2f} (each round: {each})"
        )
    lines += ["", "Written to PostgreSQL per message copied (all rounds):"]
    for workers in args.workers:
        w = written[workers]
        copies = n * args.rounds
        lines.append(
            f"- {workers} process{'es' if workers > 1 else ''}: {w.rows / copies:.2f} rows "
            f"({w.inserted / copies:.2f} inserted), {w.wal / copies:,.0f} WAL bytes"
        )
    lines += [
        "",
        "CPU µs per message: client = the worker processes; broker = the broker's process "
        "(without SQLite's writer); writer / PostgreSQL = SQLite's writer thread, or "
        "PostgreSQL's server (the postmaster and its children); rows = n_tup_ins + n_tup_upd "
        "+ n_tup_del of the schema txnbuf, WAL bytes from pg_current_wal_lsn(), from the "
        "copy's start to the broker's stop (the benchmark's values are padded with one letter: "
        "PostgreSQL compresses entries over 2 kB, a batch of them among them).",
        f"Every run's output was checked: {n:,} outputs, each input transformed exactly once.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=_workers, default=[1, 4], help="e.g. 1,4")
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="the file a section of results is appended to")  # fmt: skip
    args = parser.parse_args()
    if args.messages < 1 or args.rounds < 1 or args.per_txn < 1:
        parser.error("--messages, --rounds and --per-txn must be above 0")
    if args.size < DIGITS:
        parser.error(f"--size must be at least {DIGITS} (a value starts with its number)")
    rows = [Row(store, w) for w in args.workers for store in STORES]
    runs: dict[Row, list[Run]] = {r: [] for r in rows}
    written = {w: Written() for w in args.workers}
    databases = iter(range(1 << 30))
    with (
        private_postgres("cluster-bench-") as server,
        tempfile.TemporaryDirectory() as tmp,
        asyncio.Runner(loop_factory=_loop_factory()) as runner,
        Runs(args.rounds * len(rows), "cluster") as progress,
    ):
        header = [
            machine(),
            f"PostgreSQL {server.cluster.version}, asyncpg (the PostgreSQL engine)",
        ]
        for r in range(args.rounds):
            shift = r * len(rows) // args.rounds
            for row in rows[shift:] + rows[:shift]:
                progress.start(f"round {r + 1}/{args.rounds}: {row.label}")
                variant = Variant("txnbuf", row.workers, True, "readme")
                make = None
                if row.store == "PostgreSQL":

                    def make(row: Row = row) -> PostgresTxnbuf:
                        name = f"run{next(databases)}"
                        return PostgresTxnbuf(tmp, server, name, written[row.workers])

                run = one_run(variant, args, tmp, None, runner, make)
                progress.done(f"{run.rate:,.0f} msgs/s, output checked")
                runs[row].append(run)
    text = report(args, rows, runs, written, header)
    print(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as results:
        results.write(f"\n## {header[0].split(';')[0]}\n\n{text}\n")


if __name__ == "__main__":
    main()
