"""asyncpg beside psycopg 3 (async) for the PostgreSQL engine's group commit.

    python -m bench.pgdriver [--commits 2000] [--rows 1,100,1000] [--size 100] [--rounds 3]

One private PostgreSQL server (`bench._postgres`), the engine's schema
(`ledger._postgres`); each driver runs ``--commits`` group commits one after
another (one in flight, as the engine does), each one call of
``txnbuf.commit`` with ``--rows`` rows of ``--size`` bytes as arrays, in
autocommit (its own transaction, one round trip); the drivers alternate
round by round. Prints, per driver and batch size, the median over rounds
of the commits per second and of this process's CPU µs per commit (what
the broker's event loop pays: encoding the arrays, the protocol). psycopg
3 is not a dependency of txnbuf: the benchmark skips it when it is not
installed (``pip install 'psycopg[binary]'``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import statistics
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench._postgres import private_postgres
from ledger import LedgerStore

RESULTS = Path(__file__).resolve().parent / "results" / "pgdriver.md"
CALL = (
    "SELECT txnbuf.commit({0}::text, {0}::integer[], {0}::bigint[], {0}::bigint[], "
    "{0}::bigint[], {0}::bytea[], {0}::bigint[], {0}::bigint[], {0}::bigint[])"
)

Commit = Callable[[list[int], list[int], list[bytes]], Awaitable[None]]


async def asyncpg_driver(url: str) -> tuple[Commit, Callable[[], Awaitable[None]]]:
    import asyncpg

    conn = await asyncpg.connect(url)
    sql = CALL.format("${}").format(*range(1, 10))  # ($1 .. $9)

    async def commit(keys: list[int], metas: list[int], data: list[bytes]) -> None:
        await conn.execute(sql, "", [], [], keys, metas, data, [], [], [])

    return commit, conn.close


async def psycopg_driver(url: str) -> tuple[Commit, Callable[[], Awaitable[None]]]:
    import psycopg

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    sql = CALL.format("%b")

    async def commit(keys: list[int], metas: list[int], data: list[bytes]) -> None:
        await conn.execute(sql, ("", [], [], keys, metas, data, [], [], []), prepare=True)

    return commit, conn.close


DRIVERS: dict[str, Callable[[str], Awaitable[tuple[Commit, Callable[[], Awaitable[None]]]]]] = {
    "asyncpg": asyncpg_driver,
    "psycopg": psycopg_driver,
}


async def one(driver: str, url: str, ledger: int, rows: int, size: int, commits: int, first: int
              ) -> tuple[float, float]:  # fmt: skip
    commit, close = await DRIVERS[driver](url)
    try:
        payload = b"x" * size
        start, cpu = time.perf_counter(), time.process_time()
        for c in range(commits):
            base = first + c * rows
            keys = [(ledger << 40) | (base + i) for i in range(rows)]
            await commit(keys, [1] * rows, [payload] * rows)
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        await close()
    return commits / wall, cpu / commits * 1e6


Found = dict[tuple[str, int], list[tuple[float, float]]]  # (driver, rows) -> (rate, cpu) per round


async def run(args: argparse.Namespace, url: str) -> Found:
    store = await LedgerStore.open(url)
    ledgers = {}
    for driver in args.drivers:
        for rows in args.rows:
            ledgers[(driver, rows)] = (await store.open_ledger(f"{driver}/{rows}")).id
    await store.close()
    found: Found = {k: [] for k in ledgers}
    next_id = dict.fromkeys(ledgers, 0)
    for r in range(args.rounds):
        order = args.drivers if r % 2 == 0 else list(reversed(args.drivers))
        for rows in args.rows:
            for driver in order:
                key = (driver, rows)
                found[key].append(await one(driver, url, ledgers[key], rows, args.size,
                                            args.commits, next_id[key]))  # fmt: skip
                next_id[key] += args.commits * rows
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, default=2000)
    parser.add_argument(
        "--rows", type=lambda t: [int(x) for x in t.split(",")], default=[1, 100, 1000]
    )
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    args.drivers = [d for d in DRIVERS if importlib.util.find_spec(d) is not None]
    with private_postgres("pgdriver-") as server:
        found = asyncio.run(run(args, server.url()))
        version = server.cluster.version
    versions = []
    for d in args.drivers:
        module: Any = __import__(d)
        versions.append(f"{d} {module.__version__}")
    lines = [
        f"group commits through txnbuf.commit, one in flight, autocommit: {args.commits} per run, "
        f"rows of {args.size} B; {args.rounds} rounds, drivers alternating; "
        f"PostgreSQL {version}, {', '.join(versions)}",
        "",
        "| driver | rows per commit | commits/s | CPU µs per commit (this process) |",
        "|---|---:|---:|---:|",
    ]
    for (driver, rows), runs in sorted(found.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        lines.append(f"| {driver} | {rows} | {rate:,.0f} | {cpu:,.0f} |")
    text = "\n".join(lines)
    print(text)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    with open(args.results, "a") as f:
        f.write(f"\n## {datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}\n\n{text}\n")


if __name__ == "__main__":
    main()
