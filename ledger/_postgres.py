"""The PostgreSQL engine of a `LedgerStore`, with fencing by slots.

Any libpq URL (``postgresql://user:password@host:port/db?...``), through
asyncpg (`connect_options`: a URL naming several hosts, a primary and its
standbys, connects to the writable one): it speaks PostgreSQL's binary
protocol from Cython, so a group commit's arrays of keys, metas and blobs
are encoded without a Python loop, and a statement with its parameters is
one round trip (Parse/Bind/Execute/
Sync in one write, the statement prepared once per connection). psycopg 3
(async, pipeline mode) can do the same in one round trip; `bench.pgdriver`
measures both, and asyncpg spent less CPU per group commit in this process
(docs/cluster.md has the figures).

Layout, in the schema ``txnbuf`` of the database (created by the first
store that opens it, under a transaction-scoped advisory lock so that two
brokers starting at once do not both create it; the lock serialises DDL
only, nothing relies on it for the data)::

    txnbuf.meta(key, value)        schema_version, slots
    txnbuf.slots(slot, owner, epoch)  owner NULL: free (`cluster.MembershipStore`'s
                                      table ``slots``)
    txnbuf.brokers(id, urls, lease_until, renewed_at)  the cluster's members (its ``brokers``)
    txnbuf.moves(id, slot, from_owner, to_owner, epoch, at, why)  recent moves of slots
    txnbuf.ledgers(id, name, first_entry_id, next_entry_id)
    txnbuf.entries(ledger, entry, meta, data)   primary key (ledger, entry)

and three functions, each called as one statement (its own transaction,
one round trip): ``txnbuf.commit`` (a group commit: the fencing check, the
appends as one ``INSERT ... SELECT FROM unnest(...)``, the trims),
``txnbuf.create_ledgers`` and ``txnbuf.delete_ledger``. A group commit
larger than `CHUNK_ROWS` rows or `CHUNK_BYTES` bytes is several calls of
``txnbuf.commit`` inside one explicit transaction.

Schema versions: ``meta.schema_version`` is `SCHEMA_VERSION` when a store
creates the schema. A store refuses a database of a later version (made by
a newer txnbuf) and upgrades one of an earlier version in place, in the
transaction (and under the lock) that checks it: `UPGRADES` holds what each
version adds (version 2: the table ``brokers``, the cluster's membership,
which `cluster.PostgresMembership` reads and writes; version 3: the
brokers' ``renewed_at`` and the table ``moves``, the recent moves of slots).

Group commit: one writer connection and one commit in flight at a time, so
append order is durability order (as on SQLite). Requests that arrive while
a commit runs wait, and the consecutive writes among them are the next
group commit. Fail-stop as on SQLite: after a failed commit (an error, a
lost connection: an unknown outcome) every later request is refused. Reads
go to a small pool of their own connections.

Slots and fencing (the cluster's safety). A cluster database has a fixed
number of slots, set when it is created (`DEFAULT_SLOTS`, 64, unless the
first store is opened with another number); ``txnbuf.slots`` has one row
per slot: its owner (a broker's name) and its epoch. The broker hands the
store ``slot_of(ledger name, slots)``: slot k holds the topics whose stable
hash falls in k, coordinator k, and the Kafka group-coordinator and
transactional-id range k (`broker._slots`). `take_slots` makes this store's
owner the owner of some slots and raises their epochs by one (``UPDATE
txnbuf.slots SET owner = $me, epoch = epoch + 1 WHERE slot = ...``, or,
given the epochs it saw, ``... AND epoch = $seen``: a takeover that loses a
race takes nothing); the store keeps the epochs. Every group commit,
creation and deletion that writes a slot's ledgers first locks those
slots' rows ``FOR SHARE`` and checks that each still names this owner and
the epoch the store holds, in the same transaction, before it writes
anything. A takeover's ``UPDATE`` of a row waits for every transaction
holding it ``FOR SHARE`` to end, so it is ordered after each write of the
old owner that passed the check; every later write of the old owner sees
the new epoch (under READ COMMITTED its locking read re-reads the updated
row) and fails: the transaction is rolled back and the commit fails with
`LedgerFencedError` naming the slots, nothing of it written. A store that
writes a slot it does not hold fails the same way. Leases and advisory
locks are not used for this. The writer connection has
``idle_in_transaction_session_timeout`` (`IDLE_IN_TRANSACTION`): a group
commit large enough to be several statements in one transaction, whose
broker is paused between them, does not hold its slots' share locks (and
block a takeover) for as long as its TCP connection stays up.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import asyncpg

from ledger import _writer
from ledger._base import EngineSink, Entry, LedgerError, LedgerFailedError, LedgerFencedError

__all__ = ["SCHEMA_VERSION", "PostgresEngine", "connect_options"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 3
READERS = 4  # connections of the read pool, at most
STOP_WAIT = 10.0  # seconds a closing store waits for its connections to close
IDLE_IN_TRANSACTION = "5s"  # the writer's idle_in_transaction_session_timeout
CHUNK_ROWS = 20_000  # rows of one call of txnbuf.commit, at most
CHUNK_BYTES = 64 << 20  # bytes of data of one call, at most (before the next row)
FENCED = "TXF01"  # the SQLSTATE txnbuf.fence raises
_ENTRY_BITS = _writer.ENTRY_BITS
_MAX_ENTRY_ID = _writer.MAX_ENTRY_ID
MAX_LEDGER_ID = (1 << (63 - _ENTRY_BITS)) - 1  # (ids share a 63-bit key with entry ids)
_SCHEMA_LOCK = 0x7478_6E62  # pg_advisory_xact_lock key for creating the schema ("txnb")

# The recent moves of slots between brokers (`cluster.PostgresMembership`
# writes them in the statements that take, release and free slots).
MOVES = """
CREATE TABLE txnbuf.moves (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    slot integer NOT NULL,
    from_owner text,
    to_owner text,
    epoch bigint NOT NULL,
    at timestamptz NOT NULL DEFAULT now(),
    why text NOT NULL
);
"""

SCHEMA = f"""
CREATE SCHEMA IF NOT EXISTS txnbuf;
CREATE TABLE txnbuf.meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE txnbuf.slots (
    slot integer PRIMARY KEY,
    owner text,
    epoch bigint NOT NULL DEFAULT 0
);
CREATE TABLE txnbuf.brokers (
    id text PRIMARY KEY,
    urls text NOT NULL,
    lease_until timestamptz NOT NULL,
    renewed_at timestamptz NOT NULL DEFAULT now()
);
{MOVES}CREATE TABLE txnbuf.ledgers (
    id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY CHECK (id <= {MAX_LEDGER_ID}),
    name text COLLATE "C" UNIQUE NOT NULL,
    first_entry_id bigint NOT NULL DEFAULT 0,
    next_entry_id bigint NOT NULL DEFAULT 0
);
CREATE TABLE txnbuf.entries (
    ledger bigint NOT NULL,
    entry bigint NOT NULL,
    meta bigint NOT NULL,
    data bytea NOT NULL,
    PRIMARY KEY (ledger, entry)
);

