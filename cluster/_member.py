"""The driver: one broker's membership loop over a `MembershipStore`.

Every ``renew_every`` seconds (a third of the lease by default, counted from
the start of the previous look), or at once when woken
(`Member.store_failed`), or when a broker that missed a renewal would lose
its lease and leave slots to this one (`watch`), or when another broker
nudges it (`Member.nudge`: it changed the tables, and this broker may have
something to do), the loop reads one snapshot of the cluster tables, asks
`decide` what to do, and does it:

- DropAll: the host drops everything it holds (as a restart would);
- Join / Renew: one statement each; a renewal refused (the lease had
  expired) drops everything, and the next look joins again;
- Release: the host unloads each slot (stops taking its commands, settles
  its writes), then one statement frees the rows still held at their epochs;
- Take: one statement takes the rows still at the epochs seen; the host
  loads each slot won (topics, coordinator recovery) in a task of its own,
  so that slow loads never hold up the next renewal (an unload or a drop
  cancels a load still running);
- Leave (draining): the host unloads every slot, then one transaction frees
  the rows and deletes the broker's row.

A request whose answer does not come within ``timeout`` (half a renewal
interval by default) or that fails has an unknown outcome: the rest of that
look is skipped and the next look, a sixth of an interval later, re-reads;
so two answers lost in a row still leave the lease renewed in time.
Independently of any answer, a broker whose last renewal was sent
``ttl`` ago (its own clock) drops everything, right then (no request waits
past that moment, nor does the next look): by then its lease has expired
in the database and other brokers may take its slots, so it must stop
serving what it holds in memory even if the database is unreachable.
Writes need no such care: the store's fence refuses them.

A look that changed the tables so that the others have something to do
(this broker joined, released slots, or left) calls ``changed`` (the
view it read, and what it did), which asks the other brokers to look now
(`broker._cluster`). Nudges only save the wait for the next look: the
tables and their epochs stay the only truth, and a nudge lost or ignored
costs nothing but that wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Protocol, TypeVar

from cluster._ownership import (
    Action,
    DropAll,
    Join,
    LeaseTiming,
    Leave,
    Local,
    Release,
    Renew,
    Take,
    View,
    decide,
    watch,
)
from cluster._store import MembershipError, MembershipStore

__all__ = ["Member", "SlotHost"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")
UNKNOWN_LOG_EVERY = 10.0  # seconds between two warnings while requests keep failing
NUDGE_GAP = 0.1  # seconds from the start of one look to a look made for a nudge, at least


class SlotHost(Protocol):
    """What a broker does when it gains or loses slots."""

    async def load(self, slot: int, epoch: int) -> None:
        """Start serving ``slot``, taken at ``epoch``: load its topics and
        recover its coordinator from the store; write at ``epoch``."""
        ...

    async def unload(self, slot: int) -> None:
        """Stop taking commands on ``slot``, settle its writes (every commit
        that writes it has answered), drop it from memory."""
        ...

    async def drop_all(self, reason: str) -> None:
        """Drop everything held in memory and start again from the store."""
        ...


class _Unknown(Exception):
    """A request's outcome is unknown."""


