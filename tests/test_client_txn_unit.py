"""Unit tests of the client's PIP-31 transactions, against the in-process
``FakeBroker`` of ``test_client_unit.py`` playing broker and coordinator.

The pure pieces (TxnID, the state table, frame building) are tested
directly; framing, commit/abort, spares and reconnects against the fake,
which adds a transactional SEND's partition and ACK's subscription to the
transaction, as the broker does, and answers END_TXN after_ops only once
the transaction's sends and acks are answered (NOT_ALLOWED if one failed).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import pytest
from test_client_unit import FakeBroker, ack_ids, frame, messages_of

import client
import proto
import tc
from client import Client, MessageId, Transaction, TxnID, TxnState, errors
from client._consumer import build_ack
from client._producer import build_send, partition_for_key
from client._txn import TRANSITIONS, TxnEvent, transition
from proto import txnbuf_pb2 as pb
from tests.conftest import until

T = pb.BaseCommand
U64 = 2**64 - 1


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


async def full(c: Client, timeout: float = 60.0) -> Transaction:
    """A transaction on the full path (``flush()``: its sends and acks are
    framed as they come, and END_TXN ends it), for the tests of that path."""
    txn = await c.new_transaction(timeout=timeout)
    txn.flush()
    return txn


def index_of_first(fake: FakeBroker, predicate: Any) -> int:
    return next(i for i, cmd in enumerate(fake.received) if predicate(cmd))


def end_actions(fake: FakeBroker) -> list[int]:
    return [cmd.end_txn.txn_action for cmd in fake.of_type(T.END_TXN)]


def key_for(partition: int, partitions: int) -> str:
    return next(
        k for i in itertools.count() if partition_for_key(k := f"k{i}", partitions) == partition
    )


# --- TxnID ----------------------------------------------------------------------


def test_txnid_tcid_str_and_parse() -> None:
    txn_id = TxnID((5 << 48) | 9, 11)
    assert txn_id.tcid == 5 and TxnID(U64, 0).tcid == 2**16 - 1 and TxnID(0, U64).tcid == 0
    assert str(txn_id) == f"({(5 << 48) | 9},11)"
    assert str(TxnID(0, 0)) == "(0,0)"
    for value in (txn_id, TxnID(0, 0), TxnID(U64, U64)):
        assert TxnID.parse(str(value)) == value
    assert TxnID.parse(" ( 3 , 4 )\n") == TxnID(3, 4)
    assert txn_id == (txn_id.most_bits, txn_id.least_bits)  # a NamedTuple
    assert client.TxnID is TxnID is proto.TxnID is tc.TxnID  # one type on every side


@pytest.mark.parametrize(
    "text",
    ["", "()", "(1)", "(1,2,3)", "1,2", "(1,2", "[1,2]", "(a,2)", "(-1,2)", "(+1,2)",
     "(1.0,2)", "(0x1,2)", "(1,)", "TxnID(1,2)", "(\uff11,2)", f"({U64 + 1},0)", f"(0,{U64 + 1})"],
)  # fmt: skip
def test_txnid_parse_rejects_anything_else(text: str) -> None:
    with pytest.raises(ValueError, match="TxnID"):
        TxnID.parse(text)


# --- the state table ------------------------------------------------------------

S, E = TxnState, TxnEvent
LEGAL = {
    (S.OPEN, E.COMMIT): S.COMMITTING,
    (S.OPEN, E.ABORT): S.ABORTING,
    (S.OPEN, E.PREPARE): S.PREPARED,
    (S.PREPARED, E.COMMIT): S.COMMITTING,
    (S.PREPARED, E.ABORT): S.ABORTING,
    (S.COMMITTING, E.COMMIT): S.COMMITTING,
    (S.COMMITTING, E.ABORT): S.ABORTING,
    (S.ABORTING, E.ABORT): S.ABORTING,
    (S.COMMITTING, E.COMMITTED): S.COMMITTED,
    (S.COMMITTING, E.ABORTED): S.ABORTED,
    (S.ABORTING, E.ABORTED): S.ABORTED,
    (S.COMMITTING, E.LOST): S.ENDED,
    (S.ABORTING, E.LOST): S.ENDED,
}


@pytest.mark.parametrize(("state", "event"), list(itertools.product(TxnState, TxnEvent)))
def test_state_table(state: TxnState, event: TxnEvent) -> None:
    txn_id = TxnID(1, 2)
    if (state, event) in LEGAL:
        assert transition(state, event, txn_id) is LEGAL[state, event]
    else:
        with pytest.raises(errors.InvalidTxnStatusError, match=r"\(1,2\)"):
            transition(state, event, txn_id)


def test_state_table_facts() -> None:
    assert TRANSITIONS == LEGAL
    # no event leaves an ended transaction; ABORTING never turns into a commit
    assert not any(s in (S.COMMITTED, S.ABORTED, S.ENDED) for s, _ in TRANSITIONS)
    assert S.COMMITTED not in {TRANSITIONS.get((S.ABORTING, e)) for e in TxnEvent}


# --- frames ---------------------------------------------------------------------


def test_transactional_frames_carry_the_txnid_and_flag() -> None:
    entries: list[Any] = [(b"x", None, None, 5)]
    plain = build_send(1, 2, 0, entries, 0).send
    assert not plain.transactional and (plain.txnid_most_bits, plain.txnid_least_bits) == (0, 0)
    zero = build_send(1, 2, 0, entries, 0, TxnID(0, 0)).send
    assert zero.transactional  # TxnID (0,0) is valid: the flag tells
    sent = build_send(1, 2, 0, entries, 0, TxnID(7, 8)).send
    assert (sent.txnid_most_bits, sent.txnid_least_bits, sent.transactional) == (7, 8, True)
    ack = build_ack(1, 2, pb.CommandAck.INDIVIDUAL, [MessageId(0, 1, 0)], TxnID(0, 0)).ack
    assert ack.transactional and (ack.txnid_most_bits, ack.txnid_least_bits) == (0, 0)
    assert not build_ack(1, 2, pb.CommandAck.INDIVIDUAL, [MessageId(0, 1, 0)]).ack.transactional


# --- new transactions -----------------------------------------------------------


async def test_new_transactions_go_round_robin_over_tc_ids(fake: FakeBroker) -> None:
    fake.tc_ids = [3, 7]
    async with Client(fake.url, operation_timeout=5.0) as c:
        txns = [await c.new_transaction(timeout=2.5) for _ in range(3)]
    requests = [cmd.new_txn for cmd in fake.of_type(T.NEW_TXN)]
    assert [r.tc_id for r in requests] == [3, 7, 3]
    assert {r.txn_ttl_ms for r in requests} == {2500}
    assert [t.tc_id for t in txns] == [3, 7, 3]
    assert [t.id.tcid for t in txns] == [3, 7, 3]
    assert txns[0].id != txns[2].id
    assert str(txns[1].id) == f"({7 << 48},1)" and txns[0].timeout == 2.5
    assert all(t.state is TxnState.OPEN for t in txns)


async def test_without_tc_ids_coordinator_0_is_used(fake: FakeBroker, cli: Client) -> None:
    txn = await cli.new_transaction()
    assert fake.of_type(T.NEW_TXN)[0].new_txn.tc_id == 0 and txn.tc_id == 0
    assert fake.of_type(T.NEW_TXN)[0].new_txn.txn_ttl_ms == 60_000


async def test_coordinator_answers_survive_the_link_dying(fake: FakeBroker, cli: Client) -> None:
    # The answer comes, then the socket closes at once: a transaction outlives
    # its link, so neither the new transaction nor its end is asked for again.
    fake.close_after = {T.NEW_TXN}
    txn = await full(cli)
    assert len(fake.of_type(T.NEW_TXN)) == 1 and len(fake.txns) == 1
    fake.close_after = {T.END_TXN}
    await txn.commit()
    assert end_actions(fake) == [pb.COMMIT] and txn.state is TxnState.COMMITTED
    await until(lambda: fake.connects == 3)  # both links did die


async def test_new_transaction_refused_or_bad_timeout(fake: FakeBroker, cli: Client) -> None:
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(errors.InvalidInputError, match="timeout"):
            await cli.new_transaction(timeout=bad)  # type: ignore[arg-type]
    assert not fake.of_type(T.NEW_TXN)
    fake.txn_errors[T.NEW_TXN] = [pb.TRANSACTION_COORDINATOR_NOT_FOUND]
    with pytest.raises(errors.TransactionCoordinatorNotFoundError):
        await cli.new_transaction()
    fake.txn_errors[T.NEW_TXN] = [pb.SERVICE_NOT_READY]  # retriable: asked again
    txn = await cli.new_transaction()
    assert len(fake.of_type(T.NEW_TXN)) == 3 and txn.state is TxnState.OPEN


# --- participants ---------------------------------------------------------------


async def test_the_broker_adds_the_participants(fake: FakeBroker, cli: Client) -> None:
    """No ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN: the transactional
    SENDs and ACKs (individual and cumulative) carry the TxnID, and the
    broker adds their partition and subscription itself."""
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await asyncio.gather(*(producer.send(b"in-%d" % i) for i in range(2)))
    msgs = [await consumer.receive(timeout=5) for _ in range(2)]
    out = await cli.create_producer("out")
    txn = await full(cli)
    await asyncio.gather(*(out.send_nowait(b"%d" % i, txn=txn) for i in range(3)))
    await consumer.acknowledge(msgs[0], txn=txn)
    await consumer.acknowledge_cumulative(msgs[1], txn=txn)
    await until(lambda: len(fake.pending_acks) == 2)  # PENDING_ACK, not acked yet
    await txn.commit()
    assert set(fake.types()) <= {
        "CONNECT", "PARTITIONED_METADATA", "PRODUCER", "SUBSCRIBE", "FLOW", "SEND", "ACK",
        "NEW_TXN", "END_TXN",
    }  # fmt: skip
    sends = [s for s in fake.sends() if s.transactional]
    acks = [a for a in fake.acks() if a.transactional]
    assert sends and all((s.txnid_most_bits, s.txnid_least_bits) == txn.id for s in sends)
    assert acks and all((a.txnid_most_bits, a.txnid_least_bits) == txn.id for a in acks)
    assert {a.ack_type for a in acks} == {pb.CommandAck.INDIVIDUAL, pb.CommandAck.CUMULATIVE}
    assert fake.txn(txn.id).status == "COMMITTED"
    assert fake.txn(txn.id).partitions == {("out", 0)}
    assert fake.txn(txn.id).subscriptions == {("t", "s")}
    assert fake.stored("out") == [b"0", b"1", b"2"]
    assert not fake.subs["t", "s"].unacked and not fake.pending_acks


# --- framing --------------------------------------------------------------------


async def test_txn_and_plain_messages_never_share_a_frame(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    a, b = await full(cli), await full(cli)
    owners = [None, a, b] * 4
    futures = [producer.send_nowait(b"%d" % i, txn=txn) for i, txn in enumerate(owners)]
    await asyncio.gather(*futures)
    sends = fake.sends()
    assert len(sends) == 3  # one frame per owner: plain, a, b
    for send in sends:
        messages = messages_of(send)
        owner = owners[int(messages[0].payload)]
        assert [owners[int(m.payload)] for m in messages] == [owner] * 4
        if owner is None:
            assert not send.transactional
        else:
            assert send.transactional
            assert (send.txnid_most_bits, send.txnid_least_bits) == owner.id
    # one sequence-id counter for the producer, transactional or not
    seqs = sorted(m.sequence_id for s in sends for m in messages_of(s))
    assert seqs == list(range(12))
    assert futures[0].result() == MessageId(0, 0, 0)
    assert [futures[i].result() for i in (1, 4, 7, 10)] == [MessageId(0, -1, i) for i in range(4)]


async def test_txn_message_ids_count_within_the_transaction(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    txn = await cli.new_transaction()
    assert await producer.send(b"a", txn=txn) == MessageId(0, -1, 0)
    assert await producer.send(b"plain") == MessageId(0, 0, 0)
    assert await producer.send(b"b", txn=txn) == MessageId(0, -1, 1)
    assert (await consumer.receive(timeout=5)).value == b"plain"
    assert fake.stored("t") == [b"plain"]  # not visible before the commit
    await txn.commit()
    assert fake.stored("t") == [b"plain", b"a", b"b"]
    got = [await consumer.receive(timeout=5) for _ in range(2)]
    assert [m.value for m in got] == [b"a", b"b"]


async def test_producers_of_one_transaction_on_one_partition_get_their_places(
    fake: FakeBroker, cli: Client
) -> None:
    """Two producers' sends to one partition in one transaction, queued in
    turn: each is answered at once with its place in the transaction, and
    the frames go out in that order, so the broker places them there."""
    a, b = await cli.create_producer("t"), await cli.create_producer("t")
    txn = await full(cli)
    ids = [await p.send(b"%d" % i, txn=txn) for i, p in enumerate([a, b, a, a, b])]
    assert ids == [MessageId(0, -1, i) for i in range(5)]
    await txn.commit()  # (a place other than the answered one would fail it)
    placed = [single.payload for _, single in fake.txn(txn.id).buffers["t", 0]]
    assert placed == [b"0", b"1", b"2", b"3", b"4"]
    assert [len(messages_of(s)) for s in fake.sends()] == [1, 1, 2, 1]


async def test_awaited_txn_sends_and_acks_share_frames(fake: FakeBroker, cli: Client) -> None:
    """The README's loop (per message an awaited send and ack in the
    transaction): the awaits return at once, so the batch goes as one
    SEND and one ACK frame, and the commit right behind them."""
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(5)))
    batch = [await consumer.receive(timeout=5) for _ in range(5)]
    out = await cli.create_producer("out")
    before = len(fake.received)
    async with cli.transaction() as txn:
        txn.flush()  # (the full path)
        for msg in batch:
            await out.send(msg.value.upper(), txn=txn)
            await consumer.acknowledge(msg, txn=txn)
    sent = [cmd.type for cmd in fake.received[before:] if cmd.type != T.NEW_TXN]
    assert sent == [T.SEND, T.ACK, T.END_TXN]
    assert fake.stored("out") == [b"0", b"1", b"2", b"3", b"4"]
    assert not fake.subs["t", "s"].unacked


async def test_txn_acks_never_share_a_frame(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s", subscription_type="shared")
    await asyncio.gather(*(producer.send(b"x") for _ in range(6)))
    msgs = [await consumer.receive(timeout=5) for _ in range(6)]
    a, b = await full(cli), await full(cli)
    owner_of = dict(zip((m.message_id for m in msgs), [None, a, b] * 2, strict=True))
    await asyncio.gather(*(consumer.acknowledge(mid, txn=t) for mid, t in owner_of.items()))
    acks = fake.acks()
    assert len(acks) == 3  # one frame per owner: plain, a, b
    for ack in acks:
        ids = [MessageId(*position) for position in ack_ids(ack)]
        owners = {owner_of[mid] for mid in ids}
        assert len(ids) == 2 and len(owners) == 1
        (owner,) = owners
        assert ack.transactional == (owner is not None)
        if owner is not None:
            assert (ack.txnid_most_bits, ack.txnid_least_bits) == owner.id
    assert len(fake.pending_acks) == 4 and len(fake.subs["t", "s"].unacked) == 4


# --- commit and abort -----------------------------------------------------------


async def test_commit_waits_for_sends_in_flight(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.ignore_sends = True
    futures = [producer.send_nowait(b"%d" % i, txn=txn) for i in range(3)]
    cancelled = asyncio.ensure_future(producer.send(b"c", txn=txn))  # framed one turn later
    await until(lambda: len(fake.sends()) == 2)
    cancelled.cancel()  # the caller gives up; the transaction still waits for it
    committing = asyncio.ensure_future(txn.commit())
    await asyncio.sleep(0.1)
    # Written right behind the sends; the broker commits once they are answered.
    assert [cmd.end_txn.after_ops for cmd in fake.of_type(T.END_TXN)] == [True]
    assert not committing.done() and txn.state is TxnState.COMMITTING
    with pytest.raises(errors.InvalidTxnStatusError):
        await producer.send(b"late", txn=txn)  # no joining a transaction being committed
    with pytest.raises(errors.InvalidTxnStatusError, match="already"):
        await txn.abort()  # one commit or abort at a time
    buffer = fake.txn(txn.id).buffers["t", 0]
    for send in fake.sends():  # store and answer them, as the broker would
        await asyncio.sleep(0.05)
        assert not committing.done()
        ids = []
        for single in messages_of(send):
            ids.append(pb.MessageIdData(partition=0, entry_id=-1, batch_index=len(buffer)))
            buffer.append(("p", single))
        await fake.push(
            frame(
                T.SEND_RECEIPT,
                "send_receipt",
                producer_id=producer.producer_id,
                request_id=send.request_id,
                partition=0,
                entry_id=-1,
                message_ids=ids,
            )
        )
    await asyncio.wait_for(committing, 5)
    assert [f.result() for f in futures] == [MessageId(0, -1, i) for i in range(3)]
    assert end_actions(fake) == [pb.COMMIT] and txn.state is TxnState.COMMITTED
    assert fake.stored("t") == [b"0", b"1", b"2", b"c"]
    assert index_of_first(fake, lambda c: c.type == T.END_TXN) > index_of_first(
        fake, lambda c: c.type == T.SEND
    )


async def test_conflict_makes_commit_abort_and_raise(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    msg = await consumer.receive(timeout=5)
    first, second = await full(cli), await full(cli)
    await consumer.acknowledge(msg, txn=first)
    await consumer.acknowledge(msg, txn=second)  # queued: the broker's answer is the commit's
    await producer.send(b"out", txn=second)  # other work of the doomed transaction
    with pytest.raises(errors.TransactionConflictError):
        await second.commit()
    assert second.state is TxnState.ABORTED
    assert fake.txn(second.id).status == "ABORTED" and fake.stored("t") == [b"x"]
    await second.abort()  # abort after abort: nothing to do
    assert end_actions(fake) == [pb.COMMIT, pb.ABORT]  # (refused behind the failed ack)
    await first.commit()
    assert end_actions(fake) == [pb.COMMIT, pb.ABORT, pb.COMMIT]
    assert not fake.subs["t", "s"].unacked


async def test_refused_txn_ack_comes_again_after_abort(fake: FakeBroker, cli: Client) -> None:
    """A transactional ack the broker refused (here SERVICE_NOT_READY, as
    while its coordinator moves) changed nothing: the message is still
    delivered and unacknowledged, not PENDING_ACK, so the abort of the
    transaction does not redeliver it. The consumer asks for it again: an
    abort on purpose (no ``redeliver_unacknowledged`` by the application)
    still gets the message back, not only after a reconnect."""
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    msg = await consumer.receive(timeout=5)
    txn = await full(cli)
    fake.txn_ack_errors = [pb.SERVICE_NOT_READY]
    await consumer.acknowledge(msg, txn=txn)
    await txn.abort()
    assert txn.state is TxnState.ABORTED
    again = await consumer.receive(timeout=5)
    assert (again.message_id, again.value) == (msg.message_id, b"x")
    txn = await full(cli)
    await consumer.acknowledge(again, txn=txn)
    await txn.commit()
    assert not fake.subs["t", "s"].unacked


async def test_failed_send_makes_commit_abort(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    await producer.send(b"ok", txn=txn)
    fake.send_error = pb.PERSISTENCE_ERROR
    failed = producer.send_nowait(b"lost", txn=txn)
    assert failed.result() == MessageId(0, -1, 1)  # answered once queued
    with pytest.raises(errors.PersistenceError):  # the send's error, not the refusal
        await txn.commit()
    # The commit behind the failed send is refused, then the client aborts.
    assert end_actions(fake) == [pb.COMMIT, pb.ABORT] and txn.state is TxnState.ABORTED
    assert fake.stored("t") == []


async def test_txn_receipt_without_ids_is_a_protocol_error(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.ignore_sends = True
    pending = producer.send_nowait(b"x", txn=txn)
    await until(lambda: len(fake.sends()) == 1)
    assert pending.result() == MessageId(0, -1, 0)
    await answer_the_send(fake, producer, entry_id=-1)  # the plain-send shape: no message_ids
    await until(lambda: producer.pending == 0)
    with pytest.raises(errors.ProtocolError, match="transactional"):
        await txn.commit()
    assert end_actions(fake) == [pb.ABORT]


async def test_abort_goes_right_behind_sends_in_flight(fake: FakeBroker, cli: Client) -> None:
    """abort() frames what is queued and writes END_TXN ABORT behind it at
    once (after_ops); the broker aborts once it has answered them."""
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"in")
    msg = await consumer.receive(timeout=5)
    txn = await full(cli)
    fake.ignore_sends = True
    await producer.send(b"x", txn=txn)
    await consumer.acknowledge(msg, txn=txn)
    aborting = asyncio.ensure_future(txn.abort())  # in the same turn: nothing framed yet
    await until(lambda: len(fake.of_type(T.END_TXN)) == 1)
    assert [cmd.type for cmd in fake.received[-3:]] == [T.SEND, T.ACK, T.END_TXN]
    (end,) = fake.of_type(T.END_TXN)
    assert end.end_txn.after_ops and end.end_txn.txn_action == pb.ABORT
    await asyncio.sleep(0.05)
    assert not aborting.done()  # the broker has not answered the send yet
    await fake.push(  # it refuses it: an abort does not mind
        frame(
            T.SEND_ERROR,
            "send_error",
            producer_id=producer.producer_id,
            request_id=fake.sends()[-1].request_id,
            error=pb.INVALID_TXN_STATUS,
        )
    )
    await asyncio.wait_for(aborting, 5)
    assert txn.state is TxnState.ABORTED and fake.txn(txn.id).status == "ABORTED"
    assert producer.pending == 0 and not fake.pending_acks


async def test_use_after_end_raises(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    msg = await consumer.receive(timeout=5)
    committed = await cli.new_transaction()
    await producer.send(b"y", txn=committed)
    await committed.commit()
    aborted = await cli.new_transaction()
    await aborted.abort()
    before = len(fake.received)
    for txn in (committed, aborted):
        with pytest.raises(errors.InvalidTxnStatusError):
            await producer.send(b"z", txn=txn)
        with pytest.raises(errors.InvalidTxnStatusError):
            producer.send_nowait(b"z", txn=txn)
        with pytest.raises(errors.InvalidTxnStatusError):
            await consumer.acknowledge(msg, txn=txn)
        with pytest.raises(errors.InvalidTxnStatusError):
            await consumer.acknowledge_cumulative(msg, txn=txn)
    with pytest.raises(errors.InvalidTxnStatusError):
        await committed.abort()
    with pytest.raises(errors.InvalidTxnStatusError):
        await aborted.commit()
    await committed.commit()  # commit after commit, abort after abort: no-ops
    await aborted.abort()
    await asyncio.sleep(0.05)
    assert len(fake.received) == before  # nothing was sent for any of these
    assert producer.last_sequence_id == 1  # and no sequence id was used up
    assert committed.state is TxnState.COMMITTED and aborted.state is TxnState.ABORTED


@pytest.mark.parametrize(
    ("code", "cls", "state"),
    [
        (pb.TRANSACTION_TIMEOUT, errors.TransactionTimeoutError, TxnState.ABORTED),
        (pb.TRANSACTION_NOT_FOUND, errors.TransactionNotFoundError, TxnState.ENDED),
        (pb.INVALID_TXN_STATUS, errors.InvalidTxnStatusError, TxnState.ENDED),
    ],
)
async def test_coordinator_refusal_ends_the_transaction(
    fake: FakeBroker, cli: Client, code: int, cls: type[errors.ServerError], state: TxnState
) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    await producer.send(b"x", txn=txn)
    fake.txn_errors[T.END_TXN] = [code]
    with pytest.raises(cls):
        await txn.commit()
    assert txn.state is state
    with pytest.raises(errors.InvalidTxnStatusError):
        await producer.send(b"y", txn=txn)
    with pytest.raises(errors.InvalidTxnStatusError):
        await txn.commit()
    if state is TxnState.ABORTED:  # the coordinator aborted it: abort has nothing to do
        await txn.abort()
    else:
        with pytest.raises(errors.InvalidTxnStatusError):
            await txn.abort()
    assert len(fake.of_type(T.END_TXN)) == 1


async def test_commit_after_an_unknown_outcome_may_be_retried(fake: FakeBroker) -> None:
    async with Client(fake.url, operation_timeout=0.3) as c:
        txn = await full(c)
        fake.hold = {T.END_TXN}  # the answer never comes
        with pytest.raises(errors.OperationTimeoutError):
            await txn.commit()
        assert txn.state is TxnState.COMMITTING
        fake.hold = set()
        await txn.commit()  # again: END_TXN is idempotent on the coordinator
        assert txn.state is TxnState.COMMITTED
        assert end_actions(fake)[-1] == pb.COMMIT and fake.txn(txn.id).status == "COMMITTED"


async def test_transaction_from_another_client_is_refused(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    async with Client(fake.url, operation_timeout=5.0) as other:
        foreign = await other.new_transaction()
        with pytest.raises(errors.InvalidInputError, match="another Client"):
            await producer.send(b"x", txn=foreign)
    with pytest.raises(errors.InvalidInputError, match="Transaction"):
        await producer.send(b"x", txn="txn")  # type: ignore[arg-type]
    assert not fake.sends() and producer.pending == 0


# --- async with client.transaction() -------------------------------------------


async def test_transaction_block_commits_on_clean_exit(fake: FakeBroker, cli: Client) -> None:
    source = await cli.create_producer("in")
    consumer = await cli.subscribe("in", "s")
    reader = await cli.subscribe("out", "r")
    producer = await cli.create_producer("out")
    await source.send(b"order")
    msg = await consumer.receive(timeout=5)
    async with cli.transaction(timeout=10) as txn:
        txn.flush()  # (the full path)
        assert isinstance(txn, Transaction) and txn.state is TxnState.OPEN
        await producer.send(msg.value + b"-billed", txn=txn)
        await consumer.acknowledge(msg, txn=txn)
        assert fake.stored("out") == [] and fake.subs["in", "s"].unacked
    assert txn.state is TxnState.COMMITTED and end_actions(fake) == [pb.COMMIT]
    assert fake.of_type(T.NEW_TXN)[0].new_txn.txn_ttl_ms == 10_000
    assert not fake.subs["in", "s"].unacked
    assert (await reader.receive(timeout=5)).value == b"order-billed"


async def test_transaction_block_aborts_on_exception(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    with pytest.raises(RuntimeError, match="boom"):
        async with cli.transaction() as txn:
            await producer.send(b"x", txn=txn)
            raise RuntimeError("boom")
    assert txn.state is TxnState.ABORTED and end_actions(fake) == [pb.ABORT]
    assert fake.stored("t") == []


async def test_transaction_block_leaves_a_transaction_it_ended(
    fake: FakeBroker, cli: Client
) -> None:
    async with cli.transaction() as aborted:
        aborted.flush()  # (the full path)
        await aborted.abort()
    async with cli.transaction() as committed:
        committed.flush()  # (the full path)
        await committed.commit()
    assert end_actions(fake) == [pb.ABORT, pb.COMMIT]
    with pytest.raises(errors.TransactionConflictError):  # commit raised: no second END_TXN
        async with cli.transaction() as txn:
            txn.flush()  # (the full path)
            raise errors.TransactionConflictError("from the block")
    assert txn.state is TxnState.ABORTED and end_actions(fake) == [pb.ABORT, pb.COMMIT, pb.ABORT]


# --- reconnect ------------------------------------------------------------------


async def test_txn_send_in_flight_is_resent_after_reconnect(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.store_without_receipt = True
    assert await producer.send(b"x", txn=txn) == MessageId(0, -1, 0)
    await until(lambda: len(fake.sends()) == 1)
    fake.store_without_receipt = False
    await fake.drop_connections()
    await until(lambda: producer.pending == 0)  # answered on the new link
    first, resent = fake.sends()
    assert first == resent and resent.transactional
    await txn.commit()
    assert fake.stored("t") == [b"x"]  # stored once


async def test_txn_ack_in_flight_is_resent_after_reconnect(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    msg = await consumer.receive(timeout=5)
    txn = await full(cli)
    original = fake._on_ack

    async def swallow(ws: Any, ack: Any) -> None:
        return None

    fake._on_ack = swallow  # type: ignore[method-assign]
    pending = asyncio.ensure_future(consumer.acknowledge(msg, txn=txn))
    await until(lambda: len(fake.of_type(T.ACK)) == 1)
    fake._on_ack = original  # type: ignore[method-assign]
    await fake.drop_connections()
    await asyncio.wait_for(pending, 5)
    await until(lambda: len(fake.of_type(T.ACK)) == 2)
    first, resent = (cmd.ack for cmd in fake.of_type(T.ACK))
    assert first == resent and resent.transactional
    await txn.commit()
    assert not fake.subs["t", "s"].unacked


async def test_end_txn_is_retried_after_reconnect(fake: FakeBroker, cli: Client) -> None:
    txn = await full(cli)
    fake.hold = {T.END_TXN}
    committing = asyncio.ensure_future(txn.commit())
    await until(lambda: len(fake.of_type(T.END_TXN)) == 1)
    fake.hold = set()
    await fake.drop_connections()
    await asyncio.wait_for(committing, 5)
    assert end_actions(fake) == [pb.COMMIT, pb.COMMIT]
    assert txn.state is TxnState.COMMITTED


# --- subscribe ------------------------------------------------------------------


async def test_read_uncommitted_is_passed_to_subscribe(fake: FakeBroker, cli: Client) -> None:
    await cli.subscribe("t", "committed")
    uncommitted = await cli.subscribe("t", "dirty", read_uncommitted=True)
    assert uncommitted.read_uncommitted
    flags = {
        c.subscribe.subscription: c.subscribe.read_uncommitted for c in fake.of_type(T.SUBSCRIBE)
    }
    assert flags == {"committed": False, "dirty": True}
    with pytest.raises(errors.InvalidInputError, match="read_uncommitted"):
        await cli.subscribe("t", "x", read_uncommitted="yes")  # type: ignore[arg-type]
    await fake.drop_connections()  # re-subscribing keeps the flag
    await until(lambda: len(fake.of_type(T.SUBSCRIBE)) == 4)
    again = {
        c.subscribe.subscription: c.subscribe.read_uncommitted
        for c in fake.of_type(T.SUBSCRIBE)[2:]
    }
    assert again == flags


# --- receipts with first_batch_index -----------------------------------------------


async def answer_the_send(fake: FakeBroker, producer: Any, **receipt: Any) -> None:
    """Answer the (only) SEND with a receipt on partition 0 with these fields."""
    await fake.push(
        frame(
            T.SEND_RECEIPT,
            "send_receipt",
            producer_id=producer.producer_id,
            request_id=fake.sends()[0].request_id,
            partition=0,
            **receipt,
        )
    )


async def answer_with_first_batch_index(fake: FakeBroker, producer: Any, first: int) -> None:
    """Answer the (only) SEND with a receipt that gives ``first_batch_index``."""
    await answer_the_send(fake, producer, entry_id=-1, first_batch_index=first)


async def test_receipt_with_too_few_ids_makes_commit_abort(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.ignore_sends = True
    futures = [producer.send_nowait(b"%d" % i, txn=txn) for i in range(2)]
    await until(lambda: len(fake.sends()) == 1)
    await answer_the_send(
        fake, producer, message_ids=[pb.MessageIdData(partition=0, entry_id=-1, batch_index=0)]
    )
    assert [f.result() for f in futures] == [MessageId(0, -1, i) for i in range(2)]
    await until(lambda: producer.pending == 0)
    with pytest.raises(errors.ProtocolError, match="placed 2 messages"):
        await txn.commit()
    assert end_actions(fake) == [pb.ABORT] and producer.pending == 0


async def test_first_batch_index_answers_every_message(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.ignore_sends = True
    futures = [producer.send_nowait(b"%d" % i, txn=txn) for i in range(3)]
    assert [f.result() for f in futures] == [MessageId(0, -1, i) for i in range(3)]
    await until(lambda: len(fake.sends()) == 1)
    await answer_with_first_batch_index(fake, producer, 0)
    await until(lambda: producer.pending == 0)
    assert txn._error is None


async def test_places_other_than_the_answered_ones_make_commit_abort(
    fake: FakeBroker, cli: Client
) -> None:
    """The client answers a transactional send with its place at once; a
    broker that placed the messages elsewhere fails the transaction."""
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.ignore_sends = True
    futures = [producer.send_nowait(b"%d" % i, txn=txn) for i in range(3)]
    await until(lambda: len(fake.sends()) == 1)
    await answer_with_first_batch_index(fake, producer, 5)
    await until(lambda: producer.pending == 0)
    with pytest.raises(errors.ProtocolError, match=r"from place 5.*places from 0"):
        await txn.commit()
    assert [f.result() for f in futures] == [MessageId(0, -1, i) for i in range(3)]
    assert end_actions(fake) == [pb.ABORT] and producer.pending == 0


async def test_first_batch_index_zero_is_not_a_missing_id(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.ignore_sends = True
    future = producer.send_nowait(b"x", txn=txn)
    await until(lambda: len(fake.sends()) == 1)
    await answer_with_first_batch_index(fake, producer, 0)
    assert await future == MessageId(0, -1, 0)
    assert type(await future) is MessageId


# --- spare transactions (client._spares) ------------------------------------------


def txn_key(txn: Transaction) -> tuple[int, int]:
    return (txn.id.most_bits, txn.id.least_bits)


def open_txns(fake: FakeBroker) -> list[tuple[int, int]]:
    return [k for k, t in fake.txns.items() if t.status == "OPEN"]


async def test_ending_a_transaction_asks_for_the_next_one(fake: FakeBroker, cli: Client) -> None:
    fake.tc_ids = []
    first = await full(cli, 30)
    assert fake.types().count("NEW_TXN") == 1
    await first.commit()
    (end,) = [cmd.end_txn for cmd in fake.of_type(T.END_TXN)]
    assert end.next_txn_ttl_ms == 30_000 and end.next_tc_id == 0
    (spare,) = open_txns(fake)
    second = await full(cli, 30)
    assert txn_key(second) == spare and fake.types().count("NEW_TXN") == 1  # nothing sent
    assert second.timeout == 30 and second.state is TxnState.OPEN
    await second.abort()  # an abort asks for a spare too
    assert fake.of_type(T.END_TXN)[-1].end_txn.next_txn_ttl_ms == 30_000
    third = await full(cli, 30)
    assert fake.types().count("NEW_TXN") == 1 and txn_key(third) not in (spare, txn_key(first))


async def test_spares_go_round_robin_over_the_coordinators(fake: FakeBroker) -> None:
    fake.tc_ids = [3, 7]
    async with Client(fake.url, operation_timeout=5.0) as c:
        txn = await full(c)
        for _ in range(3):
            await txn.commit()
            txn = await full(c)
    assert [cmd.new_txn.tc_id for cmd in fake.of_type(T.NEW_TXN)] == [3]
    assert [cmd.end_txn.next_tc_id for cmd in fake.of_type(T.END_TXN)][:3] == [7, 3, 7]


async def test_a_spare_is_only_for_the_same_timeout(fake: FakeBroker, cli: Client) -> None:
    await (await cli.new_transaction(timeout=30)).commit()
    other = await cli.new_transaction(timeout=10)
    assert [cmd.new_txn.txn_ttl_ms for cmd in fake.of_type(T.NEW_TXN)] == [30_000, 10_000]
    assert fake.txn(other.id).ttl_ms == 10_000


async def test_a_failed_end_brings_no_spare_and_its_retry_asks_for_none(
    fake: FakeBroker, cli: Client
) -> None:
    txn = await full(cli, 30)
    fake.txn_errors[T.END_TXN] = [pb.SERVICE_NOT_READY]  # retriable: END is sent again
    await txn.commit()
    asked = [cmd.end_txn.HasField("next_txn_ttl_ms") for cmd in fake.of_type(T.END_TXN)]
    assert asked == [True, False]
    assert open_txns(fake) == []  # (the fake, like the broker, opens none for a failed END)
    await full(cli, 30)
    assert fake.types().count("NEW_TXN") == 2


async def test_spares_asked_for_are_bounded(
    fake: FakeBroker, cli: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client._spares, "MAX_SPARES", 3)
    txns = [await full(cli, 30) for _ in range(5)]
    fake.hold = {T.END_TXN}
    commits = [asyncio.ensure_future(t.commit()) for t in txns]
    await until(lambda: len(fake.of_type(T.END_TXN)) == 5)
    asked = [cmd.end_txn.HasField("next_txn_ttl_ms") for cmd in fake.of_type(T.END_TXN)]
    assert asked == [True, True, True, False, False]
    fake.hold = set()
    await fake.release()
    await asyncio.gather(*commits)
    assert len(open_txns(fake)) == 3
    await asyncio.gather(*(cli.new_transaction(timeout=30) for _ in range(3)))
    assert fake.types().count("NEW_TXN") == 5  # all three were spares
    await (await full(cli, 30)).commit()  # room again: it asks
    assert fake.of_type(T.END_TXN)[-1].end_txn.HasField("next_txn_ttl_ms")


async def test_a_spare_too_old_is_aborted_not_used(
    fake: FakeBroker, cli: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client._spares, "MAX_AGE", 0.05)
    await (await cli.new_transaction(timeout=30)).commit()
    (spare,) = open_txns(fake)
    await until(lambda: fake.txns[spare].status == "ABORTED")  # nobody took it in time
    fresh = await cli.new_transaction(timeout=30)
    assert txn_key(fresh) != spare and fake.txn(fresh.id).status == "OPEN"
    assert fake.types().count("NEW_TXN") == 2


async def test_spares_grown_old_are_all_aborted(
    fake: FakeBroker, cli: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One timer watches them all: it wakes for each spare in turn."""
    monkeypatch.setattr(client._spares, "MAX_AGE", 0.2)
    first = await cli.new_transaction(timeout=30)
    second = await cli.new_transaction(timeout=20)
    await first.commit()
    await asyncio.sleep(0.1)
    await second.commit()
    spares = open_txns(fake)
    assert len(spares) == 2
    await until(lambda: fake.txns[spares[0]].status == "ABORTED")
    assert fake.txns[spares[1]].status == "OPEN"  # younger: not yet
    await until(lambda: fake.txns[spares[1]].status == "ABORTED")


