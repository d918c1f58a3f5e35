"""The writer process of a `LedgerStore`: every write to one database file.

Run by the store as ``python _writer.py DB_PATH PARENT_PID LOCK_WAIT`` (standard library only, so
that it starts fast and imports nothing of the broker). It reads requests on
stdin and answers on stdout, both as frames: a 4-byte little-endian length,
then a pickled tuple.

Requests, each with a sequence number ``seq`` the store counts up from 1:

    (seq, "write", rows, trims)  rows: [(key, meta, data)], trims:
                                 [(ledger_id, first, next)]
    (seq, "create", name)        answer: the ledger's id
    (seq, "delete", ledger_id)

Answers: ``(seq, None, result)``, or ``(seq, "error text", None)``. The first
frame written is ``(0, None, "ready")``, once the schema exists. A write's
result is ``(commits, rows, seconds)``: the group commits done so far, and
the rows and duration of the group commit that wrote it (inserts, trims
and the COMMIT with its fsync).

Group commit happens here: the writes that arrived while a commit was
running are committed together, as one SQLite transaction (one fsync, WAL
with ``synchronous=FULL``), in the order they arrived. A commit needs no
interpreter lock shared with the broker's event loop, so it takes about as
long as the disk does, however busy the loop is (a thread of the broker
would wait for the loop to let go of the GIL after each step back from
SQLite).

Fail-stop: once a commit failed, every later write is answered with that
error and nothing more is written (see `LedgerStore._fail`).

The process dies with the broker: the kernel kills it when its parent dies
(``PR_SET_PDEATHSIG``), and it exits when stdin closes. It ignores SIGINT
and SIGTERM, which reach it with its broker's when they are sent to the
process group (Ctrl-C): it must outlive the broker's clean stop. It holds an exclusive
lock on ``DB_PATH + ".lock"`` for its life, so that a restarted broker's
writer cannot open the database while an old one is still running.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import os
import pickle
import select
import signal
import sqlite3
import struct
import sys
import time
from typing import Any

LENGTH = struct.Struct("<I")
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

ENTRY_BITS = 40
MAX_ENTRY_ID = (1 << ENTRY_BITS) - 1
_PR_SET_PDEATHSIG = 1
PIPE_SIZE = 1 << 20  # bytes (Linux's default pipe-max-size)


_STALL = os.environ.get("TXNBUF_WRITER_STALL", "")


def key(ledger_id: int, entry_id: int) -> int:
    return (ledger_id << ENTRY_BITS) | entry_id


def frame(message: Any) -> bytes:
    """``message`` as one frame: its pickled length, then the pickle."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(data)) + data


def take_frames(buffer: bytearray) -> list[Any]:
    """The messages of the complete frames at the start of ``buffer``, which
    keeps only what follows them (the start of a frame still arriving)."""
    out = []
    pos = 0
    while len(buffer) - pos >= LENGTH.size:
        (n,) = LENGTH.unpack_from(buffer, pos)
        start = pos + LENGTH.size
        if len(buffer) - start < n:
            break
        out.append(pickle.loads(buffer[start : start + n]))
        pos = start + n
    del buffer[:pos]
    return out


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
    while _STALL and os.path.exists(_STALL):  # (test-only: see `ledger.faults`)
        time.sleep(0.01)
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


class Requests:
    """Frames read from a file descriptor."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()
        self.eof = False

    def take(self) -> list[tuple[Any, ...]]:
        """Wait for one complete request, then return every request complete
        by now; an empty list once the other end closed."""
        while not self._complete() and not self.eof:
            self._read()
        while not self.eof and select.select([self.fd], [], [], 0)[0]:
            self._read()
        return take_frames(self.buffer)

    def _read(self) -> None:
        chunk = os.read(self.fd, 1 << 20)
        if chunk:
            self.buffer += chunk
        else:
            self.eof = True

    def _complete(self) -> bool:
        if len(self.buffer) < LENGTH.size:
            return False
        (n,) = LENGTH.unpack_from(self.buffer)
        return len(self.buffer) - LENGTH.size >= int(n)


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent dies (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: stdin closing still ends the process


def widen(fd: int) -> None:
    """Give the pipe on ``fd`` room for a whole write of large entries (a
    send of 1,000 messages is ~110 KB): through Linux's default 64 KB, one
    went over in several turns of both processes (0.8 ms a write, not 0.5)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError):
        pass  # (not Linux, or above /proc/sys/fs/pipe-max-size: keep the default)


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
    raw.executescript(SCHEMA)
    return raw


def serve(path: str, parent: int, lock_wait: float) -> None:
    # Ctrl-C in a terminal, or a supervisor stopping the process group,
    # signals every process of the group: this one goes when the broker,
    # stopping cleanly, has written what it queued and closes stdin.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    die_with_parent()
    if os.getppid() != parent:
        return  # the parent died before the line above
    out = sys.stdout.fileno()
    for fd in (sys.stdin.fileno(), out):
        widen(fd)
    try:
        lock(path, lock_wait)
        raw = connect(path)
    except Exception as exc:
        os.write(out, frame((0, f"{type(exc).__name__}: {exc}", None)))
        return
    os.write(out, frame((0, None, "ready")))
    requests = Requests(sys.stdin.fileno())
    writer = Writer(raw)
    while True:
        # Wait for one request, then take every other one that has arrived:
        # the writes among them are one group commit.
        batch = requests.take()
        if not batch:
            return  # stdin closed: the store is closed (or the broker died)
        data = b"".join([frame(answer) for answer in writer.handle(batch)])
        while data:
            data = data[os.write(out, data) :]


if __name__ == "__main__":
    serve(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
