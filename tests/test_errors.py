"""Server errors and wire codes: one server class (`proto.refusals`) and one
client class (`client.errors`) per code; the packages' errors have one
parent each and are mapped to their codes by one table
(`broker._errors.WIRE_CODES`); a refusal is answered with its code; anything
else (a bug) is answered UNKNOWN_ERROR and logged with its traceback
(`broker._errors`), on a real connection too."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import broker  # noqa: F401  (imports every server package: all their classes exist)
from broker import Broker, _errors, make_app
from broker._errors import KAFKA_CODES, WIRE_CODES, error_code, error_text, kafka_code
from broker._errors import REFUSALS as REFUSAL_CLASSES
from buffer import (
    DuplicateTooOldError,
    InvalidNameError,
    InvalidTopicNameError,
    MalformedSendError,
    OutOfOrderSequenceError,
    PartitionCountError,
    RetentionError,
    SendRejectedError,
    StaleEpochError,
    TransactionBufferError,
    TxnConflictError,
    TxnEndedError,
    check_subscription_name,
    check_topic_name,
)
from client import Client, errors
from ledger import LedgerError, LedgerFailedError, LedgerFencedError
from proto import refusals
from proto import txnbuf_pb2 as pb
from tc import (
    ConcurrentTransactionsError,
    InvalidPidMappingError,
    InvalidProducerEpochError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    InvalidTxnStatusError,
    NotStuckError,
    ProducerEpochError,
    ProducerFencedError,
    TransactionAbortableError,
    TwoPhaseCommitNotAllowedError,
    TxnArgumentError,
    TxnNotFoundError,
    TxnStatus,
    TxnTimeoutError,
)
from tests.conftest import RawConnection

T = pb.BaseCommand
CODES = {name: code for name, code in pb.ServerError.items() if code != pb.UNKNOWN_ERROR}


def _subclasses(cls: type) -> Iterator[type]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def _setting_code(base: type) -> dict[int, list[type]]:
    """Code -> the classes under ``base`` that set it themselves."""
    found: dict[int, list[type]] = {}
    for cls in {base, *_subclasses(base)}:
        if "code" in cls.__dict__:
            found.setdefault(cls.__dict__["code"], []).append(cls)
    return found


# -- one class per code, on each side --------------------------------------------


def test_each_wire_code_has_one_server_class_and_one_client_class() -> None:
    server = _setting_code(refusals.Refusal)
    client = _setting_code(errors.ServerError)
    assert set(server) == set(CODES.values()), "a code without a server class, or a stray one"
    assert set(client) == {*CODES.values(), pb.UNKNOWN_ERROR}
    for name, code in CODES.items():
        (server_cls,) = server[code]
        (client_cls,) = client[code]
        assert server_cls.__module__ == "proto.refusals", name
        assert server_cls.__name__ == "".join(w.capitalize() for w in name.split("_")), name
        assert getattr(refusals, server_cls.__name__) is server_cls
        assert errors.for_code(code) is client_cls
    assert errors.for_code(pb.UNKNOWN_ERROR) is errors.UnknownServerError


def test_every_refusal_class_has_a_code() -> None:
    """No class below `Refusal` is left without a code (error_code reads it)."""
    for cls in _subclasses(refusals.Refusal):
        assert getattr(cls, "code", None) in CODES.values(), cls


SERVER_PACKAGES = ("proto", "ledger", "tc", "buffer", "subscriptions", "broker")


def _server_errors() -> list[type]:
    return [
        cls for cls in _subclasses(BaseException) if cls.__module__.split(".")[0] in SERVER_PACKAGES
    ]


def test_every_server_error_class_has_one_parent() -> None:
    """Single inheritance: an exception's code never depends on the order of
    its parents (the table's nearest class on its one line of parents)."""
    found = _server_errors()
    assert len(found) > 30  # (every server package is imported: see the top)
    two = [f"{c.__module__}.{c.__name__}{c.__bases__}" for c in found if len(c.__bases__) != 1]
    assert not two, "\n".join(two)


def test_only_proto_defines_refusal_classes() -> None:
    """A package's own refusal is its own error mapped in `WIRE_CODES`,
    not a subclass of a wire refusal."""
    outside = [c for c in _subclasses(refusals.Refusal) if c.__module__ != "proto.refusals"]
    assert outside == []


def test_the_table_maps_each_class_once_and_the_nearest_class_wins() -> None:
    assert set(WIRE_CODES) >= set(REFUSAL_CLASSES)
    for cls, code in WIRE_CODES.items():
        assert code in pb.ServerError.values(), cls
        if issubclass(cls, refusals.Refusal):
            assert code == cls.code
    # A subclass with a row of its own is answered with it, not its parent's.
    assert error_code(TxnTimeoutError(TxnStatus.ABORTED, "commit")) == pb.TRANSACTION_TIMEOUT
    assert error_code(InvalidTopicNameError("topic", "x")) == pb.INVALID_TOPIC_NAME
    assert error_code(MalformedSendError("x")) == pb.MALFORMED_FRAME

    # A subclass without one takes its nearest parent's.
    class Narrower(TxnNotFoundError):
        pass

    assert error_code(Narrower("x")) == pb.TRANSACTION_NOT_FOUND


# -- each refusal keeps the code it had -------------------------------------------


REFUSALS: list[tuple[BaseException, int, type | None]] = [
    # (the exception, its code, a built-in or package class callers also catch)
    (ProducerFencedError("x"), pb.PRODUCER_FENCED, ProducerEpochError),
    (InvalidProducerEpochError("x"), pb.INVALID_PRODUCER_EPOCH, ProducerEpochError),
    (StaleEpochError("x"), pb.INVALID_PRODUCER_EPOCH, TransactionBufferError),
    (InvalidTxnStateError("x"), pb.INVALID_TXN_STATE, ProducerEpochError),
    (TransactionAbortableError("x"), pb.TRANSACTION_ABORTABLE, ProducerEpochError),
    (InvalidPidMappingError("x"), pb.INVALID_PRODUCER_ID_MAPPING, ProducerEpochError),
    (ConcurrentTransactionsError("x"), pb.CONCURRENT_TRANSACTIONS, ProducerEpochError),
    (InvalidTransactionTimeoutError("x"), pb.INVALID_TRANSACTION_TIMEOUT, ProducerEpochError),
    (OutOfOrderSequenceError("x"), pb.OUT_OF_ORDER_SEQUENCE, TransactionBufferError),
    (TwoPhaseCommitNotAllowedError("x"), pb.AUTHORIZATION_ERROR, ProducerEpochError),
    (MalformedSendError("x"), pb.MALFORMED_FRAME, SendRejectedError),
    (InvalidTopicNameError("topic", "x"), pb.INVALID_TOPIC_NAME, InvalidNameError),
    (InvalidNameError("subscription", "x"), pb.INVALID_ARGUMENT, ValueError),
    (DuplicateTooOldError("x"), pb.SEQUENCE_TOO_OLD, None),
    (TxnTimeoutError(TxnStatus.ABORTED, "commit"), pb.TRANSACTION_TIMEOUT, InvalidTxnStatusError),
    (InvalidTxnStatusError(TxnStatus.COMMITTED, "abort"), pb.INVALID_TXN_STATUS, None),
    (TxnEndedError("x"), pb.INVALID_TXN_STATUS, TransactionBufferError),
    (TxnConflictError("x"), pb.INVALID_TXN_STATUS, TransactionBufferError),
    (TxnNotFoundError("x"), pb.TRANSACTION_NOT_FOUND, LookupError),
    (SendRejectedError("x"), pb.INVALID_ARGUMENT, ValueError),
    (PartitionCountError("x"), pb.INVALID_ARGUMENT, ValueError),
    (RetentionError("x"), pb.INVALID_ARGUMENT, ValueError),
    (TxnArgumentError("x"), pb.INVALID_ARGUMENT, ValueError),
    (refusals.TopicNotFound("x"), pb.TOPIC_NOT_FOUND, None),
]


@pytest.mark.parametrize(("exc", "code", "also"), REFUSALS, ids=lambda v: type(v).__name__)
def test_a_refusal_is_answered_with_its_code_and_not_logged(
    exc: BaseException, code: int, also: type | None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="broker._errors"):
        assert error_code(exc) == code
    assert caplog.records == []
    assert error_text(exc) == str(exc)
    if also is not None:
        assert isinstance(exc, also)


def test_names_are_refused_with_the_code_of_their_kind() -> None:
    with pytest.raises(InvalidTopicNameError) as topic:
        check_topic_name("bad name")
    assert error_code(topic.value) == pb.INVALID_TOPIC_NAME and topic.value.kind == "topic"
    with pytest.raises(InvalidNameError) as sub:
        check_subscription_name("bad name")
    assert type(sub.value) is InvalidNameError and error_code(sub.value) == pb.INVALID_ARGUMENT


def test_a_storage_failure_is_persistence_error() -> None:
    exc = LedgerError("disk full")
    assert error_code(exc) == pb.PERSISTENCE_ERROR
    assert error_text(exc) == "disk full"
    assert kafka_code(exc) == 56  # KAFKA_STORAGE_ERROR
    failed = LedgerFailedError("group commit to pg failed: connection lost")
    assert error_code(failed) == pb.PERSISTENCE_ERROR  # (one broker: fail-stop)


def test_a_cluster_brokers_store_out_of_service_is_not_owner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_errors, "_store_failed_code", pb.PERSISTENCE_ERROR)
    _errors.cluster_store_failures()
    for failed in (
        LedgerFailedError("group commit to pg failed: connection lost"),
        LedgerFencedError("fenced: slots 3", [3]),
    ):
        assert error_code(failed) == pb.NOT_OWNER  # (retriable: the client sends again)
        assert error_text(failed).startswith(str(failed))
        assert "try again at the slot's owner" in error_text(failed)
        assert kafka_code(failed) == 6  # NOT_LEADER_OR_FOLLOWER
    other = LedgerError("ledger x is deleted")  # (not the store: still what it was)
    assert error_code(other) == pb.PERSISTENCE_ERROR