async def test_a_spare_with_a_short_timeout_is_aborted_after_a_tenth_of_it(
    fake: FakeBroker, cli: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spare loses at most a tenth of its timeout: one nobody takes is
    aborted then, not only after MAX_AGE (a minute here)."""
    monkeypatch.setattr(client._spares, "MAX_AGE", 60.0)
    await (await cli.new_transaction(timeout=0.5)).commit()  # a spare of 0.5 s: 50 ms
    (spare,) = open_txns(fake)
    await until(lambda: fake.txns[spare].status == "ABORTED", timeout=5.0)


async def test_a_spare_from_before_a_reconnect_is_not_used(fake: FakeBroker, cli: Client) -> None:
    # A restarted broker aborts the transactions it found open: a spare
    # answered on an earlier link may be one of them.
    await (await cli.new_transaction(timeout=30)).commit()
    (spare,) = open_txns(fake)
    await fake.drop_connections()
    await until(lambda: cli.connections == 2)
    fresh = await cli.new_transaction(timeout=30)
    assert txn_key(fresh) != spare
    assert fake.types().count("NEW_TXN") == 2


async def test_close_aborts_the_spares(fake: FakeBroker) -> None:
    async with Client(fake.url, operation_timeout=5.0) as c:
        await (await c.new_transaction(timeout=30)).commit()
    assert [t.status for t in fake.txns.values()] == ["COMMITTED", "ABORTED"]


# --- the commit goes right behind the sends (after_ops) -----------------------------


async def test_a_commit_is_written_right_behind_its_sends(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    futures = [producer.send_nowait(b"%d" % i, txn=txn) for i in range(3)]
    await txn.commit()
    (end,) = fake.of_type(T.END_TXN)
    assert end.end_txn.after_ops and end.end_txn.txn_action == pb.COMMIT
    last_send = max(i for i, cmd in enumerate(fake.received) if cmd.type == T.SEND)
    assert fake.received.index(end) > last_send
    assert all(f.done() and not f.exception() for f in futures)  # answered before the END
    assert txn.state is TxnState.COMMITTED and fake.txn(txn.id).status == "COMMITTED"


async def test_a_commit_refused_behind_a_failed_send_aborts(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.send_error = pb.TOPIC_NOT_FOUND
    producer.send_nowait(b"x", txn=txn)
    with pytest.raises(errors.TopicNotFoundError):  # the send's error, not the refusal
        await txn.commit()
    assert end_actions(fake) == [pb.COMMIT, pb.ABORT]
    # (an ABORT always goes behind the sends and acks)
    assert [cmd.end_txn.after_ops for cmd in fake.of_type(T.END_TXN)] == [True, True]
    assert txn.state is TxnState.ABORTED


async def test_a_commit_refused_without_a_failed_send_aborts_too(
    fake: FakeBroker, cli: Client
) -> None:
    producer = await cli.create_producer("t")
    txn = await full(cli)
    producer.send_nowait(b"x", txn=txn)
    fake.txn_errors[T.END_TXN] = [pb.NOT_ALLOWED]
    with pytest.raises(errors.NotAllowedError):
        await txn.commit()
    assert end_actions(fake) == [pb.COMMIT, pb.ABORT] and txn.state is TxnState.ABORTED


async def test_a_commit_behind_sends_cut_off_is_asked_again_after_them(
    fake: FakeBroker, cli: Client
) -> None:
    """The link dies before the END's answer: its outcome is unknown, so the
    client waits for the sends (re-sent on the new link), then sends END
    COMMIT again, not right behind them."""
    producer = await cli.create_producer("t")
    txn = await full(cli)
    producer.send_nowait(b"x", txn=txn)
    fake.hold = {T.END_TXN}
    committing = asyncio.ensure_future(txn.commit())
    await until(lambda: len(fake.of_type(T.END_TXN)) == 1)
    fake.hold = set()
    await fake.drop_connections()
    await committing
    assert [cmd.end_txn.after_ops for cmd in fake.of_type(T.END_TXN)] == [True, False]
    assert txn.state is TxnState.COMMITTED and fake.stored("t") == [b"x"]


@pytest.mark.parametrize("when", ["after", "during"])
async def test_a_send_failing_after_its_commit_succeeded_is_logged_loudly(
    fake: FakeBroker,
    cli: Client,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    when: str,
) -> None:
    """An ordering hole, reopened here on purpose (a send kept while its
    producer is re-created no longer holds the commit back): END_TXN is
    written before the send and commits without it, and the broker then
    refuses the send as too late. ``commit()`` succeeded, so the client
    logs a WARNING naming the transaction: the hole's only trace.
    ``during``: the refusal comes while the END's answer is on its way."""
    monkeypatch.setattr(Transaction, "_unwritten", lambda self: None)
    producer = await cli.create_producer("t")
    txn = await full(cli)
    current, producer._gen = producer._gen, -1  # (being re-created: its frames kept)
    producer.send_nowait(b"v", txn=txn)
    if when == "during":
        fake.hold = {T.END_TXN}
    committing = asyncio.ensure_future(txn.commit())
    await until(lambda: len(fake.of_type(T.END_TXN)) == 1)
    assert not fake.sends()  # (the END went first)
    (kept,) = producer._inflight.values()
    refusal = frame(
        T.SEND_ERROR,
        "send_error",
        producer_id=producer.producer_id,
        request_id=kept.request_id,
        error=pb.INVALID_TXN_STATUS,
        message="cannot add participants to a transaction that is COMMITTED",
    )
    with caplog.at_level(logging.WARNING, logger="client"):
        if when == "after":
            await committing
            await fake.push(refusal)
            await until(lambda: not producer._inflight)
        else:
            await fake.push(refusal)
            await until(lambda: txn._error is not None)
            assert txn.state is TxnState.COMMITTING
            fake.hold = set()
            await fake.release()
            await committing
    producer._gen = current
    assert txn.state is TxnState.COMMITTED
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and "after the transaction's commit succeeded" in r.getMessage()
    ]
    assert len(warned) == 1, warned
    assert str(txn.id) in warned[0] and "COMMITTED" in warned[0]


