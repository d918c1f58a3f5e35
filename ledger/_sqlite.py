"""The SQLite engine of a `LedgerStore`: one database file, written by a
writer thread of the store's own (`ledger._writer` does the work), read
through an aiosqlite connection.

The store hands the engine what a turn of the event loop appended, as one
request; `SqliteEngine.submit` puts it in the writer thread's list under a
lock. The thread takes every request waiting, commits the writes among
them together, as one SQLite transaction (WAL, ``synchronous=FULL``: one
fsync), and hands the answers back to the event loop in one
``call_soon_threadsafe``. Requests are pipelined: the store does not wait
for one answer before it sends the next, and they are answered in order.
SQLite runs without the interpreter lock; a group commit of appends is one
statement, so the thread takes the lock about twice per group commit (to
start the statement, and to answer), never per row. Nothing is pickled or
copied on the way: the rows the store built are the ones SQLite binds.

Reads that miss the in-memory tail cache go to an aiosqlite connection
used for nothing else (each read is one hop to its thread and back); in
WAL mode they never queue behind a commit.

Layout: table ``ledgers(id, name, first_entry_id, next_entry_id)`` and
table ``entries(id, meta, data)`` whose integer primary key is
``ledger_id << 40 | entry_id``: one B-tree, each ledger a contiguous key
range.

SQLite has no slots: a store on it is never fenced (one broker per file,
which the writer's lock file enforces).
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from ledger import _writer
from ledger._base import EngineSink, Entry, LedgerError

__all__ = ["SqliteEngine"]

log = logging.getLogger(__name__)

_MAX_ENTRY_ID = _writer.MAX_ENTRY_ID
_key = _writer.key
STOP_WAIT = 10.0  # seconds a closing store waits for its writer thread to end
_T = TypeVar("_T")


async def _on_thread(conn: aiosqlite.Connection, fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(sqlite3_connection, *args)`` on the connection's own thread.

    aiosqlite has no public call for "run this function on your thread";
    `Connection._execute` is that call (checked against aiosqlite 0.20-0.22,
    pinned in pyproject.toml). This is the only place that uses it.
    """
    raw: sqlite3.Connection = conn._conn
    result: _T = await conn._execute(fn, raw, *args)  # type: ignore[no-untyped-call]
    return result


def _read_catalog(raw: sqlite3.Connection, pack: Callable[[int, int, int], int]) -> dict[str, int]:
    """Every ledger's name -> its packed ids (``pack``), on the reader's
    thread: each with its greatest entry key, in one statement (one range
    seek per ledger), row by row (no list of every row at once: the start of
    a store of many ledgers leaves less memory behind)."""
    catalog: dict[str, int] = {}
    for ledger_id, name, first, nxt, max_key in raw.execute(
        "SELECT id, name, first_entry_id, next_entry_id, (SELECT max(e.id) FROM "
        "entries AS e WHERE e.id >= ledgers.id << ? AND e.id <= (ledgers.id << ?) + ?) "
        "FROM ledgers",
        (_writer.ENTRY_BITS, _writer.ENTRY_BITS, _MAX_ENTRY_ID),
    ):
        # next_entry_id is written by trims only (so that ids never repeat
        # once every entry is trimmed); otherwise the entries tell.
        nxt = max(nxt, first)
        if max_key is not None:
            nxt = max(nxt, (max_key & _MAX_ENTRY_ID) + 1)
        catalog[name] = pack(ledger_id, first, nxt)
    return catalog


class _Reads:
    """Reads, through an aiosqlite connection used for nothing else."""

    _reader: aiosqlite.Connection

    async def load_catalog(self, pack: Callable[[int, int, int], int]) -> dict[str, int]:
        return await _on_thread(self._reader, _read_catalog, pack)

    async def read(self, ledger_id: int, start: int, end: int) -> list[Entry]:
        def read(raw: sqlite3.Connection) -> list[Entry]:
            cur = raw.execute(
                "SELECT id, meta, data FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger_id, start), _key(ledger_id, end)),
            )
            return [Entry(k & _MAX_ENTRY_ID, m, d) for k, m, d in cur]

        return await _on_thread(self._reader, read)

    async def read_meta(self, ledger_id: int) -> list[tuple[int, int]]:
        def read(raw: sqlite3.Connection) -> list[tuple[int, int]]:
            cur = raw.execute(
                "SELECT id, meta FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger_id, 0), _key(ledger_id, _MAX_ENTRY_ID)),
            )
            return [(k & _MAX_ENTRY_ID, m) for k, m in cur]

        return await _on_thread(self._reader, read)

    async def read_sizes(self, ledger_id: int) -> list[tuple[int, int]]:
        def read(raw: sqlite3.Connection) -> list[tuple[int, int]]:
            cur = raw.execute(
                "SELECT id, length(data) FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger_id, 0), _key(ledger_id, _MAX_ENTRY_ID)),
            )
            return [(k & _MAX_ENTRY_ID, n) for k, n in cur]

        return await _on_thread(self._reader, read)


