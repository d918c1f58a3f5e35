"""A discrete-event simulation of a cluster: 100+ brokers running the real
membership driver and ownership core (`cluster.Member`, `cluster.decide`)
over the model store (`cluster.ModelStore`), on a virtual clock.

    python -m bench.clustersim                       # 120 brokers, 1024 slots, ttl 2, 5, 10 s
    python -m bench.clustersim --brokers 30 --slots 128 --ttl 2 --events 12 --storm 6

Each broker is a `Member` with a host that loads a slot (a random time, as
topics load and a coordinator recovers), unloads it (settling the commit in
flight) and drops everything, and a writer that group-commits every loaded
slot a few times a second through the model's fence. Requests cross a
network with jittered delays and occasional spikes, and some answers are
lost (the request happened; the driver does not know). One run per ttl:

1. cold start: every broker starts within two seconds;
2. quiet: only renewals and jitter (nothing may move);
3. events, one at a time, each followed by a settled cluster: joins of new
   brokers, SIGKILL-like deaths, restarts of dead brokers under their old
   id, SIGSTOP-like pauses shorter and longer than the lease, SIGTERM-like
   drains; a paused broker, woken, first tries the group commit it had in
   flight, with the epochs it held;
4. storm: the same events at random, overlapping, then a settle.

The clock is virtual and every random draw comes from ``--seed``: a run is
the same every time, whatever the machine's load. It prints and records
(bench/results/clustersim.md) the balance over time
(max/min slots per live broker), failover times (SIGKILL to every slot of
the dead broker owned again, and loaded), drain and pause figures, slots
moved per join against the joiner's share, and it fails (exit status 1)
unless: no slot ever had two writers (every commit the store accepted was
by the slot's owner at its current epoch: `cluster.check_history`), no
woken broker wrote to a slot it had lost, and nothing moved while nothing
happened.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import math
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from bench import _virtualtime
from bench._results import recorded
from cluster import (
    EventKind,
    LeaseTiming,
    Member,
    ModelConnection,
    ModelStore,
    SlotRow,
    Violation,
    check_history,
    placement,
    quotas,
    score,
)

_T = TypeVar("_T")


@dataclass
class Params:
    brokers: int = 120
    slots: int = 1024
    ttl: float = 5.0
    seed: int = 1
    events: int = 40  # one at a time, each settled
    storm: int = 20  # overlapping
    storm_every: float = 1.5  # seconds between storm events (mean)
    quiet: float = 60.0  # seconds of only renewals and jitter
    delay_ms: float = 1.0  # one-way network delay (median)
    spike: float = 0.01  # chance a request or answer is delayed by up to spike_ms
    spike_ms: float = 400.0
    lost: float = 0.002  # chance an answer never comes (the request did happen)
    load: tuple[float, float] = (0.05, 0.5)  # seconds to load a slot (uniform)
    commit_every: float = 0.25  # each broker's group commit interval (mean)
    settle_timeout: float = 120.0
    fence: bool = True  # False: a store without the commit fence (two writers appear)


@dataclass
class Fault:
    """One event and what it concerned."""

    time: float
    kind: str  # join, kill, restart, pause, drain
    broker: str
    slots: dict[int, int] = field(default_factory=dict)  # the victim's rows then
    duration: float = 0.0  # pause
    storm: bool = False
    live: int = 0  # live brokers just before
    settled: float | None = None  # when the cluster was settled again (sequential events)
    after: int = 0  # the slots the broker owned then


class Net:
    """One broker's network: a `cluster.Network` for its `ModelConnection`.

    A request is sent when the broker runs (a paused broker sends nothing),
    reaches the store after a delay, runs there at once (even if the broker
    has died meanwhile), and its answer comes back after another delay, or
    never (lost); an answer that arrives while the broker is paused is
    handed over when it wakes, and one for a dead broker never."""

    def __init__(self, sim: Sim) -> None:
        self.sim = sim
        self.running = asyncio.Event()
        self.running.set()
        self.dead = False
        self.waiting: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []

    def delay(self) -> float:
        p = self.sim.p
        rng = self.sim.rng
        d = p.delay_ms / 1000 * rng.lognormvariate(0, 0.5)
        if rng.random() < p.spike:
            d += rng.uniform(0, p.spike_ms / 1000)
        return d

    async def __call__(self, step: Callable[[], _T]) -> _T:
        await self.running.wait()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[_T] = loop.create_future()
        loop.call_later(self.delay(), self._arrive, step, answer)
        return await answer

    def _arrive(self, step: Callable[[], Any], answer: asyncio.Future[Any]) -> None:
        error: BaseException | None = None
        result = None
        try:
            result = step()
        except Exception as exc:
            error = exc
        if self.sim.rng.random() < self.sim.p.lost:
            self.sim.lost_answers += 1
            return
        asyncio.get_running_loop().call_later(self.delay(), self._deliver, answer, result, error)

    def _deliver(
        self, answer: asyncio.Future[Any], result: Any, error: BaseException | None
    ) -> None:
        if self.dead or answer.done():
            return
        if not self.running.is_set():
            self.waiting.append((answer, result, error))
        elif error is not None:
            answer.set_exception(error)
        else:
            answer.set_result(result)

    def wake(self) -> None:
        self.running.set()
        waiting, self.waiting = self.waiting, []
        for answer, result, error in waiting:
            self._deliver(answer, result, error)


class SimBroker:
    """A broker: the real driver, a host that loads and unloads slots, a writer."""

    def __init__(self, sim: Sim, name: str) -> None:
        self.sim = sim
        self.name = name
        self.net = Net(sim)
        self.conn = ModelConnection(sim.store, self.net)
        lease = LeaseTiming(sim.p.ttl)
        self.member = Member(self.conn, name, f"http://{name}:6650", self, lease)
        self.loaded: dict[int, int] = {}
        self.commit_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task[Any]] = []
        self.paused_with: dict[int, int] | None = None
        self.generation = 0  # drops so far: a commit of an earlier store fails only that store
        self.paused_generation = 0

    def start(self) -> None:
        self.tasks = [
            asyncio.create_task(self.member.run()),
            asyncio.create_task(self.writer()),
        ]

    def kill(self) -> None:
        self.net.dead = True
        for task in self.tasks:
            task.cancel()

    # SlotHost

    async def load(self, slot: int, epoch: int) -> None:
        await asyncio.sleep(self.sim.rng.uniform(*self.sim.p.load))
        self.loaded[slot] = epoch
        self.sim.served.setdefault(slot, []).append((asyncio.get_running_loop().time(), epoch))

    async def unload(self, slot: int) -> None:
        self.loaded.pop(slot, None)
        async with self.commit_lock:  # settle the commit in flight
            pass

    async def drop_all(self, reason: str) -> None:
        # Start again from the store: the failed store is closed, and what it
        # still had in flight can fail it but not the new one.
        self.generation += 1
        self.loaded.clear()
        self.sim.drops[reason.split(":")[0].split(" held at")[0]] += 1

    # the writer: group commits of every loaded slot, through the fence

    async def writer(self) -> None:
        p = self.sim.p
        while True:
            await asyncio.sleep(p.commit_every * self.sim.rng.uniform(0.5, 1.5))
            if self.loaded:
                await self.commit(dict(self.loaded))

    async def commit(self, epochs: dict[int, int]) -> bool:
        generation = self.generation
        async with self.commit_lock:
            try:
                async with asyncio.timeout(self.member.timeout):
                    ok = await self.conn.commit(self.name, epochs)
            except TimeoutError:
                ok = False  # unknown outcome: the store failed all the same
        if not ok and generation == self.generation:
            self.member.store_failed()
        return ok


class Sim:
    def __init__(self, p: Params) -> None:
        self.p = p
        self.rng = random.Random(p.seed)
        self.store = ModelStore(p.slots, self.clock, fence=p.fence)
        self.brokers: dict[str, SimBroker] = {}  # running (or paused) brokers
        self.dead: list[str] = []  # killed, may be restarted
        self.next_id = 0
        self.served: dict[int, list[tuple[float, int]]] = {}  # slot -> (time, epoch) loads
        self.faults: list[Fault] = []
        self.samples: list[tuple[float, int, int, int, int, int]] = []
        self.drops: Counter[str] = Counter()
        self.lost_answers = 0
        self.woken_writes: list[tuple[str, int, int]] = []  # (broker, slots lost, refused?)
        self.pauses_until = 0.0

    def clock(self) -> float:
        return asyncio.get_running_loop().time()

    # -- faults ----------------------------------------------------------------

    def new_name(self) -> str:
        self.next_id += 1
        return f"b{self.next_id:04d}"

    def owned_by(self, name: str) -> dict[int, int]:
        return {k: r.epoch for k, r in enumerate(self.store.slots) if r.owner == name}

    def join(self, name: str | None = None, storm: bool = False) -> Fault:
        name = name or self.new_name()
        kind = "restart" if name in self.dead else "join"
        if name in self.dead:
            self.dead.remove(name)
        broker = SimBroker(self, name)
        self.brokers[name] = broker
        broker.start()
        return self.note(Fault(self.clock(), kind, name, storm=storm))

    def kill(self, name: str, storm: bool = False) -> Fault:
        fault = self.note(Fault(self.clock(), "kill", name, self.owned_by(name), storm=storm))
        self.brokers.pop(name).kill()
        self.dead.append(name)
        return fault

    def pause(self, name: str, duration: float, storm: bool = False) -> Fault:
        broker = self.brokers[name]
        fault = Fault(self.clock(), "pause", name, self.owned_by(name), duration, storm)
        broker.net.running.clear()
        broker.paused_with = dict(broker.loaded)
        broker.paused_generation = broker.generation
        asyncio.get_running_loop().call_later(duration, self.wake, broker)
        self.pauses_until = max(self.pauses_until, self.clock() + duration)
        return self.note(fault)

    def wake(self, broker: SimBroker) -> None:
        held = broker.paused_with or {}
        broker.paused_with = None
        if broker.net.dead:
            return
        if held:
            # The group commit it had in flight when it stopped goes first.
            broker.tasks.append(asyncio.create_task(self.woken_commit(broker, held)))
        broker.net.wake()

    async def woken_commit(self, broker: SimBroker, held: dict[int, int]) -> None:
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[bool] = loop.create_future()
        # Sent before anything else the broker does now (no wait for `running`).
        loop.call_later(broker.net.delay(), self._woken_arrive, broker, held, answer)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(broker.member.timeout):
                if not await answer and broker.generation == broker.paused_generation:
                    broker.member.store_failed()

    def _woken_arrive(
        self, broker: SimBroker, held: dict[int, int], answer: asyncio.Future[bool]
    ) -> None:
        # The slots it lost: taken (or freed) since it took them.
        lost = sum(1 for k, e in held.items() if self.store.slots[k] != SlotRow(broker.name, e))
        ok = self.store.commit_now(broker.name, held)
        self.woken_writes.append((broker.name, lost, int(not ok)))
        if not answer.done():
            answer.set_result(ok)

    async def drain(self, name: str, storm: bool = False) -> Fault:
        fault = self.note(Fault(self.clock(), "drain", name, self.owned_by(name), storm=storm))
        broker = self.brokers.pop(name)
        broker.tasks[1].cancel()  # the writer: nothing new is taken on
        await broker.member.drain()
        broker.kill()
        return fault

    def note(self, fault: Fault) -> Fault:
        fault.live = len(self.live())
        self.faults.append(fault)
        return fault

    # -- observation ---------------------------------------------------------------

    def live(self) -> list[str]:
        now = self.clock()
        return [b for b, (_, until) in self.store.brokers.items() if until > now]

    def sample(self) -> None:
        live = set(self.live())
        counts = Counter(r.owner for r in self.store.slots if r.owner in live)
        unowned = sum(1 for r in self.store.slots if r.owner not in live)
        unserved = 0
        for k, r in enumerate(self.store.slots):
            b = self.brokers.get(r.owner or "")
            if b is None or b.loaded.get(k) != r.epoch or not b.net.running.is_set():
                unserved += 1
        per = [counts[b] for b in live] or [0]
        self.samples.append((self.clock(), len(live), min(per), max(per), unowned, unserved))

    async def sampler(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(1.0)

    def settled(self) -> bool:
        live = self.live()
        if sorted(live) != sorted(self.brokers) or not live:
            return False  # a dead broker's lease has yet to expire, or one is not in yet
        if any(not b.net.running.is_set() for b in self.brokers.values()):
            return False
        counts = Counter(r.owner for r in self.store.slots)
        if counts != Counter(quotas(live, self.p.slots)) and (
            max(counts[b] for b in live) - min(counts[b] for b in live) > 1
        ):
            return False
        for k, r in enumerate(self.store.slots):
            b = self.brokers.get(r.owner or "")
            if b is None or b.loaded.get(k) != r.epoch or b.member.held.get(k) != r.epoch:
                return False
        return True

    async def settle(self) -> float:
        start = self.clock()
        while not self.settled():
            if self.clock() - start > self.p.settle_timeout:
                raise SystemExit(f"not settled {self.p.settle_timeout:.0f} s after t={start:.1f}")
            await asyncio.sleep(0.1)
        return self.clock()

    # -- the run -----------------------------------------------------------------------

    def pick_event(self) -> str:
        n = len(self.brokers)
        low, high = 0.85 * self.p.brokers, 1.15 * self.p.brokers
        kinds = ["pause_short", "pause_long"]
        if n < high:
            kinds += ["join", "join"] + (["restart", "restart"] if self.dead else [])
        if n > low:
            kinds += ["kill", "kill", "drain"]
        return self.rng.choice(kinds)

    async def event(self, kind: str, storm: bool = False) -> Fault:
        ttl = self.p.ttl
        victim = self.rng.choice(sorted(self.brokers)) if self.brokers else ""
        if storm:  # only brokers not already paused
            running = sorted(b for b, x in self.brokers.items() if x.net.running.is_set())
            victim = self.rng.choice(running) if running else ""
        if kind == "join" or not victim:
            return self.join(storm=storm)
        if kind == "restart":
            return self.join(self.rng.choice(self.dead), storm=storm)
        if kind == "kill":
            return self.kill(victim, storm=storm)
        if kind == "drain":
            return await self.drain(victim, storm=storm)
        if kind == "pause_short":
            return self.pause(victim, self.rng.uniform(0.1, 0.6) * ttl, storm=storm)
        return self.pause(victim, self.rng.uniform(1.2, 2.5) * ttl, storm=storm)

    async def main(self) -> None:
        p = self.p
        sampler = asyncio.create_task(self.sampler())
        # 1. Cold start.
        for _ in range(p.brokers):
            self.join()
            await asyncio.sleep(self.rng.uniform(0, 2.0 / p.brokers))
        self.cold_start = (0.0, await self.settle())
        # 2. Quiet.
        self.quiet_from = self.clock()
        await asyncio.sleep(p.quiet)
        self.quiet_to = self.clock()
        # 3. One event at a time.
        for _ in range(p.events):
            fault = await self.event(self.pick_event())
            if fault.kind == "pause":
                await asyncio.sleep(fault.duration)
            fault.settled = await self.settle()
            fault.after = len(self.owned_by(fault.broker))
            await asyncio.sleep(self.rng.uniform(1.0, 5.0))
        # 4. Storm.
        self.storm_from = self.clock()
        tasks = []
        for _ in range(p.storm):
            await asyncio.sleep(self.rng.expovariate(1 / p.storm_every))
            tasks.append(asyncio.create_task(self.event(self.pick_event(), storm=True)))
        await asyncio.gather(*tasks)
        self.storm_to = self.clock()
        await asyncio.sleep(max(0.0, self.pauses_until - self.clock()))  # every pause is over
        self.storm_settled = await self.settle()
        sampler.cancel()
        self.sample()
        self.end = self.clock()


# -- placements compared -------------------------------------------------------------------


def rendezvous(live: list[str], slots: int) -> list[str]:
    """Plain rendezvous hashing: each slot to the broker scoring highest."""
    return [max(live, key=lambda b: (score(k, b), b)) for k in range(slots)]


def bounded(live: list[str], slots: int) -> list[str]:
    """Rendezvous hashing with bounded loads: slots in order, each to the
    highest-scoring broker that has fewer than ceil(S/N)."""
    cap = -(-slots // len(live))
    load: Counter[str] = Counter()
    out = []
    for k in range(slots):
        for b in sorted(live, key=lambda b: (score(k, b), b), reverse=True):
            if load[b] < cap:
                load[b] += 1
                out.append(b)
                break
    return out


def compare_placements(slot_counts: list[int], sizes: list[int], joins: int = 3) -> list[str]:
    """Balance and slots moved per join and per death, for plain rendezvous
    hashing, rendezvous with bounded loads, and the sticky fair share of
    `cluster.placement` (grown to N by joins, as a cluster is)."""
    lines = [
        "placement: balance at N brokers (max/min slots per broker, max/mean) and slots moved",
        "when one broker joins or dies (mean of 3 each; the joiner's share is S/(N+1)):",
        f"  {'S':>5} {'N':>4}  {'placement':<22} {'max/min':>9} {'max/mean':>8}"
        f" {'moved/join':>10} {'moved/death':>11} {'S/(N+1)':>8}",
    ]
    for slots in slot_counts:
        for n in sizes:
            live = [f"b{i:04d}" for i in range(n)]
            newcomers = [[*live, f"new{j}"] for j in range(joins)]
            rng = random.Random(n)
            deaths = [[b for b in live if b != victim] for victim in rng.sample(live, joins)]

            def moved(a: list[str], b: list[str]) -> int:
                return sum(1 for x, y in zip(a, b, strict=True) if x != y)

            rows: list[tuple[str, list[str], float, float]] = []
            for name, f in (("rendezvous", rendezvous), ("rendezvous, bounded", bounded)):
                at_n = f(live, slots)
                mj = statistics.mean(moved(at_n, f(x, slots)) for x in newcomers)
                md = statistics.mean(moved(at_n, f(x, slots)) for x in deaths)
                rows.append((name, at_n, mj, md))
            owners: list[str | None] = [None] * slots
            for i in range(1, n + 1):
                owners = list(placement(live[:i], owners))
            at_n = [o or "" for o in owners]
            mj = statistics.mean(moved(at_n, placement(x, owners)) for x in newcomers)
            md = statistics.mean(moved(at_n, placement(x, owners)) for x in deaths)
            rows.append(("sticky fair share", at_n, mj, md))
            for name, at_n, mj, md in rows:
                count = Counter(at_n)
                per = [count[b] for b in live]
                lines.append(
                    f"  {slots:>5} {n:>4}  {name:<22} {max(per):>4}/{min(per):<4}"
                    f" {max(per) / (slots / n):>8.2f} {mj:>10.1f} {md:>11.1f}"
                    f" {slots / (n + 1):>8.1f}"
                )
    return lines


# -- the figures -----------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    values = sorted(values)
    return values[min(len(values) - 1, math.ceil(q / 100 * len(values)) - 1)]


@dataclass
class Report:
    p: Params
    lines: list[str]
    violations: list[Violation]
    ok: bool
    failover: list[float]  # SIGKILL -> every slot owned again (s)
    failover_served: list[float]
    moves_extra: int
    quiet_moves: int


def takes_after(
    history: list[Any], t0: float, slots: dict[int, int]
) -> dict[int, tuple[float, int]]:
    """The first take of each of ``slots`` after ``t0``: slot -> (time, epoch)."""
    out: dict[int, tuple[float, int]] = {}
    for ev in history:
        if ev.time < t0 or ev.kind is not EventKind.TAKE:
            continue
        for k, e in ev.slots:
            if k in slots and k not in out and e > slots[k]:
                out[k] = (ev.time, e)
    return out


def first_load(sim: Sim, slot: int, epoch: int) -> float:
    """When ``slot`` was first loaded at ``epoch`` or later (its taker may
    have dropped it and taken it again before it finished loading)."""
    return min((t for t, e in sim.served.get(slot, []) if e >= epoch), default=math.inf)


def moves_between(history: list[Any], t0: float, t1: float) -> int:
    """Slots taken by a broker other than the one that took them before."""
    last: dict[int, str] = {}
    moved = 0
    for ev in history:
        if ev.kind is not EventKind.TAKE:
            continue
        for k, _ in ev.slots:
            if t0 <= ev.time < t1 and k in last and last[k] != ev.broker:
                moved += 1
            last[k] = ev.broker
    return moved


def analyse(sim: Sim, wall: float) -> Report:
    p = sim.p
    hist = sim.store.history
    lines: list[str] = []
    out = lines.append
    violations = check_history(hist, p.slots)
    accepted = sum(1 for e in hist if e.kind is EventKind.COMMIT)
    fenced = sum(1 for e in hist if e.kind is EventKind.FENCED)
    out(
        f"ttl {p.ttl:g} s (renewed every {p.ttl / 3:.2f} s), {p.brokers} brokers, {p.slots} slots,"
        f" seed {p.seed}: {sim.end:.0f} s simulated in {wall:.0f} s"
    )
    # Balance over time.
    settled_samples = [s for s in sim.samples if s[0] >= sim.cold_start[1]]
    spread = [s[3] - s[2] for s in settled_samples]
    out(
        f"  balance (max-min slots per live broker, sampled each second after the cold start):"
        f" max-min <= 1 in {sum(1 for x in spread if x <= 1) / max(1, len(spread)):.0%}"
        f" of samples; worst max {max(s[3] for s in settled_samples)},"
        f" worst min {min(s[2] for s in settled_samples)};"
        f" slot-seconds unowned {sum(s[4] for s in settled_samples)},"
        f" not served {sum(s[5] for s in settled_samples)}"
    )
    out(f"  cold start: {p.brokers} brokers started in 2 s, settled at {sim.cold_start[1]:.1f} s;"
        f" slots moved {moves_between(hist, 0, sim.cold_start[1] + 0.001)}"
        f" (then each holds {p.slots // p.brokers}-{-(-p.slots // p.brokers)})")  # fmt: skip
    quiet_moves = moves_between(hist, sim.quiet_from, sim.quiet_to)
    out(f"  quiet {p.quiet:.0f} s (renewals, jitter, spikes to {p.spike_ms:.0f} ms):"
        f" slots moved {quiet_moves}")  # fmt: skip
    # Events.
    seq = [f for f in sim.faults if f.time >= sim.quiet_to and not f.storm]
    by_kind: dict[str, list[Fault]] = {}
    for f in seq:
        by_kind.setdefault(f.kind, []).append(f)
    extra_total = 0
    failover: list[float] = []
    served: list[float] = []
    for f in seq:
        assert f.settled is not None
        moved = moves_between(hist, f.time, f.settled)
        if f.kind in ("join", "restart"):
            needed = f.after  # its share, from brokers over their new quota
        elif f.kind in ("kill", "drain"):
            needed = len(f.slots)
        else:  # a pause: the slots taken while it slept, and a share back
            lost = takes_after(hist, f.time, f.slots)
            needed = sum(1 for t, _ in lost.values() if t < f.time + f.duration) + f.after
        extra_total += max(0, moved - needed)
        if f.kind == "kill" and f.slots:
            taken = takes_after(hist, f.time, f.slots)
            if len(taken) == len(f.slots):
                failover.append(max(t for t, _ in taken.values()) - f.time)
                served.append(max(first_load(sim, k, e) for k, (_, e) in taken.items()) - f.time)
    out(f"  {len(seq)} events one at a time, each until settled:"
        f" {', '.join(f'{len(v)} {k}' for k, v in sorted(by_kind.items()))}")  # fmt: skip
    if failover:
        out(f"    SIGKILL -> every slot of the dead one owned again: p50 {pct(failover, 50):.2f} s,"
            f" max {max(failover):.2f} s; loaded again: p50 {pct(served, 50):.2f} s,"
            f" max {max(served):.2f} s  ({len(failover)} kills)")  # fmt: skip
    drains = [f for f in seq if f.kind == "drain" and f.slots]
    if drains:
        dt = []
        for f in drains:
            taken = takes_after(hist, f.time, f.slots)
            if len(taken) == len(f.slots):
                dt.append(max(t for t, _ in taken.values()) - f.time)
        out(f"    SIGTERM -> every slot owned by another broker: p50 {pct(dt, 50):.2f} s,"
            f" max {max(dt, default=math.nan):.2f} s ({len(dt)} drains)")  # fmt: skip
    joins = [f for f in seq if f.kind in ("join", "restart")]
    if joins:
        per_join = [moves_between(hist, f.time, f.settled or f.time) for f in joins]
        ideal = [p.slots / (f.live + 1) for f in joins]
        took = [(f.settled or f.time) - f.time for f in joins]
        out(f"    join or restart: slots moved per join mean {statistics.mean(per_join):.2f},"
            f" the joiner's share mean {statistics.mean(f.after for f in joins):.2f}"
            f" (S/(N+1) {statistics.mean(ideal):.2f}); settled in p50 {pct(took, 50):.2f} s,"
            f" max {max(took):.2f} s ({len(joins)} joins)")  # fmt: skip
    pauses = [f for f in seq if f.kind == "pause"]
    if pauses:
        short = [f for f in pauses if f.duration < p.ttl]
        long = [f for f in pauses if f.duration >= p.ttl]
        moved_short = sum(moves_between(hist, f.time, f.settled or f.time) for f in short)
        out(f"    pauses: {len(short)} shorter than the lease (slots moved {moved_short}),"
            f" {len(long)} longer")  # fmt: skip
    out(f"    slots moved beyond what the events needed: {extra_total}")
    # Storm.
    storm = [f for f in sim.faults if f.storm]
    kinds = ", ".join(f"{n} {k}" for k, n in sorted(Counter(f.kind for f in storm).items()))
    span = sim.storm_to - sim.storm_from
    out(f"  storm: {len(storm)} overlapping events ({kinds}) in {span:.0f} s; settled"
        f" {sim.storm_settled - max(sim.storm_to, sim.pauses_until):.1f} s after the last event"
        f" or the end of the last pause, whichever came later")  # fmt: skip
    # Safety.
    woken = [w for w in sim.woken_writes if w[1]]
    refused = sum(w[2] for w in woken)
    out(f"  safety: {accepted} group commits accepted, {fenced} refused by the fence;"
        f" slots with two writers: {len(violations)}")  # fmt: skip
    out(f"    woken brokers that had lost slots tried their in-flight commit {len(woken)} times:"
        f" refused {refused}, accepted {len(woken) - refused}")  # fmt: skip
    out(f"    drops: {dict(sorted(sim.drops.items()))}; answers lost {sim.lost_answers}")
    ok = not violations and refused == len(woken) and quiet_moves == 0
    return Report(p, lines, violations, ok, failover, served, extra_total, quiet_moves)


def simulate(p: Params) -> Report:
    # The drivers log every drop and unknown outcome: thousands here.
    logging.getLogger("cluster").setLevel(logging.ERROR)
    sim = Sim(p)
    started = time.perf_counter()
    _virtualtime.run(sim.main())
    return analyse(sim, time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.clustersim", description=__doc__)
    ap.add_argument("--brokers", type=int, default=Params.brokers)
    ap.add_argument("--slots", type=int, default=Params.slots)
    ap.add_argument("--ttl", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    ap.add_argument("--events", type=int, default=Params.events)
    ap.add_argument("--storm", type=int, default=Params.storm)
    ap.add_argument("--quiet", type=float, default=Params.quiet)
    ap.add_argument("--seed", type=int, default=Params.seed)
    ap.add_argument("--compare-slots", type=int, nargs="*", default=[1024, 4096])
    ap.add_argument("--compare-brokers", type=int, nargs="*", default=[10, 100, 200])
    args = ap.parse_args(argv)
    command = "python -m bench.clustersim " + " ".join(sys.argv[1:] if argv is None else argv)
    ok = True
    with recorded("clustersim", command.strip()):
        if args.compare_slots and args.compare_brokers:
            table = compare_placements(args.compare_slots, args.compare_brokers)
            print("\n".join(table), flush=True)
        for ttl in args.ttl:
            p = Params(
                brokers=args.brokers, slots=args.slots, ttl=ttl, seed=args.seed,
                events=args.events, storm=args.storm, quiet=args.quiet,
            )  # fmt: skip
            report = simulate(p)
            print("\n".join(report.lines), flush=True)
            for v in report.violations[:10]:
                print(f"    TWO WRITERS: {v}")
            ok &= report.ok
        print("all checks held" if ok else "A CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
