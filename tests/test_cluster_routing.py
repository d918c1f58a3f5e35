"""What speaks in requests rather than through producers and consumers
(readers, subscription cursors, transaction groups, the producer-epoch
mode's producers), routed in a cluster (`client._brokers`' ``Route``),
against real broker processes sharing one PostgreSQL database: each
reaches topics and coordinators owned by another broker than the one
whose URL the client was given, and a reader keeps reading across a
SIGKILL and a SIGTERM of its topic's owner, from where it was, with no
message skipped or read twice. Tests wait for conditions, never for a
length of time."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from client import Client, SubscriptionCursor, TransactionGroups, errors
from proto import txnbuf_pb2 as pb
from tests._cluster import first_slot, start_placed, topic_in, topic_on
from tests.conftest import BrokerProcess, RawConnection

pytestmark = pytest.mark.integration

COUNT = 120


async def test_readers_cursors_groups_and_epoch_producers_reach_other_brokers(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    found = await start_placed(tmp_path, pg_url, logs)
    home, owner = logs[0], logs[1]  # (a topic owned by another broker than the home one)
    slot = first_slot(found, owner)
    topic = topic_in(slot, "read")
    async with Client(home.url, operation_timeout=30.0) as client:
        producer = await client.create_producer(topic)
        assert producer._conn.url == owner.url
        for i in range(10):
            await producer.send(b"r%d" % i)
        # A reader, from the earliest position and from one in the middle.
        reader = await client.create_reader(topic)
        assert reader._route.conn.url == owner.url
        got = [(await reader.read_next(timeout=30)).value for _ in range(10)]
        assert got == [b"r%d" % i for i in range(10)]
        middle = await client.create_reader(topic, start=(await reader.end()))
        await producer.send(b"after")
        assert (await middle.read_next(timeout=30)).value == b"after"
        # A cursor.
        cursor = SubscriptionCursor(client, topic, "job", "earliest")
        start = await cursor.positions()
        assert cursor._route.conn.url == owner.url
        moved = await cursor.acknowledge_before({0: await reader.end()})
        assert moved[0] > start[0]
        # A transaction group whose coordinator is in the topic's slot.
        groups = TransactionGroups(client)
        tc_id = await groups.coordinator_near(topic)
        assert tc_id == slot
        txn = await groups.new_transaction("batch-1", tc_id=tc_id)
        assert txn._conn.url == owner.url
        await producer.send(b"grouped", txn=txn)
        await txn.prepare()
        result = await groups.commit("job", 1, [txn.id])
        assert not result.duplicate and result.committed == 1
        assert (await groups.commit("job", 1, [txn.id])).duplicate
        assert (await middle.read_next(timeout=30)).value == b"grouped"
        # At a broker that does not serve the coordinator: the retriable NOT_OWNER.
        async with RawConnection(home.url) as raw:
            ask = pb.CommandAbortTagged(request_id=1, tc_id=slot, tag="batch-1")
            reply = await raw.request(pb.BaseCommand.ABORT_TAGGED, "abort_tagged", ask)
            assert reply.txn_group_response.error == pb.NOT_OWNER
        doomed = await groups.new_transaction("batch-2", tc_id=tc_id)
        await producer.send(b"never", txn=doomed)
        await doomed.prepare()
        assert await groups.abort_tagged("batch-2") == 1
        # A producer of the producer-epoch mode whose transactional id is
        # in that slot: its coordinator, and the topic, are the owner's.
        epoch = await client.create_transactional_producer(topic_in(slot, "tid"))
        await epoch.init_transactions()
        assert epoch._conn.url == owner.url
        await epoch.begin_transaction()
        await epoch.send(topic, b"epoch")
        await epoch.commit_transaction()
        assert (await middle.read_next(timeout=30)).value == b"epoch"
        # A transaction over a topic of another broker than the producer's
        # coordinator too: its sends go to that topic's owner, which checks
        # them with the coordinator; it commits, and it aborts.
        other_topic = topic_on(found, logs[2], "other")
        plain = await client.create_producer(other_topic)
        assert plain._conn.url == logs[2].url != epoch._conn.url
        there = await client.create_reader(other_topic)
        await epoch.begin_transaction()
        sent = [await epoch.send(other_topic, b"there-%d" % i) for i in range(3)]
        await epoch.send(topic, b"here")
        await epoch.commit_transaction()
        assert all(f.done() for f in sent)
        assert (await middle.read_next(timeout=30)).value == b"here"
        got = [(await there.read_next(timeout=30)).value for _ in range(3)]
        assert got == [b"there-%d" % i for i in range(3)]
        await epoch.begin_transaction()
        await epoch.send(other_topic, b"never")
        await epoch.send(topic, b"never")
        await epoch.abort_transaction()
        await epoch.begin_transaction()
        await epoch.send(other_topic, b"then")
        await epoch.commit_transaction()
        assert (await there.read_next(timeout=30)).value == b"then"  # (not "never")
        with pytest.raises(errors.OperationTimeoutError):
            await middle.read_next(timeout=1.0)


async def _read_across(
    tmp_path: Path, pg_url: str, procs: list[BrokerProcess], ttl: float, how: signal.Signals
) -> list[bytes]:
    """A reader of a topic of ``procs[0]``'s, reading while a producer sends
    and ``procs[0]`` is sent ``how``; what the reader read."""
    found = await start_placed(tmp_path, pg_url, procs, ttl=ttl)
    victim, home = procs[0], procs[1]
    topic = topic_on(found, victim, "moving")
    async with Client(home.url, operation_timeout=60.0) as client:
        producer = await client.create_producer(topic)
        reader = await client.create_reader(topic, batch=7)
        assert reader._route.conn.url == victim.url
        read: list[bytes] = []
        go = asyncio.Event()

        async def produce() -> None:
            for i in range(COUNT):
                if i == COUNT // 3:
                    go.set()
                await producer.send(b"m%04d" % i)

        async def consume() -> None:
            while len(read) < COUNT:
                read.append((await reader.read_next(timeout=60)).value)

        producing = asyncio.ensure_future(produce())
        consuming = asyncio.ensure_future(consume())
        await go.wait()
        assert victim.proc is not None
        victim.proc.send_signal(how)
        await asyncio.gather(producing, consuming)
        assert reader._route.conn.url != victim.url
        with pytest.raises(errors.OperationTimeoutError):
            read.append((await reader.read_next(timeout=1.0)).value)
    return read


async def test_a_reader_reads_on_across_a_sigkill_of_its_topics_owner(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    read = await _read_across(tmp_path, pg_url, logs, 2.0, signal.SIGKILL)
    assert read == [b"m%04d" % i for i in range(COUNT)], "a gap or a repeat"


async def test_a_reader_reads_on_across_a_sigterm_handover(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    read = await _read_across(tmp_path, pg_url, logs, 30.0, signal.SIGTERM)
    assert read == [b"m%04d" % i for i in range(COUNT)], "a gap or a repeat"


async def test_an_epoch_producer_and_a_transaction_group_follow_a_sigkill_of_their_owner(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    """A producer-epoch mode producer and a transaction group whose
    coordinator and topic are a killed broker's go on at the new owner: the
    epoch producer's transaction under way is not reported committed (the
    new owner's recovery aborted it), its next one commits; a group's
    transaction prepared before the kill is committed after it."""
    found = await start_placed(tmp_path, pg_url, logs)
    victim, home = logs[0], logs[1]
    slot = first_slot(found, victim)
    topic = topic_in(slot, "moving")
    async with Client(home.url, operation_timeout=60.0) as client:
        producer = await client.create_producer(topic)
        reader = await client.create_reader(topic)
        epoch = await client.create_transactional_producer(topic_in(slot, "tid"))
        await epoch.init_transactions()
        assert epoch._conn.url == victim.url
        await epoch.begin_transaction()
        await epoch.send(topic, b"before")
        await epoch.commit_transaction()
        groups = TransactionGroups(client)
        prepared = await groups.new_transaction("batch", tc_id=slot)
        await producer.send(b"grouped", txn=prepared)
        await prepared.prepare()
        await epoch.begin_transaction()
        await (await epoch.send(topic, b"lost"))
        assert victim.proc is not None
        victim.proc.send_signal(signal.SIGKILL)
        with pytest.raises(errors.TxnbufError):
            await epoch.commit_transaction()
        await epoch.abort_transaction()
        await epoch.begin_transaction()
        await epoch.send(topic, b"after")
        await epoch.commit_transaction()
        assert epoch._conn.url != victim.url
        result = await groups.commit("job", 1, [prepared.id])
        assert result.committed == 1 and not result.duplicate
        got = [(await reader.read_next(timeout=60)).value for _ in range(3)]
        assert sorted(got) == [b"after", b"before", b"grouped"]
        with pytest.raises(errors.OperationTimeoutError):
            await reader.read_next(timeout=1.0)
