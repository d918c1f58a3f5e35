"""Unit tests of the cursor's range sets (subscriptions._ranges): every
operation checked against a plain set of positions, on random workloads."""

from __future__ import annotations

import itertools
import random

import pytest

from subscriptions._ranges import DeliveredMap, LockTable, RangeSet, positions_of, ranges_of

T1, T2, T3 = (1, 1), (1, 2), (2, 7)


def test_ranges_of_and_positions_of() -> None:
    positions = [(3, 0), (3, 1), (3, 2), (3, 5), (4, 0), (4, 1), (3, 6)]
    assert ranges_of(positions) == [(3, 0, 2), (3, 5, 5), (4, 0, 1), (3, 6, 6)]
    assert positions_of(ranges_of(positions)) == positions
    assert ranges_of([]) == [] and positions_of([]) == []


def test_adding_merges_touching_and_overlapping_runs() -> None:
    s = RangeSet()
    s.add_range(5, 4, 6)
    s.add_range(5, 0, 1)
    s.add_range(5, 2, 3)  # touches both: one run
    assert list(s.ranges()) == [(5, 0, 6)] and len(s) == 7
    s.add_range(5, 3, 9)  # overlaps
    s.add_range(2, 0, 0)
    assert list(s.ranges()) == [(2, 0, 0), (5, 0, 9)] and len(s) == 11
    assert s.overlap(5, 10, 20) is None and s.overlap(5, 8, 20) == 8 and s.overlap(4, 0, 9) is None
    assert s.take_run((5, 1)) is None and s.take_run((5, 0)) == 9 and not s.has_entry(5)
    assert list(s) == [(2, 0)]


@pytest.mark.parametrize("seed", range(20))
def test_a_range_set_is_the_set_of_its_positions(seed: int) -> None:
    rng = random.Random(seed)
    s, model = RangeSet(), set()
    for _ in range(300):
        entry = rng.randrange(6)
        a = rng.randrange(30)
        b = a + rng.randrange(8)
        op = rng.random()
        if op < 0.5:
            s.add_range(entry, a, b)
            model.update((entry, i) for i in range(a, b + 1))
        elif op < 0.7:
            s.discard_range(entry, a, b)
            model.difference_update((entry, i) for i in range(a, b + 1))
        elif op < 0.8:
            bound = (entry, a)
            s.drop_through(bound)
            model = {p for p in model if p > bound}
        elif op < 0.9:
            last = s.take_run((entry, a))
            if (entry, a) in model and (entry, a - 1) not in model:
                assert last is not None
                run = range(a, last + 1)
                assert all((entry, i) in model for i in run) and (entry, last + 1) not in model
                model.difference_update((entry, i) for i in run)
            else:
                assert last is None
        else:
            hit = s.overlap(entry, a, b)
            inside = [i for i in range(a, b + 1) if (entry, i) in model]
            assert hit == (inside[0] if inside else None)
        assert list(s) == sorted(model) and len(s) == len(model)
        assert all(p in s for p in model)
        assert (entry, a) in s if (entry, a) in model else (entry, a) not in s
        runs = list(s.ranges())
        for (e1, _, l1), (e2, f2, _) in itertools.pairwise(runs):
            assert e1 < e2 or f2 > l1 + 1  # disjoint and apart
    assert RangeSet(model) == s and s.copy() == s


@pytest.mark.parametrize("seed", range(10))
def test_a_lock_table_is_its_locked_positions(seed: int) -> None:
    rng = random.Random(seed)
    table: LockTable = LockTable()
    model: dict[tuple[int, int], tuple[int, int]] = {}
    for _ in range(200):
        txn = rng.choice([T1, T2, T3])
        if rng.random() < 0.7:
            entry, a = rng.randrange(5), rng.randrange(20)
            b = a + rng.randrange(5)
            positions = [(entry, i) for i in range(a, b + 1)]
            clash = next((p for p in positions if p in model), None)
            hit = table.overlap(entry, a, b)
            assert (hit is None) == (clash is None)
            if hit is not None:
                assert clash is not None and hit == (clash[1], model[clash])
                continue
            table.lock(txn, [(entry, a, b)])
            model.update(dict.fromkeys(positions, txn))
        else:
            mine = sorted(p for p, t in model.items() if t == txn)
            assert positions_of(table.unlock(txn)) == mine
            for p in mine:
                del model[p]
        assert len(table) == len(model)
        assert dict(table.positions()) == model
        for p, t in model.items():
            assert table.holder(p) == t
        for t in (T1, T2, T3):
            assert table.count(t) == sum(1 for x in model.values() if x == t)


@pytest.mark.parametrize("seed", range(10))
def test_a_delivered_map_is_a_dict_of_positions(seed: int) -> None:
    rng = random.Random(seed)
    delivered: DeliveredMap[str] = DeliveredMap()
    model: dict[tuple[int, int], str] = {}
    for _ in range(300):
        entry, a = rng.randrange(5), rng.randrange(20)
        b = a + rng.randrange(6)
        who = rng.choice("xyz")
        op = rng.random()
        if op < 0.3:
            delivered.deliver_range(entry, a, b, who)
            model.update({(entry, i): who for i in range(a, b + 1)})
        elif op < 0.45:
            indexes = sorted(rng.sample(range(30), rng.randrange(1, 6)))
            delivered.deliver(entry, indexes, who)
            model.update({(entry, i): who for i in indexes})
        elif op < 0.6:
            positions = [(entry, i) for i in range(a, b + 1)]
            rng.shuffle(positions)
            delivered.forget(positions)
            for p in positions:
                model.pop(p, None)
        elif op < 0.7:
            gone = delivered.discard_range(entry, a, b)
            assert gone == sum(1 for i in range(a, b + 1) if (entry, i) in model)
            for i in range(a, b + 1):
                model.pop((entry, i), None)
        elif op < 0.8 and model:
            pos = rng.choice(sorted(model))
            del delivered[pos]
            del model[pos]
        elif op < 0.9:
            delivered[(entry, a)] = who
            model[(entry, a)] = who
        else:
            bound = (entry, a)
            assert delivered.through(bound) == sorted(p for p in model if p <= bound)
        assert dict(delivered.items()) == model and len(delivered) == len(model)
        assert list(delivered) == sorted(model)
        assert delivered.of(who) == sorted(p for p, c in model.items() if c == who)
        for i in range(0, 30, 7):
            assert ((entry, i) in delivered) == ((entry, i) in model)
            assert delivered.get((entry, i)) == model.get((entry, i))
