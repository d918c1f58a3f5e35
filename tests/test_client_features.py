"""The client features Pulsar users expect, against the real broker
(docs/client.md): batch receive and ``async for``, transactional sends and
acks that return once queued, and the rest of ``client``'s Pulsar-like
surface.
"""

from __future__ import annotations

import asyncio
import json
import time
import zlib

import pytest

from client import Client, DeadLetterPolicy, MessageId, TxnState, errors
from proto import MAX_MESSAGE_SIZE
from proto import txnbuf_pb2 as pb
from tests.conftest import BrokerProcess, RawConnection, send_command, until

T = pb.BaseCommand

pytestmark = pytest.mark.integration


# --- batch_receive and async for ---------------------------------------------------


async def test_batch_receive_returns_a_full_batch_at_once(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        producer = await client.create_producer("t")
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(25)))
        await until(lambda: len(consumer._queue) == 25, "all 25 in the receive queue")
        started = time.monotonic()
        first = await consumer.batch_receive(max_messages=10, timeout=5)
        assert time.monotonic() - started < 1  # full: no wait for the timeout
        second = await consumer.batch_receive(max_messages=10, timeout=5)
        rest = await consumer.batch_receive(max_messages=10, timeout=0.2)  # 5 left: timeout
        values = [m.value for m in first + second + rest]
        assert values == [b"%d" % i for i in range(25)]
        assert [len(first), len(second), len(rest)] == [10, 10, 5]
        assert await consumer.batch_receive(max_messages=10, timeout=0.1) == []
        await consumer.acknowledge(first + second + rest)


