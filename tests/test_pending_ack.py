"""PIP-31 transactional acknowledgements: the PENDING_ACK state.

Pure tests of the table rows and of `Cursor` (txn acks, conflicts, retries,
commit, abort, cumulative acks, snapshots, replay == live), then
`PartitionSubscription` and `Subscriptions` on a real LedgerStore: durability
across a reopen, dispatch and redelivery of locked messages, the fault hooks.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

import ledger._store as ledger_store
import subscriptions._pending_ack as pending_ack_module
from buffer import MessageId, Partition, Topics
from ledger import Entry, LedgerStore, faults
from proto import TxnID, refusals
from proto import txnbuf_pb2 as pb
from subscriptions import (
    TRANSITIONS,
    WHOLE_ENTRY,
    AckConflict,
    AckEvent,
    Consumer,
    Cursor,
    InvalidAckTransition,
    MsgState,
    PartitionSubscription,
    Subscriptions,
    SubType,
    transition,
)
from subscriptions._cursor import (
    CUMULATIVE,
    INDIVIDUAL,
    SNAPSHOT,
    TXN_ABORT,
    TXN_ACK,
    TXN_COMMIT,
    AckRecord,
    replay_cursor,
)
from subscriptions._ranges import positions_of
from tests.conftest import until

Position = tuple[int, int]
START: Position = (-1, WHOLE_ENTRY)
P, PA, D = MsgState.PENDING, MsgState.PENDING_ACK, MsgState.DELETED
T1: TxnID = (1 << 48, 1)  # TC 1, counter 1
T2: TxnID = (1 << 48, 2)
BIG: TxnID = ((1 << 64) - 1, (1 << 64) - 1)

# -- the table -----------------------------------------------------------------------

PIP31_ROWS = {
    (P, AckEvent.ACK): D,
    (D, AckEvent.ACK): D,
    (PA, AckEvent.ACK): PA,
    (P, AckEvent.TXN_ACK): PA,
    (PA, AckEvent.TXN_COMMIT): D,
    (PA, AckEvent.TXN_ABORT): P,
}


def test_table_is_exactly_pip31() -> None:
    assert TRANSITIONS == PIP31_ROWS
    assert set(MsgState) == {P, PA, D}
    assert set(AckEvent) == {
        AckEvent.ACK,
        AckEvent.TXN_ACK,
        AckEvent.TXN_COMMIT,
        AckEvent.TXN_ABORT,
    }


@pytest.mark.parametrize(("key", "after"), list(PIP31_ROWS.items()))
def test_each_row(key: tuple[MsgState, AckEvent], after: MsgState) -> None:
    assert transition(*key) is after


@pytest.mark.parametrize(
    ("state", "event"),
    [k for k in itertools.product(MsgState, AckEvent) if k not in PIP31_ROWS],
)
def test_no_row_raises_and_changes_nothing(state: MsgState, event: AckEvent) -> None:
    before = dict(TRANSITIONS)
    with pytest.raises(InvalidAckTransition) as info:
        transition(state, event)
    assert (info.value.state, info.value.event) == (state, event)
    assert TRANSITIONS == before


def test_txn_ack_of_locked_or_deleted_has_no_row() -> None:
    for state in (PA, D):
        with pytest.raises(InvalidAckTransition):
            transition(state, AckEvent.TXN_ACK)


# -- the cursor ------------------------------------------------------------------------

THREES = {e: 3 for e in range(5)}  # entries 0..4 of 3 messages each
LAST = 4


def sizes(counts: dict[int, int]) -> Callable[[int], int]:
    return lambda entry_id: counts.get(entry_id, 0)


COUNT = sizes(THREES)


def apply(
    cursor: Cursor, kind: int, *positions: Position, txn: TxnID | None = None
) -> list[Position]:
    return cursor.apply(kind, list(positions), COUNT, LAST, txn)


def txn_ack(cursor: Cursor, txn: TxnID, *positions: Position) -> list[Position]:
    return apply(cursor, TXN_ACK, *positions, txn=txn)


def held(cursor: Cursor) -> dict[TxnID, set[Position]]:
    """Each transaction's locked positions (its ranges' messages, as sets)."""
    return {t: set(positions_of(rs)) for t, rs in cursor.txn_acks.items()}


def dump(cursor: Cursor) -> tuple[Any, ...]:
    """Everything a cursor holds, its indexes included."""
    return (
        cursor.mark_delete,
        list(cursor.acked),
        dict(cursor.pending_ack),
        held(cursor),
        len(cursor.pending_ack),
    )


def check_invariants(cursor: Cursor) -> None:
    md = cursor.mark_delete
    assert all(p > md for p in cursor.acked)
    mine = held(cursor)
    for pos, txn in cursor.pending_ack.items():
        assert pos > md, "mark-delete moved over a PENDING_ACK message"
        assert pos not in cursor.acked
        assert pos in mine[txn]
    index = {(p, t) for t, ps in mine.items() for p in ps}
    assert index == set(cursor.pending_ack.items())
    assert all(cursor.txn_acks.values())  # no empty index entries
    assert len(cursor.pending_ack) == len(index) == sum(cursor.locks.count(t) for t in mine)
    for e, _ in cursor.pending_ack:
        assert cursor.locks.has_entry(e) and not cursor.all_pending(e)


def test_txn_ack_locks_messages() -> None:
    cursor = Cursor(START)
    assert txn_ack(cursor, T1, (0, 1), (2, 0)) == [(0, 1), (2, 0)]
    assert cursor.state((0, 1)) is PA and cursor.state((2, 0)) is PA
    assert cursor.state((0, 0)) is P
    assert cursor.pending_ack == {(0, 1): T1, (2, 0): T1}
    assert held(cursor) == {T1: {(0, 1), (2, 0)}}
    assert not cursor.acked
    check_invariants(cursor)


def test_mark_delete_never_moves_over_a_locked_message() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (0, 1))
    apply(cursor, INDIVIDUAL, (0, 0), (0, 2), (1, 0))
    assert cursor.mark_delete == (0, 0)  # stops before (0, 1)
    assert list(cursor.acked) == [(0, 2), (1, 0)]
    check_invariants(cursor)


def test_all_pending_sees_locked_messages() -> None:
    cursor = Cursor(START)
    assert cursor.all_pending(1)
    txn_ack(cursor, T1, (1, 2))
    assert not cursor.all_pending(1)
    assert cursor.all_pending(2)
    apply(cursor, TXN_ABORT, txn=T1)
    assert cursor.all_pending(1)


def test_conflict_with_another_transaction_changes_nothing() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (1, 1))
    before = dump(cursor)
    with pytest.raises(AckConflict) as info:
        txn_ack(cursor, T2, (0, 0), (1, 1), (2, 2))  # (0, 0) and (2, 2) are free
    exc = info.value
    assert exc.position == (1, 1) and exc.holder == T1 and exc.txn == T2
    assert (exc.state, exc.event) == (PA, AckEvent.TXN_ACK)
    text = str(exc)
    assert "1:1" in text and f"({T1[0]},{T1[1]})" in text and f"({T2[0]},{T2[1]})" in text
    assert dump(cursor) == before


@pytest.mark.parametrize("deleted", [(0, 0), (0, 2), (3, 1)])
def test_conflict_with_a_deleted_message_changes_nothing(deleted: Position) -> None:
    cursor = Cursor(START)
    apply(cursor, CUMULATIVE, (0, 1))  # below mark-delete: (0, 0), at it: (0, 1)
    apply(cursor, INDIVIDUAL, (0, 2) if deleted != (0, 2) else (3, 1))
    apply(cursor, INDIVIDUAL, deleted)
    before = dump(cursor)
    with pytest.raises(AckConflict) as info:
        txn_ack(cursor, T1, (4, 0), deleted)
    assert info.value.position == deleted
    assert info.value.state is D and info.value.holder is None
    assert "DELETED" in str(info.value)
    assert dump(cursor) == before


def test_same_transaction_retry_is_idempotent() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (1, 0), (1, 1))
    before = dump(cursor)
    assert txn_ack(cursor, T1, (1, 1), (1, 0)) == []
    assert dump(cursor) == before
    # A retry that adds a message locks only the new one.
    assert txn_ack(cursor, T1, (1, 0), (1, 2)) == [(1, 2)]
    assert held(cursor)[T1] == {(1, 0), (1, 1), (1, 2)}
    assert cursor.plan(TXN_ACK, [(1, 0), (1, 2)], COUNT, T1) == []


def test_the_same_position_twice_in_one_txn_record() -> None:
    cursor = Cursor(START)
    assert txn_ack(cursor, T1, (2, 1), (2, 1)) == [(2, 1)]
    assert held(cursor) == {T1: {(2, 1)}}
    check_invariants(cursor)


def test_normal_ack_of_a_locked_message_is_dropped() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (0, 0))
    assert apply(cursor, INDIVIDUAL, (0, 0), (0, 1)) == [(0, 1)]
    assert cursor.state((0, 0)) is PA
    assert cursor.mark_delete == START
    # Aborting: the dropped ack is not resurrected, the message is PENDING.
    assert apply(cursor, TXN_ABORT, txn=T1) == [(0, 0)]
    assert cursor.state((0, 0)) is P
    assert cursor.mark_delete == START
    check_invariants(cursor)


def test_commit_deletes_and_advances_mark_delete() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (0, 0), (0, 2))
    txn_ack(cursor, T2, (1, 0))
    apply(cursor, INDIVIDUAL, (0, 1))
    assert cursor.mark_delete == START
    assert sorted(apply(cursor, TXN_COMMIT, txn=T1)) == [(0, 0), (0, 2)]
    assert cursor.mark_delete == (0, WHOLE_ENTRY)  # stops before T2's (1, 0)
    assert cursor.state((0, 2)) is D
    assert held(cursor) == {T2: {(1, 0)}}
    assert cursor.pending_ack == {(1, 0): T2}
    check_invariants(cursor)
    # Repeating it, or ending an unknown transaction, changes nothing.
    before = dump(cursor)
    assert apply(cursor, TXN_COMMIT, txn=T1) == []
    assert apply(cursor, TXN_ABORT, txn=(9, 9)) == []
    assert dump(cursor) == before


def test_commit_of_the_next_messages_moves_mark_delete_past_them() -> None:
    """The usual consume-transform-produce commit: the transaction holds the
    messages right after mark-delete (whole entries, or a run with a gap)."""
    counts = sizes({0: 3, 1: 3, 2: 3, 3: 3})
    cursor = Cursor(START)
    for pos in [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]:
        cursor.apply(TXN_ACK, [pos], counts, 3, T1)
    cursor.apply(TXN_COMMIT, [], counts, 3, T1)
    assert cursor.mark_delete == (1, 1)  # entry 0 whole, then (1, 0) and (1, 1)
    assert not cursor.acked
    # A run with a gap: (1, 2) and (2, 1) are taken, (2, 0) is not.
    cursor.apply(TXN_ACK, [(1, 2), (2, 1), (2, 2)], counts, 3, T2)
    cursor.apply(TXN_COMMIT, [], counts, 3, T2)
    assert cursor.mark_delete == (1, WHOLE_ENTRY)
    assert list(cursor.acked) == [(2, 1), (2, 2)]
    assert cursor.state((2, 0)) is P
    check_invariants(cursor)
    cursor.apply(INDIVIDUAL, [(2, 0)], counts, 3)
    assert cursor.mark_delete == (2, WHOLE_ENTRY)
    assert not cursor.acked
    # A gap inside the entry: only (3, 0) continues mark-delete.
    cursor.apply(TXN_ACK, [(3, 0), (3, 2)], counts, 3, T1)
    cursor.apply(TXN_COMMIT, [], counts, 3, T1)
    assert cursor.mark_delete == (3, 0)
    assert list(cursor.acked) == [(3, 2)]
    assert cursor.state((3, 1)) is P
    check_invariants(cursor)


def test_commit_of_messages_not_next_to_mark_delete_moves_nothing() -> None:
    counts = sizes({0: 3, 1: 3})
    cursor = Cursor(START)
    cursor.apply(TXN_ACK, [(1, 1), (1, 2)], counts, 1, T1)
    cursor.apply(TXN_COMMIT, [], counts, 1, T1)
    assert cursor.mark_delete == START
    assert list(cursor.acked) == [(1, 1), (1, 2)]
    check_invariants(cursor)


def test_abort_makes_messages_pending_again() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (0, 0), (3, 1))
    assert sorted(apply(cursor, TXN_ABORT, txn=T1)) == [(0, 0), (3, 1)]
    assert cursor.state((0, 0)) is P and cursor.state((3, 1)) is P
    assert cursor.pending_ack == {} and cursor.txn_acks == {}
    assert cursor.mark_delete == START and not cursor.acked
    # Free again: another transaction may take them.
    assert txn_ack(cursor, T2, (0, 0)) == [(0, 0)]
    check_invariants(cursor)


def test_txn_record_without_a_transaction_is_refused() -> None:
    cursor = Cursor(START)
    for kind in (TXN_ACK, TXN_COMMIT, TXN_ABORT):
        with pytest.raises(ValueError):
            apply(cursor, kind, (0, 0))
    with pytest.raises(ValueError):
        apply(cursor, 9, (0, 0))
    assert dump(cursor) == dump(Cursor(START))


def test_cumulative_ack_stops_before_locked_messages() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (1, 1), (3, 0))
    deleted = apply(cursor, CUMULATIVE, (3, 2))
    assert deleted == [
        p for p in itertools.product(range(4), range(3)) if p not in {(1, 1), (3, 0)}
    ]
    assert cursor.mark_delete == (1, 0)  # just before the first locked message
    assert cursor.state((1, 1)) is PA and cursor.state((3, 0)) is PA
    assert all(
        cursor.state((e, i)) is D
        for e in (1, 2, 3)
        for i in range(3)
        if (e, i) not in {(1, 1), (3, 0)}
    )
    assert cursor.state((4, 0)) is P
    check_invariants(cursor)
    # Committing releases the lock: mark-delete reaches the cumulative position.
    apply(cursor, TXN_COMMIT, txn=T1)
    assert cursor.mark_delete == (3, WHOLE_ENTRY)
    assert not cursor.acked and not cursor.pending_ack


def test_cumulative_ack_then_abort_keeps_the_lock_gap() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (2, 0))
    apply(cursor, CUMULATIVE, (2, 2))
    assert cursor.mark_delete == (1, WHOLE_ENTRY)
    assert list(cursor.acked) == [(2, 1), (2, 2)]
    apply(cursor, TXN_ABORT, txn=T1)
    assert cursor.state((2, 0)) is P  # the cumulative ack did not delete it
    apply(cursor, INDIVIDUAL, (2, 0))
    assert cursor.mark_delete == (2, WHOLE_ENTRY)
    check_invariants(cursor)


def test_cumulative_ack_with_a_locked_first_message_keeps_mark_delete() -> None:
    cursor = Cursor((0, WHOLE_ENTRY))
    txn_ack(cursor, T1, (1, 0))
    apply(cursor, CUMULATIVE, (1, 2))
    assert cursor.mark_delete == (0, WHOLE_ENTRY)
    assert list(cursor.acked) == [(1, 1), (1, 2)]
    check_invariants(cursor)


def test_expand_cumulative_names_every_not_deleted_message() -> None:
    cursor = Cursor((0, 0))
    apply(cursor, INDIVIDUAL, (1, 1))
    txn_ack(cursor, T2, (2, 0))
    assert cursor.expand_cumulative((1, 2), COUNT) == [(0, 1), (0, 2), (1, 0), (1, 2)]
    assert cursor.expand_cumulative((2, 1), COUNT)[-3:] == [(1, 2), (2, 0), (2, 1)]
    # The bound is named even when DELETED, so that the table refuses it.
    assert cursor.expand_cumulative((0, 0), COUNT) == [(0, 0)]
    assert cursor.expand_cumulative((1, 1), COUNT) == [(0, 1), (0, 2), (1, 0), (1, 1)]


def test_cumulative_txn_ack_locks_the_range() -> None:
    cursor = Cursor((0, 0))
    apply(cursor, INDIVIDUAL, (1, 1))
    wanted = cursor.expand_cumulative((1, 2), COUNT)
    assert txn_ack(cursor, T1, *wanted) == wanted
    assert set(cursor.pending_ack) == {(0, 1), (0, 2), (1, 0), (1, 2)}
    apply(cursor, TXN_COMMIT, txn=T1)
    assert cursor.mark_delete == (1, WHOLE_ENTRY)


def test_cumulative_txn_ack_over_another_transaction_conflicts() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T2, (1, 0))
    before = dump(cursor)
    with pytest.raises(AckConflict) as info:
        txn_ack(cursor, T1, *cursor.expand_cumulative((2, 0), COUNT))
    assert info.value.position == (1, 0) and info.value.holder == T2
    assert dump(cursor) == before


def test_cumulative_txn_ack_of_a_deleted_bound_conflicts() -> None:
    cursor = Cursor((1, 1))
    with pytest.raises(AckConflict) as info:
        txn_ack(cursor, T1, *cursor.expand_cumulative((1, 0), COUNT))
    assert info.value.position == (1, 0)
    assert not cursor.pending_ack


def test_expand_cumulative_skips_empty_entries() -> None:
    counts = {0: 1, 1: 0, 2: 2}
    cursor = Cursor(START)
    assert cursor.expand_cumulative((2, 0), sizes(counts)) == [(0, 0), (2, 0)]


def test_plan_changes_nothing() -> None:
    cursor = Cursor(START)
    txn_ack(cursor, T1, (0, 0))
    before = dump(cursor)
    assert cursor.plan(TXN_ACK, [(0, 1)], COUNT, T2) == [((0, 1), PA)]
    assert cursor.plan(TXN_COMMIT, [], COUNT, T1) == [((0, 0), D)]
    assert cursor.plan(CUMULATIVE, [(0, 2)], COUNT) == [((0, 1), D), ((0, 2), D)]
    assert dump(cursor) == before


# -- records and snapshots -------------------------------------------------------------


def locked_cursor() -> Cursor:
    cursor = Cursor((5, 1))
    cursor.acked.update([(5, 3), (7, 0)])
    count = sizes({5: 4, 6: 1, 7: 2, 2**40 - 1: WHOLE_ENTRY})
    cursor.apply(TXN_ACK, [(5, 2), (6, 0)], count, 7, T1)
    cursor.apply(TXN_ACK, [(2**40 - 1, WHOLE_ENTRY - 1)], count, 7, BIG)
    return cursor


def test_mark_delete_stays_before_a_locked_message_whatever_count_says() -> None:
    # A count of 0 (e.g. a trimmed entry) must not carry mark-delete over a lock.
    cursor = Cursor((5, 1))
    cursor.apply(TXN_ACK, [(5, 2)], sizes({5: 3}), 9, T1)
    cursor.apply(TXN_ACK, [(7, 0)], sizes({}), 9, T2)
    assert cursor.mark_delete == (5, 1)
    cursor.apply(TXN_COMMIT, [], sizes({5: 3}), 9, T1)
    assert cursor.mark_delete == (6, WHOLE_ENTRY)  # entry 6 is empty, entry 7 is locked
    check_invariants(cursor)


@pytest.mark.parametrize("cursor", [Cursor(START), locked_cursor()])
def test_snapshot_round_trip_with_pending_acks(cursor: Cursor) -> None:
    data = cursor.snapshot()
    record = json.loads(data)
    # (ranges: entry, first, last and the transaction's two halves)
    assert len(record["locked_ranges"]) == 5 * sum(len(r) for r in cursor.txn_acks.values())
    back = Cursor.from_snapshot(data)
    assert dump(back) == dump(cursor)
    assert all(type(p) is tuple for p in back.pending_ack)
    assert all(type(t) is TxnID for t in back.pending_ack.values())
    check_invariants(back)


def test_snapshot_without_pending_acks_loads() -> None:
    back = Cursor.from_snapshot(b'{"md": [3, 1], "acked": [4, 0]}')
    assert back.mark_delete == (3, 1) and list(back.acked) == [(4, 0)]
    assert back.pending_ack == {} and back.txn_acks == {}


def test_a_snapshot_of_positions_one_by_one_loads_as_ranges() -> None:
    """Snapshots written before cursors kept ranges name each position."""
    old = {
        "md": [3, 1],
        "acked": [4, 0, 4, 1, 4, 2, 6, 5],
        "pending_ack": [5, 0, *T1, 5, 1, *T1, 7, 3, *T2],
    }
    back = Cursor.from_snapshot(json.dumps(old).encode())
    assert list(back.acked.ranges()) == [(4, 0, 2), (6, 5, 5)]
    assert back.txn_acks == {T1: [(5, 0, 1)], T2: [(7, 3, 3)]}
    assert dict(back.pending_ack) == {(5, 0): T1, (5, 1): T1, (7, 3): T2}
    again = Cursor.from_snapshot(back.snapshot())
    assert dump(again) == dump(back)


@pytest.mark.parametrize("pending", [[1, 2, 3], [1, 2, 3, 4, 5], [1, 2, -1, 0], [1, 2, 0, 2**64]])
def test_from_snapshot_rejects_a_bad_pending_ack_list(pending: list[int]) -> None:
    data = json.dumps({"md": [0, 0], "acked": [], "pending_ack": pending}).encode()
    with pytest.raises(ValueError):
        Cursor.from_snapshot(data)


def test_copy_is_independent_of_pending_acks() -> None:
    cursor = locked_cursor()
    other = cursor.copy()
    assert dump(other) == dump(cursor)
    other.apply(TXN_COMMIT, [], sizes({}), 0, T1)
    assert held(cursor)[T1] == {(5, 2), (6, 0)}
    assert cursor.pending_ack[(6, 0)] == T1


@pytest.mark.parametrize(
    "record",
    [
        AckRecord(INDIVIDUAL, ((0, 0), (1, 2))),
        AckRecord(CUMULATIVE, ((7, 1),)),
        AckRecord(TXN_ACK, ((0, 0), (2**40, WHOLE_ENTRY)), T1),
        AckRecord(TXN_ACK, ((3, 3),), BIG),
        AckRecord(TXN_ACK, (), (0, 0)),
        AckRecord(TXN_COMMIT, (), BIG),
        AckRecord(TXN_ABORT, (), T2),
    ],
)
def test_record_round_trip(record: AckRecord) -> None:
    data = record.encode()
    back = AckRecord.decode(record.kind, data)
    assert back == record
    assert back.txn is None or all(type(x) is int for x in back.txn)
    if record.kind in (TXN_COMMIT, TXN_ABORT):
        assert len(data) == 16


@pytest.mark.parametrize(
    ("kind", "data"),
    [
        (TXN_ACK, b"\x00" * 15),
        (TXN_ACK, b"\x00" * 24),
        (TXN_COMMIT, b"\x00" * 32),
        (TXN_ABORT, b""),
        (SNAPSHOT, b"{}"),
        (6, b""),
    ],
)
def test_decode_rejects_bad_records(kind: int, data: bytes) -> None:
    with pytest.raises(ValueError):
        AckRecord.decode(kind, data)


@pytest.mark.parametrize("txn", [None, (-1, 0), (0, 2**64), (0,), (True, 0)])
def test_encode_rejects_bad_transaction_ids(txn: Any) -> None:
    with pytest.raises(ValueError):
        AckRecord(TXN_COMMIT, (), txn).encode()


# -- replay == live (property style) ---------------------------------------------------

COUNTS = {0: 3, 1: 1, 2: 0, 3: 4, 4: 2, 5: 0, 6: 0, 7: 3, 8: 1}
LAST_ENTRY = max(COUNTS)
ALL = [(e, i) for e in sorted(COUNTS) for i in range(COUNTS[e])]
TXNS = [(1 << 48, n) for n in range(1, 5)]


def random_ops(rng: random.Random, cursor: Cursor, n: int) -> list[AckRecord]:
    """Records as a subscription would write them; some are meant to be refused."""
    count = sizes(COUNTS)
    ops: list[AckRecord] = []
    for _ in range(n):
        r = rng.random()
        txn = rng.choice(TXNS)
        if r < 0.25:
            ops.append(AckRecord(INDIVIDUAL, tuple(rng.sample(ALL, rng.randint(1, 3)))))
        elif r < 0.35:
            ops.append(AckRecord(CUMULATIVE, (rng.choice(ALL),)))
        elif r < 0.65:
            ops.append(AckRecord(TXN_ACK, tuple(rng.sample(ALL, rng.randint(1, 3))), txn))
        elif r < 0.75:
            bound = rng.choice(ALL)
            ops.append(AckRecord(TXN_ACK, tuple(cursor.expand_cumulative(bound, count)), txn))
        elif r < 0.88:
            ops.append(AckRecord(TXN_COMMIT, (), txn))
        else:
            ops.append(AckRecord(TXN_ABORT, (), txn))
        # Keep ``cursor`` live, so that cumulative expansions see the state they would.
        try:
            cursor.apply(ops[-1].kind, ops[-1].positions, count, LAST_ENTRY, ops[-1].txn)
        except AckConflict:
            pass
    return ops


class Model:
    """The table applied message by message, with no cursor at all."""

    def __init__(self) -> None:
        self.state = dict.fromkeys(ALL, P)
        self.holder: dict[Position, TxnID] = {}

    def apply(self, record: AckRecord) -> bool:
        """False if refused (then nothing changed)."""
        if record.kind == INDIVIDUAL:
            for p in record.positions:
                self.state[p] = transition(self.state[p], AckEvent.ACK)
        elif record.kind == CUMULATIVE:
            for p in ALL:
                if p <= record.positions[0]:
                    self.state[p] = transition(self.state[p], AckEvent.ACK)
        elif record.kind == TXN_ACK:
            assert record.txn is not None
            fresh = [p for p in record.positions if self.holder.get(p) != record.txn]
            if any(self.state[p] is not P for p in fresh):
                return False
            for p in fresh:
                self.state[p], self.holder[p] = PA, record.txn
        else:
            event = AckEvent.TXN_COMMIT if record.kind == TXN_COMMIT else AckEvent.TXN_ABORT
            for p in [p for p, t in self.holder.items() if t == record.txn]:
                self.state[p] = transition(PA, event)
                del self.holder[p]
        return True


def check_against_model(cursor: Cursor, model: Model) -> None:
    for pos in ALL:
        assert cursor.state(pos) is model.state[pos], pos
    assert cursor.pending_ack == model.holder
    after = [p for p in ALL if p > cursor.mark_delete]
    if after:
        assert model.state[after[0]] is not D  # mark-delete went as far as it could
    check_invariants(cursor)


@pytest.mark.parametrize("seed", range(40))
def test_replaying_records_gives_the_live_cursor(seed: int) -> None:
    rng = random.Random(seed)
    records = random_ops(rng, Cursor(START), 60)
    count = sizes(COUNTS)
    live, model = Cursor(START), Model()
    log: list[tuple[int, bytes]] = []
    snapshots: list[tuple[int, bytes]] = []
    refused = 0
    for record in records:
        # Every record is logged: one refused when applied is void, live and replayed.
        log.append((record.kind, record.encode()))
        before = dump(live)
        accepted = model.apply(record)
        try:
            live.apply(record.kind, record.positions, count, LAST_ENTRY, record.txn)
        except AckConflict:
            assert not accepted
            assert dump(live) == before
            refused += 1
        else:
            assert accepted
        check_against_model(live, model)
        if rng.random() < 0.2:
            snapshots.append((len(log), live.snapshot()))
    for start, snap in [(0, Cursor(START).snapshot()), *snapshots]:
        replayed = Cursor.from_snapshot(snap)
        for kind, data in log[start:]:
            record = AckRecord.decode(kind, data)
            try:
                replayed.apply(kind, record.positions, count, LAST_ENTRY, record.txn)
            except AckConflict:
                pass
        assert dump(replayed) == dump(live)


@pytest.mark.parametrize("seed", range(40))
def test_a_checked_txn_ack_applies_as_a_planned_one(seed: int) -> None:
    """What a subscription does when no record in flight can change a
    TXN_ACK's messages: plan it once (`plan_txn_ack`), then apply what it
    locks with ``checked``. The cursor ends as with the record applied
    plainly, record after record, refusals included."""
    rng = random.Random(seed)
    count = sizes(COUNTS)
    plain, fast = Cursor(START), Cursor(START)
    for record in random_ops(rng, Cursor(START), 60):
        try:
            plain.apply(record.kind, record.positions, count, LAST_ENTRY, record.txn)
            refused = False
        except AckConflict:
            refused = True
        try:
            if record.kind == TXN_ACK:
                assert record.txn is not None
                locked = fast.plan_txn_ack(record.positions, record.txn)
                fast.apply(TXN_ACK, locked, count, LAST_ENTRY, record.txn, checked=True)
            else:
                fast.apply(record.kind, record.positions, count, LAST_ENTRY, record.txn)
        except AckConflict:
            assert refused
        else:
            assert not refused
        assert dump(fast) == dump(plain)


def test_random_sequences_exercise_every_outcome() -> None:
    """The property test above is not vacuous: it sees locks, conflicts, commits, aborts."""
    seen = {"conflict": 0, "locked": 0, "committed": 0, "aborted": 0}
    for seed in range(40):
        rng = random.Random(seed)
        records = random_ops(rng, Cursor(START), 60)
        live = Cursor(START)
        for record in records:
            try:
                changed = live.apply(
                    record.kind, record.positions, sizes(COUNTS), LAST_ENTRY, record.txn
                )
            except AckConflict:
                seen["conflict"] += 1
                continue
            if changed and record.kind == TXN_ACK:
                seen["locked"] += 1
            if changed and record.kind == TXN_COMMIT:
                seen["committed"] += 1
            if changed and record.kind == TXN_ABORT:
                seen["aborted"] += 1
    assert all(n >= 10 for n in seen.values()), seen


# -- PartitionSubscription on a real store ---------------------------------------------


def msgs(first: int, n: int) -> list[pb.SingleMessage]:
    return [
        pb.SingleMessage(payload=f"m{s}".encode(), sequence_id=s) for s in range(first, first + n)
    ]


class Harness:
    """One topic "t" with one partition, a subscription "s", and a store to reopen."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.store: LedgerStore
        self.part: Partition
        self.sub: PartitionSubscription

    async def open(self, entries: int = 0, per_entry: int = 3) -> None:
        self.store = await LedgerStore.open(self.db)
        topics = await Topics.load(self.store)
        self.part = (await topics.create("t", 1)).partitions[0]
        for e in range(entries):
            await self.part.publish("p", msgs(e * per_entry, per_entry))
        self.sub = await PartitionSubscription.create(self.part, "s", earliest=True)

    @property
    def cursor_ledger(self) -> Any:
        return self.store.get_ledger(PartitionSubscription.ledger_name("t", 0, "s"))

    async def settle(self) -> None:
        barrier = await self.store.open_ledger("test/barrier")
        for _ in range(4):
            await barrier.append(b"")

    async def reopen(self) -> PartitionSubscription:
        await self.sub.close()
        await self.settle()
        await self.store.close()
        self.store = await LedgerStore.open(self.db)
        topics = await Topics.load(self.store)
        topic = topics.get("t")
        assert topic is not None
        self.part = topic.partitions[0]
        self.sub = await PartitionSubscription.load(self.part, "s", self.cursor_ledger)
        return self.sub

    async def close(self) -> None:
        await self.sub.close()
        if not self.store._closed:
            await self.settle()
            await self.store.close()


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    harness = Harness(tmp_path / "broker.db")
    await harness.open(entries=4)
    try:
        yield harness
    finally:
        await harness.close()


