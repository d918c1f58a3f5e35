"""The driver: one broker's membership loop over a `MembershipStore`.

Every ``renew_every`` seconds (a third of the lease by default), or at once
when woken (`Member.store_failed`), the loop reads one snapshot of the
cluster tables, asks `decide` what to do, and does it:

- DropAll: the host drops everything it holds (as a restart would);
- Join / Renew: one statement each; a renewal refused (the lease had
  expired) drops everything, and the next look joins again;
- Release: the host unloads each slot (stops taking its commands, settles
  its writes), then one statement frees the rows still held at their epochs;
- Take: one statement takes the rows still at the epochs seen; the host
  loads each slot won (topics, coordinator recovery), all at once;
- Leave (draining): the host unloads every slot, then one transaction frees
  the rows and deletes the broker's row.

A request whose answer does not come within ``timeout`` (or that fails) has
an unknown outcome: the rest of that look is skipped and the next look
re-reads. Independently of any answer, a broker whose last renewal was sent
more than ``ttl`` ago (its own clock) drops everything: by then its lease
has expired in the database and other brokers may take its slots, so it
must stop serving what it holds in memory even if the database is
unreachable. Writes need no such care: the store's fence refuses them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Mapping
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
    decide,
)
from cluster._store import MembershipError, MembershipStore

__all__ = ["Member", "SlotHost"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")


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
    ) -> None:
        self.store = store
        self.me = me
        self.urls = urls
        self.host = host
        self.lease = lease or LeaseTiming()
        self.timeout = timeout or self.lease.renew_every
        self._held: dict[int, int] = {}
        self._draining = False
        self._store_failed = False
        self._deadline = float("-inf")  # local time until which the lease surely holds
        self._wake = asyncio.Event()
        self._lock = asyncio.Lock()
        self._stopped = False

    @property
    def held(self) -> Mapping[int, int]:
        """The slots taken and not yet released or dropped: slot -> epoch."""
        return MappingProxyType(self._held)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def store_failed(self) -> None:
        """The store refused a commit (fenced) or lost one's outcome: the next
        look (at once) drops everything."""
        self._store_failed = True
        self._wake.set()

    async def run(self) -> None:
        """Look every ``renew_every`` seconds until drained or stopped."""
        while not self._stopped:
            await self.tick()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.lease.renew_every):
                    await self._wake.wait()
            self._wake.clear()

    def stop(self) -> None:
        """End `run` after its current look (without handing anything over)."""
        self._stopped = True
        self._wake.set()

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
            local = Local(self.me, dict(self._held), self._draining, self._store_failed)
            actions = decide(view, local, self.lease)
            try:
                await self._apply(actions)
            except _Unknown:
                pass
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
            elif isinstance(action, Renew):
                sent = loop.time()
                if await self._call(self.store.renew(self.me, self.lease.ttl)) is None:
                    await self._drop("lease lost")
                    return  # the next look joins again
                self._deadline = sent + self.lease.ttl
            elif isinstance(action, Leave):
                for slot in sorted(self._held):
                    await self.host.unload(slot)
                    del self._held[slot]
                await self._call(self.store.leave(self.me))
            elif isinstance(action, Release):
                releases[action.slot] = action.epoch
            elif isinstance(action, Take):
                takes[action.slot] = action.epoch
        if releases:
            for slot in sorted(releases):
                if slot in self._held:
                    await self.host.unload(slot)
                    del self._held[slot]
            await self._call(self.store.release(self.me, releases))
        if takes:
            won = await self._call(self.store.take(self.me, takes))
            self._held.update(won)
            try:
                await asyncio.gather(*(self.host.load(k, e) for k, e in sorted(won.items())))
            except Exception:
                # A slot that cannot be loaded is as a store that failed.
                log.exception("loading slots %s failed", sorted(won))
                self.store_failed()

    async def _drop(self, reason: str) -> None:
        log.warning("%s drops every slot it holds (%d): %s", self.me, len(self._held), reason)
        await self.host.drop_all(reason)
        self._held.clear()
        self._store_failed = False

    async def _call(self, request: Awaitable[_T]) -> _T:
        try:
            async with asyncio.timeout(self.timeout):
                return await request
        except (MembershipError, TimeoutError, OSError) as exc:
            log.warning("%s: a request's outcome is unknown: %r", self.me, exc)
            raise _Unknown from exc
