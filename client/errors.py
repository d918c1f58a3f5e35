"""Everything the txnbuf client raises.

Every exception carries ``code`` and ``retriable``. ``code`` is the wire
``ServerError`` number (``proto/txnbuf.proto``, below 1000) for an error the
broker answered with, and a client-side code (1000 and above, never on the
wire; `CLIENT_CODES` names them) for an error the client detects itself.
The two bases, ``TxnbufError`` and ``ServerError``, are never raised
themselves (their ``code`` is None). ``retriable`` is True when the same
operation may succeed if tried again. Retry logic looks only at
``retriable``. ``fatal`` (the producer-epoch mode): the transactional
producer can do nothing more; create a new one (Kafka's "application
recoverable" errors, KIP-1050).

The tree::

    TxnbufError
    ├── InvalidInputError (also ValueError)      1000 bad argument; nothing was sent
    │   └── MessageTooBigError                    1001 a message over max_message_size
    ├── ClosedError                               1010
    │   ├── ClientClosedError                     1011
    │   ├── ProducerClosedError                   1012
    │   └── ConsumerClosedError                   1013
    ├── OperationTimeoutError (also TimeoutError) 1020 retriable
    ├── ProducerQueueFullError                    1021 retriable
    ├── BrokerConnectionError                     1030 retriable
    │   └── ConnectionLostError                   1031 retriable
    ├── ProtocolError                             1040 the broker broke the protocol
    └── ServerError                               one subclass per wire code
        ├── UnknownServerError                    UNKNOWN_ERROR and unknown codes
        ├── MalformedFrameError                   MALFORMED_FRAME
        ├── UnknownCommandError                   UNKNOWN_COMMAND
        ├── InvalidTopicNameError                 INVALID_TOPIC_NAME
        ├── InvalidArgumentError                  INVALID_ARGUMENT
        ├── PersistenceError                      PERSISTENCE_ERROR, retriable
        ├── ServiceNotReadyError                  SERVICE_NOT_READY, retriable
        ├── ProducerNotFoundError                 PRODUCER_NOT_FOUND
        ├── ConsumerNotFoundError                 CONSUMER_NOT_FOUND
        ├── ProducerBusyError                     PRODUCER_BUSY
        ├── ConsumerBusyError                     CONSUMER_BUSY
        ├── SubscriptionTypeMismatchError         SUBSCRIPTION_TYPE_MISMATCH
        ├── UnknownMessageIdError                 UNKNOWN_MESSAGE_ID
        ├── NotAllowedError                       NOT_ALLOWED
        ├── SequenceTooOldError                   SEQUENCE_TOO_OLD
        ├── TopicNotFoundError                    TOPIC_NOT_FOUND
        ├── TooManyRequestsError                  TOO_MANY_REQUESTS, retriable
        ├── AuthenticationError                   AUTHENTICATION_ERROR
        ├── AuthorizationError                    AUTHORIZATION_ERROR
        ├── NotOwnerError                         NOT_OWNER, retriable
        ├── TransactionConflictError              TRANSACTION_CONFLICT
        ├── TransactionNotFoundError              TRANSACTION_NOT_FOUND
        ├── InvalidTxnStatusError                 INVALID_TXN_STATUS
        ├── TransactionTimeoutError               TRANSACTION_TIMEOUT
        ├── ProducerFencedError                   PRODUCER_FENCED, fatal
        ├── TransactionCoordinatorNotFoundError   TRANSACTION_COORDINATOR_NOT_FOUND
        ├── InvalidTxnStateError                  INVALID_TXN_STATE
        ├── OutOfOrderSequenceError               OUT_OF_ORDER_SEQUENCE
        ├── TransactionAbortableError             TRANSACTION_ABORTABLE
        ├── InvalidPidMappingError                INVALID_PRODUCER_ID_MAPPING, fatal
        ├── InvalidProducerEpochError             INVALID_PRODUCER_EPOCH
        ├── ConcurrentTransactionsError           CONCURRENT_TRANSACTIONS, retriable
        └── InvalidTransactionTimeoutError        INVALID_TRANSACTION_TIMEOUT

``for_code(code)`` turns a wire code into its class (``UnknownServerError``
for a code this client does not know); ``from_wire(code, message)`` builds
the exception. The registry is built from the subclasses of ``ServerError``
that set ``code`` (each code once), so adding a code means adding one class
here.

Each class has one txnbuf parent. ``InvalidInputError`` and
``OperationTimeoutError`` also have a built-in one (``ValueError``,
``TimeoutError``): a promise of the client's API, so that ``except
ValueError`` and ``except TimeoutError`` catch them. The built-ins carry no
``code``, so no code depends on the order of parents.

Foreign exceptions (aiohttp, OSError, protobuf) never escape the client: they
are translated in ``client/_foreign.py`` and chained with ``raise ... from``.
"""

