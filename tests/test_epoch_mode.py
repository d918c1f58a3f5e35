"""The producer-epoch mode end to end (Kafka's transactional producer,
KIP-890, KIP-939), against the real broker process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from client import Client, Consumer, Message, PreparedTxnState, ProducerState, errors
from tests.conftest import BrokerProcess, both_stores

pytestmark = pytest.mark.integration


async def receive_all(consumer: Consumer, wait: float = 1.0) -> list[Message]:
    got = []
    while True:
        try:
            got.append(await consumer.receive(timeout=wait))
        except errors.OperationTimeoutError:
            return got


async def seed(client: Client, topic: str, n: int) -> None:
    producer = await client.create_producer(topic)
    await asyncio.gather(*(producer.send(b"in-%d" % i) for i in range(n)))
    await producer.close()


@pytest.fixture
def broker_2pc(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    proc.args = ["--allow-2pc"]
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


@both_stores
async def test_copy_commit_and_abort_with_send_offsets(broker: BrokerProcess) -> None:
    broker.admin("PUT", "/admin/v1/topics/out", b'{"partitions": 2}')
    async with Client(broker.url) as client:
        await seed(client, "in", 6)
        source = await client.subscribe("in", "copier", initial_position="earliest")
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        p = await client.create_transactional_producer("copier-1", transaction_timeout=30)
        await p.init_transactions()
        first = p.producer_id, p.epoch
        assert first[1] == 0 and p.state is ProducerState.READY
        inputs = [await source.receive(timeout=10) for _ in range(6)]
        # A committed transaction: the first three, to both partitions.
        await p.begin_transaction()
        for i, m in enumerate(inputs[:3]):
            await p.send("out", m.value.replace(b"in", b"out"), key=f"k{i}")
        await p.send_offsets_to_transaction(source, inputs[:3])
        assert await receive_all(sink, 0.3) == []  # read committed: nothing yet
        await p.commit_transaction()
        assert (p.producer_id, p.epoch) == (first[0], 1)  # KIP-890: bumped per transaction
        got = sorted(m.value for m in await receive_all(sink))
        assert got == [b"out-0", b"out-1", b"out-2"]
        # An aborted one: nothing visible, its inputs come back.
        await p.begin_transaction()
        for m in inputs[3:]:
            await p.send("out", m.value.replace(b"in", b"out"))
        await p.send_offsets_to_transaction(source, inputs[3:])
        await p.abort_transaction()
        assert p.epoch == 2
        assert await receive_all(sink, 0.5) == []
        await source.redeliver_unacknowledged()
        again = sorted(m.value for m in await receive_all(source))
        assert again == [b"in-3", b"in-4", b"in-5"]
        # The registry, as the admin API shows it.
        status, body = broker.admin("GET", "/admin/v1/producers/copier-1")
        assert status == 200
        described = json.loads(body)
        assert described["producer_id"] == p.producer_id and described["producer_epoch"] == 2
        assert described["ongoing_txnid"] is None


@both_stores
async def test_a_new_instance_fences_the_old_one_everywhere(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        await seed(client, "in", 2)
        source = await client.subscribe("in", "copier", initial_position="earliest")
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        msg = await source.receive(timeout=10)
        zombie = await client.create_transactional_producer("copier", transaction_timeout=30)
        await zombie.init_transactions()
        await zombie.begin_transaction()
        await zombie.send("out", b"zombie-1")
        await zombie.commit_transaction()  # (epoch 1 now)
        await zombie.begin_transaction()
        await zombie.send("out", b"zombie-2")
        await zombie.send_offsets_to_transaction(source, [msg])
        # A second instance with the same transactional id: the zombie's
        # open transaction is aborted before it is answered.
        fresh = await client.create_transactional_producer("copier", transaction_timeout=30)
        await fresh.init_transactions()
        assert fresh.producer_id == zombie.producer_id and fresh.epoch == zombie.epoch + 1
        with pytest.raises(errors.ProducerFencedError) as fenced:
            await zombie.send("out", b"zombie-3")
            await zombie.commit_transaction()
        assert fenced.value.fatal and zombie.state is ProducerState.FATAL
        with pytest.raises(errors.InvalidTxnStateError, match="fatal"):
            await zombie.begin_transaction()
        values = [m.value for m in await receive_all(sink)]
        assert values == [b"zombie-1"]  # only what committed before the fence
        # The input the zombie acked in its aborted transaction is pending again.
        await source.redeliver_unacknowledged()
        assert [m.value for m in await receive_all(source)] == [b"in-0", b"in-1"]


async def test_a_timed_out_transaction_is_abortable_and_the_producer_goes_on(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        p = await client.create_transactional_producer("slow", transaction_timeout=0.3)
        await p.init_transactions()
        await p.begin_transaction()
        assert (await (await p.send("out", b"too late"))).entry_id == -1  # (stored)
        await asyncio.sleep(1.0)  # the coordinator aborts it and bumps the epoch
        with pytest.raises(errors.TransactionAbortableError):
            await p.commit_transaction()
        assert p.state is ProducerState.ABORTABLE
        await p.abort_transaction()
        await p.begin_transaction()
        await p.send("out", b"in time")
        await p.commit_transaction()
        assert [m.value for m in await receive_all(sink)] == [b"in time"]


async def test_bad_calls_are_refused_and_change_nothing(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        p = await client.create_transactional_producer("t1", transaction_timeout=30)
        with pytest.raises(errors.InvalidTxnStateError, match="uninitialized"):
            await p.begin_transaction()
        await p.init_transactions()
        with pytest.raises(errors.InvalidTxnStateError, match="ready"):
            await p.send("out", b"x")  # no transaction begun
        with pytest.raises(errors.InvalidTxnStateError):
            await p.prepare_transaction()
        await p.begin_transaction()
        with pytest.raises(errors.InvalidTxnStateError):
            await p.begin_transaction()
        await p.send("out", b"x")
        with pytest.raises(errors.InvalidTxnStateError, match="two-phase"):
            await p.prepare_transaction()  # 2PC not enabled
        assert p.state is ProducerState.ABORTABLE
        await p.abort_transaction()
        # The broker does not allow 2PC here (no --allow-2pc).
        two = await client.create_transactional_producer("t2", enable_2pc=True)
        with pytest.raises(errors.AuthorizationError, match="TWO_PHASE_COMMIT"):
            await two.init_transactions()
        status, _ = broker.admin("GET", "/admin/v1/producers/t2")
        assert status == 404  # refused: nothing registered
        with pytest.raises(errors.InvalidInputError):
            await client.create_transactional_producer("t3", transaction_timeout=3600)
        with pytest.raises(errors.InvalidInputError):
            PreparedTxnState("not-a-state")


async def test_two_phase_commit_survives_a_broker_kill_between_prepare_and_complete(
    broker_2pc: BrokerProcess,
) -> None:
    broker = broker_2pc
    async with Client(broker.url) as client:
        p = await client.create_transactional_producer("dual", enable_2pc=True)
        await p.init_transactions()
        await p.begin_transaction()
        for i in range(20):
            await p.send("out", b"prepared-%d" % i, key=str(i % 3))
        state = await p.prepare_transaction()
        assert str(state) == f"{p.producer_id}:{p.epoch}"
        saved = str(state)  # (what the application stores with its own data)
        with pytest.raises(errors.InvalidTxnStateError):
            await p.send("out", b"after prepare")
    broker.kill()  # SIGKILL between prepare and complete
    broker.start()
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        assert await receive_all(sink, 0.5) == []  # prepared: not visible, not aborted
        status, body = broker.admin("GET", "/admin/v1/transactions?state=PREPARED")
        assert status == 200 and len(json.loads(body)["transactions"]) == 1
        p = await client.create_transactional_producer("dual", enable_2pc=True)
        await p.init_transactions(keep_prepared_txn=True)
        assert p.state is ProducerState.PREPARED
        with pytest.raises(errors.InvalidTxnStateError):
            await p.begin_transaction()
        await p.complete_transaction(PreparedTxnState(saved))
        values = sorted(m.value for m in await receive_all(sink))
        assert values == sorted(b"prepared-%d" % i for i in range(20))
        # Nothing ongoing now: complete is a no-op.
        await p.complete_transaction(PreparedTxnState(saved))
        assert p.state is ProducerState.READY


async def test_complete_with_a_stale_state_aborts(broker_2pc: BrokerProcess) -> None:
    async with Client(broker_2pc.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        p = await client.create_transactional_producer("dual", enable_2pc=True)
        await p.init_transactions()
        await p.begin_transaction()
        await p.send("out", b"first")
        old = await p.prepare_transaction()
        await p.commit_transaction()
        await p.begin_transaction()
        await p.send("out", b"second")
        await p.prepare_transaction()
        # The application's database holds the state of the first transaction
        # (its own commit of the second failed): the second is aborted.
        fresh = await client.create_transactional_producer("dual", enable_2pc=True)
        await fresh.init_transactions(keep_prepared_txn=True)
        await fresh.complete_transaction(old)
        assert [m.value for m in await receive_all(sink)] == [b"first"]


async def test_a_failed_send_refuses_the_commit_written_behind_it(broker: BrokerProcess) -> None:
    """commit_transaction writes its END right behind the PRODUCE without
    waiting for the answer; the broker refuses the END because the send
    failed (a sequence gap here), nothing is committed, the commit raises
    the send's error and only abort goes on."""
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        p = await client.create_transactional_producer("gap", transaction_timeout=30)
        await p.init_transactions()
        await p.begin_transaction()
        lost = await p.send("out", b"never")
        p._partitions[("out", 0)].next_seq = 5  # (the PRODUCE will start at 5, not 0)
        with pytest.raises(errors.OutOfOrderSequenceError):
            await p.commit_transaction()
        assert p.state is ProducerState.ABORTABLE and lost.done()
        assert isinstance(lost.exception(), errors.OutOfOrderSequenceError)
        with pytest.raises(errors.InvalidTxnStateError):
            await p.commit_transaction()
        await p.abort_transaction()
        await p.begin_transaction()
        sent = [await p.send("out", b"kept-%d" % i) for i in range(3)]
        await p.commit_transaction()
        assert [f.result() for f in sent] == [(0, -1, i) for i in range(3)]  # answered
        assert [m.value for m in await receive_all(sink)] == [b"kept-0", b"kept-1", b"kept-2"]


