"""The idioms that chain futures without tasks (`ledger._futures`)."""

from __future__ import annotations

import asyncio

import pytest

from ledger import LedgerError, all_of, on_outcome, resolved, then


async def test_resolved_is_done_at_once() -> None:
    assert resolved(7).result() == 7


async def test_then_maps_a_result_and_carries_a_failure_or_a_cancel() -> None:
    loop = asyncio.get_running_loop()
    source: asyncio.Future[int] = loop.create_future()
    mapped = then(source, lambda n: n * 2)
    assert not mapped.done()
    source.set_result(21)
    assert await mapped == 42
    failing: asyncio.Future[int] = loop.create_future()
    failed = then(failing, lambda n: n)
    failing.set_exception(LedgerError("disk full"))
    with pytest.raises(LedgerError, match="disk full"):
        await failed
    cancelled: asyncio.Future[int] = loop.create_future()
    carried = then(cancelled, lambda n: n)
    cancelled.cancel()
    await asyncio.sleep(0)
    assert carried.cancelled()


async def test_all_of_waits_for_every_one_and_fails_with_the_first_failure() -> None:
    loop = asyncio.get_running_loop()
    assert all_of([]).done()
    a: asyncio.Future[int] = loop.create_future()
    b: asyncio.Future[str] = loop.create_future()
    both = all_of([a, b])
    a.set_result(1)
    await asyncio.sleep(0)
    assert not both.done()
    b.set_result("x")
    assert await both is None
    c: asyncio.Future[int] = loop.create_future()
    d: asyncio.Future[int] = loop.create_future()
    either = all_of([c, d])
    d.set_exception(LedgerError("first"))
    await asyncio.sleep(0)
    c.set_exception(LedgerError("second"))
    with pytest.raises(LedgerError, match="first"):
        await either


async def test_on_outcome_calls_one_of_the_two() -> None:
    loop = asyncio.get_running_loop()
    seen: list[object] = []
    ok: asyncio.Future[int] = loop.create_future()
    on_outcome(ok, seen.append, lambda exc: seen.append(("failed", exc)))
    ok.set_result(5)
    bad: asyncio.Future[int] = loop.create_future()
    on_outcome(bad, seen.append, lambda exc: seen.append(("failed", type(exc))))
    bad.set_exception(LedgerError("x"))
    gone: asyncio.Future[int] = loop.create_future()
    on_outcome(gone, seen.append, lambda exc: seen.append(("failed", type(exc))))
    gone.cancel()
    await asyncio.sleep(0)
    assert seen == [5, ("failed", LedgerError), ("failed", asyncio.CancelledError)]
