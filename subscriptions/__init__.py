"""Subscriptions: cursors, the message state table, dispatch and redelivery.

PIP-31's PENDING_ACK state: an acknowledgement inside a transaction locks its
messages until `Subscriptions.end_txn` commits (DELETED) or aborts (PENDING,
redelivered) them; the locks are records of the cursor ledger. A transaction
is a `proto.TxnID`.
What a subscription refuses it raises as `proto.refusals` classes
(NOT_ALLOWED, TRANSACTION_CONFLICT, UNKNOWN_MESSAGE_ID, ...).
"""

from subscriptions._cursor import (
    WHOLE_ENTRY,
    AckConflict,
    Cursor,
    replay_cursor,
    txn_end_record,
)
from subscriptions._manager import Subscriptions
from subscriptions._state import TRANSITIONS, AckEvent, InvalidAckTransition, MsgState, transition
from subscriptions._subscription import Consumer, PartitionSubscription, SubType

__all__ = [
    "TRANSITIONS",
    "WHOLE_ENTRY",
    "AckConflict",
    "AckEvent",
    "Consumer",
    "Cursor",
    "InvalidAckTransition",
    "MsgState",
    "PartitionSubscription",
    "SubType",
    "Subscriptions",
    "replay_cursor",
    "transition",
    "txn_end_record",
]
