"""Receipts of transactional sends that give the first place in the
transaction (``first_batch_index``) instead of one id per message, against the
``FakeBroker`` of ``test_client_unit.py``."""

from __future__ import annotations

from typing import Any

import pytest
from test_client_unit import FakeBroker, frame, until

from client import Client, MessageId
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


@pytest.fixture
async def cli(fake: FakeBroker) -> Any:
    async with Client(fake.url, operation_timeout=5.0) as c:
        yield c


async def test_first_batch_index_answers_every_message(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await cli.new_transaction()
    fake.ignore_sends = True
    futures = [producer.send_nowait(b"%d" % i, txn=txn) for i in range(3)]
    await until(lambda: len(fake.sends()) == 1)
    await fake.push(
        frame(
            T.SEND_RECEIPT,
            "send_receipt",
            producer_id=producer.producer_id,
            request_id=fake.sends()[0].request_id,
            partition=0,
            entry_id=-1,
            first_batch_index=5,
        )
    )
    assert [await f for f in futures] == [MessageId(0, -1, 5 + i) for i in range(3)]
    assert producer.pending == 0


async def test_first_batch_index_zero_is_not_a_missing_id(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await cli.new_transaction()
    fake.ignore_sends = True
    future = producer.send_nowait(b"x", txn=txn)
    await until(lambda: len(fake.sends()) == 1)
    await fake.push(
        frame(
            T.SEND_RECEIPT,
            "send_receipt",
            producer_id=producer.producer_id,
            request_id=fake.sends()[0].request_id,
            partition=0,
            entry_id=-1,
            first_batch_index=0,
        )
    )
    assert await future == MessageId(0, -1, 0)
    assert type(await future) is MessageId