from __future__ import annotations

from proto import txnbuf_pb2 as pb

__all__ = [
    "CLIENT_CODES",
    "AuthenticationError",
    "AuthorizationError",
    "BrokerConnectionError",
    "ClientClosedError",
    "ClosedError",
    "ConcurrentTransactionsError",
    "ConnectionLostError",
    "ConsumerBusyError",
    "ConsumerClosedError",
    "ConsumerNotFoundError",
    "InvalidArgumentError",
    "InvalidInputError",
    "InvalidPidMappingError",
    "InvalidProducerEpochError",
    "InvalidTopicNameError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "InvalidTxnStatusError",
    "MalformedFrameError",
    "MessageTooBigError",
    "NotAllowedError",
    "NotOwnerError",
    "OperationTimeoutError",
    "OutOfOrderSequenceError",
    "PersistenceError",
    "ProducerBusyError",
    "ProducerClosedError",
    "ProducerFencedError",
    "ProducerNotFoundError",
    "ProducerQueueFullError",
    "ProtocolError",
    "SequenceTooOldError",
    "ServerError",
    "ServiceNotReadyError",
    "SubscriptionTypeMismatchError",
    "TooManyRequestsError",
    "TopicNotFoundError",
    "TransactionAbortableError",
    "TransactionConflictError",
    "TransactionCoordinatorNotFoundError",
    "TransactionNotFoundError",
    "TransactionTimeoutError",
    "TxnbufError",
    "UnknownCommandError",
    "UnknownMessageIdError",
    "UnknownServerError",
    "for_code",
    "from_wire",
]


class TxnbufError(Exception):
    """Base class of every exception the txnbuf client raises."""

    code: int | None = None
    retriable: bool = False
    fatal: bool = False


# --- errors the client detects itself ------------------------------------
# Their codes: 1000 and above, apart from the wire's (which stay below 1000).

INVALID_INPUT = 1000
MESSAGE_TOO_BIG = 1001
CLOSED = 1010
CLIENT_CLOSED = 1011
PRODUCER_CLOSED = 1012
CONSUMER_CLOSED = 1013
OPERATION_TIMEOUT = 1020
PRODUCER_QUEUE_FULL = 1021
BROKER_CONNECTION = 1030
CONNECTION_LOST = 1031
PROTOCOL_ERROR = 1040

CLIENT_CODES: dict[int, str] = {
    INVALID_INPUT: "INVALID_INPUT",
    MESSAGE_TOO_BIG: "MESSAGE_TOO_BIG",
    CLOSED: "CLOSED",
    CLIENT_CLOSED: "CLIENT_CLOSED",
    PRODUCER_CLOSED: "PRODUCER_CLOSED",
    CONSUMER_CLOSED: "CONSUMER_CLOSED",
    OPERATION_TIMEOUT: "OPERATION_TIMEOUT",
    PRODUCER_QUEUE_FULL: "PRODUCER_QUEUE_FULL",
    BROKER_CONNECTION: "BROKER_CONNECTION",
    CONNECTION_LOST: "CONNECTION_LOST",
    PROTOCOL_ERROR: "PROTOCOL_ERROR",
}


class InvalidInputError(TxnbufError, ValueError):
    """An argument was wrong; the message names it. Nothing was sent."""

    code = INVALID_INPUT