def states(sub: PartitionSubscription) -> dict[Position, MsgState]:
    return {(e, i): sub.cursor.state((e, i)) for e in range(4) for i in range(3)}


async def test_txn_ack_is_durable_across_a_reopen(h: Harness) -> None:
    await h.sub.ack([(0, 1), (2, 2)], False, T1)
    await h.sub.ack([(1, 0)], False, T2)
    assert h.sub.cursor.pending_ack == {(0, 1): T1, (2, 2): T1, (1, 0): T2}
    sub = await h.reopen()
    assert sub.cursor.pending_ack == {(0, 1): T1, (2, 2): T1, (1, 0): T2}
    assert held(sub.cursor) == {T1: {(0, 1), (2, 2)}, T2: {(1, 0)}}
    assert sub.backlog() == 12  # locked messages are backlog until committed


async def test_commit_after_reopen_deletes(h: Harness) -> None:
    await h.sub.ack([(0, 0), (0, 1), (0, 2), (1, 1)], False, T1)
    sub = await h.reopen()
    await sub.end_txn(T1, commit=True)
    assert sub.cursor.mark_delete == (0, WHOLE_ENTRY)
    assert sub.cursor.state((1, 1)) is D
    assert not sub.cursor.pending_ack
    assert sub.backlog() == 8
    sub = await h.reopen()
    assert sub.cursor.mark_delete == (0, WHOLE_ENTRY)
    assert sub.cursor.state((1, 1)) is D and not sub.cursor.pending_ack


