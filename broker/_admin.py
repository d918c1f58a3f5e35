"""The HTTP admin API (JSON under /admin/v1), Prometheus text at /metrics,
and at / the admin web page (broker/static/admin.html), which reads them.

Errors are JSON too: ``{"error": "<what was wrong>"}`` with status 400 (bad
input, nothing changed), 404 (no such topic) or 405/415 as aiohttp gives.

When the broker authenticates (`broker._auth`), every request but
``/admin/v1/health`` needs ``Authorization: Bearer <token>`` of a
superuser: without a valid token it is answered 401, with a token of
another role 403 (`_require_admin`). The ACL is managed here:
``GET /admin/v1/acl[?role=R]``, ``POST /admin/v1/acl/grant`` and
``POST /admin/v1/acl/revoke`` with ``{"role", "permission", "resource"}``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from broker._auth import AclEntry, AclError
from broker._errors import BrokerError
from broker._server import BROKER_KEY, Broker
from buffer import InvalidNameError, PartitionCountError, check_topic_name, quoted
from subscriptions import WHOLE_ENTRY
from tc import (
    InvalidTxnStatusError,
    NotStuckError,
    TransactionCoordinator,
    TxnID,
    TxnStatus,
    coordinator_of,
)

__all__ = ["add_admin_routes"]

ADMIN_PAGE = Path(__file__).parent / "static" / "admin.html"


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def put_topic(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    name = request.match_info["topic"]
    try:
        body = json.loads(await request.read() or b"{}")
    except (ValueError, UnicodeDecodeError):
        return _error(400, 'body must be JSON such as {"partitions": 3}')
    if not isinstance(body, dict):
        return _error(400, 'body must be a JSON object such as {"partitions": 3}')
    unknown = set(body) - {"partitions"}
    if unknown:
        return _error(400, f"unknown field(s): {quoted(', '.join(sorted(unknown)))}")
    partitions = body.get("partitions", 1)
    if isinstance(partitions, bool):
        return _error(400, "partitions must be an integer")
    try:
        topic = await broker.topics.create(check_topic_name(name), partitions)
    except (InvalidNameError, PartitionCountError) as exc:
        return _error(400, str(exc))
    await broker.subscriptions.extend(topic)
    return web.json_response({"topic": topic.name, "partitions": len(topic.partitions)})


async def list_topics(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    topics = []
    for name in broker.topics.names():
        topic = broker.topics.get(name)
        assert topic is not None
        topics.append({"name": name, "partitions": len(topic.partitions)})
    return web.json_response({"topics": topics})


def topic_stats(broker: Broker, name: str) -> dict[str, Any] | None:
    """Per partition: entries, messages, producers, consumers, each
    subscription, and its transaction buffer's transactions (null if no
    transaction wrote there)."""
    topic = broker.topics.get(name)
    if topic is None:
        return None
    producers = broker.producer_count(name)  # a producer writes to every partition
    partitions = []
    for part in topic.partitions:
        subs = broker.subscriptions.stats(name, part.index)
        ledger = part.ledger
        buffer = part.transaction_buffer
        partitions.append(
            {
                "partition": part.index,
                "entries": ledger.entry_count,
                "first_entry_id": ledger.first_entry_id,
                "last_entry_id": ledger.last_entry_id,
                "messages": part.messages_after((ledger.first_entry_id - 1, WHOLE_ENTRY)),
                "producers": producers,
                "consumers": sum(s["consumers"] for s in subs.values()),
                "subscriptions": subs,
                "transaction_buffer": None if buffer is None else buffer.stats(),
            }
        )
    return {"topic": name, "producers": producers, "partitions": partitions}


async def get_topic_stats(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    name = request.match_info["topic"]
    try:
        check_topic_name(name)
    except InvalidNameError as exc:
        return _error(400, str(exc))
    stats = topic_stats(broker, name)
    if stats is None:
        return _error(404, f"no topic {name!r}")
    return web.json_response(stats)


async def metrics(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    lines = [
        "# TYPE txnbuf_uptime_seconds gauge",
        f"txnbuf_uptime_seconds {time.time() - broker.started:.1f}",
        "# TYPE txnbuf_connections gauge",
        f"txnbuf_connections {len(broker.connections)}",
        "# TYPE txnbuf_ledger_commits_total counter",
        f"txnbuf_ledger_commits_total {broker.store.commits}",
        "# TYPE txnbuf_ledger_appends_total counter",
        f"txnbuf_ledger_appends_total {broker.store.appends}",
        "# TYPE txnbuf_messages_in_total counter",
    ]
    for name in broker.topics.names():
        topic = broker.topics.get(name)
        assert topic is not None
        for part in topic.partitions:
            lines.append(
                f'txnbuf_messages_in_total{{topic="{name}",partition="{part.index}"}} '
                f"{part.messages_in}"
            )
    stuck = sum(len(tc.stuck()) for tc in broker.coordinators.values())
    failures = sum(tc.participant_failures for tc in broker.coordinators.values())
    lines += [
        "# HELP txnbuf_transactions_stuck Decided transactions a participant has not applied yet "
        "after failing to (GET /admin/v1/transactions?state=STUCK)",
        "# TYPE txnbuf_transactions_stuck gauge",
        f"txnbuf_transactions_stuck {stuck}",
        "# HELP txnbuf_participant_end_failures_total Failed attempts to end a transaction on a "
        "partition or subscription",
        "# TYPE txnbuf_participant_end_failures_total counter",
        f"txnbuf_participant_end_failures_total {failures}",
    ]
    open_max = max((tc.active_open_time_max_ms() for tc in broker.coordinators.values()), default=0)
    lines += [
        "# HELP txnbuf_active_transaction_open_time_max_seconds The longest a transaction not "
        "yet decided (open or prepared) has been open (KIP-939)",
        "# TYPE txnbuf_active_transaction_open_time_max_seconds gauge",
        f"txnbuf_active_transaction_open_time_max_seconds {open_max / 1000:.3f}",
    ]
    lines.append("# TYPE txnbuf_backlog_messages gauge")
    for name in broker.topics.names():
        for sub, parts in broker.subscriptions.of_topic(name).items():
            backlog = sum(p.backlog() for p in parts)
            lines.append(
                f'txnbuf_backlog_messages{{topic="{name}",subscription="{sub}"}} {backlog}'
            )
    return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")


# -- transactions -----------------------------------------------------------------


_STATES = (*TxnStatus.__members__, "STUCK")


def _txn_json(tc: TransactionCoordinator, txnid: TxnID) -> dict[str, Any] | None:
    """A transaction as the admin API shows it: its coordinator's record,
    and ``stuck``, the participants that failed to apply its decision."""
    meta = tc.get(txnid)
    if meta is None:
        return None
    out = meta.to_json()
    out["stuck"] = [p.to_json() for p in tc.stuck(txnid).get(txnid, ())]
    return out


async def list_transactions(request: web.Request) -> web.Response:
    """``?state=OPEN&running_longer_than_ms=N`` (both optional). ``STUCK``:
    the decided transactions a participant failed to apply."""
    broker = request.app[BROKER_KEY]
    state = request.query.get("state")
    if state is not None and state.upper() not in _STATES:
        return _error(400, f"state must be one of {', '.join(_STATES)}")
    try:
        longer = int(request.query.get("running_longer_than_ms", "0"))
    except ValueError:
        return _error(400, "running_longer_than_ms must be an integer")
    now = int(time.time() * 1000)
    found = []
    for tc in broker.coordinators.values():
        if state is not None and state.upper() == "STUCK":
            metas = [m for m in map(tc.get, tc.stuck()) if m is not None]
        else:
            metas = [
                m for m in tc.transactions() if state is None or m.status.name == state.upper()
            ]
        for meta in metas:
            if now - meta.start_ms >= longer:
                found.append(_txn_json(tc, meta.txnid))
    found.sort(key=lambda m: m["start_ms"] if m else 0)
    return web.json_response({"transactions": found})


def _txnid(request: web.Request) -> TxnID | web.Response:
    text = request.match_info["txnid"]
    try:
        return TxnID.parse(text)
    except ValueError:
        return _error(400, f"not a TxnID: {quoted(text)} (expected '(most_bits,least_bits)')")


async def get_transaction(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    txnid = _txnid(request)
    if isinstance(txnid, web.Response):
        return txnid
    tc = broker.coordinators.get(txnid.tcid)
    found = _txn_json(tc, txnid) if tc is not None else None
    if found is None:
        return _error(404, f"no transaction {txnid}")
    return web.json_response(found)


async def abort_transaction(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    txnid = _txnid(request)
    if isinstance(txnid, web.Response):
        return txnid
    tc = broker.coordinators.get(txnid.tcid)
    if tc is None or tc.get(txnid) is None:
        return _error(404, f"no transaction {txnid}")
    if tc.stuck(txnid):
        return _error(
            409,
            f"transaction {txnid} is decided and stuck on a participant that does not apply "
            f"the decision: resolve it (POST /admin/v1/transactions/{txnid}/resolve)",
        )
    try:
        await tc.end_txn(txnid, commit=False)
    except InvalidTxnStatusError as exc:
        return _error(409, str(exc))
    return web.json_response(_txn_json(tc, txnid))


async def resolve_transaction(request: web.Request) -> web.Response:
    """An operator's answer to a stuck transaction: ``{"action": "retry"}``
    (try its stuck participants again now) or ``{"action": "skip"}`` (end
    it without them, leaving them as they are); ``"participant"`` (as
    listed under ``stuck``) narrows it to one."""
    broker = request.app[BROKER_KEY]
    txnid = _txnid(request)
    if isinstance(txnid, web.Response):
        return txnid
    try:
        body = json.loads(await request.read() or b"{}")
    except (ValueError, UnicodeDecodeError):
        return _error(400, 'body must be JSON such as {"action": "retry"}')
    if not isinstance(body, dict) or set(body) - {"action", "participant"}:
        return _error(400, 'body must be {"action": "retry" | "skip", "participant": optional}')
    action, participant = body.get("action"), body.get("participant")
    if action not in ("retry", "skip") or not isinstance(participant, str | None):
        return _error(400, 'action must be "retry" or "skip"; participant a string')
    tc = broker.coordinators.get(txnid.tcid)
    if tc is None or tc.get(txnid) is None:
        return _error(404, f"no transaction {txnid}")
    try:
        count = tc.resolve(txnid, action, participant)
    except NotStuckError as exc:
        return _error(409, str(exc))
    return web.json_response({"txnid": str(txnid), "action": action, "participants": count})


# -- transactional producers (the producer-epoch mode) -------------------------------


async def list_producers(request: web.Request) -> web.Response:
    """Every transactional id, on every coordinator here."""
    broker = request.app[BROKER_KEY]
    found = [
        {"tc_id": tcid, **entry.to_json()}
        for tcid, tc in sorted(broker.coordinators.items())
        for entry in tc.producers()
    ]
    found.sort(key=lambda e: e["transactional_id"])
    return web.json_response({"producers": found})


def _producer_coordinator(broker: Broker, transactional_id: str) -> TransactionCoordinator:
    return broker.coordinators[coordinator_of(transactional_id, list(broker.coordinators))]


async def get_producer(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    tid = request.match_info["transactional_id"]
    tc = _producer_coordinator(broker, tid)
    entry = tc.producer(tid)
    if entry is None:
        return _error(404, f"no transactional id {tid[:200]!r}")
    return web.json_response({"tc_id": tc.tcid, **entry.to_json()})


async def terminate_producer(request: web.Request) -> web.Response:
    """KIP-939's forceTerminateTransaction: fence the transactional id's
    producer and abort its ongoing transaction (prepared or not)."""
    broker = request.app[BROKER_KEY]
    tid = request.match_info["transactional_id"]
    tc = _producer_coordinator(broker, tid)
    if tc.producer(tid) is None:
        return _error(404, f"no transactional id {tid[:200]!r}")
    await tc.terminate_producer(tid)
    entry = tc.producer(tid)
    assert entry is not None
    return web.json_response({"tc_id": tc.tcid, **entry.to_json()})


async def list_coordinators(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    out = []
    for tcid, tc in sorted(broker.coordinators.items()):
        counts = {status.name: 0 for status in TxnStatus}
        for meta in tc.transactions():
            counts[meta.status.name] += 1
        out.append({"tc_id": tcid, "transactions": counts})
    return web.json_response({"coordinators": out})


# -- who may use it, and the ACL ---------------------------------------------------

OPEN_PATHS = frozenset({"/admin/v1/health"})


@web.middleware
async def _require_admin(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The admin API and /metrics serve superusers only (when the broker
    authenticates): 401 without a valid token, 403 with another role's."""
    path = request.path
    if path in OPEN_PATHS or not (path.startswith("/admin/") or path == "/metrics"):
        return await handler(request)
    security = request.app[BROKER_KEY].security
    try:
        who = security.authenticate_bearer(request.headers.get("Authorization"))
    except BrokerError as exc:
        return web.json_response(
            {"error": str(exc)},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="txnbuf"'},
        )
    try:
        security.allow_admin(who)
    except BrokerError as exc:
        return _error(403, str(exc))
    return await handler(request)


