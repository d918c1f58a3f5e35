"""Ledgers in one SQLite database, written by group commits.

A ledger is an append-only sequence of entries with increasing entry ids,
read by range and trimmed from the front. Many ledgers share one database
file (a `LedgerStore`). Appends and trims wait in a queue; a group commit
takes everything queued when it starts and commits it as one SQLite
transaction: one fsync (WAL, ``synchronous=FULL``) for all of them. A future
resolves only after its commit is on disk.

Every write goes through a writer process of the store's own
(`ledger._writer`), fed through a pipe: the event loop queues appends and
trims, hands them over once per turn of the loop, and settles them when the
writer answers. The writer commits whatever reached it while its previous
commit ran, together, and shares no interpreter lock with the busy event
loop (see `ledger._writer`).

Append order is durability order, across all the ledgers of a store: an
append made after another (in the event loop's order) is committed in the
same SQLite transaction or a later one, and never without it, because a
failed commit stops the store (fail-stop: every later write is refused until
it is reopened). The coordinator relies on this to let participants write
right behind its log records when they share a store (see `tc`).

Reads that miss the in-memory tail cache go to an aiosqlite connection of
this process, used for nothing else (each read is one hop to its thread and
back); in WAL mode they never queue behind a commit.

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
import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import aiosqlite
from sortedcontainers import SortedList

from ledger import _writer
from ledger._stats import COMMIT_SECONDS_BOUNDS, COMMIT_SIZE_BOUNDS, Buckets

__all__ = [
    "Entry",
    "Ledger",
    "LedgerError",
    "LedgerStore",
    "read_runs",
]

log = logging.getLogger(__name__)

# How long a lazy append (see `Ledger.append`) waits for a group commit to
# go with before it starts one of its own.
LAZY_DELAY = 0.005
CLOSE_ROUNDS = 10  # rounds of follow-up writes `LedgerStore.close` waits for

_MAX_ENTRY_ID = _writer.MAX_ENTRY_ID
_key = _writer.key  # ledger_id << 40 | entry_id
STOP_WAIT = 10.0  # seconds a closing store waits for its writer process to exit
LOCK_WAIT = 10.0  # seconds a store waits for another writer of its database to go
_T = TypeVar("_T")


class LedgerError(Exception):
    """The store failed to make an operation durable (or is closed)."""


def _prefix_end(prefix: str) -> str | None:
    """The least string greater than every string that starts with
    ``prefix`` (None if there is none: ``prefix`` is empty or all U+10FFFF).

    ``prefix`` with its last character raised by one: a string at or after
    ``prefix`` and before that starts with ``prefix``. A last character
    that cannot be raised is dropped first.
    """
    stem = prefix.rstrip(chr(sys.maxunicode))
    if not stem:
        return None
    return stem[:-1] + chr(ord(stem[-1]) + 1)


_ID_BITS = _writer.ENTRY_BITS + 1  # an entry id (or the next one), in `_pack`


def _pack(ledger_id: int, first: int, nxt: int) -> int:
    """A ledger not in use, as the store keeps it: one integer."""
    return (ledger_id << (2 * _ID_BITS)) | (first << _ID_BITS) | nxt


def _unpack(packed: int) -> tuple[int, int, int]:
    mask = (1 << _ID_BITS) - 1
    return packed >> (2 * _ID_BITS), (packed >> _ID_BITS) & mask, packed & mask


def _gone(ledger: Ledger) -> LedgerError:
    if ledger.deleted:
        return LedgerError(f"ledger {ledger.name} is deleted")
    return LedgerError(f"this object of ledger {ledger.name} was released (get it again)")


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: int
    meta: int
    data: bytes


class Readable(Protocol):
    """What reads a ledger's entries by range (`Ledger`, `ReadOnlyLedger`)."""

    async def read(self, start: int, end: int) -> list[Entry]: ...


