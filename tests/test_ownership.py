"""The ownership core (cluster._ownership): every rule, the slot table row by
row, the placement's balance and moves, and convergence over the model store."""

from __future__ import annotations

import random
import zlib
from collections import Counter
from collections.abc import Sequence

import pytest

from cluster import (
    SLOT_RULES,
    Action,
    DropAll,
    Join,
    LeaseTiming,
    Leave,
    Local,
    ModelStore,
    Release,
    Renew,
    SlotAction,
    SlotRelation,
    SlotRow,
    Take,
    View,
    check_history,
    decide,
    placement,
    quotas,
    relation,
    slot_of,
    watch,
)

LEASE = LeaseTiming(ttl=6.0)  # renewed every 2 s: due once 1 s has passed since the last
NOW = 100.0
LIVE = NOW + 5.0  # a lease renewed 1 s ago
DEAD = NOW - 0.5  # expired


def view(brokers: dict[str, float], rows: Sequence[tuple[str | None, int]]) -> View:
    return View(NOW, brokers, tuple(SlotRow(o, e) for o, e in rows))


def takes(actions: Sequence[Action]) -> list[int]:
    return [a.slot for a in actions if isinstance(a, Take)]


def releases(actions: Sequence[Action]) -> list[int]:
    return [a.slot for a in actions if isinstance(a, Release)]


# -- slot_of, quotas, lease timing ----------------------------------------------------


def test_slot_of_is_crc32_of_the_name_modulo_the_slots() -> None:
    assert slot_of("orders", 64) == zlib.crc32(b"orders") % 64
    assert slot_of("caf\u00e9", 7) == zlib.crc32("caf\u00e9".encode()) % 7
    assert {slot_of(f"t{i}", 64) for i in range(2000)} == set(range(64))


def test_slot_of_refuses_no_slots() -> None:
    with pytest.raises(ValueError, match="at least 1, not 0"):
        slot_of("t", 0)


@pytest.mark.parametrize(("slots", "brokers"), [(64, 1), (64, 3), (64, 64), (64, 100), (1024, 7)])
def test_quotas_add_up_and_differ_by_at_most_one(slots: int, brokers: int) -> None:
    live = [f"b{i}" for i in range(brokers)]
    quota = quotas(live, slots)
    assert sum(quota.values()) == slots
    assert max(quota.values()) - min(quota.values()) <= 1
    assert quotas(list(reversed(live)), slots) == quota  # the set counts, not the order


def test_quotas_need_a_live_broker() -> None:
    with pytest.raises(ValueError, match="at least one live broker"):
        quotas([], 64)


def test_lease_timing_defaults_and_refusals() -> None:
    assert LeaseTiming(ttl=6).renew_every == 2
    with pytest.raises(ValueError, match="ttl must be positive, not 0"):
        LeaseTiming(ttl=0)
    with pytest.raises(ValueError, match="between 0 and the ttl"):
        LeaseTiming(ttl=5, renew_every=5)


@pytest.mark.parametrize(
    ("remaining", "due"),
    [(6.0, False), (5.01, False), (5.0, True), (4.0, True), (0.1, True)],
)
def test_renewal_is_due_half_an_interval_after_the_last(remaining: float, due: bool) -> None:
    assert LEASE.renew_due(NOW + remaining, NOW) is due


# -- the slot table -----------------------------------------------------------------


def test_the_slot_table_has_a_row_for_every_pair() -> None:
    assert set(SLOT_RULES) == {(r, t) for r in SlotRelation for t in (True, False)}


def test_a_row_neither_mine_nor_held_nor_placed_on_me_waits() -> None:
    # decide skips these rows without looking them up: the table must agree.
    for r in (SlotRelation.FREE, SlotRelation.EXPIRED, SlotRelation.OTHERS):
        assert SLOT_RULES[r, False] is SlotAction.WAIT


