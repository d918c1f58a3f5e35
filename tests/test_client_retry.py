"""Unit tests of the client's retry loops in a cluster (``client._backoff``)
and of its connect timeout, against ``FakeBroker`` (tests/test_client_unit.py)
and a socket server that accepts and never answers.

A slot between owners is played by a fake broker that refuses a request
NOT_OWNER for a fixed window while its lookups keep naming the same broker:
the requests it gets in that window are counted (a loop without a pause
makes hundreds; with the pause, 0.05 s doubling, about five a second).
These tests take about a second each (the window)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_client_unit import FakeBroker

import client
from client import Client, TransactionGroups, errors
from client._backoff import RETRY_FIRST, RETRY_MOST, Backoff
from client._connection import CONNECT_TIMEOUT, Connection
from proto import txnbuf_pb2 as pb

T = pb.BaseCommand

WINDOW = 1.0  # seconds a slot is between owners (refused NOT_OWNER)
AT_MOST = 8  # attempts in WINDOW: at 0, 0.05, 0.15, 0.35, 0.75 s (and slack for a busy machine)


@pytest.fixture
async def fake() -> AsyncIterator[FakeBroker]:
    server = FakeBroker()
    server.slots = 64  # (a cluster's broker: the client looks things up)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
    assert not server.bad_frames and not server.violations


async def refused_for(window: float, refusals: list[int], attempt: Any) -> Any:
    """Start ``attempt()``, refused while ``refusals`` holds codes, and
    empty ``refusals`` after ``window`` seconds (the slot loaded); its
    result."""
    task = asyncio.ensure_future(attempt())
    await asyncio.sleep(window)  # (the window itself is what is measured)
    assert not task.done(), task
    refusals.clear()
    return await task


# --- the helper ------------------------------------------------------------------


def test_a_pause_doubles_at_the_same_broker_and_is_none_at_a_new_one() -> None:
    a, b = object(), object()
    backoff = Backoff(float("inf"), a)
    assert [backoff.delay(a) for _ in range(7)] == [0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0]
    assert backoff.delay(b) == 0  # (a real move: at once, and the delays start again)
    assert backoff.delay(b) == RETRY_FIRST
    assert backoff.delay(a) == 2 * RETRY_FIRST  # (back to one tried already: no new start)
    assert backoff.delay(None) == 4 * RETRY_FIRST  # (no owner known: a pause)
    assert RETRY_MOST == 1.0
    looks = Backoff(float("inf"), most=0.5)
    assert [looks.delay() for _ in range(5)] == [0.05, 0.1, 0.2, 0.4, 0.5]


async def test_a_pause_is_never_taken_past_the_deadline() -> None:
    loop = asyncio.get_running_loop()
    a = object()
    backoff = Backoff(loop.time() + 0.12, a)
    started = loop.time()
    assert await backoff.wait(a)  # 0.05 s
    assert not await backoff.wait(a)  # (0.1 s more would reach the deadline: not taken)
    assert loop.time() - started < 0.1 and backoff.pauses == 1
    assert not await Backoff(loop.time() - 1).wait(object())  # (no time left at all)


# --- the loops -------------------------------------------------------------------


async def test_an_end_txn_refused_at_the_same_broker_is_sent_again_after_pauses(
    fake: FakeBroker,
) -> None:
    """The coordinator's slot between owners: END_TXN refused NOT_OWNER, and
    every lookup names the same broker (here: itself)."""
    async with Client(fake.url, operation_timeout=10.0) as cli:
        txn = await cli.new_transaction()
        refusals = fake.txn_errors[T.END_TXN] = [pb.NOT_OWNER] * 100_000
        await refused_for(WINDOW, refusals, txn.abort)
        assert txn.state is client.TxnState.ABORTED
    ends = len(fake.of_type(T.END_TXN))
    assert 2 <= ends <= AT_MOST + 1, f"{ends} END_TXN in {WINDOW} s of NOT_OWNER"
    assert len(fake.of_type(T.LOOKUP)) <= AT_MOST


async def test_an_end_txn_follows_a_move_at_once(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused NOT_OWNER, the lookup names another broker: the END goes
    there at once (a pause, made here longer than the operation timeout,
    would fail the abort)."""
    monkeypatch.setattr(client._backoff, "RETRY_FIRST", 60.0)
    owner = FakeBroker()
    owner.slots = 64
    await owner.start()
    try:
        async with Client(fake.url, operation_timeout=5.0) as cli:
            txn = await cli.new_transaction()
            fake.txn_errors[T.END_TXN] = [pb.NOT_OWNER]
            fake.redirect = owner.url
            owner.txns = fake.txns  # (one database: the new owner knows it)
            await txn.abort()
            assert txn.state is client.TxnState.ABORTED
            assert txn._conn.url == owner.url
            assert len(owner.of_type(T.END_TXN)) == 1
    finally:
        await owner.stop()