async def test_a_send_the_client_timed_out_during_a_commit_that_succeeded_is_not_warned_about(
    fake: FakeBroker, cli: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A send the client itself gave up on (its operation timeout) while the
    END was on its way may have been taken and committed (the broker
    decided): not a hole, no WARNING."""
    producer = await cli.create_producer("t")
    txn = await full(cli)
    fake.ignore_sends = True
    producer.send_nowait(b"v", txn=txn)
    committing = asyncio.ensure_future(txn.commit())
    await until(lambda: len(fake.of_type(T.END_TXN)) == 1)
    with caplog.at_level(logging.WARNING, logger="client"):
        producer.expire(asyncio.get_running_loop().time() + 3600)  # (its deadline passed)
        await until(lambda: txn._error is not None)
        assert isinstance(txn._error, errors.OperationTimeoutError)
        await answer_the_send(fake, producer, entry_id=-1, first_batch_index=0)  # (taken)
        await committing  # (the broker committed it behind the send)
    assert txn.state is TxnState.COMMITTED
    assert not [r for r in caplog.records if "commit succeeded" in r.getMessage()]


# --- the local path: held until one COMMIT_TXN -------------------------------------


def commits(fake: FakeBroker) -> list[pb.CommandCommitTxn]:
    return [cmd.commit_txn for cmd in fake.of_type(T.COMMIT_TXN)]


async def seeded(fake: FakeBroker, cli: Client, n: int, topic: str = "t") -> tuple[Any, list[Any]]:
    producer = await cli.create_producer(topic)
    consumer = await cli.subscribe(topic, "s")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(n)))
    return consumer, [await consumer.receive(timeout=5) for _ in range(n)]


async def test_the_readme_loop_is_one_commit_frame(fake: FakeBroker, cli: Client) -> None:
    """Sends and acks are held until the commit, which carries them, the
    acks as ranges, and the ask for the next transaction: one frame, one
    answer; no SEND, ACK or END_TXN."""
    consumer, batch = await seeded(fake, cli, 5)
    out = await cli.create_producer("out")
    async with cli.transaction(timeout=30) as txn:
        before = len(fake.received)
        for msg in batch:
            assert await out.send(msg.value.upper(), txn=txn) == MessageId(0, -1, int(msg.value))
            await consumer.acknowledge(msg, txn=txn)
        await asyncio.sleep(0.05)
        assert len(fake.received) == before  # nothing sent yet
    sent = [cmd.type for cmd in fake.received[before:] if cmd.type != T.FLOW]
    assert sent == [T.COMMIT_TXN]
    (commit,) = commits(fake)
    assert (commit.txnid_most_bits, commit.txnid_least_bits) == txn.id
    (send,) = commit.sends
    assert send.producer_id == out.producer_id and send.partition == 0
    assert [m.payload for m in messages_of(send)] == [b"0", b"1", b"2", b"3", b"4"]  # type: ignore[arg-type]
    assert send.HasField("first_sequence_id")
    (acks,) = commit.acks
    first = batch[0].message_id
    assert acks.consumer_id == consumer.consumer_id
    assert list(acks.ranges) == [first.partition, first.entry_id, 0, 4]  # one range
    assert commit.next_txn_ttl_ms == 30_000
    assert txn.state is TxnState.COMMITTED and fake.txn(txn.id).status == "COMMITTED"
    assert fake.stored("out") == [b"0", b"1", b"2", b"3", b"4"]
    assert not fake.subs["t", "s"].unacked
    assert len(open_txns(fake)) == 1  # the spare
    assert not txn._held_sends and not txn._held_acks and not out._held_in


async def test_held_sends_keep_their_places_across_producers(fake: FakeBroker, cli: Client) -> None:
    a, b = await cli.create_producer("t"), await cli.create_producer("t")
    txn = await cli.new_transaction()
    ids = [await p.send(b"%d" % i, txn=txn) for i, p in enumerate([a, b, a, a, b])]
    assert ids == [MessageId(0, -1, i) for i in range(5)]
    await txn.commit()
    (commit,) = commits(fake)
    owners = [s.producer_id for s in commit.sends]
    assert owners == [a.producer_id, b.producer_id, a.producer_id, b.producer_id]
    assert [len(messages_of(s)) for s in commit.sends] == [1, 1, 2, 1]  # type: ignore[arg-type]
    placed = [single.payload for _, single in fake.txn(txn.id).buffers["t", 0]]
    assert placed == [b"0", b"1", b"2", b"3", b"4"]


async def test_acks_held_out_of_order_make_several_ranges(fake: FakeBroker, cli: Client) -> None:
    consumer, batch = await seeded(fake, cli, 6)
    txn = await cli.new_transaction()
    for i in (0, 1, 2, 4, 5, 3):
        await consumer.acknowledge(batch[i], txn=txn)
    await txn.commit()
    (commit,) = commits(fake)
    e = batch[0].message_id.entry_id
    assert list(commit.acks[0].ranges) == [0, e, 0, 2, 0, e, 4, 5, 0, e, 3, 3]
    assert not fake.subs["t", "s"].unacked


async def test_a_refused_commit_aborts_and_asks_for_its_messages_again(
    fake: FakeBroker, cli: Client
) -> None:
    """Nothing was written: the client aborts (END_TXN ABORT), asks for the
    messages it had acknowledged again, and raises the refusal."""
    consumer, (msg,) = await seeded(fake, cli, 1)
    holder = await full(cli)
    await consumer.acknowledge(msg, txn=holder)  # PENDING_ACK in another transaction
    await until(lambda: len(fake.pending_acks) == 1)
    txn = await cli.new_transaction()
    await consumer.acknowledge(msg, txn=txn)
    with pytest.raises(errors.TransactionConflictError):
        await txn.commit()
    assert txn.state is TxnState.ABORTED and fake.txn(txn.id).status == "ABORTED"
    assert end_actions(fake) == [pb.ABORT]
    (redeliver,) = fake.of_type(T.REDELIVER_UNACKNOWLEDGED)
    assert [tuple(m.ListFields()) for m in redeliver.redeliver_unacknowledged.message_ids]
    assert redeliver.redeliver_unacknowledged.message_ids[0].entry_id == msg.message_id.entry_id
    await holder.commit()
    assert not fake.subs["t", "s"].unacked


@pytest.mark.parametrize(
    ("code", "cls", "state"),
    [
        (pb.TRANSACTION_TIMEOUT, errors.TransactionTimeoutError, TxnState.ABORTED),
        (pb.TRANSACTION_NOT_FOUND, errors.TransactionNotFoundError, TxnState.ENDED),
        (pb.INVALID_TXN_STATUS, errors.InvalidTxnStatusError, TxnState.ENDED),
    ],
)
async def test_a_commit_the_coordinator_refuses_ends_the_transaction(
    fake: FakeBroker, cli: Client, code: int, cls: type[errors.ServerError], state: TxnState
) -> None:
    producer = await cli.create_producer("t")
    txn = await cli.new_transaction()
    await producer.send(b"x", txn=txn)
    fake.txn_errors[T.COMMIT_TXN] = [code]
    with pytest.raises(cls):
        await txn.commit()
    assert txn.state is state and not txn._held_sends
    with pytest.raises(errors.InvalidTxnStatusError):
        await producer.send(b"y", txn=txn)
    assert len(commits(fake)) == 1 and not fake.of_type(T.END_TXN) and fake.stored("t") == []


async def test_a_commit_of_unknown_outcome_is_sent_again_as_it_was(fake: FakeBroker) -> None:
    async with Client(fake.url, operation_timeout=0.3) as c:
        consumer, batch = await seeded(fake, c, 2)
        producer = await c.create_producer("out")
        txn = await c.new_transaction()
        for msg in batch:
            await producer.send(msg.value, txn=txn)
            await consumer.acknowledge(msg, txn=txn)
        fake.hold = {T.COMMIT_TXN}  # its answer never comes
        with pytest.raises(errors.OperationTimeoutError):
            await txn.commit()
        assert txn.state is TxnState.COMMITTING
        fake.hold = set()
        await txn.commit()  # the broker wrote it: answered as done, nothing twice
    first, again = commits(fake)
    assert list(first.sends) == list(again.sends) and list(first.acks) == list(again.acks)
    assert first.HasField("next_txn_ttl_ms") and not again.HasField("next_txn_ttl_ms")
    assert txn.state is TxnState.COMMITTED and fake.stored("out") == [b"0", b"1"]


async def test_a_commit_whose_link_dies_is_sent_again_on_the_next(
    fake: FakeBroker, cli: Client
) -> None:
    producer = await cli.create_producer("t")
    txn = await cli.new_transaction()
    await producer.send(b"x", txn=txn)
    fake.hold = {T.COMMIT_TXN}
    committing = asyncio.ensure_future(txn.commit())
    await until(lambda: len(commits(fake)) == 1)
    fake.hold = set()
    await fake.drop_connections()
    await asyncio.wait_for(committing, 5)
    assert len(commits(fake)) == 2 and txn.state is TxnState.COMMITTED
    assert fake.stored("t") == [b"x"]  # once


async def test_abort_of_a_held_transaction_writes_nothing(fake: FakeBroker, cli: Client) -> None:
    consumer, (msg,) = await seeded(fake, cli, 1)
    out = await cli.create_producer("out")
    txn = await cli.new_transaction()
    await out.send(b"x", txn=txn)
    await consumer.acknowledge(msg, txn=txn)
    before = len(fake.received)
    await txn.abort()
    assert [cmd.type for cmd in fake.received[before:]] == [T.REDELIVER_UNACKNOWLEDGED, T.END_TXN]
    assert end_actions(fake) == [pb.ABORT] and txn.state is TxnState.ABORTED
    again = await consumer.receive(timeout=5)  # it comes again
    assert again.value == msg.value and again.redelivery_count == 1
    assert fake.stored("out") == []


async def test_what_does_not_fit_one_frame_goes_the_full_way(fake: FakeBroker) -> None:
    fake.max_message_size = 64 * 1024
    async with Client(fake.url, operation_timeout=5.0) as c:
        producer = await c.create_producer("t")
        txn = await c.new_transaction()
        sent = [await producer.send(b"%05d" % i + b"x" * 1000, txn=txn) for i in range(100)]
        assert sent == [MessageId(0, -1, i) for i in range(100)]
        assert not txn._holding  # it passed the frame's size: sent as it comes
        await txn.commit()
    assert not commits(fake) and end_actions(fake)[:1] == [pb.COMMIT]  # (then the spare's abort)
    assert [m[:5] for m in fake.stored("t")] == [b"%05d" % i for i in range(100)]


async def test_flush_cumulative_ack_and_closing_take_the_full_path(
    fake: FakeBroker, cli: Client
) -> None:
    consumer, batch = await seeded(fake, cli, 3)
    out = await cli.create_producer("out")
    flushed = await cli.new_transaction()
    await out.send(b"a", txn=flushed)
    flushed.flush()
    await until(lambda: len([s for s in fake.sends() if s.transactional]) == 1)
    await flushed.commit()
    cumulative = await cli.new_transaction()
    await consumer.acknowledge(batch[0], txn=cumulative)
    await consumer.acknowledge_cumulative(batch[1], txn=cumulative)
    assert not cumulative._holding
    await cumulative.commit()
    closing = await cli.new_transaction()
    await out.send(b"b", txn=closing)
    await out.close()  # its held send goes first
    await closing.commit()
    assert not commits(fake) and end_actions(fake) == [pb.COMMIT] * 3
    assert fake.stored("out") == [b"a", b"b"]
    assert list(fake.subs["t", "s"].unacked) == [batch[2].message_id]


async def test_a_spare_comes_with_the_commit(fake: FakeBroker, cli: Client) -> None:
    fake.tc_ids = [3, 7]
    async with Client(fake.url, operation_timeout=5.0) as c:
        txn = await c.new_transaction(timeout=20)
        for _ in range(3):
            await txn.commit()
            txn = await c.new_transaction(timeout=20)
    assert fake.types().count("NEW_TXN") == 1
    assert [cm.next_tc_id for cm in commits(fake)] == [7, 3, 7]
    assert {cm.next_txn_ttl_ms for cm in commits(fake)} == {20_000}


async def test_held_keys_and_properties_go_with_the_commit_or_the_full_way(
    fake: FakeBroker, cli: Client
) -> None:
    fake.partitions["t"] = 2
    producer = await cli.create_producer("t")
    for full_way in (False, True):
        txn = await cli.new_transaction()
        sent = [
            await producer.send(b"plain", txn=txn),
            await producer.send(b"keyed", key="k", txn=txn),
            await producer.send(b"props", properties={"p": "v"}, txn=txn),
            await producer.send(b"both", key="k", properties={"q": "w"}, txn=txn),
        ]
        if full_way:
            txn.flush()
        await txn.commit()
        stored = {
            single.payload: (
                single.key if single.HasField("key") else None,
                dict(single.properties),
            )
            for _, single in [x for b in fake.txn(txn.id).buffers.values() for x in b]
        }
        assert stored == {
            b"plain": (None, {}),
            b"keyed": ("k", {}),
            b"props": (None, {"p": "v"}),
            b"both": ("k", {"q": "w"}),
        }
        assert sent[1].partition == sent[3].partition == partition_for_key("k", 2)
    assert len(commits(fake)) == 1  # (the second went the full way)
