"""The PostgreSQL engine's own behaviour: fencing by slots, stores sharing a
database, the schema version. (Its ledger behaviour: tests/test_ledger.py,
run on both engines.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from ledger import LedgerError, LedgerFencedError, LedgerStore


def slot_of(name: str, slots: int) -> int | None:
    """Ledger ``s{k}/...`` is in slot k; any other is in none."""
    head, _, _ = name.partition("/")
    return int(head[1:]) % slots if head.startswith("s") and head[1:].isdigit() else None


async def open_store(url: str, owner: str, slots: int = 8) -> LedgerStore:
    return await LedgerStore.open(url, owner=owner, slot_of=slot_of, slots=slots)


async def rows(url: str, query: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        found: list[asyncpg.Record] = await conn.fetch(query, *args)
        return found
    finally:
        await conn.close()


async def stored(url: str, name: str) -> list[bytes]:
    """The data of ledger ``name``'s entries, read on a connection of its own."""
    found = await rows(
        url,
        "SELECT e.data FROM txnbuf.entries AS e JOIN txnbuf.ledgers AS l ON l.id = e.ledger "
        "WHERE l.name = $1 ORDER BY e.entry",
        name,
    )
    return [bytes(r[0]) for r in found]


@pytest.fixture
async def two(pg_url: str) -> AsyncIterator[tuple[LedgerStore, LedgerStore]]:
    a = await open_store(pg_url, "a")
    b = await open_store(pg_url, "b")
    try:
        yield a, b
    finally:
        await a.close()
        await b.close()


async def test_the_first_store_creates_the_slots_and_a_later_one_keeps_their_number(
    pg_url: str,
) -> None:
    first = await open_store(pg_url, "a", slots=8)
    second = await open_store(pg_url, "b", slots=64)  # (the database has 8 already)
    try:
        assert (first.slot_count, second.slot_count) == (8, 8)
        assert [tuple(r) for r in await rows(pg_url, "SELECT slot, owner, epoch FROM "
                "txnbuf.slots ORDER BY slot")] == [(k, None, 0) for k in range(8)]  # fmt: skip
        assert await first.take_slots(range(8)) == {k: 1 for k in range(8)}
        assert first.epochs == {k: 1 for k in range(8)}
        assert await second.take_slots([3]) == {3: 2}
        owners = await rows(pg_url, "SELECT slot, owner, epoch FROM txnbuf.slots WHERE slot = 3")
        assert tuple(owners[0]) == (3, "b", 2)
    finally:
        await first.close()
        await second.close()


async def test_a_store_whose_slot_was_taken_is_fenced_and_writes_nothing_more(
    two: tuple[LedgerStore, LedgerStore], pg_url: str
) -> None:
    a, b = two
    await a.take_slots(range(8))
    mine = await a.open_ledger("s0/log")
    other = await a.open_ledger("s1/log")
    assert await mine.append(b"before") == 0
    await b.take_slots([0])  # b takes slot 0 over: a is fenced there
    late = mine.append(b"after the takeover")
    with pytest.raises(LedgerFencedError, match="slots 0 ") as caught:
        await late
    assert caught.value.slots == (0,)
    assert a.failure.done() and isinstance(a.failure.result(), LedgerFencedError)
    # Fail-stop: every later write is refused, in a slot a still holds too.
    with pytest.raises(LedgerFencedError, match="refuses writes"):
        other.append(b"elsewhere")
    assert await stored(pg_url, "s0/log") == [b"before"]
    # The new owner goes on from what a made durable.
    await b.take_slots([])  # (no slot: loads the catalog again)
    theirs = b.get_ledger("s0/log")
    assert theirs is not None and theirs.last_entry_id == 0
    assert await theirs.append(b"by b") == 1
    assert await stored(pg_url, "s0/log") == [b"before", b"by b"]


async def test_a_commit_whose_check_fails_writes_nothing_of_any_slot(
    two: tuple[LedgerStore, LedgerStore], pg_url: str
) -> None:
    """One group commit writes slots 1 (still held) and 2 (taken over), and
    a trim: the transaction is rolled back whole."""
    a, b = two
    await a.take_slots(range(8))
    held = await a.open_ledger("s1/log")
    lost = await a.open_ledger("s2/log")
    free = await a.open_ledger("none")  # (no slot)
    for ledger in (held, lost, free):
        await ledger.append(b"0")
        await ledger.append(b"1")
    await b.take_slots([2])
    writes = [held.append(b"2"), held.trim(1), lost.append(b"2"), free.append(b"2")]
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert all(isinstance(r, LedgerFencedError) for r in results), results
    assert all(r.slots == (2,) for r in results if isinstance(r, LedgerFencedError))
    for name in ("s1/log", "s2/log", "none"):
        assert await stored(pg_url, name) == [b"0", b"1"], name
    first = await rows(pg_url, "SELECT first_entry_id FROM txnbuf.ledgers WHERE name = 's1/log'")
    assert first[0][0] == 0  # (the trim is not stored either)


async def test_writing_a_slot_the_store_does_not_hold_is_refused(pg_url: str) -> None:
    a = await open_store(pg_url, "a")
    try:
        await a.take_slots([0])
        with pytest.raises(LedgerFencedError, match="does not hold slots 5"):
            await a.open_ledger("s5/log")  # (a creation in slot 5)
        assert await rows(pg_url, "SELECT * FROM txnbuf.ledgers") == []
        with pytest.raises(LedgerFencedError):
            await a.open_ledger("s0/log")  # (fail-stop: refused after that)
    finally:
        await a.close()


