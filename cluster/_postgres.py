"""`MembershipStore` on PostgreSQL (asyncpg): the statements of its docstring.

The tables are the ledger engine's (`ledger._postgres` creates and upgrades
the schema ``txnbuf``: ``txnbuf.brokers`` and ``txnbuf.slots``, the rows its
group commits fence on), so a broker opens its ledger store first and this
second. Each method is one statement in autocommit, or one transaction
(``read``, ``leave``), on a small pool of connections of its own (apart from
the store's writer: a renewal never queues behind a group commit). Every
error of the driver or the server, and a lost connection, is raised as
`MembershipError` (the outcome is unknown: `Member` re-reads); a bad
argument (a slot that does not exist) as ``ValueError``.

Settings of the pool's sessions: ``lock_timeout`` (`LOCK_TIMEOUT`), so that a
take or a release waiting for a slot row that a stuck transaction holds gives
up (and is tried again at the next look) instead of holding up renewals; and
``idle_in_transaction_session_timeout``, so that a broker paused inside
``read`` or ``leave`` holds nothing for long.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any

import asyncpg

from cluster._ownership import SlotRow, View
from cluster._store import MembershipError

__all__ = ["LOCK_TIMEOUT", "PostgresMembership"]

LOCK_TIMEOUT = "1s"
IDLE_IN_TRANSACTION = "5s"
POOL_SIZE = 2  # connections: a look at a time, and a drain's leave beside it

_READ_BROKERS = "SELECT id, extract(epoch FROM lease_until)::float8, urls FROM txnbuf.brokers"
_READ_SLOTS = "SELECT slot, owner, epoch FROM txnbuf.slots ORDER BY slot"
_JOIN = """
INSERT INTO txnbuf.brokers (id, urls, lease_until)
VALUES ($1, $2, now() + make_interval(secs => $3))
ON CONFLICT (id) DO UPDATE SET urls = EXCLUDED.urls, lease_until = EXCLUDED.lease_until
RETURNING extract(epoch FROM lease_until)::float8
"""
_RENEW = """
UPDATE txnbuf.brokers SET lease_until = now() + make_interval(secs => $2)
WHERE id = $1 AND lease_until > now()
RETURNING extract(epoch FROM lease_until)::float8
"""
_TAKE = """
UPDATE txnbuf.slots AS s SET owner = $1, epoch = s.epoch + 1
FROM unnest($2::integer[], $3::bigint[]) AS t(slot, seen)
WHERE s.slot = t.slot AND s.epoch = t.seen
  AND EXISTS (SELECT 1 FROM txnbuf.brokers WHERE id = $1 AND lease_until > now())
  AND (s.owner IS NULL OR s.owner = $1
       OR NOT EXISTS (SELECT 1 FROM txnbuf.brokers AS b
                      WHERE b.id = s.owner AND b.lease_until > now()))
