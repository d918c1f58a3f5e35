"""Who may do what on a broker, and how much one client may take.

Authentication (Pulsar's token authentication): a client proves a role
with a JWT whose subject (``sub``) is the role, signed with the broker's
secret key (HS256) or with a private key whose public half the broker holds
(RS256 for RSA keys; ES256, ES384, ES512 for EC keys on P-256, P-384,
P-521). The algorithms a broker accepts follow from its key alone, never
from the token, so an RSA public key can never be used as an HMAC secret.
``exp``, when present, is checked (no leeway); a token without it never
expires. The data plane carries the token in CONNECT (``auth_method``
"token", ``auth_data`` the token); the admin API in ``Authorization:
Bearer <token>``.

A broker without a key (`Security.enabled` False) authenticates nobody:
every connection is the anonymous principal, which holds every permission
and the `ADMIN_ROLE`, but not the ``cluster`` role (coordinator-to-
participant commands are refused to all). The CLI refuses to serve that way
on an address other than loopback unless ``--insecure`` says so
(`check_listen`), on every listener: the Kafka listener too, which
authenticates with these tokens and roles over SASL and checks its
requests with these permissions (`broker.kafka._session`).

Roles and permissions:

- A superuser (a role in ``superuser_roles``, ``admin`` by default) may do
  everything a client may, and use the admin API: its connections hold
  `ADMIN_ROLE`.
- The ``cluster`` role (a token whose subject is ``cluster``) is the only
  one that may send END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION and
  GROUP_CURSORS (`broker._connection.CLUSTER_ROLE`); it gets nothing else
  for free.
- Every other role holds what the ACL grants it (`AclEntry`): ``produce``
  and ``consume`` on topics, ``consume`` on subscriptions, ``produce`` and
  KIP-939's ``two_phase_commit`` on transactional ids. A resource is named with
  wildcards: ``*`` stands for any run of characters (``topic:orders-*``,
  ``subscription:orders-*/billing``, ``transactional-id:payments-*``).

What each command needs (checked on every command, before anything
changes; a refusal is AUTHORIZATION_ERROR naming the permission):

- PARTITIONED_METADATA, LOOKUP (which may create the topic): produce or
  consume on the topic. LOOKUP of a transaction coordinator: any
  authenticated role, as NEW_TXN (it names a broker's URL, nothing more).
- PRODUCER and every SEND: produce on the topic.
- SUBSCRIBE, FLOW, ACK, REDELIVER_UNACKNOWLEDGED: consume on the topic, and
  on the subscription when any grant names it (Pulsar's subscription
  permission: a subscription that some role is granted ``consume`` on is
  restricted to the roles granted it; one nobody names is open to every
  role that may consume the topic).
- NEW_TXN: any authenticated role (it touches nothing).
- ADD_PARTITION_TO_TXN: produce on each topic; ADD_SUBSCRIPTION_TO_TXN:
  consume on each subscription. A transactional SEND is checked as a send,
  a transactional ACK as an ack.
- END_TXN: PIP-31 lets any client end a transaction by its id, and a
  driver that ends the transactions its executors wrote in relies on it;
  but TxnIDs are counters, easy to guess. So ending a transaction needs
  what writing it needed: produce on every topic it registered and
  consume on every subscription it registered (`Security.allow_end`). A
  driver with its executors' role may end their transactions; a stranger
  may not commit or abort them. One that registered nothing may be ended
  by any role.
- END_TXN_ON_PARTITION, END_TXN_ON_SUBSCRIPTION, GROUP_CURSORS (a Kafka
  group's offsets at their topic's owner, `broker._group_cursors`): the
  ``cluster`` role.
- Transaction groups (`broker._groups`): NEW_TXN with a tag as NEW_TXN;
  PREPARE_TXN, COMMIT_GROUP and ABORT_TAGGED as END_TXN, for every
  transaction they decide (a group is refused whole if one is refused).
- READ_ENTRIES (`broker._reader`): consume on the topic; CURSOR: consume on
  the topic and on its subscription, as SUBSCRIBE.
- SEEK, UNSUBSCRIBE (`broker._seek`): consume on the topic and on the
  subscription, as SUBSCRIBE.
- CLOSE_PRODUCER, CLOSE_CONSUMER, PING: nothing (a client may always stop
  what it started).
- The admin API and /metrics: a superuser; ``/admin/v1/health`` is open
  (it tells nothing but that the broker answers).
- The producer-epoch mode (Kafka's rules, with ``produce`` on a
  transactional id for Kafka's WRITE on a TransactionalId): INIT_PRODUCER_ID
  needs produce on the transactional id, and with ``enable_2pc`` also
  KIP-939's ``two_phase_commit`` on it; PRODUCE needs produce on the topic,
  TXN_OFFSETS consume on the subscription, and both, like
  PREPARE_PRODUCER_TXN and END_PRODUCER_TXN, produce on the transactional
  id that holds the request's producer id (`Security.allow_transactional_id`).
  Without it any role could fence another's producer and abort its
  transaction.

A revoked grant takes effect at the next command of each producer and
consumer (messages a consumer's permits already asked for may still
arrive). A token that expires while its connection is open ends the
connection (AUTHENTICATION_ERROR); the client reconnects with what it has.

Limits on what one client may take (`Limits`): connections per broker
(``--max-connections``; one more is answered TOO_MANY_REQUESTS, which the
client retries, and closed) and producers and consumers per connection
(NOT_ALLOWED: the client must close some first; retrying cannot help).
Producer and consumer names follow the rule of topic names
(`buffer.check_producer_name`), and error messages quote at most 200
characters of bad input (`buffer.quoted`).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import secrets
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from broker._acl import ACL_FILE, AclEntry, AclError, AclStore, Permission, ResourceType, check_role
from buffer import quoted
from ledger import LedgerStore
from proto import refusals
from proto import txnbuf_pb2 as pb

__all__ = [
    "ADMIN_ROLE",
    "ANONYMOUS",
    "NOBODY",
    "AuthConfig",
    "Authenticator",
    "KeyFileError",
    "Limits",
    "Principal",
    "Security",
    "check_listen",
    "create_key_pair",
    "create_secret_key",
    "create_token",
    "load_signing_key",
    "parse_duration",
]

ADMIN_ROLE = "admin"  # the role a superuser's connection holds
TOKEN_METHOD = "token"  # CommandConnect.auth_method of a JWT
CLUSTER_METHOD = "cluster"  # ... of another broker of the cluster (`broker._peers`)
CLUSTER_ISSUER = "txnbuf-cluster"  # the ``iss`` of a cluster token
# The admin route by which a broker asks another to look at the cluster
# tables now (a nudge: `broker._admin_cluster.look_now`); the role
# ``cluster`` only (`Security.authenticate_cluster_bearer`).
NUDGE_PATH = "/admin/v1/cluster/look"
CLUSTER_ROLE_NAME = "cluster"  # the role such a token proves
SECRET_KEY_BYTES = 32  # what `create_secret_key` makes; shorter keys are refused


class KeyFileError(ValueError):
    """A key file that cannot be used: the message says why."""


# -- keys and tokens ------------------------------------------------------------------


def create_secret_key() -> str:
    """A new HS256 secret key, as the base64 text a key file holds."""
    return base64.b64encode(secrets.token_bytes(SECRET_KEY_BYTES)).decode() + "\n"


def _read(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def _secret_key(path: str | Path) -> bytes:
    text = _read(path, "secret key file").strip()
    try:
        key = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        try:
            key = base64.urlsafe_b64decode(text)
        except (binascii.Error, ValueError):
            raise KeyFileError(
                f"the secret key file {path} does not hold base64 text "
                "(make one with `txnbuf token create-secret-key`)"
            ) from None
    if len(key) < SECRET_KEY_BYTES:
        raise KeyFileError(
            f"the secret key in {path} has {len(key)} bytes; HS256 needs at least "
            f"{SECRET_KEY_BYTES}"
        )
    return key


def _algorithm(key: object, path: str | Path) -> str:
    """The one JWS algorithm for an asymmetric key."""
    if isinstance(key, rsa.RSAPrivateKey | rsa.RSAPublicKey):
        return "RS256"
    if isinstance(key, ec.EllipticCurvePrivateKey | ec.EllipticCurvePublicKey):
        by_curve = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}
        found = by_curve.get(key.curve.name)
        if found is not None:
            return found
        raise KeyFileError(
            f"the EC key in {path} is on {key.curve.name}: use P-256, P-384 or P-521"
        )
    raise KeyFileError(f"the key in {path} is neither RSA nor EC")


def load_signing_key(
    secret_key_file: str | Path | None = None, private_key_file: str | Path | None = None
) -> tuple[Any, str]:
    """(key, algorithm) to sign tokens with: a secret key file (HS256) or a
    PEM private key file (RS256, ES256/384/512)."""
    if (secret_key_file is None) == (private_key_file is None):
        raise KeyFileError("give a secret key file or a private key file (one of them)")
    if secret_key_file is not None:
        return _secret_key(secret_key_file), "HS256"
    assert private_key_file is not None
    pem = _read(private_key_file, "private key file")
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(
            f"the private key file {private_key_file} is not an unencrypted PEM private key: {exc}"
        ) from None
    return key, _algorithm(key, private_key_file)


def create_key_pair(algorithm: str = "RS256") -> tuple[bytes, bytes]:
    """(private PEM, public PEM) of a new key pair for RS256 or ES256."""
    private: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey
    if algorithm == "RS256":
        private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif algorithm == "ES256":
        private = ec.generate_private_key(ec.SECP256R1())
    else:
        raise KeyFileError(f"algorithm must be RS256 or ES256, not {quoted(algorithm)}")
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private_pem, public_pem


def create_token(subject: str, key: Any, algorithm: str, expires_in: float | None = None) -> str:
    """A token for the role ``subject``, valid for ``expires_in`` seconds
    (None: for ever; negative: expired already, for tests)."""
    check_role(subject)
    now = int(time.time())
    claims: dict[str, Any] = {"sub": subject, "iat": now}
    if expires_in is not None:
        claims["exp"] = now + int(expires_in)
        if expires_in < 0:
            claims["iat"] = claims["exp"] - 1
    return jwt.encode(claims, key, algorithm=algorithm)


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "y": 365 * 86400}


def parse_duration(text: str) -> int:
    """Seconds in ``30s``, ``15m``, ``1h``, ``7d``, ``1y`` (or a bare number of seconds)."""
    found = re.fullmatch(r"(\d{1,9})([smhdy]?)", text.strip())
    if found is None or int(found.group(1)) == 0:
        raise ValueError(f"not a duration: {quoted(text)} (e.g. 30s, 15m, 1h, 7d, 1y)")
    return int(found.group(1)) * _UNITS[found.group(2) or "s"]


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a connection or an admin request is: ``role`` (None when
    authentication is off), whether it is a superuser, and when its token
    expires (epoch seconds, None for never)."""

    role: str | None
    superuser: bool
    expires: float | None = None

    @property
    def roles(self) -> frozenset[str]:
        """The roles `broker._connection.Connection.roles` holds."""
        held = {self.role} if self.role is not None else set()
        if self.superuser:
            held.add(ADMIN_ROLE)
        return frozenset(held)

    @property
    def name(self) -> str:
        if self.role is None:
            return "the anonymous client" if self.superuser else "an unauthenticated client"
        return f"role {self.role!r}"


