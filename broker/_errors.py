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

__all__ = ["PRODUCER_EPOCH_CODES", "BrokerError", "error_code", "error_text"]


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
