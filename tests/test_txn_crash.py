"""Transactions under SIGKILL at chosen steps (TXNBUF_FAULT, see ledger/_faults.py).

Each test arms one step, runs a consume-transform-produce transaction over
two output partitions and one input subscription, lets the broker die at
that step, restarts it without the fault and checks DESIGN.md's invariants:
the transaction is applied entirely or not at all (sends visible to a
read-committed consumer exactly once, inputs never redelivered - or no
send visible and every input redelivered), and a decision once logged is
carried out. The full path's steps run a transaction that takes it
(``Transaction.flush``); the local path's (one COMMIT_TXN, one group
commit) the README's own: killed between its durable write and its answer,
and with several transactions' records in one group commit, held by the
store's writer (``TXNBUF_WRITER_STALL``) until they all are queued.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from client import Client, errors
from tests.conftest import BrokerProcess, until

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.auth]

N_INPUTS = 6


async def setup_topics(broker: BrokerProcess) -> None:
    status, _ = broker.admin("PUT", "/admin/v1/topics/out", b'{"partitions": 2}')
    assert status == 200
    async with Client(broker.url) as client:
        # Create the subscriptions first so they see everything.
        await (await client.subscribe("out", "reader", initial_position="earliest")).close()
        await (await client.subscribe("in", "copier", initial_position="earliest")).close()
        producer = await client.create_producer("in")
        for i in range(N_INPUTS):
            await producer.send(b"in-%d" % i)


async def run_copy(broker: BrokerProcess, full: bool = True) -> BaseException | None:
    """Copy every input to both output partitions in one transaction; commit.
    ``full``: the full path (else the local one: one COMMIT_TXN)."""
    async with Client(broker.url, operation_timeout=20.0) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        producer = await client.create_producer("out", producer_name="copier")
        inputs = [await source.receive(timeout=10) for _ in range(N_INPUTS)]
        try:
            txn = await client.new_transaction(timeout=120)
            if full:
                txn.flush()
            for i, m in enumerate(inputs):
                await producer.send(m.value.replace(b"in", b"out"), key=f"k{i}", txn=txn)
            for m in inputs:
                await source.acknowledge(m, txn=txn)
            await txn.commit()
        except errors.TxnbufError as exc:
            return exc
    return None


async def outcome(broker: BrokerProcess) -> tuple[list[bytes], list[bytes]]:
    """(outputs a read-committed consumer sees, inputs still to be consumed)."""
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        source = await client.subscribe("in", "copier", initial_position="earliest")
        outs, ins = [], []
        for consumer, into in ((sink, outs), (source, ins)):
            while True:
                try:
                    into.append((await consumer.receive(timeout=2.0)).value)
                except errors.OperationTimeoutError:
                    break
    return outs, ins


def assert_all_or_nothing(outs: list[bytes], ins: list[bytes]) -> str:
    expected_out = Counter(b"out-%d" % i for i in range(N_INPUTS))
    expected_in = Counter(b"in-%d" % i for i in range(N_INPUTS))
    if Counter(outs) == expected_out:
        assert ins == [], f"committed, but inputs come again: {ins}"
        return "committed"
    assert outs == [], f"partial or duplicated outputs: {sorted(outs)}"
    assert Counter(ins) == expected_in, f"aborted, but inputs are missing: {sorted(ins)}"
    return "aborted"


async def wait_ended(broker: BrokerProcess) -> None:
    def finished() -> bool:
        return not [
            t
            for state in ("COMMITTING", "ABORTING")
            for t in json.loads(broker.admin("GET", f"/admin/v1/transactions?state={state}")[1])[
                "transactions"
            ]
        ]

    await until(finished, "the transactions to finish after the restart")


async def abort_open_transactions(broker: BrokerProcess) -> None:
    """What an operator does for a client that gave up: abort what it left open."""
    status, body = broker.admin("GET", "/admin/v1/transactions?state=OPEN")
    assert status == 200
    for txn in json.loads(body)["transactions"]:
        status, _ = broker.admin("POST", f"/admin/v1/transactions/{txn['txnid']}/abort")
        assert status == 200


async def crash_at(
    broker: BrokerProcess, step: str, full: bool = True
) -> tuple[str, BaseException | None]:
    await setup_topics(broker)
    broker.stop()
    broker.env["TXNBUF_FAULT"] = step
    broker.start()
    copy = asyncio.create_task(run_copy(broker, full))
    assert broker.proc is not None
    await asyncio.to_thread(broker.proc.wait, 30)  # the fault killed it
    assert f"SIGKILL at {step.split('@')[0]}" in broker.log()
    broker.env.pop("TXNBUF_FAULT")
    broker.start()  # the client reconnects and carries on, or gives up
    error = await copy
    if error is not None:
        await abort_open_transactions(broker)
    await wait_ended(broker)
    result = assert_all_or_nothing(*await outcome(broker))
    # Nothing is left open where the transaction wrote (a restart aborts
    # on the participants what its coordinator found open).
    _, body = broker.admin("GET", "/admin/v1/topics/out/stats")
    for part in json.loads(body)["partitions"]:
        assert part["transaction_buffer"] is None or part["transaction_buffer"]["open"] == 0, part
    return result, error


@pytest.mark.parametrize(
    "step",
    [
        "tc.after_decision_logged",  # COMMITTING logged, no marker yet
        "buffer.after_commit_marker",  # marker on the partition, no sidecar record
        "tc.after_partition_end@1",  # one partition committed, the other not
        "tc.after_subscription_end",  # acks committed, COMMITTED not logged
    ],
)
async def test_a_logged_commit_survives_a_crash_at(broker: BrokerProcess, step: str) -> None:
    result, _ = await crash_at(broker, step)
    assert result == "committed"


@pytest.mark.parametrize(
    "step",
    [
        "buffer.after_txn_data_write",  # during a transactional send
        "subscriptions.after_pending_ack_write",  # during a transactional ack
    ],
)
async def test_a_crash_inside_an_open_transaction_is_all_or_nothing(
    broker: BrokerProcess, step: str
) -> None:
    # The broker answers a transaction's sends and acks before they are
    # durable, so its restart aborts every transaction it finds open: the
    # client's commit fails, and nothing of the transaction is seen. Unless
    # the client was that fast: its later acks and its END were queued
    # while the store was busy, so the group commit that holds the record
    # of this step holds the COMMITTING record too. Then the commit stands
    # and the client's retried END says so.
    result, error = await crash_at(broker, step)
    if result == "committed":
        assert error is None, repr(error)
    else:
        assert isinstance(error, errors.InvalidTxnStatusError | errors.TransactionNotFoundError), (
            repr(error)
        )


@pytest.mark.parametrize("broker", ["postgresql"], indirect=True)
async def test_a_logged_commit_survives_a_crash_on_postgresql(broker: BrokerProcess) -> None:
    """The same crash on a broker whose store is PostgreSQL: one partition
    committed, the other not, when the broker is SIGKILLed."""
    result, _ = await crash_at(broker, "tc.after_partition_end@1")
    assert result == "committed"


# -- the local path: one COMMIT_TXN, one group commit -----------------------------


async def test_a_local_commit_killed_before_its_answer_is_answered_as_done(
    broker: BrokerProcess,
) -> None:
    """Killed once the transaction's one group commit is durable, before
    its answer: the client sends the commit again to the restarted broker,
    which finds it COMMITTED and answers it as done; nothing is stored
    twice, no input comes again."""
    result, error = await crash_at(broker, "broker.after_local_commit", full=False)
    assert result == "committed" and error is None, repr(error)
    _, body = broker.admin("GET", "/admin/v1/transactions?state=COMMITTED")
    (committed,) = json.loads(body)["transactions"]
    assert committed["partitions"] and committed["subscriptions"]


COPIERS = 4


async def setup_copiers(broker: BrokerProcess) -> None:
    """Topics in0..in3, each with N_INPUTS inputs, each copied by one copier."""
    status, _ = broker.admin("PUT", "/admin/v1/topics/out", b'{"partitions": 2}')
    assert status == 200
    async with Client(broker.url) as client:
        await (await client.subscribe("out", "reader", initial_position="earliest")).close()
        for c in range(COPIERS):
            await (await client.subscribe(f"in{c}", "copier", initial_position="earliest")).close()
            producer = await client.create_producer(f"in{c}")
            for i in range(N_INPUTS):
                await producer.send(b"in-%d-%d" % (c, i))


async def copier(broker: BrokerProcess, c: int, queued: asyncio.Event) -> BaseException | None:
    """Copy topic in<c> to out in one local transaction; ``queued`` is set
    once its commit is sent."""
    async with Client(broker.url, operation_timeout=30.0) as client:
        source = await client.subscribe(f"in{c}", "copier", initial_position="earliest")
        producer = await client.create_producer("out", producer_name=f"copier-{c}")
        inputs = [await source.receive(timeout=10) for _ in range(N_INPUTS)]
        try:
            async with client.transaction(timeout=120) as txn:
                for i, m in enumerate(inputs):
                    await producer.send(m.value.replace(b"in", b"out"), key=f"k{i}", txn=txn)
                    await source.acknowledge(m, txn=txn)
                queued.set()
        except errors.TxnbufError as exc:
            return exc
    return None


async def copied(broker: BrokerProcess) -> tuple[Counter[bytes], dict[int, list[bytes]]]:
    """(the outputs a read-committed consumer sees, each copier's inputs still
    to be consumed)."""
    async with Client(broker.url) as client:
        sink = await client.subscribe("out", "reader", initial_position="earliest")
        left: dict[int, list[bytes]] = {}
        outs: Counter[bytes] = Counter()
        for consumer, c in [(sink, -1)] + [
            (await client.subscribe(f"in{c}", "copier", initial_position="earliest"), c)
            for c in range(COPIERS)
        ]:
            while True:
                try:
                    value = (await consumer.receive(timeout=2.0)).value
                except errors.OperationTimeoutError:
                    break
                if c < 0:
                    outs[value] += 1
                else:
                    left.setdefault(c, []).append(value)
    return outs, left


async def several_in_one_group_commit(
    broker: BrokerProcess, stall: Path, holder: Client
) -> list[asyncio.Task[BaseException | None]]:
    """Start the copiers with the store's writer held (by a send of
    ``holder``'s), and return once every one's commit is queued behind the
    held write (their transactions are COMMITTED at the coordinator, in
    memory, and nothing of them is durable)."""
    await setup_copiers(broker)
    other = await holder.create_producer("other")
    await asyncio.to_thread(stall.touch)  # the next write is held, and what follows waits
    other.send_nowait(b"held")
    for _ in range(500):
        if await asyncio.to_thread(stall.with_name(stall.name + ".held").exists):
            break
        await asyncio.sleep(0.01)
    else:
        raise AssertionError("the writer did not hold a write")
    events = [asyncio.Event() for _ in range(COPIERS)]
    tasks = [asyncio.create_task(copier(broker, c, events[c])) for c in range(COPIERS)]
    for _ in range(3000):
        _, body = broker.admin("GET", "/admin/v1/transactions?state=COMMITTED")
        if len(json.loads(body)["transactions"]) == COPIERS:
            return tasks
        await asyncio.sleep(0.01)
    raise AssertionError("the commits were not all queued")


async def test_a_group_commit_of_several_local_transactions_killed_after_it_is_durable(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Several transactions' records in one group commit (their writes
    gathered behind a held one), the broker killed at the first answer,
    once that group commit is durable: every one of them committed, each
    copier's retried commit answered as done, every output once."""
    stall = tmp_path / "stall"
    broker.stop()
    broker.env["TXNBUF_WRITER_STALL"] = str(stall)
    broker.env["TXNBUF_FAULT"] = "broker.after_local_commit"
    broker.start()
    holder = Client(broker.url, operation_timeout=30.0)
    tasks = await several_in_one_group_commit(broker, stall, holder)
    stall.unlink()  # the held write commits, then the four transactions in one group
    assert broker.proc is not None
    await asyncio.to_thread(broker.proc.wait, 30)
    assert "SIGKILL at broker.after_local_commit" in broker.log()
    del broker.env["TXNBUF_FAULT"], broker.env["TXNBUF_WRITER_STALL"]
    broker.start()
    errors_ = await asyncio.gather(*tasks)
    await holder.close()
    assert errors_ == [None] * COPIERS
    outs, left = await copied(broker)
    expected = Counter(b"out-%d-%d" % (c, i) for c in range(COPIERS) for i in range(N_INPUTS))
    assert outs == expected and left == {}


