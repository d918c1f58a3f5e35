"""The status of a transaction, as one table (PIP-31 §TxnStatus).

    OPEN --COMMIT--> COMMITTING --FINISH--> COMMITTED
    OPEN --COMMIT_LOCAL-------------------> COMMITTED
    OPEN --ABORT---> ABORTING ----FINISH--> ABORTED
    OPEN --TIMEOUT-> ABORTING
    OPEN --PREPARE-> PREPARED --COMMIT--> COMMITTING
                     PREPARED --ABORT---> ABORTING
                     PREPARED --TIMEOUT-> ABORTING  (only with a prepared timeout)

COMMITTING / ABORTING are logged before any participant is told: from that
record on the outcome is decided and survives any crash. FINISH is logged
once every participant has answered. COMMIT_LOCAL is a local transaction's
commit (docs/architecture.md): its writes and this one record share one
group commit, so the record is both the decision and the end, and there is
nobody to tell. PREPARED (two-phase commit, KIP-939):
every write of the transaction is durable and it waits for a decision made
elsewhere; it survives a restart (an OPEN one is aborted) and times out
only if it was opened with a prepared timeout (a sink's transaction, whose
job may die before it decides). `transition` is the only way a status
changes; the log stores (expected, new) pairs, which `check_update` checks
against the same table on replay.

The three state tables of txnbuf (this one, a transaction on one partition
in `buffer._txnstate`, a message of a subscription in `subscriptions._state`)
have one shape: states and events are `enum.StrEnum`, the table is a dict
``(state, event) -> state``, and ``transition(state, event)`` returns the
next state or raises the table's error (here `InvalidTxnStatusError`, the
refusal itself), changing nothing.
"""

from __future__ import annotations

import enum

from proto import txnbuf_pb2 as pb

__all__ = [
    "TRANSITIONS",
    "InvalidTxnStatusError",
    "TxnEvent",
    "TxnStatus",
    "check_update",
    "status_of",
    "transition",
    "wire_status",
]


class TxnStatus(enum.StrEnum):
    """A str underneath: hashed in C (the transition table is looked up by
    (status, event) on every update). The log holds its TxnStatusValue
    (`wire_status`, `status_of`)."""

    OPEN = "OPEN"
    COMMITTING = "COMMITTING"
    COMMITTED = "COMMITTED"
    ABORTING = "ABORTING"
    ABORTED = "ABORTED"
    PREPARED = "PREPARED"

    @property
    def ended(self) -> bool:
        return self in (TxnStatus.COMMITTED, TxnStatus.ABORTED)


class TxnEvent(enum.StrEnum):
    COMMIT = "COMMIT"
    COMMIT_LOCAL = "COMMIT_LOCAL"  # a local transaction: its writes and outcome in one record
    ABORT = "ABORT"
    TIMEOUT = "TIMEOUT"
    FINISH = "FINISH"  # every participant has answered
    PREPARE = "PREPARE"  # every write is durable; the decision is made elsewhere (2PC)


class InvalidTxnStatusError(Exception):
    """No transition for (status, event); nothing changed."""

    def __init__(self, status: TxnStatus, event: TxnEvent | str) -> None:
        what = event.value if isinstance(event, TxnEvent) else event
        super().__init__(f"cannot {what} a transaction that is {status.name}")
        self.status = self.state = status
        self.event = event


TRANSITIONS: dict[tuple[TxnStatus, TxnEvent], TxnStatus] = {
    (TxnStatus.OPEN, TxnEvent.COMMIT): TxnStatus.COMMITTING,
    (TxnStatus.OPEN, TxnEvent.COMMIT_LOCAL): TxnStatus.COMMITTED,
    (TxnStatus.OPEN, TxnEvent.ABORT): TxnStatus.ABORTING,
    (TxnStatus.OPEN, TxnEvent.TIMEOUT): TxnStatus.ABORTING,
    (TxnStatus.OPEN, TxnEvent.PREPARE): TxnStatus.PREPARED,
    (TxnStatus.PREPARED, TxnEvent.COMMIT): TxnStatus.COMMITTING,
    (TxnStatus.PREPARED, TxnEvent.ABORT): TxnStatus.ABORTING,
    (TxnStatus.PREPARED, TxnEvent.TIMEOUT): TxnStatus.ABORTING,
    (TxnStatus.COMMITTING, TxnEvent.FINISH): TxnStatus.COMMITTED,
    (TxnStatus.ABORTING, TxnEvent.FINISH): TxnStatus.ABORTED,
}

_UPDATES = {(before, after) for (before, _), after in TRANSITIONS.items()}


def transition(status: TxnStatus, event: TxnEvent) -> TxnStatus:
    """The status after ``event``; raises `InvalidTxnStatusError` if there is none."""
    try:
        return TRANSITIONS[(status, event)]
    except KeyError:
        raise InvalidTxnStatusError(status, event) from None


_WIRE: dict[TxnStatus, pb.TxnStatusValue] = {
    status: pb.TxnStatusValue.Value(status.value)  # type: ignore[misc]
    for status in TxnStatus
}
_BY_VALUE = tuple(sorted(TxnStatus, key=_WIRE.__getitem__))


def wire_status(status: TxnStatus) -> pb.TxnStatusValue:
    """The log's TxnStatusValue of ``status``."""
    return _WIRE[status]


def status_of(value: int) -> TxnStatus:
    """The status logged as ``value`` (a TxnStatusValue; a tuple lookup: a
    record read back is applied on every update)."""
    if 0 <= value < len(_BY_VALUE):
        return _BY_VALUE[value]
    raise ValueError(f"{value} is not a transaction status")


def check_update(expected: TxnStatus, new: TxnStatus) -> TxnStatus:
    """Check a logged (expected -> new) update against the table; returns ``new``."""
    if (expected, new) not in _UPDATES:
        raise InvalidTxnStatusError(expected, f"move to {new.name}")
    return new
