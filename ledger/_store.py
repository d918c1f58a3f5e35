"""Ledgers in one database, written by group commits, on an engine.

A ledger is an append-only sequence of entries with increasing entry ids,
read by range and trimmed from the front. Many ledgers share one database
(a `LedgerStore`). Appends and trims wait in a queue; a group commit takes
everything queued when it starts and commits it as one database
transaction. A future resolves only after its commit is durable.

The store is in two parts. `LedgerStore` holds what does not depend on
the database: the `Ledger` objects and their ids, tail caches, listeners
and waiters, the queue of appends and trims, lazy appends, the bookkeeping
of group commits, fail-stop and the figures. An *engine* (`Engine`) holds
the database: it loads the catalog, creates and deletes ledgers, commits a
batch of appends and trims atomically, and reads. Two engines:

- SQLite (`ledger._sqlite`, the default): one file, WAL with
  ``synchronous=FULL``, written by a writer thread of the store's own.
- PostgreSQL (`ledger._postgres`): any libpq URL, through asyncpg; many
  brokers' stores may share one database, each fenced by its slots.

`LedgerStore.open` picks the engine from its first argument: a
``postgresql://`` (or ``postgres://``) URL, or a file path.

The record format is the engine's concern only as bytes: an entry is its
id, a ``meta`` integer the ledger's user gives it (the partition stores its
message count there, so that a start learns entry sizes without reading
blobs) and its data. Entry ids are at most 40 bits and ledger ids 23 (the
key ``ledger_id << 40 | entry_id`` both engines are handed).

The store hands the engine what a turn of the event loop appended, as one
request; the engine commits whatever reached it while its previous commit
ran, together, in the order it came, and answers each request in order.
Append order is durability order, across all the ledgers of a store: an
append made after another (in the event loop's order) is committed in the
same transaction or a later one, and never without it, because a failed
commit stops the store (fail-stop: every later write is refused until it
is reopened). The coordinator relies on this to let participants write
right behind its log records when they share a store (see `tc`).

Fencing (PostgreSQL): a store opened with ``slot_of`` gives every ledger a
slot (or none) and checks, in each transaction that writes a slot's
ledgers, that the database still names this store's owner and epoch for the
slot (`ledger._postgres` says how). A commit that fails the check writes
nothing and fails with `LedgerFencedError`; the store then refuses every
later write, as after any failed commit.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sortedcontainers import SortedList

from ledger import _writer
from ledger._base import EngineSink, Entry, LedgerError, LedgerFailedError, LedgerFencedError
from ledger._stats import COMMIT_SECONDS_BOUNDS, COMMIT_SIZE_BOUNDS, Buckets

__all__ = [
    "Engine",
    "EngineSink",
    "Entry",
    "Ledger",
    "LedgerError",
    "LedgerFailedError",
    "LedgerFencedError",
    "LedgerStore",
    "is_postgres_url",
    "read_runs",
]

log = logging.getLogger(__name__)

# How long a lazy append (see `Ledger.append`) waits for a group commit to
# go with before it starts one of its own.
LAZY_DELAY = 0.005
CLOSE_ROUNDS = 10  # rounds of follow-up writes `LedgerStore.close` waits for

_MAX_ENTRY_ID = _writer.MAX_ENTRY_ID
_key = _writer.key  # ledger_id << 40 | entry_id
LOCK_WAIT = 10.0  # seconds a store waits for another writer of its database to go
DEFAULT_SLOTS = 64  # slots of a PostgreSQL database made by its first store

# A ledger's slot: ``slot_of(ledger name, slots of the database)``; None: no slot.
SlotOf = Callable[[str, int], "int | None"]


def is_postgres_url(location: object) -> bool:
    """Does ``location`` name a PostgreSQL database (a libpq URL)?"""
    return isinstance(location, str) and location.startswith(("postgresql://", "postgres://"))


class Engine(Protocol):
    """A database under a `LedgerStore` (see the module docstring).

    Requests, each with a sequence number the store counts up from 1
    (``slots``, ``slot``: only to an engine that ``fences``):

        ("write", rows, trims[, slots])  rows: [(ledger_id << 40 | entry_id,
            meta, data)], trims: [(ledger_id, first, next)], slots: the
            slots of the ledgers written; answer ``(commits, rows, seconds)``:
            the group commits done so far, and the rows and duration of the
            one that wrote it
        ("create", name[, slot])  answer: the ledger's id
        ("delete", ledger_id[, slot])

    Answers go to `EngineSink._answered`, in the order of the requests;
    consecutive writes may share one group commit. After a failed commit
    every later request is answered with that failure (fail-stop).
    """

    location: str  # for messages (no password)
    fences: bool  # does it take slots (and check them on every write)?

    def attach(self, sink: EngineSink) -> None: ...

    async def load_catalog(self, pack: Callable[[int, int, int], int]) -> dict[str, int]:
        """Every ledger's name -> ``pack(id, first entry id, next entry id)``."""
        ...

    def submit(self, seq: int, request: tuple[Any, ...]) -> None: ...

    async def close(self) -> None:
        """Answer everything submitted, then let go of the database."""
        ...

    async def abandon(self) -> None:
        """Let go of the database at once, answering nothing more."""
        ...

    async def read(self, ledger_id: int, start: int, end: int) -> list[Entry]: ...

    async def read_meta(self, ledger_id: int) -> list[tuple[int, int]]: ...

    async def read_sizes(self, ledger_id: int) -> list[tuple[int, int]]: ...


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
    """A write handed to the engine: its operations, in order, the
    ledgers it trims (their new first entry ids) and how many entries it adds."""

    batch: list[_Append | _Trim]
    trims: dict[Ledger, int]
    appended: int


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


