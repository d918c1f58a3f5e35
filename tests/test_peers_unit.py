"""Unit tests of `broker._peers.Peers`' figures (the metrics
``txnbuf_cluster_peer_*``), with a stand-in for its cluster host and a
port nobody listens on: a tell tried again after NOT_OWNER and after a
broker out of reach, applied here once its slot came here; a tell refused
here handed back to its caller; a check with nobody answering given up;
and, against one real broker serving TLS, the CA the peers trust.
The figures on real brokers: tests/test_cluster_network.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from broker import _peers
from broker._peers import Peers
from client import errors
from client._foreign import tls_context
from proto import refusals
from tc import CoordinatorMoved, TxnEnd, TxnID
from tests.conftest import BrokerProcess, free_port
from tests.test_security import self_signed


class Store:
    slot_count = 64

    def slot_epoch(self, slot: int) -> int:
        return 1


class FakeBroker:
    def __init__(self) -> None:
        self.store = Store()
        self.applied = 0
        self.refuse = False

    async def end_locally_on_partition(self, *args: Any) -> None:
        if self.refuse:
            raise refusals.NotAllowed("stale")
        self.applied += 1


class Host:
    """The cluster host: its answers to "who owns the slot" come in turn."""

    def __init__(self, answers: list[str | Exception]) -> None:
        self.broker = FakeBroker()
        self.me = "me"
        self.answers = answers
        self.seen = 1  # the coordinator slot's epoch in the cluster tables
        self.fresh_reads = 0

    async def fresh_view(self) -> None:
        self.fresh_reads += 1

    def slot_epoch_seen(self, slot: int) -> int | None:
        return self.seen

    def owner_seen(self, slot: int, what: str) -> str:
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    served = True  # (every topic's slot, until handed over)

    def gate(self, topic: str) -> None:
        if not self.served:
            raise refusals.NotOwner(f"topic {topic!r}: handed over")


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_peers, "REQUEST_TIMEOUT", 0.3)
    monkeypatch.setattr(_peers, "RETRY_MIN", 0.01)


END = TxnEnd(TxnID(3, 1), commit=True)


async def test_a_tells_retries_are_counted_by_reason() -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    host = Host([refusals.NotOwner("moving", 3), nobody, ""])
    peers = Peers(host, "x" * 32)
    try:
        await peers.end_on_partition("t", 0, END)
    finally:
        await peers.close()
    assert host.broker.applied == 1  # (the slot came here: applied here)
    assert peers.tells == 0
    assert dict(peers.tell_retries) == {"not_owner": 1, "unreachable": 1}
    assert not peers.tell_failures


async def test_a_tell_refused_is_counted_and_raised() -> None:
    host = Host([""])
    host.broker.refuse = True
    peers = Peers(host, "x" * 32)
    with pytest.raises(refusals.NotAllowed):
        await peers.end_on_partition("t", 0, END)
    assert dict(peers.tell_failures) == {"not_allowed": 1}


class Answers:
    """A participant broker's answers to the tells, in turn (None: done)."""

    def __init__(self, *answers: Exception | None) -> None:
        self.answers = list(answers)

    async def __call__(self, url: str, build: object, what: str, *expect: object) -> None:
        answer = self.answers.pop(0)
        if answer is not None:
            raise answer


