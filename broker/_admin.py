"""The HTTP admin API (JSON under /admin/v1), Prometheus text at /metrics,
and at / the admin web page (broker/static/admin.html), which reads them.
docs/operations.md lists the routes.

Errors are JSON on every route, unknown ones included (`json_errors`):
``{"error": "<what was wrong>"}`` with status 400 (bad input), 404 (no such
topic, subscription, transaction or route), 405 (method; with ``Allow``),
409 (refused in this state: in use, held by a transaction), 414 (URL over
`MAX_URL_BYTES`); a refused request changes nothing. A refusal a handler
does not answer itself is answered by its code (`_HTTP_STATUS`); anything
else is 500, logged.

When the broker authenticates (`broker._auth`), every request but
``/admin/v1/health`` needs ``Authorization: Bearer <token>`` of a
superuser: without a valid token it is answered 401, with a token of
another role 403 (`_require_admin`). The ACL is managed here:
``GET /admin/v1/acl[?role=R]``, ``POST /admin/v1/acl/grant`` and
``POST /admin/v1/acl/revoke`` with ``{"role", "permission", "resource"}``.

In a cluster (`broker._admin_cluster`): ``GET /admin/v1/cluster``; a request
about another broker's topic or transaction (or an ACL write) is answered
by forwarding it to its owner, and the lists gather every broker's.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler
from prometheus_client import CONTENT_TYPE_LATEST

from broker._acl import AclEntry, AclError
from broker._admin_cluster import NUDGE_PATH, add_cluster_routes, forward_to_owner
from broker._broker import BROKER_KEY, Broker
from broker._errors import REFUSALS, error_code
from broker._operations import (
    AdminError,
    delete_subscription,
    delete_topic,
    reset_subscription,
    skip_messages,
    subscriptions_json,
)
from buffer import (
    NO_RETENTION,
    InvalidNameError,
    PartitionCountError,
    Retention,
    RetentionError,
    check_subscription_name,
    check_topic_name,
    quoted,
)
from ledger import LedgerError
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions import WHOLE_ENTRY
from tc import (
    InvalidTxnStatusError,
    NotStuckError,
    TransactionCoordinator,
    TxnID,
    TxnMeta,
    TxnStatus,
)

__all__ = ["MAX_URL_BYTES", "add_admin_routes", "json_errors"]

log = logging.getLogger(__name__)

ADMIN_PAGE = Path(__file__).parent / "static" / "admin.html"
FAVICON = Path(__file__).parent / "static" / "favicon.svg"
MAX_URL_BYTES = 8 << 10  # a longer path and query is answered 414


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


# The HTTP status of a refusal's code; any other code is 409 (refused in this state).
_HTTP_STATUS: dict[pb.ServerError, int] = {
    pb.MALFORMED_FRAME: 400,
    pb.INVALID_TOPIC_NAME: 400,
    pb.INVALID_ARGUMENT: 400,
    pb.AUTHENTICATION_ERROR: 401,
    pb.AUTHORIZATION_ERROR: 403,
    pb.TOPIC_NOT_FOUND: 404,
    pb.PRODUCER_NOT_FOUND: 404,
    pb.CONSUMER_NOT_FOUND: 404,
    pb.TRANSACTION_NOT_FOUND: 404,
    pb.TRANSACTION_COORDINATOR_NOT_FOUND: 404,
    pb.TOO_MANY_REQUESTS: 429,
    pb.NOT_OWNER: 503,  # (retriable: its slot is elsewhere, or moving)
    pb.PERSISTENCE_ERROR: 503,
    pb.SERVICE_NOT_READY: 503,
}


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every error as JSON: aiohttp's own (no such route, method not
    allowed, body too large), an `AdminError`, a refusal (`_HTTP_STATUS`),
    and an unexpected failure (500, logged)."""
    if len(request.raw_path) > MAX_URL_BYTES:
        return _error(414, f"URL longer than {MAX_URL_BYTES} bytes ({len(request.raw_path)})")
    try:
        return await handler(request)
    except AdminError as exc:
        return _error(exc.status, str(exc))
    except REFUSALS as exc:
        return _error(_HTTP_STATUS.get(error_code(exc), 409), str(exc))
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if isinstance(exc, web.HTTPMethodNotAllowed):
            allowed = ", ".join(sorted(exc.allowed_methods))
            return _error(
                405,
                f"method {request.method} not allowed on {request.path[:200]} (allowed: {allowed})",
                {"Allow": allowed},
            )
        if isinstance(exc, web.HTTPNotFound):
            return _error(404, f"no route {request.method} {request.path[:200]}")
        return _error(exc.status, exc.text or exc.reason)
    except Exception:
        log.exception("admin request %s %s failed", request.method, request.path[:200])
        return _error(500, "internal error (see the broker's log)")


