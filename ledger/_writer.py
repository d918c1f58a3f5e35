"""The writes of a SQLite `LedgerStore`, done by its writer thread (`ledger._sqlite`).

Requests, each with a sequence number ``seq`` the store counts up from 1:

    (seq, "write", rows, trims)  rows: [(key, meta, data)], trims:
                                 [(ledger_id, first, next)]
    (seq, "create", name)        answer: the ledger's id
    (seq, "delete", ledger_id)

Answers: ``(seq, None, result)``, or ``(seq, "error text", None)``. A
write's result is ``(commits, rows, seconds)``: the group commits done so
far, and the rows and duration of the group commit that wrote it (inserts,
trims and the COMMIT with its fsync).

Group commit happens here: the writes that arrived while a commit was
running are committed together, as one SQLite transaction (one fsync, WAL
with ``synchronous=FULL``), in the order they arrived. A group commit of
appends alone is one statement (a multi-row INSERT in autocommit mode):
one call into SQLite, which runs without the interpreter lock, so the
writer thread needs the lock once per commit, not once per row or step.

Fail-stop: once a commit failed, every later write is answered with that
error and nothing more is written (see `LedgerStore._fail`).

The writer holds an exclusive lock on ``DB_PATH + ".lock"`` while the
store is open (`lock`), so that a second broker on the same data
directory cannot open the database; the kernel lets go of it when the
broker's process ends, however it ends.
"""

from __future__ import annotations

import fcntl
import functools
import os
import sqlite3
import time
from typing import Any

Answer = tuple[int, str | None, Any]  # (seq, error text or None, result)

SCHEMA = """
CREATE TABLE IF NOT EXISTS ledgers (
    id INTEGER PRIMARY KEY,
    name TEXT UNIQUE NOT NULL,
    first_entry_id INTEGER NOT NULL DEFAULT 0,
    next_entry_id INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY,
    meta INTEGER NOT NULL,
    data BLOB NOT NULL
);
"""

# The format of the data a broker keeps in the database (the tables above
# and the records of every ledger), in SQLite's ``user_version``. A writer
# opens a database of this format or an older one it knows how to bring up
# to date (`UPGRADES`), stamps it with this one, and refuses a newer one.
# Version 0 is a database from before the stamp: the same layout as 1.
FORMAT_VERSION = 1
UPGRADES: dict[int, str] = {0: ""}  # from version -> the SQL that makes it version + 1

ENTRY_BITS = 40
MAX_ENTRY_ID = (1 << ENTRY_BITS) - 1


_STALL = os.environ.get("TXNBUF_WRITER_STALL", "")


def key(ledger_id: int, entry_id: int) -> int:
    return (ledger_id << ENTRY_BITS) | entry_id


@functools.lru_cache(maxsize=512)
def insert_sql(rows: int) -> str:
    return "INSERT INTO entries(id, meta, data) VALUES " + ",".join(["(?,?,?)"] * rows)


def insert(raw: sqlite3.Connection, rows: list[tuple[int, int, bytes]], per: int) -> None:
    """Insert ``rows`` as multi-row INSERTs of at most ``per`` rows each."""
    for i in range(0, len(rows), per):
        chunk = rows[i : i + per]
        raw.execute(insert_sql(len(chunk)), [x for row in chunk for x in row])


def commit(
    raw: sqlite3.Connection,
    rows: list[tuple[int, int, bytes]],
    trims: list[tuple[int, int, int]],
) -> None:
    """One group commit: inserts, trims, one COMMIT. Appends alone that fit
    one statement go in autocommit mode: their own transaction, one step."""
    if _STALL and os.path.exists(_STALL):  # (test-only: see `ledger.faults`)
        held = _STALL + ".held"
        with open(held, "w"):
            pass
        while os.path.exists(_STALL):
            time.sleep(0.01)
        os.unlink(held)
    per = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 3  # rows in one statement
    if not trims and len(rows) <= per:
        if rows:
            insert(raw, rows, per)
        return
    raw.execute("BEGIN IMMEDIATE")
    try:
        insert(raw, rows, per)
        for ledger_id, first, nxt in trims:
            raw.execute(
                "DELETE FROM entries WHERE id >= ? AND id < ?",
                (key(ledger_id, 0), key(ledger_id, first)),
            )
            raw.execute(
                "UPDATE ledgers SET first_entry_id = ?, next_entry_id = ? WHERE id = ?",
                (first, nxt, ledger_id),
            )
        raw.execute("COMMIT")
    except BaseException:
        raw.execute("ROLLBACK")
        raise


def create(raw: sqlite3.Connection, name: str) -> int:
    # OR IGNORE: the ledger may exist already (a store that created it and
    # was stopped before it learned the id).
    raw.execute("INSERT OR IGNORE INTO ledgers(name) VALUES (?)", (name,))
    row = raw.execute("SELECT id FROM ledgers WHERE name = ?", (name,)).fetchone()
    return int(row[0])


