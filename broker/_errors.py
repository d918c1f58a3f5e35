"""Exceptions of the server packages -> wire error codes, in one place."""

from __future__ import annotations

from buffer import (
    DuplicateTooOldError,
    InvalidNameError,
    OutOfOrderSequenceError,
    PartitionCountError,
    SendRejectedError,
    StaleEpochError,
    TransactionBufferError,
)
from ledger import LedgerError
from proto import txnbuf_pb2 as pb
from subscriptions import SubscriptionError
from tc import (
    ConcurrentTransactionsError,
    InvalidPidMappingError,
    InvalidProducerEpochError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    InvalidTxnStatusError,
    ProducerFencedError,
    TransactionAbortableError,
    TwoPhaseCommitNotAllowedError,
    TxnNotFoundError,
    TxnTimeoutError,
)

__all__ = [
    "KAFKA_CODES",
    "PRODUCER_EPOCH_CODES",
    "BrokerError",
    "error_code",
    "error_text",
    "kafka_code",
]


class BrokerError(Exception):
    """A request the broker refuses; ``code`` names a `ServerError` value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


# The producer-epoch mode's refusals, Kafka's names on both sides: the one
# table a Kafka listener maps onto Kafka's error codes.
PRODUCER_EPOCH_CODES: dict[type[BaseException], pb.ServerError] = {
    ProducerFencedError: pb.PRODUCER_FENCED,
    InvalidProducerEpochError: pb.INVALID_PRODUCER_EPOCH,
    StaleEpochError: pb.INVALID_PRODUCER_EPOCH,
    InvalidTxnStateError: pb.INVALID_TXN_STATE,
    TransactionAbortableError: pb.TRANSACTION_ABORTABLE,
    InvalidPidMappingError: pb.INVALID_PRODUCER_ID_MAPPING,
    ConcurrentTransactionsError: pb.CONCURRENT_TRANSACTIONS,
    InvalidTransactionTimeoutError: pb.INVALID_TRANSACTION_TIMEOUT,
    OutOfOrderSequenceError: pb.OUT_OF_ORDER_SEQUENCE,
    TwoPhaseCommitNotAllowedError: pb.AUTHORIZATION_ERROR,
}


# What a Kafka client is answered for each refusal (Kafka's error codes, see
# `broker.kafka`). A fenced producer is INVALID_PRODUCER_EPOCH, as Kafka
# answers the request versions served there (PRODUCER_FENCED, 90, came with
# later versions, and aiokafka does not know it); TRANSACTION_ABORTABLE
# (KIP-890) is unknown to the clients of EndTxn before v5, so theirs is the
# same: the client gives up on the producer and starts a new one.
KAFKA_CODES: dict[pb.ServerError, int] = {
    pb.UNKNOWN_ERROR: -1,  # UNKNOWN_SERVER_ERROR
    pb.MALFORMED_FRAME: 42,  # INVALID_REQUEST
    pb.UNKNOWN_COMMAND: 35,  # UNSUPPORTED_VERSION
    pb.INVALID_TOPIC_NAME: 17,  # INVALID_TOPIC_EXCEPTION
    pb.INVALID_ARGUMENT: 42,  # INVALID_REQUEST
    pb.PERSISTENCE_ERROR: 56,  # KAFKA_STORAGE_ERROR (retriable)
    pb.SERVICE_NOT_READY: 15,  # COORDINATOR_NOT_AVAILABLE (retriable)
    pb.TOPIC_NOT_FOUND: 3,  # UNKNOWN_TOPIC_OR_PARTITION
    pb.NOT_ALLOWED: 42,  # INVALID_REQUEST
    pb.SEQUENCE_TOO_OLD: 46,  # DUPLICATE_SEQUENCE_NUMBER
    pb.AUTHORIZATION_ERROR: 53,  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    pb.TRANSACTION_CONFLICT: 51,  # CONCURRENT_TRANSACTIONS: another transaction holds it
    pb.TRANSACTION_NOT_FOUND: 48,  # INVALID_TXN_STATE
    pb.INVALID_TXN_STATUS: 48,  # INVALID_TXN_STATE
    pb.TRANSACTION_TIMEOUT: 47,  # INVALID_PRODUCER_EPOCH
    pb.PRODUCER_FENCED: 47,  # INVALID_PRODUCER_EPOCH
    pb.INVALID_TXN_STATE: 48,  # INVALID_TXN_STATE
    pb.OUT_OF_ORDER_SEQUENCE: 45,  # OUT_OF_ORDER_SEQUENCE_NUMBER
    pb.TRANSACTION_ABORTABLE: 47,  # INVALID_PRODUCER_EPOCH
    pb.INVALID_PRODUCER_ID_MAPPING: 49,  # INVALID_PRODUCER_ID_MAPPING
    pb.INVALID_PRODUCER_EPOCH: 47,  # INVALID_PRODUCER_EPOCH
    pb.CONCURRENT_TRANSACTIONS: 51,  # CONCURRENT_TRANSACTIONS (retriable)
    pb.INVALID_TRANSACTION_TIMEOUT: 50,  # INVALID_TRANSACTION_TIMEOUT
}


def kafka_code(exc: BaseException) -> int:
    """The Kafka error code that tells a Kafka client what went wrong."""
    return KAFKA_CODES.get(error_code(exc), -1)


def error_code(exc: BaseException) -> pb.ServerError:
    """The `ServerError` code that tells a client what went wrong."""
    code = PRODUCER_EPOCH_CODES.get(type(exc))
    if code is not None:
        return code
    if isinstance(exc, (SubscriptionError, BrokerError)):
        return pb.ServerError.Value(exc.code)  # type: ignore[return-value]
    if isinstance(exc, InvalidNameError):
        return pb.INVALID_TOPIC_NAME if exc.kind == "topic" else pb.INVALID_ARGUMENT
    if isinstance(exc, DuplicateTooOldError):
        return pb.SEQUENCE_TOO_OLD
    if isinstance(exc, LedgerError):
        return pb.PERSISTENCE_ERROR
    if isinstance(exc, TxnTimeoutError):
        return pb.TRANSACTION_TIMEOUT
    if isinstance(exc, (InvalidTxnStatusError, TransactionBufferError)):
        return pb.INVALID_TXN_STATUS
    if isinstance(exc, TxnNotFoundError):
        return pb.TRANSACTION_NOT_FOUND
    if isinstance(exc, LookupError):
        return pb.CONSUMER_NOT_FOUND
    if isinstance(exc, (SendRejectedError, PartitionCountError, ValueError)):
        return pb.INVALID_ARGUMENT
    return pb.UNKNOWN_ERROR


def error_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