async def _body(request: web.Request, example: str) -> dict[str, Any]:
    """The request's JSON object body ({} if empty); AdminError 400 if not one."""
    try:
        body = json.loads(await request.read() or b"{}")
    except (ValueError, UnicodeDecodeError):
        raise AdminError(400, f"body must be JSON such as {example}") from None
    if not isinstance(body, dict):
        raise AdminError(400, f"body must be a JSON object such as {example}")
    return body


def _flag(request: web.Request, name: str) -> bool:
    """A true/false query parameter (absent: false; ``?name`` alone: true)."""
    value = request.query.get(name, "false").lower()
    if value not in ("true", "false", "1", "0", ""):
        raise AdminError(400, f"{name} must be true or false, not {value[:50]!r}")
    return value in ("true", "1", "")


def _force(request: web.Request) -> bool:
    return _flag(request, "force")


def _topic_name(request: web.Request) -> str:
    try:
        return check_topic_name(request.match_info["topic"])
    except InvalidNameError as exc:
        raise AdminError(400, str(exc)) from None


def _sub_name(request: web.Request) -> str:
    try:
        return check_subscription_name(request.match_info["subscription"])
    except InvalidNameError as exc:
        raise AdminError(400, str(exc)) from None


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def put_topic(request: web.Request) -> web.Response:
    """Create a topic, grow it to ``partitions``, set its ``retention``
    (``{"time_s": T, "size_bytes": S}``, -1 for no limit, null for none:
    see `buffer.Retention`). Everything is checked before anything changes."""
    broker = request.app[BROKER_KEY]
    name = _topic_name(request)
    body = await _body(request, '{"partitions": 3, "retention": {"time_s": 3600}}')
    unknown = set(body) - {"partitions", "retention"}
    if unknown:
        return _error(400, f"unknown field(s): {quoted(', '.join(sorted(unknown)))}")
    existing = broker.topics.partition_count(name)  # (loaded or not)
    partitions = body.get("partitions", existing or 1)
    if isinstance(partitions, bool):
        return _error(400, "partitions must be an integer")
    try:
        retention = Retention.from_json(body["retention"]) if "retention" in body else None
        if existing is not None and isinstance(partitions, int):
            if partitions < existing:
                raise PartitionCountError(
                    f"topic {name!r} has {existing} partitions; the count can grow but not shrink"
                )
        topic = await broker.topics.create(name, partitions)
    except (PartitionCountError, RetentionError) as exc:
        return _error(400, str(exc))
    if retention is not None:
        topic = await broker.topics.set_retention(name, retention)
    await broker.subscriptions.extend(topic)
    answer: dict[str, Any] = {"topic": topic.name, "partitions": len(topic.partitions)}
    if topic.retention != NO_RETENTION:
        answer["retention"] = topic.retention.to_json()
    return web.json_response(answer)


async def _topic_json(broker: Broker, name: str) -> dict[str, Any] | None:
    topic = await broker.topics.load_topic(name)
    if topic is None:
        return None
    return {
        "topic": topic.name,
        "partitions": len(topic.partitions),
        "retention": topic.retention.to_json(),
        "subscriptions": list(broker.subscriptions.of_topic(name)),
    }


async def get_topic(request: web.Request) -> web.Response:
    found = await _topic_json(request.app[BROKER_KEY], _topic_name(request))
    if found is None:
        return _error(404, f"no topic {request.match_info['topic']!r}")
    return web.json_response(found)


async def delete_topic_route(request: web.Request) -> web.Response:
    """``?force=true``: see `broker._operations`."""
    force = _force(request)
    return web.json_response(
        await delete_topic(request.app[BROKER_KEY], _topic_name(request), force)
    )