async def test_abort_after_reopen_makes_messages_deliverable(h: Harness) -> None:
    await h.sub.ack([(1, 0), (1, 2)], False, T1)
    sub = await h.reopen()
    pushed: list[pb.DeliveredEntry] = []
    consumer = make_consumer(pushed)
    sub.add_consumer(consumer)
    sub.start()
    consumer.add_permits(100)
    await until(
        lambda: delivered(pushed) >= {(e, i) for e in range(4) for i in range(3)} - {(1, 0), (1, 2)}
    )
    assert (1, 0) not in delivered(pushed) and (1, 2) not in delivered(pushed)
    await sub.end_txn(T1, commit=False)
    assert sub.cursor.state((1, 0)) is P and sub.cursor.state((1, 2)) is P
    await until(lambda: {(1, 0), (1, 2)} <= delivered(pushed))
    # Redelivered as the messages of entry 1 that are PENDING again.
    last = pushed[-1]
    assert (last.entry_id, list(last.indexes)) == (1, [0, 2])
    assert last.redelivery_count == 1
    # And durable: after another reopen they are PENDING.
    sub = await h.reopen()
    assert sub.cursor.state((1, 0)) is P and not sub.cursor.pending_ack


async def test_conflict_writes_nothing(h: Harness) -> None:
    await h.sub.ack([(1, 1)], False, T1)
    await h.sub.ack([(0, 0)], False)
    ledger = h.cursor_ledger
    last = ledger.last_entry_id
    before = states(h.sub)
    for txn, positions in [(T2, [(2, 0), (1, 1)]), (T2, [(0, 0)]), (T1, [(2, 1), (0, 0)])]:
        with pytest.raises(refusals.Refusal) as info:
            await h.sub.ack(positions, False, txn)
        assert info.value.code == pb.TRANSACTION_CONFLICT
    assert ledger.last_entry_id == last
    assert states(h.sub) == before


