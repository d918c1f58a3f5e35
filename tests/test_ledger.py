"""LedgerStore / Ledger: ids, group commit, durability, reads, trims, listeners.

The tests of the store's behaviour run on both engines (``db`` is a SQLite
file or the URL of a fresh PostgreSQL database); those of SQLite's writer
process take ``sqlite_db``. Fencing: tests/test_pgstore.py."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from ledger import Entry, Ledger, LedgerError, LedgerStore, pass_failure, settled

Location = Path | str  # a SQLite file, or a PostgreSQL URL


@pytest.fixture(params=["sqlite", "postgresql"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    if request.param == "sqlite":
        return tmp_path / "ledgers.db"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    return tmp_path / "ledgers.db"


@pytest.fixture
async def store(db: Location) -> AsyncIterator[LedgerStore]:
    s = await LedgerStore.open(db)
    try:
        yield s
    finally:
        await s.close()


def payload(i: int) -> bytes:
    return f"entry-{i}".encode()


async def fill(ledger: Ledger, n: int, meta: int = 1) -> list[int]:
    return list(await asyncio.gather(*(ledger.append(payload(i), meta) for i in range(n))))


def stored_row(db: Location, ledger: Ledger, entry_id: int) -> tuple[int, bytes] | None:
    """Read one entry with a separate connection (plain sqlite3, or psql):
    the layout of ledger/_sqlite.py and ledger/_postgres.py."""
    if isinstance(db, str):
        out = subprocess.run(
            ["psql", db, "-At", "-c", "SELECT meta, encode(data, 'hex') FROM txnbuf.entries "
             f"WHERE ledger = {ledger.id} AND entry = {entry_id}"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        if not out:
            return None
        meta, data = out.split("|")
        return int(meta), bytes.fromhex(data)
    conn = sqlite3.connect(db)
    try:
        row = conn.execute(
            "SELECT meta, data FROM entries WHERE id = ?", ((ledger.id << 40) | entry_id,)
        ).fetchone()
    finally:
        conn.close()
    return row


# -- appends -------------------------------------------------------------------


async def test_append_ids_increase_from_0_per_ledger(store: LedgerStore) -> None:
    a = await store.open_ledger("a")
    b = await store.open_ledger("b")
    assert (a.first_entry_id, a.last_entry_id, a.entry_count) == (0, -1, 0)
    ids_a, ids_b = [], []
    for i in range(5):
        ids_a.append(await a.append(payload(i)))
        ids_b.append(await b.append(payload(i)))
        ids_b.append(await b.append(payload(i)))
    assert ids_a == list(range(5))
    assert ids_b == list(range(10))
    assert (a.last_entry_id, b.last_entry_id) == (4, 9)
    assert a.entry_count == 5


async def test_concurrent_appends_get_ids_in_call_order(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    futures = [ledger.append(payload(i)) for i in range(50)]
    assert [await f for f in futures] == list(range(50))
    entries = await ledger.read(0, 49)
    assert [e.data for e in entries] == [payload(i) for i in range(50)]


async def test_future_resolves_only_after_commit(store: LedgerStore, db: Location) -> None:
    ledger = await store.open_ledger("a")
    commits = store.commits
    seen_at_resolution: list[object] = []
    fut = ledger.append(b"durable", meta=3)
    fut.add_done_callback(lambda f: seen_at_resolution.append(stored_row(db, ledger, f.result())))
    # Queued, not yet committed: nothing visible, nothing resolved.
    assert not fut.done()
    assert ledger.last_entry_id == -1
    assert await ledger.read(0, 10) == []
    assert stored_row(db, ledger, 0) is None
    assert await fut == 0
    assert store.commits == commits + 1
    # When the future resolved, the row was already committed (seen by another connection).
    assert seen_at_resolution == [(3, b"durable")]


async def test_many_concurrent_appends_share_few_group_commits(store: LedgerStore) -> None:
    ledgers = [await store.open_ledger(f"l{i}") for i in range(4)]
    commits, appends = store.commits, store.appends
    futures = [ledgers[i % 4].append(payload(i)) for i in range(1000)]
    await asyncio.gather(*futures)
    assert store.appends - appends == 1000
    assert 1 <= store.commits - commits <= 10


async def test_appends_queued_during_a_commit_go_in_the_next_one(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    commits = store.commits
    first = ledger.append(b"0")
    await asyncio.sleep(0)  # the writer takes the batch [0] and starts committing
    rest = [ledger.append(payload(i)) for i in range(1, 200)]
    assert await asyncio.gather(first, *rest) == list(range(200))
    assert store.commits - commits <= 3


async def test_a_lazy_append_goes_with_the_next_commit(store: LedgerStore, db: Location) -> None:
    ledger = await store.open_ledger("a")
    commits = store.commits
    lazy = ledger.append(b"lazy", lazy=True)
    await asyncio.sleep(0)
    assert not lazy.done()  # no commit of its own yet
    assert await ledger.append(b"eager") == 1
    assert lazy.done() and lazy.result() == 0  # both in one commit, in order
    assert store.commits == commits + 1
    assert stored_row(db, ledger, 0) == (1, b"lazy")


async def test_a_lazy_append_alone_is_committed_after_the_delay(
    store: LedgerStore, db: Location
) -> None:
    import ledger._store as store_module

    ledger = await store.open_ledger("a")
    loop = asyncio.get_running_loop()
    start = loop.time()
    assert await ledger.append(b"alone", lazy=True) == 0
    assert loop.time() - start >= store_module.LAZY_DELAY * 0.9
    assert stored_row(db, ledger, 0) == (1, b"alone")


async def test_close_commits_lazy_appends(db: Location) -> None:
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    lazy = ledger.append(b"lazy", lazy=True)
    await _close_or_fail(store, 1.5)
    assert lazy.result() == 0
    assert stored_row(db, ledger, 0) == (1, b"lazy")


# -- reads ---------------------------------------------------------------------


def expected(start: int, end: int, meta: int = 1) -> list[Entry]:
    return [Entry(i, meta, payload(i)) for i in range(start, end + 1)]


async def read_back(db: Location, first: int, last: int, **options: Any) -> list[Entry]:
    """Entries ``first`` .. ``last`` of ledger "a", read by a store opened
    anew (``options`` go to `LedgerStore.open`)."""
    store = await LedgerStore.open(db, **options)
    try:
        ledger = await store.open_ledger("a")
        return await ledger.read(first, last)
    finally:
        await store.close()


RANGES = [(0, 19), (0, 0), (3, 7), (15, 19), (17, 19), (19, 19), (10, 18), (-5, 2), (18, 99)]


async def test_reads_from_disk_and_tail_cache_agree(db: Location) -> None:
    small = await LedgerStore.open(db, cache_entries=2)
    disk_reads: list[tuple[int, int]] = []
    real_read = small._read

    async def spy(ledger: Ledger, start: int, end: int) -> list[Entry]:
        disk_reads.append((start, end))
        return await real_read(ledger, start, end)

    small._read = spy  # type: ignore[method-assign]
    try:
        ledger = await small.open_ledger("a")
        await fill(ledger, 20)
        for start, end in RANGES:
            assert await ledger.read(start, end) == expected(max(start, 0), min(end, 19))
        # Only the last two entries are cached: the tail is served from memory ...
        disk_reads.clear()
        assert await ledger.read(18, 19) == expected(18, 19)
        assert disk_reads == []
        # ... older entries come from SQLite, a straddling range from both.
        assert await ledger.read(5, 19) == expected(5, 19)
        assert disk_reads == [(5, 17)]
    finally:
        await small.close()

    # Reopened with the default cache: everything from disk, same entries.
    big = await LedgerStore.open(db)
    try:
        ledger = big.get_ledger("a")
        assert ledger is not None
        assert (ledger.first_entry_id, ledger.last_entry_id) == (0, 19)
        for start, end in RANGES:
            assert await ledger.read(start, end) == expected(max(start, 0), min(end, 19))
    finally:
        await big.close()


async def test_cache_byte_limit_sends_old_entries_to_disk(db: Location) -> None:
    store = await LedgerStore.open(db, cache_bytes=30)  # each payload is ~8 bytes
    try:
        ledger = await store.open_ledger("a")
        await fill(ledger, 20)
        assert await ledger.read(0, 19) == expected(0, 19)
    finally:
        await store.close()


async def test_read_spanning_disk_and_cache_while_a_commit_evicts_the_cache(db: Location) -> None:
    # Ledger.read computes where the cache starts, awaits the disk part, then
    # indexes the cache with that stale start. A commit that lands during the
    # disk read (a reader catching up while producers write) shifts the cache.
    store = await LedgerStore.open(db, cache_entries=2)
    try:
        ledger = await store.open_ledger("a")
        await fill(ledger, 10)  # cache holds entries 8 and 9
        real_read = store._read

        async def read_then_commit(lg: Ledger, start: int, end: int) -> list[Entry]:
            rows = await real_read(lg, start, end)
            await ledger.append(payload(10))  # commits while the read is in flight
            return rows

        store._read = read_then_commit  # type: ignore[method-assign]
        assert await ledger.read(0, 9) == expected(0, 9)
    finally:
        await store.close()


async def test_read_meta_gives_ids_and_meta_without_data(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    for i in range(5):
        await ledger.append(payload(i), meta=i * 10)
    assert await ledger.read_meta() == [(i, i * 10) for i in range(5)]
    other = await store.open_ledger("b")
    assert await other.read_meta() == []


async def test_meta_round_trips_through_reopen(db: Location) -> None:
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    metas = [0, 1, 2, 7, 2**40, -3]
    for i, m in enumerate(metas):
        await ledger.append(payload(i), meta=m)
    assert [e.meta for e in await ledger.read(0, 5)] == metas
    await store.close()

    store = await LedgerStore.open(db)
    try:
        ledger = await store.open_ledger("a")
        assert [e.meta for e in await ledger.read(0, 5)] == metas
        assert await ledger.read_meta() == list(enumerate(metas))
    finally:
        await store.close()


async def test_wait_for_returns_once_entry_is_durable(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    waiter = asyncio.ensure_future(ledger.wait_for(2))
    await ledger.append(b"0")
    await ledger.append(b"1")
    assert not waiter.done()
    await ledger.append(b"2")
    await asyncio.wait_for(waiter, 1)
    await asyncio.wait_for(ledger.wait_for(0), 1)  # already durable


# -- trims ---------------------------------------------------------------------


async def test_trim_removes_entries_below_and_survives_reopen(db: Location) -> None:
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    other = await store.open_ledger("b")
    await fill(ledger, 10)
    await fill(other, 3)
    await ledger.trim(4)
    assert (ledger.first_entry_id, ledger.last_entry_id, ledger.entry_count) == (4, 9, 6)
    assert await ledger.read(0, 9) == expected(4, 9)
    assert [i for i, _ in await ledger.read_meta()] == list(range(4, 10))
    assert stored_row(db, ledger, 3) is None
    assert stored_row(db, ledger, 4) == (1, payload(4))
    await ledger.trim(2)  # below the first entry: nothing changes
    assert ledger.first_entry_id == 4
    await store.close()

    store = await LedgerStore.open(db)
    try:
        ledger = await store.open_ledger("a")
        assert (ledger.first_entry_id, ledger.last_entry_id) == (4, 9)
        assert await ledger.read(0, 100) == expected(4, 9)
        assert await ledger.append(b"x") == 10
        other = await store.open_ledger("b")
        assert await other.read(0, 2) == expected(0, 2)  # other ledgers untouched
    finally:
        await store.close()


async def test_trim_beyond_the_end_trims_everything(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    await fill(ledger, 5)
    await ledger.trim(1000)
    assert (ledger.first_entry_id, ledger.last_entry_id, ledger.entry_count) == (5, 4, 0)
    assert await ledger.read(0, 1000) == []
    assert await ledger.append(b"next") == 5


async def test_ids_never_repeat_after_trimming_everything_and_reopening(db: Location) -> None:
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    await fill(ledger, 7)
    await ledger.trim(7)
    await store.close()

    store = await LedgerStore.open(db)
    try:
        ledger = await store.open_ledger("a")
        assert (ledger.first_entry_id, ledger.last_entry_id) == (7, 6)
        assert await ledger.append(b"after") == 7
        assert await ledger.read(0, 7) == [Entry(7, 1, b"after")]
    finally:
        await store.close()


async def test_append_and_trim_in_one_group_commit(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    await fill(ledger, 3)
    futures = [ledger.append(payload(3)), ledger.trim(2), ledger.append(payload(4))]
    results = await asyncio.gather(*futures)
    assert results == [3, None, 4]
    assert ledger.first_entry_id == 2
    assert await ledger.read(0, 10) == expected(2, 4)


# -- listeners -----------------------------------------------------------------


async def test_listeners_get_new_entries_before_futures_resolve(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    calls: list[tuple[str, list[Entry], bool]] = []
    futures: list[asyncio.Future[int]] = []

    def first(lg: Ledger, entries: list[Entry]) -> None:
        assert lg is ledger
        calls.append(("first", list(entries), any(f.done() for f in futures)))

    def second(lg: Ledger, entries: list[Entry]) -> None:
        calls.append(("second", list(entries), any(f.done() for f in futures)))

    ledger.add_listener(first)
    ledger.add_listener(second)
    futures.extend(ledger.append(payload(i), meta=2) for i in range(3))
    await asyncio.gather(*futures)
    batch = expected(0, 2, meta=2)
    assert calls == [("first", batch, False), ("second", batch, False)]

    ledger.remove_listener(first)
    ledger.remove_listener(first)  # removing twice is harmless
    futures[:] = [ledger.append(payload(3), meta=2)]
    await futures[0]
    assert calls[2:] == [("second", expected(3, 3, meta=2), False)]


async def test_failing_listener_does_not_stop_others_or_the_append(store: LedgerStore) -> None:
    ledger = await store.open_ledger("a")
    seen: list[int] = []

    def broken(_lg: Ledger, _entries: list[Entry]) -> None:
        raise RuntimeError("listener bug")

    ledger.add_listener(broken)
    ledger.add_listener(lambda _lg, entries: seen.extend(e.entry_id for e in entries))
    assert await ledger.append(b"x") == 0
    assert seen == [0]


async def test_listeners_are_per_ledger(store: LedgerStore) -> None:
    a = await store.open_ledger("a")
    b = await store.open_ledger("b")
    seen: list[bytes] = []
    a.add_listener(lambda _lg, entries: seen.extend(e.data for e in entries))
    await asyncio.gather(a.append(b"for-a"), b.append(b"for-b"))
    assert seen == [b"for-a"]


# -- ledgers -------------------------------------------------------------------


async def test_open_ledger_is_durable_and_idempotent(db: Location) -> None:
    store = await LedgerStore.open(db)
    a = await store.open_ledger("x/a")
    assert await store.open_ledger("x/a") is a
    await store.open_ledger("x/b")
    await store.open_ledger("y")
    assert store.ledger_names() == ["x/a", "x/b", "y"]
    assert store.ledger_names("x/") == ["x/a", "x/b"]
    assert store.get_ledger("nope") is None
    await store.close()

    store = await LedgerStore.open(db)
    try:
        assert store.ledger_names() == ["x/a", "x/b", "y"]
    finally:
        await store.close()


async def test_concurrent_open_ledger_of_a_new_name_gives_one_ledger(store: LedgerStore) -> None:
    a, b = await asyncio.gather(store.open_ledger("new"), store.open_ledger("new"))
    assert a is b
    assert store.ledger_names() == ["new"]


# Names whose characters sort around "/" ("-" "." "/" "0" are 0x2d-0x30), and
# topics whose names are prefixes of each other (t1, t10, t1-x, t1.x).
PREFIX_NAMES = [
    "c/t1/0/s", "c/t1/0/s2", "c/t1/1/s", "c/t1/10/s", "c/t10/0/s", "c/t1-x/0/s",
    "c/t1.x/0/s", "c/t1/0/s-x", "c/t1/0/s.x", "c/t10", "c/t1", "d/t1/0", "p/t1/0",
    "c/t0/0/s", "c/t2/0/s", "c0", "c", "b/z", "c/t1/\U0010ffff", "c/t1/\U0010ffffz",
    "c/t1\U0010ffff/0/s", "c/t2\U0010ffff",
]  # fmt: skip
PREFIXES = [
    "", "c", "c/", "c/t1", "c/t1/", "c/t1/0/", "c/t1/1/", "c/t10/", "c/t1-x/", "c/t1.",
    "c/t1/0/s", "c/t3/", "zzz", "a", "c/t1/\U0010ffff", "c/t1\U0010ffff", "\U0010ffff",
]  # fmt: skip


async def test_ledger_names_by_prefix_are_exactly_the_names_with_that_prefix(db: Location) -> None:
    """A prefix is a range of the sorted names: t1's names, not t10's or
    t1-x's; empty for a prefix nothing has; the same after a reopen, and
    after a deletion and a creation."""
    store = await LedgerStore.open(db)
    try:
        await asyncio.gather(*(store.open_ledger(n) for n in PREFIX_NAMES))

        def check(names: list[str]) -> None:
            for prefix in PREFIXES:
                want = sorted(n for n in names if n.startswith(prefix))
                assert store.ledger_names(prefix) == want, prefix

        check(PREFIX_NAMES)
        assert store.ledger_names("c/t1/") == [
            "c/t1/0/s", "c/t1/0/s-x", "c/t1/0/s.x", "c/t1/0/s2", "c/t1/1/s", "c/t1/10/s",
            "c/t1/\U0010ffff", "c/t1/\U0010ffffz",
        ]  # fmt: skip
        assert store.ledger_names("c/t1/1/") == ["c/t1/1/s"]
        assert store.ledger_names("c/t3/") == []
        await store.close()

        store = await LedgerStore.open(db)
        check(PREFIX_NAMES)
        await store.delete_ledger("c/t1/0/s")
        await store.open_ledger("c/t1/0/r")
        names = [n for n in PREFIX_NAMES if n != "c/t1/0/s"] + ["c/t1/0/r"]
        check(names)
        want = ["c/t1/0/r", "c/t1/0/s-x", "c/t1/0/s.x", "c/t1/0/s2"]
        assert store.ledger_names("c/t1/0/") == want
    finally:
        await store.close()


def test_prefix_end_is_the_first_string_past_the_prefix() -> None:
    from ledger._store import _prefix_end

    assert _prefix_end("c/t1/") == "c/t10"
    assert _prefix_end("a\U0010ffff\U0010ffff") == "b"
    assert _prefix_end("") is None
    assert _prefix_end("\U0010ffff") is None


async def test_ledgers_created_together_get_their_own_ids_and_keep_order(db: Location) -> None:
    """Creations that reach the writer together are one transaction; each
    gets its own id, an append queued before them is durable with them,
    and all of them are there after a reopen."""
    store = await LedgerStore.open(db)
    first = await store.open_ledger("first")
    appended = first.append(b"before")
    ledgers = await asyncio.gather(*(store.open_ledger(f"n/{i}") for i in range(50)))
    assert len({lg.id for lg in ledgers}) == 50
    assert await appended == 0
    await asyncio.gather(*(lg.append(lg.name.encode()) for lg in ledgers))
    await store.close()

    store = await LedgerStore.open(db)
    try:
        first = await store.open_ledger("first")
        assert store.ledger_names("n/") == sorted(f"n/{i}" for i in range(50))
        for i in range(50):
            ledger = store.get_ledger(f"n/{i}")
            assert ledger is not None
            assert [e.data for e in await ledger.read(0, 5)] == [f"n/{i}".encode()]
        assert [e.data for e in await first.read(0, 5)] == [b"before"]
    finally:
        await store.close()


async def test_delete_ledger_removes_it_and_its_entries(db: Location) -> None:
    store = await LedgerStore.open(db)
    a = await store.open_ledger("a")
    b = await store.open_ledger("b")
    await fill(a, 5)
    await fill(b, 5)
    await store.delete_ledger("a")
    await store.delete_ledger("never-existed")  # no error
    assert store.get_ledger("a") is None
    assert store.ledger_names() == ["b"]
    assert stored_row(db, a, 0) is None
    await store.close()

    store = await LedgerStore.open(db)
    try:
        assert store.ledger_names() == ["b"]
        again = await store.open_ledger("a")
        assert (again.first_entry_id, again.last_entry_id) == (0, -1)
        assert await again.read(0, 10) == []
        assert await again.append(b"fresh") == 0
        b = await store.open_ledger("b")
        assert await b.read(0, 4) == expected(0, 4)
    finally:
        await store.close()


# -- closing -------------------------------------------------------------------


async def _close_or_fail(store: LedgerStore, seconds: float) -> None:
    """``await store.close()`` in this task; fail (and clean up) if it hangs."""
    try:
        async with asyncio.timeout(seconds):
            await store.close()
    except TimeoutError:
        # Stop the writer and the reader ourselves, so that neither outlives
        # the test.
        await store._engine.abandon()
        pytest.fail(f"LedgerStore.close() did not return within {seconds} s")


async def test_close_flushes_queued_appends(db: Location) -> None:
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    futures = [ledger.append(payload(i)) for i in range(5)]
    await _close_or_fail(store, 1.5)
    assert [f.result() for f in futures] == list(range(5))

    assert await read_back(db, 0, 10) == expected(0, 4)


async def test_close_waits_for_what_durable_callbacks_write(db: Location) -> None:
    """A listener and a done callback that append when an entry is durable
    (as subscriptions write snapshots and buffers their end records): close
    writes their entries too, in a second round, instead of refusing them."""
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    followers: list[asyncio.Future[int]] = []

    def listener(_ledger: Ledger, entries: list[Entry]) -> None:
        if any(e.data == b"first" for e in entries):
            followers.append(ledger.append(b"from the listener"))

    ledger.add_listener(listener)
    first = ledger.append(b"first")
    first.add_done_callback(lambda _f: followers.append(ledger.append(b"from a callback")))
    await _close_or_fail(store, 3.0)
    assert [f.result() for f in followers] == [1, 2]
    assert [e.data for e in await read_back(db, 0, 5)] == [
        b"first",
        b"from the listener",
        b"from a callback",
    ]


async def test_close_when_idle_and_twice(db: Location) -> None:
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    await ledger.append(b"x")
    await _close_or_fail(store, 1.5)
    await _close_or_fail(store, 1.5)  # closing again is a no-op


async def test_two_closes_at_once_both_return(db: Location) -> None:
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    appended = ledger.append(b"x")
    async with asyncio.timeout(3.0):
        await asyncio.gather(store.close(), store.close())
    assert appended.result() == 0


async def test_closed_store_refuses_work(db: Location) -> None:
    store = await LedgerStore.open(db, cache_entries=1)
    ledger = await store.open_ledger("a")
    await fill(ledger, 3)
    await store.close()
    with pytest.raises(LedgerError, match="closed"):
        ledger.append(b"late")
    with pytest.raises(LedgerError, match="closed"):
        ledger.trim(1)
    with pytest.raises(LedgerError, match="closed"):
        await store.open_ledger("b")
    with pytest.raises(LedgerError, match="closed"):
        await ledger.read(0, 2)  # needs the disk


async def test_group_commits_larger_than_one_statement(db: Location) -> None:
    """Rows go in as multi-row INSERTs of at most SQLite's variable limit
    (32766 variables: 10922 rows of three)."""
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    await fill(ledger, 4)
    many = 25_000
    alone = await fill(ledger, many)  # one commit, no trim: 3 statements
    assert alone == list(range(4, 4 + many))
    ledger.trim(2)
    with_trim = await fill(ledger, many)  # the same, inside BEGIN ... COMMIT with the trim
    assert with_trim == list(range(4 + many, 4 + 2 * many))
    await store.close()
    store = await LedgerStore.open(db)
    again = await store.open_ledger("a")
    last = 3 + 2 * many
    assert (again.first_entry_id, again.last_entry_id) == (2, last)
    entries = await again.read(2, last)
    assert [e.data for e in entries] == [payload(i) for i in (2, 3, *range(many), *range(many))]
    await store.close()


async def fail_inserts(store: LedgerStore, db: Location, on: bool) -> None:
    """Make every insert of an entry fail from now on (``on``), as a broken
    disk would, or no longer: a trigger, made on another connection."""
    if isinstance(db, Path):  # (on the reader's connection: SQLite's triggers are the file's)
        reader = store._engine._reader  # type: ignore[attr-defined]
        if on:
            await reader.execute(
                "CREATE TRIGGER fail BEFORE INSERT ON entries "
                "BEGIN SELECT RAISE(ABORT, 'disk I/O error'); END"
            )
        else:
            await reader.execute("DROP TRIGGER fail")
        return
    import asyncpg

    conn = await asyncpg.connect(db)
    try:
        if on:
            await conn.execute(
                "CREATE FUNCTION fail() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'disk I/O error'; END $$; "
                "CREATE TRIGGER fail BEFORE INSERT ON txnbuf.entries "
                "FOR EACH ROW EXECUTE FUNCTION fail()"
            )
        else:
            await conn.execute("DROP TRIGGER fail ON txnbuf.entries; DROP FUNCTION fail()")
    finally:
        await conn.close()


async def test_a_failed_commit_stops_the_store(db: Location) -> None:
    """Append order is durability order: after a failed commit nothing later
    may land without it, so the store refuses every write until reopened."""
    store = await LedgerStore.open(db)
    ledger = await store.open_ledger("a")
    await fill(ledger, 2)
    await fail_inserts(store, db, True)
    first = ledger.append(b"lost")
    await asyncio.sleep(0)  # the engine takes the first one alone
    second = ledger.append(b"queued behind it")
    with pytest.raises(LedgerError, match="disk I/O error"):
        await first
    with pytest.raises(LedgerError, match="refuses writes"):
        await second
    assert store.failure.done()
    await fail_inserts(store, db, False)
    with pytest.raises(LedgerError, match="refuses writes"):
        ledger.append(b"later")
    with pytest.raises(LedgerError, match="refuses writes"):
        ledger.trim(1)
    assert ledger.last_entry_id == 1
    await store.close()
    reopened = await LedgerStore.open(db)
    again = await reopened.open_ledger("a")
    assert [e.data for e in await again.read(0, again.last_entry_id)] == [
        payload(0),
        payload(1),
    ]
    assert await again.append(b"after reopening") == 2
    await reopened.close()


# -- crash ---------------------------------------------------------------------

CRASH_WRITER = r"""
import asyncio, sys
from ledger import LedgerStore