async def read_runs(ledger: Readable, entry_ids: Sequence[int], window: int) -> dict[int, Entry]:
    """The entries ``entry_ids`` (sorted) of ``ledger`` that exist, by id: one
    read per run of ids that lie within ``window`` of its first."""
    found: dict[int, Entry] = {}
    i = 0
    while i < len(entry_ids):
        j = i
        while j + 1 < len(entry_ids) and entry_ids[j + 1] - entry_ids[i] < window:
            j += 1
        wanted = set(entry_ids[i : j + 1])
        for entry in await ledger.read(entry_ids[i], entry_ids[j]):
            if entry.entry_id in wanted:
                found[entry.entry_id] = entry
        i = j + 1
    return found


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
    entry_id: int


@dataclass(slots=True)
class _Trim:
    ledger: Ledger
    before: int
    future: asyncio.Future[None]


@dataclass(slots=True)
class _Sent:
    """A write handed to the writer process: its operations, in order, the
    ledgers it trims (their new first entry ids) and how many entries it adds."""

    batch: list[_Append | _Trim]
    trims: dict[Ledger, int]
    appended: int


class _WriterProtocol(asyncio.SubprocessProtocol):
    """Reads the writer's answers as they come and hands each to the store."""

    def __init__(self) -> None:
        self.store: LedgerStore | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._buffer += data
        for seq, error, result in _writer.take_frames(self._buffer):
            if seq == 0:
                if not self.ready.done():
                    if error is None:
                        self.ready.set_result(None)
                    else:
                        self.ready.set_exception(LedgerError(error))
            elif self.store is not None:
                self.store._answered(seq, error, result)

    def process_exited(self) -> None:
        if not self.ready.done():
            self.ready.set_exception(LedgerError("the writer process exited before it was ready"))
        if not self.exited.done():
            self.exited.set_result(None)
        if self.store is not None:
            self.store._writer_exited()


_DROPPED = Entry(-1, 0, b"")  # in a tail cache, before its head: let go
_NO_CACHE: list[Entry] = []  # the tail cache of a ledger that keeps none (never added to)


