"""Which slots this broker should own, and what it does about it: no I/O.

`decide(view, local, lease)` is a pure function. ``view`` is one snapshot of
the cluster database (the ``brokers`` and ``slots`` tables and the
database's ``now``), ``local`` what this broker holds in memory; the answer
is the actions to take, in order. The driver (`cluster.Member`) reads the
view, calls `decide`, and carries the actions out against the store; the
simulation (`bench.clustersim`) runs the same function for every broker.

The broker-wide rules, first match wins:

    1. the store failed (a commit was fenced, or its outcome is unknown)
                                          -> DROP_ALL, then act as a fresh broker
    2. draining (SIGTERM)                 -> LEAVE: release every row of mine and
                                             delete my broker row, one transaction
    3. my lease is gone (no row, or expired by the database's clock)
                                          -> DROP_ALL (if I hold anything), JOIN
    4. a slot I hold is owned by someone else, or at another epoch
                                          -> DROP_ALL, then act as a fresh broker
    5. otherwise                          -> RENEW when due, then each slot's row
                                             of `SLOT_RULES`

Each slot is classified by how its row relates to this broker
(`SlotRelation`) and whether `placement` gives it to this broker; the table
`SLOT_RULES` maps the pair to what to do. Taking a slot of another broker
happens only once that broker's lease has expired (EXPIRED); a live owner
hands a slot over by releasing it (its row's owner becomes NULL), and the
target takes the free row at its next look.

Placement is *sticky fair share*: every live broker has a quota, the
floor or ceiling of S/N (which brokers get the ceiling depends on a
stable hash of their ids only), keeps up to its quota of the slots it owns,
and the rest (free rows, rows of expired brokers, a broker's slots beyond its
quota) go to the brokers under their quota, each slot to the one that
scores highest for it (rendezvous hashing among those with room). So the
largest and smallest share differ by at most one slot, a join moves exactly
the joiner's quota and a death exactly the dead broker's slots (no other
broker gains on a join nor loses on a death), and the answer depends on
which brokers are live and who owns what, never on lease times: renewals
arriving early or late move nothing. docs/scaling.md has the measurements
against plain and bounded-load rendezvous hashing.
"""

from __future__ import annotations

import enum
import functools
import hashlib
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

__all__ = [
    "SLOT_RULES",
    "Action",
    "DropAll",
    "Join",
    "LeaseTiming",
    "Leave",
    "Local",
    "Release",
    "Renew",
    "SlotAction",
    "SlotRelation",
    "SlotRow",
    "Take",
    "View",
    "decide",
    "placement",
    "quotas",
    "relation",
    "score",
    "slot_of",
    "watch",
]


def slot_of(name: str, slots: int) -> int:
    """The slot of a topic, a transactional id or a Kafka group: crc32 of
    its UTF-8 name modulo the number of slots (the same in every process and
    every release, unlike Python's ``hash``)."""
    if slots < 1:
        raise ValueError(f"the number of slots must be at least 1, not {slots}")
    return zlib.crc32(name.encode()) % slots


