"""The admin API in a cluster: ``GET /admin/v1/cluster``, and every admin
request answered by any broker.

``GET /admin/v1/cluster`` reads the cluster tables (`cluster.PostgresMembership.
describe`: brokers with their leases by the database's clock, slots with
owner and epoch, the recent moves) and asks each other live broker which of
its slots are loaded (``GET /admin/v1/cluster/broker``, this broker's own
view). On a broker without ``--cluster`` it answers ``"cluster": false``
with that one broker, no slots and no moves (docs/operations.md).

Forwarding (`forward_to_owner`, a middleware after the superuser check): a
request about a topic (its subscriptions and stats included), a
transaction or a transactional id (``/admin/v1/producers/{id}``, the
registry of its slot's coordinator) whose slot another broker serves is sent on to that broker's
admin URL with the caller's ``Authorization`` and body, and its answer
(status, JSON) returned as it is, with ``X-Txnbuf-Answered-By`` naming the
broker that answered. A proxy, not a 307 redirect: common HTTP clients
(curl, Python's urllib and requests) drop ``Authorization`` when a redirect
goes to another host or port, so a redirected admin request would arrive
unauthenticated; and the caller needs no route to every broker, only to
one. The forwarded request carries ``X-Txnbuf-Forwarded``: a broker that
gets one for a slot it does not serve (it moved meanwhile) refuses it
``NOT_OWNER`` (503, retriable) rather than forwarding again, so a request
makes one hop at most. Grants and revokes of the ACL go to the owner of
slot 0, which writes it.

Cluster-wide lists (``/admin/v1/topics``, ``/transactions``,
``/coordinators``, ``/producers``, ``/tagged-transactions``) and the abort
of tagged transactions (``POST /admin/v1/tagged-transactions/abort``): each
broker knows the topics and coordinators of its own slots, so the broker
asked answers (or aborts) its own and asks every other live broker for
theirs (forwarded, so each answers its own only), merged; a broker that
does not answer within `GATHER_TIMEOUT` (`FORWARD_TIMEOUT` for the abort)
is named under ``"missing"`` (the answer is then partial, and says so).

``POST /admin/v1/cluster/look`` (`look_now`): another broker of the cluster
changed the tables (it joined, released slots, or left) and asks this one
to look at them now (`cluster.Member.nudge`) rather than at its next
interval. For the role ``cluster`` only (a token of the cluster's secret,
checked by `broker._admin._require_admin`): a superuser is refused 403
like any other role. Its body is empty or ``{"from": "<broker id>"}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import urllib.parse
from typing import TYPE_CHECKING, Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from broker._auth import ACL_LEDGER, NUDGE_PATH
from broker._broker import BROKER_KEY, Broker
from broker._slots import slot_of, slot_of_key
from buffer import InvalidNameError, check_topic_name
from cluster import MembershipError
from cluster._postgres import MOVES_KEPT
from tc import TxnID

if TYPE_CHECKING:
    from broker._cluster import ClusterHost

__all__ = [
    "ANSWERED_BY",
    "FORWARDED",
    "NUDGE_PATH",
    "add_cluster_routes",
    "forward_to_owner",
]

log = logging.getLogger(__name__)

FORWARDED = "X-Txnbuf-Forwarded"  # a request forwarded by another broker: answer it here
ANSWERED_BY = "X-Txnbuf-Answered-By"  # the broker that answered a forwarded request
FORWARD_TIMEOUT = 30.0  # seconds a forwarded request may take (as the admin CLI waits)
GATHER_TIMEOUT = 5.0  # seconds each broker may take to answer its part of a list
MOVES_SHOWN = 100  # moves in GET /admin/v1/cluster unless ?moves=N says
NUDGE_BODY_MAX = 4096  # bytes of a nudge's body, at most

_SESSION_KEY = web.AppKey("cluster_admin_session", aiohttp.ClientSession)

# The cluster-wide lists: (method, path) -> (the key of the list, what sorts
# it: a key of its items, or "" for items that are strings).
_LISTS: dict[tuple[str, str], tuple[str, str]] = {
    ("GET", "/admin/v1/topics"): ("topics", "name"),
    ("GET", "/admin/v1/transactions"): ("transactions", "start_ms"),
    ("GET", "/admin/v1/coordinators"): ("coordinators", "tc_id"),
    ("GET", "/admin/v1/producers"): ("producers", "transactional_id"),
    ("GET", "/admin/v1/tagged-transactions"): ("transactions", "start_ms"),
    ("POST", "/admin/v1/tagged-transactions/abort"): ("aborted", ""),
}
_ACL_WRITES = frozenset({"/admin/v1/acl/grant", "/admin/v1/acl/revoke"})


def _host(broker: Broker) -> ClusterHost | None:
    """The broker's cluster host (None: not a cluster's broker)."""
    if broker.cluster is None:
        return None
    from broker._cluster import ClusterHost  # (imported already: it set broker.cluster)

    return broker.cluster if isinstance(broker.cluster, ClusterHost) else None


def _session(app: web.Application) -> aiohttp.ClientSession:
    session = app.get(_SESSION_KEY)
    if session is None or session.closed:
        session = app[_SESSION_KEY] = aiohttp.ClientSession()
    return session


async def _close_session(app: web.Application) -> None:
    session = app.get(_SESSION_KEY)
    if session is not None:
        await session.close()


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


class _Wildcard(OSError):
    """A broker registered a wildcard address (``--host 0.0.0.0``): no other
    broker can reach it there."""


async def _send(
    request: web.Request, url: str, path_qs: str, body: bytes, timeout: float
) -> tuple[int, Any]:
    """``request``'s method on ``url + path_qs`` with its credentials, as
    forwarded; (status, JSON answer). Raises OSError/aiohttp/timeout errors."""
    host = urllib.parse.urlsplit(url).hostname or ""
    if host in ("0.0.0.0", "::"):
        raise _Wildcard(
            f"the broker registered {url}, a wildcard address no other broker can reach "
            "(start it with --advertised-url naming an address the others reach)"
        )
    cluster = _host(request.app[BROKER_KEY])
    headers = {FORWARDED: cluster.me if cluster is not None else "broker"}
    for name in ("Authorization", "Content-Type"):
        if name in request.headers:
            headers[name] = request.headers[name]
    session = _session(request.app)
    tls_ca = cluster.tls_ca if cluster is not None else None
    async with session.request(
        request.method,
        url.rstrip("/") + path_qs,
        data=body or None,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout),
        ssl=tls_ca if tls_ca is not None else True,
    ) as answer:
        text = await answer.read()
        try:
            return answer.status, json.loads(text or b"null")
        except ValueError:
            return answer.status, {"error": text.decode(errors="replace")[:500]}


async def _forward(request: web.Request, owner: str, url: str) -> web.Response:
    body = await request.read()
    try:
        status, answer = await _send(request, url, request.path_qs, body, FORWARD_TIMEOUT)
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        why = str(exc) if isinstance(exc, _Wildcard) else f"{exc!r}; try again"
        return _json(502, {"error": f"forwarding to the owner {owner} at {url} failed: {why}"})
    return _json(status, answer, {ANSWERED_BY: owner})


def _slot_of_request(request: web.Request, cluster: ClusterHost) -> tuple[int, str] | None:
    """The slot a request is about, and what it names (None: none, or a name
    the handler refuses as bad input itself)."""
    count = cluster.broker.store.slot_count
    info = request.match_info
    if "topic" in info:
        try:
            topic = check_topic_name(info["topic"])
        except InvalidNameError:
            return None
        return slot_of_key(topic, count), f"topic {topic!r}"
    if "txnid" in info:
        try:
            tcid = TxnID.parse(info["txnid"]).tcid
        except ValueError:
            return None
        return tcid % count, f"transaction coordinator {tcid}"
    if "transactional_id" in info:  # (its producer-epoch registry: the id's slot)
        tid = info["transactional_id"]
        return slot_of_key(tid, count), f"transactional id {tid[:200]!r}"
    if request.path in _ACL_WRITES:
        return slot_of(ACL_LEDGER, count) or 0, "the ACL"
    return None


@web.middleware
async def forward_to_owner(request: web.Request, handler: Handler) -> web.StreamResponse:
    """In a cluster: a request about another broker's slot is answered by
    its owner; a cluster-wide list gathers every live broker's (see the
    module docstring). Runs after the superuser check."""
    cluster = _host(request.app[BROKER_KEY])
    if cluster is None or not request.path.startswith("/admin/v1/"):
        return await handler(request)
    forwarded = FORWARDED in request.headers
    target = _slot_of_request(request, cluster)
    if target is not None:
        slot, what = target
        if slot in cluster.served:
            return await handler(request)
        if forwarded:  # (one hop at most: it moved meanwhile)
            raise cluster.not_owner(slot, what)
        url = await cluster.admin_owner(slot, what)
        view = cluster.membership.last_view
        owner = view.slots[slot].owner if view is not None else None
        return await _forward(request, owner or "", url)
    if (request.method, request.path) in _LISTS and not forwarded:
        return await _gather(request, handler, cluster)
    return await handler(request)


async def _gather(request: web.Request, handler: Handler, cluster: ClusterHost) -> web.Response:
    key, order = _LISTS[request.method, request.path]
    own = await handler(request)
    if not isinstance(own, web.Response) or own.status != 200 or own.body is None:
        return own  # type: ignore[return-value]  # (bad input: refused here as everywhere)
    assert isinstance(own.body, bytes)
    mine = json.loads(own.body)
    others = await cluster.live_others()

    # (A POST, an abort, waits for each broker's aborts to be durable and applied.)
    timeout = GATHER_TIMEOUT if request.method == "GET" else FORWARD_TIMEOUT

    async def ask(owner: str, url: str) -> tuple[str, int, Any]:
        try:
            status, answer = await _send(request, url, request.path_qs, b"", timeout)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            return owner, 0, {"error": repr(exc)}
        return owner, status, answer

    answers = await asyncio.gather(*(ask(b, u) for b, u in others.items()))
    items: list[Any] = list(mine.get(key, []))
    missing = []
    for owner, status, answer in answers:
        if status == 200 and isinstance(answer, dict) and isinstance(answer.get(key), list):
            items.extend(answer[key])
        else:
            error = answer.get("error") if isinstance(answer, dict) else None
            missing.append({"broker": owner, "error": error or f"status {status}"})
    seen: set[str] = set()
    merged = []

    def sort_key(item: Any) -> tuple[Any, ...]:
        value = item.get(order) if isinstance(item, dict) else item
        return (1,) if value is None else (0, value)

    for item in sorted(items, key=sort_key):
        ident = str(item.get("name")) if key == "topics" else json.dumps(item, sort_keys=True)
        if ident not in seen:  # (a topic seen on two brokers while its slot moved)
            seen.add(ident)
            merged.append(item)
    out: dict[str, Any] = {**mine, key: merged}
    if missing:
        out["missing"] = missing
    return web.json_response(out)


# -- GET /admin/v1/cluster ---------------------------------------------------------


def _this_broker(broker: Broker) -> dict[str, Any]:
    cluster = _host(broker)
    if cluster is None:
        return {"cluster": False, "broker": broker.url, "urls": broker.url}
    return {
        "cluster": True,
        "broker": cluster.me,
        "urls": broker.url,
        "lease_ttl_s": cluster.member.lease.ttl,
        "held": {str(k): e for k, e in sorted(cluster.member.held.items())},
        "loaded": sorted(cluster.served),
        "loading": sorted(cluster.loading),
        "drops": cluster.drops,
    }


async def get_this_broker(request: web.Request) -> web.Response:
    """This broker's own view: the slots it holds, loaded or loading."""
    return web.json_response(_this_broker(request.app[BROKER_KEY]))


