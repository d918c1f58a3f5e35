"""The cluster tables as an interface (`MembershipStore`), and a model of them.

`MembershipStore` is what the driver (`cluster.Member`) needs from the
cluster database. `ModelStore` implements it in memory with the semantics of
the PostgreSQL statements written below: every method is one atomic step at
one instant of one clock (the database's), and ``commit`` models the
ledger engine's per-commit fence. The simulation and the tests run on the
model (each broker through its own `ModelConnection`); the PostgreSQL
implementation runs the SQL in `MembershipStore`'s docstring.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from cluster._ownership import SlotRow, View

__all__ = [
    "Event",
    "EventKind",
    "MembershipError",
    "MembershipStore",
    "ModelConnection",
    "ModelStore",
    "Network",
    "Violation",
    "check_history",
    "direct",
]


_T = TypeVar("_T")


class MembershipError(Exception):
    """The cluster database did not answer, or answered with an error: the
    outcome of the request that raised it is unknown (it may have been
    applied). An implementation translates its driver's errors into this."""


class MembershipStore(Protocol):
    """The cluster's membership and slot tables (PostgreSQL in a cluster).

    Tables (created with the cluster database; S fixed then, written in the
    database, 64 by default)::

        CREATE TABLE brokers (
            id          text PRIMARY KEY,
            urls        text NOT NULL,          -- where clients reach it (1)
            lease_until timestamptz NOT NULL    -- by the database's clock
        );
        CREATE TABLE slots (
            slot  integer PRIMARY KEY,          -- 0 .. S-1, all rows exist
            owner text,                         -- NULL: free
            epoch bigint NOT NULL DEFAULT 0
        );
        INSERT INTO slots(slot) SELECT generate_series(0, $S - 1);

    (1) the service URL, then the other listeners' addresses, separated by
    commas: ``kafka://host:port`` for a Kafka listener
    (`cluster.service_url`, `cluster.kafka_address`).

    Times cross the interface as seconds on the database's clock
    (``extract(epoch FROM ...)``); a broker never compares them with its own
    clock. Every method is one statement or one transaction; each raises
    `MembershipError` when the outcome is unknown (connection lost, timeout,
    COMMIT failed), and the caller then re-reads rather than guesses.

    ``read``, one snapshot (an implementation may keep the slots it read
    and re-read them only when a version row, bumped by every take,
    release and leave in the same transaction, has changed)::

        BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY;
        SELECT extract(epoch FROM now());
        SELECT id, extract(epoch FROM lease_until) FROM brokers;
        SELECT slot, owner, epoch FROM slots ORDER BY slot;
        COMMIT;

    ``join`` (register, or come back after a lost lease)::

        INSERT INTO brokers(id, urls, lease_until)
        VALUES ($me, $urls, now() + make_interval(secs => $ttl))
        ON CONFLICT (id) DO UPDATE
            SET urls = EXCLUDED.urls, lease_until = EXCLUDED.lease_until
        RETURNING extract(epoch FROM lease_until);

    ``renew`` (no row returned: the lease had expired, or the row is gone;
    the broker must then drop what it holds and join again)::

        UPDATE brokers SET lease_until = now() + make_interval(secs => $ttl)
        WHERE id = $me AND lease_until > now()
        RETURNING extract(epoch FROM lease_until);

    ``take`` (compare-and-set on each slot's epoch; the rows returned are the
    slots won, at their new epochs)::

        UPDATE slots AS s SET owner = $me, epoch = s.epoch + 1
        FROM unnest($slots::int[], $seen::bigint[]) AS t(slot, seen)
        WHERE s.slot = t.slot AND s.epoch = t.seen
          AND EXISTS (SELECT 1 FROM brokers
                      WHERE id = $me AND lease_until > now())
          AND (s.owner IS NULL OR s.owner = $me
               OR NOT EXISTS (SELECT 1 FROM brokers b
                              WHERE b.id = s.owner AND b.lease_until > now()))
        RETURNING s.slot, s.epoch;

    ``release`` (rows returned: the slots released)::

        UPDATE slots AS s SET owner = NULL
        FROM unnest($slots::int[], $epochs::bigint[]) AS t(slot, epoch)
        WHERE s.slot = t.slot AND s.owner = $me AND s.epoch = t.epoch
        RETURNING s.slot;

    ``leave`` (SIGTERM, after every slot was unloaded)::

        BEGIN;
        UPDATE slots SET owner = NULL WHERE owner = $me;
        DELETE FROM brokers WHERE id = $me;
        COMMIT;

    Safety does not come from these tables but from the fence that the
    ledger engine runs inside every group commit (``ModelStore.commit``
    models it): in the same PostgreSQL transaction as the writes of slots
    ``$slots`` held at ``$epochs``::

        SELECT s.slot FROM slots AS s
        JOIN unnest($slots::int[], $epochs::bigint[]) AS t(slot, epoch)
          ON s.slot = t.slot
        WHERE s.owner = $me AND s.epoch = t.epoch
        FOR SHARE OF s;

    fewer rows than slots: ROLLBACK and fail the store (fail-stop; the
    broker drops everything). Run it with one group commit in flight per
    broker and database (two transactions share-locking one row make a
    MultiXact). Sessions get ``idle_in_transaction_session_timeout`` below
    the ttl, so that a broker paused between this check and its COMMIT does
    not hold the lock (and block takeovers) for as long as TCP stays up, and
    ``take`` runs with a ``lock_timeout`` (a take that times out is tried
    again at the next look). ``FOR SHARE`` makes a concurrent ``take``
    (an UPDATE of the row) wait for this commit, and a commit that comes
    after the take see the new owner or epoch (READ COMMITTED re-checks the
    WHERE clause against the row's newest version after waiting). ``FOR KEY
    SHARE`` would not do: it does not block a non-key UPDATE.
    """

    async def read(self) -> View:
        """One snapshot of both tables and the database's ``now``."""
        ...

    async def join(self, me: str, urls: str, ttl: float) -> float:
        """Register ``me`` (or refresh its row) with a lease of ``ttl``
        seconds; returns ``lease_until``."""
        ...

    async def renew(self, me: str, ttl: float) -> float | None:
        """Extend the lease of ``me`` by ``ttl`` from now if it has not
        expired; returns ``lease_until``, or None if it had expired (or the
        row is gone): the broker lost its lease."""
        ...

    async def take(self, me: str, seen: Mapping[int, int]) -> dict[int, int]:
        """Take each slot k of ``seen`` whose row still has epoch
        ``seen[k]``, is free, this broker's, or owned by a broker whose
        lease has expired, if ``me``'s own lease has not; returns the slots
        taken with their new epochs (``seen[k] + 1``)."""
        ...

    async def release(self, me: str, held: Mapping[int, int]) -> set[int]:
        """Free each slot k of ``held`` still owned by ``me`` at epoch
        ``held[k]``; returns the slots freed."""
        ...

    async def leave(self, me: str) -> None:
        """Free every slot owned by ``me`` and delete its broker row, in one
        transaction."""
        ...