@functools.lru_cache(maxsize=1 << 18)
def score(slot: int, broker: str) -> int:
    """The rendezvous score of ``broker`` for ``slot`` (64 bits of BLAKE2b):
    stable across processes, so every broker computes the same placement."""
    digest = hashlib.blake2b(f"{slot}\0{broker}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


@functools.lru_cache(maxsize=1 << 12)
def _rank(broker: str) -> bytes:
    return hashlib.blake2b(broker.encode(), digest_size=8).digest()


# -- the inputs ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SlotRow:
    """One row of table ``slots``: its owner (None when free) and epoch."""

    owner: str | None
    epoch: int


@dataclass(frozen=True, slots=True)
class View:
    """One snapshot of the cluster tables, read in one database transaction.

    ``brokers``: broker id -> ``lease_until``; ``slots``: the row of slot k
    at index k; ``now``: the database's clock when the snapshot was taken
    (every time here is in seconds on that one clock)."""

    now: float
    brokers: Mapping[str, float]
    slots: Sequence[SlotRow]

    def live(self) -> list[str]:
        """The brokers whose lease has not expired, sorted."""
        return sorted(b for b, until in self.brokers.items() if until > self.now)

    def is_live(self, broker: str) -> bool:
        until = self.brokers.get(broker)
        return until is not None and until > self.now


@dataclass(frozen=True, slots=True)
class Local:
    """What this broker knows of itself: its id, the slots it holds in memory
    (slot -> the epoch it took them at), whether it is draining (SIGTERM),
    whether its store failed (a commit was fenced or its outcome unknown)."""

    me: str
    held: Mapping[int, int] = field(default_factory=dict)
    draining: bool = False
    store_failed: bool = False


@dataclass(frozen=True, slots=True)
class LeaseTiming:
    """The lease's length and how often it is renewed (seconds).

    A lease is renewed once at least half a renewal interval has passed
    since the last renewal, so a driver that looks every ``renew_every``
    seconds, early or late by a little, renews at each look."""

    ttl: float = 5.0
    renew_every: float = 0.0  # 0: ttl / 3

    def __post_init__(self) -> None:
        if not self.ttl > 0:
            raise ValueError(f"the lease ttl must be positive, not {self.ttl}")
        if self.renew_every == 0:
            object.__setattr__(self, "renew_every", self.ttl / 3)
        if not 0 < self.renew_every < self.ttl:
            raise ValueError(
                f"the renewal interval must be between 0 and the ttl ({self.ttl}),"
                f" not {self.renew_every}"
            )

    def renew_due(self, lease_until: float, now: float) -> bool:
        return lease_until - now <= self.ttl - self.renew_every / 2


# -- the actions --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DropAll:
    """Drop everything held in memory and start again from the store, as a
    restart would (the broker's writes can no longer be trusted to land)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Join:
    """Register (or re-register) with a fresh lease."""


@dataclass(frozen=True, slots=True)
class Renew:
    """Extend the lease; refused by the store if it has already expired."""


@dataclass(frozen=True, slots=True)
class Leave:
    """Release every row this broker owns and delete its broker row, in one
    database transaction (after unloading what it holds)."""


@dataclass(frozen=True, slots=True)
class Take:
    """Take ``slot`` if its row still has ``epoch`` (the epoch becomes
    epoch + 1); the store also checks that the previous owner's lease has
    expired (or the row is free or already this broker's) and that this
    broker's own lease has not."""

    slot: int
    epoch: int


@dataclass(frozen=True, slots=True)
class Release:
    """Unload ``slot`` (stop taking its commands, settle its writes), then
    set its row's owner to NULL if it is still this broker's at ``epoch``."""

    slot: int
    epoch: int


Action = DropAll | Join | Renew | Leave | Take | Release


# -- the slot table -----------------------------------------------------------------


class SlotRelation(enum.Enum):
    HELD = "held"  # mine in the table at the epoch I hold it at
    MINE_UNHELD = "mine, not held"  # mine in the table, not in memory
    LOST = "lost"  # held, but the table says another owner or epoch
    FREE = "free"  # no owner
    EXPIRED = "expired"  # another broker's, whose lease has expired
    OTHERS = "others"  # another live broker's


class SlotAction(enum.Enum):
    KEEP = "keep"
    TAKE = "take"
    RELEASE = "release"
    WAIT = "wait"  # not mine to do anything about
    DROP = "drop"  # everything: someone took a slot I hold


# (how the row relates to me, whether placement gives the slot to me) -> what I do
SLOT_RULES: dict[tuple[SlotRelation, bool], SlotAction] = {
    (SlotRelation.HELD, True): SlotAction.KEEP,
    (SlotRelation.HELD, False): SlotAction.RELEASE,  # hand over to a live target
    # A row of a previous life of this broker, or a take whose answer was
    # lost: take it again (epoch + 1) to load it, or let it go.
    (SlotRelation.MINE_UNHELD, True): SlotAction.TAKE,
    (SlotRelation.MINE_UNHELD, False): SlotAction.RELEASE,
    (SlotRelation.LOST, True): SlotAction.DROP,
    (SlotRelation.LOST, False): SlotAction.DROP,
    (SlotRelation.FREE, True): SlotAction.TAKE,
    (SlotRelation.FREE, False): SlotAction.WAIT,
    (SlotRelation.EXPIRED, True): SlotAction.TAKE,
    (SlotRelation.EXPIRED, False): SlotAction.WAIT,
    (SlotRelation.OTHERS, True): SlotAction.WAIT,  # its owner hands it over
    (SlotRelation.OTHERS, False): SlotAction.WAIT,
}


def relation(row: SlotRow, held_epoch: int | None, me: str, view: View) -> SlotRelation:
    """How slot ``row`` relates to broker ``me``, which holds it at
    ``held_epoch`` (None: does not hold it)."""
    if held_epoch is not None:
        if row.owner == me and row.epoch == held_epoch:
            return SlotRelation.HELD
        return SlotRelation.LOST
    if row.owner is None:
        return SlotRelation.FREE
    if row.owner == me:
        return SlotRelation.MINE_UNHELD
    return SlotRelation.OTHERS if view.is_live(row.owner) else SlotRelation.EXPIRED


# -- placement ----------------------------------------------------------------------


def quotas(live: Sequence[str], slots: int) -> dict[str, int]:
    """How many slots each live broker should own: S // N each, and one more
    for the first S % N brokers ordered by a stable hash of their ids (so
    the quotas depend on which brokers are live, nothing else)."""
    if not live:
        raise ValueError("placement needs at least one live broker")
    each, extra = divmod(slots, len(live))
    ranked = sorted(live, key=lambda b: (_rank(b), b))
    return {b: each + (i < extra) for i, b in enumerate(ranked)}


def placement(live: Sequence[str], owners: Sequence[str | None]) -> list[str]:
    """The target owner of each slot (sticky fair share, see the module's
    docstring): ``owners[k]`` is slot k's owner in the table."""
    quota = quotas(live, len(owners))
    owned: dict[str, list[int]] = {b: [] for b in quota}
    pool: list[int] = []
    for k, owner in enumerate(owners):
        if owner is not None and owner in owned:
            owned[owner].append(k)
        else:
            pool.append(k)
    target: list[str | None] = [None] * len(owners)
    room: dict[str, int] = {}
    for b, ks in owned.items():
        if len(ks) > quota[b]:
            # Keep the slots this broker scores highest for; the rest go.
            ks.sort(key=lambda k: score(k, b), reverse=True)
            pool.extend(ks[quota[b] :])
            ks = ks[: quota[b]]
        elif len(ks) < quota[b]:
            room[b] = quota[b] - len(ks)
        for k in ks:
            target[k] = b
    pool.sort()
    for k in pool:
        b = max(room, key=lambda b: (score(k, b), b))
        target[k] = b
        room[b] -= 1
        if not room[b]:
            del room[b]
    return target  # type: ignore[return-value]  # every slot got one (sum of quotas = S)


# -- the decision -------------------------------------------------------------------


def decide(view: View, local: Local, lease: LeaseTiming) -> tuple[Action, ...]:
    """The actions broker ``local.me`` takes given ``view`` (the rules in the
    module's docstring), in the order to carry them out: DropAll first,
    then Join or Renew, then releases, then takes."""
    me = local.me
    bad = sorted(k for k in local.held if not 0 <= k < len(view.slots))
    if bad:
        raise ValueError(f"held slots {bad} do not exist (the cluster has {len(view.slots)})")
    if local.store_failed:
        return _drop_then(view, local, "the store failed", lease)
    if local.draining:
        mine = local.held or any(row.owner == me for row in view.slots)
        return (Leave(),) if mine or me in view.brokers else ()
    if not view.is_live(me):
        reason = "lease lost" if me in view.brokers else "not registered"
        return ((DropAll(reason),) if local.held else ()) + (Join(),)
    for k, epoch in sorted(local.held.items()):
        row = view.slots[k]
        if relation(row, epoch, me, view) is SlotRelation.LOST:
            taken = f"owned by {row.owner}" if row.owner else "free"
            why = f"slot {k} held at epoch {epoch} is {taken} at epoch {row.epoch}"
            return _drop_then(view, local, why, lease)
    actions: list[Action] = []
    if lease.renew_due(view.brokers[me], view.now):
        actions.append(Renew())
    target = placement(view.live(), [row.owner for row in view.slots])
    releases: list[Action] = []
    takes: list[Action] = []
    held = local.held
    for k, row in enumerate(view.slots):
        if row.owner != me and target[k] != me and k not in held:
            continue  # FREE, EXPIRED or OTHERS, placed elsewhere: WAIT (a shortcut)
        what = SLOT_RULES[relation(row, held.get(k), me, view), target[k] == me]
        if what is SlotAction.TAKE:
            takes.append(Take(k, row.epoch))
        elif what is SlotAction.RELEASE:
            releases.append(Release(k, row.epoch))
    return (*actions, *releases, *takes)


def watch(view: View, me: str, lease: LeaseTiming) -> float | None:
    """When (the database's clock) a look should come, sooner than the
    usual cadence, to take slots of a broker that is about to lose its lease.

    A live broker whose lease has less than ``ttl - 1.5 * renew_every`` left
    has missed a renewal: if its lease runs out, placement without it gives
    ``me`` some of its slots, and ``me`` looks right then instead of up to
    one interval later (failover then takes about the ttl, not the ttl plus
    an interval). The earliest such expiry, or None."""
    if not view.is_live(me):
        return None
    live = view.live()
    owners = [row.owner for row in view.slots]
    soonest: float | None = None
    for b in live:
        until = view.brokers[b]
        if b == me or until - view.now >= lease.ttl - 1.5 * lease.renew_every:
            continue
        if soonest is not None and until >= soonest:
            continue
        target = placement([x for x in live if x != b], owners)
        if any(o == b and t == me for o, t in zip(owners, target, strict=True)):
            soonest = until
    return soonest


def _drop_then(view: View, local: Local, reason: str, lease: LeaseTiming) -> tuple[Action, ...]:
    fresh = replace(local, held={}, store_failed=False)
    return (DropAll(reason), *decide(view, fresh, lease))
