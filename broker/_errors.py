"""Exceptions -> wire error codes: the one edge where an error answer is made.

A request the server refuses raises an exception that says what was wrong
and changes nothing: a `proto.refusals.Refusal` (one class per wire code,
raised where no package of its own has a word for it) or an error of the
package that refused (`tc`, `buffer`), each class with one parent. The
broker answers each with the code of the one table `WIRE_CODES` (as httpx
maps httpcore's exceptions with ``HTTPCORE_EXC_MAP``): the code of the
nearest class of the exception's own line of parents in the table (single
inheritance: one line, no order to get wrong). A `ledger.LedgerError` (the
storage floor knows no wire codes) is answered PERSISTENCE_ERROR; in a
cluster broker's process (`cluster_store_failures`), a store out of service
(`ledger.LedgerFailedError`: failed, fenced or closed) is answered the
retriable NOT_OWNER instead (the broker drops its slots, reopens the store
and joins again: the request succeeds at the slot's owner). Anything
else is a bug: it is answered UNKNOWN_ERROR and logged here, with its
traceback. Every place that answers an error (`broker._connection`,
`broker._transactions`, `broker._epoch`, `broker._groups`, `broker._reader`,
`broker._admin`, `broker.kafka`) goes through `error_code` and
`error_text`; one that answers a refusal itself catches `REFUSALS`.

The tree (each class has one parent; its code is its own row of the table,
or its nearest parent's)::

    Exception
    ├── proto.refusals.Refusal                        code: its ServerError value
    │   └── MalformedFrame, InvalidArgument, ...      one class per code (`proto.refusals`)
    ├── ValueError
    │   ├── buffer.InvalidNameError                   INVALID_ARGUMENT (a name)
    │   │   └── buffer.InvalidTopicNameError          INVALID_TOPIC_NAME
    │   ├── buffer.SendRejectedError                  INVALID_ARGUMENT (a malformed send)
    │   │   └── buffer.MalformedSendError             MALFORMED_FRAME (not an EntryBatch)
    │   ├── buffer.PartitionCountError                INVALID_ARGUMENT
    │   ├── buffer.RetentionError                     INVALID_ARGUMENT
    │   └── tc.TxnArgumentError                       INVALID_ARGUMENT (a timeout, tag, group)
    ├── LookupError
    │   ├── tc.TxnNotFoundError                       TRANSACTION_NOT_FOUND
    │   └── tc.NotStuckError                          (not a refusal: UNKNOWN_ERROR)
    ├── buffer.DuplicateTooOldError                   SEQUENCE_TOO_OLD
    ├── tc.InvalidTxnStatusError                      INVALID_TXN_STATUS
    │   └── tc.TxnTimeoutError                        TRANSACTION_TIMEOUT
    ├── tc.ProducerEpochError                         (the producer-epoch mode's)
    │   ├── tc.ProducerFencedError                    PRODUCER_FENCED
    │   ├── tc.InvalidProducerEpochError              INVALID_PRODUCER_EPOCH
    │   ├── tc.InvalidTxnStateError                   INVALID_TXN_STATE
    │   ├── tc.TransactionAbortableError              TRANSACTION_ABORTABLE
    │   ├── tc.InvalidPidMappingError                 INVALID_PRODUCER_ID_MAPPING
    │   ├── tc.ConcurrentTransactionsError            CONCURRENT_TRANSACTIONS
    │   ├── tc.InvalidTransactionTimeoutError         INVALID_TRANSACTION_TIMEOUT
    │   └── tc.TwoPhaseCommitNotAllowedError          AUTHORIZATION_ERROR
    ├── buffer.TransactionBufferError                 (itself: a damaged log, UNKNOWN_ERROR)
    │   ├── buffer.TxnEndedError                      INVALID_TXN_STATUS (a late write)
    │   ├── buffer.TxnConflictError                   INVALID_TXN_STATUS
    │   ├── buffer.StaleEpochError                    INVALID_PRODUCER_EPOCH
    │   └── buffer.OutOfOrderSequenceError            OUT_OF_ORDER_SEQUENCE
    ├── ledger.LedgerError                            PERSISTENCE_ERROR
    │   └── ledger.LedgerFailedError                  (in a cluster: NOT_OWNER)
    └── anything else (KeyError, ...)                 UNKNOWN_ERROR, logged with its traceback

The Kafka listener answers a Kafka client with Kafka's code for the same
refusal: `kafka_code`, through the one table `KAFKA_CODES`.
"""

from __future__ import annotations

import logging

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
    TxnConflictError,
    TxnEndedError,
)
from ledger import LedgerError, LedgerFailedError
from proto import refusals
from proto import txnbuf_pb2 as pb
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
    TxnArgumentError,
    TxnNotFoundError,
    TxnTimeoutError,
)

__all__ = [
    "KAFKA_CODES",
    "REFUSALS",
    "WIRE_CODES",
    "cluster_store_failures",
    "error_code",
    "error_text",
    "kafka_code",
    "wire_code",
]

log = logging.getLogger(__name__)

_REFUSAL_CODES: dict[type[BaseException], pb.ServerError] = {
    cls: cls.code
    for cls in (getattr(refusals, name) for name in refusals.__all__)
    if cls is not refusals.Refusal
}