@pytest.mark.parametrize(
    ("row", "held", "expected"),
    [
        (("me", 3), 3, SlotRelation.HELD),
        (("me", 4), 3, SlotRelation.LOST),  # taken again at a later epoch: not by me
        (("b", 4), 3, SlotRelation.LOST),
        ((None, 3), 3, SlotRelation.LOST),
        (("me", 3), None, SlotRelation.MINE_UNHELD),
        ((None, 3), None, SlotRelation.FREE),
        (("dead", 3), None, SlotRelation.EXPIRED),
        (("gone", 3), None, SlotRelation.EXPIRED),  # no broker row at all
        (("b", 3), None, SlotRelation.OTHERS),
    ],
)
def test_relation(row: tuple[str | None, int], held: int | None, expected: SlotRelation) -> None:
    v = view({"me": LIVE, "b": LIVE, "dead": DEAD}, [row])
    assert relation(SlotRow(*row), held, "me", v) is expected


# One concrete situation per row of SLOT_RULES: the live brokers besides "me",
# the slots' rows (slot 0 is the one looked at) and what "me" holds. With two
# slots and two live brokers each keeps the one it owns, and a free or expired
# slot 0 goes to whoever owns nothing. With one slot, the broker ranked first
# (by the hash of its id) gets it: AHEAD ranks before "me", BEHIND after.
CANDIDATES = [f"n{i}" for i in range(20)]
AHEAD = next(n for n in CANDIDATES if quotas(["me", n], 1)[n] == 1)
BEHIND = next(n for n in CANDIDATES if quotas(["me", n], 1)[n] == 0)
Rows = list[tuple[str | None, int]]
SITUATIONS: dict[tuple[SlotRelation, bool], tuple[str, Rows, dict[int, int]]] = {
    (SlotRelation.HELD, True): ("b", [("me", 1), ("b", 1)], {0: 1}),
    (SlotRelation.HELD, False): (AHEAD, [("me", 1)], {0: 1}),
    (SlotRelation.MINE_UNHELD, True): ("b", [("me", 1), ("b", 1)], {}),
    (SlotRelation.MINE_UNHELD, False): (AHEAD, [("me", 1)], {}),
    (SlotRelation.LOST, True): (BEHIND, [(BEHIND, 2)], {0: 1}),
    (SlotRelation.LOST, False): (AHEAD, [(AHEAD, 2)], {0: 1}),
    (SlotRelation.FREE, True): ("b", [(None, 1), ("b", 1)], {}),
    (SlotRelation.FREE, False): ("b", [(None, 1), ("me", 1)], {1: 1}),
    (SlotRelation.EXPIRED, True): ("b", [("dead", 1), ("b", 1)], {}),
    (SlotRelation.EXPIRED, False): ("b", [("dead", 1), ("me", 1)], {1: 1}),
    (SlotRelation.OTHERS, True): (BEHIND, [(BEHIND, 1)], {}),  # its owner will hand it over
    (SlotRelation.OTHERS, False): ("b", [("b", 1), ("me", 1)], {1: 1}),
}


@pytest.mark.parametrize("pair", list(SLOT_RULES), ids=lambda p: f"{p[0].name}-{p[1]}")
def test_each_row_of_the_slot_table(pair: tuple[SlotRelation, bool]) -> None:
    other, rows, held = SITUATIONS[pair]
    v = view({"me": NOW + 5.5, other: LIVE, "dead": DEAD}, rows)  # no renewal due
    assert relation(v.slots[0], held.get(0), "me", v) is pair[0]
    assert (placement(v.live(), [r.owner for r in v.slots])[0] == "me") is pair[1]
    actions = decide(v, Local("me", held), LEASE)
    expected = SLOT_RULES[pair]
    if expected is SlotAction.DROP:
        assert isinstance(actions[0], DropAll)
        assert f"slot 0 held at epoch 1 is owned by {other} at epoch 2" in actions[0].reason
    else:
        assert not any(isinstance(a, DropAll) for a in actions)
        assert (0 in takes(actions)) is (expected is SlotAction.TAKE)
        assert (0 in releases(actions)) is (expected is SlotAction.RELEASE)
    if expected is SlotAction.TAKE:
        assert Take(0, 1) in actions  # at the epoch seen
    if expected is SlotAction.RELEASE:
        assert Release(0, 1) in actions


