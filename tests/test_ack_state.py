"""The ack state table and the Cursor that applies it (pure, no I/O)."""

from __future__ import annotations

import enum
import itertools
import json
import random
from collections.abc import Callable

import pytest

from subscriptions import (
    TRANSITIONS,
    WHOLE_ENTRY,
    AckEvent,
    Cursor,
    InvalidAckTransition,
    MsgState,
    transition,
)
from subscriptions._cursor import CUMULATIVE, INDIVIDUAL, decode_record, encode_record

Position = tuple[int, int]
START: Position = (-1, WHOLE_ENTRY)  # nothing deleted yet

# -- the state table -----------------------------------------------------------

EXPECTED_TABLE = {  # PIP-31 §PENDING_ACK State
    (MsgState.PENDING, AckEvent.ACK): MsgState.DELETED,
    (MsgState.DELETED, AckEvent.ACK): MsgState.DELETED,  # acks are idempotent
    (MsgState.PENDING_ACK, AckEvent.ACK): MsgState.PENDING_ACK,  # a normal ack is dropped
    (MsgState.PENDING, AckEvent.TXN_ACK): MsgState.PENDING_ACK,
    (MsgState.PENDING_ACK, AckEvent.TXN_COMMIT): MsgState.DELETED,
    (MsgState.PENDING_ACK, AckEvent.TXN_ABORT): MsgState.PENDING,
}
MISSING_ROWS = [key for key in itertools.product(MsgState, AckEvent) if key not in EXPECTED_TABLE]


def test_table_has_exactly_the_documented_rows() -> None:
    assert TRANSITIONS == EXPECTED_TABLE


@pytest.mark.parametrize(("key", "after"), list(EXPECTED_TABLE.items()))
def test_every_row(key: tuple[MsgState, AckEvent], after: MsgState) -> None:
    state, event = key
    assert transition(state, event) is after


def test_the_missing_rows_are_the_conflicts() -> None:
    assert set(MISSING_ROWS) == {
        (MsgState.PENDING_ACK, AckEvent.TXN_ACK),  # held by a transaction
        (MsgState.DELETED, AckEvent.TXN_ACK),  # already acknowledged
        (MsgState.PENDING, AckEvent.TXN_COMMIT),
        (MsgState.PENDING, AckEvent.TXN_ABORT),
        (MsgState.DELETED, AckEvent.TXN_COMMIT),
        (MsgState.DELETED, AckEvent.TXN_ABORT),
    }


@pytest.mark.parametrize(("state", "event"), MISSING_ROWS)
def test_event_without_a_row_raises_and_changes_nothing(state: MsgState, event: AckEvent) -> None:
    before = dict(TRANSITIONS)
    with pytest.raises(InvalidAckTransition) as info:
        transition(state, event)
    assert info.value.state is state
    assert info.value.event is event
    assert event.value in str(info.value) and state.value in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert TRANSITIONS == before


class _ForeignEvent(enum.Enum):
    TXN_ACK = "TXN_ACK"  # same value, not our enum: no row


def test_an_event_of_another_enum_has_no_row() -> None:
    with pytest.raises(InvalidAckTransition):
        transition(MsgState.PENDING, _ForeignEvent.TXN_ACK)  # type: ignore[arg-type]


