"""The membership driver (cluster.Member) over the model store, on a virtual
clock (bench._virtualtime): joining, handing over, draining, failing over,
dropping on a fenced store, lost answers, slow loads, a lease that runs out;
nudges (a drain and a join acted on at once, coalesced and rate-limited)."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest

from bench._virtualtime import Deadlock, run
from cluster import (
    EventKind,
    LeaseTiming,
    Member,
    MembershipError,
    ModelConnection,
    ModelStore,
    SlotRow,
    View,
    check_history,
)
from cluster._member import NUDGE_GAP

_T = TypeVar("_T")
LEASE = LeaseTiming(ttl=3.0)  # looks every second


def now() -> float:
    return asyncio.get_running_loop().time()


class Host:
    """Records what the driver asks of the broker."""

    def __init__(self, load_time: float = 0.05) -> None:
        self.load_time = load_time
        self.loaded: dict[int, int] = {}
        self.log: list[tuple[str, object]] = []

    async def load(self, slot: int, epoch: int) -> None:
        await asyncio.sleep(self.load_time)
        self.loaded[slot] = epoch
        self.log.append(("load", slot))

    async def unload(self, slot: int) -> None:
        self.loaded.pop(slot, None)
        self.log.append(("unload", slot))

    async def drop_all(self, reason: str) -> None:
        self.loaded.clear()
        self.log.append(("drop", reason))
        self.dropped_at = now()


class Net:
    """A network with a 1 ms delay each way that can lose answers."""

    def __init__(self) -> None:
        self.lose: Callable[[], bool] = lambda: False
        self.cut = False  # nothing gets through at all

    async def __call__(self, step: Callable[[], _T]) -> _T:
        await asyncio.sleep(0.001)
        if self.cut:
            await asyncio.Future()  # the answer never comes
        result = step()
        if self.lose():
            await asyncio.Future()
        await asyncio.sleep(0.001)
        return result


class Cluster:
    def __init__(self, slots: int) -> None:
        self.store = ModelStore(slots, now)
        self.members: dict[str, tuple[Member, Host, Net, asyncio.Task[None]]] = {}

    def start(self, name: str, host: Host | None = None, nudge: bool = False) -> Member:
        """``nudge``: the broker nudges the others of its view when its look
        changed the tables (1 ms later, as over a network)."""
        net = Net()
        host = host or Host()
        changed = self.nudge_others(name) if nudge else None
        member = Member(
            ModelConnection(self.store, net), name, f"http://{name}", host, LEASE, changed=changed
        )
        self.members[name] = (member, host, net, asyncio.create_task(member.run()))
        return member

    def nudge_others(self, me: str) -> Callable[[View, str], None]:
        def changed(view: View, what: str) -> None:
            for other in view.live():
                entry = self.members.get(other)
                if other != me and entry is not None:
                    asyncio.get_running_loop().call_later(0.001, entry[0].nudge)

        return changed

    def kill(self, name: str) -> None:
        self.members.pop(name)[3].cancel()

    def owners(self) -> list[str | None]:
        return [row.owner for row in self.store.slots]

    def host(self, name: str) -> Host:
        return self.members[name][1]

    async def until(self, condition: Callable[[], bool], within: float = 30.0) -> float:
        """Virtual seconds until ``condition`` holds (checked every 10 ms)."""
        start = now()
        while not condition():
            if now() - start > within:
                raise AssertionError(f"not within {within} s")
            await asyncio.sleep(0.01)
        return now() - start

    def served(self) -> bool:
        """Every slot owned and loaded at its epoch by its owner."""
        for k, row in enumerate(self.store.slots):
            entry = self.members.get(row.owner or "")
            if entry is None or entry[1].loaded.get(k) != row.epoch:
                return False
        return True


def simulate(main: Callable[[], Coroutine[Any, Any, _T]]) -> _T:
    return run(main())


def test_a_broker_takes_every_slot_then_hands_half_to_a_newcomer() -> None:
    async def main() -> None:
        c = Cluster(8)
        a = c.start("a")
        await c.until(c.served)
        assert c.owners() == ["a"] * 8 and dict(a.held) == {k: 1 for k in range(8)}
        c.start("b")
        took = await c.until(lambda: c.served() and c.owners().count("b") == 4)
        assert took < 2 * LEASE.renew_every + 0.5  # a releases at its look, b takes at its
        assert sorted(c.host("a").loaded) == sorted(a.held) and len(a.held) == 4
        assert [e for e in c.host("a").log if e[0] == "unload"] == [
            ("unload", k) for k in sorted(k for k, o in enumerate(c.owners()) if o == "b")
        ]
        await asyncio.sleep(10)  # and then nothing moves
        taken = [k for e in c.store.history if e.kind is EventKind.TAKE for k, _ in e.slots]
        assert len(taken) == 8 + 4
        assert check_history(c.store.history, 8) == []

    simulate(main)


def test_a_draining_broker_hands_everything_over_at_once() -> None:
    async def main() -> None:
        c = Cluster(8)
        c.start("a")
        await c.until(c.served)
        b = c.start("b")
        await c.until(lambda: c.served() and c.owners().count("b") == 4)
        started = now()
        assert await b.drain()
        assert "b" not in c.store.brokers and "b" not in c.owners()
        assert c.host("b").loaded == {} and not b.held
        c.members.pop("b")
        took = await c.until(lambda: c.served() and c.owners() == ["a"] * 8)
        assert now() - started < LEASE.ttl / 2  # no lease expiry waited for
        assert took <= LEASE.renew_every + 0.5

    simulate(main)


def test_nudged_brokers_take_a_drained_brokers_slots_and_balance_a_join_at_once() -> None:
    async def main() -> None:
        c = Cluster(8)
        a = c.start("a", nudge=True)
        await c.until(c.served)
        await asyncio.sleep(LEASE.renew_every / 2)  # (mid-interval: a look is far)
        c.start("b", nudge=True)
        # b joins and nudges a, which releases and nudges b, which takes (at
        # least NUDGE_GAP after the start of its join's look).
        took = await c.until(lambda: c.owners().count("b") == 4)
        assert took < 2 * NUDGE_GAP, took
        await c.until(c.served)
        await asyncio.sleep(LEASE.renew_every / 2)
        started = now()
        assert await c.members["b"][0].drain()
        c.members.pop("b")
        took = await c.until(lambda: c.owners() == ["a"] * 8)
        assert now() - started < 0.1, now() - started
        assert a.nudges == 2  # (b's join, b's leave; a's renewals nudge nobody)
        await c.until(c.served)
        assert check_history(c.store.history, 8) == []

    simulate(main)


def test_nudges_are_coalesced_and_rate_limited() -> None:
    async def main() -> None:
        c = Cluster(4)
        a = c.start("a")
        await c.until(c.served)
        reads: list[float] = []
        read = a.store.read

        async def counted() -> View:
            reads.append(now())
            return await read()

        a.store.read = counted  # type: ignore[method-assign]
        await asyncio.sleep(LEASE.renew_every / 2)
        a.nudge()
        await c.until(lambda: bool(reads))
        assert reads[0] - now() < 0.01  # one nudge: a look at once
        # A flood (one every millisecond for 2 s): a look every NUDGE_GAP at most.
        flood = now()
        for _ in range(2000):
            a.nudge()
            await asyncio.sleep(0.001)
        during = [t for t in reads if t >= flood]
        assert len(during) <= 2 / NUDGE_GAP + 1, len(during)
        assert all(y - x >= NUDGE_GAP - 1e-6 for x, y in itertools.pairwise(during))
        # Then back to the usual cadence: nudges leave no extra looks behind.
        end = now()
        await asyncio.sleep(3 * LEASE.renew_every)
        after = [t for t in reads if t > end + NUDGE_GAP]
        assert len(after) <= 3, after

    simulate(main)


def test_a_nudges_gap_does_not_delay_a_store_failure() -> None:
    async def main() -> None:
        c = Cluster(4)
        a = c.start("a")
        await c.until(c.served)
        await asyncio.sleep(LEASE.renew_every / 2)
        a.nudge()
        await asyncio.sleep(0.02)  # (the nudge's look has begun: the next waits NUDGE_GAP)
        a.nudge()
        await asyncio.sleep(0.01)
        failed = now()
        a.store_failed()
        await c.until(lambda: any(e[0] == "drop" for e in c.host("a").log))
        assert c.host("a").dropped_at - failed < NUDGE_GAP / 2

    simulate(main)


def test_a_dead_brokers_slots_are_taken_when_its_lease_expires() -> None:
    async def main() -> None:
        c = Cluster(8)
        c.start("a")
        await c.until(c.served)
        c.start("b")
        await c.until(lambda: c.served() and c.owners().count("b") == 4)
        await asyncio.sleep(0.5)
        lease_until = c.store.brokers["b"][1]
        c.kill("b")
        killed = now()
        await c.until(lambda: c.owners() == ["a"] * 8)
        # Taken right at the expiry (the driver watches a broker that missed a
        # renewal), not at a's next regular look after it.
        assert lease_until <= now() < lease_until + 0.1
        assert now() - killed <= LEASE.ttl
        await c.until(c.served)

    simulate(main)


def test_a_fenced_store_drops_everything_and_takes_its_slots_again() -> None:
    async def main() -> None:
        c = Cluster(4)
        a = c.start("a")
        await c.until(c.served)
        a.store_failed()
        await c.until(lambda: any(e[0] == "drop" for e in c.host("a").log))
        assert ("drop", "the store failed") in c.host("a").log
        await c.until(c.served)
        assert dict(a.held) == {k: 2 for k in range(4)}  # taken again: epoch + 1

    simulate(main)


def test_a_take_whose_answer_was_lost_is_taken_again() -> None:
    async def main() -> None:
        c = Cluster(4)
        a = c.start("a")
        net = c.members["a"][2]
        lost = []

        def lose_takes() -> bool:
            if any(e.kind is EventKind.TAKE for e in c.store.history) and not lost:
                lost.append(now())
                return True
            return False

        net.lose = lose_takes
        await c.until(c.served)
        assert lost  # the store gave the slots to a at epoch 1; a never heard
        assert dict(a.held) == {k: 2 for k in range(4)}
        assert c.store.slots == [SlotRow("a", 2)] * 4

    simulate(main)


def test_a_broker_cut_off_from_the_store_drops_everything_when_its_lease_runs_out() -> None:
    async def main() -> None:
        c = Cluster(4)
        a = c.start("a")
        await c.until(c.served)
        await asyncio.sleep(0.3)
        c.members["a"][2].cut = True
        cut = now()
        last_renewal = max(e.time for e in c.store.history if e.kind is not EventKind.COMMIT)
        await c.until(lambda: not a.held)
        # It stops serving no later than its lease ends (by its own clock, from the
        # last renewal it sent), before anyone may take its slots.
        assert ("drop", "the lease expired with no renewal answered") in c.host("a").log
        dropped = c.host("a").dropped_at
        assert last_renewal + LEASE.ttl - 0.01 <= dropped <= last_renewal + LEASE.ttl
        assert dropped - cut > LEASE.ttl - LEASE.renew_every - 0.01

    simulate(main)


def test_a_slow_load_does_not_hold_up_renewals_and_an_unload_cancels_it() -> None:
    async def main() -> None:
        c = Cluster(4)
        slow = Host(load_time=10 * LEASE.ttl)
        a = c.start("a", slow)
        await c.until(lambda: len(a.held) == 4)
        await asyncio.sleep(3 * LEASE.ttl)
        assert c.store.live("a") and not slow.loaded  # renewed all along, still loading
        c.start("b")
        await c.until(lambda: c.owners().count("b") == 2)
        assert len(a.held) == 2 and sum(1 for e in slow.log if e[0] == "unload") == 2
        await c.until(lambda: len(slow.loaded) == 2, within=15 * LEASE.ttl)
        assert set(slow.loaded) == set(a.held)  # the cancelled loads never finished

    simulate(main)


def test_unknown_outcomes_are_what_the_store_raises() -> None:
    async def main() -> None:
        c = Cluster(2)
        net_calls = []

        class Failing(Net):
            async def __call__(self, step: Callable[[], _T]) -> _T:
                net_calls.append(now())
                raise MembershipError("connection reset")

        member = Member(ModelConnection(c.store, Failing()), "a", "http://a", Host(), LEASE)
        assert await member.tick() is None  # the read failed: nothing decided
        assert c.store.history == []

    simulate(main)


def test_the_virtual_clock_refuses_to_wait_forever() -> None:
    async def main() -> None:
        await asyncio.Future()

    with pytest.raises(Deadlock):
        simulate(main)