def _name_thread(name: str) -> None:
    """Give the calling thread ``name`` in the kernel (``/proc/PID/task/TID/comm``),
    so that its CPU time can be told apart (Linux; elsewhere nothing)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(15, name.encode()[:15], 0, 0, 0)  # (PR_SET_NAME)
    except (OSError, AttributeError):
        pass


WRITER_THREAD = "txnbuf-writer"  # the writer thread's name in the kernel


class _WriterThread:
    """The writer of a `SqliteEngine`: `ledger._writer.Writer` on a thread
    of this process, fed under a lock, answering through the event loop's
    ``call_soon_threadsafe``."""

    def __init__(self, path: str, lock_wait: float) -> None:
        self._loop = asyncio.get_running_loop()
        self.sink: EngineSink | None = None
        self._cond = threading.Condition(threading.Lock())
        self._requests: list[tuple[Any, ...]] = []
        self._stopping = False
        self._abandoned = False
        self.ready: asyncio.Future[None] = self._loop.create_future()
        self.exited: asyncio.Future[None] = self._loop.create_future()
        threading.Thread(
            target=self._run, args=(path, lock_wait), name=WRITER_THREAD, daemon=True
        ).start()

    def submit(self, request: tuple[Any, ...]) -> None:
        with self._cond:
            self._requests.append(request)
            self._cond.notify()

    async def stop(self) -> None:
        """Answer what was submitted, then end the thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        try:
            await asyncio.wait_for(asyncio.shield(self.exited), STOP_WAIT)
        except TimeoutError:
            log.error("the ledger writer thread did not stop; leaving it")

    def abandon(self) -> None:
        """Answer nothing more; the thread ends after the commit under way."""
        self._abandoned = True
        with self._cond:
            self._stopping = True
            self._requests.clear()
            self._cond.notify()

    # -- on the writer thread -----------------------------------------------------------

    def _run(self, path: str, lock_wait: float) -> None:
        _name_thread(WRITER_THREAD)
        lock_fd = -1
        raw: sqlite3.Connection | None = None
        try:
            try:
                lock_fd = _writer.lock(path, lock_wait)
                raw = _writer.connect(path)
            except Exception as exc:
                self._call(self._started, str(exc) or type(exc).__name__)
                return
            self._call(self._started, None)
            self._serve(_writer.Writer(raw))
        except BaseException as exc:  # (a bug: the store fails, as after a failed commit)
            log.exception("the ledger writer thread failed")
            self._call(self._lost, f"the writer thread failed: {exc!r}")
        finally:
            if raw is not None:
                raw.close()
            if lock_fd >= 0:
                os.close(lock_fd)
            self._call(self._finished)

    def _serve(self, writer: _writer.Writer) -> None:
        cond = self._cond
        while True:
            with cond:
                while not self._requests and not self._stopping:
                    cond.wait()
                batch, self._requests = self._requests, []
            if not batch:
                return  # stopping, and everything answered
            answers = writer.handle(batch)
            if not self._abandoned:
                self._call(self._deliver, answers)

    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            self._loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # (the event loop is closed: nobody is listening)
            pass

    # -- back on the event loop ---------------------------------------------------------

    def _started(self, error: str | None) -> None:
        if self.ready.done():
            return
        if error is None:
            self.ready.set_result(None)
        else:
            self.ready.set_exception(LedgerError(error))

    def _deliver(self, answers: list[_writer.Answer]) -> None:
        sink = self.sink
        if sink is None or self._abandoned:
            return
        for seq, error, result in answers:
            sink._answered(seq, error, result)

    def _lost(self, reason: str) -> None:
        if self.sink is not None and not self._abandoned:
            self.sink._engine_lost(reason)

    def _finished(self) -> None:
        if not self.ready.done():
            self.ready.set_exception(LedgerError("the writer thread stopped before it was ready"))
        if not self.exited.done():
            self.exited.set_result(None)


class SqliteEngine(_Reads):
    """A SQLite database file and its writer thread (see the module docstring)."""

    fences = False  # (no slots: `LedgerStore` computes none for its writes)

    def __init__(self, path: Path, writer: _WriterThread, reader: aiosqlite.Connection) -> None:
        self.path = path
        self.location = str(path)
        self._writer = writer
        self._reader = reader

    @classmethod
    async def open(cls, path: Path, lock_wait: float) -> SqliteEngine:
        """Start the writer thread on ``path`` (it locks the database and
        creates the schema) and open the reader; `LedgerError` if the writer
        cannot start, for instance when another broker still holds this
        database after ``lock_wait`` seconds."""
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = _WriterThread(str(path), lock_wait)
        try:
            await writer.ready
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            await writer.stop()
            raise
        return cls(path, writer, reader)

    def attach(self, sink: EngineSink) -> None:
        self._writer.sink = sink

    def submit(self, seq: int, request: tuple[Any, ...]) -> None:
        self._writer.submit((seq, *request))

    async def close(self) -> None:
        """Stop the writer thread (it answers what it has first) and the reader."""
        await self._writer.stop()
        await self._reader.close()

    async def abandon(self) -> None:
        """Answer nothing more, let the thread go, close the reader."""
        self._writer.abandon()
        await self._reader.close()
