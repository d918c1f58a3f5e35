"""PIP-31 transactions end to end, against the real broker process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from client import Client, Consumer, Message, TxnState, errors
from proto import txnbuf_pb2 as pb
from tests.conftest import (
    BrokerProcess,
    RawConnection,
    both_stores,
    send_command,
    unbatch,
    until,
)

pytestmark = pytest.mark.integration

T = pb.BaseCommand
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "consume_transform_produce.py"


async def receive_n(consumer: Consumer, n: int, wait: float = 10.0) -> list[Message]:
    return [await consumer.receive(timeout=wait) for _ in range(n)]


async def nothing_more(consumer: Consumer, wait: float = 0.5) -> None:
    with pytest.raises(errors.OperationTimeoutError):
        msg = await consumer.receive(timeout=wait)
        pytest.fail(f"unexpected message {msg.value!r} {msg.message_id}")


def admin_json(broker: BrokerProcess, method: str, path: str) -> tuple[int, dict]:  # type: ignore[type-arg]
    status, body = broker.admin(method, path)
    return status, json.loads(body)


async def seed(client: Client, topic: str, n: int) -> None:
    producer = await client.create_producer(topic)
    await asyncio.gather(*(producer.send(b"in-%d" % i) for i in range(n)))
    await producer.close()


@both_stores
async def test_commit_makes_sends_visible_and_acks_final(broker: BrokerProcess) -> None:
    broker.admin("PUT", "/admin/v1/topics/out", b'{"partitions": 3}')
    async with Client(broker.url) as client:
        await seed(client, "in", 10)
        source = await client.subscribe("in", "copier", initial_position="earliest")
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        producer = await client.create_producer("out")
        inputs = await receive_n(source, 10)
        txn = await client.new_transaction(timeout=30)
        ids = [
            await producer.send(m.value.replace(b"in", b"out"), key=str(i), txn=txn)
            for i, m in enumerate(inputs)
        ]
        assert all(i.entry_id == -1 for i in ids)  # final ids come with the commit
        for m in inputs:
            await source.acknowledge(m, txn=txn)
        await nothing_more(sink)  # read committed: nothing before the commit
        status, listed = admin_json(broker, "GET", "/admin/v1/transactions?state=OPEN")
        assert [t["txnid"] for t in listed["transactions"]] == [str(txn.id)]
        await txn.commit()
        got = await receive_n(sink, 10)
        assert sorted(m.value for m in got) == sorted(b"out-%d" % i for i in range(10))
        assert all(m.message_id.entry_id >= 0 for m in got)
        status, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert status == 200 and meta["status"] in ("COMMITTING", "COMMITTED")
        assert {p["topic"] for p in meta["partitions"]} == {"out"}
        assert meta["subscriptions"] == [{"topic": "in", "subscription": "copier"}]
    # The acked inputs are gone for good, also after a crash.
    broker.kill()
    broker.start()
    async with Client(broker.url) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        await nothing_more(source)
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        got = await receive_n(sink, 10)  # never acked: redelivered, same ids
        assert sorted(m.value for m in got) == sorted(b"out-%d" % i for i in range(10))


async def test_spare_transactions_are_used_and_aborted_at_close(broker: BrokerProcess) -> None:
    """A transaction ending asks for the next one (client._spares): it is
    listed OPEN with no participants until taken, and a closing client
    aborts it."""
    async with Client(broker.url) as client:
        producer = await client.create_producer("spares")
        first = await client.new_transaction(timeout=30)
        await producer.send(b"x", txn=first)
        await first.commit()
        _, listed = admin_json(broker, "GET", "/admin/v1/transactions?state=OPEN")
        (spare,) = listed["transactions"]
        assert spare["partitions"] == [] and spare["subscriptions"] == []
        second = await client.new_transaction(timeout=30)
        assert str(second.id) == spare["txnid"]
        await producer.send(b"y", txn=second)
        await second.commit()
    await until(  # (the abort's records are logged after END answers)
        lambda: (
            admin_json(broker, "GET", "/admin/v1/transactions?state=OPEN")[1]["transactions"] == []
        ),
        "no transaction OPEN",
    )


async def test_end_txn_opens_the_next_transaction_only_when_it_succeeds(
    broker: BrokerProcess,
) -> None:
    """END_TXN with next_txn_ttl_ms opens the next
    transaction (its timeout, on next_tc_id) and answers its id; an END that
    fails answers none and leaves none open; a next transaction that cannot
    be opened (no such coordinator, a bad timeout) leaves the END as it is."""

    def open_txns() -> list[dict]:  # type: ignore[type-arg]
        return admin_json(broker, "GET", "/admin/v1/transactions?state=OPEN")[1]["transactions"]

    async with RawConnection(broker.url) as raw:
        answer = await raw.request(
            T.NEW_TXN, "new_txn", pb.CommandNewTxn(request_id=1, txn_ttl_ms=10_000)
        )
        first = answer.new_txn_response

        async def end(
            request_id: int, txn: object, action: int, **ask: int
        ) -> pb.CommandTxnResponse:
            ids = dict(
                txnid_most_bits=txn.txnid_most_bits,  # type: ignore[attr-defined]
                txnid_least_bits=txn.txnid_least_bits,  # type: ignore[attr-defined]
            )
            body = pb.CommandEndTxn(request_id=request_id, txn_action=action, **ids, **ask)  # type: ignore[arg-type]
            return (await raw.request(T.END_TXN, "end_txn", body)).txn_response

        answer = await end(2, first, pb.COMMIT, next_txn_ttl_ms=20_000, next_tc_id=0)
        assert not answer.HasField("error") and answer.HasField("next_txnid_most_bits")
        following = f"({answer.next_txnid_most_bits},{answer.next_txnid_least_bits})"
        (listed,) = open_txns()
        assert listed["txnid"] == following and listed["timeout_ms"] == 20_000
        assert listed["partitions"] == [] and listed["subscriptions"] == []

        # The END fails (the first transaction was committed): no next one.
        refused = await end(3, first, pb.ABORT, next_txn_ttl_ms=20_000, next_tc_id=0)
        assert refused.error == pb.INVALID_TXN_STATUS
        assert not refused.HasField("next_txnid_most_bits")
        # The next transaction the broker opened for it is aborted.
        await until(
            lambda: [t["txnid"] for t in open_txns()] == [following], "only the next one open"
        )

        # The END succeeds, the next transaction cannot be opened: the END stands.
        second = pb.CommandNewTxnResponse(
            txnid_most_bits=answer.next_txnid_most_bits,
            txnid_least_bits=answer.next_txnid_least_bits,
        )
        answer = await end(4, second, pb.COMMIT, next_txn_ttl_ms=20_000, next_tc_id=9)
        assert not answer.HasField("error") and not answer.HasField("next_txnid_most_bits")
        again = await end(5, second, pb.COMMIT, next_txn_ttl_ms=10**12, next_tc_id=0)
        assert not again.HasField("error") and not again.HasField("next_txnid_most_bits")
        assert open_txns() == []
        _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{following}")
        assert meta["status"] == "COMMITTED"


@both_stores
async def test_abort_discards_sends_and_redelivers_inputs(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        await seed(client, "in", 5)
        source = await client.subscribe("in", "copier", initial_position="earliest")
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        producer = await client.create_producer("out")
        inputs = await receive_n(source, 5)
        async with client.transaction(timeout=30) as txn:
            await producer.send(b"doomed", txn=txn)
            await source.acknowledge_cumulative(inputs[-1], txn=txn)
            await txn.abort()
        await producer.send(b"plain")
        assert (await sink.receive(timeout=10)).value == b"plain"
        await nothing_more(sink)
        await source.redeliver_unacknowledged()
        again = await receive_n(source, 5)
        assert [m.value for m in again] == [m.value for m in inputs]
        with pytest.raises(errors.InvalidTxnStatusError):
            await producer.send(b"late", txn=txn)


async def test_exception_in_transaction_block_aborts(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader")
        producer = await client.create_producer("out")
        with pytest.raises(RuntimeError, match="boom"):
            async with client.transaction() as txn:
                await producer.send(b"never", txn=txn)
                raise RuntimeError("boom")
        await nothing_more(sink)
        _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert meta["status"] in ("ABORTING", "ABORTED")


@both_stores
async def test_conflicting_acks_abort_the_second_transaction(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        await seed(client, "in", 3)
        c1 = await client.subscribe("in", "shared", "shared", initial_position="earliest")
        inputs = await receive_n(c1, 3)
        t1 = await client.new_transaction()
        t1.flush()  # (the full path: its ack is written, PENDING_ACK, before its commit)
        t2 = await client.new_transaction()
        await c1.acknowledge(inputs[0], txn=t1)
        for _ in range(200):  # (written and applied: PENDING_ACK)
            _, stats = admin_json(broker, "GET", "/admin/v1/topics/in/stats")
            if stats["partitions"][0]["subscriptions"]["shared"]["pending_ack"] == 1:
                break
            await asyncio.sleep(0.05)
        await c1.acknowledge(inputs[0], txn=t2)  # held: its refusal is the commit's
        with pytest.raises(errors.TransactionConflictError):
            await t2.commit()  # the client aborts a transaction that saw a conflict
        assert t2.state is TxnState.ABORTED
        await c1.acknowledge(inputs[0])  # a plain ack of a PENDING_ACK message: dropped
        await t1.abort()
        # The abort delivers its message again. Take it before asking for the
        # rest: a redelivery request crossing it on the wire would deliver it
        # twice (redelivery is at least once).
        assert [m.value for m in await receive_n(c1, 1)] == [inputs[0].value]
        await c1.redeliver_unacknowledged()
        again = await receive_n(c1, 3)
        assert sorted(m.value for m in again) == sorted(m.value for m in inputs)


async def test_open_transaction_of_a_dead_client_times_out(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        await seed(client, "in", 4)
    async with Client(broker.url) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        producer = await client.create_producer("out")
        inputs = await receive_n(source, 4)
        txn = await client.new_transaction(timeout=1.0)
        await producer.send(b"orphan", txn=txn)
        for m in inputs:
            await source.acknowledge(m, txn=txn)
        # the client goes away without ending the transaction

    def meta() -> dict:  # type: ignore[type-arg]
        return admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")[1]  # type: ignore[no-any-return]

    await until(lambda: meta()["status"] == "ABORTED", "the timeout's abort")
    assert meta()["timed_out"] is True
    async with Client(broker.url) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        again = await receive_n(source, 4)
        assert [m.value for m in again] == [m.value for m in inputs]
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        await nothing_more(sink)


async def test_admin_abort_and_coordinators(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("out")
        txn = await client.new_transaction(timeout=60)
        await producer.send(b"x", txn=txn)
        status, meta = admin_json(broker, "POST", f"/admin/v1/transactions/{txn.id}/abort")
        assert status == 200 and meta["status"] in ("ABORTING", "ABORTED")
        with pytest.raises(errors.InvalidTxnStatusError):
            await txn.commit()
    assert broker.admin("GET", "/admin/v1/transactions/(nonsense)")[0] == 400
    assert broker.admin("GET", "/admin/v1/transactions/(0,12345)")[0] == 404
    assert broker.admin("GET", "/admin/v1/transactions?state=BOGUS")[0] == 400
    status, coords = admin_json(broker, "GET", "/admin/v1/coordinators")
    assert status == 200 and [c["tc_id"] for c in coords["coordinators"]] == [0]


async def test_late_transactional_write_is_refused(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("late")
        txn = await client.new_transaction()
        txn.flush()  # (the full path: the send is written before the abort)
        await producer.send(b"in time", txn=txn)
        await txn.abort()
    async with RawConnection(broker.url) as raw:
        await raw.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(request_id=1, producer_id=1, topic="late", producer_name="p"),
        )
        msg = pb.SingleMessage(payload=b"too late", sequence_id=100)
        answer = await raw.request(
            T.SEND,
            "send",
            send_command(
                msg,
                producer_id=1,
                request_id=2,
                transactional=True,
                txnid_most_bits=txn.id.most_bits,
                txnid_least_bits=txn.id.least_bits,
            ),
        )
        assert answer.type == T.SEND_ERROR
        assert answer.send_error.error == pb.INVALID_TXN_STATUS
    _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
    assert meta["status"] == "ABORTED"
    assert meta["partitions"] == [{"topic": "late", "partition": 0}]  # nothing added late


async def raw_copier(broker: BrokerProcess, raw: RawConnection, topic: str) -> int:
    """Seed one input message on ``<topic>-in``; on ``raw``, open producer 1
    on ``topic`` and consumer 1 of subscription "s" on ``<topic>-in`` (request
    ids 1 and 2) and receive the input: its entry id."""
    async with Client(broker.url) as client:
        producer = await client.create_producer(f"{topic}-in")
        await producer.send(b"input")
    await raw.request(
        T.PRODUCER,
        "producer",
        pb.CommandProducer(request_id=1, producer_id=1, topic=topic, producer_name="p"),
    )
    await raw.request(
        T.SUBSCRIBE,
        "subscribe",
        pb.CommandSubscribe(
            request_id=2,
            consumer_id=1,
            topic=f"{topic}-in",
            subscription="s",
            initial_position=pb.CommandSubscribe.EARLIEST,
        ),
    )
    await raw.send(T.FLOW, "flow", pb.CommandFlow(consumer_id=1, permits=10))
    delivered = await raw.receive()
    assert delivered.type == T.MESSAGE
    return int(delivered.message.entries[0].entry_id)


async def open_until_aborted(
    broker: BrokerProcess, raw: RawConnection, ids: dict[str, int], request_id: int
) -> None:
    """The transaction ``ids`` is still OPEN (a refused commit changed
    nothing), and aborting it on ``raw`` succeeds."""
    txnid = f"({ids['txnid_most_bits']},{ids['txnid_least_bits']})"
    _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txnid}")
    assert meta["status"] == "OPEN"
    aborted = await raw.request(
        T.END_TXN, "end_txn", pb.CommandEndTxn(request_id=request_id, txn_action=pb.ABORT, **ids)
    )
    assert not aborted.txn_response.HasField("error")


async def test_a_commit_written_behind_its_sends_and_acks_waits_for_them(
    broker: BrokerProcess,
) -> None:
    """END_TXN COMMIT with after_ops, written right behind
    the transaction's SENDs and ACK before they are answered, commits once
    they are: their answers come first. If one of them failed, the commit is
    refused with NOT_ALLOWED and changes nothing (again if asked again), and
    the transaction can still be aborted."""
    async with RawConnection(broker.url) as raw:
        entry_id = await raw_copier(broker, raw, "behind")

        async def new_txn(request_id: int) -> dict[str, int]:
            answer = await raw.request(
                T.NEW_TXN, "new_txn", pb.CommandNewTxn(request_id=request_id, txn_ttl_ms=10_000)
            )
            txn = answer.new_txn_response
            return dict(txnid_most_bits=txn.txnid_most_bits, txnid_least_bits=txn.txnid_least_bits)

        def send(ids: dict[str, int], request_id: int, seq: int) -> pb.CommandSend:
            msg = pb.SingleMessage(payload=b"out-%d" % seq, sequence_id=seq)
            return send_command(
                msg, producer_id=1, request_id=request_id, transactional=True, **ids
            )

        def ack(ids: dict[str, int], request_id: int, entry: int) -> pb.CommandAck:
            return pb.CommandAck(
                consumer_id=1, request_id=request_id, ack_type=pb.CommandAck.INDIVIDUAL,
                ranges=[0, entry, 0, 0], transactional=True, **ids,
            )  # fmt: skip

        def commit(ids: dict[str, int], request_id: int) -> pb.CommandEndTxn:
            return pb.CommandEndTxn(
                request_id=request_id, txn_action=pb.COMMIT, after_ops=True, **ids
            )

        ids = await new_txn(3)
        await raw.send(T.SEND, "send", send(ids, 4, 0))
        await raw.send(T.SEND, "send", send(ids, 5, 1))
        await raw.send(T.ACK, "ack", ack(ids, 6, entry_id))
        await raw.send(T.END_TXN, "end_txn", commit(ids, 7))
        answers = [await raw.receive() for _ in range(4)]
        # (in any order among themselves; the END's answer last)
        assert sorted(a.type for a in answers[:3]) == sorted(
            [T.SEND_RECEIPT, T.SEND_RECEIPT, T.ACK_RESPONSE]
        )
        assert not any(a.ack_response.HasField("error") for a in answers[:3])
        assert answers[3].type == T.TXN_RESPONSE and not answers[3].txn_response.HasField("error")

        # An ack of a message the subscription never had fails: no commit.
        ids = await new_txn(8)
        await raw.send(T.SEND, "send", send(ids, 9, 2))
        await raw.send(T.ACK, "ack", ack(ids, 10, entry_id + 1000))
        await raw.send(T.END_TXN, "end_txn", commit(ids, 11))
        answers = [await raw.receive() for _ in range(3)]
        by_type = {a.type: a for a in answers[:2]}
        assert set(by_type) == {T.SEND_RECEIPT, T.ACK_RESPONSE}
        assert by_type[T.ACK_RESPONSE].ack_response.HasField("error")
        assert answers[2].txn_response.error == pb.NOT_ALLOWED
        again = await raw.request(T.END_TXN, "end_txn", commit(ids, 12))
        assert again.txn_response.error == pb.NOT_ALLOWED  # the failure is remembered
        await open_until_aborted(broker, raw, ids, 13)
    async with Client(broker.url) as client:
        sink = await client.subscribe("behind", "reader", initial_position="earliest")
        assert [m.value for m in await receive_n(sink, 2)] == [b"out-0", b"out-1"]
        await nothing_more(sink)  # (out-2 was aborted)


async def test_a_send_refused_at_once_refuses_the_commit_behind_it(
    broker: BrokerProcess,
) -> None:
    """A transactional SEND answered at once is not counted among its
    transaction's unanswered operations, but one refused at once is
    remembered: END_TXN COMMIT after_ops behind it is refused (NOT_ALLOWED),
    nothing is committed, and the transaction can be aborted."""
    async with RawConnection(broker.url) as raw:
        await raw_copier(broker, raw, "refused")
        answer = await raw.request(
            T.NEW_TXN, "new_txn", pb.CommandNewTxn(request_id=3, txn_ttl_ms=10_000)
        )
        txn = answer.new_txn_response
        ids = dict(txnid_most_bits=txn.txnid_most_bits, txnid_least_bits=txn.txnid_least_bits)

        def send(request_id: int, partition: int, seq: int) -> pb.CommandSend:
            msg = pb.SingleMessage(payload=b"out-%d" % seq, sequence_id=seq)
            return send_command(
                msg, producer_id=1, request_id=request_id, partition=partition,
                transactional=True, **ids,
            )  # fmt: skip

        await raw.send(T.SEND, "send", send(4, 0, 0))  # accepted
        await raw.send(T.SEND, "send", send(5, 7, 1))  # no partition 7: refused at once
        await raw.send(
            T.END_TXN,
            "end_txn",
            pb.CommandEndTxn(request_id=6, txn_action=pb.COMMIT, after_ops=True, **ids),
        )
        answers = [await raw.receive() for _ in range(3)]
        by_type = {a.type: a for a in answers[:2]}  # (in any order; the END's answer last)
        assert set(by_type) == {T.SEND_RECEIPT, T.SEND_ERROR}
        assert by_type[T.SEND_ERROR].send_error.error == pb.INVALID_ARGUMENT
        assert answers[2].type == T.TXN_RESPONSE
        assert answers[2].txn_response.error == pb.NOT_ALLOWED
        await open_until_aborted(broker, raw, ids, 7)
    async with Client(broker.url) as client:
        sink = await client.subscribe("refused", "reader", initial_position="earliest")
        await nothing_more(sink)  # (out-0 was aborted with the transaction)


async def test_transactional_sends_and_acks_add_their_participants(
    broker: BrokerProcess,
) -> None:
    """KIP-890 part 2: a transactional SEND or ACK adds its partition /
    subscription to the transaction itself (once); a transaction not OPEN
    gains nothing, and the send is refused."""
    async with RawConnection(broker.url) as raw:
        entry_id = await raw_copier(broker, raw, "joined")
        answer = await raw.request(
            T.NEW_TXN, "new_txn", pb.CommandNewTxn(request_id=3, txn_ttl_ms=10_000)
        )
        txn = answer.new_txn_response
        ids = dict(txnid_most_bits=txn.txnid_most_bits, txnid_least_bits=txn.txnid_least_bits)
        txnid = f"({txn.txnid_most_bits},{txn.txnid_least_bits})"

        def send(request_id: int, seq: int) -> pb.CommandSend:
            msg = pb.SingleMessage(payload=b"out-%d" % seq, sequence_id=seq)
            return send_command(
                msg, producer_id=1, request_id=request_id, transactional=True, **ids
            )

        _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txnid}")
        assert meta["partitions"] == [] and meta["subscriptions"] == []
        assert (await raw.request(T.SEND, "send", send(6, 0))).type == T.SEND_RECEIPT
        assert (await raw.request(T.SEND, "send", send(7, 1))).type == T.SEND_RECEIPT
        ack = pb.CommandAck(
            consumer_id=1, request_id=8, ack_type=pb.CommandAck.INDIVIDUAL,
            ranges=[0, entry_id, 0, 0], transactional=True, **ids,
        )  # fmt: skip
        answer = await raw.request(T.ACK, "ack", ack)
        assert not answer.ack_response.HasField("error"), answer
        _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txnid}")
        assert meta["partitions"] == [{"topic": "joined", "partition": 0}]  # added once
        assert meta["subscriptions"] == [{"topic": "joined-in", "subscription": "s"}]
        answer = await raw.request(
            T.END_TXN, "end_txn", pb.CommandEndTxn(request_id=9, txn_action=pb.COMMIT, **ids)
        )
        assert not answer.txn_response.HasField("error")
        late = await raw.request(T.SEND, "send", send(10, 2))
        assert late.send_error.error == pb.INVALID_TXN_STATUS  # ended: nothing is added
    async with Client(broker.url) as client:
        sink = await client.subscribe("joined", "reader", initial_position="earliest")
        assert [m.value for m in await receive_n(sink, 2)] == [b"out-0", b"out-1"]
        await nothing_more(sink)
        source = await client.subscribe("joined-in", "s", initial_position="earliest")
        await nothing_more(source)  # the acked input is gone


async def test_pip31_registrations_are_answered(broker: BrokerProcess) -> None:
    """PIP-31's ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN, for a client
    that registers first, each written right before the SEND (or ACK) of
    the transaction without waiting for its answer: all are answered, and
    the transaction commits. A registration of an ended transaction is
    refused, as is the send behind it."""
    async with RawConnection(broker.url) as raw:
        entry_id = await raw_copier(broker, raw, "piped")
        answer = await raw.request(
            T.NEW_TXN, "new_txn", pb.CommandNewTxn(request_id=3, txn_ttl_ms=10_000)
        )
        most = answer.new_txn_response.txnid_most_bits
        least = answer.new_txn_response.txnid_least_bits
        ids = dict(txnid_most_bits=most, txnid_least_bits=least)
        # Four frames back to back, no answers awaited in between.
        await raw.send(
            T.ADD_PARTITION_TO_TXN,
            "add_partition_to_txn",
            pb.CommandAddPartitionToTxn(
                request_id=4, partitions=[pb.PartitionRef(topic="piped", partition=0)], **ids
            ),
        )
        msg = pb.SingleMessage(payload=b"output", sequence_id=0)
        await raw.send(
            T.SEND,
            "send",
            send_command(msg, producer_id=1, request_id=5, transactional=True, **ids),
        )
        await raw.send(
            T.ADD_SUBSCRIPTION_TO_TXN,
            "add_subscription_to_txn",
            pb.CommandAddSubscriptionToTxn(
                request_id=6,
                subscriptions=[pb.SubscriptionRef(topic="piped-in", subscription="s")],
                **ids,
            ),
        )
        await raw.send(
            T.ACK,
            "ack",
            pb.CommandAck(
                consumer_id=1,
                request_id=7,
                ack_type=pb.CommandAck.INDIVIDUAL,
                ranges=[0, entry_id, 0, 0],
                transactional=True,
                **ids,
            ),
        )
        answers = {}
        for _ in range(4):
            cmd = await raw.receive()
            body = getattr(cmd, cmd.WhichOneof("command"))
            answers[body.request_id] = cmd
        assert answers[5].type == T.SEND_RECEIPT, answers[5]
        assert answers[7].type == T.ACK_RESPONSE and not answers[7].ack_response.HasField("error")
        for rid in (4, 6):
            assert answers[rid].type == T.TXN_RESPONSE
            assert not answers[rid].txn_response.HasField("error")
        answer = await raw.request(
            T.END_TXN, "end_txn", pb.CommandEndTxn(request_id=8, txn_action=pb.COMMIT, **ids)
        )
        assert not answer.txn_response.HasField("error")
        # Behind a refused registration (an ended transaction), the send is refused.
        await raw.send(
            T.ADD_PARTITION_TO_TXN,
            "add_partition_to_txn",
            pb.CommandAddPartitionToTxn(
                request_id=9, partitions=[pb.PartitionRef(topic="piped", partition=0)], **ids
            ),
        )
        await raw.send(
            T.SEND,
            "send",
            send_command(
                pb.SingleMessage(payload=b"late", sequence_id=1),
                producer_id=1,
                request_id=10,
                transactional=True,
                **ids,
            ),
        )
        late = {}
        for _ in range(2):
            cmd = await raw.receive()
            late[getattr(cmd, cmd.WhichOneof("command")).request_id] = cmd
        assert late[9].txn_response.error == pb.INVALID_TXN_STATUS
        assert late[10].type == T.SEND_ERROR
        assert late[10].send_error.error == pb.INVALID_TXN_STATUS
    async with Client(broker.url) as client:
        reader = await client.subscribe("piped", "r", initial_position="earliest")
        assert [m.value for m in await receive_n(reader, 1)] == [b"output"]


async def test_two_coordinators_share_the_transactions(tmp_path) -> None:  # type: ignore[no-untyped-def]
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.args = ["--tc-ids", "0,1"]
    broker.start()
    try:
        async with Client(broker.url) as client:
            sink = await client.subscribe("out", "reader", initial_position="earliest")
            producer = await client.create_producer("out")
            txns = [await client.new_transaction() for _ in range(4)]
            assert sorted(t.id.tcid for t in txns) == [0, 0, 1, 1]
            for i, txn in enumerate(txns):
                await producer.send(b"%d" % i, txn=txn)
                await txn.commit()
            got = await receive_n(sink, 4)
            assert sorted(m.value for m in got) == [b"0", b"1", b"2", b"3"]
        _status, coords = admin_json(broker, "GET", "/admin/v1/coordinators")
        assert [c["tc_id"] for c in coords["coordinators"]] == [0, 1]
    finally:
        broker.stop()
    # Each has a log of its own: a ledger in the broker's store.
    with contextlib.closing(sqlite3.connect(tmp_path / "data" / "broker.db")) as db:
        names = {name for (name,) in db.execute("SELECT name FROM ledgers")}
    assert {"tc/0", "tc/1"} <= names


@both_stores
async def test_the_consume_transform_produce_example_runs(broker: BrokerProcess) -> None:
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, str(EXAMPLE), "--url", broker.url, "--seed", "250", "--idle", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "done: 250 messages copied" in result.stdout
    async with Client(broker.url) as client:
        out = await client.subscribe("ctp-output", "check", initial_position="earliest")
        got = await receive_n(out, 250)
        assert sorted(m.value for m in got) == sorted(b"MESSAGE %d" % i for i in range(250))
        await nothing_more(out)


async def test_isolation_level_mismatch_is_refused_clearly(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        await client.subscribe("t", "dirty", read_uncommitted=True)
        with pytest.raises(errors.NotAllowedError, match="read_uncommitted; its isolation"):
            await client.subscribe("t", "dirty", "shared")
        clean = await client.subscribe("t", "clean")  # the connection is fine
        producer = await client.create_producer("t")
        await producer.send(b"x")
        assert (await clean.receive(timeout=5)).value == b"x"
    _, stats = admin_json(broker, "GET", "/admin/v1/topics/t/stats")
    subs = stats["partitions"][0]["subscriptions"]
    assert sorted(subs) == ["clean", "dirty"]
    assert subs["dirty"]["read_uncommitted"] and not subs["clean"]["read_uncommitted"]


async def test_batches_are_handled_in_order_and_answers_batched(broker: BrokerProcess) -> None:
    """A BATCH frame is handled command by command, and answers ready at
    once come back as one BATCH."""

    def frame(kind: int, field: str, body: object) -> pb.BaseCommand:
        cmd = pb.BaseCommand(type=kind)  # type: ignore[arg-type]
        getattr(cmd, field).CopyFrom(body)
        return cmd

    T = pb.BaseCommand
    async with RawConnection(broker.url) as conn:
        created = await conn.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(topic="batched", producer_id=1, request_id=1, producer_name="p"),
        )
        assert created.type == T.PRODUCER_SUCCESS
        batch = pb.BaseCommand(type=T.BATCH)
        for i in range(3):
            msg = pb.SingleMessage(payload=b"%d" % i, sequence_id=i)
            send = send_command(msg, producer_id=1, request_id=10 + i, partition=0)
            batch.batch.commands.append(frame(T.SEND, "send", send))
        batch.batch.commands.append(frame(T.BATCH, "batch", pb.CommandBatch()))  # refused
        await conn.send_raw(batch.SerializeToString())
        answers: list[pb.BaseCommand] = []
        frames = 0
        while len(answers) < 4:
            answers.extend(unbatch(await conn.receive_frame()))
            frames += 1
    errors = [a for a in answers if a.type == T.ERROR]
    assert len(errors) == 1 and "BATCH may not hold a BATCH" in errors[0].error.message
    receipts = sorted((a.send_receipt for a in answers if a.type == T.SEND_RECEIPT),
                      key=lambda r: r.request_id)  # fmt: skip
    assert [r.request_id for r in receipts] == [10, 11, 12]
    assert [r.entry_id for r in receipts] == [0, 1, 2]  # stored in the order sent
    assert frames < len(answers)  # the receipts of one group commit share a frame


async def test_a_data_directory_with_a_coordinator_file_is_refused(tmp_path: Path) -> None:
    """Coordinators log in broker.db; a data directory holding a coordinator
    log of its own (``tc-<id>.db``) is refused with a clear error, untouched."""
    data = tmp_path / "data"
    data.mkdir()
    (data / "tc-0.db").write_bytes(b"an old coordinator log")
    broker = BrokerProcess(data, tmp_path / "broker.log")
    with pytest.raises(RuntimeError, match="broker exited"):
        broker.start()
    assert "tc-0.db is a coordinator log in a separate file" in broker.log()
    assert "Traceback" not in broker.log()
    assert (data / "tc-0.db").read_bytes() == b"an old coordinator log"
