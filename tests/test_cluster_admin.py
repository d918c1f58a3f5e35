"""Operating a cluster, against real broker processes sharing one PostgreSQL
database: ``GET /admin/v1/cluster`` from every broker agrees with the slots
table; the moves of a SIGKILL (failover) and a SIGTERM (handover) are
recorded; an admin request about another broker's topic or transaction is
answered by its owner, and the lists gather every broker's; ``txnbuf
cluster`` prints the cluster; the superuser check holds on every broker,
forwarded requests included; a nudge (``POST /admin/v1/cluster/look``) is
taken from the role ``cluster`` only, every other caller and bad input
refused with nothing changed; the per-broker metrics move. A single broker
answers ``"cluster": false``. Tests wait for conditions, never for a length
of time."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from broker._admin_cluster import ANSWERED_BY, FORWARDED, NUDGE_PATH
from broker._auth import create_secret_key, create_token, load_signing_key
from broker._peers import cluster_token
from client import Client, TransactionGroups
from cluster import PostgresMembership
from proto import txnbuf_pb2 as pb
from tests._cluster import (
    cluster_broker,
    owner_id,
    owners,
    placed,
    scrape,
    settled,
    slots,
    start_placed,
    topic_on,
    wait_for,
)
from tests.conftest import BrokerProcess, RawConnection
from tests.test_metrics import value

NUDGES = "txnbuf_cluster_nudges_received_total"

pytestmark = pytest.mark.integration

TTL = 2.0  # seconds of lease


def call(
    proc: BrokerProcess,
    method: str,
    path: str,
    body: object = None,
    token: str | None = None,
    extra: dict[str, str] | None = None,
) -> tuple[int, Any, dict[str, str]]:
    """(status, JSON answer, headers) of an admin request (``extra``: more headers)."""
    token = token if token is not None else proc.token
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    headers.update(extra or {})
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(proc.url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


async def acall(
    proc: BrokerProcess, method: str, path: str, body: object = None, token: str | None = None
) -> tuple[int, Any, dict[str, str]]:
    return await asyncio.to_thread(call, proc, method, path, body, token)


async def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``txnbuf ARGS``, run to its end."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "broker", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def cluster_of(proc: BrokerProcess) -> dict[str, Any]:
    status, answer, _ = await acall(proc, "GET", "/admin/v1/cluster?moves=1000")
    assert status == 200, answer
    return dict(answer)


def assert_documented_shape(answer: dict[str, Any]) -> None:
    """The answer has the keys of docs/operations.md's sample."""
    doc = (Path(__file__).parent.parent / "docs" / "operations.md").read_text()
    start = doc.index('```json\n{"cluster": true')
    sample = json.loads(doc[start + len("```json\n") : doc.index("```", start + 7)])
    assert set(answer) == set(sample)
    for key in ("brokers", "slots", "moves"):
        assert answer[key], key
        assert set(answer[key][0]) == set(sample[key][0]), key