async def test_a_participant_whose_view_lags_is_told_again_soon_and_quietly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An END refused because the participant has not seen the coordinator
    slot's takeover yet (SERVICE_NOT_READY) is tried again within the tell,
    not handed to the coordinator's stuck list: one WARNING (for that
    coordinator slot epoch, however many tells), no ERROR."""
    host = Host(["http://participant"])
    peers = Peers(host, "x" * 32)
    lagging = errors.ServiceNotReadyError("newer than this broker has seen")
    monkeypatch.setattr(peers, "_request", Answers(lagging, lagging, lagging, None, lagging, None))
    with caplog.at_level(logging.DEBUG, logger="broker._peers"):
        await peers.end_on_partition("t", 0, END)
        await peers.end_on_partition("t", 1, END)  # (the same coordinator epoch: not again)
    assert peers.tells == 2
    assert dict(peers.tell_retries) == {"service_not_ready": 4}
    assert not peers.tell_failures
    assert [r.levelno for r in caplog.records if r.levelno >= logging.WARNING] == [logging.WARNING]


async def test_a_participant_lagging_for_long_goes_to_the_stuck_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_peers, "LAG_RETRY_S", 0.05)
    peers = Peers(Host(["http://participant"]), "x" * 32)
    lagging = errors.ServiceNotReadyError("still loading")
    monkeypatch.setattr(peers, "_request", Answers(*[lagging] * 100))
    with pytest.raises(refusals.ServiceNotReady):
        await peers.end_on_partition("t", 0, END)
    assert dict(peers.tell_failures) == {"service_not_ready": 1}


@pytest.mark.parametrize("seen", [1, 2])
async def test_a_refused_slot_epoch_stops_the_tell_once_the_tables_say_it_moved(
    monkeypatch: pytest.MonkeyPatch, seen: int
) -> None:
    """NOT_ALLOWED (the participant holds a newer coordinator slot epoch
    than the one told, 1): the tables read again say 2, so this broker lost
    the slot and stops telling (`CoordinatorMoved`); if they still say 1,
    the refusal goes to the coordinator as before (the stuck list)."""
    host = Host(["http://participant"])
    host.seen = seen
    peers = Peers(host, "x" * 32)
    monkeypatch.setattr(peers, "_request", Answers(errors.NotAllowedError("older epoch")))
    with pytest.raises(CoordinatorMoved if seen == 2 else refusals.NotAllowed):
        await peers.end_on_partition("t", 0, END)
    assert host.fresh_reads == 1
    assert dict(peers.tell_failures) == {"not_allowed": 1}


async def test_a_check_nobody_answers_is_given_up_and_counted() -> None:
    host = Host([f"http://127.0.0.1:{free_port()}"])
    peers = Peers(host, "x" * 32)
    try:
        with pytest.raises(refusals.ServiceNotReady, match="no answer in time"):
            await peers.register(TxnID(3, 1), "t", partition=0)
    finally:
        await peers.close()
    assert peers.checks == 1
    assert peers.check_retries["unreachable"] >= 1
    assert dict(peers.check_refusals) == {"no_answer": 1}
    assert not peers.registered(TxnID(3, 1), "t/0")


@pytest.mark.integration
@pytest.mark.parametrize("epoch_mode", [False, True])
async def test_a_check_answered_after_its_slot_was_handed_over_is_refused(
    epoch_mode: bool,
) -> None:
    """The coordinator answers a participant's check while the participant's
    slot is handed over: the caller would write to a slot its store no
    longer holds (fenced: the whole store fails), so the check is refused
    NOT_OWNER instead, and nothing is cached (a send of that transaction
    there later is checked again)."""
    host = Host([""])
    peers = Peers(host, "x" * 32)
    txnid = TxnID(1 << 48, 7)

    moves = [False]  # (unloaded while the first answer came)

    async def answered(*args: Any) -> tuple[TxnID, str]:
        if moves:
            host.served = moves.pop()
        return txnid, "app"

    peers._ask = answered  # type: ignore[method-assign]
    peers._ask_producer = answered  # type: ignore[method-assign]
    with pytest.raises(refusals.NotOwner):
        if epoch_mode:
            await peers.register_producer((5, 0), "t", partition=0)
        else:
            await peers.register(txnid, "t", partition=0)
    assert not peers.registered(txnid, "t/0")
    host.served = True  # (served again: asked again, and kept)
    if epoch_mode:
        assert await peers.register_producer((5, 0), "t", partition=0) == (txnid, "app")
    else:
        await peers.register(txnid, "t", partition=0)
    assert peers.registered(txnid, "t/0")


async def test_a_broker_over_tls_is_trusted_with_the_cluster_ca(tmp_path: Path) -> None:
    """A real broker serving TLS with a certificate no system CA trusts:
    without ``tls_ca`` the peers cannot reach it, and say which option is
    missing; with it, the TLS handshake passes (that broker, not a
    cluster's, then refuses the cluster role itself)."""
    cert, key = self_signed(tmp_path)
    proc = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    proc.tls = (cert, key, cert)
    proc.start()
    try:
        for ca, expected in (
            (None, "--cluster-tls-ca"),
            (tls_context(cert), "auth_method 'cluster'"),
        ):
            peers = Peers(Host([proc.url]), "x" * 32, ca)
            try:
                with pytest.raises(refusals.ServiceNotReady) as refused:
                    await peers.register(TxnID(3, 1), "t", partition=0)
            finally:
                await peers.close()
            message = str(refused.value)
            assert expected in message, message
            assert ("certificate" in message) == (ca is None), message
    finally:
        proc.stop()