# -- anything else is a bug: UNKNOWN_ERROR, logged ---------------------------------


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(
    "exc",
    [
        KeyError("bug"),  # (was CONSUMER_NOT_FOUND: a LookupError)
        LookupError("bug"),
        ValueError("bug"),  # (was INVALID_ARGUMENT)
        TransactionBufferError("malformed commit marker (3 bytes)"),  # a damaged log
        NotStuckError("not a wire refusal"),
        AttributeError("bug"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_anything_else_is_unknown_error_and_logged_with_its_traceback(
    exc: BaseException, caplog: pytest.LogCaptureFixture
) -> None:
    raised = _raised(exc)
    with caplog.at_level(logging.ERROR, logger="broker._errors"):
        assert error_code(raised, "connection x: test request") == pb.UNKNOWN_ERROR
    (record,) = caplog.records
    assert record.levelno == logging.ERROR
    assert "connection x: test request" in record.getMessage()
    assert record.exc_info is not None and record.exc_info[1] is raised
    assert "Traceback" in caplog.text and type(exc).__name__ in caplog.text
    assert error_text(raised).startswith(f"internal error: {type(exc).__name__}: ")


def test_the_kafka_table_maps_codes_and_leaves_the_rest_unknown(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert set(KAFKA_CODES) <= set(pb.ServerError.values())
    assert kafka_code(ProducerFencedError("x")) == 47  # INVALID_PRODUCER_EPOCH
    assert kafka_code(OutOfOrderSequenceError("x")) == 45
    assert kafka_code(refusals.TopicNotFound("x")) == 3
    assert kafka_code(refusals.UnknownMessageId("x")) == -1  # no Kafka code: not logged
    assert caplog.records == []
    with caplog.at_level(logging.ERROR, logger="broker._errors"):
        assert kafka_code(_raised(KeyError("bug"))) == -1
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is not None


# -- on a real connection ----------------------------------------------------------


@asynccontextmanager
async def serving(tmp_path: Path) -> AsyncIterator[tuple[Broker, str]]:
    """A broker in this process (so that a test can plant a bug in it),
    serving on a free port."""
    brk = await Broker.open(tmp_path / "data")
    runner = web.AppRunner(make_app(brk), shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield brk, f"http://{host}:{port}"
    finally:
        await runner.cleanup()
        await brk.close()


def _bug(*args: Any, **kwargs: Any) -> Any:
    raise KeyError("planted bug")


def _logged_bugs(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR
        and r.exc_info is not None
        and isinstance(r.exc_info[1], KeyError)
        and r.exc_info[2] is not None  # (with its traceback)
    ]


async def test_a_bug_in_a_handler_reaches_the_client_as_unknown_error_and_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.ERROR)
    async with serving(tmp_path) as (brk, url), RawConnection(url) as raw:
        # An ACK whose work hits a KeyError: UNKNOWN_ERROR, not CONSUMER_NOT_FOUND.
        subscribed = await raw.request(
            T.SUBSCRIBE,
            "subscribe",
            pb.CommandSubscribe(request_id=1, consumer_id=7, topic="t", subscription="s"),
        )
        assert subscribed.type == T.SUCCESS
        monkeypatch.setattr(brk.subscriptions, "ack_positions", _bug)
        acked = await raw.request(
            T.ACK, "ack", pb.CommandAck(consumer_id=7, request_id=2, ranges=[0, 0, 0, 0])
        )
        assert acked.type == T.ACK_RESPONSE
        assert acked.ack_response.error == pb.UNKNOWN_ERROR
        assert "KeyError" in acked.ack_response.message
        assert len(_logged_bugs(caplog)) == 1
        # ... while an ACK of a consumer that is not there still is CONSUMER_NOT_FOUND,
        # a refusal, not logged.
        unknown = await raw.request(
            T.ACK, "ack", pb.CommandAck(consumer_id=99, request_id=3, ranges=[0, 0, 0, 0])
        )
        assert unknown.ack_response.error == pb.CONSUMER_NOT_FOUND
        assert len(_logged_bugs(caplog)) == 1

        # A synchronous handler (LOOKUP) that hits one: an ERROR for its request.
        monkeypatch.setattr(brk.security, "allow_lookup", _bug)
        looked = await raw.request(
            T.LOOKUP, "lookup", pb.CommandLookupTopic(request_id=4, topic="t")
        )
        assert looked.type == T.ERROR
        assert (looked.error.request_id, looked.error.error) == (4, pb.UNKNOWN_ERROR)
        assert len(_logged_bugs(caplog)) == 2

        # A refusal raised by a synchronous handler keeps its code.
        refused = await raw.request(
            T.END_TXN_ON_PARTITION,
            "end_txn_on_partition",
            pb.CommandEndTxnOnPartition(request_id=5, partition=pb.PartitionRef(topic="t")),
        )
        assert refused.txn_response.error == pb.AUTHORIZATION_ERROR  # (no cluster role)
        assert len(_logged_bugs(caplog)) == 2

    # Through the client: creating a producer (its topic's metadata) hits a bug.
    async with serving(tmp_path / "again") as (brk, url):
        monkeypatch.setattr(brk.topics, "get_or_create", _bug)
        monkeypatch.setattr(brk.topics, "partition_count", _bug)
        async with Client(url) as client:
            with pytest.raises(errors.UnknownServerError, match="KeyError") as info:
                await client.create_producer("fresh")
        assert info.value.code == pb.UNKNOWN_ERROR and not info.value.retriable
        assert _logged_bugs(caplog)


def test_client_errors_have_one_parent_but_two_that_are_also_builtins() -> None:
    """Each client class has one txnbuf parent. Two carry a built-in second
    parent, a promise of the client's API (``except ValueError`` catches bad
    input, ``except TimeoutError`` a timeout); a built-in carries no code, so
    no code depends on the order of parents (`client.errors` maps codes
    through its one registry, `for_code`)."""
    also_builtin = {
        errors.InvalidInputError: ValueError,
        errors.OperationTimeoutError: TimeoutError,
    }
    for cls in [errors.TxnbufError, *_subclasses(errors.TxnbufError)]:
        if cls in also_builtin:
            assert cls.__bases__ == (errors.TxnbufError, also_builtin[cls]), cls
            assert not hasattr(also_builtin[cls], "code")
            assert cls.code == cls.__dict__["code"]  # (its own, not a parent's)
        else:
            assert len(cls.__bases__) == 1, cls
