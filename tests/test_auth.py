"""Unit tests of `broker._auth`: grants and their wildcards, the ACL file,
tokens and keys, and the rules a broker checks. The broker process itself
is tested in test_security.py."""

from __future__ import annotations

import json
from pathlib import Path

import jwt
import pytest

from broker._acl import AclEntry, AclError, AclFileError, AclStore
from broker._auth import (
    ANONYMOUS,
    NOBODY,
    AuthConfig,
    Authenticator,
    KeyFileError,
    Limits,
    Principal,
    Security,
    check_listen,
    create_key_pair,
    create_secret_key,
    create_token,
    load_signing_key,
    parse_duration,
)
from proto import refusals
from proto import txnbuf_pb2 as pb


def store(tmp_path: Path, *grants: tuple[str, str, str]) -> AclStore:
    return AclStore(tmp_path / "acl.json", [AclEntry.parse(*g) for g in grants])


def app() -> Principal:
    return Principal("app", superuser=False)


@pytest.mark.parametrize(
    ("role", "permission", "resource", "message"),
    [
        ("", "produce", "topic:t", "invalid role"),
        ("a b", "produce", "topic:t", "invalid role"),
        ("app", "write", "topic:t", "unknown permission 'write'"),
        ("app", "produce", "t", "must be topic:<pattern>"),
        ("app", "produce", "queue:t", "unknown resource type 'queue'"),
        ("app", "produce", "topic:a/b", "invalid pattern 'a/b'"),
        ("app", "produce", "topic:", "invalid pattern ''"),
        ("app", "consume", "subscription:t", "subscription:<topic pattern>/<subscription"),
        ("app", "produce", "subscription:t/s", "produce cannot be granted on a subscription"),
        ("app", "two_phase_commit", "topic:t", "two_phase_commit cannot be granted on a topic"),
        ("app", "consume", "transactional-id:x", "consume cannot be granted"),
    ],
)
def test_a_malformed_grant_says_what_is_wrong(
    role: str, permission: str, resource: str, message: str
) -> None:
    with pytest.raises(AclError, match=message.replace("(", r"\(").replace("*", r"\*")):
        AclEntry.parse(role, permission, resource)


def test_a_long_bad_grant_is_quoted_short() -> None:
    with pytest.raises(AclError) as info:
        AclEntry.parse("r" * 10_000, "produce", "topic:t")
    assert "(10000 characters)" in str(info.value) and len(str(info.value)) < 400


def test_wildcards_match_any_run_of_characters(tmp_path: Path) -> None:
    acl = store(
        tmp_path,
        ("app", "produce", "topic:orders-*"),
        ("app", "consume", "topic:*.events"),
        ("app", "two_phase_commit", "transactional-id:pay-*-eu"),
        ("app", "produce", "transactional-id:pay-*"),
    )
    sec = Security(acl)
    sec.allow_produce(app(), "orders-1")
    sec.allow_produce(app(), "orders-")
    for topic in ("orders", "xorders-1", "payments"):
        with pytest.raises(
            refusals.AuthorizationError, match="'produce' permission on topic"
        ) as info:
            sec.allow_produce(app(), topic)
        assert info.value.code == pb.AUTHORIZATION_ERROR
    sec.allow_consume(app(), "a.b.events", "any")
    with pytest.raises(refusals.AuthorizationError, match="'consume'"):
        sec.allow_consume(app(), "orders-1", "s")  # produce does not give consume
    sec.allow_lookup(app(), "orders-1")
    sec.allow_lookup(app(), "x.events")
    with pytest.raises(refusals.AuthorizationError, match="'produce' or 'consume'"):
        sec.allow_lookup(app(), "other")
    sec.allow_transactional_id(app(), "pay-1-us")
    sec.allow_transactional_id(app(), "pay-1-eu", two_phase=True)
    with pytest.raises(
        refusals.AuthorizationError, match="'two_phase_commit' permission on transactional id"
    ):
        sec.allow_transactional_id(app(), "pay-1-us", two_phase=True)
    with pytest.raises(
        refusals.AuthorizationError, match="'produce' permission on transactional id 'copy'"
    ):
        sec.allow_transactional_id(app(), "copy")
    # A pattern's dots and dashes are literal.
    with pytest.raises(refusals.AuthorizationError):
        sec.allow_consume(app(), "aXevents", "s")
    # Another role gets nothing of app's.
    with pytest.raises(refusals.AuthorizationError, match="role 'other'"):
        sec.allow_produce(Principal("other", superuser=False), "orders-1")


