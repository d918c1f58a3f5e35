"""The transaction coordinator (PIP-31 §Transaction Coordinator).

`TransactionCoordinator` issues `TxnID`s, logs each transaction's status
(`TxnStatus`, one table in `tc._status`) and the partitions and
subscriptions it touches, times transactions out, and ends them on every
participant through the `Participant` interface.
"""

from tc._coordinator import (
    NotStuckError,
    Participant,
    StuckParticipant,
    TransactionCoordinator,
    TxnMeta,
    TxnNotFoundError,
    TxnTimeoutError,
)
from tc._status import (
    TRANSITIONS,
    InvalidTxnStatusError,
    TxnEvent,
    TxnStatus,
    check_update,
    transition,
)
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
    "TxnTimeoutError",
    "check_update",
    "transition",
    "wire_txnid",
]
