"""What the cluster tests share: brokers of a cluster over one PostgreSQL
database (``txnbuf serve --store URL --cluster``) as real processes, and
what a test asks of its slots table. The brokers go into the ``logs``
fixture's list (tests/conftest.py), which kills them and shows their logs
at the end of the test. A helper module, not a test module: pytest collects
nothing here."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import asyncpg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker._slots import slot_of_key
from cluster import placement
from tests.conftest import BrokerProcess, free_port

SLOTS = 64  # (a database's default)
WAIT = 60.0  # seconds a condition may take on a busy machine, at most

Owners = dict[str | None, set[int]]  # who holds which slots (None: nobody)


def cluster_broker(tmp_path: Path, url: str, name: str, ttl: float) -> BrokerProcess:
    """A broker of the cluster over ``url`` (not started): its data in
    ``tmp_path/name``, its log in ``tmp_path/name.log``, lease ``ttl``."""
    proc = BrokerProcess(tmp_path / name, tmp_path / f"{name}.log", store=url)
    proc.args = ["--cluster", "--lease-ttl", str(ttl)]
    return proc


def start_all(
    tmp_path: Path,
    url: str,
    n: int,
    ttl: float,
    procs: list[BrokerProcess],
    stream: bool = False,
) -> None:
    """Start ``n`` brokers ``b0``... of the cluster over ``url`` into
    ``procs`` (``stream``: each serves the raw TCP listener too)."""
    for i in range(n):
        proc = cluster_broker(tmp_path, url, f"b{i}", ttl)
        if stream:
            proc.stream_port = free_port()
        procs.append(proc)
        proc.start()


def owner_id(proc: BrokerProcess) -> str:
    """Who ``proc`` is in the slots table."""
    assert proc.proc is not None
    return f"{proc.url} pid {proc.proc.pid}"


async def slots(url: str) -> list[tuple[int, str | None, int]]:
    """(slot, owner, epoch) of every slot, in order."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT slot, owner, epoch FROM txnbuf.slots ORDER BY slot")
    finally:
        await conn.close()
    return [(r[0], r[1], r[2]) for r in rows]


async def owners(url: str) -> Owners:
    out: Owners = {}
    for slot, owner, _ in await slots(url):
        out.setdefault(owner, set()).add(slot)
    return out


async def wait_for(what: str, check: Callable[[], Awaitable[bool]], timeout: float = WAIT) -> float:
    """Poll ``check`` until it holds; the seconds it took."""
    t0 = time.monotonic()
    while not await check():
        if time.monotonic() - t0 > timeout:
            pytest.fail(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def spread_over(url: str, procs: list[BrokerProcess]) -> bool:
    """Every slot owned by one of ``procs``, shares within one slot."""
    found = await owners(url)
    ids = {owner_id(p) for p in procs}
    if set(found) != ids:
        return False
    sizes = [len(s) for s in found.values()]
    return max(sizes) - min(sizes) <= 1


async def settled(url: str, procs: list[BrokerProcess]) -> bool:
    """Every slot owned where the placement puts it (no move under way)."""
    held = [owner for _, owner, _ in await slots(url)]
    return None not in held and placement([owner_id(p) for p in procs], held) == held


async def placed(url: str, procs: list[BrokerProcess]) -> Owners:
    """Wait until the slots are `settled` on ``procs``; who holds which then."""
    await wait_for(f"slots placed on the {len(procs)} brokers", lambda: settled(url, procs))
    return await owners(url)


async def start_placed(
    tmp_path: Path,
    url: str,
    procs: list[BrokerProcess],
    n: int = 3,
    ttl: float = 2.0,
    stream: bool = False,
) -> Owners:
    """`start_all`, then `placed`."""
    start_all(tmp_path, url, n, ttl, procs, stream)
    return await placed(url, procs)


def topic_in(slot: int, prefix: str = "t") -> str:
    """A topic name whose slot is ``slot``."""
    i = 0
    while slot_of_key(f"{prefix}{i}", SLOTS) != slot:
        i += 1
    return f"{prefix}{i}"


def first_slot(found: Owners, proc: BrokerProcess) -> int:
    """The first slot ``proc`` holds."""
    return min(found[owner_id(proc)])


def topic_on(found: Owners, proc: BrokerProcess, prefix: str) -> str:
    """A topic named ``prefix...`` in `first_slot` of ``proc`` (which also
    names a coordinator there: `Client.new_transaction(near=...)`)."""
    return topic_in(first_slot(found, proc), prefix)


def three_topics(found: Owners, procs: list[BrokerProcess]) -> tuple[str, str, str]:
    """A topic in a slot of each of three brokers: ``anchor`` (which also
    names the first's coordinator), ``out`` and ``into``."""
    a, b, c = procs
    return topic_on(found, a, "anchor"), topic_on(found, b, "out"), topic_on(found, c, "in")


async def three_brokers(
    tmp_path: Path, url: str, procs: list[BrokerProcess], stream: bool = False
) -> tuple[str, str, str]:
    """Three brokers started into ``procs`` and placed (``stream``: each
    serves the raw TCP listener too); `three_topics`."""
    return three_topics(await start_placed(tmp_path, url, procs, stream=stream), procs)


def served_by(found: Owners, slot: int, procs: list[BrokerProcess]) -> BrokerProcess:
    for proc in procs:
        if slot in found.get(owner_id(proc), set()):
            return proc
    raise AssertionError(f"slot {slot} is owned by none of the brokers: {found}")


async def received(consumer: object, count: int) -> list[bytes]:
    """The next ``count`` messages' values, each acknowledged."""
    values = []
    for _ in range(count):
        message = await consumer.receive(timeout=60)  # type: ignore[attr-defined]
        values.append(message.value)
        await consumer.acknowledge(message)  # type: ignore[attr-defined]
    return values


def scrape(proc: BrokerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics, keyed by (sample name, sorted labels)."""
    status, body = proc.admin("GET", "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
    }