def test_a_subscription_named_in_a_grant_is_open_only_to_its_roles(tmp_path: Path) -> None:
    acl = store(
        tmp_path,
        ("billing", "consume", "topic:orders"),
        ("audit", "consume", "topic:orders"),
        ("billing", "consume", "subscription:orders/bill-*"),
    )
    sec = Security(acl)
    billing, audit = Principal("billing", False), Principal("audit", False)
    sec.allow_consume(billing, "orders", "bill-1")
    sec.allow_consume(audit, "orders", "audit")  # named by nobody: open
    with pytest.raises(
        refusals.AuthorizationError, match="subscription 'bill-1' of topic 'orders'"
    ):
        sec.allow_consume(audit, "orders", "bill-1")
    # The subscription grant alone does not give the topic.
    acl2 = store(tmp_path, ("x", "consume", "subscription:orders/s"))
    with pytest.raises(refusals.AuthorizationError, match="on topic 'orders'"):
        Security(acl2).allow_consume(Principal("x", False), "orders", "s")


def test_ending_a_transaction_needs_what_writing_it_needed(tmp_path: Path) -> None:
    sec = Security(store(tmp_path, ("app", "produce", "topic:out"), ("app", "consume", "topic:in")))
    sec.allow_end(app(), [("out", 0), ("out", 1)], [("in", "copier")])
    sec.allow_end(app(), [], [])
    with pytest.raises(refusals.AuthorizationError, match="'produce' permission on topic 'other'"):
        sec.allow_end(app(), [("out", 0), ("other", 0)], [])
    with pytest.raises(refusals.AuthorizationError, match="'consume' permission on topic 'out'"):
        sec.allow_end(app(), [], [("out", "s")])
    sec.allow_end(Principal("root", superuser=True), [("other", 0)], [])


def test_superusers_the_anonymous_principal_and_roles(tmp_path: Path) -> None:
    sec = Security(store(tmp_path))
    assert not sec.enabled and sec.anonymous is ANONYMOUS
    assert ANONYMOUS.roles == {"admin"} and "cluster" not in ANONYMOUS.roles
    assert NOBODY.roles == frozenset()
    sec.allow_admin(ANONYMOUS)
    sec.allow_produce(ANONYMOUS, "anything")
    with pytest.raises(refusals.AuthorizationError, match="lacks the 'admin' role"):
        sec.allow_admin(app())
    assert Principal("cluster", False).roles == {"cluster"}
    assert Principal("root", True).roles == {"root", "admin"}


async def test_the_acl_is_written_before_it_changes_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "acl.json"
    acl = AclStore.load(path)  # no file: empty
    entry = AclEntry.parse("app", "produce", "topic:orders-*")
    assert await acl.grant(entry) is True
    assert await acl.grant(entry) is False
    assert json.loads(path.read_text()) == {"format": 1, "grants": [entry.to_json()]}
    assert acl.allows("app", entry.permission, entry.kind, "orders-9")
    assert AclStore.load(path).entries() == [entry]
    assert await acl.revoke(entry) is True
    assert await acl.revoke(entry) is False
    assert not acl.allows("app", entry.permission, entry.kind, "orders-9")  # (cache cleared)
    assert AclStore.load(path).entries() == []
    assert not (tmp_path / "acl.json.tmp").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "broken"),
        ("[]", '"format": 1'),
        ('{"format": 2, "grants": []}', '"format": 1'),
        ('{"format": 1, "grants": {}}', "must be a list"),
        ('{"format": 1, "grants": [5]}', "must be an object"),
        ('{"format": 1, "grants": [{"role": "a", "permission": "x", "resource": "topic:t"}]}',
         "unknown permission"),
    ],
)  # fmt: skip
def test_a_broken_acl_file_stops_the_broker(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "acl.json").write_text(text)
    with pytest.raises(AclFileError, match=message):
        Security.load(tmp_path)


