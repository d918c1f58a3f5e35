"""Exceptions -> wire error codes: the one edge where an error answer is made.

Every refusal the server packages raise is a `proto.refusals.Refusal` and
carries its code: `error_code` answers with it. A `ledger.LedgerError` (the
storage floor knows no wire codes) is answered PERSISTENCE_ERROR. Anything
else is a bug: it is answered UNKNOWN_ERROR and logged here, with its
traceback. Every place that answers an error (`broker._connection`,
`broker._transactions`, `broker._epoch`, `broker._groups`, `broker._reader`,
`broker.kafka`) goes through `error_code` and `error_text`.

The tree (a package's own class inherits its code from the `refusals`
class it names; ``(also X)``: callers may catch it as the built-in X)::

    Exception
    ├── proto.refusals.Refusal                        code: its ServerError value
    │   ├── MalformedFrame                            MALFORMED_FRAME
    │   ├── UnknownCommand                            UNKNOWN_COMMAND
    │   ├── InvalidTopicName                          INVALID_TOPIC_NAME
    │   │   └── buffer.InvalidTopicNameError          (also InvalidNameError)
    │   ├── InvalidArgument                           INVALID_ARGUMENT
    │   │   ├── buffer.InvalidNameError               (also ValueError) a name
    │   │   ├── buffer.SendRejectedError              (also ValueError) a malformed send
    │   │   ├── buffer.PartitionCountError            (also ValueError)
    │   │   ├── buffer.RetentionError                 (also ValueError)
    │   │   └── tc.TxnArgumentError                   (also ValueError) a timeout, tag, group
    │   ├── PersistenceError                          PERSISTENCE_ERROR (and ledger.LedgerError)
    │   ├── ServiceNotReady                           SERVICE_NOT_READY
    │   ├── ProducerNotFound                          PRODUCER_NOT_FOUND
    │   ├── ConsumerNotFound                          CONSUMER_NOT_FOUND
    │   ├── ProducerBusy                              PRODUCER_BUSY
    │   ├── ConsumerBusy                              CONSUMER_BUSY
    │   ├── SubscriptionTypeMismatch                  SUBSCRIPTION_TYPE_MISMATCH
    │   ├── UnknownMessageId                          UNKNOWN_MESSAGE_ID
    │   ├── NotAllowed                                NOT_ALLOWED
    │   ├── SequenceTooOld                            SEQUENCE_TOO_OLD
    │   │   └── buffer.DuplicateTooOldError
    │   ├── TopicNotFound                             TOPIC_NOT_FOUND
    │   ├── TooManyRequests                           TOO_MANY_REQUESTS
    │   ├── AuthenticationError                       AUTHENTICATION_ERROR
    │   ├── AuthorizationError                        AUTHORIZATION_ERROR
    │   ├── NotOwner                                  NOT_OWNER (a cluster: the slot is elsewhere)
    │   │   └── tc.TwoPhaseCommitNotAllowedError      (also tc.ProducerEpochError)
    │   ├── TransactionConflict                       TRANSACTION_CONFLICT
    │   ├── TransactionNotFound                       TRANSACTION_NOT_FOUND
    │   │   └── tc.TxnNotFoundError                   (also LookupError)
    │   ├── InvalidTxnStatus                          INVALID_TXN_STATUS
    │   │   ├── tc.InvalidTxnStatusError
    │   │   ├── buffer.TxnEndedError                  (also TransactionBufferError)
    │   │   └── buffer.TxnConflictError               (also TransactionBufferError)
    │   ├── TransactionTimeout                        TRANSACTION_TIMEOUT
    │   │   └── tc.TxnTimeoutError                    (also tc.InvalidTxnStatusError)
    │   ├── ProducerFenced                            PRODUCER_FENCED
    │   │   └── tc.ProducerFencedError                (also tc.ProducerEpochError)
    │   ├── TransactionCoordinatorNotFound            TRANSACTION_COORDINATOR_NOT_FOUND
    │   ├── InvalidTxnState                           INVALID_TXN_STATE
    │   │   └── tc.InvalidTxnStateError               (also tc.ProducerEpochError)
    │   ├── OutOfOrderSequence                        OUT_OF_ORDER_SEQUENCE
    │   │   └── buffer.OutOfOrderSequenceError        (also TransactionBufferError)
    │   ├── TransactionAbortable                      TRANSACTION_ABORTABLE
    │   │   └── tc.TransactionAbortableError          (also tc.ProducerEpochError)
    │   ├── InvalidProducerIdMapping                  INVALID_PRODUCER_ID_MAPPING
    │   │   └── tc.InvalidPidMappingError             (also tc.ProducerEpochError)
    │   ├── InvalidProducerEpoch                      INVALID_PRODUCER_EPOCH
    │   │   ├── tc.InvalidProducerEpochError          (also tc.ProducerEpochError)
    │   │   └── buffer.StaleEpochError                (also TransactionBufferError)
    │   ├── ConcurrentTransactions                    CONCURRENT_TRANSACTIONS
    │   │   └── tc.ConcurrentTransactionsError        (also tc.ProducerEpochError)
    │   └── InvalidTransactionTimeout                 INVALID_TRANSACTION_TIMEOUT
    │       └── tc.InvalidTransactionTimeoutError     (also ProducerEpochError, ValueError)
    ├── ledger.LedgerError                            PERSISTENCE_ERROR
    └── anything else (KeyError, a damaged log's      UNKNOWN_ERROR, logged with
        buffer.TransactionBufferError, ...)           its traceback

The Kafka listener answers a Kafka client with Kafka's code for the same
refusal: `kafka_code`, through the one table `KAFKA_CODES`.
"""

from __future__ import annotations

import logging

from ledger import LedgerError
from proto import txnbuf_pb2 as pb
from proto.refusals import Refusal

__all__ = ["KAFKA_CODES", "error_code", "error_text", "kafka_code"]

log = logging.getLogger(__name__)


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


def error_code(exc: BaseException, what: str = "a request") -> pb.ServerError:
    """The `ServerError` code that tells a client what went wrong: a
    refusal's own, PERSISTENCE_ERROR for the storage; for anything else
    UNKNOWN_ERROR, and ``exc`` is logged with its traceback (``what``
    failed: the connection and the request, for the log)."""
    if isinstance(exc, Refusal):
        return exc.code
    if isinstance(exc, LedgerError):
        return pb.PERSISTENCE_ERROR
    log.error("%s failed (answered UNKNOWN_ERROR)", what, exc_info=exc)
    return pb.UNKNOWN_ERROR


def error_text(exc: BaseException) -> str:
    """The message of an error answer: a refusal's says what was wrong; an
    unexpected error's names its type (the broker's log has the rest)."""
    if isinstance(exc, Refusal | LedgerError):
        return str(exc) or type(exc).__name__
    return f"internal error: {type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def kafka_code(exc: BaseException, what: str = "a Kafka request") -> int:
    """The Kafka error code that tells a Kafka client what went wrong."""
    return KAFKA_CODES.get(error_code(exc, what), -1)