async def list_subscriptions(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    name = _topic_name(request)
    subs = await subscriptions_json(broker, name)
    return web.json_response({"topic": name, "subscriptions": subs})


async def reset_subscription_route(request: web.Request) -> web.Response:
    body = await _body(request, '{"position": "earliest"}')
    return web.json_response(
        await reset_subscription(
            request.app[BROKER_KEY], _topic_name(request), _sub_name(request), body
        )
    )


async def skip_route(request: web.Request) -> web.Response:
    body = await _body(request, '{"messages": 10}')
    if not set(body) <= {"messages", "partition"} or "messages" not in body:
        return _error(400, 'body must be {"messages": N} (and optionally "partition": P)')
    count, partition = body["messages"], body.get("partition")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        return _error(400, f"messages must be a whole number >= 1, not {count!r}")
    if partition is not None and (
        isinstance(partition, bool) or not isinstance(partition, int) or partition < 0
    ):
        return _error(400, f"partition must be a whole number >= 0, not {partition!r}")
    return web.json_response(
        await skip_messages(
            request.app[BROKER_KEY], _topic_name(request), _sub_name(request), count, partition
        )
    )


async def delete_subscription_route(request: web.Request) -> web.Response:
    force = _force(request)
    return web.json_response(
        await delete_subscription(
            request.app[BROKER_KEY], _topic_name(request), _sub_name(request), force
        )
    )


async def list_topics(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    topics = broker.topics
    return web.json_response(
        {
            "topics": [
                {
                    "name": name,
                    "partitions": topics.partition_count(name),
                    "retention": topics.retention_of(name).to_json(),
                }
                for name in topics.names()
            ]
        }
    )


async def topic_stats(broker: Broker, name: str) -> dict[str, Any] | None:
    """Per partition: entries, messages, producers, consumers, each
    subscription, and its transaction buffer's transactions (null if no
    transaction wrote there). Loads the topic if it is not."""
    topic = await broker.topics.load_topic(name)
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
                # (stored by this broker since the topic loaded here: for rates)
                "messages_in": part.messages_in,
                "producers": producers,
                "consumers": sum(s["consumers"] for s in subs.values()),
                "subscriptions": subs,
                "transaction_buffer": None if buffer is None else buffer.stats(),
            }
        )
    return {
        "topic": name,
        "producers": producers,
        "retention": topic.retention.to_json(),
        "partitions": partitions,
    }