# -- the model -----------------------------------------------------------------------


class EventKind(enum.Enum):
    JOIN = "join"
    RENEW = "renew"
    TAKE = "take"
    RELEASE = "release"
    LEAVE = "leave"
    COMMIT = "commit"  # a group commit the fence accepted
    FENCED = "fenced"  # a group commit the fence refused (rolled back)


@dataclass(frozen=True, slots=True)
class Event:
    """One change (or refused commit) in the model store's history."""

    time: float
    kind: EventKind
    broker: str
    slots: tuple[tuple[int, int], ...] = ()  # (slot, epoch) pairs it concerned


class ModelStore:
    """The cluster tables in memory, with PostgreSQL's semantics as stated in
    `MembershipStore`: conditional updates on the epoch, leases measured on
    one clock (``clock``, the database's), and ``commit``, the ledger
    engine's fence: a group commit by broker b that writes slots at epochs
    ``{k: e}`` is accepted only if every ``slots[k] == (b, e)`` at that
    instant, and otherwise rolled back as a whole.

    Each ``*_now`` method is one atomic step at ``clock()``; brokers reach
    them through a `ModelConnection` each. With ``fence=False`` every
    commit is accepted: a store without the fence, in which `check_history`
    finds slots written by two brokers (the tests show that the fence is
    what keeps them apart).
    """

    def __init__(
        self,
        slots: int,
        clock: Callable[[], float],
        *,
        fence: bool = True,
    ) -> None:
        if slots < 1:
            raise ValueError(f"a cluster needs at least 1 slot, not {slots}")
        self.clock = clock
        self.fence = fence
        self.brokers: dict[str, tuple[str, float]] = {}  # id -> (urls, lease_until)
        self.slots: list[SlotRow] = [SlotRow(None, 0)] * slots
        self.history: list[Event] = []

    # The steps (atomic, no awaits).

    def live(self, broker: str) -> bool:
        row = self.brokers.get(broker)
        return row is not None and row[1] > self.clock()

    def snapshot(self) -> View:
        now = self.clock()
        return View(now, {b: until for b, (_, until) in self.brokers.items()}, tuple(self.slots))

    def _log(self, kind: EventKind, broker: str, slots: Mapping[int, int] | None = None) -> None:
        pairs = tuple(sorted(slots.items())) if slots else ()
        self.history.append(Event(self.clock(), kind, broker, pairs))

    def join_now(self, me: str, urls: str, ttl: float) -> float:
        until = self.clock() + ttl
        self.brokers[me] = (urls, until)
        self._log(EventKind.JOIN, me)
        return until

    def renew_now(self, me: str, ttl: float) -> float | None:
        if not self.live(me):
            return None
        until = self.clock() + ttl
        self.brokers[me] = (self.brokers[me][0], until)
        self._log(EventKind.RENEW, me)
        return until

    def _check(self, slots: Iterable[int]) -> None:
        bad = sorted(k for k in slots if not 0 <= k < len(self.slots))
        if bad:
            raise ValueError(f"no such slot: {bad} (the cluster has {len(self.slots)} slots)")

    def take_now(self, me: str, seen: Mapping[int, int]) -> dict[int, int]:
        self._check(seen)
        if not self.live(me):
            return {}
        won: dict[int, int] = {}
        for k, epoch in sorted(seen.items()):
            row = self.slots[k]
            if row.epoch != epoch:
                continue
            if row.owner is not None and row.owner != me and self.live(row.owner):
                continue
            self.slots[k] = SlotRow(me, epoch + 1)
            won[k] = epoch + 1
        if won:
            self._log(EventKind.TAKE, me, won)
        return won

    def release_now(self, me: str, held: Mapping[int, int]) -> set[int]:
        self._check(held)
        freed = {k: e for k, e in held.items() if self.slots[k] == SlotRow(me, e)}
        for k, e in freed.items():
            self.slots[k] = SlotRow(None, e)
        if freed:
            self._log(EventKind.RELEASE, me, freed)
        return set(freed)

    def leave_now(self, me: str) -> None:
        freed = {k: row.epoch for k, row in enumerate(self.slots) if row.owner == me}
        for k, e in freed.items():
            self.slots[k] = SlotRow(None, e)
        self.brokers.pop(me, None)
        self._log(EventKind.LEAVE, me, freed)

    def commit_now(self, me: str, epochs: Mapping[int, int]) -> bool:
        self._check(epochs)
        ok = not self.fence or all(self.slots[k] == SlotRow(me, e) for k, e in epochs.items())
        self._log(EventKind.COMMIT if ok else EventKind.FENCED, me, epochs)
        return ok


