"""`MembershipStore` on PostgreSQL (asyncpg): the statements of its docstring.

The tables are the ledger engine's (`ledger._postgres` creates and upgrades
the schema ``txnbuf``: ``txnbuf.brokers`` and ``txnbuf.slots``, the rows its
group commits fence on), so a broker opens its ledger store first and this
second. Each method is one statement in autocommit, or one transaction
(``read``, ``leave``), on a small pool of connections of its own (apart from
the store's writer: a renewal never queues behind a group commit). Every
error of the driver or the server, and a lost connection, is raised as
`MembershipError` (the outcome is unknown: `Member` re-reads); a bad
argument (a slot that does not exist) as ``ValueError``. The pool connects
with the options it is given (the broker gives the store's,
`ledger._postgres.connect_options`: with a URL naming a primary and its
standbys, to the writable one); a connection lost when the
primary went is made again at the next request, to whichever server is
writable then (none: `MembershipError`, and the next look tries again).

Settings of the pool's sessions: ``lock_timeout`` (`LOCK_TIMEOUT`), so that a
take or a release waiting for a slot row that a stuck transaction holds gives
up (and is tried again at the next look) instead of holding up renewals; and
``idle_in_transaction_session_timeout``, so that a broker paused inside
``read`` or ``leave`` holds nothing for long.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg

from cluster._ownership import SlotRow, View
from cluster._store import MembershipError

__all__ = [
    "KAFKA_SCHEME",
    "LOCK_TIMEOUT",
    "MOVES_KEPT",
    "BrokerRow",
    "ClusterTables",
    "Move",
    "PostgresMembership",
    "kafka_address",
    "service_url",
]

LOCK_TIMEOUT = "1s"
MOVES_KEPT = 1000  # rows of txnbuf.moves kept (the most recent)
IDLE_IN_TRANSACTION = "5s"
POOL_SIZE = 2  # connections: a look at a time, and a drain's leave beside it

_READ_BROKERS = "SELECT id, extract(epoch FROM lease_until)::float8, urls FROM txnbuf.brokers"
_READ_SLOTS = "SELECT slot, owner, epoch FROM txnbuf.slots ORDER BY slot"
_JOIN = """
INSERT INTO txnbuf.brokers (id, urls, lease_until, renewed_at)
VALUES ($1, $2, now() + make_interval(secs => $3), now())
ON CONFLICT (id) DO UPDATE
    SET urls = EXCLUDED.urls, lease_until = EXCLUDED.lease_until, renewed_at = now()
