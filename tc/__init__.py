"""The transaction coordinator (PIP-31 §Transaction Coordinator).

`TransactionCoordinator` issues `TxnID`s, logs each transaction's status
(`TxnStatus`, one table in `tc._status`), times transactions out, and ends
them on every participant through the `Participant` interface. What it
knows is a `TxnTable` (`tc._table`, no I/O), rebuilt on start from its log
(`tc._log`).
"""

from tc._coordinator import (
    NotStuckError,
    Participant,
    StuckParticipant,
    TransactionCoordinator,
)
from tc._status import (
    TRANSITIONS,
    InvalidTxnStatusError,
    TxnEvent,
    TxnStatus,
    check_update,
    transition,
)
from tc._table import TxnMeta, TxnNotFoundError, TxnTable, TxnTimeoutError
from tc._txnid import TxnID, wire_txnid

__all__ = [
    "TRANSITIONS",
    "InvalidTxnStatusError",
    "NotStuckError",
    "Participant",
    "StuckParticipant",
    "TransactionCoordinator",
    "TxnEvent",
    "TxnID",
    "TxnMeta",
    "TxnNotFoundError",
    "TxnStatus",
    "TxnTable",
    "TxnTimeoutError",
    "check_update",
    "transition",
    "wire_txnid",
]
