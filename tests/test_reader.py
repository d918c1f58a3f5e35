"""Reading partitions by position (READ_ENTRIES, `client.Reader`) and
cursors moved by position (CURSOR, `client.SubscriptionCursor`), against a
real broker process."""

from __future__ import annotations

import asyncio
import json

import pytest

from client import Client, Position, SubscriptionCursor
from client._brokers import Route
from client._reader import read_entries
from client.errors import InvalidArgumentError, InvalidInputError, OperationTimeoutError
from tests.conftest import BrokerProcess, until

pytestmark = pytest.mark.integration


async def test_a_reader_reads_committed_messages_in_committed_order(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("orders")
        await producer.send(b"plain-1", key="k", properties={"p": "1"})
        late = await client.new_transaction()
        await producer.send(b"late-1", txn=late)
        await producer.send(b"late-2", txn=late)
        await producer.send(b"plain-2")
        async with client.transaction() as early:
            await producer.send(b"early-1", txn=early)
        aborted = await client.new_transaction()
        await producer.send(b"aborted-1", txn=aborted)
        await aborted.abort()
        open_txn = await client.new_transaction()
        await producer.send(b"open-1", txn=open_txn)
        await late.commit()

        reader = await client.create_reader("orders")
        got = await reader.read_batch()
        # The committed order: plain sends where they were stored, each
        # transaction where it committed; nothing aborted or open.
        assert [m.value for m in got] == [b"plain-1", b"plain-2", b"early-1", b"late-1", b"late-2"]
        assert got[0].key == "k" and got[0].properties == {"p": "1"}
        assert [m.message_id[1:] for m in got] == [(0, 0), (1, 0), (2, 0), (3, 0), (3, 1)]
        assert reader.position == Position(4, 0) == await reader.end()
        assert await reader.read_batch() == []

        # The open transaction's messages appear once it commits, after the rest.
        await open_txn.commit()
        assert [m.value for m in await reader.read_batch()] == [b"open-1"]

        # Reading a range again gives the same messages (a replay).
        again = await client.create_reader("orders", start=(1, 0))
        first = await again.read_batch(end=Position(3, 1))
        assert [m.value for m in first] == [b"plain-2", b"early-1", b"late-1"]
        replay = await client.create_reader("orders", start=Position(1, 0))
        assert [m.value for m in await replay.read_batch(end=Position(3, 1))] == [
            m.value for m in first
        ]
        # A limit inside an entry, and from the middle of one.
        mid = await client.create_reader("orders", start=(3, 1), batch=1)
        assert [m.value for m in await mid.read_batch()] == [b"late-2"]
        assert mid.position == Position(4, 0)


async def test_read_next_waits_for_a_commit(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("events")
        reader = await client.create_reader("events", start="latest")
        txn = await client.new_transaction()
        await producer.send(b"pending", txn=txn)
        with pytest.raises(OperationTimeoutError):
            await reader.read_next(timeout=0.3)
        waiting = asyncio.ensure_future(reader.read_next(timeout=10))
        await asyncio.sleep(0.2)
        assert not waiting.done()
        await txn.commit()
        assert (await waiting).value == b"pending"
        await producer.send(b"next")
        async for msg in reader:
            assert msg.value == b"next"
            break


async def test_positions_only_reads_count_without_data(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("counted", batching_max_messages=5)
        await asyncio.gather(*(producer.send(b"x%d" % i) for i in range(12)))
        conn = Route(client._brokers, client._conn)
        whole = await read_entries(conn, "counted", 0, None, max_messages=100)
        assert whole.covered == 12 and whole.next == whole.end
        some = await read_entries(conn, "counted", 0, Position(0, 0), max_messages=7,
                                  positions_only=True)  # fmt: skip
        assert some.messages == [] and some.covered == 7
        rest = await read_entries(conn, "counted", 0, some.next, max_messages=100)
        assert [m.value for m in whole.messages[7:]] == [m.value for m in rest.messages]


async def test_bad_positions_are_refused_with_the_partition_range(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("small")
        await producer.send(b"one")
        conn = Route(client._brokers, client._conn)
        with pytest.raises(InvalidArgumentError, match="past its end"):
            await read_entries(conn, "small", 0, Position(5, 0))
        with pytest.raises(InvalidArgumentError, match="holds 1 messages"):
            await read_entries(conn, "small", 0, Position(0, 3))
        with pytest.raises(InvalidArgumentError, match="no partition 2"):
            await read_entries(conn, "small", 2, Position(0, 0))
        with pytest.raises(InvalidArgumentError, match="before start"):
            await read_entries(conn, "small", 0, Position(1, 0), end=Position(0, 0))
        with pytest.raises(InvalidInputError):
            await client.create_reader("small", start=(-1, 0))
        with pytest.raises(InvalidInputError):
            await client.create_reader("small", start="middle")
        reader = await client.create_reader("small")
        assert [m.value for m in await reader.read_batch()] == [b"one"]  # nothing changed


async def test_a_cursor_holds_retention_up_to_what_it_acknowledged(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        cursor = SubscriptionCursor(client, "kept", "job-1", "earliest")
        assert await cursor.positions() == {0: Position(0, 0)}
        producer = await client.create_producer("kept")
        for i in range(60):
            await producer.send(b"%d" % i)  # one entry each
        assert await cursor.positions() == {0: Position(0, 0)}
        await asyncio.sleep(1.5)  # (a retention pass: nothing acknowledged, nothing trimmed)
        reader = await client.create_reader("kept")
        assert reader.position == Position(0, 0)

        assert await cursor.acknowledge_before({0: Position(40, 0)}) == {0: Position(40, 0)}
        assert await cursor.acknowledge_before({0: Position(30, 0)}) == {0: Position(40, 0)}

        async def first_kept() -> Position:
            return await (await client.create_reader("kept")).first()

        async def trimmed() -> bool:
            return (await first_kept()).entry_id > 0

        await until(trimmed, "a retention pass trimming it")
        first = await first_kept()
        assert 0 < first.entry_id <= 40  # trimmed, up to a slack below what was acknowledged
        with pytest.raises(InvalidArgumentError, match="trimmed"):
            await read_entries(Route(client._brokers, client._conn), "kept", 0, Position(0, 0))
        replay = await client.create_reader("kept", start=(40, 0))
        assert [m.value for m in await replay.read_batch()] == [b"%d" % i for i in range(40, 60)]
        status, body = broker.admin("GET", "/admin/v1/topics/kept/stats")
        assert status == 200 and "job-1" in json.loads(body)["partitions"][0]["subscriptions"]

    broker.restart()  # (SIGKILL) the cursor is durable
    async with Client(broker.url) as client:
        cursor = SubscriptionCursor(client, "kept", "job-1", "latest")
        assert await cursor.positions() == {0: Position(40, 0)}
        with pytest.raises(InvalidArgumentError, match="past its end"):
            await cursor.acknowledge_before({0: Position(99, 0)})
        with pytest.raises(InvalidInputError):
            SubscriptionCursor(client, "kept", "job-1", "middle")
        assert await cursor.positions() == {0: Position(40, 0)}


async def test_part_of_a_large_transaction_is_sent_alone(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("big")
        async with client.transaction() as txn:
            for i in range(3000):
                producer.send_nowait(b"%05d" % i, txn=txn)
        conn = Route(client._brokers, client._conn)
        part = await read_entries(conn, "big", 0, Position(0, 1000), max_messages=500)
        assert [m.value for m in part.messages] == [b"%05d" % i for i in range(1000, 1500)]
        assert [m.message_id for m in part.messages][:2] == [(0, 0, 1000), (0, 0, 1001)]
        assert part.next == Position(0, 1500)
        reader = await client.create_reader("big", batch=1000)
        seen = []
        while batch := await reader.read_batch():
            seen.extend(m.value for m in batch)
        assert seen == [b"%05d" % i for i in range(3000)]
