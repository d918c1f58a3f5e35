"""Who a Kafka connection is, and what it may do (`broker._auth` over Kafka).

The Kafka listener authenticates with the broker's own tokens and roles.
SASL (SaslHandshake v1, then SaslAuthenticate) with two mechanisms that
Kafka's clients speak with their stock settings:

- OAUTHBEARER (RFC 7628, KIP-255): the token is the bearer token. An
  authorization id in the GS2 header (``n,a=<role>,``), if any, must be
  the token's role.
- PLAIN (RFC 4616): the user name is the role, the password the token; the
  token's role must be that user (and an authorization id, if any, too).

When the broker authenticates, a connection may send ApiVersions,
SaslHandshake and SaslAuthenticate and nothing else until it has
authenticated: any other request closes it (as Kafka closes a connection
that skips its SASL exchange). A failed SaslAuthenticate is answered
SASL_AUTHENTICATION_FAILED with the reason, and the connection closed. A
SaslHandshake v0 (raw SASL tokens after it, before Kafka 1.0) is not
served. Without authentication every connection is the anonymous
principal (every permission, as on the broker's own port); a SASL
exchange is then answered as successful without checking anything, as a
CONNECT with a token is.

A token that expires ends its connection, as on the broker's own port.
SaslAuthenticate v1 tells the client the session's lifetime (KIP-368:
the milliseconds left until the token's ``exp``, 0 for a token that does
not expire), so a client that re-authenticates (librdkafka, kafka-python)
does so on the same connection before it ends: a new SaslHandshake and
SaslAuthenticate, whose token must be of the same role (a connection
keeps its role, as a CONNECT's does).

Permissions (`KafkaSession`'s ``allow_*``): each check is `broker._auth`'s
own (`Security`), and a refusal is the Kafka error code a Kafka client
expects for the resource it names: TOPIC_AUTHORIZATION_FAILED,
GROUP_AUTHORIZATION_FAILED, TRANSACTIONAL_ID_AUTHORIZATION_FAILED or
CLUSTER_AUTHORIZATION_FAILED. docs/security.md has the table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from broker._auth import NOBODY, Principal, Security
from proto import refusals

__all__ = [
    "CLUSTER_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
    "ILLEGAL_SASL_STATE",
    "MECHANISMS",
    "SASL_AUTHENTICATION_FAILED",
    "TOPIC_AUTHORIZATION_FAILED",
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED",
    "UNSUPPORTED_SASL_MECHANISM",
    "KafkaError",
    "KafkaSession",
    "SaslError",
    "sasl_credentials",
]

log = logging.getLogger(__name__)

# Kafka's error codes for what a principal may not do, and for SASL.
TOPIC_AUTHORIZATION_FAILED = 29
GROUP_AUTHORIZATION_FAILED = 30
CLUSTER_AUTHORIZATION_FAILED = 31
UNSUPPORTED_SASL_MECHANISM = 33
ILLEGAL_SASL_STATE = 34
TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
SASL_AUTHENTICATION_FAILED = 58

MECHANISMS = ("OAUTHBEARER", "PLAIN")
_MAX_TOKEN_TEXT = 16 << 10  # bytes of SASL credentials read


class KafkaError(Exception):
    """A request refused with a Kafka error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class SaslError(ValueError):
    """SASL credentials that do not hold: the message says why."""


def sasl_credentials(mechanism: str, data: bytes) -> tuple[str | None, str]:
    """(the role the client names, if it names one; the token) of a SASL
    client's first message; `SaslError` if it is not well formed."""
    if len(data) > _MAX_TOKEN_TEXT:
        raise SaslError(f"{len(data)} bytes of SASL credentials (at most {_MAX_TOKEN_TEXT})")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SaslError(f"the {mechanism} credentials are not UTF-8 text") from None
    if mechanism == "PLAIN":
        parts = text.split("\0")
        if len(parts) != 3:
            raise SaslError(
                "PLAIN credentials are authzid NUL user NUL password "
                "(the user is the role, the password the token)"
            )
        authzid, user, password = parts
        if not user or not password:
            raise SaslError("PLAIN credentials need a user (the role) and a password (the token)")
        if authzid and authzid != user:
            raise SaslError(f"PLAIN authorization id {authzid!r} is not the user {user!r}")
        return user, password
    # OAUTHBEARER: gs2-header kvsep *(key=value kvsep) kvsep, kvsep = \x01
    header, sep, rest = text.partition("\x01")
    if not sep or not rest.endswith("\x01"):
        if text == "\x01":
            raise SaslError("the client gave up the OAUTHBEARER exchange")
        raise SaslError("OAUTHBEARER credentials are 'n,,\\x01auth=Bearer <token>\\x01\\x01'")
    fields = header.split(",")
    if len(fields) != 3 or fields[0] not in ("n", "y") or fields[2]:
        raise SaslError(f"OAUTHBEARER GS2 header {header[:100]!r} is not 'n,,' or 'n,a=<role>,'")
    named: str | None = None
    if fields[1]:
        if not fields[1].startswith("a="):
            raise SaslError(f"OAUTHBEARER GS2 header {header[:100]!r}: expected a=<role>")
        named = fields[1][2:].replace("=2C", ",").replace("=3D", "=")
    auth = None
    for pair in rest[:-1].split("\x01"):
        if not pair:
            continue
        key, eq, value = pair.partition("=")
        if not eq:
            raise SaslError(f"OAUTHBEARER field {pair[:100]!r} is not key=value")
        if key == "auth":
            auth = value
    if auth is None:
        raise SaslError("OAUTHBEARER credentials without auth=Bearer <token>")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise SaslError("OAUTHBEARER auth must be 'Bearer <token>'")
    return named, token.strip()