def delete(raw: sqlite3.Connection, ledger_id: int) -> None:
    raw.execute("BEGIN IMMEDIATE")
    try:
        raw.execute(
            "DELETE FROM entries WHERE id >= ? AND id <= ?",
            (key(ledger_id, 0), key(ledger_id, MAX_ENTRY_ID)),
        )
        raw.execute("DELETE FROM ledgers WHERE id = ?", (ledger_id,))
        raw.execute("COMMIT")
    except BaseException:
        raw.execute("ROLLBACK")
        raise


def lock_path(path: str) -> str:
    """The lock file of the database ``path``: its writer holds it exclusively."""
    return path + ".lock"


def lock(path: str, wait: float) -> int:
    """Lock `lock_path`, waiting at most ``wait`` seconds for another
    writer of the database to go."""
    fd = os.open(lock_path(path), os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{path} is in use by another process (its writer holds {path}.lock)"
                ) from None
            time.sleep(0.01)


class FormatError(Exception):
    """The database is of a format this txnbuf does not read."""


def check_format(version: int, path: str) -> None:
    """Raise `FormatError` if this txnbuf cannot read format ``version``."""
    if version > FORMAT_VERSION:
        raise FormatError(
            f"{path} holds data of format {version}, written by a newer txnbuf; this one "
            f"reads formats up to {FORMAT_VERSION}: run the newer txnbuf, or restore a backup "
            "taken before the upgrade"
        )
    if version < 0 or any(v not in UPGRADES for v in range(version, FORMAT_VERSION)):
        raise FormatError(f"{path} holds data of format {version}, which this txnbuf cannot read")


def open_format(raw: sqlite3.Connection, path: str) -> None:
    """Create the schema, or check and bring up to date the format of an
    existing database (`FORMAT_VERSION`), in one transaction."""
    raw.execute("BEGIN IMMEDIATE")
    try:
        version = raw.execute("PRAGMA user_version").fetchone()[0]
        check_format(version, path)
        for statement in SCHEMA.split(";"):
            if statement.strip():
                raw.execute(statement)
        for v in range(version, FORMAT_VERSION):
            for statement in UPGRADES[v].split(";"):
                if statement.strip():
                    raw.execute(statement)
        if version != FORMAT_VERSION:
            raw.execute(f"PRAGMA user_version = {FORMAT_VERSION}")
        raw.execute("COMMIT")
    except BaseException:
        raw.execute("ROLLBACK")
        raise


class Writer:
    """Answers requests on one connection; fail-stop after a failed commit."""

    def __init__(self, raw: sqlite3.Connection) -> None:
        self.raw = raw
        self.failed: str | None = None
        self.commits = 0  # group commits done (each write's answer carries the count)

    def handle(self, batch: list[tuple[Any, ...]]) -> list[Answer]:
        """Answers to ``batch``, in order: consecutive writes as one group
        commit, consecutive creations as one transaction."""
        answers: list[Answer] = []
        writes: list[tuple[Any, ...]] = []
        creates: list[tuple[Any, ...]] = []
        for request in batch:
            kind = request[1]
            if kind != "create":  # (what was asked before goes first)
                answers.extend(self.create(creates))
                creates = []
            if kind != "write":
                answers.extend(self.write(writes))
                writes = []
            if kind == "write":
                writes.append(request)
            elif kind == "create":
                creates.append(request)
            else:
                seq, _, ledger_id = request
                try:
                    if self.failed is not None:
                        raise RuntimeError(self.failed)
                    delete(self.raw, ledger_id)
                    answers.append((seq, None, None))
                except Exception as exc:
                    answers.append((seq, f"{type(exc).__name__}: {exc}", None))
        answers.extend(self.write(writes))
        answers.extend(self.create(creates))
        return answers

    def create(self, creates: list[tuple[Any, ...]]) -> list[Answer]:
        """Create the ledgers of ``creates`` in one transaction (one fsync:
        a broker creating many topics at once creates their ledgers together)."""
        if not creates:
            return []
        try:
            if self.failed is not None:
                raise RuntimeError(self.failed)
            self.raw.execute("BEGIN IMMEDIATE")
            try:
                ids = [create(self.raw, name) for _, _, name in creates]
                self.raw.execute("COMMIT")
            except BaseException:
                self.raw.execute("ROLLBACK")
                raise
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            return [(seq, error, None) for seq, _, _ in creates]
        return [(seq, None, ledger_id) for (seq, _, _), ledger_id in zip(creates, ids, strict=True)]

    def write(self, writes: list[tuple[Any, ...]]) -> list[Answer]:
        if not writes:
            return []
        if self.failed is None:
            try:
                rows = [row for w in writes for row in w[2]]
                started = time.perf_counter()
                commit(self.raw, rows, [trim for w in writes for trim in w[3]])
                took = time.perf_counter() - started
                self.commits += 1
                result = (self.commits, len(rows), took)
                return [(w[0], None, result) for w in writes]
            except Exception as exc:
                self.failed = f"{type(exc).__name__}: {exc}"
        return [(w[0], self.failed, None) for w in writes]


def connect(path: str) -> sqlite3.Connection:
    """The writer's connection to ``path``: WAL, ``synchronous=FULL``, the schema made."""
    raw = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    raw.execute("PRAGMA journal_mode=WAL")
    raw.execute("PRAGMA synchronous=FULL")
    open_format(raw, path)
    return raw
