"""Subscriptions: cursors, the message state table, dispatch and redelivery.

PIP-31's PENDING_ACK state and the pending-ack log join this package with
transactions (issue 3).
"""

from subscriptions._cursor import WHOLE_ENTRY, Cursor
from subscriptions._manager import Subscriptions
from subscriptions._state import TRANSITIONS, AckEvent, InvalidAckTransition, MsgState, transition
from subscriptions._subscription import Consumer, PartitionSubscription, SubscriptionError, SubType

__all__ = [
    "TRANSITIONS",
    "WHOLE_ENTRY",
    "AckEvent",
    "Consumer",
    "Cursor",
    "InvalidAckTransition",
    "MsgState",
    "PartitionSubscription",
    "SubType",
    "SubscriptionError",
    "Subscriptions",
    "transition",
]