# -- the broker-wide rules ------------------------------------------------------------


def test_a_failed_store_drops_everything_then_takes_its_rows_again() -> None:
    v = view({"me": LIVE, "b": LIVE}, [("me", 1), ("b", 1)])
    actions = decide(v, Local("me", {0: 1}, store_failed=True), LEASE)
    assert actions == (DropAll("the store failed"), Renew(), Take(0, 1))


def test_draining_leaves_at_once_with_everything() -> None:
    v = view({"me": LIVE, "b": LIVE}, [("me", 1), ("me", 1), ("b", 1)])
    assert decide(v, Local("me", {0: 1, 1: 1}, draining=True), LEASE) == (Leave(),)
    # Rows of mine not held (a lost answer) go too; once all is gone, nothing is left to do.
    assert decide(v, Local("me", {}, draining=True), LEASE) == (Leave(),)
    gone = view({"b": LIVE}, [("b", 2), ("b", 2), ("b", 1)])
    assert decide(gone, Local("me", {}, draining=True), LEASE) == ()


def test_a_failed_store_while_draining_drops_then_leaves() -> None:
    v = view({"me": LIVE}, [("me", 1)])
    actions = decide(v, Local("me", {0: 1}, draining=True, store_failed=True), LEASE)
    assert actions == (DropAll("the store failed"), Leave())


def test_a_lost_lease_drops_everything_and_joins_again() -> None:
    v = view({"me": DEAD, "b": LIVE}, [("me", 1), ("b", 1)])
    assert decide(v, Local("me", {0: 1}), LEASE) == (DropAll("lease lost"), Join())
    # Holding nothing, it just joins again; it takes nothing before it is live.
    assert decide(v, Local("me", {}), LEASE) == (Join(),)


def test_a_new_broker_joins_first() -> None:
    v = view({"b": LIVE}, [(None, 0), (None, 0)])
    assert decide(v, Local("me"), LEASE) == (Join(),)


def test_a_slot_taken_from_under_a_live_broker_drops_everything() -> None:
    # (An operator's forced move, or two processes with one id.) It then acts
    # as a fresh broker: renews, and waits for slot 0 like any other.
    v = view({"me": LIVE, "b": LIVE}, [("b", 5), ("me", 1)])
    actions = decide(v, Local("me", {0: 4, 1: 1}), LEASE)
    assert actions[0] == DropAll("slot 0 held at epoch 4 is owned by b at epoch 5")
    assert actions[1:] == (Renew(), Take(1, 1))


def test_held_slots_that_do_not_exist_are_refused() -> None:
    v = view({"me": LIVE}, [("me", 1)])
    with pytest.raises(ValueError, match=r"held slots \[1, 7\] do not exist \(the cluster has 1\)"):
        decide(v, Local("me", {0: 1, 1: 1, 7: 2}), LEASE)


def test_the_model_store_refuses_slots_that_do_not_exist() -> None:
    store = ModelStore(4, lambda: NOW)
    store.join_now("me", "http://me", 6.0)
    for step in (store.take_now, store.release_now, store.commit_now):
        with pytest.raises(ValueError, match=r"no such slot: \[4\] \(the cluster has 4 slots\)"):
            step("me", {0: 0, 4: 0})
    assert store.slots == [SlotRow(None, 0)] * 4 and len(store.history) == 1


def test_renew_only_when_due() -> None:
    rows = [("me", 1)]
    assert decide(view({"me": NOW + 5.5}, rows), Local("me", {0: 1}), LEASE) == ()
    assert decide(view({"me": NOW + 4.0}, rows), Local("me", {0: 1}), LEASE) == (Renew(),)