async def get_topic_stats(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    name = request.match_info["topic"]
    try:
        check_topic_name(name)
    except InvalidNameError as exc:
        return _error(400, str(exc))
    stats = await topic_stats(broker, name)
    if stats is None:
        return _error(404, f"no topic {name!r}")
    return web.json_response(stats)


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text (see `broker._metrics`)."""
    broker = request.app[BROKER_KEY]
    try:
        body = await broker.metrics.scrape()
    except LedgerError as exc:
        return _error(503, f"the broker's store refuses writes: {exc}")
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


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
    out["spare"] = tc.is_spare(txnid)
    return out


_NOT_ENDED = (TxnStatus.OPEN, TxnStatus.PREPARED, TxnStatus.COMMITTING, TxnStatus.ABORTING)


def _unused(meta: TxnMeta) -> bool:
    """An aborted transaction that never had a participant: a spare one the
    client opened in advance and aborted unused (``client._spares``)."""
    return meta.status is TxnStatus.ABORTED and not meta.partitions and not meta.subscriptions


async def list_transactions(request: web.Request) -> web.Response:
    """``?state=OPEN&running_longer_than_ms=N&in_progress=true&all=true``
    (all optional). ``STUCK``: the decided transactions a participant
    failed to apply. ``running_longer_than_ms``: only transactions not
    ended yet (OPEN, PREPARED, COMMITTING, ABORTING) open that long.
    ``in_progress=true``: only those not ended, and not a client's spare
    nobody used yet (``"spare": true``). Aborted transactions that never
    had a participant (a client's unused spares) are left out unless
    ``all=true``."""
    broker = request.app[BROKER_KEY]
    state = request.query.get("state")
    if state is not None and state.upper() not in _STATES:
        return _error(400, f"state must be one of {', '.join(_STATES)}")
    longer: int | None = None
    if "running_longer_than_ms" in request.query:
        try:
            longer = int(request.query["running_longer_than_ms"])
        except ValueError:
            return _error(400, "running_longer_than_ms must be an integer")
    show_all = _flag(request, "all")
    in_progress = _flag(request, "in_progress")
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
            if longer is not None and (
                meta.status not in _NOT_ENDED or now - meta.start_ms < longer
            ):
                continue
            if not show_all and _unused(meta):
                continue
            if in_progress and (meta.status not in _NOT_ENDED or tc.is_spare(meta.txnid)):
                continue
            found.append(_txn_json(tc, meta.txnid))
    found.sort(key=lambda m: m["start_ms"] if m else 0)
    return web.json_response({"transactions": found})


def _coordinator_here(broker: Broker, txnid: TxnID) -> TransactionCoordinator | None:
    """The coordinator of ``txnid`` on this broker; None (404: no such
    transaction) when none has its id. In a cluster, a coordinator not
    loaded here -- its slot is being loaded (recovery runs before the
    coordinator is there) or dropped -- is refused `refusals.NotOwner` (503,
    retriable) instead: "no transaction" would tell the caller the
    transaction is unknown, ended and forgotten, while its real state is
    only not known here yet."""
    if broker.cluster is not None:
        return broker.coordinator(txnid)
    return broker.coordinators.get(txnid.tcid)


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
    tc = _coordinator_here(broker, txnid)
    found = _txn_json(tc, txnid) if tc is not None else None
    if found is None:
        return _error(404, f"no transaction {txnid}")
    return web.json_response(found)


async def abort_transaction(request: web.Request) -> web.Response:
    broker = request.app[BROKER_KEY]
    txnid = _txnid(request)
    if isinstance(txnid, web.Response):
        return txnid
    tc = _coordinator_here(broker, txnid)
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
    tc = _coordinator_here(broker, txnid)
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
    # (the one mapping of transactional ids: as INIT_PRODUCER_ID and Kafka's
    # InitProducerId; in a cluster the id's slot, forwarded there)
    return broker.transactional_coordinator(transactional_id)


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
    """Per coordinator here: its transactions by state, and ``spares``, the
    transactions clients opened ahead and have not used yet (OPEN in the
    coordinator's table, counted apart rather than as OPEN)."""
    broker = request.app[BROKER_KEY]
    out = []
    for tcid, tc in sorted(broker.coordinators.items()):
        counts = {status.name: 0 for status in TxnStatus}
        spares = 0
        for meta in tc.transactions():
            if tc.is_spare(meta.txnid):  # (opened ahead by a client, not used yet: not OPEN)
                spares += 1
            else:
                counts[meta.status.name] += 1
        out.append({"tc_id": tcid, "transactions": counts, "spares": spares})
    return web.json_response({"coordinators": out})


# -- who may use it, and the ACL ---------------------------------------------------

OPEN_PATHS = frozenset({"/admin/v1/health"})
CLUSTER_PATHS = frozenset({NUDGE_PATH})  # for the role `cluster` only, not superusers


@web.middleware
async def _require_admin(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The admin API and /metrics serve superusers only (when the broker
    authenticates): 401 without a valid token, 403 with another role's."""
    path = request.path
    if path in OPEN_PATHS or not (path.startswith("/admin/") or path == "/metrics"):
        return await handler(request)
    security = request.app[BROKER_KEY].security
    if path in CLUSTER_PATHS:  # (the cluster's brokers' own: the role `cluster` only)
        try:
            security.authenticate_cluster_bearer(request.headers.get("Authorization"))
        except refusals.AuthenticationError as exc:
            return web.json_response(
                {"error": str(exc)},
                status=401,
                headers={"WWW-Authenticate": 'Bearer realm="txnbuf"'},
            )
        except refusals.AuthorizationError as exc:
            return _error(403, str(exc))
        return await handler(request)
    try:
        who = security.authenticate_bearer(request.headers.get("Authorization"))
    except refusals.AuthenticationError as exc:
        return web.json_response(
            {"error": str(exc)},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="txnbuf"'},
        )
    try:
        security.allow_admin(who)
    except refusals.AuthorizationError as exc:
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


async def favicon(request: web.Request) -> web.Response:
    """The page's icon (SVG), at /favicon.svg and at /favicon.ico, where
    browsers ask for one whatever the page says."""
    return web.Response(
        body=FAVICON.read_bytes(),
        content_type="image/svg+xml",
        headers={"Cache-Control": "max-age=86400"},
    )


def add_admin_routes(app: web.Application) -> None:
    app.middlewares.append(json_errors)  # (outermost: whatever answers, errors are JSON)
    app.middlewares.append(_require_admin)
    app.middlewares.append(forward_to_owner)  # (in a cluster; after the superuser check)
    add_cluster_routes(app)
    app.router.add_get("/", admin_page)
    app.router.add_get("/favicon.ico", favicon)
    app.router.add_get("/favicon.svg", favicon)
    app.router.add_get("/admin/v1/acl", list_acl)
    app.router.add_post("/admin/v1/acl/grant", grant_acl)
    app.router.add_post("/admin/v1/acl/revoke", revoke_acl)
    app.router.add_get("/admin/v1/health", health)
    app.router.add_get("/admin/v1/topics", list_topics)
    app.router.add_put("/admin/v1/topics/{topic}", put_topic)
    app.router.add_get("/admin/v1/topics/{topic}", get_topic)
    app.router.add_delete("/admin/v1/topics/{topic}", delete_topic_route)
    subs = "/admin/v1/topics/{topic}/subscriptions"
    app.router.add_get(subs, list_subscriptions)
    app.router.add_post(subs + "/{subscription}/reset", reset_subscription_route)
    app.router.add_post(subs + "/{subscription}/skip", skip_route)
    app.router.add_delete(subs + "/{subscription}", delete_subscription_route)
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
