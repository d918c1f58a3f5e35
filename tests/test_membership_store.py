"""The contract of `cluster.MembershipStore`, run on the in-memory model
(`cluster.ModelStore`) and on PostgreSQL (`cluster.PostgresMembership`, a
real server): the same cases, the same answers. Leases are measured with the
database's clock: on the model a clock the test moves, on PostgreSQL its
``now()``, which the test waits on (it reads until the database's clock has
passed a lease)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest

from cluster import (
    MembershipError,
    MembershipStore,
    ModelConnection,
    ModelStore,
    PostgresMembership,
    SlotRow,
)
from ledger import LedgerStore

SLOTS = 8
TTL = 0.5  # seconds (PostgreSQL's tests wait for it to pass)


class Backend:
    """A `MembershipStore` and a way to let the database's clock pass a time."""

    store: MembershipStore
    name: str

    async def pass_time(self, until: float) -> None:
        raise NotImplementedError


class Model(Backend):
    name = "model"

    def __init__(self) -> None:
        self.now = 1000.0
        self.model = ModelStore(SLOTS, lambda: self.now)
        self.store = ModelConnection(self.model)

    async def pass_time(self, until: float) -> None:
        self.now = max(self.now, until + 0.001)


class Postgres(Backend):
    name = "postgresql"

    def __init__(self, url: str, ledgers: LedgerStore, store: PostgresMembership) -> None:
        self.url = url
        self.ledgers = ledgers
        self.store = self.membership = store

    async def pass_time(self, until: float) -> None:
        while (await self.store.read()).now <= until:  # noqa: ASYNC110 - the database's clock
            await asyncio.sleep(0.02)


@pytest.fixture(params=["model", "postgresql"])
def where(request: pytest.FixtureRequest) -> str | None:
    """None: the model; else the URL of a fresh PostgreSQL database."""
    return None if request.param == "model" else str(request.getfixturevalue("pg_url"))


@pytest.fixture
async def backend(where: str | None) -> AsyncIterator[Backend]:
    if where is None:
        yield Model()
        return
    url = where
    ledgers = await LedgerStore.open(url, slots=SLOTS)  # (creates the schema)
    store = await PostgresMembership.open(url)
    try:
        yield Postgres(url, ledgers, store)
    finally:
        await store.close()
        await ledgers.close()


async def test_join_registers_a_live_broker_with_a_lease_of_ttl(backend: Backend) -> None:
    store = backend.store
    before = (await store.read()).now
    until = await store.join("a", "http://a", TTL)
    after = (await store.read()).now
    assert before + TTL <= until <= after + TTL
    view = await store.read()
    assert view.brokers == {"a": pytest.approx(until)}
    assert view.is_live("a") and view.live() == ["a"]
    assert list(view.slots) == [SlotRow(None, 0)] * SLOTS
    # Joining again refreshes the row (a broker back after losing its lease).
    again = await store.join("a", "http://a2", TTL)
    assert again >= until


async def test_renew_extends_a_live_lease_and_is_refused_once_it_expired(backend: Backend) -> None:
    store = backend.store
    until = await store.join("a", "http://a", TTL)
    renewed = await store.renew("a", TTL)
    assert renewed is not None and renewed >= until
    await backend.pass_time(renewed)
    assert not (await store.read()).is_live("a")
    assert await store.renew("a", TTL) is None  # (expired by the database's clock)
    assert await store.renew("nobody", TTL) is None  # (no row)
    rejoined = await store.join("a", "http://a", TTL)
    assert (await store.read()).is_live("a") and rejoined > renewed


async def test_take_is_a_compare_and_set_on_the_epoch_seen(backend: Backend) -> None:
    store = backend.store
    await store.join("a", "http://a", 30)
    assert await store.take("a", {0: 0, 1: 0}) == {0: 1, 1: 1}
    assert await store.take("a", {2: 5}) == {}  # (not at the epoch seen)
    assert await store.take("a", {0: 0}) == {}  # (moved on since)
    assert await store.take("a", {0: 1}) == {0: 2}  # (its own row again: epoch + 1)
    assert await store.take("a", {}) == {}
    view = await store.read()
    assert list(view.slots[:3]) == [SlotRow("a", 2), SlotRow("a", 1), SlotRow(None, 0)]
    with pytest.raises(ValueError, match="no such slot"):
        await store.take("a", {SLOTS: 0})


