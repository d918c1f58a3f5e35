"""Ledgers in one SQLite database, written by group commits.

A ledger is an append-only sequence of entries with increasing entry ids,
read by range and trimmed from the front. Many ledgers share one database
file (a `LedgerStore`). Appends and trims wait in a queue; a group commit
takes everything queued when it starts and commits it as one SQLite
transaction: one fsync (WAL, ``synchronous=FULL``) for all of them. A future
resolves only after its commit is on disk.

The group commit takes the queue on the writer connection's thread, not in
the event loop: a commit is queued to that thread as soon as something waits
and no commit is queued yet, so the thread goes from one commit to the next
without waiting for the event loop (which, when busy, took as long as the
commit itself to hand the thread its next batch: 0.8 ms p50 at 4 CTP
workers, against 0.6 ms for the commit).

Append order is durability order, across all the ledgers of a store: an
append made after another (in the event loop's order) is committed in the
same SQLite transaction or a later one, and never without it, because a
failed commit stops the store (fail-stop: every later write is refused until
it is reopened). The coordinator relies on this to let participants write
right behind its log records when they share a store (see `tc`).

Each aiosqlite call is a hop to its thread and back (~80-100 us), so a whole
group commit runs as one function on the writer connection's thread (see
`LedgerStore._commit_queued`). Reads that miss the in-memory tail cache go to a
second, read-only connection, so catching-up readers never queue behind a
commit.

Layout: table ``ledgers(id, name, first_entry_id, next_entry_id)`` and
table ``entries(id, meta, data)`` whose integer primary key is
``ledger_id << 40 | entry_id``: one B-tree, each ledger a contiguous key
range. ``meta`` is a small integer the ledger's user gives each entry (the
partition stores its message count there) so that start-up can learn entry
sizes without reading blobs.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import logging
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

__all__ = ["Entry", "Ledger", "LedgerError", "LedgerStore", "unawaited"]

log = logging.getLogger(__name__)

# How long a lazy append (see `Ledger.append`) waits for a group commit to
# go with before it starts one of its own.
LAZY_DELAY = 0.005

_ENTRY_BITS = 40
_MAX_ENTRY_ID = (1 << _ENTRY_BITS) - 1
_T = TypeVar("_T")

_SCHEMA = """
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


class LedgerError(Exception):
    """The store failed to make an operation durable (or is closed)."""


def unawaited(f: asyncio.Future[Any]) -> None:
    """Done callback of a write nobody awaits: mark its error seen (a failed
    write stops the store, and whatever comes after it reports that)."""
    if not f.cancelled():
        f.exception()


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: int
    meta: int
    data: bytes


def _key(ledger_id: int, entry_id: int) -> int:
    return (ledger_id << _ENTRY_BITS) | entry_id


