"""The message states of a subscription, as one table (PIP-31 §Acknowledgements).

Every message of a subscription is PENDING (to be delivered and acked) or
DELETED (acknowledged; never delivered again). PIP-31 adds PENDING_ACK for
acknowledgements inside a transaction (issue 3) as new rows of this table:
(PENDING, TXN_ACK) -> PENDING_ACK, (PENDING_ACK, COMMIT) -> DELETED,
(PENDING_ACK, ABORT) -> PENDING.

`transition` is the only way a state changes, live and in recovery; an
event that has no row raises `InvalidAckTransition` and changes nothing.
"""

from __future__ import annotations

import enum

__all__ = ["TRANSITIONS", "AckEvent", "InvalidAckTransition", "MsgState", "transition"]


class MsgState(enum.Enum):
    PENDING = "PENDING"
    DELETED = "DELETED"


class AckEvent(enum.Enum):
    ACK = "ACK"  # individual or cumulative acknowledgement


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
}


def transition(state: MsgState, event: AckEvent) -> MsgState:
    """The state after ``event``; raises `InvalidAckTransition` if there is none."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidAckTransition(state, event) from None