async def test_batch_receive_waits_for_the_batch_to_fill_or_the_timeout(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        producer = await client.create_producer("t")
        waiting = asyncio.ensure_future(consumer.batch_receive(max_messages=3, timeout=10))
        await producer.send(b"a")
        await asyncio.sleep(0.2)
        assert not waiting.done()  # 1 of 3
        await asyncio.gather(producer.send(b"b"), producer.send(b"c"))
        batch = await asyncio.wait_for(waiting, 5)
        assert [m.value for m in batch] == [b"a", b"b", b"c"]
        # timeout=None: the first message, with what is queued behind it
        first = asyncio.ensure_future(consumer.batch_receive(max_messages=50, timeout=None))
        await asyncio.sleep(0.2)
        assert not first.done()
        await producer.send(b"d")
        assert [m.value for m in await asyncio.wait_for(first, 5)] == [b"d"]


async def test_batch_receive_refuses_bad_arguments(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s")
        for bad in (0, -1, 1.5, "3"):
            with pytest.raises(errors.InvalidInputError, match="max_messages"):
                await consumer.batch_receive(max_messages=bad)  # type: ignore[arg-type]
        with pytest.raises(errors.InvalidInputError, match="timeout"):
            await consumer.batch_receive(timeout=-1)
        await consumer.close()
        with pytest.raises(errors.ConsumerClosedError):
            await consumer.batch_receive()


async def test_close_wakes_a_waiting_batch_receive(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s")
        waiting = asyncio.ensure_future(consumer.batch_receive(max_messages=5, timeout=30))
        await asyncio.sleep(0.1)
        await consumer.close()
        with pytest.raises(errors.ConsumerClosedError):
            await asyncio.wait_for(waiting, 5)


async def test_async_for_yields_messages_until_the_consumer_is_closed(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        producer = await client.create_producer("t")
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(5)))
        got = []

        async def read() -> None:
            async for msg in consumer:
                got.append(msg.value)
                await consumer.acknowledge(msg)
                if len(got) == 5:
                    asyncio.get_running_loop().call_soon(
                        lambda: asyncio.ensure_future(consumer.close())
                    )

        await asyncio.wait_for(read(), 10)  # ends once closed
        assert got == [b"%d" % i for i in range(5)]


# --- transactional sends and acks return once queued -------------------------------


async def test_the_readme_loop_commits_sends_and_acks(broker: BrokerProcess) -> None:
    """Per message an awaited send and ack in the transaction: each returns
    at once with its place, and the commit makes them all visible."""
    async with Client(broker.url) as client:
        seeder = await client.create_producer("in")
        await asyncio.gather(*(seeder.send(b"m%d" % i) for i in range(30)))
        consumer = await client.subscribe("in", "copier", initial_position="earliest")
        producer = await client.create_producer("out")
        reader = await client.subscribe("out", "reader", initial_position="earliest")
        batch = await consumer.batch_receive(max_messages=30, timeout=5)
        assert len(batch) == 30
        ids = []
        async with client.transaction() as txn:
            for msg in batch:
                ids.append(await producer.send(msg.value.upper(), txn=txn))
                await consumer.acknowledge(msg, txn=txn)
        assert ids == [MessageId(0, -1, i) for i in range(30)]
        assert txn.state is TxnState.COMMITTED
        got = [await reader.receive(timeout=5) for _ in range(30)]
        assert [m.value for m in got] == [b"M%d" % i for i in range(30)]
        # The final ids: the commit marker's entry id, the same places.
        (marker,) = {m.message_id.entry_id for m in got}
        assert [m.message_id for m in got] == [MessageId(0, marker, i) for i in range(30)]
        await consumer.redeliver_unacknowledged()
        assert await consumer.batch_receive(max_messages=1, timeout=0.5) == []  # all acked


async def test_two_producers_in_one_transaction_get_the_places_the_broker_gives(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        a = await client.create_producer("out")
        b = await client.create_producer("out")
        reader = await client.subscribe("out", "reader", initial_position="earliest")
        async with client.transaction() as txn:
            ids = [await p.send(b"%d" % i, txn=txn) for i, p in enumerate([a, b, b, a, b])]
        assert ids == [MessageId(0, -1, i) for i in range(5)]
        got = [await reader.receive(timeout=5) for _ in range(5)]
        assert [(m.value, m.message_id.batch_index) for m in got] == [
            (b"%d" % i, i) for i in range(5)
        ]


async def test_a_refused_transactional_send_is_raised_by_commit(broker: BrokerProcess) -> None:
    """A send the broker refuses (its transaction timed out on the
    coordinator) returns at once; the commit raises and nothing is stored."""
    async with Client(broker.url) as client:
        producer = await client.create_producer("out")
        txn = await client.new_transaction(timeout=0.2)
        await asyncio.sleep(1.0)  # the coordinator aborts it
        assert await producer.send(b"late", txn=txn) == MessageId(0, -1, 0)
        with pytest.raises(errors.TransactionTimeoutError):
            await txn.commit()
        assert txn.state is TxnState.ABORTED
        reader = await client.subscribe("out", "reader", initial_position="earliest")
        assert await reader.batch_receive(max_messages=5, timeout=0.5) == []


async def test_a_conflicting_transactional_ack_is_raised_by_commit(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        seeder = await client.create_producer("in")
        await seeder.send(b"x")
        consumer = await client.subscribe("in", "s", "shared", initial_position="earliest")
        (msg,) = await consumer.batch_receive(max_messages=1, timeout=5)
        holder, loser = await client.new_transaction(), await client.new_transaction()
        await consumer.acknowledge(msg, txn=loser)  # returns: held
        await consumer.acknowledge(msg, txn=holder)
        await holder.commit()  # (its local commit takes the message first)
        with pytest.raises(errors.TransactionConflictError):
            await loser.commit()
        assert loser.state is TxnState.ABORTED
        # On the full path, the second ack is refused once the first holds it.
        holder, loser = await client.new_transaction(), await client.new_transaction()
        holder.flush()
        loser.flush()
        await seeder.send(b"y")
        (msg,) = await consumer.batch_receive(max_messages=1, timeout=5)
        await consumer.acknowledge(msg, txn=holder)
        await consumer.acknowledge(msg, txn=loser)  # returns: queued
        with pytest.raises(errors.TransactionConflictError):
            await loser.commit()
        assert loser.state is TxnState.ABORTED
        await holder.commit()


async def test_an_abort_right_behind_acks_redelivers_their_messages(
    broker: BrokerProcess,
) -> None:
    """abort() goes right behind acks it did not wait for; the broker aborts
    them with the transaction, so their messages come again."""
    async with Client(broker.url) as client:
        seeder = await client.create_producer("in")
        await asyncio.gather(*(seeder.send(b"%d" % i) for i in range(10)))
        consumer = await client.subscribe("in", "s", "shared", initial_position="earliest")
        batch = await consumer.batch_receive(max_messages=10, timeout=5)
        producer = await client.create_producer("out")
        txn = await client.new_transaction()
        for msg in batch:
            await producer.send(msg.value, txn=txn)
            await consumer.acknowledge(msg, txn=txn)
        await txn.abort()
        again = await consumer.batch_receive(max_messages=10, timeout=5)
        assert sorted(m.value for m in again) == sorted(m.value for m in batch)
        assert all(m.redelivery_count == 1 for m in again)


# --- deduplication across producer restarts -----------------------------------------

OLD = 1300  # entries enough that the first are too old to place after a restart


async def stored_one_per_entry(client: Client, n: int) -> list[MessageId]:
    """Send ``n`` messages of producer "app-1" (sequence ids 0..n-1), each
    an entry of its own; their ids."""
    producer = await client.create_producer("d", producer_name="app-1", batching_max_messages=1)
    ids = await asyncio.gather(*(producer.send(b"%d" % i, sequence_id=i) for i in range(n)))
    assert len({m.entry_id for m in ids}) == n
    await producer.close()
    return ids


async def expect_each_once(client: Client, n: int) -> None:
    """Topic "d" holds the values 0..n-1, each once, in order."""
    reader = await client.subscribe("d", "reader", initial_position="earliest")
    got = []
    while batch := await reader.batch_receive(max_messages=1000, timeout=1):
        got += batch
    assert [m.value for m in got] == [b"%d" % i for i in range(n)]


async def test_a_producer_made_again_gets_the_original_ids_of_what_it_resends(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        reader = await client.subscribe("d", "reader", initial_position="earliest")
        first = await client.create_producer("d", producer_name="app-1")
        ids = [await first.send(b"%d" % i, sequence_id=i) for i in range(5)]
        await first.close()  # (the application restarts)
        again = await client.create_producer("d", producer_name="app-1")
        assert again.last_sequence_id == 4
        # It cannot tell what was stored: it sends 3.. again, then goes on.
        resent = [await again.send(b"%d" % i, sequence_id=i) for i in range(3, 7)]
        assert resent[:2] == ids[3:] and not any(m.is_duplicate for m in resent)
        assert resent[2] > ids[-1]  # new ones stored after
        assert await again.send(b"7") == MessageId(0, resent[3].entry_id + 1, 0)
        got = await reader.batch_receive(max_messages=100, timeout=1)
        assert [m.value for m in got] == [b"%d" % i for i in range(8)]  # never twice


async def test_a_duplicate_too_old_to_place_is_answered_as_a_duplicate(
    broker: BrokerProcess,
) -> None:
    """After a broker restart a partition replays its entries from its last
    dedup snapshot (every 1,000 entries) or its last 256, whichever is
    earlier: an older re-sent message is known to be stored, not where."""
    async with Client(broker.url) as client:
        ids = await stored_one_per_entry(client, OLD)
    broker.restart()
    async with Client(broker.url) as client:
        again = await client.create_producer("d", producer_name="app-1")
        assert again.last_sequence_id == OLD - 1
        old, recent, new = [
            await again.send(b"%d" % i, sequence_id=i) for i in (0, OLD - 1, OLD)
        ]  # (one at a time: each its own send)
        assert old.is_duplicate and old == MessageId(0, -1, -1)
        assert recent == ids[-1] and not recent.is_duplicate
        assert not new.is_duplicate and new.entry_id > ids[-1].entry_id
        await expect_each_once(client, OLD + 1)


async def test_resent_and_new_messages_in_one_send(broker: BrokerProcess) -> None:
    """A frame mixing re-sent ids (known and too old) and new ones: each is
    answered, the new ones are stored, once."""
    async with Client(broker.url) as client:
        ids = await stored_one_per_entry(client, OLD)
    broker.restart()
    async with Client(broker.url) as client:
        again = await client.create_producer("d", producer_name="app-1")
        resent = (1, OLD - 2, OLD - 1, OLD, OLD + 1)
        answers = await asyncio.gather(*(again.send(b"%d" % i, sequence_id=i) for i in resent))
        assert answers[0].is_duplicate and answers[1:3] == ids[-2:]
        assert answers[3:] == [MessageId(0, answers[3].entry_id, i) for i in range(2)]
        await expect_each_once(client, OLD + 2)


# --- seek and unsubscribe ---------------------------------------------------------------


async def test_seek_to_a_message_id_delivers_from_it_again(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        producer = await client.create_producer("t")
        ids = [await producer.send(b"%d" % i) for i in range(6)]
        first = await consumer.batch_receive(max_messages=6, timeout=5)
        await consumer.acknowledge(first)
        await consumer.seek(ids[2])  # back
        again = await consumer.batch_receive(max_messages=10, timeout=1)
        assert [m.value for m in again] == [b"2", b"3", b"4", b"5"]
        await consumer.acknowledge(again)
        await consumer.seek(first[4])  # a Message will do; forward past nothing new
        assert [m.value for m in await consumer.batch_receive(max_messages=10, timeout=1)] == [
            b"4",
            b"5",
        ]


async def test_seek_to_a_time_delivers_what_was_published_from_then(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        producer = await client.create_producer("t")
        await producer.send(b"old")
        await asyncio.sleep(0.05)
        since = int(time.time() * 1000)
        await asyncio.sleep(0.05)
        await producer.send(b"new")
        got = await consumer.batch_receive(max_messages=2, timeout=5)
        await consumer.acknowledge(got)
        await consumer.seek(since)
        assert [m.value for m in await consumer.batch_receive(max_messages=5, timeout=1)] == [
            b"new"
        ]
        await consumer.seek(0)  # the beginning of time: everything kept
        values = [m.value for m in await consumer.batch_receive(max_messages=5, timeout=1)]
        assert values == [b"old", b"new"]


async def test_seek_refuses_bad_targets_and_a_subscription_a_transaction_holds(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        producer = await client.create_producer("t")
        await producer.send(b"x")
        (msg,) = await consumer.batch_receive(max_messages=1, timeout=5)
        for bad in (-1, 1.5, "0:1:0", True, MessageId(0, -1, 0)):
            with pytest.raises(errors.InvalidInputError):
                await consumer.seek(bad)  # type: ignore[arg-type]
        txn = await client.new_transaction()
        txn.flush()  # (the full path: the ack is written before the commit)
        await consumer.acknowledge(msg, txn=txn)
        await asyncio.sleep(0.2)  # (the broker holds it PENDING_ACK)
        with pytest.raises(errors.NotAllowedError, match="PENDING_ACK"):
            await consumer.seek(0)
        await txn.commit()
        await consumer.seek(0)  # nothing holds it now
        assert [m.value for m in await consumer.batch_receive(max_messages=5, timeout=1)] == [b"x"]


async def test_unsubscribe_deletes_the_subscription_and_closes_the_consumer(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        producer = await client.create_producer("t")
        await producer.send(b"unread")
        await consumer.unsubscribe()
        with pytest.raises(errors.ConsumerClosedError):
            await consumer.receive(timeout=0.1)
        status, body = broker.admin("GET", "/admin/v1/topics/t/stats")
        assert status == 200 and json.loads(body)["partitions"][0]["subscriptions"] == {}
        # Subscribing again makes a new subscription, at its initial position.
        again = await client.subscribe("t", "s", initial_position="latest")
        await producer.send(b"after")
        assert [m.value for m in await again.batch_receive(max_messages=5, timeout=1)] == [b"after"]


async def test_unsubscribe_is_refused_while_another_consumer_is_connected(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        one = await client.subscribe("t", "s", "shared", initial_position="earliest")
        other = await client.subscribe("t", "s", "shared")
        with pytest.raises(errors.NotAllowedError, match="1 other consumer"):
            await one.unsubscribe()
        producer = await client.create_producer("t")
        await producer.send(b"still here")  # the consumer still works
        got = await one.batch_receive(max_messages=1, timeout=1) or await other.batch_receive(
            max_messages=1, timeout=1
        )
        assert [m.value for m in got] == [b"still here"]
        await other.close()
        await one.unsubscribe()


# --- the message size limit -------------------------------------------------------------


async def test_a_message_over_max_message_size_is_refused_before_it_is_sent(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("big", "s", initial_position="earliest")
        producer = await client.create_producer("big")
        with pytest.raises(errors.MessageTooBigError, match=r"over max_message_size \(5,242,880"):
            await producer.send(b"x" * MAX_MESSAGE_SIZE)
        with pytest.raises(errors.MessageTooBigError, match="max_message_size"):
            await producer.send(b"x", properties={"p": "y" * MAX_MESSAGE_SIZE})
        assert producer.pending == 0
        # Up to the limit a message goes, alone in its frame if need be
        # (bigger than a batch may be, 1 MiB).
        big = b"b" * (MAX_MESSAGE_SIZE - 64)
        middle = b"m" * (2 * 1024 * 1024)
        ids = await asyncio.gather(
            producer.send(b"small"), producer.send(big), producer.send(middle)
        )
        assert len({m.entry_id for m in ids}) == 3
        got = [await consumer.receive(timeout=10) for _ in range(3)]
        assert [m.value for m in got] == [b"small", big, middle]


async def test_the_broker_refuses_a_message_over_max_message_size(broker: BrokerProcess) -> None:
    """A client that does not check is refused by the broker, naming the
    limit; the connection goes on."""
    async with RawConnection(broker.url) as raw:
        created = await raw.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(request_id=1, producer_id=1, topic="big", producer_name="p"),
        )
        assert created.type == T.PRODUCER_SUCCESS
        too_big = pb.SingleMessage(payload=b"x" * MAX_MESSAGE_SIZE, sequence_id=0)
        answer = await raw.request(
            T.SEND, "send", send_command(too_big, producer_id=1, request_id=2)
        )
        assert answer.type == T.SEND_ERROR and answer.send_error.error == pb.INVALID_ARGUMENT
        assert "over max_message_size (5,242,880 bytes)" in answer.send_error.message
        fine = pb.SingleMessage(payload=b"ok", sequence_id=1)
        answer = await raw.request(T.SEND, "send", send_command(fine, producer_id=1, request_id=3))
        assert answer.type == T.SEND_RECEIPT


async def test_the_transactional_producer_refuses_a_message_over_the_limit(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_transactional_producer("big-1")
        await producer.init_transactions()
        await producer.begin_transaction()
        with pytest.raises(errors.MessageTooBigError, match="max_message_size"):
            await producer.send("big", b"x" * MAX_MESSAGE_SIZE)
        with pytest.raises(errors.MessageTooBigError, match="max_message_size"):
            await producer.send("big", b"x", key="k" * MAX_MESSAGE_SIZE)
        # Messages adding up to more than a frame may hold go in several.
        sent = [await producer.send("big", b"y" * (1024 * 1024)) for _ in range(8)]
        await producer.commit_transaction()
        assert all(f.done() and not f.exception() for f in sent)
        reader = await client.subscribe("big", "r", initial_position="earliest")
        got = [await reader.receive(timeout=10) for _ in range(8)]
        assert all(len(m.value) == 1024 * 1024 for m in got)


# --- negative acks: a delay, and a redelivery limit with a dead letter topic ------------


async def test_a_negative_ack_redelivers_after_the_delay(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe(
            "n", "s", initial_position="earliest", negative_ack_redelivery_delay=0.5
        )
        producer = await client.create_producer("n")
        await producer.send(b"again")
        msg = await consumer.receive(timeout=5)
        started = time.monotonic()
        await consumer.negative_acknowledge(msg)
        with pytest.raises(errors.OperationTimeoutError):
            await consumer.receive(timeout=0.3)
        again = await consumer.receive(timeout=5)
        assert time.monotonic() - started >= 0.5
        assert again.message_id == msg.message_id and again.redelivery_count == 1
        with pytest.raises(errors.InvalidInputError, match="negative_ack_redelivery_delay"):
            await client.subscribe("n", "t", negative_ack_redelivery_delay=-1)


async def test_a_message_redelivered_too_often_goes_to_the_dead_letter_topic(
    broker: BrokerProcess,
) -> None:
    policy = DeadLetterPolicy(max_redeliver_count=2, initial_subscription_name="ops")
    async with Client(broker.url) as client:
        consumer = await client.subscribe(
            "orders",
            "billing",
            "shared",
            initial_position="earliest",
            negative_ack_redelivery_delay=0.05,
            dead_letter_policy=policy,
        )
        producer = await client.create_producer("orders")
        poison = await producer.send(b"poison", key="k", properties={"p": "1"})
        await producer.send(b"fine")
        seen = []
        for _ in range(4):  # the first delivery and 2 redeliveries of poison, and fine
            msg = await consumer.receive(timeout=5)
            seen.append((msg.value, msg.redelivery_count))
            if msg.value == b"poison":
                await consumer.negative_acknowledge(msg)
            else:
                await consumer.acknowledge(msg)
        assert sorted(seen) == [(b"fine", 0), (b"poison", 0), (b"poison", 1), (b"poison", 2)]
        with pytest.raises(errors.OperationTimeoutError):  # the 4th time it is not handed out
            await consumer.receive(timeout=1)
        dlq = await client.subscribe("orders-billing-DLQ", "ops")  # (made before it was sent)
        dead = await dlq.receive(timeout=5)
        assert (dead.value, dead.key) == (b"poison", "k")
        assert dead.properties == {
            "p": "1",
            "REAL_TOPIC": "orders",
            "ORIGIN_MESSAGE_ID": str(poison),
        }
        await dlq.acknowledge(dead)
    _, stats = admin_stats(broker, "orders")
    billing = stats["partitions"][0]["subscriptions"]["billing"]
    assert billing["backlog"] == 0 and billing["unacked"] == 0 and billing["pending_ack"] == 0


def admin_stats(broker: BrokerProcess, topic: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    status, body = broker.admin("GET", f"/admin/v1/topics/{topic}/stats")
    return status, json.loads(body)


def test_dead_letter_policy_refuses_bad_values() -> None:
    for bad in (-1, 1.5, None):
        with pytest.raises(errors.InvalidInputError, match="max_redeliver_count"):
            DeadLetterPolicy(max_redeliver_count=bad)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInputError, match="dead_letter_topic"):
        DeadLetterPolicy(1, dead_letter_topic="")


# --- a topic that grows ----------------------------------------------------------------


async def test_a_producer_learns_that_its_topic_grew_and_uses_the_new_partitions(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        consumer = await client.subscribe("grows", "s", initial_position="earliest")
        producer = await client.create_producer("grows", partitions_update_interval=0.2)
        assert producer.partitions == 1
        before = [await producer.send(b"a%d" % i) for i in range(3)]
        assert {m.partition for m in before} == {0}
        status, _ = broker.admin("PUT", "/admin/v1/topics/grows", b'{"partitions": 3}')
        assert status == 200
        await until(lambda: producer.partitions == 3, "the producer to see 3 partitions")
        after = [await producer.send(b"b%d" % i) for i in range(6)]  # round robin
        keyed = await producer.send(b"k", key="k")
        assert {m.partition for m in after} == {0, 1, 2}
        assert keyed.partition == zlib.crc32(b"k") % 3
        # The subscription got the new partitions: everything is delivered.
        got = [await consumer.receive(timeout=5) for _ in range(10)]
        assert sorted(m.value for m in got) == sorted(
            [b"a0", b"a1", b"a2", b"k"] + [b"b%d" % i for i in range(6)]
        )
    with pytest.raises(errors.InvalidInputError, match="partitions_update_interval"):
        async with Client(broker.url) as client:
            await client.create_producer("grows", partitions_update_interval=0)


# --- a commit never overtakes a send kept while its producer is re-created ------------


async def test_a_commit_waits_for_a_send_kept_while_its_producer_is_re_created(
    broker: BrokerProcess,
) -> None:
    """A send framed while its producer has no current link (it is being
    re-created: moved to the coordinator's connection in a cluster, or
    after a reconnect) is kept and written once the producer is re-created.
    A commit in that window must not write END_TXN right behind it on the
    coordinator's link: the END would reach the broker first, which would
    commit without the send and then refuse it as too late, while commit()
    returned success. The commit waits for the send's answer instead, and
    the message is committed."""
    async with Client(broker.url) as client:
        producer = await client.create_producer("kept")
        conn = client._conn
        txn = await client.new_transaction()
        txn.flush()  # (the full path: END_TXN ends it)
        # The window of a re-creation: the connection's link is up and ready,
        # the producer's generation is not current yet (`Producer.reattach`).
        current = producer._gen
        producer._gen = -1
        sent = producer.send_nowait(b"v", txn=txn)
        committing = asyncio.ensure_future(txn.commit())
        await until(lambda: committing.done() or txn._settled is not None)
        # The re-creation ends: the kept frames are written, as reattach does.
        producer._gen = current
        for kept in producer._inflight.values():
            conn.write(kept.data)
        await committing
        await sent  # (not refused as too late)
        consumer = await client.subscribe("kept", "s", initial_position="earliest")
        msg = await consumer.receive(timeout=10)
        assert msg.value == b"v"