async def test_a_producer_created_during_a_move_is_tried_again_after_pauses(
    fake: FakeBroker,
) -> None:
    """`Client._at_owner`: CREATE_PRODUCER refused NOT_OWNER, the lookup
    naming the same broker."""
    async with Client(fake.url, operation_timeout=10.0) as cli:
        await cli.partitions("t")
        refusals = fake.refuse_producer = [pb.NOT_OWNER] * 100_000
        producer = await refused_for(WINDOW, refusals, lambda: cli.create_producer("t"))
        await producer.send(b"x")
    creates = len(fake.of_type(T.PRODUCER))
    assert 2 <= creates <= AT_MOST + 1, f"{creates} PRODUCER in {WINDOW} s of NOT_OWNER"
    assert fake.stored("t") == [b"x"]


async def test_a_producer_moved_to_a_broker_still_loading_its_slot_waits_between_tries(
    fake: FakeBroker,
) -> None:
    """`Brokers._move`: a send refused NOT_OWNER moves the producer to the
    owner a lookup names, which refuses its re-creation for a while (it is
    loading the slot): re-created there after pauses, then the send goes."""
    owner = FakeBroker()
    owner.slots = 64
    owner.partitions["t"] = 1
    await owner.start()
    try:
        async with Client(fake.url, operation_timeout=10.0) as cli:
            producer = await cli.create_producer("t")
            fake.send_error = pb.NOT_OWNER
            fake.redirect = owner.url
            refusals = owner.refuse_producer = [pb.NOT_OWNER] * 100_000
            await refused_for(WINDOW, refusals, lambda: producer.send(b"moved"))
            assert producer._conn.url == owner.url
        creates = len(owner.of_type(T.PRODUCER))
        assert 2 <= creates <= AT_MOST + 1, f"{creates} PRODUCER in {WINDOW} s of NOT_OWNER"
        assert owner.stored("t") == [b"moved"]
    finally:
        await owner.stop()


async def test_a_routed_request_refused_at_the_same_broker_is_made_again_after_pauses(
    fake: FakeBroker,
) -> None:
    """`Route.request` (transaction groups, readers, cursors, epoch producers)."""
    async with Client(fake.url, operation_timeout=10.0) as cli:
        groups = TransactionGroups(cli)
        refusals = fake.txn_errors[T.NEW_TXN] = [pb.NOT_OWNER] * 100_000
        await refused_for(WINDOW, refusals, lambda: groups.new_transaction("tag", tc_id=7))
    asked = len(fake.of_type(T.NEW_TXN))
    assert 2 <= asked <= AT_MOST + 1, f"{asked} NEW_TXN in {WINDOW} s of NOT_OWNER"


# --- the connect timeout ---------------------------------------------------------


class Silent:
    """A server that accepts connections and never answers (as a SIGSTOPped
    broker's kernel does); ``held``: the connections it accepted."""

    def __init__(self) -> None:
        self.held: list[asyncio.StreamWriter] = []
        self.url = ""

    async def accept(self, _: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.held.append(writer)


@pytest.fixture
async def silent() -> AsyncIterator[Silent]:
    found = Silent()
    server = await asyncio.start_server(found.accept, "127.0.0.1", 0)
    found.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield found
    finally:
        for writer in found.held:
            writer.close()
        server.close()


async def test_a_broker_that_never_answers_connect_is_left_for_the_next_url(
    silent: Silent,
) -> None:
    server = FakeBroker()  # (a single broker: the service's other URL)
    await server.start()
    try:
        started = time.monotonic()
        urls = [silent.url, server.url]
        async with Client(urls, operation_timeout=10.0, connect_timeout=0.3) as c:
            assert c._conn.url == server.url
            await (await c.create_producer("t")).send(b"x")
        assert time.monotonic() - started < 5.0  # (not the operation timeout: 10 s)
        assert server.stored("t") == [b"x"] and len(silent.held) == 1
    finally:
        await server.stop()


def test_the_connect_timeout_applies_when_there_is_another_url_to_try() -> None:
    assert CONNECT_TIMEOUT == 5.0
    one = Connection("http://127.0.0.1:1", operation_timeout=30.0)
    assert one.attempt_timeout() == 30.0  # (nothing else to try: as before)
    two = Connection("http://127.0.0.1:1", 30.0, fallbacks=["http://127.0.0.1:2"])
    assert two.attempt_timeout() == CONNECT_TIMEOUT
    short = Connection("http://127.0.0.1:1", 2.0, fallbacks=["http://127.0.0.1:2"])
    assert short.attempt_timeout() == 2.0  # (never more than the operation timeout)
    one.add_fallback("http://127.0.0.1:3")  # (a broker a lookup named)
    assert one.attempt_timeout() == CONNECT_TIMEOUT


async def test_a_single_url_of_a_silent_broker_waits_the_operation_timeout(
    silent: Silent,
) -> None:
    """With one URL there is nothing else to try: one attempt, not cut
    short (unchanged: a broker paused for a moment still answers it)."""
    cli = Client(silent.url, operation_timeout=1.0, connect_timeout=0.2)
    try:
        with pytest.raises(errors.BrokerConnectionError):
            await cli.connect()
        assert cli._conn.links == 0 and len(silent.held) == 1
    finally:
        await cli.close()


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_bad_connect_timeout_is_refused(value: Any) -> None:
    with pytest.raises(errors.InvalidInputError, match="connect_timeout"):
        Client("http://127.0.0.1:1", connect_timeout=value)
