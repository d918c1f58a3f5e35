"""The cluster simulation (bench.clustersim): a short run in CI, and the
fence shown to be what keeps a woken paused broker from writing."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import _virtualtime
from bench.clustersim import Params, Sim, compare_placements
from cluster import check_history

ROOT = Path(__file__).resolve().parent.parent


def test_a_short_simulation_holds_every_check() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.clustersim", "--brokers", "30", "--slots", "128",
         "--ttl", "2", "--events", "12", "--storm", "6", "--quiet", "10",
         "--compare-slots", "64", "--compare-brokers", "5"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "all checks held" in out.stdout
    assert "slots with two writers: 0" in out.stdout
    assert "quiet 10 s (renewals, jitter, spikes to 400 ms): slots moved 0" in out.stdout
    assert "slots moved beyond what the events needed: 0" in out.stdout
    assert "sticky fair share" in out.stdout
    recorded = (Path(os.environ["TXNBUF_BENCH_RESULTS"]) / "clustersim.md").read_text()
    assert "python -m bench.clustersim --brokers 30" in recorded and " cores; Python " in recorded


def pause_past_the_lease(fence: bool) -> tuple[Sim, str]:
    """Eight brokers settle; one is paused for 2.5 leases (its slots move),
    wakes, sends the group commit it had in flight, and the cluster settles."""
    p = Params(brokers=8, slots=32, ttl=2.0, lost=0.0, spike=0.0, fence=fence)
    sim = Sim(p)

    async def main() -> str:
        for _ in range(p.brokers):
            sim.join()
        await sim.settle()
        await asyncio.sleep(1.0)
        victim = sorted(sim.brokers)[3]
        sim.pause(victim, 2.5 * p.ttl)
        await asyncio.sleep(2.5 * p.ttl)
        await sim.settle()
        return victim

    return sim, _virtualtime.run(main())


def test_a_woken_broker_cannot_write_to_the_slots_it_lost() -> None:
    sim, victim = pause_past_the_lease(fence=True)
    assert check_history(sim.store.history, 32) == []
    ((broker, lost, refused),) = sim.woken_writes
    assert broker == victim and lost == 4 and refused == 1
    # It dropped everything it held (at its lease's end by its own clock, or
    # when the fence refused that commit, whichever came first).
    assert sim.drops["the lease expired with no renewal answered"] + sim.drops["the store failed"]


def test_without_the_fence_the_woken_broker_writes_over_the_new_owners() -> None:
    sim, victim = pause_past_the_lease(fence=False)
    violations = check_history(sim.store.history, 32)
    assert violations
    assert {v.writer for v in violations} == {victim}
    assert all(v.owner not in (None, v.writer) for v in violations)
    ((_, lost, refused),) = sim.woken_writes
    assert lost == 4 and refused == 0


@pytest.mark.parametrize("slots", [64])
def test_the_placement_comparison_shows_fair_share_balanced(slots: int) -> None:
    lines = compare_placements([slots], [10], joins=2)
    ours = next(line for line in lines if "sticky fair share" in line).split()
    assert ours[:2] == [str(slots), "10"] and ours[5] == "7/6"  # max/min slots per broker
