"""The message states of a subscription, as one table (PIP-31 §PENDING_ACK State).

Every message of a subscription is PENDING (to be delivered and acked),
PENDING_ACK (acknowledged inside a transaction that has not ended yet: locked,
never delivered, acked or redelivered by anyone until the transaction ends)
or DELETED (acknowledged; never delivered again).

    (PENDING,     ACK)        -> DELETED
    (DELETED,     ACK)        -> DELETED      acks are idempotent
    (PENDING_ACK, ACK)        -> PENDING_ACK  a normal ack of a locked message is dropped
    (PENDING,     TXN_ACK)    -> PENDING_ACK
    (PENDING_ACK, TXN_COMMIT) -> DELETED
    (PENDING_ACK, TXN_ABORT)  -> PENDING      delivered again

There is no row for TXN_ACK on PENDING_ACK or DELETED: a second transaction
acking a locked or deleted message is a conflict (the client aborts it). A
transaction re-sending its own ack of a message it holds is a retry, which
the cursor recognises before it consults this table.

`transition(state, event)` is the only way a state changes, live and in
recovery (the shape of txnbuf's three state tables, see `tc._status`); an
event that has no row raises `InvalidAckTransition` and changes nothing.
"""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "AckEvent", "InvalidAckTransition", "MsgState", "transition"]


class MsgState(enum.StrEnum):
    PENDING = "PENDING"
    PENDING_ACK = "PENDING_ACK"
    DELETED = "DELETED"


class AckEvent(enum.StrEnum):
    ACK = "ACK"  # individual or cumulative acknowledgement, outside a transaction
    TXN_ACK = "TXN_ACK"  # acknowledgement inside a transaction
    TXN_COMMIT = "TXN_COMMIT"  # the transaction holding the message committed
    TXN_ABORT = "TXN_ABORT"  # the transaction holding the message aborted


class InvalidAckTransition(Exception):
    """No transition for this (state, event): the event is refused."""

    def __init__(self, state: MsgState, event: AckEvent) -> None:
        super().__init__(f"cannot apply {event.value} to a message in state {state.value}")
        self.state = state
        self.event = event


TRANSITIONS: dict[tuple[MsgState, AckEvent], MsgState] = {
    (MsgState.PENDING, AckEvent.ACK): MsgState.DELETED,
    # Acks are idempotent: a client re-sends those it had no answer for.
    (MsgState.DELETED, AckEvent.ACK): MsgState.DELETED,
    # A locked message cannot be deleted by a normal ack: the ack is dropped
    # (PIP-31: there is no guarantee on a normal ack anyway).
    (MsgState.PENDING_ACK, AckEvent.ACK): MsgState.PENDING_ACK,
    (MsgState.PENDING, AckEvent.TXN_ACK): MsgState.PENDING_ACK,
    (MsgState.PENDING_ACK, AckEvent.TXN_COMMIT): MsgState.DELETED,
    (MsgState.PENDING_ACK, AckEvent.TXN_ABORT): MsgState.PENDING,
}


def transition(state: MsgState, event: AckEvent) -> MsgState:
    """The state after ``event``; raises `InvalidAckTransition` if there is none."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidAckTransition(state, event) from None