async def test_every_broker_answers_the_cluster_and_moves_are_recorded(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    await start_placed(tmp_path, pg_url, logs, ttl=TTL)
    a, b, c = logs

    async def agrees(procs: list[BrokerProcess]) -> bool:
        """Each broker's answer is the slots table as it is, every slot loaded."""
        table = await slots(pg_url)
        for proc in procs:
            view = await cluster_of(proc)
            if [(s["slot"], s["owner"], s["epoch"]) for s in view["slots"]] != table:
                return False
            if {s["state"] for s in view["slots"]} != {"loaded"}:
                return False
            assert [x["id"] for x in view["brokers"] if x["this"]] == [owner_id(proc)]
            assert view["this"] == owner_id(proc) and view["slot_count"] == len(table)
            live = [x for x in view["brokers"] if x["live"]]
            if {x["id"] for x in live} != {owner_id(p) for p in procs}:
                return False
            for broker in live:  # (leases by the database's clock)
                assert 0 <= broker["lease_age_s"] <= TTL, broker
                assert 0 < broker["lease_expires_in_s"] <= TTL, broker
                assert broker["slots"] == [k for k, o, _ in table if o == broker["id"]]
        return True

    await wait_for("every broker's /admin/v1/cluster agrees", lambda: agrees(logs))
    assert_documented_shape(await cluster_of(a))
    metrics = scrape(a)
    owned = len((await owners(pg_url))[owner_id(a)])
    assert value(metrics, "txnbuf_cluster_slots_owned") == owned
    assert value(metrics, "txnbuf_cluster_slot_loads_total") >= owned
    assert value(metrics, "txnbuf_cluster_lease_renewals_total") >= 1
    assert 0 <= value(metrics, "txnbuf_cluster_lease_renewal_age_seconds") < TTL

    # SIGKILL: b's slots are taken over once its lease ran out (failover).
    lost = (await owners(pg_url))[owner_id(b)]
    b.kill()
    await wait_for("a and c hold every slot", lambda: settled(pg_url, [a, c]))
    await wait_for("a and c agree", lambda: agrees([a, c]))
    view = await cluster_of(c)
    failed_over = {
        m["slot"]: m for m in view["moves"] if m["from"] == owner_id(b) and m["why"] == "failover"
    }
    assert set(failed_over) == lost
    failovers = [value(scrape(p), "txnbuf_cluster_slot_failovers_total") for p in (a, c)]
    assert sum(failovers) == len(lost), failovers
    assert {m["to"] for m in failed_over.values()} <= {owner_id(a), owner_id(c)}
    dead = [x for x in view["brokers"] if x["id"] == owner_id(b)]
    assert dead == [] or not dead[0]["live"]

    # SIGTERM: c hands its slots over at once (handover), a takes them.
    handed = (await owners(pg_url))[owner_id(c)]
    assert c.stop() == 0
    await wait_for("a holds every slot", lambda: settled(pg_url, [a]))

    async def handed_over() -> bool:
        moves = (await cluster_of(a))["moves"]
        done = {m["slot"] for m in moves if m["from"] == owner_id(c) and m["to"] == owner_id(a)}
        return done >= handed

    await wait_for("c's handovers recorded as taken by a", handed_over)
    view = await cluster_of(a)
    latest: dict[int, dict[str, Any]] = {}
    for m in reversed(view["moves"]):  # (the latest move of each slot)
        latest[m["slot"]] = m
    assert {latest[k]["why"] for k in handed} == {"handover"}
    assert [x["id"] for x in view["brokers"]] == [owner_id(a)] or not all(
        x["live"] for x in view["brokers"] if x["id"] != owner_id(a)
    )
    metrics = scrape(a)
    assert value(metrics, "txnbuf_cluster_slots_owned") == len(view["slots"])
    assert value(metrics, "txnbuf_cluster_store_drops_total") == 0

    # The CLI prints it.
    out = await cli("cluster", "--url", f"{b.url},{c.url},{a.url}")  # (b, c: gone)
    assert out.returncode == 0, out.stderr
    assert f"{owner_id(a)} (this)" in out.stdout
    assert "slots per broker:" in out.stdout and "handover" in out.stdout
    assert f"0-{len(view['slots']) - 1}" in out.stdout  # (a's loaded slots, as ranges)
    printed = await cli("cluster", "--url", a.url, "--json")
    assert json.loads(printed.stdout)["this"] == owner_id(a)


async def test_admin_requests_are_answered_by_any_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    found = await start_placed(tmp_path, pg_url, logs, ttl=TTL)
    x, y, z = logs
    topics = {owner_id(p): topic_on(found, p, "adm") for p in logs}
    topic = topics[owner_id(x)]

    # Created at y, served by x: the answer is x's.
    status, answer, headers = await acall(y, "PUT", f"/admin/v1/topics/{topic}", {"partitions": 2})
    assert status == 200 and answer == {"topic": topic, "partitions": 2}, answer
    assert headers[ANSWERED_BY] == owner_id(x)
    for t in topics.values():
        assert (await acall(z, "PUT", f"/admin/v1/topics/{t}", {}))[0] == 200
    async with Client(y.url) as client:
        producer = await client.create_producer(topic)
        consumer = await client.subscribe(topic, "s", initial_position="earliest")
        for i in range(3):
            await producer.send(b"m%d" % i)
        txn = await client.new_transaction(near=topic, timeout=60)
        await producer.send(b"open", txn=txn)
        await producer.flush()
        assert txn.tc_id in found[owner_id(x)]

        _, at_owner, _ = await acall(x, "GET", f"/admin/v1/topics/{topic}/stats")
        status, at_other, headers = await acall(y, "GET", f"/admin/v1/topics/{topic}/stats")
        assert status == 200 and headers[ANSWERED_BY] == owner_id(x)
        assert at_other == at_owner
        assert sum(p["messages"] for p in at_other["partitions"]) == 3
        status, subs, _ = await acall(z, "GET", f"/admin/v1/topics/{topic}/subscriptions")
        assert status == 200 and [s["name"] for s in subs["subscriptions"]] == ["s"]

        # A transaction of x's coordinator, asked at y and z.
        txnid = str(txn.id)
        status, shown, headers = await acall(y, "GET", f"/admin/v1/transactions/{txnid}")
        assert status == 200 and shown["status"] == "OPEN", shown
        assert headers[ANSWERED_BY] == owner_id(x)
        status, listed, _ = await acall(z, "GET", "/admin/v1/transactions?in_progress=true")
        assert status == 200 and "missing" not in listed
        assert txnid in [t["txnid"] for t in listed["transactions"]]
        status, aborted, _ = await acall(z, "POST", f"/admin/v1/transactions/{txnid}/abort")
        assert status == 200 and aborted["status"] in ("ABORTING", "ABORTED"), aborted
        await consumer.close()

    # The lists gather every broker's.
    status, listed, headers = await acall(z, "GET", "/admin/v1/topics")
    assert status == 200 and "missing" not in listed
    assert set(topics.values()) <= {t["name"] for t in listed["topics"]}
    assert ANSWERED_BY not in headers
    _, coordinators, _ = await acall(y, "GET", "/admin/v1/coordinators")
    assert [c["tc_id"] for c in coordinators["coordinators"]] == list(
        range(len(await slots(pg_url)))
    )

    # Tagged transactions (a Spark query's) of z's coordinators, found and aborted at x.
    async with Client(z.url) as client:
        tc_id = min(found[owner_id(z)])  # (a coordinator of z's: the client's first broker)
        tagged = await TransactionGroups(client).new_transaction("query/0", tc_id=tc_id)
        query = "/admin/v1/tagged-transactions?tag=query/&prefix=true"
        status, listed, _ = await acall(x, "GET", query)
        assert status == 200 and [t["txnid"] for t in listed["transactions"]] == [str(tagged.id)]
        status, aborted, _ = await acall(x, "POST", query.replace("?", "/abort?"))
        assert status == 200 and aborted == {"aborted": [str(tagged.id)]}, aborted
        assert (await acall(y, "GET", query))[1]["transactions"] == []

    # A command refused NOT_OWNER is counted by the broker that refused it.
    before = value(scrape(y), "txnbuf_cluster_not_owner_refusals_total")
    async with RawConnection(y.url) as raw:
        answer = await raw.request(
            pb.BaseCommand.PARTITIONED_METADATA,
            "partitioned_metadata",
            pb.CommandPartitionedMetadata(request_id=1, topic=topic),
        )
    assert answer.partitioned_metadata_response.error == pb.NOT_OWNER, answer
    assert value(scrape(y), "txnbuf_cluster_not_owner_refusals_total") == before + 1

    # A forwarded request is never forwarded again (its slot moved meanwhile): NOT_OWNER.
    status, answer, _ = await asyncio.to_thread(
        call, y, "GET", f"/admin/v1/topics/{topic}/stats", None, None, {FORWARDED: "test"}
    )
    assert status == 503 and "which this broker does not serve" in answer["error"], answer
    assert owner_id(x) in answer["error"], answer

    # Bad input is refused where it arrives, and a missing topic is the owner's 404.
    status, answer, _ = await acall(y, "GET", "/admin/v1/topics/bad%2Fname/stats")
    assert status == 400, answer
    missing = topic_on(found, z, "nothere")
    status, answer, headers = await acall(y, "GET", f"/admin/v1/topics/{missing}")
    assert status == 404 and headers[ANSWERED_BY] == owner_id(z), answer


def shared_auth(procs: list[BrokerProcess], key_file: Path) -> None:
    for proc in procs:
        proc.secret_key_file = key_file
        proc.token = proc.make_token("admin")


async def test_the_superuser_check_holds_on_every_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    key_file = tmp_path / "secret.key"
    key_file.write_text(create_secret_key())
    for i in range(2):
        proc = cluster_broker(tmp_path, pg_url, f"s{i}", TTL)
        shared_auth([proc], key_file)
        logs.append(proc)
        proc.start()
    x, y = logs
    found = await placed(pg_url, logs)
    key, algorithm = load_signing_key(key_file)
    app = create_token("app", key, algorithm)
    topic = topic_on(found, x, "sec")
    for path in (
        "/admin/v1/cluster",
        "/admin/v1/cluster/broker",
        "/admin/v1/topics",
        f"/admin/v1/topics/{topic}/stats",
    ):
        for proc in logs:
            assert (await acall(proc, "GET", path, token=""))[0] == 401, path
            status, answer, headers = await acall(proc, "GET", path, token=app)
            assert status == 403 and "admin" in answer["error"], (path, answer)
            assert ANSWERED_BY not in headers  # (refused where it arrived)
    # With a superuser's token, forwarded with it.
    status, answer, headers = await acall(y, "PUT", f"/admin/v1/topics/{topic}", {})
    assert status == 200 and headers[ANSWERED_BY] == owner_id(x), answer
    assert (await cluster_of(y))["this"] == owner_id(y)
    # A grant at the broker that does not write the ACL (slot 0's owner does).
    held = await owners(pg_url)
    writer, other = (x, y) if 0 in held[owner_id(x)] else (y, x)
    grant = {"role": "app", "permission": "produce", "resource": "topic:sec*"}
    assert (await acall(other, "POST", "/admin/v1/acl/grant", grant, token=app))[0] == 403
    status, answer, headers = await acall(other, "POST", "/admin/v1/acl/grant", grant)
    assert status == 200 and headers[ANSWERED_BY] == owner_id(writer), answer

    async def granted_everywhere() -> bool:
        for proc in logs:
            acl = (await acall(proc, "GET", "/admin/v1/acl?role=app"))[1]["acl"]
            if len(acl) != 1:
                return False
        return True

    await wait_for("the grant read by both brokers", granted_everywhere)
    await _only_the_cluster_role_nudges(pg_url, logs, app, create_token("cluster", key, algorithm))


async def _only_the_cluster_role_nudges(
    pg_url: str, procs: list[BrokerProcess], app: str, operators_cluster: str
) -> None:
    """``POST /admin/v1/cluster/look`` on each broker: refused to everyone but
    the role ``cluster`` (a superuser included), and to bad input, with no
    look made (the nudges counted received do not move); taken from a token
    of the cluster's secret and from the operator's with subject cluster."""
    membership = await PostgresMembership.open(pg_url)
    try:
        ours = cluster_token(await membership.secret(), "a test")
    finally:
        await membership.close()
    forged = cluster_token("not the secret of this cluster: " + "x" * 32, "a test")
    await placed(pg_url, procs)  # (settled: no look of theirs nudges anyone now)
    for proc in procs:
        before = value(scrape(proc), NUDGES)
        for token, body, status, says in (
            ("", None, 401, "cluster's brokers only"),
            (forged, None, 401, "not a token of this cluster's brokers"),
            (app, None, 403, "role 'cluster' only"),
            (proc.token, None, 403, "role 'cluster' only"),  # (a superuser's)
            (ours, "not an object", 400, "the body must be"),
            (ours, {"from": 7}, 400, "the body must be"),
            (ours, {"from": "x", "slots": [1]}, 400, "the body must be"),
        ):
            answer = await acall(proc, "POST", NUDGE_PATH, body, token=token)
            assert answer[0] == status and says in answer[1]["error"], (token, body, answer)
            assert ANSWERED_BY not in answer[2]
        assert (await acall(proc, "GET", NUDGE_PATH, token=ours))[0] == 405
        assert value(scrape(proc), NUDGES) == before  # (nothing woke its loop)
        for token in (ours, operators_cluster):
            answer = await acall(proc, "POST", NUDGE_PATH, {"from": "a test"}, token=token)
            assert answer[:2] == (200, {"looking": True}), answer
        assert value(scrape(proc), NUDGES) == before + 2


async def test_a_single_broker_is_not_a_cluster(broker: BrokerProcess) -> None:
    status, answer, _ = await acall(broker, "GET", "/admin/v1/cluster")
    assert status == 200
    assert answer["cluster"] is False and answer["slots"] == [] and answer["moves"] == []
    assert [b["id"] for b in answer["brokers"]] == [broker.url]
    assert "txnbuf_cluster_slots_owned" not in {n for (n, _) in scrape(broker)}
    status, answer, _ = await acall(broker, "POST", NUDGE_PATH, token="")
    assert status == 401 and "cluster's brokers only" in answer["error"], answer
    out = await cli("cluster", "--url", broker.url)
    assert out.returncode == 0 and out.stdout.startswith("not a cluster"), out


async def test_a_broker_registered_at_a_wildcard_address_is_named(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    """A broker started with --host 0.0.0.0 registers a URL no other broker
    can reach: a request forwarded to it is refused 502, saying so, rather
    than sent to whatever listens on that port here. (The tests listen on
    loopback only: the row is made to name the wildcard address, as such a
    broker's join writes it.)"""
    found = await start_placed(tmp_path, pg_url, logs, 2, TTL)
    x, wild = logs
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(
            "UPDATE txnbuf.brokers SET urls = $1 WHERE id = $2",
            f"http://0.0.0.0:{wild.port}",
            owner_id(wild),
        )
    finally:
        await conn.close()
    topic = topic_on(found, wild, "wild")

    async def named() -> bool:  # (once x's look read the row)
        status, answer, _ = await acall(x, "GET", f"/admin/v1/topics/{topic}/stats")
        if status == 200:
            return False
        assert status == 502 and "wildcard address" in answer["error"], answer
        return True

    await wait_for("x names the wildcard address", named)
    status, listed, _ = await acall(x, "GET", "/admin/v1/topics")
    assert status == 200 and [m["broker"] for m in listed["missing"]] == [owner_id(wild)]


@pytest.mark.parametrize("route", ["get", "abort", "resolve"])
async def test_a_transaction_of_a_coordinator_not_loaded_yet_is_not_owner_rather_than_404(
    route: str,
) -> None:
    """A broker that serves a slot but has not loaded its coordinator yet
    (it recovers it first, after a move) answers a request about one of
    its transactions 503 ``NOT_OWNER`` (retriable), not 404 "no
    transaction": a caller reads 404 as unknown, i.e. ended and forgotten
    (`txnbuf check` did, and let a new process read past a crashed
    transaction's acks before their abort). One broker still answers 404.
    (A unit test of the admin routes, on a broker object with no
    coordinator loaded.)"""
    from aiohttp import web
    from aiohttp.test_utils import make_mocked_request

    from broker._admin import abort_transaction, get_transaction, json_errors, resolve_transaction
    from broker._broker import BROKER_KEY, Broker
    from proto import refusals

    handler = {"get": get_transaction, "abort": abort_transaction, "resolve": resolve_transaction}
    txnid = "(3,7)"

    class Gate:
        def coordinator_not_here(self, tcid: int) -> refusals.Refusal:
            return refusals.NotOwner(f"slot {tcid} is being loaded here", tcid)

    class Loading:  # (a cluster's broker serving slot 3, its coordinator not loaded yet)
        coordinators: dict[int, Any] = {}
        cluster: Any = Gate()
        coordinator = Broker.coordinator

    async def answer(broker: Any) -> tuple[int, dict[str, Any]]:
        app = web.Application()
        app[BROKER_KEY] = broker
        path = f"/admin/v1/transactions/{txnid}" + ("" if route == "get" else f"/{route}")
        request = make_mocked_request(
            "GET" if route == "get" else "POST", path, match_info={"txnid": txnid}, app=app
        )
        if route == "resolve":
            request._read_bytes = b'{"action": "retry"}'
        response = await json_errors(request, handler[route])
        assert isinstance(response, web.Response) and isinstance(response.body, bytes)
        return response.status, json.loads(response.body)

    status, body = await answer(Loading())
    assert status == 503 and "being loaded" in body["error"], body
    Loading.cluster = None  # (one broker: no coordinator with that id)
    status, body = await answer(Loading())
    assert status == 404 and body["error"] == f"no transaction {txnid}"