def test_removed_row_is_refused_by_transition(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(TRANSITIONS, (MsgState.DELETED, AckEvent.ACK))
    with pytest.raises(InvalidAckTransition):
        transition(MsgState.DELETED, AckEvent.ACK)
    assert transition(MsgState.PENDING, AckEvent.ACK) is MsgState.DELETED


def test_cursor_refusing_an_individual_ack_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cursor = Cursor((0, 1))
    cursor.acked.add((1, 1))
    monkeypatch.delitem(TRANSITIONS, (MsgState.DELETED, AckEvent.ACK))
    for pos in [(0, 0), (1, 1)]:  # below mark-delete / individually acked
        with pytest.raises(InvalidAckTransition):
            cursor.apply(INDIVIDUAL, [pos], sizes({0: 3, 1: 3}), 1)
        assert cursor.mark_delete == (0, 1)
        assert list(cursor.acked) == [(1, 1)]


def test_cursor_refusing_a_cumulative_ack_changes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cursor = Cursor((0, 1))
    cursor.acked.add((1, 1))
    monkeypatch.delitem(TRANSITIONS, (MsgState.PENDING, AckEvent.ACK))
    with pytest.raises(InvalidAckTransition):
        cursor.apply(CUMULATIVE, [(1, 2)], sizes({0: 3, 1: 3}), 1)
    assert cursor.mark_delete == (0, 1)
    assert list(cursor.acked) == [(1, 1)]


# -- the cursor ----------------------------------------------------------------


def sizes(counts: dict[int, int]) -> Callable[[int], int]:
    return lambda entry_id: counts.get(entry_id, 0)


THREES = {e: 3 for e in range(5)}  # entries 0..4 of 3 messages each
LAST = 4


def ack(cursor: Cursor, *positions: Position, counts: dict[int, int] = THREES) -> list[Position]:
    return cursor.apply(INDIVIDUAL, list(positions), sizes(counts), max(counts))


def test_state_of_positions() -> None:
    cursor = Cursor((1, 1))
    cursor.acked.add((2, 0))
    assert cursor.state((0, 2)) is MsgState.DELETED
    assert cursor.state((1, 1)) is MsgState.DELETED
    assert cursor.state((1, 2)) is MsgState.PENDING
    assert cursor.state((2, 0)) is MsgState.DELETED
    assert cursor.state((2, 1)) is MsgState.PENDING


def test_first_open_entry() -> None:
    assert Cursor(START).first_open_entry() == 0
    assert Cursor((3, WHOLE_ENTRY)).first_open_entry() == 4
    assert Cursor((3, 1)).first_open_entry() == 3


def test_out_of_order_individual_acks_advance_only_when_contiguous() -> None:
    cursor = Cursor(START)
    assert ack(cursor, (0, 2)) == [(0, 2)]
    assert cursor.mark_delete == START
    assert ack(cursor, (0, 1)) == [(0, 1)]
    assert cursor.mark_delete == START
    assert list(cursor.acked) == [(0, 1), (0, 2)]
    assert ack(cursor, (1, 1)) == [(1, 1)]
    assert cursor.mark_delete == START
    # (0, 0) closes the gap: mark-delete moves over entry 0 and stops before (1, 0).
    assert ack(cursor, (0, 0)) == [(0, 0)]
    assert cursor.mark_delete == (0, WHOLE_ENTRY)
    assert cursor.first_open_entry() == 1
    assert list(cursor.acked) == [(1, 1)]
    assert ack(cursor, (1, 0)) == [(1, 0)]
    assert cursor.mark_delete == (1, 1)
    assert list(cursor.acked) == []
    assert ack(cursor, (1, 2), (2, 0)) == [(1, 2), (2, 0)]
    assert cursor.mark_delete == (2, 0)
    assert cursor.state((2, 1)) is MsgState.PENDING


@pytest.mark.parametrize("seed", range(20))
def test_out_of_order_acks_advance_as_a_simple_model_says(seed: int) -> None:
    """Random groups of messages acknowledged in random order (runs with and
    without gaps inside entries, as shared subscriptions make them): after
    each group, mark-delete is the last message of the longest acknowledged
    prefix, and ``acked`` holds exactly the acknowledged messages past it."""
    rng = random.Random(seed)
    counts = {e: rng.choice([1, 2, 5, 40, 100]) for e in range(6)}
    everything = [(e, i) for e, n in counts.items() for i in range(n)]
    order = everything[:]
    rng.shuffle(order)
    cursor, done = Cursor(START), set()
    while order:
        size = rng.randint(1, 60)
        group, order = order[:size], order[size:]
        group.sort()
        ack(cursor, *group, counts=counts)
        done.update(group)
        prefix = list(itertools.takewhile(done.__contains__, everything))
        if not prefix:
            expected_md = START
        elif prefix[-1][1] == counts[prefix[-1][0]] - 1:
            expected_md = (prefix[-1][0], WHOLE_ENTRY)
        else:
            expected_md = prefix[-1]
        assert cursor.mark_delete == expected_md
        assert list(cursor.acked) == sorted(done - set(prefix))


def test_mark_delete_stops_at_the_last_entry() -> None:
    cursor = Cursor((LAST, 1))
    ack(cursor, (LAST, 2))
    assert cursor.mark_delete == (LAST, WHOLE_ENTRY)
    assert not cursor.acked


def test_cumulative_ack_removes_acked_entries_below_it() -> None:
    cursor = Cursor(START)
    ack(cursor, (0, 1), (1, 1), (3, 0), (3, 2))
    cursor.apply(CUMULATIVE, [(2, 1)], sizes(THREES), LAST)
    assert cursor.mark_delete == (2, 1)
    assert list(cursor.acked) == [(3, 0), (3, 2)]
    # The next cumulative ack reaches (3, 0) and advances over the rest of entry 3.
    cursor.apply(CUMULATIVE, [(3, 1)], sizes(THREES), LAST)
    assert cursor.mark_delete == (3, WHOLE_ENTRY)
    assert list(cursor.acked) == []


def test_cumulative_ack_then_acked_messages_after_it_advance() -> None:
    cursor = Cursor(START)
    ack(cursor, (1, 0), (1, 1))
    assert cursor.mark_delete == START
    cursor.apply(CUMULATIVE, [(0, 2)], sizes(THREES), LAST)
    assert cursor.mark_delete == (1, 1)
    assert not cursor.acked


def test_cumulative_ack_uses_the_highest_position_of_a_record() -> None:
    cursor = Cursor(START)
    cursor.apply(CUMULATIVE, [(0, 1), (2, 0), (1, 0)], sizes(THREES), LAST)
    assert cursor.mark_delete == (2, 0)


def test_acks_of_deleted_messages_are_idempotent() -> None:
    cursor = Cursor(START)
    ack(cursor, (0, 0), (0, 1), (2, 2))
    cursor.apply(CUMULATIVE, [(1, 0)], sizes(THREES), LAST)
    md, acked = cursor.mark_delete, list(cursor.acked)
    assert (md, acked) == ((1, 0), [(2, 2)])
    assert ack(cursor, (0, 0)) == []  # below mark-delete
    assert ack(cursor, (1, 0)) == []  # at mark-delete
    assert ack(cursor, (2, 2)) == []  # individually acked
    assert ack(cursor, (2, 2), (2, 2)) == []
    assert cursor.apply(CUMULATIVE, [(0, 2)], sizes(THREES), LAST) == []
    assert cursor.apply(CUMULATIVE, [(1, 0)], sizes(THREES), LAST) == []
    assert (cursor.mark_delete, list(cursor.acked)) == (md, acked)


def test_the_same_position_twice_in_one_record_is_deleted_once() -> None:
    cursor = Cursor(START)
    assert ack(cursor, (3, 1), (3, 1)) == [(3, 1)]
    assert list(cursor.acked) == [(3, 1)]


def test_empty_entries_are_skipped_when_advancing() -> None:
    counts = {0: 3, 1: 0, 2: 0, 3: 2, 4: 0}
    cursor = Cursor(START)
    ack(cursor, (0, 0), (0, 1), (0, 2), counts=counts)
    assert cursor.mark_delete == (2, WHOLE_ENTRY)  # over the empty entries 1 and 2
    assert cursor.first_open_entry() == 3
    ack(cursor, (3, 1), counts=counts)
    assert cursor.mark_delete == (2, WHOLE_ENTRY)
    ack(cursor, (3, 0), counts=counts)
    assert cursor.mark_delete == (4, WHOLE_ENTRY)  # entry 4 is empty and the last


def test_empty_entries_after_the_last_entry_are_not_skipped() -> None:
    counts = {0: 1, 1: 0, 2: 0}
    cursor = Cursor(START)
    cursor.apply(INDIVIDUAL, [(0, 0)], sizes(counts), 0)
    assert cursor.mark_delete == (0, WHOLE_ENTRY)


def test_empty_entries_at_the_start_are_skipped() -> None:
    counts = {0: 0, 1: 0, 2: 2}
    cursor = Cursor(START)
    ack(cursor, (2, 0), counts=counts)
    assert cursor.mark_delete == (2, 0)


# -- records ---------------------------------------------------------------------


def sample_cursor() -> Cursor:
    cursor = Cursor((5, 1))
    cursor.acked.update([(5, 3), (7, 0), (2**40 - 1, WHOLE_ENTRY - 1)])
    return cursor


def same(a: Cursor, b: Cursor) -> bool:
    return a.mark_delete == b.mark_delete and list(a.acked) == list(b.acked)


@pytest.mark.parametrize("cursor", [Cursor(START), Cursor((3, WHOLE_ENTRY)), sample_cursor()])
def test_snapshot_round_trip(cursor: Cursor) -> None:
    data = cursor.snapshot()
    json.loads(data)  # plain JSON
    back = Cursor.from_snapshot(data)
    assert same(back, cursor)
    assert isinstance(back.mark_delete, tuple)
    assert all(isinstance(p, tuple) for p in back.acked)


def test_from_snapshot_rejects_an_odd_acked_list() -> None:
    with pytest.raises(ValueError):
        Cursor.from_snapshot(b'{"md": [0, 0], "acked": [1, 2, 3]}')


def test_copy_is_independent() -> None:
    cursor = sample_cursor()
    other = cursor.copy()
    assert same(other, cursor)
    ack(other, (5, 2))
    assert cursor.mark_delete == (5, 1)
    assert (5, 2) not in cursor.acked


@pytest.mark.parametrize(
    "positions",
    [[], [(0, 0)], [(1, 2), (3, 4)], [(2**40 - 1, WHOLE_ENTRY), (-1, WHOLE_ENTRY), (0, 0)]],
)
def test_encode_decode_record_round_trip(positions: list[Position]) -> None:
    data = encode_record(positions)
    assert len(data) == 16 * len(positions)
    decoded = decode_record(data)
    assert decoded == positions
    assert all(type(p) is tuple and all(type(x) is int for x in p) for p in decoded)


@pytest.mark.parametrize("data", [b"\x00" * 8, b"\x00" * 9, b"\x00" * 17])
def test_decode_record_rejects_torn_records(data: bytes) -> None:
    with pytest.raises(ValueError):
        decode_record(data)


# -- live vs replay (property style) -----------------------------------------------

COUNTS = {0: 3, 1: 1, 2: 0, 3: 4, 4: 2, 5: 0, 6: 0, 7: 3, 8: 1}
LAST_ENTRY = max(COUNTS)
ALL_POSITIONS = [(e, i) for e in sorted(COUNTS) for i in range(COUNTS[e])]


def random_records(rng: random.Random) -> list[tuple[int, list[Position]]]:
    records: list[tuple[int, list[Position]]] = []
    order = ALL_POSITIONS[:]
    rng.shuffle(order)
    while order:
        if rng.random() < 0.15:
            records.append((CUMULATIVE, [rng.choice(ALL_POSITIONS)]))
        n = rng.randint(1, 3)
        batch, order = order[:n], order[n:]
        if rng.random() < 0.2:
            batch.append(rng.choice(ALL_POSITIONS))  # a re-sent ack
        records.append((INDIVIDUAL, batch))
    return records


def check_against_model(cursor: Cursor, deleted: set[Position]) -> None:
    for pos in ALL_POSITIONS:
        assert (cursor.state(pos) is MsgState.DELETED) == (pos in deleted), pos
    # Mark-delete went as far as it could: the first message after it is not deleted.
    after = [p for p in ALL_POSITIONS if p > cursor.mark_delete]
    if after:
        assert after[0] not in deleted
    assert all(p > cursor.mark_delete for p in cursor.acked)


@pytest.mark.parametrize("seed", range(40))
def test_replaying_records_gives_the_live_cursor(seed: int) -> None:
    rng = random.Random(seed)
    count = sizes(COUNTS)
    live = Cursor(START)
    log: list[tuple[int, bytes]] = []
    model: set[Position] = set()
    snapshots: list[tuple[int, bytes]] = []  # (records before it, snapshot)
    for kind, positions in random_records(rng):
        log.append((kind, encode_record(positions)))
        newly = live.apply(kind, positions, count, LAST_ENTRY)
        if kind == INDIVIDUAL:
            fresh = [p for p in dict.fromkeys(positions) if p not in model]
            assert newly == fresh
            model.update(positions)
        else:
            model.update(p for p in ALL_POSITIONS if p <= positions[0])
        check_against_model(live, model)
        if rng.random() < 0.2:
            snapshots.append((len(log), live.snapshot()))
    assert model == set(ALL_POSITIONS)
    assert live.mark_delete == (LAST_ENTRY, WHOLE_ENTRY)
    assert not live.acked

    # Recovery: from the start, and from every snapshot, through the same apply.
    for start, snap in [(0, Cursor(START).snapshot()), *snapshots]:
        replayed = Cursor.from_snapshot(snap)
        for kind, data in log[start:]:
            replayed.apply(kind, decode_record(data), count, LAST_ENTRY)
        assert same(replayed, live)


@pytest.mark.parametrize("seed", range(20))
def test_replaying_a_prefix_gives_the_live_cursor_at_that_point(seed: int) -> None:
    rng = random.Random(1000 + seed)
    count = sizes(COUNTS)
    live = Cursor(START)
    history: list[Cursor] = []
    records = random_records(rng)
    for kind, positions in records:
        live.apply(kind, positions, count, LAST_ENTRY)
        history.append(live.copy())
    for n in sorted(rng.sample(range(len(records)), min(5, len(records)))):
        replayed = Cursor(START)
        for kind, positions in itertools.islice(records, n + 1):
            replayed.apply(kind, decode_record(encode_record(positions)), count, LAST_ENTRY)
        assert same(replayed, history[n])