async def test_take_is_refused_for_a_live_owner_and_allowed_once_its_lease_expired(
    backend: Backend,
) -> None:
    store = backend.store
    until = await store.join("a", "http://a", TTL)
    await store.join("b", "http://b", 30)
    assert await store.take("a", {3: 0}) == {3: 1}
    assert await store.take("b", {3: 1}) == {}  # (a is live)
    await backend.pass_time(until)
    assert await store.take("b", {3: 1}) == {3: 2}
    assert (await store.read()).slots[3] == SlotRow("b", 2)


async def test_a_broker_without_a_live_lease_takes_nothing(backend: Backend) -> None:
    store = backend.store
    assert await store.take("ghost", {0: 0}) == {}  # (never joined)
    until = await store.join("a", "http://a", TTL)
    await backend.pass_time(until)
    assert await store.take("a", {0: 0}) == {}
    assert (await store.read()).slots[0] == SlotRow(None, 0)


async def test_release_frees_only_rows_still_held_at_their_epoch(backend: Backend) -> None:
    store = backend.store
    await store.join("a", "http://a", 30)
    await store.join("b", "http://b", 30)
    assert await store.take("a", {0: 0, 1: 0}) == {0: 1, 1: 1}
    assert await store.take("b", {2: 0}) == {2: 1}
    assert await store.release("a", {0: 1, 1: 7, 2: 1}) == {0}
    view = await store.read()
    assert list(view.slots[:3]) == [SlotRow(None, 1), SlotRow("a", 1), SlotRow("b", 1)]
    assert await store.release("a", {}) == set()
    # A released row keeps its epoch: the next take is at it.
    assert await store.take("b", {0: 1}) == {0: 2}


async def test_leave_frees_every_slot_and_deletes_the_broker(backend: Backend) -> None:
    store = backend.store
    await store.join("a", "http://a", 30)
    await store.join("b", "http://b", 30)
    await store.take("a", {0: 0, 1: 0, 5: 0})
    await store.take("b", {2: 0})
    await store.leave("a")
    view = await store.read()
    assert set(view.brokers) == {"b"}
    assert [row.owner for row in view.slots[:6]] == [None, None, "b", None, None, None]
    assert [row.epoch for row in view.slots[:6]] == [1, 1, 1, 0, 0, 1]
    # Taken at once by another, with no lease to wait for.
    assert await store.take("b", {0: 1, 1: 1, 5: 1}) == {0: 2, 1: 2, 5: 2}
    await store.leave("nobody")  # (nothing to do)


# -- PostgreSQL only: errors, the schema ------------------------------------------------


@pytest.fixture
async def pg(pg_url: str) -> AsyncIterator[Postgres]:
    ledgers = await LedgerStore.open(pg_url, slots=SLOTS)
    store = await PostgresMembership.open(pg_url)
    try:
        yield Postgres(pg_url, ledgers, store)
    finally:
        await store.close()
        await ledgers.close()


async def test_a_database_that_cannot_be_reached_is_a_membership_error(pg_url: str) -> None:
    port = pg_url.split(":")[2].split("/")[0]
    with pytest.raises(MembershipError, match="cannot connect"):
        await PostgresMembership.open(pg_url.replace(f":{port}/", ":1/"))


async def test_a_database_without_the_tables_is_refused(pg_url: str) -> None:
    with pytest.raises(MembershipError, match="no cluster tables"):
        await PostgresMembership.open(pg_url)