async def main(path):
    store = await LedgerStore.open(path)
    ledger = await store.open_ledger("crash")
    sem = asyncio.Semaphore(16)  # keep several appends in flight: group commits

    async def one(i):
        try:
            entry_id = await ledger.append(b"payload-%d" % i, meta=i % 7)
            if entry_id != i:
                sys.exit(f"entry id {entry_id} for append {i}")
            sys.stdout.write(f"{entry_id}\n")
            sys.stdout.flush()
        finally:
            sem.release()

    i = 0
    tasks = set()
    while True:
        await sem.acquire()
        task = asyncio.ensure_future(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1

asyncio.run(main(sys.argv[1]))
"""


def run_writer_until_acked_then_sigkill(db: Location, want: int) -> list[int]:
    """Run CRASH_WRITER on ``db``, collect ``want`` acknowledged ids, SIGKILL it."""
    child = subprocess.Popen(
        [sys.executable, "-c", CRASH_WRITER, str(db)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    acked: list[int] = []
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 30
        while len(acked) < want and time.monotonic() < deadline:
            line = child.stdout.readline()
            if not line:
                break
            acked.append(int(line))
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        stderr = child.stderr.read() if child.stderr else ""
        for pipe in (child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    assert child.returncode == -signal.SIGKILL, stderr
    assert len(acked) >= want, stderr
    return acked


@pytest.mark.crash
async def test_acknowledged_appends_survive_sigkill(db: Location) -> None:
    acked = await asyncio.to_thread(run_writer_until_acked_then_sigkill, db, 300)

    store = await LedgerStore.open(db)
    try:
        ledger = store.get_ledger("crash")
        assert ledger is not None
        assert ledger.last_entry_id >= max(acked)
        entries = {e.entry_id: e for e in await ledger.read(0, ledger.last_entry_id)}
        for entry_id in acked:
            assert entry_id in entries, f"acknowledged entry {entry_id} lost"
            assert entries[entry_id].data == b"payload-%d" % entry_id
            assert entries[entry_id].meta == entry_id % 7
        # Stored entries are contiguous from 0: no holes after the crash.
        assert sorted(entries) == list(range(ledger.last_entry_id + 1))
        # The reopened ledger carries on after the last stored id.
        last = ledger.last_entry_id
        assert await ledger.append(b"after") == last + 1
    finally:
        await store.close()


# -- the writer thread ---------------------------------------------------------


async def test_a_second_store_on_the_same_database_is_refused(sqlite_db: Path) -> None:
    """One writer per database: the second waits for the first, then gives up."""
    first = await LedgerStore.open(sqlite_db)
    try:
        await fill(await first.open_ledger("a"), 2)
        with pytest.raises(LedgerError, match="in use by another process"):
            await LedgerStore.open(sqlite_db, lock_wait=0.3)
    finally:
        await first.close()
    assert await read_back(sqlite_db, 0, 9, lock_wait=5) == expected(0, 1)


def break_the_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the writer thread fail on its next request, as a bug would."""

    def broken(self: object, batch: object) -> object:
        raise RuntimeError("a bug in the writer")

    monkeypatch.setattr("ledger._writer.Writer.handle", broken)


async def test_a_failed_writer_stops_the_store(
    sqlite_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(sqlite_db)
    ledger = await store.open_ledger("a")
    await fill(ledger, 2)
    break_the_writer(monkeypatch)
    pending = ledger.append(b"in flight")
    with pytest.raises(LedgerError, match="writer thread failed"):
        await pending
    with pytest.raises(LedgerError, match="refuses writes"):
        ledger.append(b"after")
    assert ledger.last_entry_id == 1
    await _close_or_fail(store, 5)
    assert await read_back(sqlite_db, 0, 9, lock_wait=5) == expected(0, 1)


OWNER = r"""
import asyncio, sys
from ledger import LedgerStore

async def main(path):
    store = await LedgerStore.open(path)
    await (await store.open_ledger("a")).append(b"x")
    print("ready", flush=True)
    await asyncio.sleep(60)

asyncio.run(main(sys.argv[1]))
"""


def start_owner_and_sigkill_it(db: Location) -> None:
    """Start OWNER on ``db``; once it has written, SIGKILL it."""
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(db)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "ready"
        owner.kill()
        owner.wait(timeout=10)
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
        if owner.stdout is not None:
            owner.stdout.close()


@pytest.mark.crash
async def test_a_sigkilled_owner_leaves_the_database_to_the_next(sqlite_db: Path) -> None:
    """A SIGKILLed broker's lock goes with its process: the next store opens
    the database at once, with what was written."""
    await asyncio.to_thread(start_owner_and_sigkill_it, sqlite_db)
    store = await LedgerStore.open(sqlite_db, lock_wait=0.5)
    try:
        ledger = store.get_ledger("a")
        assert ledger is not None and ledger.last_entry_id == 0
    finally:
        await store.close()


async def test_settled_waits_for_any_outcome_and_raises_none() -> None:
    loop = asyncio.get_running_loop()
    for settle in (
        lambda f: f.set_result(1),
        lambda f: f.set_exception(LedgerError("failed")),
        lambda f: f.cancel(),
    ):
        future: asyncio.Future[int] = loop.create_future()
        waiting = loop.create_task(settled(future))
        await asyncio.sleep(0)
        assert not waiting.done()
        settle(future)
        await asyncio.wait_for(waiting, 1)  # (raises nothing, whatever the outcome)
        if not future.cancelled():
            future.exception()  # (retrieved)
    done: asyncio.Future[int] = loop.create_future()
    done.set_result(2)
    await settled(done)  # (at once)
    # A waiter that gives up leaves no callback on the future.
    pending: asyncio.Future[int] = loop.create_future()
    waiting = loop.create_task(settled(pending))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not pending._callbacks  # type: ignore[attr-defined]


async def test_an_append_gets_its_id_when_queued(store: LedgerStore) -> None:
    ledger = await store.open_ledger("ids")
    await ledger.append(b"first")
    first = ledger.next_entry_id
    assert first == 1
    futures = [ledger.append(b"x") for _ in range(3)]
    assert ledger.next_entry_id == first + 3  # (before any of them is durable)
    assert [await f for f in futures] == [first, first + 1, first + 2]


async def test_a_trim_never_reaches_entries_appended_after_it(store: LedgerStore) -> None:
    ledger = await store.open_ledger("trimmed")
    await ledger.append(b"a")  # 0
    trim = ledger.trim(100)  # (past everything appended so far)
    later = ledger.append(b"b")  # 1, queued behind the trim, in the same write
    await trim
    assert await later == 1
    assert [e.entry_id for e in await ledger.read(0, 10)] == [1]
    assert ledger.first_entry_id == 1


async def test_pass_failure_carries_a_failure_or_cancellation_and_nothing_else() -> None:
    loop = asyncio.get_running_loop()
    source, target = loop.create_future(), loop.create_future()
    source.set_result(3)
    assert pass_failure(source, target) is False and not target.done()
    source = loop.create_future()
    source.set_exception(LedgerError("disk full"))
    assert pass_failure(source, target) is True
    with pytest.raises(LedgerError, match="disk full"):
        target.result()
    source, target = loop.create_future(), loop.create_future()
    source.cancel()
    assert pass_failure(source, target) is True and target.cancelled()
    done = loop.create_future()
    done.set_result(1)
    failed = loop.create_future()
    failed.set_exception(LedgerError("late"))
    assert pass_failure(failed, done) is True and done.result() == 1  # (a done target stays)


@pytest.mark.parametrize("seed", range(6))
async def test_reads_across_the_tail_cache_match_a_model(db: Location, seed: int) -> None:
    """Random appends (awaited or not), trims and reads with a small tail
    cache: every read returns exactly the entries asked for that are not
    trimmed, in order, with their own data, whether they come from the
    cache, the disk or both (a read ending before the cache once returned
    cached entries after its end too)."""
    rnd = random.Random(seed)
    store = await LedgerStore.open(db, cache_entries=8, cache_bytes=400)
    try:
        ledger = await store.open_ledger("fuzz")
        appended = 0
        for _ in range(400):
            op = rnd.random()
            if op < 0.5:
                writes = [
                    ledger.append(b"%d." % (appended + i) * rnd.randint(1, 20))
                    for i in range(rnd.randint(1, 5))
                ]
                appended += len(writes)
                if rnd.random() < 0.7:
                    await asyncio.gather(*writes)
            elif op < 0.6 and appended > ledger.first_entry_id:
                await ledger.trim(rnd.randint(ledger.first_entry_id, appended))
            elif ledger.last_entry_id >= ledger.first_entry_id:
                start = rnd.randint(ledger.first_entry_id, ledger.last_entry_id)
                end = rnd.randint(start, ledger.last_entry_id)
                got = await ledger.read(start, end)
                assert [e.entry_id for e in got] == list(range(start, end + 1))
                assert all(e.data.startswith(b"%d." % e.entry_id) for e in got)
    finally:
        await store.close()