CREATE FUNCTION txnbuf.fence(p_owner text, p_slots integer[], p_epochs bigint[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    lost integer[];
BEGIN
    IF cardinality(p_slots) = 0 THEN
        RETURN;
    END IF;
    -- FOR SHARE: a takeover's UPDATE of these rows waits for this transaction.
    SELECT coalesce(array_agg(f.slot ORDER BY f.slot), '{{}}') INTO lost
    FROM unnest(p_slots, p_epochs) AS f(slot, epoch)
    LEFT JOIN (
        SELECT s.slot, s.owner, s.epoch FROM txnbuf.slots AS s
        WHERE s.slot = ANY(p_slots) ORDER BY s.slot FOR SHARE
    ) AS s ON s.slot = f.slot
    WHERE s.slot IS NULL OR s.owner IS DISTINCT FROM p_owner OR s.epoch <> f.epoch;
    IF cardinality(lost) > 0 THEN
        RAISE EXCEPTION 'slots % are no longer held by % at the epochs it holds', lost, p_owner
            USING ERRCODE = '{FENCED}', DETAIL = array_to_string(lost, ',');
    END IF;
END $$;

CREATE FUNCTION txnbuf.commit(
    p_owner text, p_slots integer[], p_epochs bigint[],
    p_keys bigint[], p_metas bigint[], p_data bytea[],
    p_trim_ids bigint[], p_trim_firsts bigint[], p_trim_nexts bigint[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM txnbuf.fence(p_owner, p_slots, p_epochs);
    INSERT INTO txnbuf.entries (ledger, entry, meta, data)
    SELECT r.k >> {_ENTRY_BITS}, r.k & {_MAX_ENTRY_ID}, r.m, r.d
    FROM unnest(p_keys, p_metas, p_data) AS r(k, m, d);
    -- (A trim never reaches an entry appended after it: deleting after
    -- inserting is the order of the queue.)
    FOR i IN 1 .. coalesce(cardinality(p_trim_ids), 0) LOOP
        DELETE FROM txnbuf.entries
        WHERE ledger = p_trim_ids[i] AND entry < p_trim_firsts[i];
        UPDATE txnbuf.ledgers
        SET first_entry_id = p_trim_firsts[i], next_entry_id = p_trim_nexts[i]
        WHERE id = p_trim_ids[i];
    END LOOP;
END $$;

CREATE FUNCTION txnbuf.create_ledgers(
    p_owner text, p_slots integer[], p_epochs bigint[], p_names text[]
) RETURNS TABLE (ledger_name text, ledger_id bigint) LANGUAGE plpgsql AS $$
BEGIN
    PERFORM txnbuf.fence(p_owner, p_slots, p_epochs);
    -- (Sorted: two stores creating the same names wait for each other in
    -- one order. A name another store created meanwhile is kept.)
    INSERT INTO txnbuf.ledgers (name)
    SELECT n FROM unnest(p_names) AS n ORDER BY n COLLATE "C"
    ON CONFLICT (name) DO NOTHING;
    -- (A statement of its own: its snapshot sees what a concurrent creation
    -- of the same name committed while the INSERT waited for it.)
    RETURN QUERY SELECT l.name::text, l.id FROM txnbuf.ledgers AS l WHERE l.name = ANY(p_names);
END $$;

CREATE FUNCTION txnbuf.delete_ledger(
    p_owner text, p_slots integer[], p_epochs bigint[], p_id bigint
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM txnbuf.fence(p_owner, p_slots, p_epochs);
    DELETE FROM txnbuf.entries WHERE ledger = p_id;
    DELETE FROM txnbuf.ledgers WHERE id = p_id;
END $$;
"""

# What each schema version adds to the one before (applied in order, in the
# transaction that creates or upgrades the schema).
UPGRADES = {
    3: "ALTER TABLE txnbuf.brokers ADD COLUMN renewed_at timestamptz NOT NULL DEFAULT now();\n"
    + MOVES,
    2: """
CREATE TABLE txnbuf.brokers (
    id text PRIMARY KEY,
    urls text NOT NULL,
    lease_until timestamptz NOT NULL
);
""",
}

_COMMIT = "SELECT txnbuf.commit($1, $2, $3, $4, $5, $6, $7, $8, $9)"
_CREATE = "SELECT ledger_name, ledger_id FROM txnbuf.create_ledgers($1, $2, $3, $4)"
_DELETE = "SELECT txnbuf.delete_ledger($1, $2, $3, $4)"
_CATALOG = (
    "SELECT l.id, l.name, l.first_entry_id, l.next_entry_id, "
    "(SELECT max(e.entry) FROM txnbuf.entries AS e WHERE e.ledger = l.id) FROM txnbuf.ledgers AS l"
)


def redacted(url: str) -> str:
    """``url`` without its password, for messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


WRITABLE = ("read-write", "primary")  # the target_session_attrs a store accepts
DRIVER_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,  # (TargetServerAttributeNotMatched: no host is writable)
)


def connect_options(url: str) -> dict[str, Any]:
    """asyncpg's options for connecting to the store ``url``, beside the URL
    itself: every connection of a store (its engine's, and the cluster
    membership's) is made with them.

    A URL may name several hosts, libpq's way (``postgresql://u@h1:5432,
    h2:5432/db``, or ``?host=h1,h2``): a primary and its standbys. asyncpg
    then tries them in order and keeps the first whose session matches
    ``target_session_attrs``; a store writes, so with several hosts the
    default here is ``read-write`` (libpq's and asyncpg's is ``any``, which
    would keep a standby that answers first), ``primary`` is accepted too,
    and the other values are refused (`LedgerError`). The URL's value, then
    ``PGTARGETSESSIONATTRS``, wins over the default. A URL of one host is
    left as it is (a PostgreSQL-compatible database may not report
    ``in_hot_standby``, and asyncpg would ask it ``pg_is_in_recovery()``)."""
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qs(parts.query)
    hosts = parts.netloc.rsplit("@", 1)[-1]
    several = "," in hosts or any("," in h for h in query.get("host", []))
    given = query.get("target_session_attrs", [os.environ.get("PGTARGETSESSIONATTRS", "")])[-1]
    if not given:
        return {"target_session_attrs": "read-write"} if several else {}
    if given not in WRITABLE and (several or given != "any"):
        raise LedgerError(
            f"target_session_attrs={given} in the store URL {redacted(url)}: a store writes, "
            f"so it connects to a writable server ({' or '.join(WRITABLE)}; read-write unless "
            "given)"
        )
    return {}


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _fenced(exc: asyncpg.PostgresError, owner: str) -> LedgerFencedError:
    detail = getattr(exc, "detail", None) or ""
    slots = [int(s) for s in detail.split(",") if s.strip().isdigit()]
    return LedgerFencedError(
        f"fenced: slots {', '.join(map(str, slots))} are no longer held by {owner!r} at the "
        "epochs it holds (another broker took them over); nothing of this write was stored",
        slots,
    )


async def _connect(url: str, **options: Any) -> asyncpg.Connection:
    try:
        conn: asyncpg.Connection = await asyncpg.connect(url, **connect_options(url), **options)
    except (*DRIVER_ERRORS, ValueError) as exc:
        raise LedgerError(f"cannot connect to PostgreSQL at {redacted(url)}: {exc}") from exc
    return conn


async def _ensure_schema(conn: asyncpg.Connection, slots: int, location: str) -> int:
    """Create the schema if the database has none; refuse a later version.
    Returns the database's number of slots."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _SCHEMA_LOCK)
        if await conn.fetchval("SELECT to_regclass('txnbuf.meta')") is None:
            await conn.execute(SCHEMA)
            await conn.execute(
                "INSERT INTO txnbuf.meta (key, value) VALUES ('schema_version', $1), ('slots', $2)",
                str(SCHEMA_VERSION),
                str(slots),
            )
            await conn.execute(
                "INSERT INTO txnbuf.slots (slot) SELECT generate_series(0, $1 - 1)", slots
            )
            log.info(
                "created the txnbuf schema (version %d, %d slots) in %s",
                SCHEMA_VERSION,
                slots,
                location,
            )
        rows = dict(await conn.fetch("SELECT key, value FROM txnbuf.meta"))
        version = int(rows.get("schema_version", "0"))
        if version > SCHEMA_VERSION:
            raise LedgerError(
                f"the txnbuf schema in {location} is version {version}, made by a newer "
                f"txnbuf; this one reads version {SCHEMA_VERSION} (upgrade txnbuf)"
            )
        if version < 1:
            raise LedgerError(
                f"the txnbuf schema in {location} is version {version}, which this txnbuf "
                f"cannot upgrade to version {SCHEMA_VERSION}"
            )
        while version < SCHEMA_VERSION:
            version += 1
            await conn.execute(UPGRADES[version])
            await conn.execute(
                "UPDATE txnbuf.meta SET value = $1 WHERE key = 'schema_version'", str(version)
            )
            log.info("upgraded the txnbuf schema in %s to version %d", location, version)
        return int(rows["slots"])


class PostgresEngine:
    """A PostgreSQL database of ledgers (see the module docstring)."""

    fences = True

    def __init__(
        self,
        url: str,
        writer: asyncpg.Connection,
        readers: asyncpg.Pool,
        owner: str,
        slot_count: int,
    ) -> None:
        self.url = url
        self.location = redacted(url)
        self.owner = owner
        self.slot_count = slot_count
        self.epochs: dict[int, int] = {}  # the slots held, with their epochs
        self._writer = writer
        self._readers = readers
        self._sink: EngineSink | None = None
        self._requests: list[tuple[int, tuple[Any, ...]]] = []
        self._wake: asyncio.Future[None] | None = None
        self._closing = False
        self._failed: str | LedgerError | None = None
        self._commits = 0
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    @classmethod
    async def open(cls, url: str, owner: str | None, slots: int) -> PostgresEngine:
        if not 1 <= slots <= 1 << 16:
            raise LedgerError(f"slots must be 1..65536, not {slots}")
        location = redacted(url)
        settings = {"idle_in_transaction_session_timeout": IDLE_IN_TRANSACTION}
        writer = await _connect(url, server_settings=settings)
        try:
            count = await _ensure_schema(writer, slots, location)
            # (min_size=0: a pool with a floor restores it in the background
            # while the server is gone, and logs a traceback at each try.)
            readers = await asyncpg.create_pool(
                url, min_size=0, max_size=READERS, **connect_options(url)
            )
        except BaseException as exc:
            writer.terminate()
            if isinstance(exc, DRIVER_ERRORS):  # (the server went, or is a standby now)
                raise LedgerError(f"opening the store at {location} failed: {exc}") from exc
            raise
        return cls(url, writer, readers, owner or "", count)

    def attach(self, sink: EngineSink) -> None:
        self._sink = sink

    async def load_catalog(self, pack: Callable[[int, int, int], int]) -> dict[str, int]:
        catalog: dict[str, int] = {}
        async with self._readers.acquire() as conn:
            for ledger_id, name, first, nxt, max_entry in await conn.fetch(_CATALOG):
                # (As on SQLite: next_entry_id is written by trims only.)
                nxt = max(nxt, first)
                if max_entry is not None:
                    nxt = max(nxt, max_entry + 1)
                catalog[name] = pack(ledger_id, first, nxt)
        return catalog

    async def take_slots(self, slots: Iterable[int] | Mapping[int, int]) -> dict[int, int]:
        """Make this engine's owner the owner of ``slots``, each epoch one
        higher; given a mapping slot -> the epoch seen, only those still at
        it. Returns the slots taken, with their new epochs (also held in
        `epochs`)."""
        if not self.owner:
            raise LedgerError("a store opened without an owner takes no slots")
        if isinstance(slots, Mapping):
            rows = await self._writer.fetch(
                "UPDATE txnbuf.slots AS s SET owner = $1, epoch = s.epoch + 1 "
                "FROM unnest($2::integer[], $3::bigint[]) AS t(slot, seen) "
                "WHERE s.slot = t.slot AND s.epoch = t.seen RETURNING s.slot, s.epoch",
                self.owner,
                list(slots),
                list(slots.values()),
            )
        else:
            wanted = sorted(set(slots))
            if any(not 0 <= s < self.slot_count for s in wanted):
                raise LedgerError(f"slots are 0..{self.slot_count - 1}, not {wanted}")
            rows = await self._writer.fetch(
                "UPDATE txnbuf.slots SET owner = $1, epoch = epoch + 1 "
                "WHERE slot = ANY($2::integer[]) RETURNING slot, epoch",
                self.owner,
                wanted,
            )
        taken = {int(slot): int(epoch) for slot, epoch in rows}
        self.epochs.update(taken)
        return taken

    # -- writes ---------------------------------------------------------------

    def submit(self, seq: int, request: tuple[Any, ...]) -> None:
        self._requests.append((seq, request))
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)

    async def _run(self) -> None:
        """Answer requests in order, one group commit at a time."""
        loop = asyncio.get_running_loop()
        while True:
            if not self._requests:
                if self._closing:
                    return
                self._wake = loop.create_future()
                await self._wake
                continue
            batch, self._requests = self._requests, []
            await self._handle(batch)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.error("the PostgreSQL writer of %s stopped: %s", self.location, _describe(error))
            if self._sink is not None:
                self._sink._engine_lost(f"the PostgreSQL writer stopped: {_describe(error)}")

    async def _handle(self, batch: list[tuple[int, tuple[Any, ...]]]) -> None:
        """Consecutive writes as one group commit, consecutive creations as
        one transaction, in order."""
        i = 0
        while i < len(batch):
            kind = batch[i][1][0]
            j = i + 1
            if kind in ("write", "create"):
                while j < len(batch) and batch[j][1][0] == kind:
                    j += 1
            group = batch[i:j]
            if kind == "write":
                await self._write(group)
            elif kind == "create":
                await self._create(group)
            else:
                await self._delete(group[0])
            i = j

    def _answer(self, seq: int, error: str | LedgerError | None, result: Any) -> None:
        if self._sink is not None:
            self._sink._answered(seq, error, result)

    def _fencing(self, slots: Iterable[int]) -> tuple[list[int], list[int]]:
        """The slots and the epochs held for them; `LedgerFencedError` for a
        slot this store does not hold."""
        slots = list(slots)
        missing = [s for s in slots if s not in self.epochs]
        if missing:
            raise LedgerFencedError(
                f"fenced: this store ({self.owner!r}) does not hold slots "
                f"{', '.join(map(str, missing))}; nothing of this write was stored",
                missing,
            )
        return slots, [self.epochs[s] for s in slots]

    def _failure(self, exc: BaseException) -> str | LedgerError:
        if isinstance(exc, LedgerError):
            return exc
        if isinstance(exc, asyncpg.PostgresError) and exc.sqlstate == FENCED:
            return _fenced(exc, self.owner)
        return _describe(exc)

    async def _write(self, group: list[tuple[int, tuple[Any, ...]]]) -> None:
        if self._failed is None:
            try:
                rows = [row for _, request in group for row in request[1]]
                trims = [trim for _, request in group for trim in request[2]]
                slots: set[int] = set()
                for _, request in group:
                    if len(request) > 3:
                        slots.update(request[3])
                fence = self._fencing(sorted(slots))
                started = time.perf_counter()
                await self._commit(fence, rows, trims)
                took = time.perf_counter() - started
                self._commits += 1
                result = (self._commits, len(rows), took)
                for seq, _ in group:
                    self._answer(seq, None, result)
                return
            except Exception as exc:
                self._failed = self._failure(exc)
        for seq, _ in group:
            self._answer(seq, self._failed, None)

    async def _commit(
        self,
        fence: tuple[list[int], list[int]],
        rows: list[tuple[int, int, bytes]],
        trims: list[tuple[int, int, int]],
    ) -> None:
        """One transaction: the fencing check, the rows, the trims."""
        chunks: list[list[tuple[int, int, bytes]]] = []
        chunk: list[tuple[int, int, bytes]] = []
        size = 0
        for row in rows:
            if chunk and (len(chunk) >= CHUNK_ROWS or size >= CHUNK_BYTES):
                chunks.append(chunk)
                chunk, size = [], 0
            chunk.append(row)
            size += len(row[2])
        chunks.append(chunk)
        calls = []
        for n, part in enumerate(chunks):
            last = n == len(chunks) - 1
            keys, metas, data = (list(c) for c in zip(*part, strict=True)) if part else ([], [], [])
            trimmed = trims if last else []
            calls.append(
                (
                    self.owner,
                    *fence,
                    keys,
                    metas,
                    data,
                    [t[0] for t in trimmed],
                    [t[1] for t in trimmed],
                    [t[2] for t in trimmed],
                )
            )
        if len(calls) == 1:
            await self._writer.execute(_COMMIT, *calls[0])
            return
        async with self._writer.transaction():
            for args in calls:
                await self._writer.execute(_COMMIT, *args)

    async def _create(self, group: list[tuple[int, tuple[Any, ...]]]) -> None:
        try:
            if self._failed is not None:
                raise LedgerFailedError(str(self._failed))
            names = [request[1] for _, request in group]
            slots = {request[2] for _, request in group if len(request) > 2} - {None}
            fence = self._fencing(sorted(slots))
            rows = await self._writer.fetch(_CREATE, self.owner, *fence, names)
            ids = {name: ledger_id for name, ledger_id in rows}
        except Exception as exc:
            error = self._failure(exc)
            if isinstance(error, LedgerFencedError):
                self._failed = error  # (fail-stop, as after a failed commit)
            for seq, _ in group:
                self._answer(seq, error, None)
            return
        for seq, request in group:
            self._answer(seq, None, ids[request[1]])

    async def _delete(self, item: tuple[int, tuple[Any, ...]]) -> None:
        seq, request = item
        try:
            if self._failed is not None:
                raise LedgerFailedError(str(self._failed))
            slot = request[2] if len(request) > 2 else None
            fence = self._fencing([] if slot is None else [slot])
            await self._writer.execute(_DELETE, self.owner, *fence, request[1])
        except Exception as exc:
            error = self._failure(exc)
            if isinstance(error, LedgerFencedError):
                self._failed = error
            self._answer(seq, error, None)
            return
        self._answer(seq, None, None)

    # -- closing ----------------------------------------------------------------

    async def close(self) -> None:
        """Answer what was submitted, then close the connections."""
        self._closing = True
        if self._wake is not None and not self._wake.done():
            self._wake.set_result(None)
        try:
            await asyncio.shield(self._task)
        except Exception:
            pass  # (reported by `_ended`)
        try:  # (a connection that is gone, or a server that does not answer: let go)
            await asyncio.wait_for(self._writer.close(), STOP_WAIT)
        except (Exception, TimeoutError):
            self._writer.terminate()
        try:
            await asyncio.wait_for(self._readers.close(), STOP_WAIT)
        except (Exception, TimeoutError):
            self._readers.terminate()

    async def abandon(self) -> None:
        self._task.cancel()
        self._writer.terminate()
        self._readers.terminate()

    # -- reads ------------------------------------------------------------------

    async def _fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        try:
            rows: list[asyncpg.Record] = await self._readers.fetch(query, *args)
        except DRIVER_ERRORS as exc:  # (the server went: the store is out of service)
            raise LedgerFailedError(f"reading from {self.location} failed: {exc}") from exc
        return rows

    async def read(self, ledger_id: int, start: int, end: int) -> list[Entry]:
        rows = await self._fetch(
            "SELECT entry, meta, data FROM txnbuf.entries "
            "WHERE ledger = $1 AND entry >= $2 AND entry <= $3 ORDER BY entry",
            ledger_id,
            start,
            end,
        )
        return [Entry(e, m, d) for e, m, d in rows]

    async def read_meta(self, ledger_id: int) -> list[tuple[int, int]]:
        rows = await self._fetch(
            "SELECT entry, meta FROM txnbuf.entries WHERE ledger = $1 ORDER BY entry", ledger_id
        )
        return [(e, m) for e, m in rows]

    async def read_sizes(self, ledger_id: int) -> list[tuple[int, int]]:
        rows = await self._fetch(
            "SELECT entry, octet_length(data) FROM txnbuf.entries WHERE ledger = $1 ORDER BY entry",
            ledger_id,
        )
        return [(e, n) for e, n in rows]