async def get_cluster(request: web.Request) -> web.Response:
    """The brokers (leases by the database's clock), the slots (owner,
    epoch, state) and the recent moves; see docs/operations.md."""
    broker = request.app[BROKER_KEY]
    cluster = _host(broker)
    if cluster is None:
        return web.json_response(
            {
                "cluster": False,
                "this": broker.url,
                "slot_count": 0,
                "brokers": [
                    {
                        "id": broker.url,
                        "urls": broker.url,
                        "this": True,
                        "live": True,
                        "lease_age_s": None,
                        "lease_expires_in_s": None,
                        "slots": [],
                    }
                ],
                "slots": [],
                "moves": [],
            }
        )
    shown = request.query.get("moves", str(MOVES_SHOWN))
    if not shown.isdigit() or int(shown) > MOVES_KEPT:
        return _json(400, {"error": f"moves must be a whole number up to {MOVES_KEPT}"})
    try:
        tables = await cluster.membership.describe(int(shown))
    except MembershipError as exc:
        return _json(503, {"error": f"the cluster database did not answer: {exc}"})
    now = tables.now
    live = {b.id for b in tables.brokers if b.lease_until > now}
    urls = {b.id: b.urls for b in tables.brokers}

    async def view_of(owner: str) -> tuple[str, dict[str, Any] | None]:
        url = next((u.strip() for u in urls[owner].split(",") if u.startswith("http")), "")
        if not url:
            return owner, None
        try:
            status, answer = await _send(
                request, url, "/admin/v1/cluster/broker", b"", GATHER_TIMEOUT
            )
        except (aiohttp.ClientError, OSError, TimeoutError):
            return owner, None
        return owner, answer if status == 200 and isinstance(answer, dict) else None

    views = dict(await asyncio.gather(*(view_of(b) for b in sorted(live) if b != cluster.me)))
    views[cluster.me] = _this_broker(broker)
    slots = []
    for slot, owner, epoch in tables.slots:
        if owner is None:
            state = "free"
        elif owner not in live:
            state = "expired"  # (its lease ran out: being taken over)
        elif (view := views.get(owner)) is None:
            state = "unknown"  # (its owner did not say)
        elif slot in view.get("loaded", ()):
            state = "loaded"
        else:
            state = "loading"
        slots.append({"slot": slot, "owner": owner, "epoch": epoch, "state": state})
    brokers = [
        {
            "id": b.id,
            "urls": b.urls,
            "this": b.id == cluster.me,
            "live": b.id in live,
            "lease_age_s": round(now - b.renewed_at, 3),
            "lease_expires_in_s": round(b.lease_until - now, 3),
            "slots": [s for s, o, _ in tables.slots if o == b.id],
        }
        for b in tables.brokers
    ]
    moves = [
        {
            "slot": m.slot,
            "from": m.from_owner,
            "to": m.to_owner,
            "epoch": m.epoch,
            "at_ms": int(m.at * 1000),
            "age_s": round(now - m.at, 3),
            "why": m.why,
        }
        for m in tables.moves
    ]
    return web.json_response(
        {
            "cluster": True,
            "this": cluster.me,
            "slot_count": len(tables.slots),
            "now_ms": int(now * 1000),
            "brokers": brokers,
            "slots": slots,
            "moves": moves,
            "unanswered": sorted(b for b in live if views.get(b) is None),
        }
    )


