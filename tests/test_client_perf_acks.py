"""Acknowledging lists, with one future per ``acknowledge`` call (not per id),
against the ``FakeBroker`` of ``test_client_unit.py``: a refused frame is
split id by id, a call of several ids fails only if one of its ids is bad,
and the other calls of the frame succeed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_client_unit import FakeBroker, until

from client import Client, MessageId, errors
from proto import txnbuf_pb2 as pb

T = pb.BaseCommand


@pytest.fixture
async def fake() -> Any:
    server = FakeBroker()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
    assert not server.bad_frames
    assert not server.violations


@pytest.fixture
async def cli(fake: FakeBroker) -> Any:
    async with Client(fake.url, operation_timeout=5.0) as c:
        yield c


async def test_list_ack_is_one_frame(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(5)))
    msgs = [await consumer.receive(timeout=5) for _ in range(5)]
    await consumer.acknowledge(msgs)
    (ack,) = fake.of_type(T.ACK)
    sent = [MessageId(m.partition, m.entry_id, m.batch_index) for m in ack.ack.message_ids]
    assert sent == [m.message_id for m in msgs]
    assert not fake.subs["t", "s"].unacked


async def test_bad_id_fails_only_the_list_it_is_in(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(5)))
    msgs = [await consumer.receive(timeout=5) for _ in range(5)]
    bogus = MessageId(0, 99, 0)
    results = await asyncio.gather(
        consumer.acknowledge(msgs[:2]),
        consumer.acknowledge([msgs[2], bogus, msgs[3]]),
        consumer.acknowledge(msgs[4]),
        return_exceptions=True,
    )
    assert results[0] is None
    assert isinstance(results[1], errors.UnknownMessageIdError)
    assert results[2] is None
    # One frame of all six ids, refused; then each id alone.
    acks = fake.of_type(T.ACK)
    assert [len(a.ack.message_ids) for a in acks] == [6, 1, 1, 1, 1, 1, 1]
    assert not fake.subs["t", "s"].unacked  # the good ids of the failed call too


async def test_list_ack_split_succeeds_when_all_ids_are_good(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(4)))
    msgs = [await consumer.receive(timeout=5) for _ in range(4)]
    bogus = MessageId(0, 99, 0)
    good, bad = await asyncio.gather(
        consumer.acknowledge(msgs), consumer.acknowledge(bogus), return_exceptions=True
    )
    assert good is None
    assert isinstance(bad, errors.UnknownMessageIdError)
    assert not fake.subs["t", "s"].unacked


async def test_cancelled_list_ack_still_goes_out(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(3)))
    msgs = [await consumer.receive(timeout=5) for _ in range(3)]
    task = asyncio.create_task(consumer.acknowledge(msgs))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: not fake.subs["t", "s"].unacked)