class MessageTooBigError(InvalidInputError):
    """A message is over ``max_message_size`` (the broker's, 5 MiB: the
    bytes of the encoded message, payload, key and properties). Messages
    are not chunked: nothing was sent."""

    code = MESSAGE_TOO_BIG


class ClosedError(TxnbufError):
    """The object was closed (by the application or after a fatal error)."""

    code = CLOSED


class ClientClosedError(ClosedError):
    """The Client was closed; create a new one."""

    code = CLIENT_CLOSED


class ProducerClosedError(ClosedError):
    """The Producer was closed; ``__cause__`` holds the reason if it was not
    closed by the application."""

    code = PRODUCER_CLOSED


class ConsumerClosedError(ClosedError):
    """The Consumer was closed; ``__cause__`` holds the reason if it was not
    closed by the application."""

    code = CONSUMER_CLOSED


class OperationTimeoutError(TxnbufError, TimeoutError):
    """The operation did not finish within its time limit (the client's
    ``operation_timeout``, or the ``timeout`` given to ``receive``). The
    outcome of a timed-out send is unknown: it may have been stored."""

    code = OPERATION_TIMEOUT

    retriable = True


class ProducerQueueFullError(TxnbufError):
    """``Producer.send_nowait`` found the producer's pending-message bound
    reached; ``await Producer.send`` waits for room instead."""

    code = PRODUCER_QUEUE_FULL

    retriable = True


class BrokerConnectionError(TxnbufError):
    """The broker could not be reached."""

    code = BROKER_CONNECTION

    retriable = True


class ConnectionLostError(BrokerConnectionError):
    """The connection dropped while the request was in flight."""

    code = CONNECTION_LOST

    retriable = True


class ProtocolError(TxnbufError):
    """The broker sent something this client cannot understand."""

    code = PROTOCOL_ERROR


# --- errors the broker reports (one class per wire code) ------------------


class ServerError(TxnbufError):
    """An error the broker answered with; ``code`` is its ``ServerError``
    number in ``proto/txnbuf.proto``."""


class UnknownServerError(ServerError):
    """UNKNOWN_ERROR, or a code this client does not know (``code`` then
    holds the number received)."""

    code = pb.UNKNOWN_ERROR


class MalformedFrameError(ServerError):
    """The broker could not parse a frame the client sent."""

    code = pb.MALFORMED_FRAME


class UnknownCommandError(ServerError):
    """The broker does not serve this command type."""

    code = pb.UNKNOWN_COMMAND


class InvalidTopicNameError(ServerError):
    code = pb.INVALID_TOPIC_NAME


class InvalidArgumentError(ServerError):
    """A field was missing or out of range (as judged by the broker)."""

    code = pb.INVALID_ARGUMENT


class PersistenceError(ServerError):
    """The broker's storage failed."""

    code = pb.PERSISTENCE_ERROR
    retriable = True


class ServiceNotReadyError(ServerError):
    """The broker is starting or stopping."""

    code = pb.SERVICE_NOT_READY
    retriable = True


class ProducerNotFoundError(ServerError):
    code = pb.PRODUCER_NOT_FOUND


class ConsumerNotFoundError(ServerError):
    code = pb.CONSUMER_NOT_FOUND


class ProducerBusyError(ServerError):
    """A producer with this name is already connected."""

    code = pb.PRODUCER_BUSY


class ConsumerBusyError(ServerError):
    """The exclusive subscription already has a consumer."""

    code = pb.CONSUMER_BUSY


class SubscriptionTypeMismatchError(ServerError):
    code = pb.SUBSCRIPTION_TYPE_MISMATCH


class UnknownMessageIdError(ServerError):
    """An ack named a message this subscription never had."""

    code = pb.UNKNOWN_MESSAGE_ID


class NotAllowedError(ServerError):
    """E.g. a cumulative ack on a shared subscription."""

    code = pb.NOT_ALLOWED


class SequenceTooOldError(ServerError):
    """The send was a duplicate of a message already stored, too old for the
    broker to answer with its message id. The message IS stored."""

    code = pb.SEQUENCE_TOO_OLD


class TopicNotFoundError(ServerError):
    code = pb.TOPIC_NOT_FOUND


class TooManyRequestsError(ServerError):
    code = pb.TOO_MANY_REQUESTS
    retriable = True


