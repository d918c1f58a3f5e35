"""The security part of the command line (see `broker._auth` and docs/security.md).

    txnbuf serve ... [--auth-secret-key-file F | --auth-public-key-file F]
                     [--superuser-roles admin] [--insecure]
                     [--tls-cert F --tls-key F] [--max-connections N]
                     [--max-producers-per-connection N] [--max-consumers-per-connection N]
    txnbuf token create --subject ROLE (--secret-key-file F | --private-key-file F)
                        [--expires 1h]
    txnbuf token create-secret-key --output F
    txnbuf token create-key-pair --private-key-file F --public-key-file F
                                 [--algorithm RS256|ES256]
    txnbuf acl grant|revoke --role R --permission P
                            (--topic PATTERN | --subscription TOPIC/SUB | --transactional-id ID)
                            [--url URL] [--token T] [--tls-ca F]
    txnbuf acl list [--role R] [--url URL] [--token T] [--tls-ca F]

``txnbuf acl`` talks to a running broker's admin API; its token comes from
``--token`` or else ``TXNBUF_TOKEN``. Every mistake ends in one line on
stderr and exit status 1 (argparse's own usage errors: 2).
"""

from __future__ import annotations

import argparse
import json
import os
import ssl
import sys
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from broker._acl import AclEntry, AclError, check_role
from broker._auth import (
    ADMIN_ROLE,
    AuthConfig,
    Authenticator,
    KeyFileError,
    Limits,
    create_key_pair,
    create_secret_key,
    create_token,
    load_signing_key,
    parse_duration,
)

__all__ = [
    "ServeSecurity",
    "add_security_parsers",
    "add_serve_options",
    "run_security_command",
    "serve_security",
]

DEFAULT_URL = "http://127.0.0.1:6650"


def _fail(message: str) -> SystemExit:
    return SystemExit(f"txnbuf: {message}")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text[:50]!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def _roles(text: str) -> frozenset[str]:
    try:
        return frozenset(check_role(r.strip()) for r in text.split(","))
    except AclError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_serve_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("security (docs/security.md)")
    keys = g.add_mutually_exclusive_group()
    keys.add_argument(
        "--auth-secret-key-file", help="authenticate HS256 tokens signed with this secret key"
    )
    keys.add_argument(
        "--auth-public-key-file",
        help="authenticate RS256/ES256 tokens signed by this PEM public key's private half",
    )
    g.add_argument(
        "--superuser-roles",
        type=_roles,
        default=frozenset({ADMIN_ROLE}),
        help="comma-separated roles that may do everything, admin API included (admin)",
    )
    g.add_argument(
        "--insecure",
        action="store_true",
        help="allow listening beyond loopback without authentication",
    )
    g.add_argument("--tls-cert", help="serve TLS (https, wss) with this PEM certificate chain")
    g.add_argument("--tls-key", help="the PEM private key of --tls-cert")
    limits = Limits()
    g.add_argument(
        "--max-connections",
        type=_positive,
        default=limits.max_connections,
        help=f"connections at once ({limits.max_connections})",
    )
    g.add_argument(
        "--max-producers-per-connection",
        type=_positive,
        default=limits.max_producers_per_connection,
        help=f"producers on one connection ({limits.max_producers_per_connection})",
    )
    g.add_argument(
        "--max-consumers-per-connection",
        type=_positive,
        default=limits.max_consumers_per_connection,
        help=f"consumers on one connection ({limits.max_consumers_per_connection})",
    )


@dataclass(frozen=True, slots=True)
class ServeSecurity:
    """What `txnbuf serve`'s security options make: the broker's `AuthConfig`
    and, for TLS, the server's SSL context."""

    auth: AuthConfig
    ssl_context: ssl.SSLContext | None


def serve_security(args: argparse.Namespace) -> ServeSecurity:
    """`txnbuf serve`'s security options, checked (SystemExit with one line if not)."""
    try:
        if args.auth_secret_key_file:
            authenticator: Authenticator | None = Authenticator.from_secret_key_file(
                args.auth_secret_key_file
            )
        elif args.auth_public_key_file:
            authenticator = Authenticator.from_public_key_file(args.auth_public_key_file)
        else:
            authenticator = None
    except KeyFileError as exc:
        raise _fail(str(exc)) from None
    if bool(args.tls_cert) != bool(args.tls_key):
        raise _fail("--tls-cert and --tls-key go together")
    context = None
    if args.tls_cert:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            context.load_cert_chain(args.tls_cert, args.tls_key)
        except (OSError, ssl.SSLError) as exc:
            raise _fail(
                f"cannot load the TLS certificate {args.tls_cert} with key {args.tls_key}: {exc}"
            ) from None
    limits = Limits(
        max_connections=args.max_connections,
        max_producers_per_connection=args.max_producers_per_connection,
        max_consumers_per_connection=args.max_consumers_per_connection,
    )
    auth = AuthConfig(authenticator, args.superuser_roles, limits)
    return ServeSecurity(auth, context)


# -- txnbuf token / txnbuf acl -----------------------------------------------------------


def _admin_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default=DEFAULT_URL, help=f"the broker ({DEFAULT_URL})")
    p.add_argument("--token", help="a superuser's token (default: $TXNBUF_TOKEN)")
    p.add_argument("--tls-ca", help="PEM CA certificate(s) to trust for an https:// URL")