RETURNING extract(epoch FROM lease_until)::float8
"""
_RENEW = """
UPDATE txnbuf.brokers SET lease_until = now() + make_interval(secs => $2), renewed_at = now()
WHERE id = $1 AND lease_until > now()
RETURNING extract(epoch FROM lease_until)::float8
"""
# The moves (`Move`) are written by the statements that move slots, in the
# same transaction: a release or a leave writes a row with no new owner yet
# (why: balance or handover), which the take of that slot at the next epoch
# completes; a take of a slot nobody released writes its own row (from a
# broker whose lease ran out: failover; from nobody: balance, a free slot of
# a new database; from the taker itself: restart, after it dropped
# everything). Every statement that writes one trims the table to the last
# `MOVES_KEPT` rows.
# (SKIP LOCKED: two statements trimming at once never wait for each other,
# nor deadlock; a row one of them skipped goes with the next trim.)
_TRIM_MOVES = f"""
trimmed AS (
  DELETE FROM txnbuf.moves WHERE id IN (
    SELECT id FROM txnbuf.moves
    WHERE id <= (SELECT max(id) FROM txnbuf.moves) - {MOVES_KEPT}
    FOR UPDATE SKIP LOCKED)
)"""
_TAKE = f"""
WITH took AS (
  UPDATE txnbuf.slots AS s SET owner = $1, epoch = s.epoch + 1
  FROM unnest($2::integer[], $3::bigint[]) AS t(slot, seen), txnbuf.slots AS old
  WHERE s.slot = t.slot AND s.epoch = t.seen AND old.slot = s.slot
    AND EXISTS (SELECT 1 FROM txnbuf.brokers WHERE id = $1 AND lease_until > now())
    AND (s.owner IS NULL OR s.owner = $1
         OR NOT EXISTS (SELECT 1 FROM txnbuf.brokers AS b
                        WHERE b.id = s.owner AND b.lease_until > now()))
  RETURNING s.slot, s.epoch, old.owner AS previous
), released AS (
  SELECT took.slot, took.epoch FROM took JOIN txnbuf.moves AS m
    ON m.slot = took.slot AND m.to_owner IS NULL AND m.epoch = took.epoch - 1
  WHERE took.previous IS NULL
), completed AS (
  UPDATE txnbuf.moves AS m SET to_owner = $1, epoch = r.epoch, at = now()
  FROM released AS r WHERE m.slot = r.slot AND m.to_owner IS NULL AND m.epoch = r.epoch - 1
), recorded AS (
  INSERT INTO txnbuf.moves (slot, from_owner, to_owner, epoch, why)
  SELECT took.slot, took.previous, $1, took.epoch,
         CASE WHEN took.previous IS NULL THEN 'balance'
              WHEN took.previous = $1 THEN 'restart' ELSE 'failover' END
  FROM took WHERE took.slot NOT IN (SELECT slot FROM released)
), {_TRIM_MOVES}
SELECT slot, epoch FROM took
"""
_RELEASE = f"""
WITH freed AS (
  UPDATE txnbuf.slots AS s SET owner = NULL
  FROM unnest($2::integer[], $3::bigint[]) AS t(slot, epoch)
  WHERE s.slot = t.slot AND s.owner = $1 AND s.epoch = t.epoch
  RETURNING s.slot, s.epoch
), recorded AS (
  INSERT INTO txnbuf.moves (slot, from_owner, epoch, why)
  SELECT slot, $1, epoch, 'balance' FROM freed
), {_TRIM_MOVES}
SELECT slot FROM freed
"""
_LEAVE_SLOTS = f"""
WITH freed AS (
  UPDATE txnbuf.slots SET owner = NULL WHERE owner = $1 RETURNING slot, epoch
), recorded AS (
  INSERT INTO txnbuf.moves (slot, from_owner, epoch, why)
  SELECT slot, $1, epoch, 'handover' FROM freed
), {_TRIM_MOVES}
SELECT count(*) FROM freed
"""
_DESCRIBE_BROKERS = """
SELECT id, urls, extract(epoch FROM lease_until)::float8, extract(epoch FROM renewed_at)::float8
FROM txnbuf.brokers ORDER BY id
"""
_MOVES = """
SELECT slot, from_owner, to_owner, epoch, extract(epoch FROM at)::float8, why
FROM txnbuf.moves ORDER BY id DESC LIMIT $1
"""
_URLS = "SELECT id, urls FROM txnbuf.brokers"
KAFKA_SCHEME = "kafka://"


def service_url(urls: str) -> str:
    """The service URL (txnbuf's protocol) of a broker's ``urls``: the
    first of them. ``urls`` is the broker's service URL, then, separated by
    commas, its other listeners' addresses: ``kafka://host:port`` for its
    Kafka listener (`kafka_address`)."""
    return urls.split(",", 1)[0].strip()


def kafka_address(urls: str) -> str | None:
    """The ``host:port`` of a broker's Kafka listener, given in its ``urls``
    (see `service_url`), or None if it has none."""
    for url in urls.split(",")[1:]:
        url = url.strip()
        if url.startswith(KAFKA_SCHEME):
            return url[len(KAFKA_SCHEME) :]
    return None


@dataclass(frozen=True)
class BrokerRow:
    """A registered broker, times in seconds on the database's clock."""

    id: str
    urls: str
    lease_until: float
    renewed_at: float


@dataclass(frozen=True)
class Move:
    """A slot that changed owner, or is changing (``to_owner`` None: released
    and not taken yet). ``epoch``: the slot's epoch under its new owner (the
    epoch released while not taken yet); ``at``: when it was taken (or
    released), seconds on the database's clock; ``why``: ``balance`` (a
    share moved to even the brokers out, or a free slot taken),
    ``handover`` (a draining broker's, on SIGTERM), ``failover`` (taken from
    a broker whose lease ran out) or ``restart`` (a broker took its own
    slot back after dropping everything)."""

    slot: int
    from_owner: str | None
    to_owner: str | None
    epoch: int
    at: float
    why: str


@dataclass(frozen=True)
class ClusterTables:
    """One consistent read of the cluster tables, for operators (`describe`)."""

    now: float
    brokers: tuple[BrokerRow, ...]
    slots: tuple[tuple[int, str | None, int], ...]  # (slot, owner, epoch)
    moves: tuple[Move, ...]  # the most recent first


def _unknown(what: str, exc: BaseException) -> MembershipError:
    return MembershipError(f"{what}: {type(exc).__name__}: {exc}")


_DRIVER_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # (TargetServerAttributeNotMatched: no host is writable)
    OSError,
    TimeoutError,
)


