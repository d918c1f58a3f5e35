"""Transaction groups on the wire (`client.TransactionGroups`,
`Transaction.prepare`) and in the admin API, against a real broker process,
SIGKILLed where it matters."""

from __future__ import annotations

import json

import pytest

from client import Client, Position, SubscriptionCursor, TransactionGroups
from client.errors import (
    AuthorizationError,
    InvalidInputError,
    InvalidTxnStatusError,
    TransactionCoordinatorNotFoundError,
)
from tests.conftest import BrokerProcess, until

pytestmark = pytest.mark.integration


async def values(client: Client, topic: str) -> list[bytes]:
    reader = await client.create_reader(topic)
    return [m.value for m in await reader.read_batch(10_000)]


async def test_a_batch_commits_as_one_unit_once(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        groups = TransactionGroups(client)
        tc_id = await groups.coordinator_for("query-1")
        producer = await client.create_producer("out")
        txns = []
        for task in range(3):
            txn = await groups.new_transaction("query-1/0", prepared_timeout=60, tc_id=tc_id)
            await producer.send(b"task-%d" % task, txn=txn)
            await txn.prepare()
            txns.append(txn)
        assert await values(client, "out") == []  # prepared: not visible
        await txns[0].prepare()  # (again: answered at once)
        stray = await groups.new_transaction("query-1/0", tc_id=tc_id)
        await producer.send(b"failed-attempt", txn=stray)
        await stray.prepare()

        result = await groups.commit(
            "query-1", 0, [t.id for t in txns], abort_tag="query-1/0", tc_id=tc_id
        )
        assert result == (False, 3, 1)
        assert sorted(await values(client, "out")) == [b"task-0", b"task-1", b"task-2"]
        # The same batch again (a driver that crashed before recording it):
        replay = await groups.new_transaction("query-1/0", tc_id=tc_id)
        await producer.send(b"task-0", txn=replay)
        await replay.prepare()
        assert await groups.commit("query-1", 0, [replay.id], tc_id=tc_id) == (True, 0, 1)
        # ... and the same request again (its answer lost): a duplicate too.
        assert await groups.commit("query-1", 0, [t.id for t in txns], tc_id=tc_id) == (
            True,
            0,
            0,
        )
        assert sorted(await values(client, "out")) == [b"task-0", b"task-1", b"task-2"]
        with pytest.raises(InvalidTxnStatusError):
            await producer.send(b"after-prepare", txn=replay)  # refused: not open


async def test_a_group_with_an_open_member_is_refused_and_changes_nothing(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        groups = TransactionGroups(client)
        producer = await client.create_producer("out")
        ready = await groups.new_transaction("q/1")
        await producer.send(b"ready", txn=ready)
        await ready.prepare()
        unfinished = await groups.new_transaction("q/1")
        await producer.send(b"unfinished", txn=unfinished)
        with pytest.raises(InvalidTxnStatusError, match="PREPARED"):
            await groups.commit("q", 1, [ready.id, unfinished.id], abort_tag="q/1", tc_id=0)
        assert await values(client, "out") == []
        await unfinished.prepare()
        assert await groups.commit("q", 1, [ready.id, unfinished.id], tc_id=0) == (False, 2, 0)
        assert sorted(await values(client, "out")) == [b"ready", b"unfinished"]
        with pytest.raises(InvalidInputError):
            await groups.commit("q", 2, [], tc_id=None)
        with pytest.raises(InvalidInputError):
            await groups.commit("", 2, [ready.id])
        with pytest.raises(TransactionCoordinatorNotFoundError):
            await groups.new_transaction("q/3", tc_id=9)


async def test_prepared_work_survives_a_crash_and_the_key_is_remembered(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        groups = TransactionGroups(client)
        producer = await client.create_producer("out")
        txn = await groups.new_transaction("job/4")
        await producer.send(b"kept", txn=txn)
        await txn.prepare()
        done = await groups.new_transaction("job/3")
        await producer.send(b"three", txn=done)
        await done.prepare()
        assert await groups.commit("job", 3, [done.id], tc_id=0) == (False, 1, 0)
    broker.restart()  # SIGKILL
    async with Client(broker.url) as client:
        groups = TransactionGroups(client)
        producer = await client.create_producer("out")
        assert await values(client, "out") == [b"three"]
        assert await groups.commit("job", 4, [txn.id], abort_tag="job/4", tc_id=0) == (
            False,
            1,
            0,
        )
        replay = await groups.new_transaction("job/3")
        await producer.send(b"three", txn=replay)
        await replay.prepare()
        assert await groups.commit("job", 3, [replay.id], tc_id=0) == (True, 0, 1)
        assert await values(client, "out") == [b"three", b"kept"]


async def test_orphans_are_found_and_aborted_by_tag_or_by_their_timeout(
    broker: BrokerProcess,
) -> None:
    async with Client(broker.url) as client:
        groups = TransactionGroups(client)
        producer = await client.create_producer("out")
        orphans = []
        for batch in range(2):
            txn = await groups.new_transaction(f"dead-query/{batch}")
            await producer.send(b"orphan", txn=txn)
            await txn.prepare()
            orphans.append(txn)
        timed = await groups.new_transaction("short/0", prepared_timeout=0.3)
        await producer.send(b"short", txn=timed)
        await timed.prepare()

        status, body = broker.admin(
            "GET", "/admin/v1/tagged-transactions?tag=dead-query/&prefix=true"
        )
        listed = json.loads(body)["transactions"]
        assert status == 200 and [t["txnid"] for t in listed] == [str(t.id) for t in orphans]
        assert {t["status"] for t in listed} == {"PREPARED"}
        assert broker.admin("GET", "/admin/v1/tagged-transactions")[0] == 400
        status, body = broker.admin("POST", "/admin/v1/tagged-transactions/abort?tag=dead-query/0")
        assert status == 200 and json.loads(body)["aborted"] == [str(orphans[0].id)]
        assert await groups.abort_tagged("dead-query/", prefix=True) == 1
        assert await groups.abort_tagged("dead-query/", prefix=True) == 0

        def timed_out() -> dict:  # type: ignore[type-arg]
            return json.loads(broker.admin("GET", f"/admin/v1/transactions/{timed.id}")[1])  # type: ignore[no-any-return]

        await until(lambda: timed_out()["status"] == "ABORTED", "the prepared timeout's abort")
        body = json.dumps(timed_out())
        assert json.loads(body)["timed_out"]
        assert json.loads(body)["tag"] == "short/0"
        for txn in orphans:
            status, body = broker.admin("GET", f"/admin/v1/transactions/{txn.id}")
            assert json.loads(body)["status"] == "ABORTED"
        assert await values(client, "out") == []


@pytest.mark.auth
async def test_reading_and_deciding_need_the_permissions_of_writing(
    broker: BrokerProcess,
) -> None:
    for permission, resource in (("consume", "topic:in"), ("produce", "topic:out")):
        body = json.dumps({"role": "job", "permission": permission, "resource": resource})
        assert broker.admin("POST", "/admin/v1/acl/grant", body.encode())[0] == 200
    body = json.dumps({"role": "stranger", "permission": "consume", "resource": "topic:in"})
    assert broker.admin("POST", "/admin/v1/acl/grant", body.encode())[0] == 200
    async with Client(broker.url) as admin:  # (TXNBUF_TOKEN: a superuser)
        await (await admin.create_producer("in")).send(b"input")
    async with (
        Client(broker.url, token=broker.make_token("job")) as job,
        Client(broker.url, token=broker.make_token("stranger")) as stranger,
    ):
        assert await values(job, "in") == [b"input"]
        assert await SubscriptionCursor(job, "in", "job-sub", "earliest").positions() == {
            0: Position(0, 0)
        }
        with pytest.raises(AuthorizationError, match="consume"):
            await values(job, "out")  # (produce only)
        groups = TransactionGroups(job)
        txn = await groups.new_transaction("job/0")
        await (await job.create_producer("out")).send(b"output", txn=txn)
        await txn.prepare()
        theirs = TransactionGroups(stranger)
        with pytest.raises(AuthorizationError, match="produce"):
            await theirs.commit("job", 0, [txn.id], tc_id=0)
        with pytest.raises(AuthorizationError, match="produce"):
            await theirs.abort_tagged("job/0")
        with pytest.raises(AuthorizationError, match="consume"):
            await SubscriptionCursor(stranger, "out", "theirs").positions()
        assert await groups.commit("job", 0, [txn.id], tc_id=0) == (False, 1, 0)
    async with Client(broker.url) as admin:
        assert await values(admin, "out") == [b"output"]