class Ledger:
    """One append-only ledger. Get it from `LedgerStore.open_ledger`.

    ``first_entry_id`` is the first entry not trimmed and ``last_entry_id``
    the last durable one (``first - 1`` when the ledger is empty). Readers
    that have caught up are served from a tail cache of recent entries
    (made on the first append: a ledger only read has none; and none at all
    after `no_tail_cache`).

    The tail cache is a list read from ``_cache_head`` on: an entry leaves it
    by moving the head (its place is emptied), and the list is cut once more
    than half of it is behind the head. A list of a few entries costs a
    tenth of a deque's first block (most ledgers of an idle topic hold one
    or two recent entries).
    """

    __slots__ = (
        "_cache",
        "_cache_bytes",
        "_cache_head",
        "_first",
        "_listeners",
        "_next",
        "_waiters",
        "deleted",
        "first_entry_id",
        "id",
        "last_entry_id",
        "name",
        "released",
        "store",
    )

    def __init__(self, store: LedgerStore, ledger_id: int, name: str, first: int, nxt: int) -> None:
        self.store = store
        self.id = ledger_id
        self.name = name
        self.first_entry_id = first
        self.last_entry_id = nxt - 1
        # The next id to assign (appends get theirs as they are queued), and
        # the first entry not trimmed as sent to the writer
        # (``first_entry_id`` follows it once the trim is durable).
        self._next = nxt
        self._first = first
        self._cache: list[Entry] | None = None
        self._cache_head = 0  # the first entry of _cache still in the cache
        self._cache_bytes = 0
        self._waiters: list[asyncio.Future[None]] | None = None  # (made when one waits)
        # (A tuple, replaced on a change: most ledgers have none, and `_durable`
        # calls them without a copy.)
        self._listeners: tuple[Callable[[Ledger, list[Entry]], None], ...] = ()
        self.deleted = False  # by `LedgerStore.delete_ledger`: it takes no more writes
        # By `LedgerStore.release_ledger`: this object takes no more writes
        # (the store makes a new one for the ledger when asked for it again).
        self.released = False

    def __repr__(self) -> str:
        return f"Ledger({self.name!r}, first={self.first_entry_id}, last={self.last_entry_id})"

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    @property
    def settled(self) -> bool:
        """Is every append and trim of this ledger durable (none under way)?"""
        return self._next == self.last_entry_id + 1 and self._first == self.first_entry_id

    @property
    def next_entry_id(self) -> int:
        """The id the next `append` gets: ids are given as appends are
        queued, in order, so a caller knows an entry's id before it is
        durable (the future gives the same)."""
        return self._next

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

    def no_tail_cache(self) -> None:
        """Keep no tail cache from now on: for a ledger read only when its
        user loads it (records for the next start: a cursor's, snapshots),
        whose recent entries would wait in the cache for nobody."""
        self._cache, self._cache_head, self._cache_bytes = _NO_CACHE, 0, 0

    def add_listener(self, callback: Callable[[Ledger, list[Entry]], None]) -> None:
        """Call ``callback(ledger, new_entries)`` after each commit that added entries.

        Listeners run before the appenders' futures resolve, in the order
        they were added.
        """
        self._listeners = (*self._listeners, callback)

    def remove_listener(self, callback: Callable[[Ledger, list[Entry]], None]) -> None:
        listeners = self._listeners
        if callback in listeners:
            i = listeners.index(callback)
            self._listeners = listeners[:i] + listeners[i + 1 :]

    async def wait_for(self, entry_id: int) -> None:
        """Wait until the entry ``entry_id`` is durable."""
        while self.last_entry_id < entry_id:
            fut = asyncio.get_running_loop().create_future()
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(fut)
            await fut

    async def read(self, start: int, end: int) -> list[Entry]:
        """Entries with ``start <= entry_id <= end`` that exist (trimmed ones are gone)."""
        start = max(start, self.first_entry_id)
        end = min(end, self.last_entry_id)
        if start > end:
            return []
        cache, head = self._cache, self._cache_head
        if cache is None or head == len(cache):
            return await self.store._read(self, start, end)
        cached = cache[head].entry_id  # (the cache holds cached .. last_entry_id)
        if start >= cached:
            return cache[head + start - cached : head + end - cached + 1]
        # Take the cached part now: a commit during the disk read shifts the cache.
        # (None of it if the range ends before the cache: a slice's negative end
        # would count from the list's end.)
        tail = cache[head : head + end - cached + 1] if end >= cached else []
        from_disk = await self.store._read(self, start, min(end, cached - 1))
        from_disk.extend(tail)
        return from_disk

    async def read_meta(self) -> list[tuple[int, int]]:
        """``(entry_id, meta)`` of every entry, without reading the data."""
        return await self.store._read_meta(self)

    async def read_sizes(self) -> list[tuple[int, int]]:
        """``(entry_id, bytes of its data)`` of every entry (SQLite's
        ``length()`` of a blob: the data is not read)."""
        return await self.store._read_sizes(self)

    # Called by the store after a commit.
    def _durable(self, entries: list[Entry]) -> None:
        self.last_entry_id = entries[-1].entry_id
        cache = self._cache
        if cache is None:
            cache = self._cache = []
        if cache is not _NO_CACHE:
            limit_n, limit_bytes = self.store.cache_entries, self.store.cache_bytes
            for entry in entries:
                self._cache_bytes += len(entry.data)
            cache.extend(entries)
            head, size = self._cache_head, len(cache)
            while head < size and (size - head > limit_n or self._cache_bytes > limit_bytes):
                self._cache_bytes -= len(cache[head].data)
                cache[head] = _DROPPED
                head += 1
            self._cache_head = head
            if head > 32 and 2 * head > len(cache):
                self._cut_cache()
        waiters, self._waiters = self._waiters, None
        for fut in waiters or ():
            if not fut.done():
                fut.set_result(None)
        for callback in self._listeners:
            try:
                callback(self, entries)
            except Exception:
                log.exception("ledger listener failed on %s", self.name)

    def _cut_cache(self) -> None:
        """Drop the places of the entries behind the cache's head."""
        assert self._cache is not None
        del self._cache[: self._cache_head]
        self._cache_head = 0

    def _trimmed(self, before: int) -> None:
        self.first_entry_id = max(self.first_entry_id, before)
        cache, head = self._cache, self._cache_head
        if cache is None:
            return
        while head < len(cache) and cache[head].entry_id < before:
            self._cache_bytes -= len(cache[head].data)
            cache[head] = _DROPPED
            head += 1
        self._cache_head = head
        if 2 * head > len(cache):
            self._cut_cache()