class LedgerStore:
    """Ledgers in one database, written by group commits on an `Engine`."""

    def __init__(
        self,
        engine: Engine,
        cache_entries: int,
        cache_bytes: int,
        slot_of: SlotOf | None = None,
        slot_count: int = 0,
    ) -> None:
        self.location = engine.location
        self.cache_entries = cache_entries
        self.cache_bytes = cache_bytes
        self._engine = engine
        # A ledger's slot, when the engine fences (None: no fencing).
        self._slot_of = slot_of if engine.fences else None
        self.slot_count = slot_count  # slots of the database (0: it has none)
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
        # Appends and trims not yet handed to the engine.
        self._queue: collections.deque[_Append | _Trim] = collections.deque()
        self._send_scheduled = False  # a `_send` is due this turn of the loop
        # What the engine has not answered yet, in the order it was sent
        # (it answers in that order): writes, and the futures of ledger
        # creations and deletions.
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
        self._failed: LedgerFailedError | None = None
        # Done (with the error) when the store fails: a broker stops on it.
        self.failure: asyncio.Future[LedgerError] = self._loop.create_future()
        self.commits = 0  # group commits done, for stats and benchmarks
        self.appends = 0
        # Each group commit's appends, and how long the engine took to commit
        # it (inserts, trims, the COMMIT and its fsync), for /metrics.
        self.commit_sizes = Buckets(COMMIT_SIZE_BOUNDS)
        self.commit_seconds = Buckets(COMMIT_SECONDS_BOUNDS)
        engine.attach(self)

    @classmethod
    async def open(
        cls,
        location: str | Path,
        *,
        cache_entries: int = 4096,
        cache_bytes: int = 16 << 20,
        lock_wait: float = LOCK_WAIT,
        owner: str | None = None,
        slot_of: SlotOf | None = None,
        slots: int = DEFAULT_SLOTS,
    ) -> LedgerStore:
        """Open (or create) the database at ``location`` and load its catalog.

        ``location``: a file path (SQLite: starts the store's writer
        thread; raises `LedgerError` if it cannot start, for instance when
        another broker's store still holds this database after
        ``lock_wait`` seconds), or a PostgreSQL URL (`is_postgres_url`).

        PostgreSQL only: ``slots``, the slots of a database this store
        creates (an existing database keeps its own: `slot_count`);
        ``owner`` and ``slot_of``, the name this store writes as and each
        ledger's slot (``slot_of(name, slot_count)``, None for none). With
        them every write checks the slots it touches (fencing); the store
        holds no slot until `take_slots`. Without them it checks nothing
        (a store used alone: tools, tests of the store).
        """
        if is_postgres_url(location):
            from ledger._postgres import PostgresEngine

            engine: Engine = await PostgresEngine.open(str(location), owner, slots)
        else:
            from ledger._sqlite import SqliteEngine

            engine = await SqliteEngine.open(Path(location), lock_wait)
        try:
            count = getattr(engine, "slot_count", 0)
            store = cls(engine, cache_entries, cache_bytes, slot_of if owner else None, count)
            store._ledgers = dict(await engine.load_catalog(_pack))
            store._names.update(store._ledgers)
        except BaseException:
            await engine.abandon()
            raise
        return store

    async def take_slots(self, slots: Iterable[int]) -> dict[int, int]:
        """Take ``slots`` for this store's owner (PostgreSQL): each slot's
        epoch goes up by one, which fences whoever held it, and every later
        write to its ledgers checks that epoch. Returns slot -> epoch. The
        catalog is loaded again afterwards (what the previous owner wrote
        up to its last commit is in it)."""
        self._check_open()
        take = getattr(self._engine, "take_slots", None)
        if take is None or not self._engine.fences:
            raise LedgerError(f"the store {self.location} has no slots (SQLite, or no owner)")
        if self._in_use or self._queue or self._unanswered:
            raise LedgerError("take slots before any ledger is used")
        epochs: dict[int, int] = await take(list(slots))
        self._ledgers = dict(await self._engine.load_catalog(_pack))
        self._names = SortedList(self._ledgers)
        return epochs

    def slot_epoch(self, slot: int) -> int | None:
        """The epoch at which this store writes ``slot``'s ledgers (None: it
        does not hold it, or has no slots)."""
        epochs = getattr(self._engine, "epochs", None)
        return None if epochs is None else epochs.get(slot)

    async def hold_slot(self, slot: int, epoch: int) -> list[str]:
        """Write the ledgers of ``slot`` at ``epoch`` from now on (PostgreSQL,
        a store with an owner): the slot was taken at that epoch by this
        store's owner elsewhere (`cluster.Member`, through the membership
        tables). Their catalog is read again (the previous owner may have
        created, written, trimmed or deleted them up to its last commit).
        No ledger of the slot may be in use here. Returns their names."""
        self._check_open()
        slot_of = self._slot_of
        epochs = getattr(self._engine, "epochs", None)
        if slot_of is None or epochs is None:
            raise LedgerError(f"the store {self.location} has no slots (SQLite, or no owner)")
        mine = [n for n in self._ledgers if slot_of(n, self.slot_count) == slot]
        busy = [n for n in mine if not isinstance(self._ledgers[n], int)]
        if busy:
            raise LedgerError(f"slot {slot}: ledgers still in use here: {busy[:5]}")
        catalog = await self._engine.load_catalog(_pack)
        for name in mine:
            del self._ledgers[name]
            self._names.remove(name)
        found = [n for n in catalog if slot_of(n, self.slot_count) == slot]
        for name in found:
            self._ledgers[name] = catalog[name]
            self._names.add(name)
        epochs[slot] = epoch
        return found

    async def read_fresh(self, name: str) -> list[Entry]:
        """Every entry of the ledger ``name`` as the database holds it now
        (not this store's catalog: another broker may be writing it); empty
        if there is no such ledger."""
        catalog = await self._engine.load_catalog(_pack)
        packed = catalog.get(name)
        if packed is None:
            return []
        ledger_id, first, nxt = _unpack(packed)
        if nxt <= first:
            return []
        return await self._engine.read(ledger_id, first, nxt - 1)

    async def settle(self) -> None:
        """Return once every append and trim queued so far has been
        answered by the engine (durable, or failed)."""
        while self._queue or self._unanswered:
            if self._queue and self._failed is None and not self._send_scheduled:
                self._send()
            if self._unanswered:
                self._drained = self._loop.create_future()
                await self._drained
            else:
                await asyncio.sleep(0)
            if self._failed is not None and not self._unanswered:
                return

    def drop_slot(self, slot: int) -> int:
        """Stop writing the ledgers of ``slot`` (after `settle`: the slot is
        released or handed over): its epoch is forgotten, so any later write
        to them is refused as fenced, and every object of them is given
        back whatever is under way (its users are gone). Returns how many
        objects were given back."""
        epochs = getattr(self._engine, "epochs", None)
        slot_of = self._slot_of
        if epochs is not None:
            epochs.pop(slot, None)
        if slot_of is None:
            return 0
        dropped = 0
        for name, value in list(self._ledgers.items()):
            if isinstance(value, int) or slot_of(name, self.slot_count) != slot:
                continue
            self._ledgers[name] = _pack(value.id, value.first_entry_id, value._next)
            self._in_use -= 1
            value.released = True
            value._cache = None
            value._cache_head = value._cache_bytes = 0
            dropped += 1
        return dropped

    @property
    def epochs(self) -> dict[int, int]:
        """The slots this store holds, with their epochs (empty on SQLite)."""
        return dict(getattr(self._engine, "epochs", {}))

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
            log.warning(
                "%s: closed with %d writes still coming in", self.location, len(self._queue)
            )
            closed = LedgerFailedError(f"ledger store {self.location} is closed")
            for op in self._queue:
                if not op.future.done():
                    op.future.set_exception(closed)
            self._queue.clear()
        await self._engine.close()

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
        if self._slot_of is None:
            ledger_id = await self._request("create", name)
        else:
            ledger_id = await self._request("create", name, self._slot_of(name, self.slot_count))
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
        if self._slot_of is None:
            await self._request("delete", ledger.id)
        else:
            await self._request("delete", ledger.id, self._slot_of(name, self.slot_count))

    # -- the writer ---------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerFailedError(f"ledger store {self.location} is closed")
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
        """Hand what is queued to the engine."""
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
        pending = _Sent(batch, heads, len(rows))
        if self._slot_of is None:
            self._write(("write", rows, trims), pending)
        else:
            self._write(("write", rows, trims, self._slots_of(batch)), pending)

    def _slots_of(self, batch: list[_Append | _Trim]) -> tuple[int, ...]:
        """The slots of the ledgers ``batch`` writes."""
        slot_of, count = self._slot_of, self.slot_count
        assert slot_of is not None
        seen: set[Ledger] = set()
        slots: set[int] = set()
        for op in batch:
            ledger = op.ledger
            if ledger not in seen:
                seen.add(ledger)
                slot = slot_of(ledger.name, count)
                if slot is not None:
                    slots.add(slot)
        return tuple(sorted(slots))

    def _request(self, *request: object) -> asyncio.Future[Any]:
        """A creation or deletion, in order with the writes sent before it."""
        if self._send_scheduled:
            self._send()  # (what was appended before goes first)
        fut: asyncio.Future[Any] = self._loop.create_future()
        self._write(request, fut)
        return fut

    def _write(self, request: tuple[object, ...], pending: _Sent | asyncio.Future[Any]) -> None:
        self._seq += 1
        self._unanswered.append((self._seq, pending))
        self._engine.submit(self._seq, request)

    def _answered(self, seq: int, error: str | LedgerError | None, result: Any) -> None:
        """The engine's answer to request ``seq`` (they come in order)."""
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
        else:
            if isinstance(error, LedgerFencedError):  # (fenced: fail-stop, as a failed commit)
                self._fail([], error)
            if pending.done():
                pass
            elif error is None:
                pending.set_result(result)
            else:
                failed = error if isinstance(error, LedgerError) else LedgerFailedError(error)
                pending.set_exception(self._failed or failed)
        if not self._unanswered and self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    def _engine_lost(self, reason: str) -> None:
        """The engine is gone: whatever it did not answer is lost."""
        if self._unanswered or not self._closed:
            self._fail([], reason)

    def _fail(self, batch: list[_Append | _Trim], error: str | LedgerError) -> None:
        # Fail-stop: once a write failed, nothing more is written. Callers
        # rely on append order meaning durability order (an entry appended
        # after another is durable only if that one is: the coordinator lets
        # participants write right behind its log records), which a later
        # commit succeeding after a failed one would break; and after a
        # failed fsync what is on disk is unknown (PostgreSQL learned this
        # the hard way). The broker has to be restarted. (The engine refuses
        # what it receives after a failure, too.)
        if self._failed is None:
            self._failed = _error(
                self.location, error, "; the store refuses writes until it is reopened"
            )
            log.critical("%s", self._failed)
            if not self.failure.done():
                self.failure.set_result(self._failed)
        first = _error(self.location, error)
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
        return await self._engine.read(ledger.id, start, end)

    async def _read_meta(self, ledger: Ledger) -> list[tuple[int, int]]:
        self._check_open()
        return await self._engine.read_meta(ledger.id)

    async def _read_sizes(self, ledger: Ledger) -> list[tuple[int, int]]:
        self._check_open()
        return await self._engine.read_sizes(ledger.id)


def _error(location: str, error: str | LedgerError, then: str = "") -> LedgerFailedError:
    """The error of a failed group commit (a `LedgerFencedError` stays one)."""
    text = f"group commit to {location} failed: {error}{then}"
    if isinstance(error, LedgerFencedError):
        return LedgerFencedError(text, error.slots)
    return LedgerFailedError(text)