def _resource_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--role", required=True, help="the role (a token's subject)")
    p.add_argument(
        "--permission",
        required=True,
        choices=["produce", "consume", "two_phase_commit"],
        help="produce or consume on a topic; consume on a subscription; "
        "produce or two_phase_commit on a transactional id",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--topic", help="a topic name or pattern (* for any run of characters)")
    what.add_argument("--subscription", help="TOPIC/SUBSCRIPTION, each a name or pattern")
    what.add_argument("--transactional-id", help="a transactional id or pattern")


def add_security_parsers(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    token = commands.add_parser("token", help="make keys and tokens").add_subparsers(
        dest="token_command", required=True
    )
    p = token.add_parser("create", help="print a new token for a role")
    p.add_argument("--subject", required=True, help="the role the token proves")
    keys = p.add_mutually_exclusive_group(required=True)
    keys.add_argument("--secret-key-file", help="sign with this secret key (HS256)")
    keys.add_argument("--private-key-file", help="sign with this PEM private key (RS256, ES256)")
    p.add_argument("--expires", help="lifetime such as 30m, 1h, 7d (default: never expires)")
    p = token.add_parser("create-secret-key", help="write a new secret key (base64) to a file")
    p.add_argument("--output", required=True, help="the file to write (must not exist)")
    p = token.add_parser("create-key-pair", help="write a new key pair (PEM) to two files")
    p.add_argument("--private-key-file", required=True, help="for `token create` (must not exist)")
    p.add_argument("--public-key-file", required=True, help="for `serve --auth-public-key-file`")
    p.add_argument("--algorithm", choices=["RS256", "ES256"], default="RS256", help="(RS256)")

    acl = commands.add_parser("acl", help="grant, revoke and list permissions").add_subparsers(
        dest="acl_command", required=True
    )
    for name, text in (("grant", "grant a permission"), ("revoke", "revoke a permission")):
        p = acl.add_parser(name, help=text)
        _resource_options(p)
        _admin_options(p)
    p = acl.add_parser("list", help="list the grants")
    p.add_argument("--role", help="only this role's")
    _admin_options(p)


def _write_new(path: str, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise _fail(f"{path} exists already: choose another file or remove it") from None
    except OSError as exc:
        raise _fail(f"cannot create {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _token_command(args: argparse.Namespace) -> int:
    if args.token_command == "create-secret-key":
        _write_new(args.output, create_secret_key().encode(), 0o600)
        print(f"wrote a new secret key to {args.output}", file=sys.stderr)
        return 0
    if args.token_command == "create-key-pair":
        private, public = create_key_pair(args.algorithm)
        if Path(args.public_key_file).exists():
            raise _fail(f"{args.public_key_file} exists already: choose another file or remove it")
        _write_new(args.private_key_file, private, 0o600)
        _write_new(args.public_key_file, public, 0o644)
        print(
            f"wrote a {args.algorithm} key pair: {args.private_key_file} (private), "
            f"{args.public_key_file} (public)",
            file=sys.stderr,
        )
        return 0
    try:
        check_role(args.subject)
        expires = parse_duration(args.expires) if args.expires else None
        key, algorithm = load_signing_key(args.secret_key_file, args.private_key_file)
    except ValueError as exc:  # (AclError, KeyFileError, a bad duration)
        raise _fail(str(exc)) from None
    print(create_token(args.subject, key, algorithm, expires))
    return 0


def _admin_request(
    args: argparse.Namespace, method: str, path: str, body: dict[str, Any] | None = None
) -> dict[str, Any]:
    url = args.url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise _fail(f"--url must look like http://host:port or https://host:port, not {url!r}")
    token = args.token or os.environ.get("TXNBUF_TOKEN")
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    context = None
    if url.startswith("https://"):
        try:
            context = ssl.create_default_context(cafile=args.tls_ca)
        except (OSError, ssl.SSLError) as exc:
            raise _fail(f"cannot load the CA file {args.tls_ca}: {exc}") from None
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30, context=context) as r:
            answer: dict[str, Any] = json.loads(r.read())
            return answer
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        raise _fail(f"the broker refused ({exc.code}): {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise _fail(f"cannot reach the broker at {url}: {reason}") from None


def _acl_command(args: argparse.Namespace) -> int:
    if args.acl_command == "list":
        path = "/admin/v1/acl"
        if args.role:
            path += "?" + urllib.parse.urlencode({"role": args.role})
        for grant in _admin_request(args, "GET", path)["acl"]:
            print(f"{grant['role']}\t{grant['permission']}\t{grant['resource']}")
        return 0
    if args.topic is not None:
        resource = f"topic:{args.topic}"
    elif args.subscription is not None:
        resource = f"subscription:{args.subscription}"
    else:
        resource = f"transactional-id:{args.transactional_id}"
    try:  # (checked here too, for a clear message before any request)
        entry = AclEntry.parse(args.role, args.permission, resource)
    except AclError as exc:
        raise _fail(str(exc)) from None
    _admin_request(args, "POST", f"/admin/v1/acl/{args.acl_command}", entry.to_json())
    done = "granted" if args.acl_command == "grant" else "revoked"
    print(f"{done}: {entry.role} {entry.permission.value} {entry.resource}", file=sys.stderr)
    return 0


def run_security_command(args: argparse.Namespace) -> int:
    """Run ``txnbuf token ...`` or ``txnbuf acl ...``."""
    if args.command == "token":
        return _token_command(args)
    return _acl_command(args)
