"""Brokers sharing one PostgreSQL database as a cluster (`txnbuf serve --store
URL --cluster`), as real processes: slots spread over every live broker; a
SIGKILLed broker's slots taken over once its lease expired and served (what
was committed readable, what was open aborted); a SIGTERMed one hands its
slots over without waiting for a lease, taken by the others as soon as it
nudges them, and a joining one gets its share as soon as it nudges the
others; a SIGSTOPped one that wakes after
its slots moved is fenced, drops everything and joins again, nothing
written twice or lost; two brokers racing for one slot leave one owner; a
command at a broker that does not own the slot is refused NOT_OWNER, naming
the owner. Tests wait for conditions (the slots table, the admin API),
never for a length of time."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from client import Client, errors
from cluster import PostgresMembership
from ledger import LedgerStore
from proto import txnbuf_pb2 as pb
from tests import conftest
from tests._cluster import (
    SLOTS,
    WAIT,
    cluster_broker,
    owner_id,
    owners,
    scrape,
    served_by,
    slots,
    spread_over,
    start_all,
    topic_in,
    wait_for,
)
from tests.conftest import BrokerProcess, RawConnection
from tests.test_metrics import value

pytestmark = pytest.mark.integration


async def drain(consumer: object, timeout: float = 2.0) -> list[bytes]:
    values: list[bytes] = []
    with pytest.raises(errors.OperationTimeoutError):
        while True:
            message = await consumer.receive(timeout=timeout)  # type: ignore[attr-defined]
            values.append(message.value)
            await consumer.acknowledge(message)  # type: ignore[attr-defined]
    return values


async def test_slots_spread_and_a_killed_brokers_slots_are_served_again(
    tmp_path: Path, pg_url: str, logs: list[BrokerProcess]
) -> None:
    start_all(tmp_path, pg_url, 3, 2.0, logs)
    a, b, c = logs
    await wait_for("slots spread over the 3 brokers", lambda: spread_over(pg_url, logs))
    mine = (await owners(pg_url))[owner_id(a)]
    async with Client(a.url, operation_timeout=3.0) as client:
        # A transaction whose coordinator and topic are in one slot of a's.
        committed = await client.new_transaction()
        assert committed.tc_id in mine
        kept = topic_in(committed.tc_id, "kept")
        producer = await client.create_producer(kept)
        for i in range(5):
            await producer.send(b"c%d" % i, txn=committed)
        await committed.commit()
        left_open = await client.new_transaction()
        assert left_open.tc_id in mine
        lost = topic_in(left_open.tc_id, "lost")
        open_producer = await client.create_producer(lost)
        for i in range(3):
            await open_producer.send(b"o%d" % i, txn=left_open)
        # A command for a slot a does not own: NOT_OWNER, naming the owner.
        elsewhere = next(s for s in range(SLOTS) if s not in mine)
        other = served_by(await owners(pg_url), elsewhere, [b, c])
        refused = pb.CommandPartitionedMetadataResponse()

        async def names_the_owner() -> bool:  # (once a's last look saw the owner)
            async with RawConnection(a.url) as raw:
                answer = await raw.request(
                    pb.BaseCommand.PARTITIONED_METADATA,
                    "partitioned_metadata",
                    pb.CommandPartitionedMetadata(request_id=1, topic=topic_in(elsewhere, "x")),
                )
            refused.CopyFrom(answer.partitioned_metadata_response)
            assert refused.error == pb.NOT_OWNER, answer
            return f"at {other.url}" in refused.message

        await wait_for("a names the owner", names_the_owner)
        assert f"slot {elsewhere}, which this broker does not serve" in refused.message
        a.kill()
    took = await wait_for(
        "a's slots taken by b and c", lambda: spread_over(pg_url, [b, c]), timeout=WAIT
    )
    print(f"SIGKILL -> every slot owned again: {took:.2f}s")
    found = await owners(pg_url)
    for topic, slot, expected in ((kept, committed.tc_id, [b"c%d" % i for i in range(5)]),
                                  (lost, left_open.tc_id, [])):  # fmt: skip
        owner = served_by(found, slot, [b, c])
        async with Client(owner.url, operation_timeout=30.0) as client:
            consumer = await client.subscribe(topic, "check", initial_position="earliest")
            assert await drain(consumer) == expected, topic
            # Served: a new message goes through (nothing open holds the partition).
            producer = await client.create_producer(topic)
            await producer.send(b"after")
            message = await consumer.receive(timeout=30)
            assert message.value == b"after"


async def test_a_sigtermed_broker_hands_its_slots_over_without_waiting_for_its_lease(
    tmp_path: Path, pg_url: str, logs: list[BrokerProcess]
) -> None:
    # (A lease of 30 s: it expires 20 s or more after the SIGTERM, and the
    # brokers look every 10 s; the nudges make both moves take far less.)
    ttl = 30.0
    start_all(tmp_path, pg_url, 2, ttl, logs)
    a, b = logs
    await wait_for("slots spread over 2 brokers", lambda: spread_over(pg_url, logs))
    # A join is balanced at once: the joiner nudges the others, which release
    # its share and nudge it back (without nudges: its next look, 10 s on).
    c = cluster_broker(tmp_path, pg_url, "b2", ttl)
    logs.append(c)
    c.start()
    took = await wait_for("slots spread over 3 brokers", lambda: spread_over(pg_url, logs))
    print(f"a third broker listening -> slots spread over 3: {took:.2f}s")
    assert took < ttl / 6, took
    nudged = {p: value(scrape(p), "txnbuf_cluster_nudges_received_total") for p in (b, c)}
    gone = owner_id(a)
    assert a.proc is not None
    a.proc.send_signal(signal.SIGTERM)
    took = await wait_for("a's slots handed to b and c", lambda: spread_over(pg_url, [b, c]), 18)
    print(f"SIGTERM -> every slot owned again: {took:.2f}s")
    # Taken when a's nudge came, not at b's and c's next looks (up to 10 s on).
    assert took < ttl / 6, took
    for proc in (b, c):
        assert value(scrape(proc), "txnbuf_cluster_nudges_received_total") > nudged[proc]
    assert a.proc.wait(timeout=WAIT) == 0
    assert "handed over every slot and left the cluster" in a.log()
    membership = await PostgresMembership.open(pg_url)
    try:
        assert gone not in (await membership.read()).brokers
    finally:
        await membership.close()


async def test_a_paused_broker_whose_slots_moved_is_fenced_drops_everything_and_rejoins(
    tmp_path: Path, pg_url: str, logs: list[BrokerProcess]
) -> None:
    start_all(tmp_path, pg_url, 2, 2.0, logs)
    a, b = logs
    await wait_for("slots spread over the 2 brokers", lambda: spread_over(pg_url, logs))
    slot = min((await owners(pg_url))[owner_id(a)])
    topic = topic_in(slot, "paused")
    acked: list[bytes] = []
    async with Client(a.url, operation_timeout=5.0) as client:
        producer = await client.create_producer(topic)
        for i in range(5):
            await producer.send(b"a%d" % i)
            acked.append(b"a%d" % i)
        assert a.proc is not None
        a.proc.send_signal(signal.SIGSTOP)
        # Sent to the paused broker: read when it wakes, after its slots moved.
        during = asyncio.ensure_future(producer.send(b"during"))
        await wait_for("a's slots taken by b", lambda: spread_over(pg_url, [b]))
        async with Client(b.url) as other:
            p2 = await other.create_producer(topic)
            for i in range(5):
                await p2.send(b"b%d" % i)
                acked.append(b"b%d" % i)
        a.proc.send_signal(signal.SIGCONT)
        try:
            await during
            acked.append(b"during")  # (acknowledged: it must be stored once)
        except (errors.TxnbufError, OSError, TimeoutError):
            pass
    await wait_for(
        "a dropped everything", lambda: _true("dropping everything held in memory" in a.log())
    )
    await wait_for("a rejoined and took its share back", lambda: spread_over(pg_url, logs))
    found = await owners(pg_url)
    owner = served_by(found, slot, logs)
    async with Client(owner.url, operation_timeout=30.0) as client:
        consumer = await client.subscribe(topic, "check", initial_position="earliest")
        values = await drain(consumer)
    assert len(values) == len(set(values)), f"written twice: {values}"
    assert set(acked) <= set(values), f"lost: {set(acked) - set(values)}"
    assert set(values) <= set(acked) | {b"during"}


async def _true(value: bool) -> bool:
    return value


async def test_two_brokers_racing_for_free_slots_leave_one_owner_each(pg_url: str) -> None:
    ledgers = await LedgerStore.open(pg_url)  # (the schema)
    one = await PostgresMembership.open(pg_url)
    two = await PostgresMembership.open(pg_url)
    try:
        await one.join("one", "http://one", 30)
        await two.join("two", "http://two", 30)
        for slot in range(SLOTS):
            won = await asyncio.gather(one.take("one", {slot: 0}), two.take("two", {slot: 0}))
            assert sorted(len(w) for w in won) == [0, 1], (slot, won)
        rows = await slots(pg_url)
        assert all(owner in ("one", "two") and epoch == 1 for _, owner, epoch in rows)
    finally:
        await one.close()
        await two.close()
        await ledgers.close()


# (tests/test_kafka_cluster.py imports the three-broker helpers and this
# fixture from here; they live in tests/_cluster.py and tests/conftest.py.)
logs = conftest.logs
