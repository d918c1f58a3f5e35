"""A transaction's state on one partition, as one table, and the transaction buffer's errors.

PIP-31 §Transaction Index keeps each transaction's status on a partition:

    OPEN --COMMIT--> ENDING_COMMIT --MARKER--> MARKED --COMMIT_RECORD--> COMMITTED
    OPEN --ABORT---> ENDING_ABORT --ABORT_RECORD--> ABORTED

plus the rows of `TRANSITIONS` that keep a state (a send, a record, a
repeated END) and those recovery needs. SEND, COMMIT and ABORT are
requests (a transactional send, an EndTxnOnPartition); DATA, MARKER,
COMMIT_RECORD and ABORT_RECORD are records that became durable (a TXN_DATA
record, the commit marker, the TXN_COMMIT or TXN_ABORT record). The states
in between live in memory only: recovery replays records, not ENDs, so a
restart finds such a transaction OPEN (its coordinator ends it again), or
MARKED when its marker is durable (recovery completes it with the
TXN_COMMIT record). A MARKED transaction is committed for readers: its
marker is in the partition.

`transition(state, event)` is the only way a state changes, live and in
recovery (the shape of txnbuf's three state tables, see `tc._status`); a
pair without a row raises `InvalidPartitionTxnTransition` and changes
nothing. The transaction buffer moves a transaction through `step`, which
refuses such a pair with the error its event calls for, naming the
transaction: a SEND with `TxnEndedError` (a late write), a COMMIT or ABORT
with `TxnConflictError`, a record with `TransactionBufferError` (the logs
contradict each other).
"""

from __future__ import annotations

import enum

from proto import TxnID, txn_text

__all__ = [
    "TRANSITIONS",
    "InvalidPartitionTxnTransition",
    "OutOfOrderSequenceError",
    "PartitionTxnEvent",
    "PartitionTxnState",
    "StaleEpochError",
    "TransactionBufferError",
    "TxnConflictError",
    "TxnEndedError",
    "step",
    "transition",
]


class TransactionBufferError(Exception):
    """Base of the transaction buffer's errors. Raised itself, a damaged
    sidecar log or partition log (a malformed record, a marker naming what
    is not there): not a refusal, so a client is answered UNKNOWN_ERROR and
    the broker logs it. Its subclasses are refusals, each with the code the
    broker answers it with (`broker._errors.WIRE_CODES`)::

        TransactionBufferError
        ├── TxnEndedError            INVALID_TXN_STATUS: a send for a transaction
        │                            ended (or ending) here: a late write
        ├── TxnConflictError         INVALID_TXN_STATUS: COMMIT of a transaction
        │                            aborted (or aborting) here, or the reverse
        ├── StaleEpochError          INVALID_PRODUCER_EPOCH
        └── OutOfOrderSequenceError  OUT_OF_ORDER_SEQUENCE
    """


class TxnEndedError(TransactionBufferError):
    """A transactional send arrived after its transaction's END began here; nothing stored."""


class TxnConflictError(TransactionBufferError):
    """An END contradicts how the transaction ended (or is ending) here."""


class StaleEpochError(TransactionBufferError):
    """The producer-epoch mode: a send or a commit marker of an epoch (or a
    coordinator epoch) older than this partition has seen for its producer
    id: a late write, or a marker of a finished transaction."""


class OutOfOrderSequenceError(TransactionBufferError):
    """The producer-epoch mode: a send whose first sequence is not the next
    one of its producer here (a gap, or a new epoch not starting at 0)."""


class PartitionTxnState(enum.StrEnum):
    """A transaction's state on one partition. (StrEnum, not Enum: hashed
    in C, where Enum's hash is a Python call; the table is looked up a few
    times per transaction.)"""

    OPEN = "open"
    ENDING_COMMIT = "ending_commit"  # COMMIT has begun: sends refused, no marker durable
    MARKED = "marked"  # its commit marker is durable, its TXN_COMMIT record is not
    ENDING_ABORT = "ending_abort"  # ABORT has begun: sends refused
    COMMITTED = "committed"  # its TXN_COMMIT record is durable
    ABORTED = "aborted"  # its TXN_ABORT record is durable