async def test_conflict_message_names_message_and_holder(h: Harness) -> None:
    await h.sub.ack([(1, 1)], False, T1)
    with pytest.raises(refusals.Refusal) as info:
        await h.sub.ack([(1, 1)], False, T2)
    text = str(info.value)
    assert "1:1" in text and "held by transaction (281474976710656,1)" in text
    assert "'s'" in text and "t-partition-0" in text


async def test_same_transaction_retry_writes_nothing(h: Harness) -> None:
    await h.sub.ack([(1, 1), (1, 2)], False, T1)
    ledger = h.cursor_ledger
    last = ledger.last_entry_id
    await h.sub.ack([(1, 2), (1, 1)], False, T1)
    assert ledger.last_entry_id == last
    await h.sub.ack([(1, 1), (2, 0)], False, T1)
    assert ledger.last_entry_id == last + 1
    (entry,) = await ledger.read(last + 1, last + 1)
    assert AckRecord.decode(entry.meta, entry.data) == AckRecord(TXN_ACK, ((2, 0),), T1)


async def test_cumulative_txn_ack_is_stored_expanded(h: Harness) -> None:
    await h.sub.ack([(0, 1)], False)
    await h.sub.ack([(1, 0)], True, T1)
    assert set(h.sub.cursor.pending_ack) == {(0, 0), (0, 2), (1, 0)}
    ledger = h.cursor_ledger
    (entry,) = await ledger.read(ledger.last_entry_id, ledger.last_entry_id)
    assert entry.meta == TXN_ACK
    assert AckRecord.decode(entry.meta, entry.data).positions == ((0, 0), (0, 2), (1, 0))
    last = ledger.last_entry_id
    await h.sub.ack([(1, 0)], True, T1)  # a retry of the cumulative ack
    assert ledger.last_entry_id == last
    with pytest.raises(refusals.Refusal) as info:
        await h.sub.ack([(2, 0)], True, T2)
    assert info.value.code == pb.TRANSACTION_CONFLICT
    assert ledger.last_entry_id == last


