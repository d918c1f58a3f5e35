"""A transaction's states on one partition: the table itself, then each state
reached on a real transaction buffer, where every refused request changes nothing."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from conftest import Crash

from broker._errors import error_code, wire_code
from buffer import (
    CommitMarker,
    PartitionTxnEvent,
    PartitionTxnState,
    Topics,
    TransactionBuffer,
    TransactionBufferError,
    TxnConflictError,
    TxnEndedError,
)
from buffer._txnstate import TRANSITIONS, InvalidPartitionTxnTransition, step, transition
from ledger import LedgerStore
from proto import txnbuf_pb2 as pb
from proto import wire_txnid

S, E = PartitionTxnState, PartitionTxnEvent
TXN = wire_txnid(1 << 48 | 1, 7)

# The table written out again: each row is a promise the code keeps.
ROWS = {
    (S.OPEN, E.SEND): S.OPEN,
    (S.OPEN, E.DATA): S.OPEN,
    (S.OPEN, E.COMMIT): S.ENDING_COMMIT,
    (S.OPEN, E.ABORT): S.ENDING_ABORT,
    (S.OPEN, E.MARKER): S.MARKED,
    (S.OPEN, E.COMMIT_RECORD): S.COMMITTED,
    (S.OPEN, E.ABORT_RECORD): S.ABORTED,
    (S.ENDING_COMMIT, E.DATA): S.ENDING_COMMIT,
    (S.ENDING_COMMIT, E.COMMIT): S.ENDING_COMMIT,
    (S.ENDING_COMMIT, E.MARKER): S.MARKED,
    (S.ENDING_COMMIT, E.COMMIT_RECORD): S.COMMITTED,
    (S.MARKED, E.DATA): S.MARKED,
    (S.MARKED, E.COMMIT): S.MARKED,
    (S.MARKED, E.COMMIT_RECORD): S.COMMITTED,
    (S.ENDING_ABORT, E.DATA): S.ENDING_ABORT,
    (S.ENDING_ABORT, E.ABORT): S.ENDING_ABORT,
    (S.ENDING_ABORT, E.ABORT_RECORD): S.ABORTED,
    (S.COMMITTED, E.COMMIT): S.COMMITTED,
    (S.ABORTED, E.ABORT): S.ABORTED,
}
PAIRS = [(s, e) for s in S for e in E]


def test_the_table_is_exactly_its_rows() -> None:
    assert TRANSITIONS == ROWS


@pytest.mark.parametrize(("state", "event"), list(ROWS), ids=str)
def test_every_allowed_transition(state: PartitionTxnState, event: PartitionTxnEvent) -> None:
    assert transition(state, event) is ROWS[(state, event)]
    assert step(TXN, state, event) is ROWS[(state, event)]


@pytest.mark.parametrize(
    ("state", "event"), [p for p in PAIRS if p not in ROWS], ids=lambda v: str(v)
)
def test_every_other_pair_is_refused_with_its_error(
    state: PartitionTxnState, event: PartitionTxnEvent
) -> None:
    with pytest.raises(InvalidPartitionTxnTransition) as no_row:
        transition(state, event)
    assert (no_row.value.state, no_row.value.event) == (state, event)
    with pytest.raises(TransactionBufferError) as refused:
        step(TXN, state, event)
    error = refused.value
    if event is E.SEND:
        assert type(error) is TxnEndedError
        assert "late write" in str(error)
    elif event in (E.COMMIT, E.ABORT):
        assert type(error) is TxnConflictError
        assert f"cannot {event.value} transaction (281474976710657,7)" in str(error)
    else:  # a durable record the table refuses: the logs are damaged, not a refusal
        assert type(error) is TransactionBufferError
        assert wire_code(error) is None
    if type(error) is not TransactionBufferError:
        assert error_code(error) == pb.INVALID_TXN_STATUS


def test_only_the_in_between_states_say_which_end_has_begun() -> None:
    with pytest.raises(TxnEndedError, match=r"ending \(commit\)"):
        step(TXN, S.MARKED, E.SEND)
    with pytest.raises(TxnEndedError, match="already aborted"):
        step(TXN, S.ABORTED, E.SEND)
    with pytest.raises(TxnConflictError, match="its abort has begun"):
        step(TXN, S.ENDING_ABORT, E.COMMIT)
    with pytest.raises(TxnConflictError, match="it is committed"):
        step(TXN, S.COMMITTED, E.ABORT)


# -- each state on a real transaction buffer ---------------------------------------


@pytest.fixture
async def tb(tmp_path: Path) -> AsyncIterator[TransactionBuffer]:
    store = await LedgerStore.open(tmp_path / "broker.db")
    try:
        part = (await (await Topics.load(store)).create("t", 1)).partitions[0]
        yield await part.txn_buffer()
    finally:
        await store.close()


def send(tb: TransactionBuffer, seq: int) -> Awaitable[object]:
    return tb.publish(TXN, "p", [pb.SingleMessage(payload=b"m", sequence_id=seq)])


async def to_open(tb: TransactionBuffer) -> None:
    await send(tb, 0)


async def to_ending_commit(tb: TransactionBuffer) -> None:
    await send(tb, 0)
    assert tb.end_early(TXN, commit=True)  # queued, not durable


async def to_marked(tb: TransactionBuffer) -> None:
    await send(tb, 0)
    with pytest.raises(
        Crash
    ):  # (armed by `reach`) the marker is durable, its TXN_COMMIT never queued
        await tb.end(TXN, commit=True)


async def to_ending_abort(tb: TransactionBuffer) -> None:
    await send(tb, 0)
    assert tb.end_early(TXN, commit=False)


async def to_committed(tb: TransactionBuffer) -> None:
    await send(tb, 0)
    await tb.end(TXN, commit=True)
    await tb.settled()


async def to_aborted(tb: TransactionBuffer) -> None:
    await send(tb, 0)
    await tb.end(TXN, commit=False)


REACH: dict[PartitionTxnState, Callable[[TransactionBuffer], Awaitable[None]]] = {
    S.OPEN: to_open,
    S.ENDING_COMMIT: to_ending_commit,
    S.MARKED: to_marked,
    S.ENDING_ABORT: to_ending_abort,
    S.COMMITTED: to_committed,
    S.ABORTED: to_aborted,
}
REQUESTS = (E.SEND, E.COMMIT, E.ABORT)


async def reach(tb: TransactionBuffer, crash_at: list[str], state: PartitionTxnState) -> None:
    """Bring `TXN` into ``state`` on ``tb``."""
    if state is S.MARKED:
        crash_at.append("buffer.after_commit_marker")
    await REACH[state](tb)
    info = tb.status(TXN)
    assert info is not None and info.state is state


def request(tb: TransactionBuffer, event: PartitionTxnEvent) -> Awaitable[object]:
    """Make the request ``event`` of `TXN`; raises at once if it is refused."""
    if event is E.SEND:
        return send(tb, 1)
    tb.end_early(TXN, commit=event is E.COMMIT)  # (the checks of `end`, in this turn)
    return asyncio.sleep(0)


@pytest.mark.parametrize(
    ("state", "event"), [(s, e) for s in S for e in REQUESTS if (s, e) not in ROWS], ids=str
)
async def test_a_refused_request_changes_nothing(
    tb: TransactionBuffer,
    crash_at: list[str],
    state: PartitionTxnState,
    event: PartitionTxnEvent,
) -> None:
    await reach(tb, crash_at, state)
    info = tb.status(TXN)
    queued = tb.sidecar.next_entry_id, tb.partition_ledger.next_entry_id

    with pytest.raises(TxnEndedError if event is E.SEND else TxnConflictError):
        request(tb, event)
    assert tb.status(TXN) == info
    assert (tb.sidecar.next_entry_id, tb.partition_ledger.next_entry_id) == queued


@pytest.mark.parametrize(
    ("state", "event"), [(s, e) for s in S for e in REQUESTS if (s, e) in ROWS], ids=str
)
async def test_an_allowed_request_moves_the_state_as_the_table_says(
    tb: TransactionBuffer,
    crash_at: list[str],
    state: PartitionTxnState,
    event: PartitionTxnEvent,
) -> None:
    await reach(tb, crash_at, state)
    pending = request(tb, event)
    info = tb.status(TXN)
    assert info is not None and info.state is ROWS[(state, event)]
    await pending


async def test_a_second_commit_marker_is_refused_and_changes_nothing(
    tb: TransactionBuffer, crash_at: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A durable record the table refuses (here a second marker of a MARKED
    transaction) is logged and leaves the index as it was."""
    await reach(tb, crash_at, S.MARKED)
    before = tb.status(TXN)
    assert before is not None and before.state is S.MARKED and before.marker == 0
    forged = CommitMarker(TXN, before.entries, before.count)
    with caplog.at_level(logging.ERROR, logger="buffer._txnbuffer"):
        assert await tb.partition_ledger.append(*forged.encode()) == 1
    assert tb.status(TXN) == before
    assert "commit marker 1 ignored" in caplog.text
    await tb.end(TXN, commit=True)  # the retry completes it with the first marker
    await tb.settled()
    after = tb.status(TXN)
    assert after is not None and (after.state, after.marker) == (S.COMMITTED, 0)