# Every connection when authentication is off: every permission, no `cluster`.
ANONYMOUS = Principal(None, superuser=True)
# A connection that has not authenticated (yet): it may send CONNECT only.
NOBODY = Principal(None, superuser=False)


class Authenticator:
    """Verifies tokens against one key, with the algorithms that key allows."""

    def __init__(self, key: Any, algorithms: list[str]) -> None:
        self._key = key
        self.algorithms = algorithms

    @classmethod
    def from_secret_key_file(cls, path: str | Path) -> Authenticator:
        return cls(_secret_key(path), ["HS256"])

    @classmethod
    def from_public_key_file(cls, path: str | Path) -> Authenticator:
        pem = _read(path, "public key file")
        try:
            key = serialization.load_pem_public_key(pem)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(
                f"the public key file {path} is not a PEM public key: {exc}"
            ) from None
        return cls(key, [_algorithm(key, path)])

    def verify(self, token: str) -> tuple[str, float | None]:
        """(role, expiry) of a valid token; AUTHENTICATION_ERROR if it is not."""
        try:
            # (iat is not checked: an issuer's clock a little ahead of ours
            # must not make its fresh tokens "not yet valid")
            claims = jwt.decode(
                token,
                self._key,
                algorithms=self.algorithms,
                options={"require": ["sub"], "verify_iat": False},
            )
        except jwt.ExpiredSignatureError:
            raise refusals.AuthenticationError("the token has expired") from None
        except jwt.InvalidTokenError as exc:
            raise refusals.AuthenticationError(f"the token is not valid: {exc}") from None
        role = claims["sub"]
        try:
            check_role(role)
        except AclError as exc:
            raise refusals.AuthenticationError(f"the token's subject: {exc}") from None
        exp = claims.get("exp")
        return role, float(exp) if isinstance(exp, int | float) else None


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one client may take (see the module docstring)."""

    max_connections: int = 10_000
    max_producers_per_connection: int = 1_000
    max_consumers_per_connection: int = 1_000


@dataclass(frozen=True, slots=True)
class AuthConfig:
    """How a broker authenticates (``authenticator`` None: it does not),
    who its superusers are, and its limits."""

    authenticator: Authenticator | None = None
    superuser_roles: frozenset[str] = frozenset({ADMIN_ROLE})
    limits: Limits = field(default_factory=Limits)


ACL_LEDGER = "__meta/acl"  # in a PostgreSQL store (no data directory)


async def read_acl(store: LedgerStore) -> list[AclEntry]:
    """The grants of the ACL ledger as the database holds it now (written
    by whichever broker owns its slot)."""
    entries = await store.read_fresh(ACL_LEDGER)
    return AclStore.parse(entries[-1].data, f"the ledger {ACL_LEDGER}") if entries else []


class Security:
    """A broker's authentication, ACL and limits (see the module docstring)."""

    def __init__(self, acl: AclStore, config: AuthConfig | None = None) -> None:
        config = config or AuthConfig()
        self.acl = acl
        self.authenticator = config.authenticator
        self.superuser_roles = config.superuser_roles
        # A cluster broker's: the cluster's shared secret, which the other
        # brokers sign their tokens with (CONNECT auth_method "cluster").
        self.cluster_secret: str | None = None
        self.limits = config.limits

    @classmethod
    def load(cls, data_dir: Path, config: AuthConfig | None = None) -> Security:
        """With the ACL of ``data_dir`` (`AclFileError` if it is broken)."""
        return cls(AclStore.load(data_dir / ACL_FILE), config)

    @classmethod
    async def load_from_store(
        cls, store: LedgerStore, config: AuthConfig | None = None
    ) -> Security:
        """With the ACL in ``store``'s ledger `ACL_LEDGER` (a PostgreSQL
        store: the broker has no data directory)."""
        ledger = await store.open_ledger(ACL_LEDGER)
        ledger.no_tail_cache()
        return cls(await AclStore.load_ledger(ledger), config)

    @classmethod
    async def load_cluster(cls, store: LedgerStore, config: AuthConfig | None = None) -> Security:
        """A cluster broker's: the ACL as the store holds it now, read only
        (`broker._cluster` gives it the ledger to write while this broker
        owns its slot, and reads it again now and then otherwise)."""
        return cls(AclStore(None, await read_acl(store)), config)

    @property
    def enabled(self) -> bool:
        return self.authenticator is not None

    @property
    def anonymous(self) -> Principal:
        """The principal of a connection before it authenticates: ANONYMOUS
        when authentication is off, else NOBODY (it must CONNECT with a token)."""
        return NOBODY if self.enabled else ANONYMOUS

    # -- authentication ------------------------------------------------------------

    def authenticate(self, method: str, data: bytes) -> Principal:
        """The principal of a CONNECT's credentials (AUTHENTICATION_ERROR if
        they do not hold)."""
        if method == CLUSTER_METHOD:
            return self._cluster_principal(data)
        if self.authenticator is None:
            return ANONYMOUS
        if not method and not data:
            raise refusals.AuthenticationError(
                "this broker needs a token: CONNECT with auth_method 'token' "
                "(the client: Client(url, token=...) or TXNBUF_TOKEN)",
            )
        if method != TOKEN_METHOD:
            raise refusals.AuthenticationError(f"unknown auth_method {quoted(method)}: use 'token'")
        try:
            token = data.decode("ascii")
        except UnicodeDecodeError:
            raise refusals.AuthenticationError("the token is not ASCII text") from None
        return self._principal(token)

    def _cluster_principal(self, data: bytes) -> Principal:
        """Another broker of the cluster (auth_method "cluster"): a token
        signed with the cluster's secret, whose subject is the ``cluster``
        role. Whether or not client authentication is on."""
        if self.cluster_secret is None:
            raise refusals.AuthenticationError(
                "auth_method 'cluster' is for a cluster's brokers, and this broker is not one"
            )
        try:
            claims = jwt.decode(
                data.decode("ascii", "replace"),
                self.cluster_secret,
                algorithms=["HS256"],
                issuer=CLUSTER_ISSUER,
                options={"require": ["sub", "iss"]},
            )
        except jwt.InvalidTokenError as exc:
            raise refusals.AuthenticationError(
                f"not a token of this cluster's brokers: {exc}"
            ) from None
        if claims.get("sub") != CLUSTER_ROLE_NAME:
            raise refusals.AuthenticationError("a cluster token's subject must be 'cluster'")
        return Principal(CLUSTER_ROLE_NAME, superuser=False)

    def authenticate_bearer(self, header: str | None) -> Principal:
        """The principal of an ``Authorization`` header (AUTHENTICATION_ERROR
        if there is none or it does not hold)."""
        if self.authenticator is None:
            return ANONYMOUS
        if not header:
            raise refusals.AuthenticationError(
                "this broker needs a token: Authorization: Bearer <token>"
            )
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise refusals.AuthenticationError("the Authorization header must be 'Bearer <token>'")
        return self._principal(token.strip())

    def authenticate_cluster_bearer(self, header: str | None) -> Principal:
        """The role ``cluster`` of an ``Authorization`` header, for the admin
        routes only the cluster's brokers call (``POST
        /admin/v1/cluster/look``), whether or not client authentication is
        on: a token of the cluster's secret, or of the operator's key whose
        subject is ``cluster``. AUTHENTICATION_ERROR for no token or one
        that does not hold, AUTHORIZATION_ERROR for another role's (a
        superuser's included)."""
        if not header:
            raise refusals.AuthenticationError(
                "this request is for the cluster's brokers only: Authorization: Bearer "
                "<a token of the role 'cluster'>"
            )
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            raise refusals.AuthenticationError("the Authorization header must be 'Bearer <token>'")
        try:
            return self._cluster_principal(token.encode("ascii", "replace"))
        except refusals.AuthenticationError as exc:
            if self.authenticator is None:
                raise
            failure = exc
        try:
            who = self._principal(token)
        except refusals.AuthenticationError:
            raise failure from None
        if who.role != CLUSTER_ROLE_NAME:
            raise refusals.AuthorizationError(
                f"{who.name} may not send this request: it is for the role "
                f"'{CLUSTER_ROLE_NAME}' only (the cluster's brokers); nothing was changed"
            )
        return who

    def authenticate_token(self, token: str) -> Principal:
        """The principal of a bare token (the Kafka listener's SASL
        credentials; AUTHENTICATION_ERROR if it does not hold); ANONYMOUS
        when authentication is off, as for a CONNECT."""
        if self.authenticator is None:
            return ANONYMOUS
        return self._principal(token)

    def _principal(self, token: str) -> Principal:
        assert self.authenticator is not None
        role, expires = self.authenticator.verify(token)
        return Principal(role, role in self.superuser_roles, expires)

    # -- authorization ---------------------------------------------------------------

    def _refuse(self, who: Principal, permission: str, what: str) -> refusals.AuthorizationError:
        return refusals.AuthorizationError(
            f"{who.name} lacks the {permission} permission on {what}; nothing was changed",
        )

    def allow_admin(self, who: Principal) -> None:
        if not who.superuser:
            raise refusals.AuthorizationError(
                f"{who.name} lacks the {ADMIN_ROLE!r} role the admin API needs "
                f"(superuser roles: {', '.join(sorted(self.superuser_roles))})",
            )

    def _grants(
        self, who: Principal, permission: Permission, kind: ResourceType, name: str
    ) -> bool:
        return who.role is not None and self.acl.allows(who.role, permission, kind, name)

    def allow_lookup(self, who: Principal, topic: str) -> None:
        """Metadata of a topic (and creating it): produce or consume on it."""
        if who.superuser:
            return
        if not (
            self._grants(who, Permission.PRODUCE, ResourceType.TOPIC, topic)
            or self._grants(who, Permission.CONSUME, ResourceType.TOPIC, topic)
        ):
            raise self._refuse(who, "'produce' or 'consume'", f"topic {quoted(topic)}")

    def allow_produce(self, who: Principal, topic: str) -> None:
        if who.superuser:
            return
        if not self._grants(who, Permission.PRODUCE, ResourceType.TOPIC, topic):
            raise self._refuse(who, "'produce'", f"topic {quoted(topic)}")

    def allow_consume(self, who: Principal, topic: str, subscription: str) -> None:
        if who.superuser:
            return
        if not self._grants(who, Permission.CONSUME, ResourceType.TOPIC, topic):
            raise self._refuse(who, "'consume'", f"topic {quoted(topic)}")
        if self.acl.restricted(topic, subscription) and not self._grants(
            who, Permission.CONSUME, ResourceType.SUBSCRIPTION, f"{topic}/{subscription}"
        ):
            raise self._refuse(
                who,
                "'consume'",
                f"subscription {quoted(subscription)} of topic {quoted(topic)} "
                "(it is open only to the roles granted it)",
            )

    def allow_read(self, who: Principal, topic: str) -> None:
        """Reading a partition by position (READ_ENTRIES): consume on the
        topic (it names no subscription)."""
        if who.superuser:
            return
        if not self._grants(who, Permission.CONSUME, ResourceType.TOPIC, topic):
            raise self._refuse(who, "'consume'", f"topic {quoted(topic)}")

    def allow_end(
        self,
        who: Principal,
        partitions: Iterable[tuple[str, int]],
        subscriptions: Iterable[tuple[str, str]],
    ) -> None:
        """Ending a transaction: what writing it needed (module docstring)."""
        if who.superuser:
            return
        for topic in sorted({t for t, _ in partitions}):
            self.allow_produce(who, topic)
        for topic, subscription in sorted(set(subscriptions)):
            self.allow_consume(who, topic, subscription)

    def allow_transactional_id(
        self, who: Principal, transactional_id: str, two_phase: bool = False
    ) -> None:
        """The producer-epoch mode: produce on the transactional id (Kafka's
        WRITE), and ``two_phase_commit`` too for a producer asking for
        KIP-939's two-phase commit."""
        if who.superuser:
            return
        what = f"transactional id {quoted(transactional_id)}"
        kind = ResourceType.TRANSACTIONAL_ID
        if not self._grants(who, Permission.PRODUCE, kind, transactional_id):
            raise self._refuse(who, "'produce'", what)
        if two_phase and not self._grants(who, Permission.TWO_PHASE_COMMIT, kind, transactional_id):
            raise self._refuse(who, "'two_phase_commit'", what)

    # -- limits ----------------------------------------------------------------------

    def refuse_connection(self, connections: int) -> bytes | None:
        """The ERROR frame that refuses one more connection beyond
        ``max_connections``, or None if it may come in."""
        limit = self.limits.max_connections
        if connections < limit:
            return None
        cmd = pb.BaseCommand(type=pb.BaseCommand.ERROR)
        cmd.error.error = pb.TOO_MANY_REQUESTS
        cmd.error.message = (
            f"the broker serves {connections} connections, its limit (--max-connections "
            f"{limit}); try again later"
        )
        return cmd.SerializeToString()

    def allow_another(self, what: str, have: int) -> None:
        """Refuse a connection's producer or consumer beyond its limit."""
        limit = (
            self.limits.max_producers_per_connection
            if what == "producer"
            else self.limits.max_consumers_per_connection
        )
        if have >= limit:
            raise refusals.NotAllowed(
                f"this connection has {have} {what}s, the most one connection may have "
                f"(--max-{what}s-per-connection {limit}): close one first",
            )


def check_listen(host: str, authenticated: bool, insecure: bool, listener: str = "") -> str | None:
    """Why the broker must not listen on ``host`` as configured, or None
    (``listener``: which one, e.g. "Kafka", for the message). Every
    listener follows this rule: the data plane and admin API, the stream
    listener (``--stream-port``, on the same host), and the Kafka
    listener."""
    if authenticated or insecure:
        return None
    if host == "localhost":
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    what = f"for {listener} on" if listener else "on"
    return (
        f"refusing to listen {what} {host} without authentication: give --auth-secret-key-file "
        "or --auth-public-key-file, or --insecure to let anyone who reaches the port do anything"
    )