def test_order_is_renew_then_releases_then_takes() -> None:
    # "me" holds 3 of 4 slots; "b" (live, joined) owns none; slot 3 is free.
    v = view({"me": LIVE, "b": LIVE}, [("me", 1), ("me", 1), ("me", 1), (None, 1)])
    actions = decide(v, Local("me", {0: 1, 1: 1, 2: 1}), LEASE)
    kinds = [type(a) for a in actions]
    assert kinds == sorted(kinds, key=[Renew, Release, Take].index)
    assert len(releases(actions)) == 1  # keeps 2 (its quota) and hands one to b
    assert takes(actions) == []  # slot 3 is b's to take: b has room, me has none


def test_a_dead_brokers_slots_are_taken_only_once_its_lease_expired() -> None:
    rows = [("x", 1), ("x", 1), ("me", 1), ("me", 1)]
    for until, taken in [(NOW + 0.001, []), (NOW, [0, 1])]:  # expired at now == lease_until
        v = view({"me": LIVE, "x": until}, rows)
        assert takes(decide(v, Local("me", {2: 1, 3: 1}), LEASE)) == taken


def test_lease_times_move_nothing_while_every_lease_holds() -> None:
    # Renewals arriving early or late change lease_until only: the same slots move.
    rng = random.Random(7)
    brokers = [f"b{i}" for i in range(7)]
    owners = [rng.choice([*brokers, None]) for _ in range(64)]
    rows = [(o, 3) for o in owners]
    for me in brokers:
        held = {k: 3 for k, o in enumerate(owners) if o == me}
        first = None
        for _ in range(20):
            leases = {b: NOW + rng.uniform(0.001, 6.0) for b in brokers}
            leases[me] = NOW + 5.5  # (no renewal due: compare slot actions only)
            actions = decide(view(leases, rows), Local(me, held), LEASE)
            first = first if first is not None else actions
            assert actions == first


# -- placement --------------------------------------------------------------------------


def grow(slots: int, brokers: list[str]) -> list[str]:
    """The owners after the brokers joined one at a time, each join settled."""
    owners: list[str | None] = [None] * slots
    for i in range(1, len(brokers) + 1):
        owners = list(placement(brokers[:i], owners))
    return owners  # type: ignore[return-value]


def moves(before: Sequence[str | None], after: Sequence[str]) -> int:
    return sum(1 for b, a in zip(before, after, strict=True) if b is not None and b != a)


@pytest.mark.parametrize("slots", [64, 1024])
def test_placement_is_balanced_from_any_ownership(slots: int) -> None:
    rng = random.Random(slots)
    for n in (1, 2, 3, 10, 63, 64, 65, 150):
        live = [f"b{i}" for i in range(n)]
        owners = [rng.choice([*live, "gone", None]) for _ in range(slots)]
        count = Counter(placement(live, owners))
        assert sum(count.values()) == slots
        assert set(count) <= set(live)
        assert max(count.values()) - min(count[b] for b in live) <= 1
        assert count == Counter(quotas(live, slots))


def test_placement_keeps_what_is_within_quota() -> None:
    live = ["a", "b", "c"]
    owners = ["a"] * 10 + ["b"] * 4 + [None] * 8  # 22 slots: quotas 7, 7, 8 in some order
    target = placement(live, owners)
    quota = quotas(live, 22)
    assert target[10:14] == ["b"] * 4  # b is under quota: keeps all
    assert sum(1 for k in range(10) if target[k] == "a") == quota["a"]  # a keeps its quota


