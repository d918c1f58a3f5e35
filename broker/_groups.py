"""Transaction groups on a connection and in the admin API: what an
exactly-once sink (`pipelines`) needs of the coordinators.

- NEW_TXN with a ``tag`` or ``prepared_ttl_ms``: a transaction that carries
  them (`broker._transactions` handles every NEW_TXN).
- PREPARE_TXN: a PIP-31 transaction PREPARED by its TxnID (answered with
  TXN_RESPONSE once the PREPARED record, and every write of the
  transaction queued before it, is durable).
- COMMIT_GROUP: commit a batch's PREPARED transactions as one decision,
  idempotently under (group, sequence) (`tc.TransactionCoordinator.commit_group`).
- ABORT_TAGGED: abort the undecided transactions of a tag (or a tag prefix).

PREPARE_TXN, COMMIT_GROUP and ABORT_TAGGED decide transactions: they need
what ending each of them by END_TXN needs (`broker._auth`).

Admin (HTTP JSON): ``GET /admin/v1/tagged-transactions?tag=T[&prefix=true]``
lists the transactions not ended with that tag on every coordinator, and
``POST /admin/v1/tagged-transactions/abort?tag=T[&prefix=true]`` aborts the
undecided ones: how an operator finds and ends what a dead job prepared.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from broker._broker import BROKER_KEY
from broker._context import Context, Handlers
from broker._errors import error_code, error_text
from ledger import on_outcome
from proto import refusals
from proto import txnbuf_pb2 as pb
from tc import TransactionCoordinator, TxnID, TxnMeta, wire_txnid

__all__ = ["add_group_routes", "group_handlers"]

log = logging.getLogger(__name__)

T = pb.BaseCommand


def group_handlers(conn: Context) -> Handlers:
    """The handlers of the group commands for ``conn``'s dispatch table."""
    return {
        T.PREPARE_TXN: lambda cmd: _prepare_txn(conn, cmd),
        T.COMMIT_GROUP: lambda cmd: _commit_group(conn, cmd),
        T.ABORT_TAGGED: lambda cmd: _abort_tagged(conn, cmd),
    }


def _may_end(conn: Context, metas: list[TxnMeta]) -> None:
    """Deciding transactions needs what writing them needed, as END_TXN
    (`broker._auth`); refused whole if one is refused."""
    for meta in metas:
        conn.broker.security.allow_end(conn.who, meta.partitions, meta.subscriptions)


def _coordinator(conn: Context, tc_id: int) -> TransactionCoordinator:
    tc = conn.broker.coordinators.get(tc_id)
    if tc is None and conn.broker.cluster is not None:  # (another broker's: NOT_OWNER)
        raise conn.broker.cluster.coordinator_not_here(tc_id)
    if tc is None:
        raise refusals.TransactionCoordinatorNotFound(
            f"no coordinator {tc_id} here (coordinators: {sorted(conn.broker.coordinators)})",
        )
    return tc


def _prepare_txn(conn: Context, cmd: pb.BaseCommand) -> None:
    req = cmd.prepare_txn
    what = "prepare transaction"
    try:
        txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
        tc = conn.broker.coordinator(txnid)
        meta = tc.get(txnid)
        if meta is not None:
            _may_end(conn, [meta])
        if meta is not None and meta.producer is not None:
            raise refusals.NotAllowed(
                f"transaction {txnid} belongs to producer {meta.producer[0]}: it is prepared "
                "through that producer (PREPARE_PRODUCER_TXN)",
            )
        written = tc.prepare_txn(txnid)
    except Exception as exc:
        _txn_respond(conn, req, what, exc)
        return

    on_outcome(
        written,
        lambda _: _txn_respond(conn, req, what, None),
        lambda exc: _txn_respond(conn, req, what, exc),
    )


def _txn_respond(
    conn: Context, req: pb.CommandPrepareTxn, what: str, exc: BaseException | None
) -> None:
    """PREPARE_TXN's answer: TXN_RESPONSE, with the error if ``exc``."""
    out = pb.BaseCommand(type=T.TXN_RESPONSE)
    resp = out.txn_response
    resp.request_id = req.request_id
    resp.txnid_most_bits = req.txnid_most_bits
    resp.txnid_least_bits = req.txnid_least_bits
    if exc is not None:
        resp.error = error_code(exc, f"connection {conn.peer}: {what}")
        resp.message = error_text(exc)
    conn.send(out)