class AuthenticationError(ServerError):
    """No credentials, or credentials the broker does not accept."""

    code = pb.AUTHENTICATION_ERROR


class AuthorizationError(ServerError):
    """The connection's role lacks the permission the message names; nothing changed."""

    code = pb.AUTHORIZATION_ERROR


class NotOwnerError(ServerError):
    """A cluster's broker that does not own the slot of the topic or
    coordinator asked for (the message names the slot, and its owner's URL
    when the broker knows it): retriable at the owner."""

    code = pb.NOT_OWNER
    retriable = True


class TransactionConflictError(ServerError):
    """Another transaction holds the message (PENDING_ACK); abort this one."""

    code = pb.TRANSACTION_CONFLICT


class TransactionNotFoundError(ServerError):
    code = pb.TRANSACTION_NOT_FOUND


class InvalidTxnStatusError(ServerError):
    """The transaction is not in a state that allows the operation."""

    code = pb.INVALID_TXN_STATUS


class TransactionTimeoutError(ServerError):
    """The coordinator expired (aborted) the transaction."""

    code = pb.TRANSACTION_TIMEOUT


class ProducerFencedError(ServerError):
    """A newer instance of this transactional producer bumped the epoch;
    fatal: this one can do nothing more."""

    code = pb.PRODUCER_FENCED
    fatal = True


class InvalidTxnStateError(ServerError):
    """The producer-epoch mode: not allowed in the transaction's state (a
    send after prepare_transaction, prepare without enable_2pc, a send
    after init_transactions(keep_prepared_txn=True), ...)."""

    code = pb.INVALID_TXN_STATE


class OutOfOrderSequenceError(ServerError):
    """The producer-epoch mode: a send's sequence is not the next one the
    partition expects (a lost send); abort the transaction."""

    code = pb.OUT_OF_ORDER_SEQUENCE


class TransactionAbortableError(ServerError):
    """The producer-epoch mode: the transaction was aborted (its timeout, a
    broker restart, an operator); abort_transaction() and begin the next."""

    code = pb.TRANSACTION_ABORTABLE


class InvalidPidMappingError(ServerError):
    """The producer-epoch mode: the broker does not know the producer id
    (its transactional id expired); fatal: create a new producer (KIP-890)."""

    code = pb.INVALID_PRODUCER_ID_MAPPING
    fatal = True


class InvalidProducerEpochError(ServerError):
    """The producer-epoch mode: an epoch the producer id does not hold now
    (a late write of an ended transaction)."""

    code = pb.INVALID_PRODUCER_EPOCH


class ConcurrentTransactionsError(ServerError):
    """The producer-epoch mode: the transactional id's previous transaction
    or initialization is still under way."""

    code = pb.CONCURRENT_TRANSACTIONS
    retriable = True


class InvalidTransactionTimeoutError(ServerError):
    """The producer-epoch mode: a transaction timeout out of range."""

    code = pb.INVALID_TRANSACTION_TIMEOUT


class TransactionCoordinatorNotFoundError(ServerError):
    code = pb.TRANSACTION_COORDINATOR_NOT_FOUND


def _build_registry() -> dict[int, type[ServerError]]:
    registry: dict[int, type[ServerError]] = {}
    todo: list[type[ServerError]] = [ServerError]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        code = cls.__dict__.get("code")
        if code is None:
            continue
        if code in registry:
            raise RuntimeError(f"wire code {code} is mapped twice: {registry[code]} and {cls}")
        registry[code] = cls
    return registry


_REGISTRY = _build_registry()


def for_code(code: int) -> type[ServerError]:
    """The exception class for a wire ``ServerError`` code."""
    return _REGISTRY.get(code, UnknownServerError)


def from_wire(code: int, message: str = "") -> ServerError:
    """The exception for an error answer: its class from ``for_code``, its
    text the code's name and the broker's message."""
    cls = for_code(code)
    try:
        name = pb.ServerError.Name(code)
    except ValueError:
        name = f"server error {code}"
    exc = cls(f"{name}: {message}" if message else name)
    if code != cls.code:
        exc.code = code
    return exc
