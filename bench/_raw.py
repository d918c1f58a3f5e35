"""The disk's own limit: raw SQLite appends, WAL, synchronous=FULL."""

from __future__ import annotations

import os
import sqlite3
import tempfile
import time


def sqlite_rows_per_second(rows_per_txn: int = 100, seconds: float = 3.0, size: int = 100) -> float:
    """Rows/s appending ``rows_per_txn``-row transactions of ``size``-byte blobs."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "raw.db")
        db = sqlite3.connect(path, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, data BLOB NOT NULL)")
        payload = os.urandom(size)
        n = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            db.execute("BEGIN")
            db.executemany(
                "INSERT INTO t(id, data) VALUES (?, ?)",
                ((n + i, payload) for i in range(rows_per_txn)),
            )
            db.execute("COMMIT")
            n += rows_per_txn
        elapsed = time.perf_counter() - start
        db.close()
    return n / elapsed