async def list_acl(request: web.Request) -> web.Response:
    """``?role=R`` (optional): the grants, of one role or all."""
    acl = request.app[BROKER_KEY].security.acl
    role = request.query.get("role")
    return web.json_response({"acl": [e.to_json() for e in acl.entries(role)]})


async def _acl_entry(request: web.Request) -> AclEntry | web.Response:
    try:
        body = json.loads(await request.read() or b"{}")
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict) or set(body) != {"role", "permission", "resource"}:
        return _error(
            400,
            'body must be {"role": ..., "permission": "produce" | "consume" | '
            '"two_phase_commit", "resource": "topic:<pattern>" | '
            '"subscription:<topic pattern>/<subscription pattern>" | '
            '"transactional-id:<pattern>"}',
        )
    try:
        return AclEntry.parse(body["role"], body["permission"], body["resource"])
    except AclError as exc:
        return _error(400, str(exc))


async def grant_acl(request: web.Request) -> web.Response:
    entry = await _acl_entry(request)
    if isinstance(entry, web.Response):
        return entry
    added = await request.app[BROKER_KEY].security.acl.grant(entry)
    return web.json_response({"granted": entry.to_json(), "new": added})


async def revoke_acl(request: web.Request) -> web.Response:
    entry = await _acl_entry(request)
    if isinstance(entry, web.Response):
        return entry
    if not await request.app[BROKER_KEY].security.acl.revoke(entry):
        return _error(
            404,
            f"no such grant: {entry.role} {entry.permission.value} {entry.resource} "
            "(GET /admin/v1/acl lists them)",
        )
    return web.json_response({"revoked": entry.to_json()})