async def test_a_failed_send_refuses_the_prepare_written_behind_it(
    broker_2pc: BrokerProcess,
) -> None:
    async with Client(broker_2pc.url) as client:
        p = await client.create_transactional_producer("gap", enable_2pc=True)
        await p.init_transactions()
        await p.begin_transaction()
        await p.send("out", b"never")
        p._partitions[("out", 0)].next_seq = 5
        with pytest.raises(errors.OutOfOrderSequenceError):
            await p.prepare_transaction()
        assert p.state is ProducerState.ABORTABLE
        status, body = broker_2pc.admin("GET", "/admin/v1/transactions?state=PREPARED")
        assert status == 200 and json.loads(body)["transactions"] == []
        await p.abort_transaction()


async def test_sends_behind_a_produce_in_flight_are_committed_too(broker: BrokerProcess) -> None:
    """A send queued while its partition's PRODUCE is in flight goes in the
    next PRODUCE; the commit then waits for both before its END."""
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        p = await client.create_transactional_producer("late", transaction_timeout=30)
        await p.init_transactions()
        await p.begin_transaction()
        first = await p.send("out", b"a")
        await asyncio.sleep(0)  # its PRODUCE is written, the answer not read yet
        assert p._partitions[("out", 0)].inflight is not None
        second = await p.send("out", b"b")
        await p.commit_transaction()
        assert (first.result(), second.result()) == ((0, -1, 0), (0, -1, 1))
        assert [m.value for m in await receive_all(sink)] == [b"a", b"b"]


EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "dual_write.py"


def run_example(broker: BrokerProcess, db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--url", broker.url, "--db", str(db),
         "--orders", "120", "--batch", "20", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize("where", ["after", "before"])
async def test_the_dual_write_example_recovers_after_a_crash_around_its_db_commit(
    broker_2pc: BrokerProcess, tmp_path: Path, where: str
) -> None:
    """SIGKILL of the writer in batch 2, after (or before) its database
    commit and before the broker commit; the next run's recovery commits
    (or aborts) the prepared transaction as the database decided; in the
    end every order is in the database once and in the topic once."""
    db = tmp_path / "orders.db"
    crashed = run_example(broker_2pc, db, f"--crash-{where}-db-commit", "2")
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0]
    assert rows == (60 if where == "after" else 40)  # batches 0, 1 (and 2 if after)
    status, body = broker_2pc.admin("GET", "/admin/v1/transactions?state=PREPARED")
    assert status == 200 and len(json.loads(body)["transactions"]) == 1  # batch 2, left prepared
    done = run_example(broker_2pc, db)
    assert done.returncode == 0, done.stderr
    assert f"recovered: {rows} orders" in done.stdout
    with contextlib.closing(sqlite3.connect(db)) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM orders ORDER BY id")]
    assert ids == list(range(120))
    async with Client(broker_2pc.url) as client:
        events = await client.subscribe("order-events", "audit", initial_position="earliest")
        got = [m.value for m in await receive_all(events)]
    assert sorted(got) == sorted(b"order %d amount %d" % (i, i * 10) for i in range(120))


