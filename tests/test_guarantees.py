"""The README's Guarantees that no other test states as directly: what a
returned call leaves on disk when the broker is killed right after, a
transaction's messages together and in the order sent, and repeated
acknowledgements, commits and aborts (docs/guarantees.md maps every
sentence to its tests)."""

from __future__ import annotations

import pytest

from client import Client, Consumer, errors
from tests.conftest import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.crash]


async def _drain(consumer: Consumer, timeout: float = 2.0) -> list[bytes]:
    """What comes until ``timeout`` passes with nothing."""
    got: list[bytes] = []
    while batch := await consumer.batch_receive(max_messages=1000, timeout=timeout):
        got += [m.value for m in batch]
    return got


async def test_what_a_returned_call_did_survives_a_sigkill_right_after(
    broker: BrokerProcess,
) -> None:
    """A send, an acknowledgement and a commit, each killed right after it
    returned: after the restart the send is there, the acknowledged message
    does not come again, and the committed transaction is whole."""
    async with Client(broker.url) as client:
        sub = await client.subscribe("durable", "s", initial_position="earliest")
        producer = await client.create_producer("durable")
        await producer.send(b"acked")
        await sub.acknowledge(await sub.receive(timeout=10))
        async with client.transaction() as txn:
            for i in range(5):
                await producer.send(b"txn %d" % i, txn=txn)
        await producer.send(b"plain")
        broker.kill()
    broker.start()
    async with Client(broker.url) as client:
        sub = await client.subscribe("durable", "s", initial_position="earliest")
        assert await _drain(sub) == [b"txn 0", b"txn 1", b"txn 2", b"txn 3", b"txn 4", b"plain"]


async def test_a_transactions_messages_come_together_in_the_order_sent(
    broker: BrokerProcess,
) -> None:
    """Two transactions and plain sends interleaved on one partition: each
    transaction's messages are delivered one after another, in the order
    it sent them, where it committed."""
    async with Client(broker.url) as client:
        sub = await client.subscribe("together", "s", initial_position="earliest")
        producer = await client.create_producer("together")
        first = await client.new_transaction()
        second = await client.new_transaction()
        for i in range(20):
            await producer.send(b"a%d" % i, txn=first)
            await producer.send(b"b%d" % i, txn=second)
            await producer.send(b"plain %d" % i)
        await second.commit()
        await first.commit()
        got = await _drain(sub)
    plain = [b"plain %d" % i for i in range(20)]
    a = [b"a%d" % i for i in range(20)]
    b = [b"b%d" % i for i in range(20)]
    assert got == [*plain, *b, *a]


async def test_repeated_acknowledgements_commits_and_aborts(broker: BrokerProcess) -> None:
    """An acknowledgement made again succeeds and changes nothing (plainly,
    in one transaction, or after a transaction acknowledged it); a commit
    or an abort made again returns as the first did; the other end of an
    ended transaction is refused with InvalidTxnStatusError."""
    async with Client(broker.url) as client:
        sub = await client.subscribe("again", "s", initial_position="earliest")
        producer = await client.create_producer("again")
        for value in (b"one", b"two", b"three"):
            await producer.send(value)
        one, two, three = [await sub.receive(timeout=10) for _ in range(3)]
        await sub.acknowledge(one)
        await sub.acknowledge(one)
        committed = await client.new_transaction()
        await sub.acknowledge(two, txn=committed)
        await sub.acknowledge(two, txn=committed)
        await committed.commit()
        await committed.commit()
        await sub.acknowledge(two)  # (acknowledged by the commit already)
        with pytest.raises(errors.InvalidTxnStatusError) as refused:
            await committed.abort()
        assert refused.value.code == errors.InvalidTxnStatusError.code
        aborted = await client.new_transaction()
        await sub.acknowledge(three, txn=aborted)
        await aborted.abort()
        await aborted.abort()
        with pytest.raises(errors.InvalidTxnStatusError):
            await aborted.commit()
        await sub.close()
        # Only `three` is left: its acknowledgement was aborted.
        again = await client.subscribe("again", "s")
        assert (await again.receive(timeout=10)).value == b"three"
        assert await _drain(again, timeout=1.0) == []