# What a request's refusal is answered with: the wire's own refusals carry
# their code; the packages' errors are mapped here, each class once.
WIRE_CODES: dict[type[BaseException], pb.ServerError] = {
    **_REFUSAL_CODES,
    # tc
    InvalidTxnStatusError: pb.INVALID_TXN_STATUS,
    TxnTimeoutError: pb.TRANSACTION_TIMEOUT,
    TxnNotFoundError: pb.TRANSACTION_NOT_FOUND,
    TxnArgumentError: pb.INVALID_ARGUMENT,
    ProducerFencedError: pb.PRODUCER_FENCED,
    InvalidProducerEpochError: pb.INVALID_PRODUCER_EPOCH,
    InvalidTxnStateError: pb.INVALID_TXN_STATE,
    TransactionAbortableError: pb.TRANSACTION_ABORTABLE,
    InvalidPidMappingError: pb.INVALID_PRODUCER_ID_MAPPING,
    ConcurrentTransactionsError: pb.CONCURRENT_TRANSACTIONS,
    InvalidTransactionTimeoutError: pb.INVALID_TRANSACTION_TIMEOUT,
    TwoPhaseCommitNotAllowedError: pb.AUTHORIZATION_ERROR,
    # buffer
    InvalidNameError: pb.INVALID_ARGUMENT,
    InvalidTopicNameError: pb.INVALID_TOPIC_NAME,
    SendRejectedError: pb.INVALID_ARGUMENT,
    MalformedSendError: pb.MALFORMED_FRAME,
    PartitionCountError: pb.INVALID_ARGUMENT,
    RetentionError: pb.INVALID_ARGUMENT,
    DuplicateTooOldError: pb.SEQUENCE_TOO_OLD,
    TxnEndedError: pb.INVALID_TXN_STATUS,
    TxnConflictError: pb.INVALID_TXN_STATUS,
    StaleEpochError: pb.INVALID_PRODUCER_EPOCH,
    OutOfOrderSequenceError: pb.OUT_OF_ORDER_SEQUENCE,
    # ledger: the storage failed (not a refusal: nothing is wrong with the request)
    LedgerError: pb.PERSISTENCE_ERROR,
}

# The classes of a request's refusals (for ``except REFUSALS``: a handler
# that answers a refusal in its own answer).
REFUSALS: tuple[type[BaseException], ...] = tuple(c for c in WIRE_CODES if c is not LedgerError)


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
    pb.NOT_OWNER: 6,  # NOT_LEADER_OR_FOLLOWER (retriable: refresh metadata)
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


# Set by `cluster_store_failures` (a cluster broker's process).
_store_failed_code = pb.PERSISTENCE_ERROR
_STORE_FAILED_HINT = (
    "; this broker drops its slots and joins the cluster again: try again at the slot's owner"
)


def cluster_store_failures() -> None:
    """This process runs a cluster broker (`broker._cluster`): a store out
    of service is not the end of the slots it served. The broker drops
    everything and reopens its store (a fenced write, a commit whose
    outcome is unknown, a PostgreSQL primary gone until its standby is
    promoted), and each slot is served again, here or by another broker. So
    a request answered with `ledger.LedgerFailedError` is answered the
    retriable NOT_OWNER: the client looks the owner up and sends again (a
    send is deduplicated, an ack is idempotent; an END_TXN's outcome stays
    unknown to it, as for any NOT_OWNER). A single broker's failed store
    is fail-stop until it is restarted: PERSISTENCE_ERROR, as before."""
    global _store_failed_code
    _store_failed_code = pb.NOT_OWNER


def wire_code(exc: BaseException) -> pb.ServerError | None:
    """The code `WIRE_CODES` answers ``exc`` with (None: not a refusal)."""
    if isinstance(exc, LedgerFailedError):
        return _store_failed_code
    for cls in type(exc).__mro__:
        code = WIRE_CODES.get(cls)
        if code is not None:
            return code
    return None


def error_code(exc: BaseException, what: str = "a request") -> pb.ServerError:
    """The `ServerError` code that tells a client what went wrong: a
    refusal's (`WIRE_CODES`), PERSISTENCE_ERROR for the storage; for
    anything else UNKNOWN_ERROR, and ``exc`` is logged with its traceback
    (``what`` failed: the connection and the request, for the log)."""
    code = wire_code(exc)
    if code is not None:
        return code
    log.error("%s failed (answered UNKNOWN_ERROR)", what, exc_info=exc)
    return pb.UNKNOWN_ERROR


def error_text(exc: BaseException) -> str:
    """The message of an error answer: a refusal's says what was wrong; an
    unexpected error's names its type (the broker's log has the rest)."""
    code = wire_code(exc)
    if code == pb.NOT_OWNER and isinstance(exc, LedgerFailedError):
        return f"{exc}{_STORE_FAILED_HINT}"
    if code is not None:
        return str(exc) or type(exc).__name__
    return f"internal error: {type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def kafka_code(exc: BaseException, what: str = "a Kafka request") -> int:
    """The Kafka error code that tells a Kafka client what went wrong."""
    return KAFKA_CODES.get(error_code(exc, what), -1)