async def test_deleting_a_ledger_of_a_lost_slot_is_fenced(
    two: tuple[LedgerStore, LedgerStore], pg_url: str
) -> None:
    a, b = two
    await a.take_slots([3])
    ledger = await a.open_ledger("s3/log")
    await ledger.append(b"kept")
    await b.take_slots([3])
    with pytest.raises(LedgerFencedError):
        await a.delete_ledger("s3/log")
    assert await stored(pg_url, "s3/log") == [b"kept"]


async def test_a_takeover_waits_for_a_commit_in_flight_and_fences_the_next(
    two: tuple[LedgerStore, LedgerStore], pg_url: str
) -> None:
    """FOR SHARE orders a takeover after the old owner's commit that passed
    the check: that commit is stored, the next one is fenced."""
    a, b = two
    await a.take_slots([0])
    ledger = await a.open_ledger("s0/log")
    await ledger.append(b"0")
    blocker = await asyncpg.connect(pg_url)
    try:
        # Hold a's next INSERT after its fencing check has locked slot 0.
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE txnbuf.entries IN EXCLUSIVE MODE")
        in_flight = ledger.append(b"in flight")
        await wait_for_lock_waits(pg_url, 1)  # (a's INSERT waits for the table)
        takeover = asyncio.ensure_future(b.take_slots([0]))
        await wait_for_lock_waits(pg_url, 2)  # (b's UPDATE waits for a's FOR SHARE)
        assert not takeover.done()
        await tx.commit()
        assert await in_flight == 1
        assert await takeover == {0: 2}
    finally:
        await blocker.close()
    with pytest.raises(LedgerFencedError):
        await ledger.append(b"after")
    assert await stored(pg_url, "s0/log") == [b"0", b"in flight"]


async def wait_for_lock_waits(url: str, n: int) -> None:
    """Until ``n`` backends of this database wait for a lock."""
    async with asyncio.timeout(20):
        while True:
            found = await rows(
                url,
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'",
            )
            if found[0][0] >= n:
                return
            await asyncio.sleep(0.02)


async def test_a_takeover_from_a_seen_epoch_takes_nothing_once_it_moved(
    two: tuple[LedgerStore, LedgerStore],
) -> None:
    a, b = two
    taken = await a.take_slots([4])
    assert await b.take_slots({4: taken[4]}) == {4: taken[4] + 1}
    assert await a._engine.take_slots({4: taken[4]}) == {}  # type: ignore[attr-defined]


async def test_two_stores_creating_the_same_ledgers_at_once_agree_on_their_ids(
    pg_url: str,
) -> None:
    a = await LedgerStore.open(pg_url)
    b = await LedgerStore.open(pg_url)
    try:
        names = [f"n/{i}" for i in range(40)]
        for _ in range(5):
            mine, theirs = await asyncio.gather(
                asyncio.gather(*(a.open_ledger(n) for n in names)),
                asyncio.gather(*(b.open_ledger(n) for n in reversed(names))),
            )
            assert [lg.id for lg in mine] == [lg.id for lg in reversed(theirs)]
            names = [n + "x" for n in names]
        assert len(await rows(pg_url, "SELECT id FROM txnbuf.ledgers")) == 200
    finally:
        await a.close()
        await b.close()


async def test_a_schema_of_a_later_version_is_refused(pg_url: str) -> None:
    store = await LedgerStore.open(pg_url)
    await store.close()
    await rows(pg_url, "UPDATE txnbuf.meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(LedgerError, match="version 99, made by a newer txnbuf"):
        await LedgerStore.open(pg_url)


async def test_stores_opened_at_once_on_an_empty_database_make_one_schema(pg_url: str) -> None:
    stores = await asyncio.gather(*(LedgerStore.open(pg_url, slots=16) for _ in range(4)))
    try:
        assert {s.slot_count for s in stores} == {16}
        assert len(await rows(pg_url, "SELECT slot FROM txnbuf.slots")) == 16
    finally:
        for s in stores:
            await s.close()


async def test_a_bad_url_is_a_clear_error() -> None:
    with pytest.raises(LedgerError, match="cannot connect to PostgreSQL at") as caught:
        await LedgerStore.open("postgresql://nobody:secret@127.0.0.1:1/none")
    assert "secret" not in str(caught.value)  # (no password in messages)


async def test_a_lost_connection_stops_the_store(pg_url: str) -> None:
    """A commit whose connection is gone has an unknown outcome: fail-stop."""
    store = await LedgerStore.open(pg_url)
    try:
        ledger = await store.open_ledger("a")
        await ledger.append(b"0")
        pid = store._engine._writer.get_server_pid()  # type: ignore[attr-defined]
        await rows(pg_url, "SELECT pg_terminate_backend($1)", pid)
        with pytest.raises(LedgerError):
            await ledger.append(b"1")
        with pytest.raises(LedgerError, match="refuses writes"):
            ledger.append(b"2")
    finally:
        async with asyncio.timeout(15):
            await store.close()
    reopened = await LedgerStore.open(pg_url)
    try:
        again = reopened.get_ledger("a")
        assert again is not None and again.last_entry_id == 0
    finally:
        await reopened.close()