@pytest.mark.parametrize("slots", [64, 1024])
def test_a_join_moves_exactly_the_joiners_share(slots: int) -> None:
    brokers = [f"b{i}" for i in range(40)]
    owners: list[str | None] = [None] * slots
    for n in range(1, len(brokers) + 1):
        live = brokers[:n]
        target = placement(live, owners)
        assert moves(owners, target) == (0 if n == 1 else target.count(live[-1]))
        # Nobody but the joiner gains.
        if n > 1:
            before = Counter(owners)
            assert all(target.count(b) <= before[b] for b in live[:-1])
        owners = list(target)


@pytest.mark.parametrize("slots", [64, 1024])
def test_a_death_moves_exactly_the_dead_brokers_slots(slots: int) -> None:
    brokers = [f"b{i}" for i in range(40)]
    owners = grow(slots, brokers)
    rng = random.Random(slots)
    live = list(brokers)
    while len(live) > 1:
        dead = live.pop(rng.randrange(len(live)))
        target = placement(live, owners)
        assert moves(owners, target) == owners.count(dead)
        before = Counter(owners)
        assert all(target.count(b) >= before[b] for b in live)  # nobody loses
        owners = target


def test_placement_is_the_same_whatever_the_order_of_the_live_list() -> None:
    live = [f"b{i}" for i in range(9)]
    owners = [random.Random(3).choice([*live, None]) for _ in range(100)]
    assert placement(live, owners) == placement(list(reversed(live)), owners)


# -- convergence over the model store -----------------------------------------------------


class Rounds:
    """Every broker looks at the store in turn, and acts on it at once."""

    def __init__(self, slots: int) -> None:
        self.now = 0.0
        self.store = ModelStore(slots, lambda: self.now)
        self.held: dict[str, dict[int, int]] = {}
        self.draining: set[str] = set()

    def look(self, me: str) -> tuple[Action, ...]:
        held = self.held.setdefault(me, {})
        actions = decide(self.store.snapshot(), Local(me, held, me in self.draining), LEASE)
        for a in actions:
            if isinstance(a, DropAll):
                held.clear()
            elif isinstance(a, Join):
                self.store.join_now(me, f"http://{me}", LEASE.ttl)
            elif isinstance(a, Renew):
                assert self.store.renew_now(me, LEASE.ttl) is not None
            elif isinstance(a, Leave):
                held.clear()
                self.store.leave_now(me)
            elif isinstance(a, Release):
                held.pop(a.slot, None)
                assert self.store.release_now(me, {a.slot: a.epoch})
            elif isinstance(a, Take):
                won = self.store.take_now(me, {a.slot: a.epoch})
                assert won, (me, a)
                held.update(won)
        return actions

    def settle(self, brokers: list[str], rounds: int = 10) -> int:
        """Rounds until nobody does anything but renew; returns how many."""
        for n in range(rounds):
            busy = False
            for me in brokers:
                busy |= any(not isinstance(a, Renew) for a in self.look(me))
            self.now += 1.0  # (every lease is renewed each round: none expires)
            if not busy:
                return n
        raise AssertionError(f"not settled after {rounds} rounds")

    def takes_by_other(self, since: int) -> int:
        """Slots taken by a broker other than their previous taker."""
        last: dict[int, str] = {}
        moved = 0
        for i, event in enumerate(self.store.history):
            if event.kind.value != "take":
                continue
            for k, _ in event.slots:
                if i >= since and k in last and last[k] != event.broker:
                    moved += 1
                last[k] = event.broker
        return moved

    def counts(self, brokers: list[str]) -> list[int]:
        return [sum(1 for r in self.store.slots if r.owner == b) for b in brokers]


