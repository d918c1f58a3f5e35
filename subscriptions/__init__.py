"""Subscriptions: cursors, the message state table, PENDING_ACK, dispatch.

A subscription on one partition (`PartitionSubscription`) composes its
acknowledgements (`subscriptions._pending_ack`: the `Cursor` and the ledger
of its records) and its dispatch (`subscriptions._dispatch`: consumers,
permits, redelivery); `Subscriptions` holds a broker's. Every change of a
message's state is a row of one table (`TRANSITIONS`). PIP-31's PENDING_ACK:
an acknowledgement inside a transaction locks its messages until
`Subscriptions.end_txn` commits (DELETED) or aborts (PENDING, redelivered)
them. A transaction is a `proto.TxnID`. What a subscription refuses it
raises as `proto.refusals` classes (NOT_ALLOWED, TRANSACTION_CONFLICT,
UNKNOWN_MESSAGE_ID, ...).
"""

from subscriptions._cursor import (
    WHOLE_ENTRY,
    AckConflict,
    Cursor,
    replay_cursor,
    txn_end_record,
)
from subscriptions._dispatch import Consumer, SubType
from subscriptions._manager import Subscriptions
from subscriptions._state import TRANSITIONS, AckEvent, InvalidAckTransition, MsgState, transition
from subscriptions._subscription import PartitionSubscription, attached

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
    "attached",
    "replay_cursor",
    "transition",
    "txn_end_record",
]