async def test_normal_acks_leave_locked_messages_alone(h: Harness) -> None:
    await h.sub.ack([(0, 1)], False, T1)
    await h.sub.ack([(0, 1), (0, 0)], False)  # (0, 1) is dropped
    assert h.sub.cursor.state((0, 1)) is PA and h.sub.cursor.mark_delete == (0, 0)
    await h.sub.ack([(2, 1)], True)  # cumulative: stops before (0, 1)
    assert h.sub.cursor.mark_delete == (0, 0)
    assert h.sub.cursor.state((0, 1)) is PA
    assert all(h.sub.cursor.state(p) is D for p in [(0, 2), (1, 0), (1, 2), (2, 0), (2, 1)])
    assert h.sub.cursor.state((2, 2)) is P
    assert h.sub.backlog() == 1 + 1 + 3  # (0, 1) locked, (2, 2), entry 3
    sub = await h.reopen()
    assert sub.cursor.mark_delete == (0, 0) and sub.cursor.state((0, 1)) is PA
    await sub.end_txn(T1, commit=True)
    assert sub.cursor.mark_delete == (2, 1)


async def test_end_txn_is_idempotent_and_unknown_writes_nothing(h: Harness) -> None:
    ledger = h.cursor_ledger
    last = ledger.last_entry_id
    await h.sub.end_txn(T1, commit=True)  # nothing of T1 here
    assert ledger.last_entry_id == last
    await h.sub.ack([(3, 0)], False, T2)
    await h.sub.end_txn(T2, commit=False)
    assert ledger.last_entry_id == last + 2
    (entry,) = await ledger.read(last + 2, last + 2)
    assert AckRecord.decode(entry.meta, entry.data) == AckRecord(TXN_ABORT, (), T2)
    await h.sub.end_txn(T2, commit=False)
    await h.sub.end_txn(T2, commit=True)  # a confused retry changes nothing either
    assert ledger.last_entry_id == last + 2
    assert h.sub.cursor.state((3, 0)) is P


async def test_ack_after_the_transaction_ended_is_refused(h: Harness) -> None:
    await h.sub.ack([(3, 0)], False, T1)
    await h.sub.end_txn(T1, commit=True)
    await h.sub.end_txn(T2, commit=False)  # ended here with nothing to do
    for txn in (T1, T2):
        with pytest.raises(refusals.Refusal) as info:
            await h.sub.ack([(3, 1)], False, txn)
        assert info.value.code == pb.INVALID_TXN_STATUS
    assert h.sub.cursor.state((3, 1)) is P
    sub = await h.reopen()  # T1's commit record is in the ledger: still refused
    with pytest.raises(refusals.Refusal):
        await sub.ack([(3, 1)], False, T1)


@pytest.mark.parametrize("txn", [(-1, 0), (0, 2**64), (1, 2, 3), "t", (1.0, 2)])
async def test_bad_transaction_ids_are_refused(h: Harness, txn: Any) -> None:
    with pytest.raises(refusals.Refusal) as info:
        await h.sub.ack([(0, 0)], False, txn)
    assert info.value.code == pb.INVALID_ARGUMENT
    with pytest.raises(refusals.Refusal):
        await h.sub.end_txn(txn, True)
    assert h.sub.cursor.state((0, 0)) is P


async def test_a_record_invalidated_while_in_flight_is_void(h: Harness) -> None:
    # A normal ack and a txn ack of the same message race: the normal ack is
    # written first, so the txn ack is refused when it is applied.
    normal = asyncio.ensure_future(h.sub.ack([(1, 1)], False))
    await asyncio.sleep(0)
    with pytest.raises(refusals.Refusal) as info:
        await h.sub.ack([(1, 1), (1, 2)], False, T1)
    assert info.value.code == pb.TRANSACTION_CONFLICT
    await normal
    assert h.sub.cursor.state((1, 1)) is D
    assert h.sub.cursor.state((1, 2)) is P and not h.sub.cursor.pending_ack
    ledger = h.cursor_ledger
    kinds = [e.meta for e in await ledger.read(ledger.first_entry_id, ledger.last_entry_id)]
    assert kinds[-2:] == [INDIVIDUAL, TXN_ACK]  # both are in the ledger ...
    sub = await h.reopen()  # ... and the replay refuses the second one too
    assert sub.cursor.state((1, 1)) is D and sub.cursor.state((1, 2)) is P
    assert not sub.cursor.pending_ack


async def test_end_txn_sees_a_txn_ack_in_flight(h: Harness) -> None:
    acking = asyncio.ensure_future(h.sub.ack([(2, 0)], False, T1))
    await asyncio.sleep(0)
    assert not h.sub.cursor.pending_ack  # not durable yet
    await h.sub.end_txn(T1, commit=True)
    await acking
    assert h.sub.cursor.state((2, 0)) is D


async def test_a_cancelled_caller_still_gets_its_record_applied(h: Harness) -> None:
    task = asyncio.ensure_future(h.sub.ack([(2, 0)], False, T1))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await h.settle()
    assert h.sub.cursor.pending_ack == {(2, 0): T1}  # live == what the ledger holds
    sub = await h.reopen()
    assert sub.cursor.pending_ack == {(2, 0): T1}


