"""The deduplication state of one producer (`buffer._dedup`): where its
recent messages were stored, answered by sequence id."""

from __future__ import annotations

import pytest

from buffer import _dedup
from buffer._dedup import DedupState, ProducerSequence


def test_lookup_finds_each_recent_message_where_it_was_stored() -> None:
    seq = ProducerSequence()
    assert seq.lookup(0) is None  # (nothing stored yet)
    seq.record([0, 1, 2], 10)
    seq.record([5, 7, 8], 11)  # (not consecutive: 3, 4 and 6 were never sent)
    seq.record([9], 14)
    assert [seq.lookup(s) for s in (0, 1, 2)] == [(10, 0), (10, 1), (10, 2)]
    assert [seq.lookup(s) for s in (5, 7, 8)] == [(11, 0), (11, 1), (11, 2)]
    assert seq.lookup(9) == (14, 0)
    assert [seq.lookup(s) for s in (3, 4, 6, 10, -1)] == [None] * 5
    assert (seq.pushed, seq.persisted) == (9, 9)


def test_only_the_last_entries_are_remembered(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_dedup, "RECENT_ENTRIES", 4)
    seq = ProducerSequence()
    seq.record([0, 2], 0)  # (not consecutive: its ids go with it when it is forgotten)
    for i in range(1, 9):
        seq.record([2 * i + 1], i)
    # Nine entries passed twice four: the four oldest are forgotten.
    assert [seq.lookup(s) for s in (0, 2, 3, 5, 7)] == [None] * 5
    assert [seq.lookup(2 * i + 1) for i in range(4, 9)] == [(i, 0) for i in range(4, 9)]
    assert seq._gaps == {}
    assert seq.persisted == 17


def test_snapshot_and_restore_keep_the_highest_durable_sequence_id() -> None:
    state = DedupState()
    state.get("a").record([3, 4], 0)
    state.get("b").pushed = 7  # (pushed, not durable: not in the snapshot)
    assert state.snapshot() == {"a": 4}
    other = DedupState()
    other.restore({"a": 4, "c": 2})
    assert [other.last_sequence_id(p) for p in ("a", "c", "d")] == [4, 2, -1]
    assert other.get("a").pushed == 4