class Member:
    """One broker's membership: see the module's docstring."""

    def __init__(
        self,
        store: MembershipStore,
        me: str,
        urls: str,
        host: SlotHost,
        lease: LeaseTiming | None = None,
        *,
        timeout: float | None = None,
        changed: Callable[[View, str], None] | None = None,
    ) -> None:
        """``changed(view, what)``: called (it must not block) after a look
        that joined, released slots or left, with the view that look read
        and what it did (``"joined"``, ``"released N slots"``, ``"left"``)."""
        self.store = store
        self.me = me
        self.urls = urls
        self.host = host
        self.lease = lease or LeaseTiming()
        self.timeout = timeout or self.lease.renew_every / 2
        self._held: dict[int, int] = {}
        self._loading: dict[int, asyncio.Task[None]] = {}
        self._draining = False
        self._store_failed = False
        self._deadline = float("-inf")  # local time until which the lease surely holds
        self._wake = asyncio.Event()
        self._urgent = asyncio.Event()  # (`store_failed`, `stop`: no nudge's gap delays them)
        self._lock = asyncio.Lock()
        self._stopped = False
        self._unknown = False  # the last look had a request with an unknown outcome
        self._watch: float | None = None  # local time of an expiry to look at (`watch`)
        self._failures = 0  # requests failed in a row (their outcome unknown)
        self._warned = float("-inf")  # local time of the last warning about them
        # Joins and renewals answered, and the local time of the last one (for metrics).
        self.renewals = 0
        self.renewed_at: float | None = None
        # Slots taken from another broker (its lease had run out), for metrics.
        self.failovers = 0
        self._view: View | None = None  # the last look's snapshot
        self._changed = changed
        self._nudged = False  # a nudge came since the last look began
        self.nudges = 0  # nudges received (`nudge`), for metrics

    @property
    def held(self) -> Mapping[int, int]:
        """The slots taken and not yet released or dropped: slot -> epoch."""
        return MappingProxyType(self._held)

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def draining(self) -> bool:
        """Handing every slot over to leave (SIGTERM)."""
        return self._draining

    def store_failed(self) -> None:
        """The store refused a commit (fenced) or lost one's outcome: the next
        look (at once) drops everything."""
        self._store_failed = True
        self._wake.set()
        self._urgent.set()

    def nudge(self) -> None:
        """Another broker changed the tables (it joined, released slots or
        left): look again now rather than at the next interval.

        Coalesced and rate-limited: however many nudges come, they wake
        the loop for one look, which starts at least `NUDGE_GAP` (0.1 s)
        after the start of the look before it; so nudges alone never make
        this broker read the tables more than ten times a second. A nudge
        that comes while a look runs gets one more look after it (that
        look may have read the tables before the change)."""
        self.nudges += 1
        self._nudged = True
        self._wake.set()

    async def run(self) -> None:
        """Look every ``renew_every`` seconds until drained or stopped."""
        loop = asyncio.get_running_loop()
        try:
            while not self._stopped:
                started = loop.time()
                # (What woke the loop so far is answered by this look: only a
                # nudge that comes while it runs makes one more.)
                self._nudged = False
                self._wake.clear()
                self._urgent.clear()
                done = await self.tick() is not None and not self._unknown
                until = started + (self.lease.renew_every if done else self.lease.renew_every / 6)
                if self._watch is not None:
                    until = min(until, self._watch)
                if self._held:
                    until = min(until, self._deadline)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(0.0, until - loop.time())):
                        await self._wake.wait()
                self._wake.clear()
                if self._nudged:
                    # (A look for a nudge waits out NUDGE_GAP from the last
                    # one's start; nudges meanwhile: the same look. Never
                    # past the lease's deadline, nor for a store failure.)
                    gap = started + NUDGE_GAP - loop.time()
                    if self._held:
                        gap = min(gap, self._deadline - loop.time())
                    if gap > 0 and not self._urgent.is_set():
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(gap):
                                await self._urgent.wait()
                    self._wake.clear()
        finally:
            for task in self._loading.values():
                task.cancel()

    async def loads_done(self) -> None:
        """Return once every slot load started so far has ended."""
        while self._loading:
            await asyncio.gather(*self._loading.values(), return_exceptions=True)

    def stop(self) -> None:
        """End `run` after its current look (without handing anything over)."""
        self._stopped = True
        self._wake.set()
        self._urgent.set()

    async def drain(self, attempts: int = 5) -> bool:
        """SIGTERM: hand every slot over at once and leave; True once the
        store confirmed it (tried ``attempts`` times)."""
        self._draining = True
        try:
            for _ in range(attempts):
                if await self.tick() == ():
                    return True
            return False
        finally:
            self.stop()

    async def tick(self) -> tuple[Action, ...] | None:
        """One look: read, decide, act. Returns the actions decided (None:
        the read's answer did not come)."""
        async with self._lock:
            loop = asyncio.get_running_loop()
            if self._held and loop.time() >= self._deadline:
                await self._drop("the lease expired with no renewal answered")
            try:
                view = await self._call(self.store.read())
            except _Unknown:
                return None
            self._view = view
            expiry = watch(view, self.me, self.lease)
            # (The database's clock read `view.now` a little before now.)
            self._watch = None if expiry is None else loop.time() + expiry - view.now + 0.001
            local = Local(self.me, dict(self._held), self._draining, self._store_failed)
            actions = decide(view, local, self.lease)
            self._unknown = False
            try:
                await self._apply(actions)
            except _Unknown:
                self._unknown = True
            return actions

    async def _apply(self, actions: tuple[Action, ...]) -> None:
        loop = asyncio.get_running_loop()
        releases: dict[int, int] = {}
        takes: dict[int, int] = {}
        for action in actions:
            if isinstance(action, DropAll):
                await self._drop(action.reason)
            elif isinstance(action, Join):
                sent = loop.time()
                await self._call(self.store.join(self.me, self.urls, self.lease.ttl))
                self._deadline = sent + self.lease.ttl
                self._renewed()
                self._tell("joined")
            elif isinstance(action, Renew):
                sent = loop.time()
                if await self._call(self.store.renew(self.me, self.lease.ttl)) is None:
                    await self._drop("lease lost")
                    return  # the next look joins again
                self._deadline = sent + self.lease.ttl
                self._renewed()
            elif isinstance(action, Leave):
                for slot in sorted(self._held):
                    await self._unload(slot)
                await self._call(self.store.leave(self.me))
                self._tell("left")
            elif isinstance(action, Release):
                releases[action.slot] = action.epoch
            elif isinstance(action, Take):
                takes[action.slot] = action.epoch
        if releases:
            for slot in sorted(releases):
                if slot in self._held:
                    await self._unload(slot)
            await self._call(self.store.release(self.me, releases))
            self._tell(f"released {len(releases)} slots")
        if takes:
            won = await self._call(self.store.take(self.me, takes))
            self._held.update(won)
            if self._view is not None:
                rows = self._view.slots
                self.failovers += sum(rows[k].owner not in (None, self.me) for k in won)
            for slot, epoch in sorted(won.items()):
                task = asyncio.create_task(self._load(slot, epoch))
                self._loading[slot] = task

    def _tell(self, what: str) -> None:
        """This look changed the tables so that the others have something
        to do: ``changed`` (errors logged, never raised: a nudge is best
        effort)."""
        if self._changed is None or self._view is None:
            return
        try:
            self._changed(self._view, what)
        except Exception:
            log.exception("%s: nudging the other brokers failed", self.me)

    def _renewed(self) -> None:
        self.renewals += 1
        self.renewed_at = asyncio.get_running_loop().time()

    async def _load(self, slot: int, epoch: int) -> None:
        try:
            await self.host.load(slot, epoch)
        except Exception:
            # A slot that cannot be loaded is as a store that failed.
            log.exception("%s: loading slot %d failed", self.me, slot)
            self.store_failed()
        finally:
            if self._loading.get(slot) is asyncio.current_task():
                del self._loading[slot]

    async def _unload(self, slot: int) -> None:
        loading = self._loading.pop(slot, None)
        if loading is not None:
            loading.cancel()
            await asyncio.gather(loading, return_exceptions=True)
        await self.host.unload(slot)
        del self._held[slot]

    async def _drop(self, reason: str) -> None:
        log.warning("%s drops every slot it holds (%d): %s", self.me, len(self._held), reason)
        loading, self._loading = self._loading, {}
        for task in loading.values():
            task.cancel()
        await asyncio.gather(*loading.values(), return_exceptions=True)
        await self.host.drop_all(reason)
        self._held.clear()
        self._store_failed = False

    async def _call(self, request: Awaitable[_T]) -> _T:
        timeout = self.timeout
        if self._held:  # never wait past the lease: the next look drops then
            timeout = min(timeout, max(0.0, self._deadline - asyncio.get_running_loop().time()))
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                answer = await request
        except (MembershipError, TimeoutError, OSError) as exc:
            # (While the database is unreachable a look fails every sixth of
            # an interval: the first failure of a run is a warning, then one
            # every `UNKNOWN_LOG_EVERY` seconds with the count.)
            self._failures += 1
            if self._failures == 1 or loop.time() - self._warned >= UNKNOWN_LOG_EVERY:
                self._warned = loop.time()
                log.warning(
                    "%s: a request's outcome is unknown (%d in a row): %r",
                    self.me,
                    self._failures,
                    exc,
                )
            else:
                log.debug("%s: a request's outcome is unknown: %r", self.me, exc)
            raise _Unknown from exc
        if self._failures:
            log.warning(
                "%s: the cluster tables answer again (after %d requests failed)",
                self.me,
                self._failures,
            )
            self._failures = 0
        return answer
