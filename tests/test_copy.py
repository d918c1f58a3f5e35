"""A copy test in the spirit of Kafka's transactions_test.py.

10,000 seeded input messages are copied by a consume-transform-produce
copier, 100 per transaction, about a third of the transactions aborted on
purpose, while the broker is SIGKILLed and restarted three times. A
read-committed consumer reads the output all along. At the end the output
must hold every input exactly once, and the reader must never have seen a
message of an aborted transaction or a duplicate. Every other transaction
acknowledges its inputs, then queues its sends without awaiting them
(``send_nowait``), so its commit goes right behind them, unanswered (END_TXN
``after_ops``).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from client import Client, Consumer, Message, errors
from tests.conftest import BrokerProcess

pytestmark = [pytest.mark.integration, pytest.mark.crash, pytest.mark.auth]

N = 10_000
PER_TXN = 100
SEED = 20261122


async def take_batch(consumer: Consumer, limit: int) -> list[Message]:
    batch = [await consumer.receive(timeout=30)]
    while len(batch) < limit:
        try:
            batch.append(await consumer.receive(timeout=0.05))
        except errors.OperationTimeoutError:
            break
    return batch


def retrieve(future: asyncio.Future[object]) -> None:
    if not future.cancelled():
        future.exception()


async def test_copy_exactly_once_through_aborts_and_broker_kills(broker: BrokerProcess) -> None:
    rng = random.Random(SEED)
    for topic in ("copy-in", "copy-out"):
        status, _ = broker.admin("PUT", f"/admin/v1/topics/{topic}", b'{"partitions": 2}')
        assert status == 200
    async with Client(broker.url, operation_timeout=30.0) as client:
        reader = await client.subscribe("copy-out", "reader", initial_position="earliest")
        source = await client.subscribe("copy-in", "copier", initial_position="earliest")
        seeder = await client.create_producer("copy-in")
        await asyncio.gather(*(seeder.send(b"%d" % i, key=str(i)) for i in range(N)))
        sink = await client.create_producer("copy-out", producer_name="copier-out")

        aborted: set[int] = set()  # attempt numbers aborted on purpose
        seen: list[tuple[int, int, object]] = []  # (input, attempt, message id) read
        copied = asyncio.Event()

        async def read_output() -> None:
            while True:
                msg = await reader.receive()
                value, attempt = msg.value.split(b"@")
                seen.append((int(value), int(attempt), msg.message_id))
                await reader.acknowledge(msg)
                if len({v for v, _, _ in seen}) == N:
                    copied.set()

        async def copy() -> None:
            attempt = 0
            while not copied.is_set():
                try:
                    batch = await take_batch(source, PER_TXN)
                except errors.OperationTimeoutError:
                    continue
                attempt += 1
                abort = rng.random() < 1 / 3
                try:
                    txn = await client.new_transaction(timeout=60)
                    if attempt % 2:  # acks first, then the sends, unanswered at commit
                        await source.acknowledge(batch, txn=txn)
                        for m in batch:
                            value = m.value + b"@%d" % attempt
                            queued = sink.send_nowait(value, key=m.key, txn=txn)
                            queued.add_done_callback(retrieve)  # (the commit reports it)
                    else:
                        for m in batch:
                            await sink.send(m.value + b"@%d" % attempt, key=m.key, txn=txn)
                        for m in batch:
                            await source.acknowledge(m, txn=txn)
                    if abort:
                        aborted.add(attempt)
                        await txn.abort()
                    else:
                        await txn.commit()
                except errors.TxnbufError:
                    # Outcome unknown (e.g. the broker died mid-commit): the
                    # inputs come back if it aborted, the outputs show if not.
                    try:
                        await txn.abort()
                    except errors.TxnbufError:
                        pass
                    await source.redeliver_unacknowledged()

        async def kill_three_times() -> None:
            for fraction in (0.2, 0.45, 0.7):
                while len(seen) < N * fraction:  # noqa: ASYNC110 - polling a list is clearest here
                    await asyncio.sleep(0.05)
                await asyncio.to_thread(broker.restart)

        reading = asyncio.create_task(read_output())
        killing = asyncio.create_task(kill_three_times())
        copying = asyncio.create_task(copy())
        await asyncio.wait_for(copied.wait(), timeout=600)
        await killing
        copying.cancel()
        await asyncio.sleep(1.0)  # anything late would show up now
        reading.cancel()

    values = Counter(v for v, _, _ in seen)
    assert set(values) == set(range(N)), f"missing {sorted(set(range(N)) - set(values))[:20]}"
    # The reader acks as it goes: the same message delivered again after a
    # broker crash (its ack was in flight) is at-least-once delivery; the same
    # input under two message ids would be a duplicate write.
    ids_of: dict[int, set[object]] = {}
    for v, _, mid in seen:
        ids_of.setdefault(v, set()).add(mid)
    written_twice = sorted(v for v, ids in ids_of.items() if len(ids) > 1)
    assert not written_twice, f"inputs copied twice: {written_twice[:20]}"
    from_aborted = [(v, a) for v, a, _ in seen if a in aborted]
    assert not from_aborted, f"read messages of aborted transactions: {from_aborted[:20]}"
    assert len(aborted) >= 10, "the test should abort about a third of its transactions"
    assert broker.log().count("recovered") >= 4  # three restarts happened
