"""Trust boundaries: a participant obeys only its coordinator, and one that
refuses its coordinator's decision is surfaced, never retried in silence.

Against the real broker process, except the in-process check of the
participant itself (`test_the_participant_applies_only_what_the_coordinator_decided`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from broker import Broker
from client import Client, Consumer, errors
from proto import refusals
from proto import txnbuf_pb2 as pb
from tc import TxnID, TxnStatus
from tests.conftest import BrokerProcess, RawConnection, until

T = pb.BaseCommand


async def nothing_more(consumer: Consumer, wait: float = 0.5) -> None:
    with pytest.raises(errors.OperationTimeoutError):
        msg = await consumer.receive(timeout=wait)
        pytest.fail(f"unexpected message {msg.value!r} {msg.message_id}")


def admin_json(
    broker: BrokerProcess, method: str, path: str, body: bytes | None = None
) -> tuple[int, dict]:  # type: ignore[type-arg]
    status, raw = broker.admin(method, path, body)
    return status, json.loads(raw)


def forged_ends(most: int, least: int, action: int) -> list[tuple[int, str, object]]:
    """END_TXN_ON_PARTITION and END_TXN_ON_SUBSCRIPTION for one transaction,
    as anyone on the port could send them."""
    return [
        (
            T.END_TXN_ON_PARTITION,
            "end_txn_on_partition",
            pb.CommandEndTxnOnPartition(
                request_id=7,
                txnid_most_bits=most,
                txnid_least_bits=least,
                partition=pb.PartitionRef(topic="out", partition=0),
                txn_action=action,  # type: ignore[arg-type]
            ),
        ),
        (
            T.END_TXN_ON_SUBSCRIPTION,
            "end_txn_on_subscription",
            pb.CommandEndTxnOnSubscription(
                request_id=8,
                txnid_most_bits=most,
                txnid_least_bits=least,
                subscription=pb.SubscriptionRef(topic="in", subscription="copier"),
                txn_action=action,  # type: ignore[arg-type]
            ),
        ),
    ]


@pytest.mark.integration
async def test_a_forged_end_is_refused_and_changes_nothing(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        seed = await client.create_producer("in")
        await seed.send(b"input")
        source = await client.subscribe("in", "copier", initial_position="earliest")
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        producer = await client.create_producer("out")
        txn = await client.new_transaction(timeout=60)
        await producer.send(b"txn-msg-1", txn=txn)
        (msg,) = [await source.receive(timeout=10)]
        await source.acknowledge(msg, txn=txn)
        async with RawConnection(broker.url) as raw:
            for action in (pb.COMMIT, pb.ABORT):
                for kind, field, body in forged_ends(*txn.id, action):
                    answer = await raw.request(kind, field, body)
                    assert answer.type == T.TXN_RESPONSE
                    assert answer.txn_response.error == pb.AUTHORIZATION_ERROR
                    assert "'cluster' role" in answer.txn_response.message
        # Nothing changed: still OPEN at its coordinator, its message invisible,
        # its ack still pending.
        status, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert status == 200 and meta["status"] == "OPEN" and meta["stuck"] == []
        await nothing_more(sink)
        await txn.abort()
        status, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert meta["status"] in ("ABORTING", "ABORTED")
        await nothing_more(sink)
        late = await client.subscribe("out", "late", initial_position="earliest")
        await nothing_more(late)
        # The aborted ack is undone: the input comes back.
        await source.redeliver_unacknowledged()
        again = await source.receive(timeout=10)
        assert again.value == b"input"
    status, listed = admin_json(broker, "GET", "/admin/v1/transactions?state=STUCK")
    assert status == 200 and listed["transactions"] == []
    assert "Traceback" not in broker.log()


async def test_an_end_from_the_wire_applies_only_what_the_coordinator_decided(
    tmp_path: Path,
) -> None:
    broker = await Broker.open(tmp_path / "data")
    try:
        tc = broker.coordinators[0]
        txnid = tc.new_txn()
        topic = await broker.topics.get_or_create("out")
        await broker.publish_txn(
            topic.partitions[0], tuple(txnid), "p", [pb.SingleMessage(payload=b"x")]
        )  # type: ignore[arg-type]
        for commit in (True, False):
            with pytest.raises(
                refusals.InvalidTxnStatus, match="did not decide so \\(it is OPEN there\\)"
            ):
                await broker.end_txn_on_partition_durably("out", 0, txnid, commit)
            with pytest.raises(refusals.InvalidTxnStatus, match="did not decide so"):
                await broker.end_txn_on_subscription_durably("out", "s", txnid, commit)
        elsewhere = TxnID.of(7, 1)
        with pytest.raises(refusals.NotAllowed, match="coordinator 7, which does not run here"):
            await broker.end_txn_on_partition_durably("out", 0, elsewhere, True)
        buffer = topic.partitions[0].transaction_buffer
        assert buffer is not None and buffer.open_transactions() == [tuple(txnid)]
        # Its coordinator decides: now the participant applies it (and only it).
        await tc.end_txn(txnid, commit=False)
        assert tc.get(txnid).status in (TxnStatus.ABORTING, TxnStatus.ABORTED)  # type: ignore[union-attr]
        with pytest.raises(refusals.InvalidTxnStatus, match="cannot commit"):
            await broker.end_txn_on_partition_durably("out", 0, txnid, True)
        await broker.end_txn_on_partition_durably("out", 0, txnid, False)  # a repeat
        assert buffer.open_transactions() == []
    finally:
        await broker.close()


@pytest.mark.integration
async def test_a_restart_finishes_a_decided_transaction_without_a_stuck_participant(
    tmp_path: Path,
) -> None:
    """Killed after the commit decision was durable, before the partition
    applied it: the restarted coordinator tells the partition again while it
    opens (the broker's participant does not ask the coordinator back, so
    it applies the decision at once: nothing stuck, nothing logged at ERROR)."""
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.env["TXNBUF_FAULT"] = "tc.after_decision_logged"
    broker.start()
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer("out")
            txn = await client.new_transaction(timeout=60)
            await producer.send(b"decided", txn=txn)
            committing = asyncio.ensure_future(txn.commit())
            assert broker.proc is not None
            await asyncio.to_thread(broker.proc.wait, 30)  # the fault killed it
            assert "SIGKILL at tc.after_decision_logged" in broker.log()
            before = len(broker.log_path.read_text(errors="replace"))
            broker.env.pop("TXNBUF_FAULT")
            broker.start()
            try:
                await committing  # (retried on the new connection: the decision stands)
            except errors.TxnbufError:
                pass  # (or its outcome was not learnt: the messages say)
            sink = await client.subscribe("out", "reader", initial_position="earliest")
            msg = await sink.receive(timeout=10)
            assert msg.value == b"decided"
        _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
        assert meta["status"] == "COMMITTED" and meta["stuck"] == []
        after = broker.log_path.read_text(errors="replace")[before:]
        assert "(1 to finish" in after
        assert "did not apply the decision" not in after
        assert [line for line in after.splitlines() if " ERROR " in line] == []
    finally:
        broker.stop()


def stuck_txns(broker: BrokerProcess) -> list[dict]:  # type: ignore[type-arg]
    status, listed = admin_json(broker, "GET", "/admin/v1/transactions?state=STUCK")
    assert status == 200
    return listed["transactions"]  # type: ignore[no-any-return]


def metric(broker: BrokerProcess, name: str) -> float:
    _, body = broker.admin("GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"no metric {name}")


@pytest.mark.integration
async def test_a_refusing_participant_is_surfaced_and_an_operator_skips_it(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.env["TXNBUF_REFUSE"] = "broker.end_txn_on_participant"  # every time
    broker.start()
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer("out")
            sink = await client.subscribe("out", "reader", initial_position="earliest")
            txn = await client.new_transaction(timeout=60)
            txn.flush()  # (the full path: its participant is told the decision)
            await producer.send(b"never applied", txn=txn)
            # The decision is durable; the participant never applies it: END
            # answers after its wait, and the client's view is the coordinator's.
            await txn.commit()
            await until(lambda: bool(stuck_txns(broker)))
            (listed,) = stuck_txns(broker)
            assert listed["txnid"] == str(txn.id) and listed["status"] == "COMMITTING"
            (stuck,) = listed["stuck"]
            assert stuck["participant"] == "partition out/0"
            assert "TXNBUF_REFUSE" in stuck["reason"] and stuck["attempts"] >= 1
            assert metric(broker, "txnbuf_transactions_stuck") == 1
            assert metric(broker, "txnbuf_participant_end_failures_total") >= 1
            status, body = admin_json(broker, "POST", f"/admin/v1/transactions/{txn.id}/abort")
            assert status == 409 and "resolve" in body["error"]
            for bad in (b'{"action": "ignore"}', b"[]", b'{"action": "skip", "x": 1}'):
                status, _ = admin_json(
                    broker, "POST", f"/admin/v1/transactions/{txn.id}/resolve", bad
                )
                assert status == 400
            assert stuck_txns(broker)  # (bad input changed nothing)
            status, body = admin_json(
                broker, "POST", f"/admin/v1/transactions/{txn.id}/resolve", b'{"action": "skip"}'
            )
            assert status == 200 and body["participants"] == 1
            await until(lambda: not stuck_txns(broker))
            status, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
            assert meta["status"] == "COMMITTED" and meta["stuck"] == []
            assert metric(broker, "txnbuf_transactions_stuck") == 0
            status, body = admin_json(
                broker, "POST", f"/admin/v1/transactions/{txn.id}/resolve", b'{"action": "retry"}'
            )
            assert status == 409 and "not stuck" in body["error"]
            await nothing_more(sink)  # the skipped partition was left as it was
        log = broker.log()
        errors_logged = [line for line in log.splitlines() if " ERROR " in line]
        # ERROR once, then with backoff: far fewer lines than attempts
        assert 1 <= len(errors_logged) <= 4, errors_logged
        assert "did not apply the decision" in errors_logged[0]
        assert "skipped by an operator" in log
    finally:
        broker.stop()


@pytest.mark.integration
async def test_a_participant_that_refuses_for_a_while_applies_the_decision_after(
    tmp_path: Path,
) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.env["TXNBUF_REFUSE"] = "broker.end_txn_on_participant@4"
    broker.start()
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer("out")
            sink = await client.subscribe("out", "reader", initial_position="earliest")
            txn = await client.new_transaction(timeout=60)
            txn.flush()  # (the full path: its participant is told the decision)
            await producer.send(b"applied late", txn=txn)
            commit = asyncio.ensure_future(txn.commit())
            await until(lambda: bool(stuck_txns(broker)))
            # An operator asks for a retry now, until the participant applies it.
            while stuck_txns(broker):
                broker.admin(
                    "POST", f"/admin/v1/transactions/{txn.id}/resolve", b'{"action": "retry"}'
                )
                await asyncio.sleep(0.05)
            await commit
            msg = await sink.receive(timeout=10)
            assert msg.value == b"applied late"
            _, meta = admin_json(broker, "GET", f"/admin/v1/transactions/{txn.id}")
            assert meta["status"] == "COMMITTED" and meta["stuck"] == []
    finally:
        broker.stop()