async def test_pending_acks_survive_snapshots(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pending_ack_module, "SNAPSHOT_EVERY", 2)
    await h.sub.ack([(0, 0)], False, T1)
    await h.sub.ack([(0, 1)], False)
    await h.sub.ack([(1, 0)], False, T2)
    await h.sub.ack([(3, 2)], False)
    await h.settle()
    ledger = h.cursor_ledger
    entries = await ledger.read(ledger.first_entry_id, ledger.last_entry_id)
    assert entries[0].meta == SNAPSHOT  # trimmed up to a snapshot
    assert ledger.first_entry_id > 0
    snap = json.loads(entries[0].data)
    assert snap["locked_ranges"] == [0, 0, 0, *T1, 1, 0, 0, *T2]
    sub = await h.reopen()
    assert sub.cursor.pending_ack == {(0, 0): T1, (1, 0): T2}
    assert sub.cursor.state((0, 1)) is D and sub.cursor.state((3, 2)) is D
    await sub.end_txn(T1, commit=False)
    await sub.end_txn(T2, commit=True)
    sub = await h.reopen()
    assert sub.cursor.state((0, 0)) is P and sub.cursor.state((1, 0)) is D


def test_a_reset_is_a_snapshot_record_applied_as_every_record() -> None:
    """A reset writes the snapshot of the cursor it moves to; applying it
    live and replaying the ledger give the same cursor."""
    live = Cursor(START)
    apply(live, INDIVIDUAL, (0, 0), (1, 0), (3, 2))
    apply(live, TXN_ACK, (2, 1), txn=T1)
    apply(live, TXN_COMMIT, txn=T1)
    reset = AckRecord(SNAPSHOT, ((1, 0),))
    assert reset.encode() == Cursor((1, 0)).snapshot()
    assert apply(live, SNAPSHOT, (1, 0)) == []
    assert dump(live) == dump(Cursor((1, 0)))
    apply(live, INDIVIDUAL, (1, 1), (1, 2), (3, 0))
    records = [AckRecord(INDIVIDUAL, ((0, 0), (1, 0), (3, 2))), reset]
    records.append(AckRecord(INDIVIDUAL, ((1, 1), (1, 2), (3, 0))))
    entries = [Entry(0, SNAPSHOT, Cursor(START).snapshot())]
    entries += [Entry(n, r.kind, r.encode()) for n, r in enumerate(records, 1)]
    replayed, _ = replay_cursor("c", entries, COUNT, LAST)
    assert dump(replayed) == dump(live)
    assert live.mark_delete == (1, WHOLE_ENTRY) and list(live.acked) == [(3, 0)]


async def test_a_reset_keeps_ledger_order_with_the_records_around_it(h: Harness) -> None:
    """An ack queued before a reset applies to the old cursor; one queued
    while the reset is in flight applies to the new one (a transactional ack
    then waits to be durable: it cannot be checked against a cursor that is
    about to move); dispatch starts over from the new cursor."""
    pushed: list[pb.DeliveredEntry] = []
    consumer = make_consumer(pushed)
    h.sub.add_consumer(consumer)
    h.sub.start()
    consumer.add_permits(100)
    await until(lambda: len(delivered(pushed)) == 12)
    before = asyncio.ensure_future(h.sub.ack([(3, 0)], False))
    await asyncio.sleep(0)
    resetting = asyncio.ensure_future(h.sub.reset((1, WHOLE_ENTRY)))
    for _ in range(10_000):
        if any(r.kind == SNAPSHOT for r in h.sub.acks._inflight):
            break
        await asyncio.sleep(0)
    else:
        raise AssertionError("the reset record was never in flight")
    await before
    ledger = h.cursor_ledger
    queued_at = ledger.last_entry_id
    await h.sub.ack([(2, 0)], False, T1, early=True)
    assert ledger.last_entry_id > queued_at  # answered once durable, not early
    await resetting
    assert h.sub.cursor.mark_delete == (1, WHOLE_ENTRY)
    assert h.sub.cursor.pending_ack == {(2, 0): T1}
    assert h.sub.cursor.state((3, 0)) is P  # acked before the reset: undone by it
    pushed.clear()
    await until(lambda: delivered(pushed) == {(2, 1), (2, 2), (3, 0), (3, 1), (3, 2)})
    sub = await h.reopen()
    assert sub.cursor.mark_delete == (1, WHOLE_ENTRY)
    assert sub.cursor.pending_ack == {(2, 0): T1} and not sub.cursor.acked


