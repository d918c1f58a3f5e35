"""READ_UNCOMMITTED isolation (PIP-31 §Isolation Levels).

A read_uncommitted subscription gets the messages of transactional sends as
soon as they are in the transaction buffer (open, later committed or later
aborted), each once (commit markers are skipped), with ids whose entry id is
-2 - the sidecar entry id; plain acks of them are durable, unacked ones are
redelivered, and the sweep keeps what it has not acknowledged. First on a
real LedgerStore in process, then through the real broker and client.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from buffer import Partition, Topics
from client import Client, errors
from ledger import LedgerStore
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions import Consumer, MsgState, PartitionSubscription, SubType
from subscriptions._uncommitted import UncommittedCursor, from_wire, to_wire
from tests.conftest import BrokerProcess, until

Got = list[tuple[int, int, bytes]]  # (entry id, index, payload)
T1, T2 = (1, 1), (1, 2)


def msgs(*payloads: bytes, seq: int = 0) -> list[pb.SingleMessage]:
    return [pb.SingleMessage(payload=p, sequence_id=seq + i) for i, p in enumerate(payloads)]


def consumer(got: Got, *, read_uncommitted: bool = True) -> Consumer:
    def push(_c: Consumer, entries: list[pb.DeliveredEntry]) -> None:
        for e in entries:
            batch = pb.EntryBatch.FromString(e.data)
            indexes = list(e.indexes) or list(range(len(batch.messages)))
            got.extend((e.entry_id, i, batch.messages[i].payload) for i in indexes)

    c = Consumer(1, "c", "t", "s", SubType.EXCLUSIVE, push, read_uncommitted=read_uncommitted)
    c.permits = 1000
    return c


async def open_partition(path: Path) -> tuple[LedgerStore, Partition]:
    store = await LedgerStore.open(path)
    topics = await Topics.load(store)
    topic = topics.get("t") or await topics.create("t", 1)
    return store, topic.partitions[0]


def test_wire_ids_and_cursor() -> None:
    assert to_wire((0, 3)) == (-2, 3) and from_wire((-2, 3)) == (0, 3)
    assert from_wire(to_wire((41, 0))) == (41, 0)
    c = UncommittedCursor()
    c.note(0, 2)
    c.note(1, 0)  # a commit record: nothing to acknowledge
    c.note(2, 1)
    assert c.ack([(0, 1)]) == [(0, 1)] and c.mark_delete == -1
    assert c.ack([(0, 1)]) == []  # again: nothing changes
    assert c.ack([(0, 0)]) == [(0, 0)] and c.mark_delete == 1 and not c.acked
    assert c.state((2, 0)) is MsgState.PENDING and c.state((1, 5)) is MsgState.DELETED
    again = UncommittedCursor.from_snapshot(c.snapshot())
    assert again.mark_delete == 1 and again.state((2, 0)) is MsgState.PENDING
    c.skip_to(5)
    assert c.mark_delete == 5 and c.state((3, 0)) is MsgState.DELETED


async def test_open_aborted_and_committed_messages_come_once(tmp_path: Path) -> None:
    store, part = await open_partition(tmp_path / "b.db")
    try:
        sub = await PartitionSubscription.create(part, "s", earliest=True, read_uncommitted=True)
        committed = await PartitionSubscription.create(part, "rc", earliest=True)
        sub.start()
        committed.start()
        got: Got = []
        seen_rc: Got = []
        sub.add_consumer(consumer(got))
        committed.add_consumer(consumer(seen_rc, read_uncommitted=False))
        await part.publish("plain", msgs(b"p0"))
        buffer = await part.txn_buffer()
        await buffer.publish(T1, "p", msgs(b"a0", b"a1"))
        await buffer.publish(T2, "q", msgs(b"b0"))
        # Open transactions: read uncommitted sees them, read committed does not.
        await until(lambda: {p for _, _, p in got} == {b"p0", b"a0", b"a1", b"b0"})
        assert [p for _, _, p in seen_rc] == [b"p0"]
        await buffer.end(T1, commit=True)
        await buffer.end(T2, commit=False)
        await part.publish("plain", msgs(b"p1", seq=1))
        await until(lambda: len(got) == 5 and len(seen_rc) == 4)
        await asyncio.sleep(0.05)
        # Each message once: the commit marker is skipped, the abort changes nothing seen.
        assert sorted(p for _, _, p in got) == [b"a0", b"a1", b"b0", b"p0", b"p1"]
        assert [p for _, _, p in seen_rc] == [b"p0", b"a0", b"a1", b"p1"]
        sidecar_ids = {e for e, _, p in got if p in (b"a0", b"a1", b"b0")}
        assert all(e < -1 for e in sidecar_ids)
        await sub.close()
        await committed.close()
    finally:
        await store.close()


async def test_acks_are_durable_and_unacked_come_again(tmp_path: Path) -> None:
    store, part = await open_partition(tmp_path / "b.db")
    try:
        sub = await PartitionSubscription.create(part, "s", earliest=True, read_uncommitted=True)
        sub.start()
        got: Got = []
        first = consumer(got)
        sub.add_consumer(first)
        buffer = await part.txn_buffer()
        await buffer.publish(T1, "p", msgs(b"x0", b"x1", b"x2"))
        await until(lambda: len(got) == 3)
        by_payload = {p: (e, i) for e, i, p in got}
        await sub.ack([by_payload[b"x0"], by_payload[b"x2"]], cumulative=False)
        assert sub.state(by_payload[b"x0"]) is MsgState.DELETED
        with pytest.raises(refusals.Refusal, match="plain individual"):
            await sub.ack([by_payload[b"x1"]], cumulative=False, txn=T2)
        with pytest.raises(refusals.Refusal, match="plain individual"):
            await sub.ack([by_payload[b"x1"]], cumulative=True)
        # The consumer leaves: the unacked message comes again to the next one.
        sub.remove_consumer(first)
        again: Got = []
        sub.add_consumer(consumer(again))
        await until(lambda: len(again) == 1)
        assert [p for _, _, p in again] == [b"x1"]
        await sub.close()
    finally:
        await store.close()
    # After a restart: the acks hold, the rest is delivered again.
    store, part = await open_partition(tmp_path / "b.db")
    try:
        ledger = store.get_ledger(PartitionSubscription.ledger_name("t", 0, "s"))
        assert ledger is not None
        sub = await PartitionSubscription.load(part, "s", ledger)
        assert sub.read_uncommitted
        sub.start()
        after: Got = []
        sub.add_consumer(consumer(after))
        await until(lambda: len(after) == 1)
        await asyncio.sleep(0.05)
        assert [p for _, _, p in after] == [b"x1"]
        await sub.ack([(after[0][0], after[0][1])], cumulative=False)
        assert sub.uncommitted is not None and sub.uncommitted_floor() == 1  # record 0 done
        # The isolation level is a property of the subscription.
        with pytest.raises(refusals.Refusal, match="isolation"):
            sub.check_can_add(consumer([], read_uncommitted=False))
        await sub.close()
    finally:
        await store.close()


async def test_sweep_keeps_what_a_read_uncommitted_subscription_still_needs(
    tmp_path: Path,
) -> None:
    store, part = await open_partition(tmp_path / "b.db")
    try:
        sub = await PartitionSubscription.create(part, "s", earliest=True, read_uncommitted=True)
        buffer = await part.txn_buffer()
        await buffer.publish(T1, "p", msgs(b"gone"))
        await buffer.end(T1, commit=False)  # aborted: the sweep may reclaim it
        floor = sub.uncommitted_floor()
        assert floor == 0
        await buffer.sweep(floor)
        assert buffer.sidecar.first_entry_id == 0  # kept for the subscription
        sub.start()
        got: Got = []
        sub.add_consumer(consumer(got))
        await until(lambda: len(got) == 1)
        await sub.ack([(got[0][0], got[0][1])], cumulative=False)
        # The data record is acknowledged; the abort (and snapshot) records hold nothing.
        await until(lambda: (sub.uncommitted_floor() or 0) > 1)
        await buffer.sweep(sub.uncommitted_floor())
        assert buffer.sidecar.first_entry_id > 0
        await sub.close()
    finally:
        await store.close()


async def test_read_uncommitted_through_the_broker(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        dirty = await client.subscribe(
            "ru", "dirty", initial_position="earliest", read_uncommitted=True
        )
        clean = await client.subscribe("ru", "clean", initial_position="earliest")
        producer = await client.create_producer("ru")
        txn = await client.new_transaction()
        txn.flush()  # (the full path: held in the client, nothing is in the sidecar)
        await producer.send(b"in flight", txn=txn)
        msg = await dirty.receive(timeout=10)
        assert msg.value == b"in flight" and msg.message_id.entry_id < -1
        with pytest.raises(errors.OperationTimeoutError):
            await clean.receive(timeout=0.3)  # read committed: not yet
        await dirty.acknowledge(msg)
        await txn.abort()
        await producer.send(b"plain")
        assert (await dirty.receive(timeout=10)).value == b"plain"
        assert (await clean.receive(timeout=10)).value == b"plain"
        with pytest.raises(errors.NotAllowedError, match="isolation"):
            await client.subscribe("ru", "clean", read_uncommitted=True)
        # A local transaction's messages never pass the sidecar: read
        # uncommitted, they come once committed, as committed ones.
        async with client.transaction() as local:
            await producer.send(b"local", txn=local)
        for consumer in (dirty, clean):
            got = await consumer.receive(timeout=10)
            assert got.value == b"local" and got.message_id.entry_id >= 0
            await consumer.acknowledge(got)
    status = broker.admin("GET", "/admin/v1/topics/ru/stats")
    assert status[0] == 200
