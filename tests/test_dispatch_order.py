"""Dispatch order when a consumer changes while dispatch awaits a read.

Both found by `txnbuf check` under broker kills. (1) A dispatch step that
awaited a commit marker's materialization went on delivering newer entries
to a consumer that had joined meanwhile, ahead of the messages the consumer
that left had to have redelivered. (2) The same inside a redelivery step:
it read entry after entry, and a consumer that joined during one of those
reads got the rest of the step's (newer) entries before the ones its
predecessor had just given back. An exclusive consumer then saw offsets go
backwards within one session (Jepsen: nonmonotonic-poll), and acked a newer
message before an older one, which a later session saw as a skip.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from buffer import Partition, Topics
from ledger import Entry, LedgerStore
from proto import txnbuf_pb2 as pb
from subscriptions import Consumer, PartitionSubscription, SubType
from tests.conftest import until


def consumer(name: str, got: list[tuple[str, int]]) -> Consumer:
    def push(c: Consumer, entries: list[pb.DeliveredEntry]) -> None:
        got.extend((c.name, e.entry_id) for e in entries)

    return Consumer(1, name, "t", "s", SubType.EXCLUSIVE, push)


async def plain_then_markers(store: LedgerStore) -> Partition:
    """Partition t-0 holding a plain entry (0), then three commit markers (1..3)."""
    topics = await Topics.load(store)
    part = (await topics.create("t", 1)).partitions[0]
    await part.publish("p", [pb.SingleMessage(payload=b"plain", sequence_id=0)])
    buffer = await part.txn_buffer()
    for n in range(3):
        txn = (0, n)
        await buffer.publish(txn, "p", [pb.SingleMessage(payload=b"t%d" % n, sequence_id=1)])
        await buffer.end(txn, True)
    return part


def slow_materialize(
    part: Partition, monkeypatch: pytest.MonkeyPatch
) -> tuple[asyncio.Event, asyncio.Event]:
    """Make ``part`` materialize a marker only once the returned gate is set;
    the second event is set when a materialization is waiting."""
    gate, entered = asyncio.Event(), asyncio.Event()
    real = Partition.materialize

    async def slow(self: Partition, entry: Entry) -> bytes:
        if self is part:
            entered.set()
            await gate.wait()
        return await real(self, entry)

    # (On the class: a Partition has slots, no attributes of its own to patch.)
    monkeypatch.setattr(Partition, "materialize", slow)
    return gate, entered


async def test_redeliveries_go_first_even_if_the_consumer_changes_mid_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(tmp_path / "b.db")
    try:
        part = await plain_then_markers(store)
        assert part.ledger.last_entry_id == 3

        gate, entered = slow_materialize(part, monkeypatch)
        sub = await PartitionSubscription.create(part, "s", earliest=True)
        sub.start()
        got: list[tuple[str, int]] = []
        a, b = consumer("a", got), consumer("b", got)
        sub.add_consumer(a)
        a.add_permits(100)
        # Entry 0 goes to a; the step then waits on marker 1.
        await asyncio.wait_for(entered.wait(), 5)
        assert sub.pending == {(0, 0): a}
        sub.remove_consumer(a)  # entry 0 is to be redelivered
        sub.add_consumer(b)
        b.add_permits(100)
        gate.set()
        await until(lambda: len([g for g in got if g[0] == "b"]) == 4)
        assert [e for who, e in got if who == "b"] == [0, 1, 2, 3]
        await sub.close()
    finally:
        await store.close()


async def test_a_redelivery_step_keeps_order_when_the_consumer_changes_mid_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(tmp_path / "b.db")
    try:
        part = await plain_then_markers(store)
        sub = await PartitionSubscription.create(part, "s", earliest=True)
        sub.start()
        got: list[tuple[str, int]] = []
        a, b, c = consumer("a", got), consumer("b", got), consumer("c", got)
        sub.add_consumer(a)
        a.add_permits(100)
        await until(lambda: len(got) == 4)
        assert [e for who, e in got if who == "a"] == [0, 1, 2, 3]

        gate, entered = slow_materialize(part, monkeypatch)
        sub.remove_consumer(a)  # all four are to be redelivered
        sub.add_consumer(b)
        b.add_permits(100)
        # The redelivery step for b waits on marker 1 (entry 0 needs no wait).
        await asyncio.wait_for(entered.wait(), 5)
        sub.remove_consumer(b)
        sub.add_consumer(c)
        c.add_permits(100)
        gate.set()
        await until(lambda: len([g for g in got if g[0] == "c"]) >= 4)
        await asyncio.sleep(0.05)
        # c gets everything in order, whatever b got before it left.
        assert [e for who, e in got if who == "c"] == [0, 1, 2, 3], got
        await sub.close()
    finally:
        await store.close()