class PartitionTxnEvent(enum.StrEnum):
    """What happens to a transaction on one partition (see the table)."""

    SEND = "send"
    DATA = "data"
    COMMIT = "commit"
    ABORT = "abort"
    MARKER = "marker"
    COMMIT_RECORD = "commit record"
    ABORT_RECORD = "abort record"


_S, _E = PartitionTxnState, PartitionTxnEvent

TRANSITIONS: dict[tuple[PartitionTxnState, PartitionTxnEvent], PartitionTxnState] = {
    (_S.OPEN, _E.SEND): _S.OPEN,
    (_S.OPEN, _E.DATA): _S.OPEN,
    (_S.OPEN, _E.COMMIT): _S.ENDING_COMMIT,
    (_S.OPEN, _E.ABORT): _S.ENDING_ABORT,
    (_S.OPEN, _E.MARKER): _S.MARKED,  # (recovery, as the next two)
    (_S.OPEN, _E.COMMIT_RECORD): _S.COMMITTED,
    (_S.OPEN, _E.ABORT_RECORD): _S.ABORTED,
    (_S.ENDING_COMMIT, _E.DATA): _S.ENDING_COMMIT,  # a send queued before the END
    (_S.ENDING_COMMIT, _E.COMMIT): _S.ENDING_COMMIT,  # a retried END
    (_S.ENDING_COMMIT, _E.MARKER): _S.MARKED,
    (_S.ENDING_COMMIT, _E.COMMIT_RECORD): _S.COMMITTED,  # it wrote nothing here: no marker
    (_S.MARKED, _E.DATA): _S.MARKED,  # applied after the marker of its group commit
    (_S.MARKED, _E.COMMIT): _S.MARKED,
    (_S.MARKED, _E.COMMIT_RECORD): _S.COMMITTED,
    (_S.ENDING_ABORT, _E.DATA): _S.ENDING_ABORT,
    (_S.ENDING_ABORT, _E.ABORT): _S.ENDING_ABORT,
    (_S.ENDING_ABORT, _E.ABORT_RECORD): _S.ABORTED,
    (_S.COMMITTED, _E.COMMIT): _S.COMMITTED,  # repeated ENDs are answered
    (_S.ABORTED, _E.ABORT): _S.ABORTED,
}

# The END under way in each in-between state (for refusals).
_ENDING = {_S.ENDING_COMMIT: "commit", _S.MARKED: "commit", _S.ENDING_ABORT: "abort"}


class InvalidPartitionTxnTransition(Exception):
    """No transition for (state, event): the event is refused."""

    def __init__(self, state: PartitionTxnState, event: PartitionTxnEvent) -> None:
        super().__init__(f"cannot apply {event.value} to a transaction that is {state.value}")
        self.state = state
        self.event = event


def transition(state: PartitionTxnState, event: PartitionTxnEvent) -> PartitionTxnState:
    """The state after ``event``; raises `InvalidPartitionTxnTransition` if there is none."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise InvalidPartitionTxnTransition(state, event) from None


def step(txn: TxnID, state: PartitionTxnState, event: PartitionTxnEvent) -> PartitionTxnState:
    """`transition` of transaction ``txn``; refuses a pair without a row
    with the error its event calls for (see the module), naming ``txn``."""
    try:
        return transition(state, event)
    except InvalidPartitionTxnTransition:
        raise _refusal(txn, state, event) from None


def _refusal(
    txn: TxnID, state: PartitionTxnState, event: PartitionTxnEvent
) -> TransactionBufferError:
    ending = _ENDING.get(state)
    if event is _E.SEND:
        where = f"ending ({ending})" if ending else f"already {state.value}"
        return TxnEndedError(
            f"transaction {txn_text(txn)} is {where} on this partition: a late write is refused"
        )
    if event is _E.COMMIT or event is _E.ABORT:
        why = f"its {ending} has begun" if ending else f"it is {state.value}"
        return TxnConflictError(
            f"cannot {event.value} transaction {txn_text(txn)}: {why} on this partition"
        )
    return TransactionBufferError(
        f"a {event.value} of transaction {txn_text(txn)}, which is {state.value} on this partition"
    )
