"""The server's refusals: one exception class per wire error code.

Each subclass of `Refusal` sets ``code``, a `txnbuf_pb2.ServerError` value,
and is named after it (``INVALID_ARGUMENT`` -> `InvalidArgument`); no two
set the same code, and every code but ``UNKNOWN_ERROR`` has its class. The
server packages raise these (or their own subclasses of them, which inherit
the code: ``tc.TxnNotFoundError`` is a `TransactionNotFound`), and the broker
answers a refusal with its ``code`` (`broker._errors.error_code`). Anything
else a request raises is answered ``UNKNOWN_ERROR`` and logged: it is a bug.

They live here, on the floor every server package stands on, because a code
is raised by several packages that cannot import each other (``tc``,
``buffer``, ``subscriptions`` and ``broker`` all refuse INVALID_ARGUMENT).
The client maps the same codes onto its own classes (`client.errors`).
"""

from __future__ import annotations

from typing import ClassVar

from proto import txnbuf_pb2 as pb

__all__ = [
    "AuthenticationError",
    "AuthorizationError",
    "ConcurrentTransactions",
    "ConsumerBusy",
    "ConsumerNotFound",
    "InvalidArgument",
    "InvalidProducerEpoch",
    "InvalidProducerIdMapping",
    "InvalidTopicName",
    "InvalidTransactionTimeout",
    "InvalidTxnState",
    "InvalidTxnStatus",
    "MalformedFrame",
    "NotAllowed",
    "NotOwner",
    "OutOfOrderSequence",
    "PersistenceError",
    "ProducerBusy",
    "ProducerFenced",
    "ProducerNotFound",
    "Refusal",
    "SequenceTooOld",
    "ServiceNotReady",
    "SubscriptionTypeMismatch",
    "TooManyRequests",
    "TopicNotFound",
    "TransactionAbortable",
    "TransactionConflict",
    "TransactionCoordinatorNotFound",
    "TransactionNotFound",
    "TransactionTimeout",
    "UnknownCommand",
    "UnknownMessageId",
]


class Refusal(Exception):
    """A request the server refuses; nothing changed. Raise a subclass:
    ``code`` is its `ServerError` value, the message says what was wrong."""

    code: ClassVar[pb.ServerError]


class MalformedFrame(Refusal):
    """The frame (or a batch inside it) is not what its command says."""

    code = pb.MALFORMED_FRAME


class UnknownCommand(Refusal):
    """A command type this broker does not serve."""

    code = pb.UNKNOWN_COMMAND


class InvalidTopicName(Refusal):
    code = pb.INVALID_TOPIC_NAME


class InvalidArgument(Refusal):
    """A field is missing or out of range."""

    code = pb.INVALID_ARGUMENT


class PersistenceError(Refusal):
    """The storage failed (the ledger's `LedgerError` is answered so)."""

    code = pb.PERSISTENCE_ERROR


class ServiceNotReady(Refusal):
    """Starting or stopping."""

    code = pb.SERVICE_NOT_READY


class ProducerNotFound(Refusal):
    code = pb.PRODUCER_NOT_FOUND


class ConsumerNotFound(Refusal):
    code = pb.CONSUMER_NOT_FOUND


class ProducerBusy(Refusal):
    """A producer with this name is connected to the topic."""

    code = pb.PRODUCER_BUSY


class ConsumerBusy(Refusal):
    """The exclusive subscription has a consumer already."""

    code = pb.CONSUMER_BUSY


class SubscriptionTypeMismatch(Refusal):
    code = pb.SUBSCRIPTION_TYPE_MISMATCH


class UnknownMessageId(Refusal):
    """An acknowledgement of a message this subscription never had."""

    code = pb.UNKNOWN_MESSAGE_ID


class NotAllowed(Refusal):
    """Not allowed in this state (a cumulative ack on a shared subscription, ...)."""

    code = pb.NOT_ALLOWED


class SequenceTooOld(Refusal):
    """A duplicate send too old to answer with its message id (it is stored)."""

    code = pb.SEQUENCE_TOO_OLD


class TopicNotFound(Refusal):
    code = pb.TOPIC_NOT_FOUND


class TooManyRequests(Refusal):
    code = pb.TOO_MANY_REQUESTS


class AuthenticationError(Refusal):
    """No credentials, or credentials that do not hold."""

    code = pb.AUTHENTICATION_ERROR


class AuthorizationError(Refusal):
    """The role lacks the permission the message names."""

    code = pb.AUTHORIZATION_ERROR


class NotOwner(Refusal):
    """A command on a topic, coordinator or broker-wide record whose slot
    this broker does not own (a cluster): retriable at the slot's owner.
    The message names the slot and, when known, its owner's URLs, in a form
    a lookup can read: ``slot 12 is owned by broker-b at http://b:6650``."""

    code = pb.NOT_OWNER

    def __init__(self, message: str, slot: int = -1, owner_urls: str = "") -> None:
        super().__init__(message)
        self.slot = slot
        self.owner_urls = owner_urls


class TransactionConflict(Refusal):
    """Another transaction holds the message (PENDING_ACK), or it is gone."""

    code = pb.TRANSACTION_CONFLICT


class TransactionNotFound(Refusal):
    code = pb.TRANSACTION_NOT_FOUND


class InvalidTxnStatus(Refusal):
    """The transaction is not in a state that allows the operation."""

    code = pb.INVALID_TXN_STATUS


class TransactionTimeout(Refusal):
    """The transaction timed out (and was aborted)."""

    code = pb.TRANSACTION_TIMEOUT


class ProducerFenced(Refusal):
    """A newer instance of the transactional producer bumped the epoch."""

    code = pb.PRODUCER_FENCED


class TransactionCoordinatorNotFound(Refusal):
    code = pb.TRANSACTION_COORDINATOR_NOT_FOUND


class InvalidTxnState(Refusal):
    """The producer-epoch mode: not allowed in the transaction's state."""

    code = pb.INVALID_TXN_STATE


class OutOfOrderSequence(Refusal):
    """A sequence gap, or a new epoch not starting at 0."""

    code = pb.OUT_OF_ORDER_SEQUENCE


class TransactionAbortable(Refusal):
    """The transaction was aborted: abort it and go on."""

    code = pb.TRANSACTION_ABORTABLE


class InvalidProducerIdMapping(Refusal):
    """An unknown producer id (never issued, or expired)."""

    code = pb.INVALID_PRODUCER_ID_MAPPING


class InvalidProducerEpoch(Refusal):
    """An epoch this producer id does not hold now."""

    code = pb.INVALID_PRODUCER_EPOCH


class ConcurrentTransactions(Refusal):
    """The previous transaction (or initialization) is still ending."""

    code = pb.CONCURRENT_TRANSACTIONS


class InvalidTransactionTimeout(Refusal):
    code = pb.INVALID_TRANSACTION_TIMEOUT
