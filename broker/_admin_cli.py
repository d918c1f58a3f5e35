"""``txnbuf topics|subscriptions|transactions|producers|cluster ...``: the admin API
from the command line, so that an operator needs no curl.

Each command makes one or two HTTP requests to a running broker (``--url``,
http://127.0.0.1:6650 by default, or a cluster's brokers with commas; a
broker that authenticates wants a superuser's token: ``--token`` or
``$TXNBUF_TOKEN``, and ``--tls-ca`` for https) and prints a table, or the
API's JSON with ``--json``. An error the broker answers is printed as one
line on stderr (exit 1); a broker that does not answer, too (exit 1). The
routes are in docs/operations.md.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import socket
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["ADMIN_COMMANDS", "add_admin_parsers", "run_admin"]

DEFAULT_URL = "http://127.0.0.1:6650"
TIMEOUT = 30.0  # seconds a request may take (a forced deletion waits for transactions)
ADMIN_COMMANDS = ("topics", "subscriptions", "transactions", "producers", "cluster")
MOVES_PRINTED = 20  # moves `txnbuf cluster` prints unless --moves says


class CliError(Exception):
    """What to print on one line (exit 1)."""


# -- HTTP ----------------------------------------------------------------------------


def _q(part: str) -> str:
    return urllib.parse.quote(part, safe="(),")


class _Unreachable(CliError):
    """The broker could not be connected to: the request was not sent."""


def _unreachable(reason: object) -> bool:
    return isinstance(reason, ConnectionRefusedError | socket.gaierror) or (
        isinstance(reason, OSError)
        and reason.errno in (errno.ECONNREFUSED, errno.EHOSTUNREACH, errno.ENETUNREACH)
    )


def request(url: str, method: str, path: str, body: object | None = None) -> Any:
    """The JSON answer of ``method path``; CliError with the broker's
    ``error`` (or why there was no answer). The token (``--token``, else
    ``$TXNBUF_TOKEN``) and CA file (``--tls-ca``) are those `run_admin` set.

    ``url`` may name several brokers of a cluster, with commas: each is
    tried in turn while it cannot be connected to (the request was not
    sent); any of them answers every admin request (docs/operations.md)."""
    urls = [u.strip() for u in url.split(",") if u.strip()] or [url]
    missed = []
    for one in urls:
        try:
            return _request(one, method, path, body)
        except _Unreachable as exc:
            missed.append(str(exc))
    raise CliError("; ".join(missed))


def _request(url: str, method: str, path: str, body: object | None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url.rstrip("/") + path, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    if _session.token:
        req.add_header("Authorization", f"Bearer {_session.token}")
    context = None
    if url.startswith("https://"):
        try:
            context = ssl.create_default_context(cafile=_session.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise CliError(f"cannot load the CA file {_session.tls_ca}: {exc}") from None
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT, context=context) as answer:
            return json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            message = json.loads(text)["error"]
        except (ValueError, KeyError, TypeError):
            message = text.decode(errors="replace").strip()[:500]
        raise CliError(f"{method} {path}: {exc.code} {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        fault = _Unreachable if _unreachable(reason) else CliError
        raise fault(f"no answer from the broker at {url}: {reason}") from None
    except ValueError:
        raise CliError(f"{method} {path}: the answer is not JSON") from None


class _Session:
    token: str | None = None
    tls_ca: str | None = None


_session = _Session()


# -- output --------------------------------------------------------------------------


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """``rows`` as aligned columns under a header ('-' for a missing value)."""
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    for r in cells:
        lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    return "\n".join(line.rstrip() for line in lines)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ",".join(_cell(v) for v in value) or "-"
    if isinstance(value, dict):
        return " ".join(f"{k}={_cell(v)}" for k, v in value.items())
    return str(value)


def _retention(r: dict[str, Any] | None) -> str:
    if not r or r == {"time_s": 0, "size_bytes": 0}:
        return "none"
    parts = []
    for key, unit in (("time_s", "s"), ("size_bytes", "B")):
        v = r.get(key, -1)
        shown = str(int(v)) if float(v).is_integer() else str(v)
        parts.append("unlimited" if v == -1 else f"{shown}{unit}")
    return "/".join(parts)


def _print(args: argparse.Namespace, answer: Any, text: Callable[[Any], str]) -> None:
    print(json.dumps(answer, indent=2) if args.json else text(answer))
    if isinstance(answer, dict) and answer.get("missing"):  # (a cluster's list, partial)
        for gone in answer["missing"]:
            print(
                f"warning: broker {gone['broker']} did not answer ({gone['error']}): "
                "its part is missing from this list",
                file=sys.stderr,
            )


# -- commands ------------------------------------------------------------------------


def _topics(args: argparse.Namespace) -> None:
    url, action = args.url, args.action
    if action == "list":
        answer = request(url, "GET", "/admin/v1/topics")
        rows = [{**t, "retention": _retention(t.get("retention"))} for t in answer["topics"]]
        _print(args, answer, lambda _: table(rows, ["name", "partitions", "retention"]))
    elif action == "create":
        body: dict[str, Any] = {}
        if args.partitions is not None:
            body["partitions"] = args.partitions
        retention = {
            k: v
            for k, v in (("time_s", args.retention_time), ("size_bytes", args.retention_size))
            if v is not None
        }
        if retention:
            body["retention"] = retention
        answer = request(url, "PUT", f"/admin/v1/topics/{_q(args.topic)}", body)
        _print(
            args,
            answer,
            lambda a: (
                f"topic {a['topic']}: {a['partitions']} partition(s), retention "
                f"{_retention(a.get('retention'))}"
            ),
        )
    elif action == "delete":
        force = "?force=true" if args.force else ""
        answer = request(url, "DELETE", f"/admin/v1/topics/{_q(args.topic)}{force}")
        _print(
            args,
            answer,
            lambda a: (
                f"deleted topic {a['deleted']} ({a['partitions']} partition(s), "
                f"subscriptions: {_cell(a['subscriptions'])}, aborted transactions: "
                f"{_cell(a['aborted_transactions'])})"
            ),
        )
    elif action == "stats":
        answer = request(url, "GET", f"/admin/v1/topics/{_q(args.topic)}/stats")
        rows = []
        for p in answer["partitions"]:
            subs = p["subscriptions"] or {"-": {}}
            for name, s in subs.items():
                rows.append(
                    {
                        "partition": p["partition"],
                        "entries": p["entries"],
                        "messages": p["messages"],
                        "subscription": name,
                        "backlog": s.get("backlog"),
                        "unacked": s.get("unacked"),
                        "pending_ack": s.get("pending_ack"),
                        "consumers": s.get("consumers"),
                    }
                )
        head = (
            f"topic {answer['topic']}: {answer['producers']} producer(s), retention "
            f"{_retention(answer.get('retention'))}\n"
        )
        cols = ["partition", "entries", "messages", "subscription", "backlog", "unacked"]
        _print(args, answer, lambda _: head + table(rows, [*cols, "pending_ack", "consumers"]))


def _subscriptions(args: argparse.Namespace) -> None:
    url, action = args.url, args.action
    base = f"/admin/v1/topics/{_q(args.topic)}/subscriptions"
    if action == "list":
        answer = request(url, "GET", base)
        cols = ["name", "type", "consumers", "backlog", "unacked", "pending_ack"]
        _print(args, answer, lambda a: table(a["subscriptions"], cols))
        return
    sub = f"{base}/{_q(args.subscription)}"
    if action == "reset":
        given = [x for x in (args.earliest, args.latest, args.message, args.time_ms) if x]
        if len(given) != 1:
            raise CliError(
                "reset needs one of --earliest, --latest, --message P:E[:I], --time-ms T"
            )
        body: dict[str, Any]
        if args.earliest:
            body = {"position": "earliest"}
        elif args.latest:
            body = {"position": "latest"}
        elif args.time_ms is not None:
            body = {"time_ms": args.time_ms}
        else:
            body = {"position": _message_id(args.message)}
        answer = request(url, "POST", f"{sub}/reset", body)
        _print(
            args, answer, lambda a: table(a["partitions"], ["partition", "mark_delete", "backlog"])
        )
    elif action == "skip":
        body = {"messages": args.messages}
        if args.partition is not None:
            body["partition"] = args.partition
        answer = request(url, "POST", f"{sub}/skip", body)
        _print(args, answer, lambda a: table(a["partitions"], ["partition", "skipped"]))
    elif action == "delete":
        force = "?force=true" if args.force else ""
        answer = request(url, "DELETE", f"{sub}{force}")
        _print(
            args,
            answer,
            lambda a: (
                f"deleted subscription {a['deleted']} of topic {a['topic']} "
                f"(aborted transactions: {_cell(a['aborted_transactions'])})"
            ),
        )


def _message_id(text: str) -> dict[str, int]:
    try:
        parts = [int(p) for p in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) not in (2, 3) or min(parts) < 0:
        raise CliError(f"--message must be PARTITION:ENTRY[:BATCH_INDEX], not {text!r}")
    out = {"partition": parts[0], "entry_id": parts[1]}
    if len(parts) == 3:
        out["batch_index"] = parts[2]
    return out


_TXN_COLUMNS = ["txnid", "status", "tc_id", "age_s", "timeout_ms", "participants", "stuck"]


def _txn_rows(txns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    import time

    now = time.time() * 1000
    rows = []
    for t in txns:
        parts = [f"{p['topic']}/{p['partition']}" for p in t.get("partitions", [])]
        parts += [f"{s['topic']}:{s['subscription']}" for s in t.get("subscriptions", [])]
        rows.append(
            {
                **t,
                "status": t["status"] + (" (spare, unused)" if t.get("spare") else ""),
                "age_s": f"{(now - t['start_ms']) / 1000:.1f}",
                "participants": parts,
                "stuck": len(t.get("stuck", [])) or None,
            }
        )
    return rows


def _transactions(args: argparse.Namespace) -> None:
    url, action = args.url, args.action
    if action == "list":
        query = {}
        if args.state:
            query["state"] = args.state
        if args.running_longer_than_ms is not None:
            query["running_longer_than_ms"] = str(args.running_longer_than_ms)
        if args.all:
            query["all"] = "true"
        elif not args.state:
            query["in_progress"] = "true"
        path = "/admin/v1/transactions" + ("?" + urllib.parse.urlencode(query) if query else "")
        answer = request(url, "GET", path)
        _print(args, answer, lambda a: table(_txn_rows(a["transactions"]), _TXN_COLUMNS))
        return
    path = f"/admin/v1/transactions/{_q(args.txnid)}"
    if action == "show":
        answer = request(url, "GET", path)
        _print(args, answer, lambda a: json.dumps(a, indent=2))
    elif action == "abort":
        answer = request(url, "POST", f"{path}/abort")
        _print(args, answer, lambda a: f"transaction {a['txnid']}: {a['status']}")
    elif action == "resolve":
        body = {"action": args.resolve_action}
        if args.participant:
            body["participant"] = args.participant
        answer = request(url, "POST", f"{path}/resolve", body)
        _print(
            args,
            answer,
            lambda a: (
                f"transaction {a['txnid']}: {a['action']} on {a['participants']} participant(s)"
            ),
        )


def _producers(args: argparse.Namespace) -> None:
    url, action = args.url, args.action
    if action == "list":
        answer = request(url, "GET", "/admin/v1/producers")
        cols = ["transactional_id", "tc_id", "producer_id", "producer_epoch", "ongoing_txnid"]
        _print(args, answer, lambda a: table(a["producers"], cols))
        return
    path = f"/admin/v1/producers/{_q(args.transactional_id)}"
    if action == "show":
        answer = request(url, "GET", path)
        _print(args, answer, lambda a: json.dumps(a, indent=2))
    elif action == "terminate":
        answer = request(url, "POST", f"{path}/terminate")
        _print(
            args,
            answer,
            lambda a: (
                f"producer {a['transactional_id']}: fenced (producer id "
                f"{a['producer_id']}, epoch {a['producer_epoch']})"
            ),
        )


def _slot_ranges(slots: Sequence[int]) -> str:
    """``0-3,7,9-10`` ("-" for none)."""
    out: list[list[int]] = []
    for k in sorted(slots):
        if out and out[-1][1] == k - 1:
            out[-1][1] = k
        else:
            out.append([k, k])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out) or "-"


def cluster_text(answer: dict[str, Any], moves: int = MOVES_PRINTED) -> str:
    """`txnbuf cluster`'s tables: brokers, slots per broker, recent moves."""
    if not answer.get("cluster"):
        return (
            f"not a cluster: one broker ({answer.get('this')}) serves every topic and coordinator"
        )
    slots = answer["slots"]
    states: dict[str | None, dict[str, list[int]]] = {}
    for s in slots:
        states.setdefault(s["owner"], {}).setdefault(s["state"], []).append(s["slot"])
    brokers = []
    for b in answer["brokers"]:
        mine = states.get(b["id"], {})
        brokers.append(
            {
                "broker": b["id"] + (" (this)" if b["this"] else ""),
                "urls": b["urls"],
                "live": "yes" if b["live"] else "NO (lease ran out)",
                "lease_age_s": f"{b['lease_age_s']:.1f}",
                "expires_in_s": f"{b['lease_expires_in_s']:.1f}",
                "slots": len(b["slots"]),
                "loading": len(mine.get("loading", [])) or None,
            }
        )
    per = [
        {
            "owner": owner if owner is not None else "(none: free)",
            "slots": sum(len(v) for v in by_state.values()),
            **{state: _slot_ranges(v) for state, v in sorted(by_state.items())},
        }
        for owner, by_state in sorted(states.items(), key=lambda i: (i[0] is None, i[0] or ""))
    ]
    state_cols = sorted({state for by_state in states.values() for state in by_state})
    shown = [
        {
            **m,
            "from": m["from"] or "-",
            "to": m["to"] or "(not taken yet)",
            "age_s": f"{m['age_s']:.1f}",
        }
        for m in answer["moves"][:moves]
    ]
    lines = [
        f"cluster: {len(answer['brokers'])} broker(s), {answer['slot_count']} slots "
        f"(answered by {answer['this']})",
        "",
        table(
            brokers, ["broker", "urls", "live", "lease_age_s", "expires_in_s", "slots", "loading"]
        ),
        "",
        "slots per broker:",
        table(per, ["owner", "slots", *state_cols]),
        "",
        f"recent moves ({len(shown)} of {len(answer['moves'])} shown, the latest first):",
        table(shown, ["slot", "from", "to", "epoch", "age_s", "why"]) if shown else "(none)",
    ]
    if answer.get("unanswered"):
        lines.append(
            "\nbrokers that did not say which of their slots are loaded: "
            + ", ".join(answer["unanswered"])
        )
    return "\n".join(lines)