async def test_a_group_commit_of_several_local_transactions_killed_before_it_is_durable(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """The same group commit, the broker killed while the writer holds it:
    none of them happened. Each copier's commit is refused after the
    restart (the coordinator aborted what it found open), no output is
    seen, every input comes again."""
    stall = tmp_path / "stall"
    broker.stop()
    broker.env["TXNBUF_WRITER_STALL"] = str(stall)
    broker.start()
    holder = Client(broker.url, operation_timeout=30.0)
    tasks = await several_in_one_group_commit(broker, stall, holder)
    broker.kill()
    stall.unlink()
    del broker.env["TXNBUF_WRITER_STALL"]
    broker.start()
    await holder.close()
    for error in await asyncio.gather(*tasks):
        assert isinstance(error, errors.InvalidTxnStatusError | errors.TransactionNotFoundError), (
            repr(error)
        )
    outs, left = await copied(broker)
    assert outs == Counter()
    assert left == {c: [b"in-%d-%d" % (c, i) for i in range(N_INPUTS)] for c in range(COPIERS)}


@pytest.mark.parametrize("broker", ["postgresql"], indirect=True)
async def test_a_local_commit_killed_before_its_answer_on_postgresql(
    broker: BrokerProcess,
) -> None:
    """The local path on a broker whose store is PostgreSQL: its records are
    one PostgreSQL transaction; killed before the answer, the retried commit
    is answered as done."""
    result, error = await crash_at(broker, "broker.after_local_commit", full=False)
    assert result == "committed" and error is None, repr(error)


async def test_a_commit_is_lost_with_its_sends_answered_before_durable(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """A transaction's sends and acks are answered before they are durable
    and start no group commit of their own: the END's takes them along, in
    append order before the decision. The store's writer holds every write
    from the transaction's first send on (TXNBUF_WRITER_STALL) and the
    broker is killed with the decision read and not durable: the restart
    finds nothing of the transaction, the commit fails and every input of
    it comes again; the transaction before it stays committed."""
    await setup_topics(broker)
    stall = tmp_path / "stall"
    broker.stop()
    broker.env["TXNBUF_WRITER_STALL"] = str(stall)
    broker.start()
    async with Client(broker.url, operation_timeout=20.0) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        producer = await client.create_producer("out", producer_name="copier")
        inputs = [await source.receive(timeout=10) for _ in range(N_INPUTS)]
        kept, lost = inputs[:2], inputs[2:]
        # A first transaction makes both partitions' transaction buffers (a
        # send that makes one waits for it to be durable): keys k4 and k0
        # go to partitions 0 and 1.
        # Both take the full path (`Transaction.flush`): a local commit
        # makes no transaction buffer and holds its sends in the client.
        async with client.transaction(timeout=120) as txn:
            txn.flush()
            for key, m in zip(("k4", "k0"), kept, strict=True):
                await producer.send(m.value.replace(b"in", b"out"), key=key, txn=txn)
                await source.acknowledge(m, txn=txn)
        stall.touch()  # from here on the writer holds every write, committing none
        txn = await client.new_transaction(timeout=120)
        txn.flush()
        for i, m in enumerate(lost):
            await producer.send(m.value.replace(b"in", b"out"), key=f"k{i}", txn=txn)
            await source.acknowledge(m, txn=txn)
        commit = asyncio.create_task(txn.commit())
        await wait_for_state(broker, "COMMITTING")  # read, decided, not durable
        broker.kill()
        stall.unlink()
        broker.env.pop("TXNBUF_WRITER_STALL")
        broker.start()
        with pytest.raises((errors.InvalidTxnStatusError, errors.TransactionNotFoundError)):
            await commit
    outs, ins = await outcome(broker)
    assert sorted(outs) == sorted(m.value.replace(b"in", b"out") for m in kept)
    assert sorted(ins) == sorted(m.value for m in lost)


async def wait_for_state(broker: BrokerProcess, state: str) -> None:
    """Wait until the broker's coordinator lists a transaction in ``state``."""
    for _ in range(1000):
        status, body = broker.admin("GET", f"/admin/v1/transactions?state={state}")
        assert status == 200
        if json.loads(body)["transactions"]:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"no transaction became {state}")