async def test_a_transaction_lost_in_a_restart_is_never_reported_committed(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Sends are answered before they are durable. The broker is SIGKILLed
    with a transaction's sends answered and its writes (its begin included)
    held by the store's writer, so the restart loses all of it; the commit
    that follows is refused (the broker finds nothing ongoing), never
    reported done, and the abort that follows lets the producer go on."""
    stall = tmp_path / "stall"
    broker.stop()
    broker.env["TXNBUF_WRITER_STALL"] = str(stall)
    broker.start()
    async with Client(broker.url, operation_timeout=30) as client:
        p = await client.create_transactional_producer("lost")
        await p.init_transactions()
        await p.begin_transaction()
        await p.send("out", b"first")
        await p.commit_transaction()
        stall.touch()  # every write from here on is held, not committed
        await p.begin_transaction()
        sent = [await p.send("out", b"lost-%d" % i) for i in range(5)]
        await asyncio.gather(*sent)  # answered (queued, not durable)
        broker.kill()
        stall.unlink()
        broker.start()
        with pytest.raises(errors.TransactionAbortableError, match="no transaction here"):
            await p.commit_transaction()
        await p.abort_transaction()
        await p.begin_transaction()
        await p.send("out", b"next")
        await p.commit_transaction()
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        assert sorted(m.value for m in await receive_all(sink)) == [b"first", b"next"]


async def test_a_transaction_that_wrote_nothing_ends_in_the_client(broker: BrokerProcess) -> None:
    """Commit, abort and prepare of a transaction that sent and acknowledged
    nothing send nothing and keep the identity (as Kafka's clients do)."""
    async with Client(broker.url) as client:
        p = await client.create_transactional_producer("idle")
        await p.init_transactions()
        identity = (p.producer_id, p.epoch)
        for end in (p.commit_transaction, p.abort_transaction):
            await p.begin_transaction()
            await end()
            assert (p.producer_id, p.epoch) == identity and p.state is ProducerState.READY
        await p.begin_transaction()
        await p.send("out", b"x")
        await p.commit_transaction()
        assert (p.producer_id, p.epoch) == (identity[0], identity[1] + 1)