async def admin_page(request: web.Request) -> web.FileResponse:
    return web.FileResponse(ADMIN_PAGE, headers={"Cache-Control": "no-cache"})


def add_admin_routes(app: web.Application) -> None:
    app.middlewares.append(_require_admin)
    app.router.add_get("/", admin_page)
    app.router.add_get("/admin/v1/acl", list_acl)
    app.router.add_post("/admin/v1/acl/grant", grant_acl)
    app.router.add_post("/admin/v1/acl/revoke", revoke_acl)
    app.router.add_get("/admin/v1/health", health)
    app.router.add_get("/admin/v1/topics", list_topics)
    app.router.add_put("/admin/v1/topics/{topic}", put_topic)
    app.router.add_get("/admin/v1/topics/{topic}/stats", get_topic_stats)
    app.router.add_get("/admin/v1/transactions", list_transactions)
    app.router.add_get("/admin/v1/transactions/{txnid}", get_transaction)
    app.router.add_post("/admin/v1/transactions/{txnid}/abort", abort_transaction)
    app.router.add_post("/admin/v1/transactions/{txnid}/resolve", resolve_transaction)
    app.router.add_get("/admin/v1/coordinators", list_coordinators)
    app.router.add_get("/admin/v1/producers", list_producers)
    app.router.add_get("/admin/v1/producers/{transactional_id}", get_producer)
    app.router.add_post("/admin/v1/producers/{transactional_id}/terminate", terminate_producer)
    app.router.add_get("/metrics", metrics)
