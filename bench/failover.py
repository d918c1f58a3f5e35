"""Failover of a cluster of brokers over one PostgreSQL: SIGKILL and SIGTERM.

Three `txnbuf serve --store URL --cluster` processes (the default lease
unless ``--lease-ttl``) over a private PostgreSQL server. Each round:

- SIGKILL one broker; time until every slot of the database is owned by a
  live broker again (the slots table) and until every slot the dead broker
  held is *served*: a send to a topic of that slot, at its new owner, is
  acknowledged (its coordinator recovered, its topic loaded);
- start it again and wait until slots are spread over the three;
- SIGTERM one broker: the same two times (a drain hands the slots over
  without waiting for its lease);
- start it again.

Beside each, a *following producer*: a client given another broker's URL
sends to a topic of one of the victim's slots, one send at a time, from
before the signal until after the failover; its stall is the longest gap
between two acknowledgements across the signal (the client looks the topic
up again and re-sends by itself: `client._brokers`).

Also beside each:

- a *transacting client* (another broker's URL) begins a transaction every
  ``TXN_EVERY`` seconds without waiting for the ones under way, each a send
  to a topic of one of the victim's slots with its coordinator on the
  topic's broker (``transaction(near=topic)``: the victim's before the
  signal); one that fails (its coordinator died or moved: aborted by the
  new owner's recovery) or takes longer than ``TXN_GIVE_UP`` (its operation
  timeout; or, not answered at all, after ``HUNG``: counted, with where it
  waited) is given up. Measured: the time from the signal to the commit
  of the first transaction begun after it (not one begun before: a drain
  settles those); transactions begun meanwhile do not wait for one stuck
  on the dead broker;
- a *steady producer* (another broker's URL) sends to a topic of the
  victim's slot every ``STEADY_EVERY`` seconds without waiting for the
  answers; measured: the p50 and p99 latency (send to acknowledgement) of
  the sends made in the failover window (from the signal until every slot
  of the victim is served again), beside those of the second before the
  signal.

Prints each round and the medians; ``bench/results/failover.md`` keeps them
with the date and machine.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import itertools
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._brokers import (
    SLOTS,
    BrokerProcess,
    cluster_brokers,
    owners,
    spread,
    topic_in,
    wait_until,
)
from bench._postgres import private_postgres
from bench._results import recorded
from client import Client, Producer
from client.errors import TxnbufError

WAIT = 120.0
STEADY_EVERY = 0.01  # seconds between the steady producer's sends
TXN_GIVE_UP = 2.0  # seconds: the transacting client's operation timeout
TXN_EVERY = 0.05  # seconds between the transacting client's transactions
HUNG = 5 * TXN_GIVE_UP  # seconds after which a transaction is given up as hung
FAILED: collections.Counter[str] = collections.Counter()  # the transactions' errors


async def served(url: str, slots: set[int], by: dict[str, BrokerProcess], t0: float) -> float:
    """Seconds from ``t0`` until a send to a topic of every slot in ``slots``
    is acknowledged at its owner."""
    left = set(slots)
    while left:
        if time.monotonic() - t0 > WAIT:
            raise RuntimeError(f"slots {sorted(left)} not served")
        found = await owners(url)
        for slot in sorted(left):
            broker = by.get(found.get(slot) or "")
            if broker is None:
                continue
            try:
                async with Client(broker.url, operation_timeout=2.0) as client:
                    producer = await client.create_producer(topic_in(slot))
                    await producer.send(b"x")
                left.discard(slot)
            except Exception:
                pass
        if left:
            await asyncio.sleep(0.02)
    return time.monotonic() - t0


async def follow(url: str, topic: str, acks: list[float], stop: asyncio.Event) -> None:
    """Send to ``topic`` one message at a time until ``stop``, noting when
    each is acknowledged."""
    async with Client(url, operation_timeout=WAIT) as client:
        producer = await client.create_producer(topic)
        while not stop.is_set():
            await producer.send(b"f")
            acks.append(time.monotonic())


async def transact(
    url: str, topic: str, commits: list[tuple[float, float]], stop: asyncio.Event
) -> None:
    """Begin a transaction (a send to ``topic``, its coordinator on the
    topic's broker) every `TXN_EVERY` seconds until ``stop``, noting when
    each committed began and committed; one that fails is given up."""
    async with Client(url, operation_timeout=TXN_GIVE_UP) as client:
        producer = await client.create_producer(topic)

        async def attempt() -> None:
            began = time.monotonic()
            try:
                async with client.transaction(near=topic) as txn:
                    await producer.send(b"t", txn=txn)
                commits.append((began, time.monotonic()))
            except TxnbufError as exc:
                FAILED[type(exc).__name__ + ": " + str(exc)[:150]] += 1

        running: dict[asyncio.Task[None], float] = {}
        while not stop.is_set():
            task = asyncio.create_task(attempt())
            running[task] = time.monotonic()
            task.add_done_callback(lambda t: running.pop(t, None))
            await asyncio.sleep(TXN_EVERY)
            for task, began in list(running.items()):
                if time.monotonic() - began > HUNG:  # (past every deadline: noted, dropped)
                    FAILED[f"hung in {awaiting(task)}"] += 1
                    task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


async def steady(
    url: str, topic: str, sends: list[tuple[float, float]], stop: asyncio.Event
) -> None:
    """Send to ``topic`` every `STEADY_EVERY` seconds, not waiting for the
    answers, until ``stop``; note (sent, acknowledged) of each."""

    async def one(producer: Producer) -> None:
        sent = time.monotonic()
        await producer.send(b"s")
        sends.append((sent, time.monotonic()))

    async with Client(url, operation_timeout=WAIT) as client:
        producer = await client.create_producer(topic, batching_max_messages=1)
        pending: list[asyncio.Future[None]] = []
        while not stop.is_set():
            pending.append(asyncio.ensure_future(one(producer)))
            await asyncio.sleep(STEADY_EVERY)
        await asyncio.gather(*pending)


def awaiting(task: asyncio.Task[None]) -> str:
    """Where ``task`` waits: its chain of coroutines, innermost last."""
    names = []
    coro: Any = task.get_coro()
    while coro is not None and hasattr(coro, "cr_code"):
        names.append(coro.cr_code.co_name)
        coro = coro.cr_await
    return " > ".join(names[-5:])


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def one_failover(
    url: str, brokers: list[BrokerProcess], victim: BrokerProcess, sig: int
) -> dict[str, float]:
    held = sorted(s for s, o in (await owners(url)).items() if o == victim.owner)
    others = [b for b in brokers if b is not victim]
    acks: list[float] = []
    commits: list[tuple[float, float]] = []
    sends: list[tuple[float, float]] = []
    stop = asyncio.Event()
    slot = held[0]
    tasks = [
        asyncio.ensure_future(follow(others[0].url, topic_in(slot), acks, stop)),
        asyncio.ensure_future(transact(others[1].url, topic_in(slot, "t"), commits, stop)),
        asyncio.ensure_future(steady(others[0].url, topic_in(slot, "s"), sends, stop)),
    ]

    async def acked(after: float, count: int = 1) -> bool:
        for task in tasks:
            if task.done():
                task.result()  # (its error)
        return (
            sum(1 for t in acks if t > after) >= count
            and sum(1 for _, t in commits if t > after) >= count
            and sum(1 for _, t in sends if t > after) >= count
        )

    def state() -> str:
        return (
            f"(acknowledged {len(acks)}, committed {len(commits)}, steady {len(sends)}; "
            f"transactions failed: {FAILED.most_common(5)})"
        )

    await wait_until(lambda: acked(0.0, 20), state)
    await asyncio.sleep(1.0)  # (a second of steady sends before the signal)
    t0 = time.monotonic()
    victim.signal(sig)
    await wait_until(lambda: spread(url, others))
    owned = time.monotonic() - t0
    by = {b.owner: b for b in others}
    serving = await served(url, set(held), by, t0)
    done = time.monotonic()
    await wait_until(lambda: acked(done, 5), state)
    stop.set()
    await asyncio.gather(*tasks)
    around = [t for t in acks if t <= t0][-1:] + [t for t in acks if t > t0]
    stall = max(b - a for a, b in itertools.pairwise(around))
    window = [b - a for a, b in sends if t0 <= a <= t0 + serving]
    before = [b - a for a, b in sends if t0 - 1.0 <= a < t0]
    return {
        "owned": owned,
        "served": serving,
        "stall": stall,
        "first_commit": min(t for began, t in commits if began > t0) - t0,
        "p50": percentile(window, 50),
        "p99": percentile(window, 99),
        "sends": len(window),
        "p50_before": percentile(before, 50),
        "p99_before": percentile(before, 99),
    }


async def run(url: str, folder: Path, rounds: int, ttl: float | None) -> None:
    brokers = cluster_brokers(folder, url, 3, ttl, timeout=WAIT)
    try:
        await wait_until(lambda: spread(url, brokers))
        # Every slot's topic exists (so "served" measures a takeover, not a creation).
        await served(url, set(range(SLOTS)), {b.owner: b for b in brokers}, time.monotonic())
        kills: list[dict[str, float]] = []
        terms: list[dict[str, float]] = []
        for r in range(rounds):
            for sig, out in ((signal.SIGKILL, kills), (signal.SIGTERM, terms)):
                victim = brokers[r % 3]
                f = await one_failover(url, brokers, victim, sig)
                out.append(f)
                name = "SIGKILL" if sig == signal.SIGKILL else "SIGTERM"
                print(f"round {r + 1} {name}: every slot owned again {f['owned']:.2f}s, "
                      f"every slot of the victim served again {f['served']:.2f}s, "
                      f"following producer's stall {f['stall']:.2f}s, first transaction "
                      f"committed {f['first_commit']:.2f}s; steady producer's sends in "
                      f"the window ({f['sends']:.0f}): p50 {f['p50']:.2f}s, p99 "
                      f"{f['p99']:.2f}s (the second before: p50 {f['p50_before'] * 1000:.1f} "
                      f"ms, p99 {f['p99_before'] * 1000:.1f} ms)", flush=True)  # fmt: skip
                victim.wait()
                victim.start()
                await wait_until(lambda: spread(url, brokers))
        for name, figures in (("SIGKILL", kills), ("SIGTERM", terms)):

            def median(key: str, figures: list[dict[str, float]] = figures) -> float:
                return statistics.median(f[key] for f in figures)

            def most(key: str, figures: list[dict[str, float]] = figures) -> float:
                return max(f[key] for f in figures)

            print(f"{name}: median owned {median('owned'):.2f}s, median served "
                  f"{median('served'):.2f}s, slowest served {most('served'):.2f}s; following "
                  f"producer's stall median {median('stall'):.2f}s, longest "
                  f"{most('stall'):.2f}s; first transaction committed median "
                  f"{median('first_commit'):.2f}s, slowest {most('first_commit'):.2f}s; "
                  f"steady producer in the window: p50 median {median('p50'):.2f}s, p99 "
                  f"median {median('p99'):.2f}s, worst {most('p99'):.2f}s "
                  f"({len(figures)} rounds)")  # fmt: skip
        given_up = ", ".join(f"{n} {why}" for why, n in FAILED.most_common(8))
        print(f"transactions given up, by error: {given_up or 'none'}")
    finally:
        for b in brokers:
            b.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lease-ttl", type=float, default=None,
                        help="the brokers' --lease-ttl (their default if not given)")  # fmt: skip
    args = parser.parse_args()
    with private_postgres("failover-bench-") as server:
        command = "python -m bench.failover " + " ".join(sys.argv[1:])
        with recorded("failover", command.strip()), tempfile.TemporaryDirectory() as tmp:
            ttl = "default" if args.lease_ttl is None else f"{args.lease_ttl:g} s"
            cores = os.cpu_count()
            print(
                f"3 brokers, {SLOTS} slots, lease {ttl}, PostgreSQL {server.cluster.version}, "
                f"{cores} cores shared by PostgreSQL, the brokers and this client"
            )
            asyncio.run(run(server.url(), Path(tmp), args.rounds, args.lease_ttl))


if __name__ == "__main__":
    main()
