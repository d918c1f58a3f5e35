"""What PostgreSQL writes per message for txnbuf's record shapes: WAL bytes,
table and index bytes, rows, per transaction and per group commit, with and
without the slots' fence check.

    python -m bench.pgrows [--txns 2000] [--ledgers 1 10000]

A PostgreSQL server of its own (``initdb`` in a temporary folder, Debian's
binaries, fsync on) and one table shaped as the SQLite store's
(``entries(id bigint PRIMARY KEY, meta bigint, data bytea)``, the key
``ledger_id << 40 | entry_id``), plus the cluster's ``slots`` table (1,024
slots; ledger l in slot l mod 1,024). Each run appends round-robin to
``--ledgers`` ledgers that already hold ``--prefill`` entries each. The
records are those of the one-record local path, sized from their encoding:

- partition entry: TxnID (16 B) + an EntryBatch: producer name (43 B) and
  per message 113 B (a 100 B payload, sequence id, publish time);
- ack record: TxnID + one range of positions (48 B);
- coordinator outcome: a TransactionMetadataEntry naming one partition
  and one subscription (100 B).

Shapes: the README loop (one message consumed and produced per
transaction: 3 rows), a batch of 100 messages per transaction (3 rows), and
a plain send of one message (1 row). Each group commit is one PostgreSQL
transaction of ``--group`` transactions; with the fence it first runs
``SELECT ... FROM slots ... FOR SHARE`` on the slots it writes. WAL bytes
are measured with ``pg_current_wal_insert_lsn()`` from a CHECKPOINT, so
full-page images count as they come: each page's first change after a
checkpoint writes the whole page, and appends to many ledgers touch as many
index pages (one B-tree, each ledger a key range). Wall-clock rates are this machine's, one
connection (a shared 2-core machine: only the bytes compare across machines).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from bench._results import recorded
from bench.ctp import Postgres, PostgresCluster

PARTITION_ENTRY = 16 + 43  # TxnID + the EntryBatch's producer name
PER_MESSAGE = 113  # a SingleMessage of 100 B payload in the EntryBatch
ACK_RECORD = 48
OUTCOME = 100
SLOTS = 1024
FENCE = """
SELECT s.slot FROM slots AS s
JOIN unnest($1::int[], $2::bigint[]) AS t(slot, epoch) ON s.slot = t.slot
WHERE s.owner = 'me' AND s.epoch = t.epoch
FOR SHARE OF s
"""


@dataclass(frozen=True)
class Shape:
    name: str
    messages: int  # per transaction
    rows: tuple[int, ...]  # the sizes of its rows


SHAPES = [
    Shape("README loop (1 in, 1 out)", 1, (PARTITION_ENTRY + PER_MESSAGE, ACK_RECORD, OUTCOME)),
    Shape("batch of 100 per txn", 100, (PARTITION_ENTRY + 100 * PER_MESSAGE, ACK_RECORD, OUTCOME)),
    Shape("plain send of 1", 1, (43 + PER_MESSAGE,)),
]


async def wal_lsn(conn: Any) -> int:
    return int(await conn.fetchval("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn"))


async def measure(
    conn: Any, shape: Shape, txns: int, group: int, fence: bool, ledgers: int, prefill: int
) -> dict[str, float]:
    await conn.execute("TRUNCATE entries")
    filler = os.urandom(64)
    old = (((ledger << 40) | i, 1, filler) for ledger in range(ledgers) for i in range(prefill))
    await conn.copy_records_to_table("entries", records=old)
    await conn.execute("VACUUM ANALYZE entries")
    await conn.execute("CHECKPOINT")
    next_id = [prefill] * ledgers
    rows = 0
    payloads = [os.urandom(size) for size in shape.rows]
    size_before = await conn.fetchval("SELECT pg_total_relation_size('entries')")
    before = await wal_lsn(conn)
    started = time.perf_counter()
    for first in range(0, txns, group):
        batch = []
        slots: set[int] = set()
        for t in range(first, min(txns, first + group)):
            for r, data in enumerate(payloads):
                ledger = (t * len(payloads) + r) % ledgers
                batch.append(((ledger << 40) | next_id[ledger], 1, data))
                next_id[ledger] += 1
                slots.add(ledger % SLOTS)
        async with conn.transaction():
            if fence:
                ks = sorted(slots)
                got = await conn.fetch(FENCE, ks, [1] * len(ks))
                if len(got) != len(ks):
                    raise SystemExit("the fence refused a commit: slots table not as set up")
            await conn.executemany("INSERT INTO entries(id, meta, data) VALUES ($1, $2, $3)", batch)
        rows += len(batch)
    elapsed = time.perf_counter() - started
    wal = await wal_lsn(conn) - before
    size = await conn.fetchval("SELECT pg_total_relation_size('entries')") - size_before
    data = sum(shape.rows) * txns
    return {
        "wal_txn": wal / txns,
        "wal_msg": wal / (txns * shape.messages),
        "wal_row_over": (wal - data) / rows,
        "disk_row_over": (size - data) / rows,
        "rows_msg": rows / (txns * shape.messages),
        "txn_s": txns / elapsed,
        "rows_s": rows / elapsed,
    }


async def run(args: argparse.Namespace) -> None:
    import asyncpg

    cluster = PostgresCluster()
    server = Postgres(cluster)
    try:
        host, port = server.address.split(":")
        conn = await asyncpg.connect(host=host, port=int(port), user="postgres")
        await conn.execute(
            """
            CREATE TABLE entries (id bigint PRIMARY KEY, meta bigint NOT NULL, data bytea NOT NULL);
            CREATE TABLE slots (slot integer PRIMARY KEY, owner text, epoch bigint NOT NULL);
            INSERT INTO slots SELECT k, 'me', 1 FROM generate_series(0, $1 - 1) AS k;
            """.replace("$1", str(SLOTS))
        )
        print(f"PostgreSQL {cluster.version}, fsync on, synchronous_commit on, one connection;"
              f" {args.txns} transactions per row below, random (incompressible) bytes,"
              f" appended round-robin to the ledgers, each holding {args.prefill} entries"
              f" at the CHECKPOINT from which WAL and disk growth are measured")  # fmt: skip
        print(f"{'shape':<28} {'ledgers':>7} {'group':>5} {'fence':>5}  {'rows/msg':>8}"
              f" {'WAL B/txn':>9} {'WAL B/msg':>9} {'WAL over/row':>12} {'disk over/row':>13}"
              f" {'txn/s':>7} {'rows/s':>7}")  # fmt: skip
        for ledgers in args.ledgers:
            for shape in SHAPES:
                for group in args.group:
                    for fence in (False, True):
                        m = await measure(
                            conn, shape, args.txns, group, fence, ledgers, args.prefill
                        )
                        fenced = "yes" if fence else "no"
                        print(
                            f"{shape.name:<28} {ledgers:>7} {group:>5} {fenced:>5}"
                            f"  {m['rows_msg']:>8.2f} {m['wal_txn']:>9.0f} {m['wal_msg']:>9.0f}"
                            f" {m['wal_row_over']:>12.0f} {m['disk_row_over']:>13.0f}"
                            f" {m['txn_s']:>7.0f} {m['rows_s']:>7.0f}",
                            flush=True,
                        )
        await conn.close()
    finally:
        server.stop()
        cluster.remove()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pgrows", description=__doc__)
    ap.add_argument("--txns", type=int, default=2000)
    ap.add_argument("--group", type=int, nargs="+", default=[1, 100])
    ap.add_argument("--ledgers", type=int, nargs="+", default=[1, 10000])
    ap.add_argument("--prefill", type=int, default=20, help="entries per ledger before")
    args = ap.parse_args(argv)
    command = "python -m bench.pgrows " + " ".join(sys.argv[1:] if argv is None else argv)
    with recorded("pgrows", command.strip()):
        asyncio.run(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