async def test_an_early_txn_ack_starts_no_group_commit_of_its_own(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An early transactional ack is a lazy append: it waits in the store's
    queue for the next group commit (the END's) and goes in the same one."""
    monkeypatch.setattr(ledger_store, "LAZY_DELAY", 3600.0)  # (never alone, in this test)
    commits, last = h.store.commits, h.cursor_ledger.last_entry_id
    await h.sub.ack([(2, 0), (2, 1)], False, T1, early=True)
    for _ in range(20):
        await asyncio.sleep(0)
    assert h.store.commits == commits and h.cursor_ledger.last_entry_id == last
    await h.sub.end_txn(T1, commit=True)
    assert h.store.commits == commits + 1  # the ack and its commit: one group commit
    assert h.sub.cursor.state((2, 0)) is D and h.sub.cursor.state((2, 1)) is D


async def test_fault_hooks_fire_after_the_record_is_durable(
    h: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = h.cursor_ledger
    seen: list[tuple[str, int, MsgState]] = []

    def hit(step: str) -> None:
        # Durable (in the ledger) but not applied yet.
        seen.append((step, ledger.last_entry_id, h.sub.cursor.state((2, 2))))

    monkeypatch.setattr(faults, "hit", hit)
    last = ledger.last_entry_id
    await h.sub.ack([(2, 2)], False, T1)
    await h.sub.ack([(2, 1)], False)  # no hook for a normal ack
    await h.sub.end_txn(T1, commit=True)
    assert seen == [
        ("subscriptions.after_pending_ack_write", last + 1, P),
        ("subscriptions.after_txn_end_write", last + 3, PA),
    ]


# -- dispatch and redelivery -------------------------------------------------------------


def make_consumer(
    pushed: list[pb.DeliveredEntry], sub_type: SubType = SubType.EXCLUSIVE
) -> Consumer:
    return Consumer(
        consumer_id=1,
        name="c",
        topic="t",
        subscription="s",
        sub_type=sub_type,
        push=lambda c, entries: pushed.extend(entries),
    )


def delivered(pushed: list[pb.DeliveredEntry]) -> set[Position]:
    out: set[Position] = set()
    for d in pushed:
        n = len(pb.EntryBatch.FromString(d.data).messages)
        out.update((d.entry_id, i) for i in (d.indexes or range(n)))
    return out


async def test_dispatch_skips_locked_messages(h: Harness) -> None:
    await h.sub.ack([(0, 1), (2, 0), (2, 1), (2, 2)], False, T1)
    pushed: list[pb.DeliveredEntry] = []
    consumer = make_consumer(pushed)
    h.sub.add_consumer(consumer)
    h.sub.start()
    consumer.add_permits(8)  # exactly the deliverable messages: none left for entry 4
    everything = {(e, i) for e in range(4) for i in range(3)}
    want = everything - {(0, 1), (2, 0), (2, 1), (2, 2)}
    await until(lambda: delivered(pushed) == want)
    by_entry = {d.entry_id: list(d.indexes) for d in pushed}
    assert by_entry == {0: [0, 2], 1: [], 3: []}  # entry 1 and 3 on the fast path
    # A later entry with a locked message: the fast path must not take it.
    await h.part.publish("p", msgs(100, 3))
    await h.sub.ack([(4, 1)], False, T2)
    consumer.add_permits(10)
    await until(lambda: {(4, 0), (4, 2)} <= delivered(pushed))
    await asyncio.sleep(0.05)
    assert (4, 1) not in delivered(pushed)


async def test_nack_and_close_do_not_redeliver_locked_messages(h: Harness) -> None:
    pushed: list[pb.DeliveredEntry] = []
    consumer = make_consumer(pushed, SubType.SHARED)
    h.sub.add_consumer(consumer)
    h.sub.start()
    consumer.add_permits(12)
    await until(lambda: len(delivered(pushed)) == 12)
    # A message delivered to the consumer and then txn-acked leaves its pending map.
    await h.sub.ack([(1, 1)], False, T1)
    assert (1, 1) not in h.sub.pending
    assert h.sub.pending[(1, 0)] is consumer
    # A nack racing with a txn ack: the message was requeued, then locked.
    h.sub.redeliver_unacked(consumer, [(1, 2)])
    assert (1, 2) in h.sub.dispatch.redeliver
    await h.sub.ack([(1, 2)], False, T1)
    assert (1, 2) not in h.sub.dispatch.redeliver
    pushed.clear()
    h.sub.redeliver_unacked(consumer, None)
    consumer.add_permits(20)
    await until(lambda: len(delivered(pushed)) == 10)
    await asyncio.sleep(0.05)
    assert delivered(pushed) == {(e, i) for e in range(4) for i in range(3)} - {(1, 1), (1, 2)}
    # Closing the consumer: its pending messages are requeued, the locked ones are not.
    h.sub.remove_consumer(consumer)
    assert (1, 1) not in h.sub.dispatch.redeliver and (1, 2) not in h.sub.dispatch.redeliver
    assert len(h.sub.dispatch.redeliver) == 10
    # Aborting releases them to the redelivery set.
    await h.sub.end_txn(T1, commit=False)
    assert {(1, 1), (1, 2)} <= set(h.sub.dispatch.redeliver)


async def test_requeue_drops_locked_and_deleted_messages(h: Harness) -> None:
    # A txn ack takes its messages out of the pending map when applied; should
    # one be found there anyway, leaving consumers never redeliver it.
    consumer = make_consumer([], SubType.SHARED)
    h.sub.add_consumer(consumer)
    await h.sub.ack([(0, 0)], False, T1)
    await h.sub.ack([(0, 1)], False)
    for pos in [(0, 0), (0, 1), (0, 2)]:
        h.sub.pending[pos] = consumer
    h.sub.remove_consumer(consumer)
    assert not h.sub.pending
    assert list(h.sub.dispatch.redeliver) == [(0, 2)]


async def test_a_stale_redelivery_entry_is_never_sent(h: Harness) -> None:
    # A position lands in the redelivery set and is locked before dispatch
    # gets to it (the requeue path skips locked ones, so force it in).
    await h.sub.ack([(0, 0)], False, T1)
    h.sub.dispatch._redeliver_later([(0, 0), (0, 1)])
    h.sub.dispatch.read_entry = 4  # as if dispatch had read everything
    pushed: list[pb.DeliveredEntry] = []
    consumer = make_consumer(pushed)
    h.sub.add_consumer(consumer)
    h.sub.start()
    consumer.add_permits(10)
    await until(lambda: (0, 1) in delivered(pushed))
    await asyncio.sleep(0.05)
    assert delivered(pushed) == {(0, 1)}
    assert not h.sub.dispatch.redeliver


async def test_abort_of_messages_not_read_yet_delivers_them_once(h: Harness) -> None:
    await h.sub.ack([(3, 0), (3, 1)], False, T1)
    await h.sub.end_txn(T1, commit=False)
    assert not h.sub.dispatch.redeliver  # dispatch has not read entry 3: it will deliver them
    pushed: list[pb.DeliveredEntry] = []
    consumer = make_consumer(pushed)
    h.sub.add_consumer(consumer)
    h.sub.start()
    consumer.add_permits(100)
    await until(lambda: len(delivered(pushed)) == 12)
    await asyncio.sleep(0.05)
    assert sum(len(d.indexes) or 3 for d in pushed) == 12  # nothing twice


async def test_creating_a_subscription_over_its_existing_cursor_ledger_loads_it_and_says_so(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Never expected (a cluster check saw whole subscriptions start over when
    created again over their cursors): the cursor is loaded where it is, not
    written over at the start, and it is logged loudly, naming the ledger."""
    await h.sub.ack([(0, 0), (0, 1), (0, 2)], False, None)
    await h.settle()
    at = h.sub.acks.cursor.mark_delete
    assert at >= (0, 2)
    with caplog.at_level("WARNING", logger="subscriptions._subscription"):
        other = await PartitionSubscription.create(h.part, "other", earliest=True)
        assert not caplog.records  # (a new one: nothing to say)
        again = await PartitionSubscription.create(h.part, "s", earliest=True)
    (record,) = caplog.records
    assert record.levelname == "WARNING"
    assert PartitionSubscription.ledger_name("t", 0, "s") in record.getMessage()
    assert again.acks.cursor.mark_delete == at  # (not moved back to the start)
    assert other.acks.cursor.mark_delete < at
    await other.close()


# -- the Subscriptions manager ---------------------------------------------------------


async def test_a_topic_growing_while_a_consumer_subscribes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await LedgerStore.open(tmp_path / "broker.db")
    try:
        topics = await Topics.load(store)
        topic = await topics.create("t", 1)
        subs = await Subscriptions.load(topics)
        entered, gate = asyncio.Event(), asyncio.Event()
        real_create = PartitionSubscription.create

        async def slow_create(*args: Any, **kwargs: Any) -> PartitionSubscription:
            entered.set()
            await gate.wait()
            return await real_create(*args, **kwargs)

        monkeypatch.setattr(PartitionSubscription, "create", staticmethod(slow_create))
        try:
            consumer = make_consumer([])
            subscribing = asyncio.create_task(subs.subscribe(topic, "s", consumer, earliest=True))
            await entered.wait()
            await topics.create("t", 2)  # grown while the first cursor is being created
            extending = asyncio.create_task(subs.extend(topic))  # (what the admin API does)
            gate.set()
            await subscribing
            await extending
            assert [len(subs.of_topic("t")["s"]), len(consumer.subscriptions)] == [2, 2]
        finally:
            await subs.close()
    finally:
        await store.close()


async def test_manager_routes_txn_acks_and_end_txn(tmp_path: Path) -> None:
    store = await LedgerStore.open(tmp_path / "broker.db")
    try:
        topics = await Topics.load(store)
        topic = await topics.create("t", 2)
        for part in topic.partitions:
            await part.publish("p", msgs(0, 3))
        subs = await Subscriptions.load(topics)
        try:
            pushed: list[pb.DeliveredEntry] = []
            consumer = make_consumer(pushed)
            await subs.subscribe(topic, "s", consumer, earliest=True)
            ids = [MessageId(0, 0, 1), MessageId(1, 0, 0), MessageId(1, 0, 2)]
            await subs.ack(consumer, ids, False, T1)
            stats = [subs.stats("t", i)["s"] for i in (0, 1)]
            assert [s["pending_ack"] for s in stats] == [1, 2]
            assert [s["backlog"] for s in stats] == [3, 3]
            with pytest.raises(refusals.Refusal) as info:
                await subs.ack(consumer, [MessageId(1, 0, 0)], False, T2)
            assert info.value.code == pb.TRANSACTION_CONFLICT
            with pytest.raises(refusals.Refusal) as info:
                await subs.ack(consumer, [MessageId(1, 7, 0)], False, T2)
            assert info.value.code == pb.UNKNOWN_MESSAGE_ID
            await subs.end_txn("t", "other", T1, True)  # no such subscription: nothing
            await subs.end_txn("nope", "s", T1, True)
            assert subs.stats("t", 1)["s"]["pending_ack"] == 2
            await subs.end_txn("t", "s", T1, True)
            stats = [subs.stats("t", i)["s"] for i in (0, 1)]
            assert [s["pending_ack"] for s in stats] == [0, 0]
            assert [s["backlog"] for s in stats] == [2, 1]
        finally:
            await subs.close()
    finally:
        barrier = await store.open_ledger("test/barrier")
        for _ in range(4):
            await barrier.append(b"")
        await store.close()


async def test_end_txn_reaches_loaded_and_added_partitions(tmp_path: Path) -> None:
    """A subscription loaded from disk, then a partition added to its topic:
    ending a transaction reaches both partition subscriptions (the
    manager's index by topic and name is kept on every path)."""
    store = await LedgerStore.open(tmp_path / "broker.db")
    try:
        topics = await Topics.load(store)
        topic = await topics.create("t", 1)
        subs = await Subscriptions.load(topics)
        await subs.subscribe(topic, "s", make_consumer([]), earliest=True)
        await subs.close()
        subs = await Subscriptions.load(topics)  # (loaded, not created)
        try:
            topic = await topics.create("t", 2)
            await subs.extend(topic)
            for part in topic.partitions:
                await part.publish("p", msgs(0, 2))
            consumer = make_consumer([])
            await subs.subscribe(topic, "s", consumer, earliest=True)
            await subs.ack(consumer, [MessageId(0, 0, 0), MessageId(1, 0, 1)], False, T1)
            assert [subs.stats("t", i)["s"]["pending_ack"] for i in (0, 1)] == [1, 1]
            await subs.end_txn("t", "s", T1, True)
            stats = [subs.stats("t", i)["s"] for i in (0, 1)]
            assert [s["pending_ack"] for s in stats] == [0, 0]
            assert [s["backlog"] for s in stats] == [1, 1]
        finally:
            await subs.close()
    finally:
        await store.close()


async def test_an_early_txn_ack_returns_before_it_is_durable(h: Harness) -> None:
    """With no record in flight the ack is applied to exactly the state it
    was checked against: it is answered once queued."""
    ledger = h.cursor_ledger
    before = ledger.last_entry_id
    await h.sub.ack([(0, 0), (0, 1)], False, T1, early=True)
    assert ledger.last_entry_id == before  # returned before the record was durable
    assert h.sub.cursor.pending_ack == {}  # applied once durable, as every record
    await h.settle()
    assert h.sub.cursor.pending_ack == {(0, 0): T1, (0, 1): T1}


async def test_an_early_txn_ack_waits_behind_a_record_in_flight_on_its_messages(
    h: Harness,
) -> None:
    """A record in flight that names one of its messages may change what this
    one finds: it is answered once durable (here: refused, the message being
    T1's by then)."""
    first = asyncio.ensure_future(h.sub.ack([(1, 0)], False, T1, early=True))
    await asyncio.sleep(0)  # T1's record is queued, not durable
    assert h.sub.acks._inflight
    with pytest.raises(refusals.Refusal) as refused:
        await h.sub.ack([(1, 0), (1, 1)], False, T2, early=True)
    assert refused.value.code == pb.TRANSACTION_CONFLICT
    await first
    await h.settle()
    assert h.sub.cursor.pending_ack == {(1, 0): T1}


async def test_an_early_txn_ack_ignores_records_in_flight_on_other_messages(h: Harness) -> None:
    ledger = h.cursor_ledger
    before = ledger.last_entry_id
    other = asyncio.ensure_future(h.sub.ack([(1, 0)], False, T1, early=True))
    await asyncio.sleep(0)
    commit = asyncio.ensure_future(h.sub.end_txn(T1, commit=True))  # in flight too
    plain = asyncio.ensure_future(h.sub.ack([(0, 0)], False))  # a plain ack in flight
    await asyncio.sleep(0)
    assert len(h.sub.acks._inflight) == 3
    await h.sub.ack([(2, 0), (2, 1)], False, T2, early=True)
    assert ledger.last_entry_id == before  # answered before anything was durable
    await asyncio.gather(other, commit, plain)
    await h.settle()
    assert h.sub.cursor.pending_ack == {(2, 0): T2, (2, 1): T2}
    assert h.sub.cursor.state((1, 0)) is D


async def test_an_early_txn_ack_waits_behind_a_cumulative_ack_over_it(h: Harness) -> None:
    """A cumulative ack in flight deletes every message up to its bound."""
    cumulative = asyncio.ensure_future(h.sub.ack([(1, 1)], True))
    await asyncio.sleep(0)
    ledger = h.cursor_ledger
    before = ledger.last_entry_id
    await h.sub.ack([(1, 2)], False, T1, early=True)  # past the bound: at once
    assert ledger.last_entry_id == before
    with pytest.raises(refusals.Refusal) as refused:
        await h.sub.ack([(0, 2)], False, T2, early=True)  # under it: waits, then void
    assert refused.value.code == pb.TRANSACTION_CONFLICT
    await cumulative
    await h.settle()
    assert h.sub.cursor.pending_ack == {(1, 2): T1}


async def test_an_early_end_txn_returns_once_queued(h: Harness) -> None:
    """`end_txn_early` (a coordinator sharing the store): END returns with
    its record queued; the acks change when it is durable, and a reopen
    finds them changed."""
    await h.sub.ack([(0, 0), (0, 1), (0, 2)], False, T1)
    ledger = h.cursor_ledger
    before = ledger.last_entry_id
    h.sub.end_txn_early(T1, commit=True)
    assert ledger.last_entry_id == before  # returned before the record was durable
    assert h.sub.cursor.pending_ack == {(0, 0): T1, (0, 1): T1, (0, 2): T1}
    await h.settle()
    assert not h.sub.cursor.pending_ack
    assert h.sub.cursor.mark_delete == (0, WHOLE_ENTRY)
    with pytest.raises(refusals.Refusal):
        await h.sub.ack([(1, 0)], False, T1)  # ended: refused from the call on
    sub = await h.reopen()
    assert sub.cursor.mark_delete == (0, WHOLE_ENTRY) and not sub.cursor.pending_ack


@pytest.mark.parametrize(
    ("positions", "unknown"),
    [
        ([(1, 0), (1, 1), (1, 2)], None),  # one whole entry: checked by its ends
        ([(1, 2), (1, 0)], None),
        ([(1, 0), (1, 3)], (1, 3)),  # past the entry's last message
        ([(1, 1), (1, -1)], (1, -1)),
        ([(0, 2), (2, 0), (4, 0)], (4, 0)),  # several entries: each is checked
        ([(4, 0), (4, 1)], (4, 0)),  # no such entry
        ([(-1, 0)], (-1, 0)),
    ],
)
async def test_first_unknown_names_the_first_position_without_a_message(
    h: Harness, positions: list[Position], unknown: Position | None
) -> None:
    assert h.sub.first_unknown(positions) == unknown
    assert unknown is None or not h.sub.knows(unknown)


async def test_retention_trims_behind_the_slowest_subscription_only(tmp_path: Path) -> None:
    """A partition is trimmed to TRIM_SLACK entries before the first entry
    its slowest subscription has not acknowledged; one that holds TRIM_SLACK
    entries or fewer, or has no subscription, keeps everything."""
    from subscriptions._manager import TRIM_SLACK

    store = await LedgerStore.open(tmp_path / "broker.db")
    try:
        topics = await Topics.load(store)
        sizes = {"long": 40, "short": TRIM_SLACK, "free": 40}
        for name, n in sizes.items():
            part = (await topics.create(name, 1)).partitions[0]
            await asyncio.gather(*(part.publish("p", msgs(i, 1)) for i in range(n)))
        subs = await Subscriptions.load(topics)
        try:
            for topic, sub, acked_through in (("long", "s", 29), ("long", "s2", 34),
                                              ("short", "s", TRIM_SLACK - 1)):  # fmt: skip
                consumer = Consumer(1, "c", topic, sub, SubType.EXCLUSIVE, lambda c, e: None)
                found = topics.get(topic)
                assert found is not None
                await subs.subscribe(found, sub, consumer, earliest=True)
                await subs.ack(consumer, [MessageId(0, acked_through, 0)], True)
            await subs.trim_once()
            firsts = {t.name: t.partitions[0].ledger.first_entry_id for t in topics.all()}
            assert firsts == {"long": 30 - TRIM_SLACK, "short": 0, "free": 0}
        finally:
            await subs.close()
    finally:
        await store.close()


@pytest.mark.parametrize("early", [False, True])
async def test_an_ack_after_its_transactions_end_arrived_first_is_refused(
    tmp_path: Path, early: bool
) -> None:
    """A coordinator (on another broker) aborted a transaction, and its END
    reached the subscription before the transaction's ack did (the
    participant had checked with the coordinator already): the END of a
    transaction that holds nothing here writes nothing but is remembered,
    and the late ack, on every partition, is refused INVALID_TXN_STATUS and
    changes nothing (no PENDING_ACK left behind, nothing written, the
    messages delivered as before)."""
    store = await LedgerStore.open(tmp_path / "broker.db")
    try:
        topics = await Topics.load(store)
        topic = await topics.create("t", 2)
        for part in topic.partitions:
            await part.publish("p", msgs(0, 3))
        subs = await Subscriptions.load(topics)
        try:
            consumer = make_consumer([])
            await subs.subscribe(topic, "s", consumer, earliest=True)
            ledgers = [
                store.get_ledger(PartitionSubscription.ledger_name("t", i, "s")) for i in (0, 1)
            ]
            before = [ledger.last_entry_id for ledger in ledgers]
            await subs.end_txn("t", "s", T1, False, early=early)
            for ids in ([MessageId(0, 0, 1)], [MessageId(1, 0, 0), MessageId(1, 0, 2)]):
                with pytest.raises(refusals.Refusal) as info:
                    await subs.ack(consumer, ids, False, T1)
                assert info.value.code == pb.INVALID_TXN_STATUS
                assert "has already ended" in str(info.value)
            with pytest.raises(refusals.Refusal) as info:
                await subs.ack_positions(consumer, {0: [(0, 0)]}, True, T1, early=True)
            assert info.value.code == pb.INVALID_TXN_STATUS
            assert [ledger.last_entry_id for ledger in ledgers] == before
            stats = [subs.stats("t", i)["s"] for i in (0, 1)]
            assert [s["pending_ack"] for s in stats] == [0, 0]
            assert [s["backlog"] for s in stats] == [3, 3]
            await subs.ack(consumer, [MessageId(0, 0, 1)], False, T2)  # (another: taken)
            assert subs.stats("t", 0)["s"]["pending_ack"] == 1
        finally:
            await subs.close()
    finally:
        barrier = await store.open_ledger("test/barrier")
        for _ in range(4):
            await barrier.append(b"")
        await store.close()