def test_brokers_converge_to_a_balance_and_join_and_drain_move_only_what_they_must() -> None:
    r = Rounds(64)
    brokers = [f"b{i}" for i in range(5)]
    r.settle(brokers[:1])
    assert r.counts(brokers[:1]) == [64]
    for n in range(2, 6):
        mark = len(r.store.history)
        assert r.settle(brokers[:n]) <= 3  # release, take, quiet
        counts = r.counts(brokers[:n])
        assert max(counts) - min(counts) <= 1 and sum(counts) == 64
        assert r.takes_by_other(mark) == counts[-1]  # the joiner's share, no more
    # SIGTERM: b2 hands everything over at once; the others take it at their next look.
    mark = len(r.store.history)
    share = r.counts(["b2"])[0]
    r.draining.add("b2")
    r.settle(brokers)
    rest = [b for b in brokers if b != "b2"]
    assert "b2" not in r.store.brokers and r.counts(["b2"]) == [0]
    assert sorted(r.counts(rest)) == [16, 16, 16, 16]
    assert r.takes_by_other(mark) == share  # b2's slots, nothing else moved
    assert check_history(r.store.history, 64) == []


def test_a_dead_broker_is_replaced_after_its_lease_and_its_restart_takes_a_share_back() -> None:
    r = Rounds(64)
    brokers = ["a", "b", "c", "d"]
    for n in range(1, 5):
        r.settle(brokers[:n])
    dead_share = r.counts(["c"])[0]
    alive = ["a", "b", "d"]
    # c stops renewing: nothing moves until its lease expires, then its slots only.
    mark = len(r.store.history)
    for _ in range(5):  # 5 s < ttl since c's last renewal (up to 1 s ago)
        for me in alive:
            assert not takes(r.look(me))
        r.now += 1.0
    r.now += 1.0
    r.settle(alive)
    assert r.takes_by_other(mark) == dead_share
    assert sorted(r.counts(alive)) == [21, 21, 22]
    # c comes back (a restart: nothing held, its row expired): joins and gets a share.
    mark = len(r.store.history)
    r.held["c"] = {}
    r.settle(brokers)
    assert sorted(r.counts(brokers)) == [16, 16, 16, 16]
    assert r.takes_by_other(mark) == 16
    assert check_history(r.store.history, 64) == []


def test_a_quick_restart_takes_its_own_rows_back_without_waiting_for_its_lease() -> None:
    r = Rounds(16)
    for n in (1, 2):
        r.settle(["a", "b"][:n])
    mine = {k for k, row in enumerate(r.store.slots) if row.owner == "a"}
    r.held["a"] = {}  # restarted within its lease: nothing in memory, its row still live
    actions = r.look("a")
    assert set(takes(actions)) == mine  # MINE_UNHELD and placed on it: taken again
    assert all(r.store.slots[k].owner == "a" and r.store.slots[k].epoch == 2 for k in mine)


# -- watch: looking when a broker that missed a renewal would leave slots here -----------


def test_watch_names_the_expiry_of_a_broker_that_missed_a_renewal() -> None:
    # ttl 6, renewed every 2 s: a lease with less than 3 s left missed a renewal.
    rows = [("me", 1), ("x", 1), ("y", 1), ("x", 1)]
    late = NOW + 2.5
    v = view({"me": LIVE, "x": late, "y": LIVE}, rows)
    assert watch(v, "me", LEASE) == late
    assert watch(view({"me": LIVE, "x": NOW + 3.5, "y": LIVE}, rows), "me", LEASE) is None


def test_watch_ignores_a_late_broker_whose_slots_would_go_elsewhere() -> None:
    # x owns nothing: its expiry changes nothing for me.
    v = view({"me": LIVE, "x": NOW + 1, "y": LIVE}, [("me", 1), ("y", 1)])
    assert watch(v, "me", LEASE) is None
    # Nor does anything matter to a broker that is not live itself.
    v = view({"me": DEAD, "x": NOW + 1}, [("x", 1)])
    assert watch(v, "me", LEASE) is None


def test_watch_takes_the_earliest_of_several_late_brokers() -> None:
    rows = [("x", 1), ("y", 1), ("x", 1), ("y", 1)]  # either's death gives me 2
    v = view({"me": LIVE, "x": NOW + 2, "y": NOW + 1}, rows)
    assert watch(v, "me", LEASE) == NOW + 1