async def _on_thread(conn: aiosqlite.Connection, fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(sqlite3_connection, *args)`` on the connection's own thread.

    aiosqlite has no public call for "run this function on your thread";
    `Connection._execute` is that call (checked against aiosqlite 0.20-0.22,
    pinned in pyproject.toml). This is the only place that uses it.
    """
    raw: sqlite3.Connection = conn._conn
    result: _T = await conn._execute(fn, raw, *args)  # type: ignore[no-untyped-call]
    return result


@dataclass(slots=True)
class _Append:
    ledger: Ledger
    meta: int
    data: bytes
    future: asyncio.Future[int]
    entry_id: int = -1


@dataclass(slots=True)
class _Trim:
    ledger: Ledger
    before: int
    future: asyncio.Future[None]


@dataclass(slots=True)
class _Done:
    """A group commit that succeeded: its operations, in order, the ledgers
    it trimmed (new first entry ids) and how many entries it added."""

    batch: list[_Append | _Trim]
    trims: dict[Ledger, int]
    appended: int


class _Failed(Exception):
    """A group commit failed (raised on the writer thread)."""

    def __init__(self, batch: list[_Append | _Trim], error: BaseException) -> None:
        super().__init__(str(error))
        self.batch = batch
        self.error = error


class _Refused(Exception):
    """A group commit queued behind one that failed: it wrote nothing."""


@functools.lru_cache(maxsize=512)
def _insert_sql(rows: int) -> str:
    return "INSERT INTO entries(id, meta, data) VALUES " + ",".join(["(?,?,?)"] * rows)


def _insert(raw: sqlite3.Connection, rows: list[tuple[int, int, bytes]], per: int) -> None:
    """Insert ``rows`` as multi-row INSERTs of at most ``per`` rows each."""
    for i in range(0, len(rows), per):
        chunk = rows[i : i + per]
        raw.execute(_insert_sql(len(chunk)), [x for row in chunk for x in row])


def _commit(
    raw: sqlite3.Connection,
    rows: list[tuple[int, int, bytes]],
    heads: list[tuple[int, int, int]],
) -> None:
    """One group commit, run on the writer thread: inserts, trims, one COMMIT.

    The sqlite3 module lets go of the GIL around every step of a statement
    (every row of an ``executemany``) and must take it back after each; while
    the event loop's thread is busy that wait can reach the interpreter's
    switch interval, every time. So the rows go in as one multi-row INSERT,
    and a commit of appends alone is that one statement in autocommit mode:
    its own transaction, one step, one fsync.
    """
    per = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // 3  # rows in one statement
    if not heads and len(rows) <= per:
        _insert(raw, rows, per)
        return
    raw.execute("BEGIN IMMEDIATE")
    try:
        _insert(raw, rows, per)
        for ledger_id, first, nxt in heads:
            raw.execute(
                "DELETE FROM entries WHERE id >= ? AND id < ?",
                (_key(ledger_id, 0), _key(ledger_id, first)),
            )
            raw.execute(
                "UPDATE ledgers SET first_entry_id = ?, next_entry_id = ? WHERE id = ?",
                (first, nxt, ledger_id),
            )
        raw.execute("COMMIT")
    except BaseException:
        raw.execute("ROLLBACK")
        raise


class Ledger:
    """One append-only ledger. Get it from `LedgerStore.open_ledger`.

    ``first_entry_id`` is the first entry not trimmed and ``last_entry_id``
    the last durable one (``first - 1`` when the ledger is empty). Readers
    that have caught up are served from a tail cache of recent entries.
    """

    def __init__(self, store: LedgerStore, ledger_id: int, name: str, first: int, nxt: int) -> None:
        self.store = store
        self.id = ledger_id
        self.name = name
        self.first_entry_id = first
        self.last_entry_id = nxt - 1
        # Owned by the writer thread (see `LedgerStore._commit_queued`): the
        # next id to assign, in commit order, and the first entry not trimmed
        # as committed (``first_entry_id`` follows it in the event loop).
        self._next = nxt
        self._first = first
        self._cache: collections.deque[Entry] = collections.deque()
        self._cache_bytes = 0
        self._waiters: list[asyncio.Future[None]] = []
        self._listeners: list[Callable[[Ledger, list[Entry]], None]] = []

    def __repr__(self) -> str:
        return f"Ledger({self.name!r}, first={self.first_entry_id}, last={self.last_entry_id})"

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    def append(self, data: bytes, meta: int = 1, *, lazy: bool = False) -> asyncio.Future[int]:
        """Queue one entry; the future gives its entry id once it is durable.

        ``lazy``: nobody is waiting for this entry to be durable soon (a
        record answered before it is durable, or written after the answer).
        It starts no group commit of its own: it goes with the next one,
        or alone after `LAZY_DELAY` if none comes. Order is kept either way.
        """
        return self.store._append(self, data, meta, lazy)

    def trim(self, before: int) -> asyncio.Future[None]:
        """Delete every entry with an id below ``before`` (durably)."""
        return self.store._trim(self, before)

    def add_listener(self, callback: Callable[[Ledger, list[Entry]], None]) -> None:
        """Call ``callback(ledger, new_entries)`` after each commit that added entries.

        Listeners run before the appenders' futures resolve, in the order
        they were added.
        """
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[Ledger, list[Entry]], None]) -> None:
        if callback in self._listeners:
            self._listeners.remove(callback)

    async def wait_for(self, entry_id: int) -> None:
        """Wait until the entry ``entry_id`` is durable."""
        while self.last_entry_id < entry_id:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut

    async def read(self, start: int, end: int) -> list[Entry]:
        """Entries with ``start <= entry_id <= end`` that exist (trimmed ones are gone)."""
        start = max(start, self.first_entry_id)
        end = min(end, self.last_entry_id)
        if start > end:
            return []
        cached = self._cache[0].entry_id if self._cache else self.last_entry_id + 1
        if start >= cached:
            return [self._cache[i - cached] for i in range(start, end + 1)]
        # Take the cached part now: a commit during the disk read shifts the cache.
        tail = [self._cache[i - cached] for i in range(cached, end + 1)]
        from_disk = await self.store._read(self, start, min(end, cached - 1))
        from_disk.extend(tail)
        return from_disk

    async def read_meta(self) -> list[tuple[int, int]]:
        """``(entry_id, meta)`` of every entry, without reading the data."""
        return await self.store._read_meta(self)

    # Called by the store after a commit.
    def _durable(self, entries: list[Entry]) -> None:
        limit_n, limit_bytes = self.store.cache_entries, self.store.cache_bytes
        for entry in entries:
            self._cache.append(entry)
            self._cache_bytes += len(entry.data)
            self.last_entry_id = entry.entry_id
        while self._cache and (len(self._cache) > limit_n or self._cache_bytes > limit_bytes):
            self._cache_bytes -= len(self._cache.popleft().data)
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)
        for callback in list(self._listeners):
            try:
                callback(self, entries)
            except Exception:
                log.exception("ledger listener failed on %s", self.name)

    def _trimmed(self, before: int) -> None:
        self.first_entry_id = max(self.first_entry_id, before)
        while self._cache and self._cache[0].entry_id < before:
            self._cache_bytes -= len(self._cache.popleft().data)


class LedgerStore:
    """A SQLite database of ledgers with one group-committing writer task."""

    def __init__(
        self,
        path: Path,
        writer: aiosqlite.Connection,
        reader: aiosqlite.Connection,
        cache_entries: int,
        cache_bytes: int,
    ) -> None:
        self.path = path
        self.cache_entries = cache_entries
        self.cache_bytes = cache_bytes
        self._writer = writer
        self._reader = reader
        self._ledgers: dict[str, Ledger] = {}
        # Appends and trims not yet taken by a group commit. The event loop
        # appends, the writer thread takes (deque operations are atomic).
        self._queue: collections.deque[_Append | _Trim] = collections.deque()
        # A group commit is queued to the writer thread and has not started
        # (set by the loop, cleared by the thread before it takes the queue).
        self._commit_queued = False
        # Group commits queued to the writer thread, oldest first: the
        # write loop settles them in that order.
        self._jobs: collections.deque[asyncio.Future[_Done | None]] = collections.deque()
        self._wakeup = asyncio.Event()
        self._lazy_timer: asyncio.TimerHandle | None = None  # commits lazy entries alone
        self._closed = False
        # Set by a group commit that failed: the store then refuses every
        # write (fail-stop), see `_fail`. The writer thread keeps its own
        # copy, so that commits already queued behind the failed one write
        # nothing.
        self._failed: LedgerError | None = None
        self._thread_failed: BaseException | None = None
        self._task = asyncio.get_running_loop().create_task(self._write_loop())
        self.commits = 0  # group commits done, for stats and benchmarks
        self.appends = 0

    @classmethod
    async def open(
        cls, path: str | Path, *, cache_entries: int = 4096, cache_bytes: int = 16 << 20
    ) -> LedgerStore:
        """Open (or create) the database at ``path`` and load its ledger table."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = await aiosqlite.connect(path, isolation_level=None)
        try:
            await writer.execute("PRAGMA journal_mode=WAL")
            await writer.execute("PRAGMA synchronous=FULL")
            await writer.executescript(_SCHEMA)
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            await writer.close()
            raise
        store = cls(path, writer, reader, cache_entries, cache_bytes)
        rows = await writer.execute_fetchall(
            "SELECT id, name, first_entry_id, next_entry_id FROM ledgers"
        )
        for ledger_id, name, first, nxt in rows:
            # next_entry_id is written by trims only (so that ids never repeat
            # once every entry is trimmed); otherwise the entries tell.
            top = await writer.execute_fetchall(
                "SELECT max(id) FROM entries WHERE id >= ? AND id <= ?",
                (_key(ledger_id, 0), _key(ledger_id, _MAX_ENTRY_ID)),
            )
            (max_key,) = next(iter(top))
            nxt = max(nxt, first)
            if max_key is not None:
                nxt = max(nxt, (max_key & _MAX_ENTRY_ID) + 1)
            store._ledgers[name] = Ledger(store, ledger_id, name, first, nxt)
        return store

    async def close(self) -> None:
        """Finish what is queued, then close both connections."""
        if self._closed:
            return
        self._closed = True
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
            self._lazy_timer = None
        if self._queue and not self._commit_queued:  # lazy entries waiting for company
            self._queue_commit()
        self._wakeup.set()
        await self._task
        await self._reader.close()
        await self._writer.close()

    def ledger_names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self._ledgers if n.startswith(prefix))

    def get_ledger(self, name: str) -> Ledger | None:
        return self._ledgers.get(name)

    async def open_ledger(self, name: str) -> Ledger:
        """The ledger called ``name``, created (durably) if it does not exist."""
        ledger = self._ledgers.get(name)
        if ledger is not None:
            return ledger
        self._check_open()

        def create(raw: sqlite3.Connection) -> int:
            # OR IGNORE: a concurrent open_ledger of the same name may have won.
            raw.execute("INSERT OR IGNORE INTO ledgers(name) VALUES (?)", (name,))
            row = raw.execute("SELECT id FROM ledgers WHERE name = ?", (name,)).fetchone()
            return int(row[0])

        ledger_id = await _on_thread(self._writer, create)
        ledger = self._ledgers.get(name)  # created meanwhile by a concurrent caller?
        if ledger is None:
            ledger = self._ledgers[name] = Ledger(self, ledger_id, name, 0, 0)
        return ledger

    async def delete_ledger(self, name: str) -> None:
        """Delete a ledger and all its entries."""
        ledger = self._ledgers.pop(name, None)
        if ledger is None:
            return

        def delete(raw: sqlite3.Connection) -> None:
            raw.execute("BEGIN IMMEDIATE")
            raw.execute(
                "DELETE FROM entries WHERE id >= ? AND id <= ?",
                (_key(ledger.id, 0), _key(ledger.id, _MAX_ENTRY_ID)),
            )
            raw.execute("DELETE FROM ledgers WHERE id = ?", (ledger.id,))
            raw.execute("COMMIT")

        await _on_thread(self._writer, delete)

    # -- the writer ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerError(f"ledger store {self.path} is closed")
        if self._failed is not None:
            raise self._failed

    def _append(self, ledger: Ledger, data: bytes, meta: int, lazy: bool) -> asyncio.Future[int]:
        self._check_open()
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._queue.append(_Append(ledger, meta, data, fut))
        if not self._commit_queued:
            if not lazy:
                self._queue_commit()
            elif self._lazy_timer is None:
                self._lazy_timer = asyncio.get_running_loop().call_later(LAZY_DELAY, self._lazy_due)
        return fut

    def _lazy_due(self) -> None:
        self._lazy_timer = None
        if self._queue and not self._commit_queued:
            self._queue_commit()

    def _trim(self, ledger: Ledger, before: int) -> asyncio.Future[None]:
        self._check_open()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(_Trim(ledger, before, fut))
        if not self._commit_queued:
            self._queue_commit()
        return fut

    def _queue_commit(self) -> None:
        """Queue a group commit to the writer thread. It takes whatever is
        queued when it starts; until then, appends need no other."""
        self._commit_queued = True
        if self._lazy_timer is not None:  # (this commit takes the lazy entries too)
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._jobs.append(asyncio.ensure_future(_on_thread(self._writer, self._commit_queued_ops)))
        self._wakeup.set()

    def _commit_queued_ops(self, raw: sqlite3.Connection) -> _Done | None:
        """One group commit, on the writer thread: take the queue, assign
        entry ids, insert, trim, commit. None if the queue was empty (a
        commit before this one took it)."""
        self._commit_queued = False  # first: an append from now on queues the next commit
        if self._thread_failed is not None:
            raise _Refused()  # fail-stop: the event loop fails what is queued
        queue, batch = self._queue, []
        while queue:
            batch.append(queue.popleft())
        if not batch:
            return None
        rows: list[tuple[int, int, bytes]] = []
        heads: dict[Ledger, int] = {}  # ledger -> its new first entry id (-1: unchanged)
        start_next: dict[Ledger, int] = {}
        for op in batch:
            ledger = op.ledger
            if ledger not in start_next:
                start_next[ledger] = ledger._next
                heads[ledger] = -1
            if isinstance(op, _Append):
                op.entry_id = ledger._next
                ledger._next += 1
                rows.append((_key(ledger.id, op.entry_id), op.meta, op.data))
            else:
                before = min(op.before, ledger._next)
                heads[ledger] = max(heads[ledger], before, ledger._first)
        trims = {lg: first for lg, first in heads.items() if first >= 0}
        try:
            _commit(raw, rows, [(lg.id, first, lg._next) for lg, first in trims.items()])
        except BaseException as exc:
            for ledger, nxt in start_next.items():
                ledger._next = nxt
            self._thread_failed = exc
            raise _Failed(batch, exc) from exc
        for ledger, first in trims.items():
            ledger._first = first
        return _Done(batch, trims, len(rows))

    async def _write_loop(self) -> None:
        """Settle the group commits in the order they were queued."""
        while True:
            if not self._jobs:
                if self._closed:
                    return
                await self._wakeup.wait()
                self._wakeup.clear()
                continue
            job = self._jobs[0]
            try:
                done = await job
            except _Failed as failed:
                self._fail(failed.batch, failed.error)
                continue
            except _Refused:
                continue  # (the commit that failed before it failed what was queued)
            except Exception as exc:
                self._fail([], exc)
                continue
            finally:
                self._jobs.popleft()
            if done is not None:
                self._settle(done)

    def _fail(self, batch: list[_Append | _Trim], exc: BaseException) -> None:
        # Fail-stop: once a commit failed, nothing more is written. Callers
        # rely on append order meaning durability order (an entry appended
        # after another is durable only if that one is: the coordinator lets
        # participants write right behind its log records), which a later
        # commit succeeding after a failed one would break; and after a
        # failed fsync what is on disk is unknown (PostgreSQL learned this
        # the hard way). The broker has to be restarted.
        self._thread_failed = self._thread_failed or exc
        if self._failed is None:
            self._failed = LedgerError(
                f"group commit to {self.path} failed: {exc}; the store refuses writes "
                "until it is reopened"
            )
            log.critical("%s", self._failed)
        queued = list(self._queue)
        self._queue.clear()
        for op in (*batch, *queued):
            if not op.future.done():
                op.future.set_exception(self._failed)

    def _settle(self, done: _Done) -> None:
        """After a group commit: update the ledgers, tell the listeners,
        resolve the futures."""
        self.commits += 1
        self.appends += done.appended
        added: dict[Ledger, list[Entry]] = {}
        for op in done.batch:
            if isinstance(op, _Append):
                added.setdefault(op.ledger, []).append(Entry(op.entry_id, op.meta, op.data))
        for ledger, first in done.trims.items():
            ledger._trimmed(first)
        for ledger, entries in added.items():
            ledger._durable(entries)
        for op in done.batch:
            if op.future.done():  # the caller gave up waiting; the entry is stored
                continue
            if isinstance(op, _Append):
                op.future.set_result(op.entry_id)
            else:
                op.future.set_result(None)

    # -- reads --------------------------------------------------------------

    async def _read(self, ledger: Ledger, start: int, end: int) -> list[Entry]:
        self._check_open()

        def read(raw: sqlite3.Connection) -> list[Entry]:
            cur = raw.execute(
                "SELECT id, meta, data FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger.id, start), _key(ledger.id, end)),
            )
            return [Entry(k & _MAX_ENTRY_ID, m, d) for k, m, d in cur]

        return await _on_thread(self._reader, read)

    async def _read_meta(self, ledger: Ledger) -> list[tuple[int, int]]:
        self._check_open()

        def read(raw: sqlite3.Connection) -> list[tuple[int, int]]:
            cur = raw.execute(
                "SELECT id, meta FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger.id, 0), _key(ledger.id, _MAX_ENTRY_ID)),
            )
            return [(k & _MAX_ENTRY_ID, m) for k, m in cur]

        return await _on_thread(self._reader, read)