async def look_now(request: web.Request) -> web.Response:
    """``POST /admin/v1/cluster/look``: another broker's nudge (see the
    module docstring); the role ``cluster`` was checked before."""
    cluster = _host(request.app[BROKER_KEY])
    if cluster is None:  # (a cluster token is refused 401 there first)
        return _json(409, {"error": "this broker is not a cluster's: it has no tables to look at"})
    body = await request.read()
    sender = ""
    if body.strip():
        try:
            parsed = json.loads(body) if len(body) <= NUDGE_BODY_MAX else None
        except (ValueError, UnicodeDecodeError):
            parsed = None
        if (
            not isinstance(parsed, dict)
            or set(parsed) - {"from"}
            or not isinstance(parsed.get("from", ""), str)
        ):
            return _json(
                400,
                {
                    "error": 'the body must be empty or {"from": "<broker id>"} (at most '
                    f"{NUDGE_BODY_MAX} bytes); nothing was done"
                },
            )
        sender = parsed.get("from", "")
    cluster.member.nudge()
    log.debug("nudged by %s: looking at the cluster tables now", sender[:200] or "a broker")
    return web.json_response({"looking": True})


def add_cluster_routes(app: web.Application) -> None:
    app.router.add_post(NUDGE_PATH, look_now)
    app.router.add_get("/admin/v1/cluster", get_cluster)
    app.router.add_get("/admin/v1/cluster/broker", get_this_broker)
    app.on_cleanup.append(_close_session)