def _cluster(args: argparse.Namespace) -> None:
    answer = request(args.url, "GET", "/admin/v1/cluster")
    _print(args, answer, lambda a: cluster_text(a, args.moves))


# -- the parsers ---------------------------------------------------------------------

_RUN: dict[str, Callable[[argparse.Namespace], None]] = {
    "topics": _topics,
    "subscriptions": _subscriptions,
    "transactions": _transactions,
    "producers": _producers,
    "cluster": _cluster,
}


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        default=DEFAULT_URL,
        help=f"the broker ({DEFAULT_URL}); a cluster's brokers with commas: the first that "
        "can be reached answers",
    )
    p.add_argument("--json", action="store_true", help="print the API's JSON answer")
    p.add_argument("--token", help="a superuser's token (default: $TXNBUF_TOKEN)")
    p.add_argument("--tls-ca", help="CA file to check an https:// broker with")


def add_admin_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``topics``, ``subscriptions``, ``transactions`` and ``producers``."""
    topics = commands.add_parser("topics", help="list, create, delete topics; show stats")
    t = topics.add_subparsers(dest="action", required=True)
    _common(t.add_parser("list", help="every topic"))
    p = t.add_parser("create", help="create a topic, grow it, or set its retention")
    _common(p)
    p.add_argument("topic")
    p.add_argument(
        "--partitions", type=int, help="partitions (a new topic: 1; a count can only grow)"
    )
    p.add_argument(
        "--retention-time",
        type=float,
        metavar="SECONDS",
        help="keep acknowledged messages this long (-1: no limit)",
    )
    p.add_argument(
        "--retention-size",
        type=int,
        metavar="BYTES",
        help="keep up to this many bytes of acknowledged messages (-1: no limit)",
    )
    p = t.add_parser("delete", help="delete a topic and everything in it")
    _common(p)
    p.add_argument("topic")
    p.add_argument(
        "--force",
        action="store_true",
        help="abort the transactions holding it and drop its producers and consumers",
    )
    p = t.add_parser("stats", help="per partition and subscription")
    _common(p)
    p.add_argument("topic")

    subs = commands.add_parser("subscriptions", help="list, reset, skip, delete subscriptions")
    s = subs.add_subparsers(dest="action", required=True)
    p = s.add_parser("list", help="the subscriptions of a topic")
    _common(p)
    p.add_argument("topic")
    p = s.add_parser("reset", help="move a subscription to a position or a time")
    _common(p)
    p.add_argument("topic")
    p.add_argument("subscription")
    p.add_argument("--earliest", action="store_true", help="to the first message kept")
    p.add_argument("--latest", action="store_true", help="past the last message")
    p.add_argument("--message", metavar="P:E[:I]", help="so that this message id comes next")
    p.add_argument("--time-ms", type=int, help="to the first message published at or after this")
    p = s.add_parser("skip", help="acknowledge the next N messages")
    _common(p)
    p.add_argument("topic")
    p.add_argument("subscription")
    p.add_argument("messages", type=int, help="how many, on each partition")
    p.add_argument("--partition", type=int, help="on this partition only")
    p = s.add_parser("delete", help="delete a subscription")
    _common(p)
    p.add_argument("topic")
    p.add_argument("subscription")
    p.add_argument(
        "--force",
        action="store_true",
        help="abort the transactions holding it and drop its consumers",
    )

    txns = commands.add_parser("transactions", help="list, show, abort, resolve transactions")
    x = txns.add_subparsers(dest="action", required=True)
    p = x.add_parser("list", help="transactions on the broker's coordinators")
    _common(p)
    p.add_argument(
        "--state", help="OPEN, PREPARED, COMMITTING, ABORTING, COMMITTED, ABORTED, STUCK"
    )
    p.add_argument(
        "--running-longer-than-ms", type=int, metavar="MS", help="not ended, open this long"
    )
    p.add_argument(
        "--all",
        action="store_true",
        help="also those ended recently and the clients' spares (default: in progress only)",
    )
    for name, doc in (("show", "one transaction"), ("abort", "abort an open transaction")):
        p = x.add_parser(name, help=doc)
        _common(p)
        p.add_argument("txnid", help="(most_bits,least_bits), e.g. (0,17)")
    p = x.add_parser("resolve", help="retry or skip the stuck participants of a transaction")
    _common(p)
    p.add_argument("txnid")
    p.add_argument("resolve_action", choices=["retry", "skip"], metavar="retry|skip")
    p.add_argument("--participant", help="only this one (as listed under stuck)")

    producers = commands.add_parser(
        "producers", help="list, show, terminate transactional producers"
    )
    r = producers.add_subparsers(dest="action", required=True)
    _common(r.add_parser("list", help="every transactional id"))
    for name, doc in (
        ("show", "one transactional id"),
        ("terminate", "fence it and abort its transaction (KIP-939)"),
    ):
        p = r.add_parser(name, help=doc)
        _common(p)
        p.add_argument("transactional_id")
    cluster = commands.add_parser(
        "cluster", help="the brokers of a cluster, their slots and the recent moves"
    )
    _common(cluster)
    cluster.add_argument(
        "--moves", type=int, default=MOVES_PRINTED, help=f"moves to print ({MOVES_PRINTED})"
    )
    cluster.set_defaults(action="")
    for actions in (t, s, x, r):  # (named in a missing-one error)
        actions.metavar = "{" + ",".join(actions.choices) + "}"


def run_admin(args: argparse.Namespace) -> int:
    _session.token = args.token or os.environ.get("TXNBUF_TOKEN")
    _session.tls_ca = args.tls_ca
    try:
        _RUN[args.command](args)
    except CliError as exc:
        print(
            f"txnbuf {' '.join(filter(None, (args.command, args.action)))}: {exc}", file=sys.stderr
        )
        return 1
    return 0