class Network(Protocol):
    """How a request reaches the store and its answer comes back: calls
    ``step`` (one atomic step of the store) when the request arrives, and
    returns its result when the answer does. The simulation's network delays
    both, holds them while a broker is paused, and loses answers."""

    def __call__(self, step: Callable[[], _T]) -> Awaitable[_T]: ...


async def direct(step: Callable[[], _T]) -> _T:
    """No network: the step runs at once."""
    return step()


class ModelConnection:
    """One broker's connection to a `ModelStore`: `MembershipStore`, plus
    ``commit`` (the ledger engine's fenced group commit), each request sent
    through ``network``."""

    def __init__(self, store: ModelStore, network: Network = direct) -> None:
        self.store = store
        self.network = network

    async def read(self) -> View:
        return await self._step(self.store.snapshot)

    async def join(self, me: str, urls: str, ttl: float) -> float:
        return await self._step(lambda: self.store.join_now(me, urls, ttl))

    async def renew(self, me: str, ttl: float) -> float | None:
        return await self._step(lambda: self.store.renew_now(me, ttl))

    async def take(self, me: str, seen: Mapping[int, int]) -> dict[int, int]:
        return await self._step(lambda: self.store.take_now(me, seen))

    async def release(self, me: str, held: Mapping[int, int]) -> set[int]:
        return await self._step(lambda: self.store.release_now(me, held))

    async def leave(self, me: str) -> None:
        await self._step(lambda: self.store.leave_now(me))

    async def commit(self, me: str, epochs: Mapping[int, int]) -> bool:
        """A group commit by ``me`` writing slots ``epochs`` (slot -> the
        epoch it holds them at): True if the fence accepted it."""
        return await self._step(lambda: self.store.commit_now(me, epochs))

    async def _step(self, step: Callable[[], _T]) -> _T:
        return await self.network(step)


# -- the check ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Violation:
    """An accepted write to a slot by a broker that was not its owner at that
    epoch when it was written."""

    time: float
    slot: int
    writer: str
    epoch: int
    owner: str | None
    owner_epoch: int

    def __str__(self) -> str:
        return (
            f"t={self.time:.3f}: {self.writer} wrote slot {self.slot} at epoch {self.epoch}"
            f" while {self.owner or 'nobody'} owned it at epoch {self.owner_epoch}"
        )


def check_history(history: list[Event], slots: int) -> list[Violation]:
    """Replay the ownership changes of ``history`` (takes, releases,
    leaves) and check every accepted commit against them: each slot it wrote
    had been taken by its writer at the epoch it wrote at, and was neither
    taken by another broker nor released since. So no slot ever had two
    writers: between two takes of a slot, only the first taker wrote it."""
    owner: list[tuple[str | None, int]] = [(None, 0)] * slots
    bad: list[Violation] = []
    for event in history:
        if event.kind is EventKind.TAKE:
            for k, e in event.slots:
                owner[k] = (event.broker, e)
        elif event.kind in (EventKind.RELEASE, EventKind.LEAVE):
            for k, e in event.slots:
                owner[k] = (None, e)
        elif event.kind is EventKind.COMMIT:
            for k, e in event.slots:
                if owner[k] != (event.broker, e):
                    who, at = owner[k]
                    bad.append(Violation(event.time, k, event.broker, e, who, at))
    return bad