async def _stop(transport: asyncio.SubprocessTransport, protocol: _WriterProtocol) -> None:
    """Close the writer's stdin (it exits once it has answered everything)
    and wait for it; kill it if it does not go."""
    stdin = transport.get_pipe_transport(0)
    if stdin is not None:
        stdin.close()
    try:
        await asyncio.wait_for(asyncio.shield(protocol.exited), STOP_WAIT)
    except TimeoutError:
        log.error("the ledger writer process did not exit; killing it")
        transport.kill()
        await protocol.exited
    transport.close()


def _read_catalog(raw: sqlite3.Connection) -> dict[str, Ledger | int]:
    """Every ledger's name -> its packed ids (`_pack`), on the reader's
    thread: each with its greatest entry key, in one statement (one range
    seek per ledger), row by row (no list of every row at once: the start of
    a store of many ledgers leaves less memory behind)."""
    catalog: dict[str, Ledger | int] = {}
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
        catalog[name] = _pack(ledger_id, first, nxt)
    return catalog


class LedgerStore:
    """A SQLite database of ledgers, written by a group-committing writer process."""

    def __init__(
        self,
        path: Path,
        transport: asyncio.SubprocessTransport,
        protocol: _WriterProtocol,
        reader: aiosqlite.Connection,
        cache_entries: int,
        cache_bytes: int,
    ) -> None:
        self.path = path
        self.cache_entries = cache_entries
        self.cache_bytes = cache_bytes
        self._transport = transport
        self._protocol = protocol
        # (opened with stdin=PIPE; uvloop's pipe transports are not WriteTransport subclasses)
        self._stdin = cast(asyncio.WriteTransport, transport.get_pipe_transport(0))
        self._reader = reader
        # Every ledger by name: its object if it is in use, else its id and
        # first and next entry ids packed in one integer (`_pack`), about 40
        # bytes where a `Ledger` costs 150. A ledger gets its object when it
        # is first asked for (`get_ledger`) and gives it back when its user
        # is done with it (`release_ledger`); either way its name is the
        # same string object, here, in `_names` and in its `Ledger`.
        self._ledgers: dict[str, Ledger | int] = {}
        self._in_use = 0  # the values of _ledgers that are objects
        # The names of every ledger, sorted: the names with a prefix are one
        # range of it (`ledger_names`), found in O(log n).
        self._names = SortedList()
        self._loop = asyncio.get_running_loop()
        # Appends and trims not yet handed to the writer.
        self._queue: collections.deque[_Append | _Trim] = collections.deque()
        self._send_scheduled = False  # a `_send` is due this turn of the loop
        # What the writer has not answered yet, in the order it was sent
        # (the writer answers in that order): writes, and the futures of
        # ledger creations and deletions.
        self._seq = 0
        self._unanswered: collections.deque[tuple[int, _Sent | asyncio.Future[Any]]] = (
            collections.deque()
        )
        self._drained: asyncio.Future[None] | None = None  # set once nothing is unanswered
        self._closing: asyncio.Future[None] | None = None  # done once `close` has finished
        self._lazy_timer: asyncio.TimerHandle | None = None  # sends lazy entries alone
        self._closed = False
        # Set by a write that failed: the store then refuses every write
        # (fail-stop), see `_fail`.
        self._failed: LedgerError | None = None
        self.commits = 0  # group commits done, for stats and benchmarks
        self.appends = 0
        # Each group commit's appends, and how long the writer took to commit
        # it (inserts, trims, the COMMIT and its fsync), for /metrics.
        self.commit_sizes = Buckets(COMMIT_SIZE_BOUNDS)
        self.commit_seconds = Buckets(COMMIT_SECONDS_BOUNDS)
        protocol.store = self

    @classmethod
    async def open(
        cls,
        path: str | Path,
        *,
        cache_entries: int = 4096,
        cache_bytes: int = 16 << 20,
        lock_wait: float = LOCK_WAIT,
    ) -> LedgerStore:
        """Open (or create) the database at ``path`` and load its ledger table.

        Starts the store's writer process; raises `LedgerError` if it cannot
        start, for instance when another process's writer still holds this
        database after ``lock_wait`` seconds.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            _WriterProtocol,
            sys.executable,
            _writer.__file__,
            str(path),
            str(os.getpid()),
            str(lock_wait),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
        )
        reader: aiosqlite.Connection | None = None
        try:
            await protocol.ready
            reader = await aiosqlite.connect(path, isolation_level=None)
            store = cls(path, transport, protocol, reader, cache_entries, cache_bytes)
            store._ledgers = await _on_thread(reader, _read_catalog)
            store._names.update(store._ledgers)
        except BaseException:
            if reader is not None:
                await reader.close()
            await _stop(transport, protocol)
            raise
        return store

    async def close(self) -> None:
        """Finish what is queued, and what finishing it queues (the records
        and snapshots that listeners and durable callbacks append), then
        stop the writer and close the reader."""
        if self._closed:
            return
        if self._closing is not None:  # (another close is under way: wait for it)
            await asyncio.shield(self._closing)
            return
        self._closing = self._loop.create_future()
        try:
            await self._close()
        finally:
            self._closing.set_result(None)

    async def _close(self) -> None:
        for _ in range(CLOSE_ROUNDS):
            if self._lazy_timer is not None:
                self._lazy_timer.cancel()
                self._lazy_timer = None
            if self._queue and self._failed is None:
                self._send()
            if self._unanswered:
                self._drained = self._loop.create_future()
                await self._drained
            await asyncio.sleep(0)  # (the callbacks of the last answer, and what they woke)
            if not self._queue or self._failed is not None:
                break
        self._closed = True
        if self._queue:  # (still coming after CLOSE_ROUNDS rounds: refused)
            log.warning("%s: closed with %d writes still coming in", self.path, len(self._queue))
            closed = LedgerError(f"ledger store {self.path} is closed")
            for op in self._queue:
                if not op.future.done():
                    op.future.set_exception(closed)
            self._queue.clear()
        await _stop(self._transport, self._protocol)
        await self._reader.close()

    def ledger_names(self, prefix: str = "") -> list[str]:
        """The names of the ledgers that start with ``prefix``, sorted.

        They are one range of the sorted names, from ``prefix`` up to the
        first string after every string that starts with it (see
        `_prefix_end`): found by bisection, in O(log n + what is returned).
        """
        end = _prefix_end(prefix)
        if end is None:
            return list(self._names.irange(minimum=prefix))
        return list(self._names.irange(prefix, end, inclusive=(True, False)))

    def has_ledger(self, name: str) -> bool:
        return name in self._ledgers

    def get_ledger(self, name: str) -> Ledger | None:
        """The ledger called ``name`` (None if there is none)."""
        found = self._ledgers.get(name)
        if not isinstance(found, int):
            return found
        ledger_id, first, nxt = _unpack(found)
        # (The name as the store holds it: not a second copy of it.)
        name = self._names[self._names.bisect_left(name)]
        ledger = self._ledgers[name] = Ledger(self, ledger_id, name, first, nxt)
        self._in_use += 1
        return ledger

    def loaded_ledgers(self) -> int:
        """How many ledgers have their `Ledger` object now (see `release_ledger`)."""
        return self._in_use

    async def open_ledger(self, name: str) -> Ledger:
        """The ledger called ``name``, created (durably) if it does not exist."""
        ledger = self.get_ledger(name)
        if ledger is not None:
            return ledger
        self._check_open()
        ledger_id = await self._request("create", name)
        ledger = self.get_ledger(name)  # created meanwhile by a concurrent caller?
        if ledger is None:
            ledger = self._ledgers[name] = Ledger(self, ledger_id, name, 0, 0)
            self._in_use += 1
            self._names.add(name)
        return ledger

    def release_ledger(self, ledger: Ledger) -> bool:
        """Give back ``ledger``'s object, if nothing is under way on it (no
        append or trim waiting to be durable, no waiter, no listener): the
        store keeps its ids in a few bytes, and `get_ledger` makes a new
        object for it. The old object refuses writes from then on. False
        (and nothing changes) if something is under way, or it is not this
        store's current object for the ledger."""
        if ledger.deleted or ledger.released or self._ledgers.get(ledger.name) is not ledger:
            return False
        if not ledger.settled or ledger._waiters or ledger._listeners:
            return False
        self._ledgers[ledger.name] = _pack(ledger.id, ledger.first_entry_id, ledger._next)
        self._in_use -= 1
        ledger.released = True
        ledger._cache = None
        ledger._cache_head = ledger._cache_bytes = 0
        return True

    async def delete_ledger(self, name: str) -> None:
        """Delete a ledger and all its entries."""
        ledger = self.get_ledger(name)
        if ledger is None:
            return
        del self._ledgers[name]
        self._in_use -= 1
        self._names.remove(name)
        ledger.deleted = True
        self._check_open()
        await self._request("delete", ledger.id)

    # -- the writer ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerError(f"ledger store {self.path} is closed")
        if self._failed is not None:
            raise self._failed

    def _append(self, ledger: Ledger, data: bytes, meta: int, lazy: bool) -> asyncio.Future[int]:
        self._check_open()
        if ledger.deleted or ledger.released:
            raise _gone(ledger)
        fut: asyncio.Future[int] = self._loop.create_future()
        # Its id now, in queue order (which is the order of the writes).
        self._queue.append(_Append(ledger, meta, data, fut, ledger._next))
        ledger._next += 1
        if not self._send_scheduled:
            if not lazy:
                self._schedule_send()
            elif self._lazy_timer is None:
                self._lazy_timer = self._loop.call_later(LAZY_DELAY, self._lazy_due)
        return fut

    def _lazy_due(self) -> None:
        self._lazy_timer = None
        if self._queue and not self._send_scheduled and self._failed is None:
            self._schedule_send()

    def _trim(self, ledger: Ledger, before: int) -> asyncio.Future[None]:
        self._check_open()
        if ledger.deleted or ledger.released:
            raise _gone(ledger)
        fut: asyncio.Future[None] = self._loop.create_future()
        # (Never past what is appended so far: not an entry appended after it.)
        self._queue.append(_Trim(ledger, min(before, ledger._next), fut))
        if not self._send_scheduled:
            self._schedule_send()
        return fut

    def _schedule_send(self) -> None:
        """Hand the queue to the writer at the end of this turn of the loop:
        what this turn appends goes in one write."""
        self._send_scheduled = True
        if self._lazy_timer is not None:  # (this write takes the lazy entries too)
            self._lazy_timer.cancel()
            self._lazy_timer = None
        self._loop.call_soon(self._send)

    def _send(self) -> None:
        """Hand what is queued to the writer."""
        self._send_scheduled = False
        if not self._queue or self._failed is not None:
            return
        queue, batch = self._queue, []
        while queue:
            batch.append(queue.popleft())
        rows: list[tuple[int, int, bytes]] = []
        heads: dict[Ledger, int] = {}  # ledger -> its new first entry id
        for op in batch:
            ledger = op.ledger
            if isinstance(op, _Append):
                rows.append((_key(ledger.id, op.entry_id), op.meta, op.data))
            else:
                heads[ledger] = max(heads.get(ledger, -1), op.before, ledger._first)
        for ledger, first in heads.items():
            ledger._first = first
        trims = [(lg.id, first, lg._next) for lg, first in heads.items()]
        self._write("write", rows, trims, pending=_Sent(batch, heads, len(rows)))

    def _request(self, kind: str, arg: object) -> asyncio.Future[Any]:
        """A creation or deletion, in order with the writes sent before it."""
        if self._send_scheduled:
            self._send()  # (what was appended before goes first)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._write(kind, arg, pending=fut)
        return fut

    def _write(self, *request: object, pending: _Sent | asyncio.Future[Any]) -> None:
        self._seq += 1
        self._unanswered.append((self._seq, pending))
        self._stdin.write(_writer.frame((self._seq, *request)))

    def _answered(self, seq: int, error: str | None, result: Any) -> None:
        """The writer's answer to request ``seq`` (they come in order)."""
        if not self._unanswered or self._unanswered[0][0] != seq:
            self._fail([], f"the writer answered request {seq} out of order")
            return
        _, pending = self._unanswered.popleft()
        if isinstance(pending, _Sent):
            if error is None:
                commits, rows, took = result  # (the writer counts its group commits)
                if commits != self.commits:  # (the first answer of its group commit)
                    self.commits = commits
                    self.commit_sizes.observe(rows)
                    self.commit_seconds.observe(took)
                self._settle(pending)
            else:
                self._fail(pending.batch, error)
        elif not pending.done():
            if error is None:
                pending.set_result(result)
            else:
                pending.set_exception(self._failed or LedgerError(error))
        if not self._unanswered and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _writer_exited(self) -> None:
        """The writer process is gone: whatever it did not answer is lost."""
        if self._unanswered or not self._closed:
            self._fail([], "the writer process exited")

    def _fail(self, batch: list[_Append | _Trim], error: str) -> None:
        # Fail-stop: once a write failed, nothing more is written. Callers
        # rely on append order meaning durability order (an entry appended
        # after another is durable only if that one is: the coordinator lets
        # participants write right behind its log records), which a later
        # commit succeeding after a failed one would break; and after a
        # failed fsync what is on disk is unknown (PostgreSQL learned this
        # the hard way). The broker has to be restarted. (The writer refuses
        # what it receives after a failure, too.)
        if self._failed is None:
            self._failed = LedgerError(
                f"group commit to {self.path} failed: {error}; the store refuses writes "
                "until it is reopened"
            )
            log.critical("%s", self._failed)
        first = LedgerError(f"group commit to {self.path} failed: {error}")
        for op in batch:
            if not op.future.done():
                op.future.set_exception(first)
        unanswered = list(self._unanswered)
        self._unanswered.clear()
        queued = list(self._queue)
        self._queue.clear()
        for _, pending in unanswered:
            futures = (
                [op.future for op in pending.batch] if isinstance(pending, _Sent) else [pending]
            )
            for fut in futures:
                if not fut.done():
                    fut.set_exception(self._failed)
        for op in queued:
            if not op.future.done():
                op.future.set_exception(self._failed)
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _settle(self, done: _Sent) -> None:
        """After a group commit: update the ledgers, tell the listeners,
        resolve the futures."""
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

    async def _read_sizes(self, ledger: Ledger) -> list[tuple[int, int]]:
        self._check_open()

        def read(raw: sqlite3.Connection) -> list[tuple[int, int]]:
            cur = raw.execute(
                "SELECT id, length(data) FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger.id, 0), _key(ledger.id, _MAX_ENTRY_ID)),
            )
            return [(k & _MAX_ENTRY_ID, n) for k, n in cur]

        return await _on_thread(self._reader, read)
