"""A local transaction in one frame: COMMIT_TXN against the real broker.

Protocol-level (a raw WebSocket): a commit is checked whole before anything
is written, and every refusal changes nothing (the transaction stays OPEN,
nothing is visible, nothing is acknowledged); a commit writes one entry per
partition (message i at (partition, that entry, i), in the frame's order)
and DELETES its acknowledged ranges, visible and acknowledged once
answered; a commit sent again under the same commit_id is answered as done
and stores nothing twice, one under another commit_id is refused; the
permissions a SEND and an ACK need are needed. And through the client:
concurrent transactions acking the same messages, the second refused.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from client import Client, TxnState, errors
from proto import txnbuf_pb2 as pb
from tests.conftest import BrokerProcess, RawConnection

T = pb.BaseCommand


def batch(*values: bytes, first: int = 0) -> bytes:
    return pb.EntryBatch(
        messages=[pb.SingleMessage(payload=v, sequence_id=first + i) for i, v in enumerate(values)]
    ).SerializeToString()


def stats(broker: BrokerProcess, topic: str) -> dict[str, Any]:
    status, body = broker.admin("GET", f"/admin/v1/topics/{topic}/stats")
    assert status == 200, body
    return json.loads(body)  # type: ignore[no-any-return]


def txn_status(broker: BrokerProcess, txnid: tuple[int, int]) -> str:
    status, body = broker.admin("GET", f"/admin/v1/transactions/({txnid[0]},{txnid[1]})")
    assert status == 200, body
    return str(json.loads(body)["status"])


class Copier:
    """A raw connection with producer 1 on ``out`` (2 partitions) and consumer
    1 of subscription "s" on ``in``, which holds ``n`` inputs (one entry),
    delivered: ``entry`` is their entry id."""

    def __init__(self, raw: RawConnection) -> None:
        self.raw = raw
        self.entry = -1
        self.request_id = 10

    async def setup(self, broker: BrokerProcess, n: int, token: str | None = None) -> None:
        broker.admin("PUT", "/admin/v1/topics/out", b'{"partitions": 2}')
        async with Client(broker.url, token=token) as client:
            seeder = await client.create_producer("in")
            await asyncio.gather(*(seeder.send_nowait(b"in-%d" % i) for i in range(n)))
        raw = self.raw
        await raw.request(
            T.PRODUCER,
            "producer",
            pb.CommandProducer(request_id=1, producer_id=1, topic="out", producer_name="p"),
        )
        subscribed = await raw.request(
            T.SUBSCRIBE,
            "subscribe",
            pb.CommandSubscribe(
                request_id=2,
                consumer_id=1,
                topic="in",
                subscription="s",
                initial_position=pb.CommandSubscribe.EARLIEST,
            ),
        )
        assert subscribed.type == T.SUCCESS, subscribed
        await raw.send(T.FLOW, "flow", pb.CommandFlow(consumer_id=1, permits=100))
        delivered = await raw.receive()
        assert delivered.type == T.MESSAGE
        self.entry = int(delivered.message.entries[0].entry_id)

    async def new_txn(self) -> tuple[int, int]:
        self.request_id += 1
        answer = await self.raw.request(
            T.NEW_TXN, "new_txn", pb.CommandNewTxn(request_id=self.request_id)
        )
        got = answer.new_txn_response
        return (got.txnid_most_bits, got.txnid_least_bits)

    async def commit(
        self, txnid: tuple[int, int], commit_id: int = 7, **fields: Any
    ) -> pb.CommandTxnResponse:
        self.request_id += 1
        body = pb.CommandCommitTxn(
            request_id=self.request_id,
            txnid_most_bits=txnid[0],
            txnid_least_bits=txnid[1],
            commit_id=commit_id,
            **fields,
        )
        answer = await self.raw.request(T.COMMIT_TXN, "commit_txn", body)
        assert answer.type == T.TXN_RESPONSE, answer
        assert answer.txn_response.request_id == self.request_id
        return answer.txn_response  # type: ignore[no-any-return]

    def acks(self, first: int, last: int, consumer_id: int = 1) -> list[pb.TxnAckRanges]:
        return [pb.TxnAckRanges(consumer_id=consumer_id, ranges=[0, self.entry, first, last])]


async def test_a_commit_writes_one_entry_per_partition_and_deletes_its_acks(
    broker: BrokerProcess,
) -> None:
    async with RawConnection(broker.url) as raw:
        copier = Copier(raw)
        await copier.setup(broker, 4)
        txnid = await copier.new_txn()
        sends = [
            pb.TxnSendData(producer_id=1, partition=1, batch=batch(b"a", b"b")),
            pb.TxnSendData(producer_id=1, partition=0, batch=batch(b"c", first=2)),
            pb.TxnSendData(producer_id=1, partition=1, batch=batch(b"d", first=3)),
        ]
        answer = await copier.commit(
            txnid, sends=sends, acks=copier.acks(0, 2), next_txn_ttl_ms=5000
        )
        assert not answer.HasField("error"), answer
        assert answer.HasField("next_txnid_most_bits")  # the next transaction, with it
    assert txn_status(broker, txnid) == "COMMITTED"
    partitions = stats(broker, "out")["partitions"]
    assert [p["messages"] for p in partitions] == [1, 3]
    backlog = stats(broker, "in")["partitions"][0]["subscriptions"]["s"]
    assert backlog["backlog"] == 1 and backlog["pending_ack"] == 0
    async with Client(broker.url) as client:
        reader = await client.subscribe("out", "r", initial_position="earliest")
        got = sorted(
            ((m.message_id.partition, m.message_id.batch_index), m.value)
            for m in [await reader.receive(timeout=10) for _ in range(4)]
        )
    # One entry per partition, its messages in the frame's order.
    assert got == [((0, 0), b"c"), ((1, 0), b"a"), ((1, 1), b"b"), ((1, 2), b"d")]


async def test_a_commit_sent_again_is_answered_as_done_and_stores_nothing_twice(
    broker: BrokerProcess,
) -> None:
    async with RawConnection(broker.url) as raw:
        copier = Copier(raw)
        await copier.setup(broker, 2)
        txnid = await copier.new_txn()
        sends = [pb.TxnSendData(producer_id=1, partition=0, batch=batch(b"once"))]
        acks = copier.acks(0, 1)
        for _ in range(2):  # (its answer was lost)
            answer = await copier.commit(txnid, sends=sends, acks=acks)
            assert not answer.HasField("error"), answer
        another = await copier.commit(txnid, commit_id=8, sends=sends, acks=acks)
        assert another.error == pb.INVALID_TXN_STATUS and "another commit" in another.message
    assert [p["messages"] for p in stats(broker, "out")["partitions"]] == [1, 0]


@pytest.mark.parametrize(
    "case",
    [
        "unknown producer",
        "unknown consumer",
        "no such partition",
        "unknown message",
        "message acknowledged already",
        "malformed batch",
        "batch naming a producer",
        "empty batch",
        "sequence ids out of order",
        "ranges not quadruples",
        "no commit id",
        "unknown transaction",
    ],
)
async def test_a_refused_commit_changes_nothing(broker: BrokerProcess, case: str) -> None:
    async with RawConnection(broker.url) as raw:
        copier = Copier(raw)
        await copier.setup(broker, 3)
        txnid = await copier.new_txn()
        good = [pb.TxnSendData(producer_id=1, partition=0, batch=batch(b"x"))]
        fields: dict[str, Any] = {"sends": good, "acks": copier.acks(0, 1)}
        expected = pb.INVALID_ARGUMENT
        if case == "unknown producer":
            fields["sends"] = [pb.TxnSendData(producer_id=9, partition=0, batch=batch(b"x"))]
            expected = pb.PRODUCER_NOT_FOUND
        elif case == "unknown consumer":
            fields["acks"] = copier.acks(0, 1, consumer_id=9)
            expected = pb.CONSUMER_NOT_FOUND
        elif case == "no such partition":
            fields["sends"] = [pb.TxnSendData(producer_id=1, partition=5, batch=batch(b"x"))]
        elif case == "unknown message":
            fields["acks"] = copier.acks(1, 3)  # (the entry holds 0..2)
            expected = pb.UNKNOWN_MESSAGE_ID
        elif case == "message acknowledged already":
            ack = pb.CommandAck(consumer_id=1, request_id=5, ranges=[0, copier.entry, 0, 0])
            answer = await raw.request(T.ACK, "ack", ack)
            assert not answer.ack_response.HasField("error")
            expected = pb.TRANSACTION_CONFLICT
        elif case == "malformed batch":
            fields["sends"] = [pb.TxnSendData(producer_id=1, partition=0, batch=b"\xff\xff")]
            expected = pb.MALFORMED_FRAME
        elif case == "batch naming a producer":
            named = pb.EntryBatch(producer_name="me", messages=[pb.SingleMessage(payload=b"x")])
            fields["sends"] = [
                pb.TxnSendData(producer_id=1, partition=0, batch=named.SerializeToString())
            ]
        elif case == "empty batch":
            fields["sends"] = [pb.TxnSendData(producer_id=1, partition=0, batch=b"")]
        elif case == "sequence ids out of order":
            wrong = pb.EntryBatch(
                messages=[pb.SingleMessage(payload=b"x", sequence_id=s) for s in (3, 2)]
            )
            fields["sends"] = [
                pb.TxnSendData(producer_id=1, partition=0, batch=wrong.SerializeToString())
            ]
        elif case == "ranges not quadruples":
            fields["acks"] = [pb.TxnAckRanges(consumer_id=1, ranges=[0, copier.entry, 0])]
        elif case == "no commit id":
            fields["commit_id"] = 0
        elif case == "unknown transaction":
            txnid = (txnid[0], txnid[1] + 1000)
            expected = pb.TRANSACTION_NOT_FOUND
        answer = await copier.commit(txnid, **fields)
        assert answer.error == expected, answer
        if case != "unknown transaction":
            assert txn_status(broker, txnid) == "OPEN"  # nothing changed
        assert [p["messages"] for p in stats(broker, "out")["partitions"]] == [0, 0]
        sub = stats(broker, "in")["partitions"][0]["subscriptions"]["s"]
        assert sub["pending_ack"] == 0
        assert sub["backlog"] == (2 if case == "message acknowledged already" else 3)


async def test_a_commit_needs_what_a_send_and_an_ack_need(tmp_path: Any) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=True)
    broker.start()
    try:
        for permission in ("produce", "consume"):
            body = {"role": "copier", "permission": permission, "resource": "topic:in"}
            status, _ = broker.admin("POST", "/admin/v1/acl/grant", json.dumps(body).encode())
            assert status == 200
        async with RawConnection(broker.url, token=broker.token) as raw:
            copier = Copier(raw)
            await copier.setup(broker, 1, token=broker.token)
        async with RawConnection(broker.url, token=broker.make_token("copier")) as raw:
            copier = Copier(raw)
            subscribed = await raw.request(
                T.SUBSCRIBE,
                "subscribe",
                pb.CommandSubscribe(request_id=2, consumer_id=1, topic="in", subscription="s"),
            )
            assert subscribed.type == T.SUCCESS, subscribed
            refused = await raw.request(
                T.PRODUCER,
                "producer",
                pb.CommandProducer(request_id=3, producer_id=1, topic="out", producer_name="p"),
            )
            assert refused.error.error == pb.AUTHORIZATION_ERROR  # no producer on "out"
            txnid = await copier.new_txn()
            answer = await copier.commit(
                txnid, sends=[pb.TxnSendData(producer_id=1, partition=0, batch=batch(b"x"))]
            )
            assert answer.error == pb.PRODUCER_NOT_FOUND
            assert txn_status(broker, txnid) == "OPEN"
    finally:
        broker.stop()


async def test_concurrent_local_transactions_on_the_same_messages(broker: BrokerProcess) -> None:
    """Two clients' transactions acknowledge the same messages (a shared
    subscription redelivered them): the first commit takes them, the
    second is refused, aborted, and its client raises the conflict."""
    async with Client(broker.url) as seeder:
        producer = await seeder.create_producer("in")
        await asyncio.gather(*(producer.send(b"%d" % i) for i in range(5)))
    async with Client(broker.url) as a, Client(broker.url) as b:
        ca = await a.subscribe("in", "s", "shared", initial_position="earliest")
        batch_a = await ca.batch_receive(max_messages=5, timeout=5)
        cb = await b.subscribe("in", "s", "shared")
        await ca.close()  # its messages go to b
        batch_b = await cb.batch_receive(max_messages=5, timeout=5)
        assert [m.message_id for m in batch_b] == [m.message_id for m in batch_a]
        out_a, out_b = await a.create_producer("out"), await b.create_producer("out")
        first, second = await a.new_transaction(), await b.new_transaction()
        for m in batch_a:
            await out_a.send(m.value, txn=first)
        for m in batch_b:
            await out_b.send(m.value, txn=second)
            await cb.acknowledge(m, txn=second)
        ca2 = await a.subscribe("in", "s", "shared")
        for m in batch_a:
            await ca2.acknowledge(m.message_id, txn=first)
        await first.commit()
        with pytest.raises(errors.TransactionConflictError):
            await second.commit()
        assert second.state is TxnState.ABORTED
        reader = await a.subscribe("out", "r", initial_position="earliest")
        got = await reader.batch_receive(max_messages=10, timeout=2)
        assert sorted(m.value for m in got) == sorted(m.value for m in batch_a)
    sub = stats(broker, "in")["partitions"][0]["subscriptions"]["s"]
    assert sub["backlog"] == 0 and sub["pending_ack"] == 0
