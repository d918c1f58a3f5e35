"""The transaction coordinator (PIP-31 §Transaction Coordinator).

`TransactionCoordinator` (`tc._coordinator`) issues `TxnID`s, logs each
transaction's status (`TxnStatus`, one table in `tc._status`), times
transactions out, and ends them on every participant through the
`Participant` interface (`tc._participants`: a participant is told a
`TxnEnd`, everything it needs, and never asks back). What it knows is a
`TxnTable` (`tc._table`, no I/O) and, for the producer-epoch mode (Kafka's
transactional producer, `tc._epoch_mode`), a `ProducerRegistry`
(`tc._producers`), both rebuilt on start from its log (`tc._log`). What it
refuses it raises as its own errors, each with one parent
(`InvalidTxnStatusError`, `TxnNotFoundError`, the `ProducerEpochError`
classes, ...); the broker answers each with its wire code from one table
(`broker._errors.WIRE_CODES`).
"""

from proto import TxnID, wire_txnid
from tc._coordinator import TransactionCoordinator
from tc._epoch_mode import ProducerSettings, TwoPhaseCommitNotAllowedError
from tc._log import TxnLog
from tc._participants import (
    CoordinatorMoved,
    NotStuckError,
    Participant,
    ParticipantElsewhere,
    StuckParticipant,
    TxnEnd,
)
from tc._producers import (
    DEFAULT_EXPIRATION_MS,
    MAX_EPOCH,
    MAX_TXN_TIMEOUT_MS,
    ConcurrentTransactionsError,
    InvalidPidMappingError,
    InvalidProducerEpochError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerEntry,
    ProducerEpochError,
    ProducerFencedError,
    ProducerRegistry,
    TransactionAbortableError,
    coordinator_of,
    coordinator_of_producer,
    producer_id,
)
from tc._status import (
    TRANSITIONS,
    InvalidTxnStatusError,
    TxnEvent,
    TxnStatus,
    check_update,
    transition,
)
from tc._table import TxnArgumentError, TxnMeta, TxnNotFoundError, TxnTable, TxnTimeoutError

__all__ = [
    "DEFAULT_EXPIRATION_MS",
    "MAX_EPOCH",
    "MAX_TXN_TIMEOUT_MS",
    "TRANSITIONS",
    "ConcurrentTransactionsError",
    "CoordinatorMoved",
    "InvalidPidMappingError",
    "InvalidProducerEpochError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "InvalidTxnStatusError",
    "NotStuckError",
    "Participant",
    "ParticipantElsewhere",
    "ProducerEntry",
    "ProducerEpochError",
    "ProducerFencedError",
    "ProducerRegistry",
    "ProducerSettings",
    "StuckParticipant",
    "TransactionAbortableError",
    "TransactionCoordinator",
    "TwoPhaseCommitNotAllowedError",
    "TxnArgumentError",
    "TxnEnd",
    "TxnEvent",
    "TxnID",
    "TxnLog",
    "TxnMeta",
    "TxnNotFoundError",
    "TxnStatus",
    "TxnTable",
    "TxnTimeoutError",
    "check_update",
    "coordinator_of",
    "coordinator_of_producer",
    "producer_id",
    "transition",
    "wire_txnid",
]