class KafkaSession:
    """One Kafka connection's principal (`who`), its SASL exchange, and the
    permission checks of its requests. ``on_expiry`` is called when the
    token it authenticated with expires (the listener closes the
    connection)."""

    def __init__(
        self, security: Security, peer: Any, on_expiry: Callable[[], None] | None = None
    ) -> None:
        self.security = security
        self.peer = peer
        self.host = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        self.client_id = ""  # (the current request's, from its header)
        self.who: Principal = security.anonymous
        self.mechanism: str | None = None
        self.closing = False  # close the connection once this answer is out
        self._on_expiry = on_expiry
        self._expiry: asyncio.TimerHandle | None = None

    @property
    def authenticated(self) -> bool:
        return self.who is not NOBODY

    def close(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None

    # -- SASL -----------------------------------------------------------------------

    def sasl_handshake(self, req: Any, version: int) -> dict[str, Any]:
        mechanism = req.mechanism
        if mechanism not in MECHANISMS:
            self.closing = True
            return {"error_code": UNSUPPORTED_SASL_MECHANISM, "mechanisms": list(MECHANISMS)}
        self.mechanism = mechanism
        return {"error_code": 0, "mechanisms": list(MECHANISMS)}

    def sasl_authenticate(self, req: Any, version: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "error_code": 0,
            "error_message": None,
            "auth_bytes": b"",
            "session_lifetime": 0,
        }
        mechanism, self.mechanism = self.mechanism, None
        if mechanism is None:
            self.closing = True
            out["error_code"] = ILLEGAL_SASL_STATE
            out["error_message"] = "SaslAuthenticate before a SaslHandshake"
            return out
        try:
            role, token = sasl_credentials(mechanism, bytes(req.auth_bytes))
            who = self.security.authenticate_token(token)
            if role is not None and who.role is not None and role != who.role:
                raise SaslError(f"the token is role {who.role!r}'s, not {role!r}'s")
            if self.authenticated and who.role != self.who.role:
                raise SaslError(f"this connection is {self.who.name}; it cannot become another")
        except (SaslError, refusals.AuthenticationError) as exc:
            self.closing = True
            out["error_code"] = SASL_AUTHENTICATION_FAILED
            out["error_message"] = f"{mechanism} authentication failed: {exc}"
            log.info("Kafka connection %s: %s", self.peer, out["error_message"])
            return out
        self.who = who
        self.close()
        if who.expires is not None:
            left = max(0.0, who.expires - time.time())
            out["session_lifetime"] = max(1, round(left * 1000))
            self._expiry = asyncio.get_running_loop().call_later(left, self._expired)
        return out

    def _expired(self) -> None:
        self._expiry = None
        self.who = NOBODY
        log.info("Kafka connection %s: the token has expired; closing the connection", self.peer)
        if self._on_expiry is not None:
            self._on_expiry()

    # -- permissions ------------------------------------------------------------------

    def _check(self, code: int, check: Callable[..., None], *args: Any) -> None:
        try:
            check(self.who, *args)
        except refusals.AuthorizationError as exc:
            raise KafkaError(code, str(exc)) from None

    @property
    def superuser(self) -> bool:
        return self.who.superuser

    def may_describe(self, topic: str) -> bool:
        """Produce or consume on ``topic`` (what Metadata lists)."""
        try:
            self.security.allow_lookup(self.who, topic)
        except refusals.AuthorizationError:
            return False
        return True

    def allow_describe(self, topic: str) -> None:
        """Metadata, ListOffsets (and a topic Metadata may create): produce
        or consume on it."""
        self._check(TOPIC_AUTHORIZATION_FAILED, self.security.allow_lookup, topic)

    def allow_produce(self, topic: str) -> None:
        self._check(TOPIC_AUTHORIZATION_FAILED, self.security.allow_produce, topic)

    def allow_read(self, topic: str) -> None:
        """Fetch: consume on the topic."""
        self._check(TOPIC_AUTHORIZATION_FAILED, self.security.allow_read, topic)

    def allow_group(self, topic: str, group: str) -> None:
        """A group's offsets on ``topic`` (its subscription there): consume
        on the topic (else TOPIC_AUTHORIZATION_FAILED) and on the
        subscription if a grant names it (else GROUP_AUTHORIZATION_FAILED)."""
        self.allow_read(topic)
        self._check(GROUP_AUTHORIZATION_FAILED, self.security.allow_consume, topic, group)

    def allow_transactional_id(self, transactional_id: str) -> None:
        self._check(
            TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            self.security.allow_transactional_id,
            transactional_id,
        )

    def allow_admin(self, code: int = CLUSTER_AUTHORIZATION_FAILED) -> None:
        """The admin APIs: a superuser; refused with ``code`` (the one the
        API's resource calls for)."""
        self._check(code, self.security.allow_admin)