def test_secret_key_tokens(tmp_path: Path) -> None:
    key_file = tmp_path / "k"
    key_file.write_text(create_secret_key())
    auth = Authenticator.from_secret_key_file(key_file)
    key, algorithm = load_signing_key(secret_key_file=key_file)
    assert algorithm == "HS256"
    assert auth.verify(create_token("app", key, algorithm)) == ("app", None)
    role, expires = auth.verify(create_token("app", key, algorithm, expires_in=3600))
    assert role == "app" and expires is not None
    for token, message in (
        (create_token("app", key, algorithm, expires_in=-5), "expired"),
        (create_token("app", b"y" * 32, "HS256"), "Signature verification failed"),
        (jwt.encode({"sub": "app"}, None, algorithm="none"), "not valid"),
        (jwt.encode({"role": "app"}, key, algorithm="HS256"), 'missing the "sub" claim'),
        (jwt.encode({"sub": "a b"}, key, algorithm="HS256"), "invalid role"),
        ("garbage", "not valid"),
    ):
        with pytest.raises(refusals.AuthenticationError, match=message) as info:
            auth.verify(token)
        assert info.value.code == pb.AUTHENTICATION_ERROR


@pytest.mark.parametrize("algorithm", ["RS256", "ES256"])
def test_key_pair_tokens_and_no_algorithm_confusion(tmp_path: Path, algorithm: str) -> None:
    private_pem, public_pem = create_key_pair(algorithm)
    (tmp_path / "private.pem").write_bytes(private_pem)
    (tmp_path / "public.pem").write_bytes(public_pem)
    key, alg = load_signing_key(private_key_file=tmp_path / "private.pem")
    assert alg == algorithm
    auth = Authenticator.from_public_key_file(tmp_path / "public.pem")
    assert auth.algorithms == [algorithm]
    assert auth.verify(create_token("svc", key, alg))[0] == "svc"
    # The public key used as an HMAC secret: the classic confusion, refused.
    forged = jwt.api_jws.PyJWS().encode(b'{"sub":"admin"}', b"k" * 32, algorithm="HS256")
    with pytest.raises(refusals.AuthenticationError, match="not valid"):
        auth.verify(forged)


def test_key_files_that_cannot_be_used(tmp_path: Path) -> None:
    (tmp_path / "short").write_text("c2hvcnQ=")  # "short"
    (tmp_path / "text").write_text("not base64 at all!")
    for path, message in (
        (tmp_path / "missing", "cannot read the secret key file"),
        (tmp_path / "short", "has 5 bytes; HS256 needs at least 32"),
        (tmp_path / "text", "does not hold base64 text"),
    ):
        with pytest.raises(KeyFileError, match=message):
            Authenticator.from_secret_key_file(path)
    with pytest.raises(KeyFileError, match="not a PEM public key"):
        Authenticator.from_public_key_file(tmp_path / "text")
    with pytest.raises(KeyFileError, match="not an unencrypted PEM private key"):
        load_signing_key(private_key_file=tmp_path / "text")
    with pytest.raises(KeyFileError, match="one of them"):
        load_signing_key()


def test_durations() -> None:
    assert [parse_duration(t) for t in ("30", "30s", "15m", "1h", "7d", "1y")] == [
        30, 30, 900, 3600, 7 * 86400, 365 * 86400,
    ]  # fmt: skip
    for bad in ("", "0", "1w", "-1h", "soon", "1.5h"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


def test_where_a_broker_may_listen_without_authentication() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert check_listen(host, authenticated=False, insecure=False) is None
    for host in ("0.0.0.0", "::", "10.1.2.3", "broker.example.com"):
        refusal = check_listen(host, authenticated=False, insecure=False)
        assert refusal is not None and "--insecure" in refusal
        assert check_listen(host, authenticated=True, insecure=False) is None
        assert check_listen(host, authenticated=False, insecure=True) is None


def test_limits(tmp_path: Path) -> None:
    sec = Security(store(tmp_path), AuthConfig(limits=Limits(2, 3, 1)))
    assert sec.refuse_connection(1) is None
    refusal = sec.refuse_connection(2)
    assert refusal is not None and b"--max-connections 2" in refusal
    sec.allow_another("producer", 2)
    with pytest.raises(refusals.NotAllowed, match="--max-producers-per-connection 3") as info:
        sec.allow_another("producer", 3)
    assert info.value.code == pb.NOT_ALLOWED
    with pytest.raises(refusals.NotAllowed, match="--max-consumers-per-connection 1"):
        sec.allow_another("consumer", 1)