RETURNING s.slot, s.epoch
"""
_RELEASE = """
UPDATE txnbuf.slots AS s SET owner = NULL
FROM unnest($2::integer[], $3::bigint[]) AS t(slot, epoch)
WHERE s.slot = t.slot AND s.owner = $1 AND s.epoch = t.epoch
RETURNING s.slot
"""
_URLS = "SELECT id, urls FROM txnbuf.brokers"


def _unknown(what: str, exc: BaseException) -> MembershipError:
    return MembershipError(f"{what}: {type(exc).__name__}: {exc}")


_DRIVER_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


class PostgresMembership:
    """`MembershipStore` over the tables of the schema ``txnbuf`` (see the
    module docstring). Create with `open`, end with `close`."""

    def __init__(self, pool: asyncpg.Pool, slots: int) -> None:
        self._pool = pool
        self.slots = slots  # the number of slots of the database
        # The last snapshot read, and the registered brokers' URLs then.
        self.last_view: View | None = None
        self.last_urls: dict[str, str] = {}

    @classmethod
    async def open(cls, url: str) -> PostgresMembership:
        """Connect to the cluster database ``url`` (its ``txnbuf`` schema made
        by a ledger store); `MembershipError` if it cannot, or if the
        database has no cluster tables."""
        settings = {
            "lock_timeout": LOCK_TIMEOUT,
            "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION,
        }
        try:
            pool: asyncpg.Pool = await asyncpg.create_pool(
                url, min_size=1, max_size=POOL_SIZE, server_settings=settings
            )
        except (*_DRIVER_ERRORS, ValueError) as exc:
            raise _unknown("cannot connect to the cluster database", exc) from exc
        try:
            async with pool.acquire() as conn:
                if await conn.fetchval("SELECT to_regclass('txnbuf.brokers')") is None:
                    raise MembershipError(
                        "the database has no cluster tables (txnbuf.brokers): a ledger store "
                        "opened on it creates them"
                    )
                slots = await conn.fetchval("SELECT count(*) FROM txnbuf.slots")
        except BaseException as exc:
            await pool.close()
            if isinstance(exc, _DRIVER_ERRORS):
                raise _unknown("reading the cluster tables failed", exc) from exc
            raise
        return cls(pool, int(slots))

    async def close(self) -> None:
        try:
            await self._pool.close()
        except Exception:
            self._pool.terminate()

    def terminate(self) -> None:
        self._pool.terminate()

    def _check(self, slots: Mapping[int, int]) -> None:
        bad = sorted(k for k in slots if not 0 <= k < self.slots)
        if bad:
            raise ValueError(f"no such slot: {bad} (the cluster has {self.slots} slots)")

    async def _fetch(self, what: str, query: str, *args: Any) -> list[asyncpg.Record]:
        try:
            rows: list[asyncpg.Record] = await self._pool.fetch(query, *args)
        except _DRIVER_ERRORS as exc:
            raise _unknown(what, exc) from exc
        return rows

    async def secret(self) -> str:
        """The cluster's shared secret (`txnbuf.meta` ``cluster_secret``),
        made by the first broker that asks: brokers sign the tokens they
        present to each other with it (docs/security.md)."""
        try:
            async with self._pool.acquire() as conn:
                await conn.execute(
                    "INSERT INTO txnbuf.meta (key, value) VALUES ('cluster_secret', $1) "
                    "ON CONFLICT (key) DO NOTHING",
                    secrets.token_hex(32),
                )
                value = await conn.fetchval(
                    "SELECT value FROM txnbuf.meta WHERE key = 'cluster_secret'"
                )
        except _DRIVER_ERRORS as exc:
            raise _unknown("reading the cluster's secret", exc) from exc
        return str(value)

    # -- MembershipStore ----------------------------------------------------------

    async def read(self) -> View:
        try:
            async with self._pool.acquire() as conn:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    now = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
                    brokers = await conn.fetch(_READ_BROKERS)
                    slots = await conn.fetch(_READ_SLOTS)
        except _DRIVER_ERRORS as exc:
            raise _unknown("reading the cluster tables", exc) from exc
        view = View(
            float(now),
            {b: float(until) for b, until, _ in brokers},
            tuple(SlotRow(owner, int(epoch)) for _, owner, epoch in slots),
        )
        self.last_view = view
        self.last_urls = {b: urls for b, _, urls in brokers}
        return view

    async def join(self, me: str, urls: str, ttl: float) -> float:
        rows = await self._fetch("joining", _JOIN, me, urls, float(ttl))
        return float(rows[0][0])

    async def renew(self, me: str, ttl: float) -> float | None:
        rows = await self._fetch("renewing the lease", _RENEW, me, float(ttl))
        return float(rows[0][0]) if rows else None

    async def take(self, me: str, seen: Mapping[int, int]) -> dict[int, int]:
        self._check(seen)
        if not seen:
            return {}
        slots = sorted(seen)
        rows = await self._fetch("taking slots", _TAKE, me, slots, [seen[k] for k in slots])
        return {int(slot): int(epoch) for slot, epoch in rows}

    async def release(self, me: str, held: Mapping[int, int]) -> set[int]:
        self._check(held)
        if not held:
            return set()
        slots = sorted(held)
        rows = await self._fetch("releasing slots", _RELEASE, me, slots, [held[k] for k in slots])
        return {int(r[0]) for r in rows}

    async def leave(self, me: str) -> None:
        try:
            async with self._pool.acquire() as conn:
                async with conn.transaction():
                    await conn.execute("UPDATE txnbuf.slots SET owner = NULL WHERE owner = $1", me)
                    await conn.execute("DELETE FROM txnbuf.brokers WHERE id = $1", me)
        except _DRIVER_ERRORS as exc:
            raise _unknown("leaving", exc) from exc

    # -- beyond the protocol --------------------------------------------------------

    async def urls(self) -> dict[str, str]:
        """Every registered broker's URLs (live or not): broker id -> urls."""
        rows = await self._fetch("reading the brokers' URLs", _URLS)
        return {str(b): str(u) for b, u in rows}