async def test_a_connection_lost_mid_request_is_a_membership_error(pg: Postgres) -> None:
    await pg.store.join("a", "http://a", 30)
    conn = await asyncpg.connect(pg.url)
    try:
        async with conn.transaction():  # (the renewal waits for this lock)
            await conn.execute("SELECT * FROM txnbuf.brokers WHERE id = 'a' FOR UPDATE")
            renewal = asyncio.create_task(pg.store.renew("a", 30))
            waiting = None
            while not waiting:  # (until the renewal waits for the lock)
                waiting = await conn.fetch(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
            await conn.execute("SELECT pg_terminate_backend($1)", waiting[0]["pid"])
            with pytest.raises(MembershipError, match="renewing the lease"):
                await renewal
    finally:
        await conn.close()
    # The pool connects again for the next request.
    assert await pg.store.renew("a", 30) is not None
    pg.membership.terminate()
    with pytest.raises(MembershipError):
        await pg.store.read()


async def test_a_take_blocked_by_a_locked_row_times_out_as_a_membership_error(
    pg: Postgres,
) -> None:
    await pg.store.join("a", "http://a", 30)
    conn = await asyncpg.connect(pg.url)
    try:
        async with conn.transaction():
            await conn.execute("SELECT * FROM txnbuf.slots WHERE slot = 4 FOR UPDATE")
            with pytest.raises(MembershipError, match="lock timeout"):
                await pg.store.take("a", {4: 0})
        assert await pg.store.take("a", {4: 0}) == {4: 1}  # (the lock is gone)
    finally:
        await conn.close()


async def test_a_version_1_database_is_upgraded_with_the_brokers_table(pg_url: str) -> None:
    first = await LedgerStore.open(pg_url, slots=SLOTS)
    await first.close()
    conn = await asyncpg.connect(pg_url)
    try:  # (as version 1 made it: no brokers table, no moves)
        await conn.execute("DROP TABLE txnbuf.brokers")
        await conn.execute("DROP TABLE txnbuf.moves")
        await conn.execute("UPDATE txnbuf.meta SET value = '1' WHERE key = 'schema_version'")
        again = await LedgerStore.open(pg_url, slots=SLOTS)
        await again.close()
        version = await conn.fetchval("SELECT value FROM txnbuf.meta WHERE key = 'schema_version'")
        assert version == "3"
    finally:
        await conn.close()
    store = await PostgresMembership.open(pg_url)
    try:
        assert await store.join("a", "http://a", 30) > 0
        assert store.slots == SLOTS
        assert await store.take("a", {1: 0}) == {1: 1}
        (move,) = await store.moves()
        assert (move.slot, move.from_owner, move.to_owner, move.epoch) == (1, None, "a", 1)
    finally:
        await store.close()


async def test_moves_are_recorded_with_why_they_happened(pg_url: str) -> None:
    """PostgreSQL only (the model keeps no moves): a free slot taken is a
    balance move; a release completed by the next take a balance move from
    its owner; a leave's slots handovers; a dead owner's slot taken a
    failover; the taker's own slot taken again a restart."""
    ledgers = await LedgerStore.open(pg_url, slots=SLOTS)
    pg = await PostgresMembership.open(pg_url)
    try:
        await pg.join("a", "http://a", 30)
        await pg.join("b", "http://b", TTL)
        assert await pg.take("b", {0: 0, 1: 0, 2: 0}) == {0: 1, 1: 1, 2: 1}
        assert await pg.release("b", {0: 1}) == {0}
        pending = (await pg.moves(1))[0]
        assert (pending.slot, pending.from_owner, pending.to_owner, pending.why) == (
            0,
            "b",
            None,
            "balance",
        )
        assert await pg.take("a", {0: 1}) == {0: 2}
        await pg.take("b", {2: 1})  # (its own again: after dropping everything)
        await Postgres(pg_url, ledgers, pg).pass_time((await pg.read()).brokers["b"])
        assert await pg.take("a", {1: 1}) == {1: 2}
        await pg.join("c", "http://c", 30)
        assert await pg.take("c", {3: 0}) == {3: 1}
        await pg.leave("c")
        seen = [(m.slot, m.from_owner, m.to_owner, m.epoch, m.why) for m in await pg.moves()]
        assert seen[:5] == [
            (3, "c", None, 1, "handover"),
            (3, None, "c", 1, "balance"),
            (1, "b", "a", 2, "failover"),
            (2, "b", "b", 2, "restart"),
            (0, "b", "a", 2, "balance"),
        ]
        assert sorted(seen[5:]) == [(k, None, "b", 1, "balance") for k in range(3)]
        tables = await pg.describe()
        assert [b.id for b in tables.brokers] == ["a", "b"]
        assert tables.slots[0] == (0, "a", 2) and len(tables.moves) == 8
    finally:
        await pg.close()
        await ledgers.close()


async def test_the_moves_kept_are_bounded(pg_url: str) -> None:
    from cluster._postgres import MOVES_KEPT

    ledgers = await LedgerStore.open(pg_url, slots=SLOTS)
    pg = await PostgresMembership.open(pg_url)
    try:
        await pg.join("a", "http://a", 30)
        epochs = await pg.take("a", dict.fromkeys(range(SLOTS), 0))
        for _ in range(MOVES_KEPT // SLOTS + 2):  # (each round: SLOTS moves, released and taken)
            assert await pg.release("a", epochs) == set(range(SLOTS))
            epochs = await pg.take("a", epochs)
        conn = await asyncpg.connect(pg_url)
        try:
            kept = await conn.fetchval("SELECT count(*) FROM txnbuf.moves")
        finally:
            await conn.close()
        assert MOVES_KEPT <= kept <= MOVES_KEPT + SLOTS
        latest = await pg.moves(1)
        assert latest[0].to_owner == "a" and latest[0].epoch == max(epochs.values())
    finally:
        await pg.close()
        await ledgers.close()