def _group_respond(
    conn: Context,
    request_id: int,
    exc: BaseException | None = None,
    duplicate: bool = False,
    committed: int = 0,
    aborted: int = 0,
) -> None:
    out = pb.BaseCommand(type=T.TXN_GROUP_RESPONSE)
    resp = out.txn_group_response
    resp.request_id = request_id
    if exc is not None:
        resp.error = error_code(exc, f"connection {conn.peer}: group request")
        resp.message = error_text(exc)
    else:
        resp.duplicate = duplicate
        resp.committed = committed
        resp.aborted = aborted
    conn.send(out)


def _when_done(conn: Context, request_id: int, done: asyncio.Future[None], **fields: Any) -> None:
    on_outcome(
        done,
        lambda _: _group_respond(conn, request_id, **fields),
        lambda exc: _group_respond(conn, request_id, exc),
    )


def _commit_group(conn: Context, cmd: pb.BaseCommand) -> None:
    req = cmd.commit_group
    try:
        txnids = [wire_txnid(t.most_bits, t.least_bits) for t in req.txns]
        others = sorted({t.tcid for t in txnids} - {req.tc_id})
        if others:
            raise refusals.InvalidArgument(
                f"a group commit names transactions of one coordinator ({req.tc_id}); "
                f"these belong to {others}",
            )
        tc = _coordinator(conn, req.tc_id)
        named = [m for m in map(tc.get, txnids) if m is not None]
        tagged = tc.transactions_tagged(req.abort_tag) if req.abort_tag else []
        _may_end(conn, [*named, *tagged])
        duplicate, committed, aborted, done = tc.commit_group(
            req.group, req.sequence, txnids, req.abort_tag
        )
    except Exception as exc:
        _group_respond(conn, req.request_id, exc)
        return
    _when_done(
        conn, req.request_id, done, duplicate=duplicate, committed=committed, aborted=aborted
    )


def _abort_tagged(conn: Context, cmd: pb.BaseCommand) -> None:
    req = cmd.abort_tagged
    try:
        tc = _coordinator(conn, req.tc_id)
        _may_end(conn, tc.transactions_tagged(req.tag, req.prefix) if req.tag else [])
        aborted, done = tc.abort_tagged(req.tag, req.prefix)
    except Exception as exc:
        _group_respond(conn, req.request_id, exc)
        return
    _when_done(conn, req.request_id, done, aborted=aborted)


# -- admin ----------------------------------------------------------------------------


def _tag_query(request: web.Request) -> tuple[str, bool] | web.Response:
    tag = request.query.get("tag", "")
    prefix = request.query.get("prefix", "false").lower()
    if not tag:
        return web.json_response({"error": "name a tag: ?tag=..."}, status=400)
    if prefix not in ("true", "false", "1", "0"):
        return web.json_response({"error": "prefix must be true or false"}, status=400)
    return tag, prefix in ("true", "1")


async def list_tagged(request: web.Request) -> web.Response:
    """``?tag=T[&prefix=true]``: the transactions not ended with that tag
    (or a tag starting with it), on every coordinator, oldest first."""
    query = _tag_query(request)
    if isinstance(query, web.Response):
        return query
    broker = request.app[BROKER_KEY]
    found = [
        meta.to_json()
        for tc in broker.coordinators.values()
        for meta in tc.transactions_tagged(*query)
    ]
    found.sort(key=lambda m: m["start_ms"])
    return web.json_response({"transactions": found})


async def abort_tagged(request: web.Request) -> web.Response:
    """``?tag=T[&prefix=true]``: abort the undecided (OPEN or PREPARED)
    transactions with that tag on every coordinator; answers their ids
    once the aborts are durable and applied."""
    query = _tag_query(request)
    if isinstance(query, web.Response):
        return query
    broker = request.app[BROKER_KEY]
    ids: list[TxnID] = []
    waits = []
    for tc in broker.coordinators.values():
        ids += [m.txnid for m in tc.transactions_tagged(*query) if m.status.name in _UNDECIDED]
        _, done = tc.abort_tagged(*query)
        waits.append(done)
    await asyncio.gather(*waits)
    return web.json_response({"aborted": [str(t) for t in ids]})


_UNDECIDED = ("OPEN", "PREPARED")


def add_group_routes(app: web.Application) -> None:
    app.router.add_get("/admin/v1/tagged-transactions", list_tagged)
    app.router.add_post("/admin/v1/tagged-transactions/abort", abort_tagged)