class PostgresMembership:
    """`MembershipStore` over the tables of the schema ``txnbuf`` (see the
    module docstring). Create with `open`, end with `close`."""

    def __init__(self, pool: asyncpg.Pool, slots: int) -> None:
        self._pool = pool
        self.slots = slots  # the number of slots of the database
        # The last snapshot read, and the registered brokers' service URLs
        # and Kafka listeners' addresses (of those that have one) then.
        self.last_view: View | None = None
        self.last_urls: dict[str, str] = {}
        self.last_kafka: dict[str, str] = {}

    @classmethod
    async def open(cls, url: str, **options: Any) -> PostgresMembership:
        """Connect to the cluster database ``url`` (its ``txnbuf`` schema made
        by a ledger store), with more of asyncpg's connection ``options``;
        `MembershipError` if it cannot, or if the database has no cluster
        tables."""
        settings = {
            "lock_timeout": LOCK_TIMEOUT,
            "idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION,
        }
        try:
            pool: asyncpg.Pool = await asyncpg.create_pool(
                url, min_size=0, max_size=POOL_SIZE, server_settings=settings, **options
            )  # (min_size=0: no floor restored, with a traceback logged, while the server is gone)
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
            if isinstance(exc, _DRIVER_ERRORS):  # (the pool connects on its first use)
                raise _unknown("cannot connect to the cluster database", exc) from exc
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
        self.last_urls = {b: service_url(urls) for b, _, urls in brokers}
        self.last_kafka = {
            b: address for b, _, urls in brokers if (address := kafka_address(urls)) is not None
        }
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
                    await conn.fetchval(_LEAVE_SLOTS, me)
                    await conn.execute("DELETE FROM txnbuf.brokers WHERE id = $1", me)
        except _DRIVER_ERRORS as exc:
            raise _unknown("leaving", exc) from exc

    # -- beyond the protocol --------------------------------------------------------

    async def moves(self, limit: int = 100) -> list[Move]:
        """The most recent moves of slots, the latest first."""
        rows = await self._fetch("reading the moves", _MOVES, limit)
        return [_move(r) for r in rows]

    async def describe(self, moves: int = 100) -> ClusterTables:
        """The brokers, the slots and the ``moves`` most recent moves, in one
        snapshot (for the admin API)."""
        try:
            async with self._pool.acquire() as conn:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    now = await conn.fetchval("SELECT extract(epoch FROM now())::float8")
                    brokers = await conn.fetch(_DESCRIBE_BROKERS)
                    slots = await conn.fetch(_READ_SLOTS)
                    recent = await conn.fetch(_MOVES, moves)
        except _DRIVER_ERRORS as exc:
            raise _unknown("reading the cluster tables", exc) from exc
        return ClusterTables(
            float(now),
            tuple(BrokerRow(str(b), str(u), float(t), float(r)) for b, u, t, r in brokers),
            tuple((int(k), o, int(e)) for k, o, e in slots),
            tuple(_move(r) for r in recent),
        )

    async def urls(self) -> dict[str, str]:
        """Every registered broker's service URL (live or not): broker id ->
        URL (`service_url` of its row's ``urls``)."""
        rows = await self._fetch("reading the brokers' URLs", _URLS)
        return {str(b): service_url(str(u)) for b, u in rows}


def _move(row: asyncpg.Record) -> Move:
    slot, from_owner, to_owner, epoch, at, why = row
    return Move(int(slot), from_owner, to_owner, int(epoch), float(at), str(why))
