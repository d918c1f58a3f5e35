"""Dual write, the KIP-939 way: a database and a txnbuf topic updated as one.

Each batch of orders is written to a SQLite database AND published as
events to a topic, and either both happen or neither does, whatever crashes
where. The recipe (KIP-939 §Motivation):

    1. begin the database transaction
    2. begin_transaction() in txnbuf, send the events
    3. prepare_transaction() -> PreparedTxnState (the events are durable and
       the transaction PREPARED: it survives a broker restart, never times out)
    4. write the orders, and the PreparedTxnState as a string, in the database
    5. commit the database transaction
    6. commit_transaction() in txnbuf

Recovery, on every start: init_transactions(keep_prepared_txn=True) keeps a
prepared transaction a crash left behind, and complete_transaction(the
state stored in the database) commits it if the database committed its
batch (it holds that state), else aborts it (the batch is written again).

    txnbuf serve --allow-2pc &                  # 2PC must be allowed
    python examples/dual_write.py --orders 500 --db orders.db

Options: --url, --db, --topic, --orders N (orders 0..N-1 in all), --batch,
--crash-after-db-commit K / --crash-before-db-commit K (die with SIGKILL in
batch K, after or before step 5: what the tests do; run again to recover).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sqlite3
import sys

from client import Client, PreparedTxnState

TRANSACTIONAL_ID = "orders-dual-writer"


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)  # (transactions by hand)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=FULL")
    db.execute("CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, amount INTEGER)")
    db.execute(
        "CREATE TABLE IF NOT EXISTS txnbuf_state "
        "(transactional_id TEXT PRIMARY KEY, prepared TEXT NOT NULL)"
    )
    return db


def stored_state(db: sqlite3.Connection) -> PreparedTxnState:
    row = db.execute(
        "SELECT prepared FROM txnbuf_state WHERE transactional_id = ?", (TRANSACTIONAL_ID,)
    ).fetchone()
    return PreparedTxnState(row[0] if row else None)


def crash() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(args: argparse.Namespace) -> int:
    db = open_db(args.db)
    async with Client(args.url) as client:
        producer = await client.create_transactional_producer(TRANSACTIONAL_ID, enable_2pc=True)
        # Recovery: finish what a crash left prepared, as the database decided.
        await producer.init_transactions(keep_prepared_txn=True)
        await producer.complete_transaction(stored_state(db))
        done = db.execute("SELECT COALESCE(MAX(id), -1) FROM orders").fetchone()[0] + 1
        print(f"recovered: {done} orders in the database")
        batch_no = 0
        for first in range(done, args.orders, args.batch):
            orders = [(i, i * 10) for i in range(first, min(first + args.batch, args.orders))]
            db.execute("BEGIN IMMEDIATE")  # 1
            await producer.begin_transaction()  # 2
            for order_id, amount in orders:
                await producer.send(args.topic, b"order %d amount %d" % (order_id, amount),
                                    key=str(order_id))  # fmt: skip
            state = await producer.prepare_transaction()  # 3
            db.executemany("INSERT INTO orders VALUES (?, ?)", orders)  # 4
            db.execute(
                "INSERT OR REPLACE INTO txnbuf_state VALUES (?, ?)", (TRANSACTIONAL_ID, str(state))
            )
            if batch_no == args.crash_before_db_commit:
                crash()
            db.execute("COMMIT")  # 5
            if batch_no == args.crash_after_db_commit:
                crash()
            await producer.commit_transaction()  # 6
            batch_no += 1
        total = db.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
        print(f"done: {total} orders in the database and as events in {args.topic!r}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:6650")
    parser.add_argument("--db", default="orders.db")
    parser.add_argument("--topic", default="order-events")
    parser.add_argument("--orders", type=int, default=500)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--crash-after-db-commit", type=int, default=-1, metavar="K")
    parser.add_argument("--crash-before-db-commit", type=int, default=-1, metavar="K")
    sys.exit(asyncio.run(main(parser.parse_args())))
