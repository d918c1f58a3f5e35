"""The `txnbuf` command line: ``txnbuf serve``, ``txnbuf check``,
``txnbuf check-data`` (`broker._checkdata`), ``txnbuf backup``
(`broker._backup`), ``txnbuf token`` /
``txnbuf acl`` (`broker._auth_cli`), and the admin commands ``txnbuf
topics|subscriptions|transactions|producers`` (`broker._admin_cli`). Bad
options and a port in use end in one line on stderr (exit 2 and 1), not a
traceback.

``txnbuf serve`` with no arguments runs one broker on 127.0.0.1:6650 with its
data in ./txnbuf-data, authenticating nobody; it refuses another address
without authentication unless ``--insecure``, for the stream listener
(``--stream-port``, on ``--host``) and the Kafka listener
(``--kafka-host``) too (docs/security.md). SIGTERM and
SIGINT stop it cleanly: connections are closed, queued writes finish, the
database is closed.

Topics load on first use (``--no-preload``: only then; by default a
background pass loads them all after the start) and unload after
``--unload-after`` seconds left alone (see `broker._broker`).

Garbage collection: opening the broker runs with the cyclic collector off,
and then the broker freezes what it loaded (never scanned again) without
collecting first: it leaves next to no cyclic garbage. (Topics load later,
on use or in the background pass; their objects are collected as usual.)
Then it runs the young generation every `GC_GEN0_THRESHOLD` allocations
instead of Python's 700: the broker allocates many short-lived objects per
message, and the default made collection about a tenth of its
main thread's time under transactional load (py-spy). Reference counting
still frees almost everything at once; only cycles wait a little longer.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import importlib.metadata
import logging
import os
import signal
import socket
import ssl
import sys
import urllib.parse
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from aiohttp import web

from broker._acl import AclFileError
from broker._auth import AuthConfig, check_listen
from broker._auth_cli import (
    add_security_parsers,
    add_serve_options,
    run_security_command,
    serve_security,
)
from broker._backup import add_backup_parser, run_backup
from broker._broker import UNLOAD_AFTER, Broker
from broker._checkdata import add_check_data_parser, run_check_data
from broker._server import MAX_REQUEST_LINE, make_app
from ledger import LedgerError, LedgerFencedError, is_postgres_url
from tc import DEFAULT_EXPIRATION_MS, MAX_TXN_TIMEOUT_MS, ProducerSettings

if TYPE_CHECKING:
    from broker._cluster import ClusterHost

__all__ = ["main", "serve"]

log = logging.getLogger("txnbuf")

GC_GEN0_THRESHOLD = 20_000
DEFAULT_LEASE_TTL = 5.0  # seconds (--lease-ttl)
DEFAULT_STORE_WAIT = 120.0  # seconds (--store-wait; broker._cluster.DEFAULT_STORE_WAIT)


async def serve(
    data_dir: str,
    host: str,
    port: int,
    tc_ids: tuple[int, ...] = (0,),
    auth: AuthConfig | None = None,
    ssl_context: ssl.SSLContext | None = None,
    producer_settings: ProducerSettings | None = None,
    kafka: tuple[str, int, str | None] | None = None,
    preload: bool = True,
    unload_after: float | None = UNLOAD_AFTER,
    store_url: str | None = None,
    stream_port: int | None = None,
    cluster_lease: float | None = None,
    store_wait: float = DEFAULT_STORE_WAIT,
    advertised_url: str | None = None,
    cluster_tls_ca: ssl.SSLContext | None = None,
) -> None:
    """Run a broker until SIGTERM or SIGINT. ``auth``: authentication and
    limits (`broker._auth`); ``ssl_context``: serve TLS (on the Kafka
    listener and the stream listener too); ``kafka``: (host, port,
    advertised host or None) of a Kafka listener beside it
    (`broker.kafka`), which authenticates when the broker does;
    ``preload``, ``unload_after`` and ``store_url``: see `Broker.open`;
    ``stream_port``: serve the data plane on raw TCP on this port too
    (`broker._stream`); ``cluster_lease``: join the cluster of the database
    ``store_url`` with a lease of that many seconds (`broker._cluster`);
    ``store_wait``: how long a cluster broker that dropped everything tries
    to open its store again before it exits with status 1;
    ``advertised_url``: the URL others reach this broker's own listener at
    (default ``scheme://host:port``), published wherever the broker names
    itself: its cluster membership (so LOOKUP redirects, NOT_OWNER, the
    other brokers' connections and the admin API's forwarding), LOOKUP's
    CONNECT answers, and the stream listener's ``txnbuf://`` URL (its
    host); ``cluster_tls_ca``: what a cluster broker trusts when it
    connects to the others over TLS (None: the system's CAs).

    A broker whose store is fenced (another broker took its slots over:
    `ledger.LedgerFencedError`) stops at once, logging why at ERROR, and
    exits with status 1: everything it would write is refused, and what it
    holds in memory is no longer the truth."""
    scheme = "https" if ssl_context is not None else "http"
    url = advertised_url or f"{scheme}://{_in_url(host)}:{port}"
    _check_port(host, port)  # (before the data directory is opened, or created)
    if stream_port is not None:
        _check_port(host, stream_port)
    gc.disable()
    clustered: ClusterHost | None = None
    try:
        broker = await Broker.open(
            data_dir,
            url=url,
            tc_ids=tc_ids,
            auth=auth,
            producer_settings=producer_settings,
            preload=preload,
            unload_after=unload_after,
            store_url=store_url,
            cluster=cluster_lease is not None,
        )
        if cluster_lease is not None:
            assert store_url is not None
            from cluster import LeaseTiming

            try:
                from broker._cluster import ClusterHost
                from broker.kafka._cluster import listener_address
                from broker.kafka._listener import default_advertised_host

                advertised = None
                if kafka is not None:
                    kafka_host, kafka_port, kafka_advertised = kafka
                    advertised = listener_address(
                        kafka_advertised or default_advertised_host(kafka_host), kafka_port
                    )
                clustered = await ClusterHost.start(
                    broker,
                    store_url,
                    LeaseTiming(cluster_lease),
                    producer_settings,
                    advertised,
                    store_wait,
                    cluster_tls_ca,
                )
            except BaseException:
                await broker.close()
                raise
    except LedgerError as exc:  # (another broker on this data directory, a broken disk)
        where = data_dir if store_url is None else "the store"
        raise SystemExit(f"txnbuf: cannot open the data in {where}: {exc}") from None
    except OSError as exc:  # (the data directory is a file, or not writable)
        why = f"{exc.strerror}: {exc.filename}" if exc.strerror else str(exc)
        raise SystemExit(f"txnbuf: cannot open the data in {data_dir}: {why}") from None
    except AclFileError as exc:
        raise SystemExit(f"txnbuf: {exc}") from None
    finally:
        gc.enable()
    gc.freeze()
    gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
    runner = web.AppRunner(
        make_app(broker), access_log=None, handle_signals=False, max_line_size=MAX_REQUEST_LINE
    )
    await runner.setup()
    listener = None
    stream = None
    try:
        if stream_port is not None:
            from broker._stream import StreamListener

            stream = StreamListener(
                broker,
                host,
                stream_port,
                ssl_context,
                _url_host(url),
            )
            try:
                await stream.start()
            except OSError as exc:
                raise SystemExit(_cannot_listen(host, stream_port, exc)) from None
        if kafka is not None:
            from broker.kafka import KafkaListener

            listener = KafkaListener(broker, *kafka, ssl_context=ssl_context)
            await listener.start()
        site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as exc:  # (taken since `_check_port`)
            raise SystemExit(_cannot_listen(host, port, exc)) from None
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        fenced: list[LedgerFencedError] = []

        def store_failed(failure: asyncio.Future[LedgerError]) -> None:
            error = failure.result()
            if isinstance(error, LedgerFencedError):
                log.error(
                    "fenced: another broker took over slots %s of the store; this broker "
                    "stops serving (%s)",
                    ",".join(map(str, error.slots)),
                    error,
                )
                fenced.append(error)
                stop.set()

        if clustered is None:  # (a cluster broker starts again from its store: `broker._cluster`)
            broker.store.failure.add_done_callback(store_failed)
        else:  # (unless no writable server answers for --store-wait seconds)
            clustered.gave_up.add_done_callback(lambda _: stop.set())
        log.info(
            "txnbuf broker listening on %s://%s:%d%s (data in %s, coordinators %s, %s)",
            scheme,
            _in_url(host),
            port,
            f", advertised as {url}" if advertised_url else "",
            data_dir if store_url is None else broker.store.location,
            ",".join(map(str, tc_ids)),
            "tokens required" if broker.security.enabled else "no authentication",
        )
        await stop.wait()
        log.info("stopping")
        # No new connection from here on: one accepted while the broker
        # hands its slots over, or once it has, would get no answer (its
        # client would wait out its operation timeout), where a refused
        # one makes its client look the new owner up at once. On every
        # listener: a Kafka client refused looks at Metadata again.
        await site.stop()
        for other in (stream, listener):
            if other is not None:
                other.stop_accepting()
        if clustered is not None and not clustered.gave_up.done():
            await clustered.drain()
    finally:
        if clustered is not None:
            await clustered.close()
        if listener is not None:
            await listener.close()
        if stream is not None:
            await stream.close()
        await broker.close()
        await runner.cleanup()
        log.info("stopped")
    if fenced or (clustered is not None and clustered.gave_up.done()):
        raise SystemExit(1)


def _url_host(url: str) -> str:
    """The host of ``url`` as it goes into another URL (an IPv6 address in brackets)."""
    return _in_url(urllib.parse.urlsplit(url).hostname or "")


def _in_url(host: str) -> str:
    """``host`` as it goes into a URL: an IPv6 address in brackets (``--host
    ::1`` serves ``http://[::1]:6650``), given with or without them."""
    host = host.removeprefix("[").removesuffix("]")
    return f"[{host}]" if ":" in host else host


def _cannot_listen(host: str, port: int, exc: OSError) -> str:
    why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror or str(exc)
    return f"txnbuf serve: cannot listen on {host}:{port}: {why}"


def _check_port(host: str, port: int) -> None:
    """Exit with one line if ``host:port`` cannot be listened on."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # (an IPv6 address: ::1)
    try:
        with socket.create_server((host, port), family=family):
            pass
    except OSError as exc:
        raise SystemExit(_cannot_listen(host, port, exc)) from None


def _refuse_shared_ports(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """One port given to two listeners of ``serve`` on the same host is a
    usage error that names both (port 0, any free port, never clashes)."""
    listeners = [("--port", args.host, args.port), ("--stream-port", args.host, args.stream_port)]
    if args.kafka_port is not None:
        listeners.append(("--kafka-port", args.kafka_host or args.host, args.kafka_port))
    seen: dict[tuple[str, int], str] = {}
    for flag, host, port in listeners:
        if not port:
            continue
        other = seen.setdefault((host, port), flag)
        if other != flag:
            parser.error(
                f"{other} and {flag} are both {port}: each listener needs a port of its own"
            )


def _check_advertised(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A cluster's broker must publish a URL the others and the clients can
    reach: with a wildcard ``--host`` (0.0.0.0), ``--advertised-url`` is
    required rather than guessed (docs/cluster.md, "The advertised URL");
    its scheme follows TLS. ``--cluster-tls-ca`` is for a cluster only."""
    advertised = args.advertised_url
    if args.cluster and advertised is None and is_wildcard(args.host):
        parser.error(
            f"--cluster with --host {args.host!r} needs --advertised-url: a wildcard "
            "address names no machine, so the other brokers and the clients redirected here "
            "could not reach this broker (give --advertised-url http://HOST:PORT with this "
            "machine's name or address as they reach it)"
        )
    if advertised is not None:
        scheme = "https" if args.tls_cert else "http"
        if urllib.parse.urlsplit(advertised).scheme != scheme:
            parser.error(
                f"--advertised-url {advertised} must start with {scheme}:// "
                + ("(the broker serves TLS: --tls-cert)" if args.tls_cert else "(no --tls-cert)")
            )
    if args.cluster_tls_ca is not None and not args.cluster:
        parser.error("--cluster-tls-ca is for --cluster (the other brokers' certificates)")


def _event_loop_factory() -> type[asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.Loop


def _tc_ids(text: str) -> tuple[int, ...]:
    try:
        ids = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of TCIDs: {text!r} (e.g. 0,1)") from None
    if not ids or len(set(ids)) != len(ids) or not all(0 <= i < 1 << 16 for i in ids):
        raise argparse.ArgumentTypeError(f"TCIDs must be distinct numbers 0..65535: {text!r}")
    return ids


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"  # (docs/operations.md, Logs)


class _Parser(argparse.ArgumentParser):
    """An argument error is one line (exit 2), not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _log_level(text: str) -> str:
    if text.upper() not in LOG_LEVELS:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(LOG_LEVELS)}, not {text!r}")
    return text.upper()


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is a number from 0 to 65535, not {text!r}")
    return port


def _seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"a number of seconds >= 0, not {text!r}")
    return seconds


def _store_url(text: str) -> str:
    if not is_postgres_url(text):
        raise argparse.ArgumentTypeError(
            f"a store is a PostgreSQL URL (postgresql://user@host:port/db), not {text!r}"
        )
    from ledger._postgres import connect_options

    try:
        connect_options(text)
    except LedgerError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


WILDCARDS = ("", "0.0.0.0", "::")  # addresses that listen on every interface


def is_wildcard(host: str) -> bool:
    """``host`` listens on every interface, and so names no one address."""
    return host.strip("[]") in WILDCARDS


def _advertised_url(text: str) -> str:
    """``--advertised-url``: http(s)://host[:port], with a host others can
    reach (no wildcard), and no path."""
    try:
        parts = urllib.parse.urlsplit(text)
        port = parts.port
    except ValueError as exc:
        hint = (
            "; an IPv6 address goes in brackets: http://[::1]:6650"
            if _netloc(text).count(":") > 1
            else ""
        )
        raise argparse.ArgumentTypeError(f"not a URL: {text!r} ({exc}{hint})") from None
    del port
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(
            f"an advertised URL is http://host:port or https://host:port, not {text!r}"
        )
    if parts.path not in ("", "/") or parts.query or parts.fragment or parts.username:
        raise argparse.ArgumentTypeError(
            f"an advertised URL names a host and a port only, not {text!r}"
        )
    if is_wildcard(parts.hostname):
        raise argparse.ArgumentTypeError(
            f"{text!r} names a wildcard address, which no client can connect to: "
            "give this machine's name or address"
        )
    return text.rstrip("/")


def _netloc(text: str) -> str:
    """The ``host[:port]`` part of a URL given as text (parsed or not)."""
    return text.partition("://")[2].partition("/")[0]


def _store_wait(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= 86400:
        raise argparse.ArgumentTypeError(f"a wait is 0 to 86400 seconds, not {text!r}")
    return value


def _lease_ttl(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.3 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"a lease is 0.3 to 3600 seconds, not {text!r}")
    return value


def _version() -> str:
    try:
        return importlib.metadata.version("txnbuf")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    """``txnbuf ...``; the exit code. Output to a pipe closed early (``txnbuf
    transactions list --all | head``) ends the command quietly, exit 1, as
    Python's documentation suggests (`signal.SIGPIPE` stays ignored: its
    default would also kill a broker whose client went away)."""
    try:
        code = _main(argv)
        sys.stdout.flush()  # (inside the try: a closed pipe shows here, not at exit)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # (no second error when Python flushes at exit)
        return 1
    return code


def _main(argv: Sequence[str] | None = None) -> int:
    parser: argparse.ArgumentParser = _Parser(prog="txnbuf", description="txnbuf message broker")
    parser.add_argument("--version", action="version", version=f"txnbuf {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("serve", help="run a broker")
    p.add_argument("--data-dir", default="./txnbuf-data", help="where data lives (./txnbuf-data)")
    p.add_argument(
        "--store",
        type=_store_url,
        default=None,
        metavar="URL",
        help="keep everything in this PostgreSQL database instead of --data-dir "
        "(a libpq URL: postgresql://user:password@host:port/db; see docs/cluster.md)",
    )
    p.add_argument(
        "--cluster",
        action="store_true",
        help="with --store: share the database's slots with the other brokers on it "
        "(membership with a lease; see docs/cluster.md) instead of taking them all",
    )
    p.add_argument(
        "--lease-ttl",
        type=_lease_ttl,
        default=DEFAULT_LEASE_TTL,
        metavar="SECONDS",
        help=f"with --cluster: the membership lease, renewed every third of it; a dead "
        f"broker's slots are taken over within it ({DEFAULT_LEASE_TTL:g})",
    )
    p.add_argument(
        "--store-wait",
        type=_store_wait,
        default=DEFAULT_STORE_WAIT,
        metavar="SECONDS",
        help="with --cluster: how long a broker whose store failed tries to open it again "
        "(no writable PostgreSQL server, e.g. during a standby's promotion) before it exits "
        f"with status 1 ({DEFAULT_STORE_WAIT:g})",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument(
        "--advertised-url",
        type=_advertised_url,
        default=None,
        metavar="URL",
        help="the URL clients and the other brokers reach this broker at, http://host:port "
        "(https:// when serving TLS): published in the cluster's membership, lookups and "
        "redirects (http(s)://HOST:PORT of --host and --port; needed with --cluster on a "
        "wildcard --host such as 0.0.0.0)",
    )
    p.add_argument(
        "--cluster-tls-ca",
        default=None,
        metavar="FILE",
        help="with --cluster: PEM CA certificate(s) to trust when connecting to the other "
        "brokers over https (transactions across brokers, the admin API's forwarding); "
        "default: the system's CAs",
    )
    p.add_argument("--port", type=_port, default=6650, help="port to listen on (6650)")
    p.add_argument(
        "--tc-ids",
        type=_tc_ids,
        default=(0,),
        help="transaction coordinators to run here, comma-separated TCIDs (0)",
    )
    p.add_argument(
        "--allow-2pc",
        action="store_true",
        help="let transactional producers enable two-phase commit (KIP-939; off)",
    )
    p.add_argument(
        "--max-transaction-timeout",
        type=float,
        default=MAX_TXN_TIMEOUT_MS / 1000,
        metavar="SECONDS",
        help="the longest transaction timeout a transactional producer may ask for (900)",
    )
    p.add_argument(
        "--transactional-id-expiration",
        type=float,
        default=DEFAULT_EXPIRATION_MS / 1000,
        metavar="SECONDS",
        help="forget a transactional id idle this long (604800: 7 days)",
    )
    p.add_argument(
        "--no-preload",
        dest="preload",
        action="store_false",
        help="load each topic on first use only, not all of them in the background after the start",
    )
    p.add_argument(
        "--unload-after",
        type=_seconds,
        default=UNLOAD_AFTER,
        metavar="SECONDS",
        help="unload a topic left alone this long, with no client or transaction on it "
        f"(it loads again on use); 0: never ({UNLOAD_AFTER:.0f})",
    )
    p.add_argument(
        "--kafka-port",
        type=int,
        default=None,
        help="also serve Kafka's wire protocol on this port (off; see docs/kafka.md)",
    )
    p.add_argument("--kafka-host", default=None, help="address of the Kafka listener (--host)")
    p.add_argument(
        "--kafka-advertised-host",
        default=None,
        help="the address Kafka clients are told to connect to (--kafka-host; for a wildcard "
        "address such as 0.0.0.0, the host of --advertised-url, else 127.0.0.1)",
    )
    p.add_argument(
        "--stream-port",
        type=int,
        default=None,
        help="also serve the data plane on raw TCP on this port, for txnbuf:// URLs (off)",
    )
    p.add_argument(
        "--log-level",
        type=_log_level,
        default="INFO",
        metavar="LEVEL",
        help=f"{', '.join(LOG_LEVELS)} (INFO); records go to stderr, one line each: "
        f"{LOG_FORMAT.replace('%', '%%')}",
    )
    add_serve_options(p)
    from broker._admin_cli import ADMIN_COMMANDS, add_admin_parsers, run_admin
    from checker._cli import add_check_parser, run_check

    add_check_parser(commands)
    add_check_data_parser(commands)
    add_backup_parser(commands)
    add_security_parsers(commands)
    add_admin_parsers(commands)
    commands.metavar = "{" + ",".join(commands.choices) + "}"  # (named in a missing-one error)
    args = parser.parse_args(argv)
    if args.command == "check":
        return run_check(args)
    if args.command == "check-data":
        return run_check_data(args)
    if args.command == "backup":
        return run_backup(args)
    if args.command in ("token", "acl"):
        return run_security_command(args)
    if args.command in ADMIN_COMMANDS:
        return run_admin(args)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format=LOG_FORMAT,
    )
    if args.command == "serve" and args.cluster and args.store is None:
        parser.error("--cluster needs --store (the cluster's PostgreSQL database)")
    if args.command == "serve" and args.cluster and args.kafka_port == 0:
        parser.error(
            "--cluster needs a --kafka-port number, not 0 (the other brokers tell Kafka "
            "clients this broker's Kafka address before its listener starts)"
        )
    if args.command == "serve":
        _refuse_shared_ports(parser, args)
        _check_advertised(parser, args)
    if args.command == "serve":
        security = serve_security(args)
        authenticated = security.auth.authenticator is not None
        refusal = check_listen(args.host, authenticated, args.insecure)
        if refusal is None and args.kafka_port is not None:
            kafka_host = args.kafka_host or args.host
            refusal = check_listen(kafka_host, authenticated, args.insecure, "Kafka")
        if refusal is not None:
            raise SystemExit(f"txnbuf: {refusal}")
        loop_factory = _event_loop_factory()
        with asyncio.Runner(loop_factory=loop_factory) as runner:
            settings = ProducerSettings(
                max_txn_timeout_ms=round(args.max_transaction_timeout * 1000),
                expiration_ms=round(args.transactional_id_expiration * 1000),
                allow_two_phase=args.allow_2pc,
            )
            kafka = None
            if args.kafka_port is not None:
                kafka_host = args.kafka_host or args.host
                kafka_advertised = args.kafka_advertised_host
                if kafka_advertised is None and args.advertised_url and is_wildcard(kafka_host):
                    # (the machine the advertised URL names serves Kafka there too)
                    kafka_advertised = urllib.parse.urlsplit(args.advertised_url).hostname
                kafka = (kafka_host, args.kafka_port, kafka_advertised)
            cluster_ca = None
            if args.cluster_tls_ca is not None:
                try:
                    cluster_ca = ssl.create_default_context(cafile=args.cluster_tls_ca)
                except (OSError, ssl.SSLError) as exc:
                    raise SystemExit(
                        f"txnbuf: --cluster-tls-ca: cannot load CA certificates from "
                        f"{args.cluster_tls_ca}: {exc}"
                    ) from None
            runner.run(
                serve(
                    args.data_dir,
                    args.host,
                    args.port,
                    args.tc_ids,
                    security.auth,
                    security.ssl_context,
                    settings,
                    kafka,
                    args.preload,
                    args.unload_after or None,
                    args.store,
                    args.stream_port,
                    args.lease_ttl if args.cluster else None,
                    args.store_wait,
                    args.advertised_url,
                    cluster_ca,
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
