"""A subscription's cursor on one partition, and its on-disk records.

The cursor is the mark-delete position (every message at or before it is
DELETED), the set of messages after it that were acknowledged one by one (a
`SortedSet` of positions), and the messages locked in PENDING_ACK by a
transaction (``pending_ack``: position -> transaction, with an index of each
transaction's positions in ``txn_acks``). Every state change goes through
the table of `subscriptions._state`; the mark-delete position then advances
over every contiguous DELETED message, and never over a PENDING_ACK one (so
that retention never trims a message an abort must deliver again).

Durably, a cursor is a ledger of records, ``meta`` giving the kind:

    0 SNAPSHOT    JSON {"md": [e, i], "acked": [e, i, ...],
                        "pending_ack": [e, i, most, least, ...]}
    1 INDIVIDUAL  positions: int64 pairs (entry id, batch index)
    2 CUMULATIVE  the same; the highest position is the bound
    3 TXN_ACK     txn (uint64 most_bits, least_bits), then int64 position pairs
    4 TXN_COMMIT  txn only
    5 TXN_ABORT   txn only
    6 TXN_ACKED   txn, then int64 (entry id, first index, last index) ranges:
                  a local transaction's acks, committed (docs/architecture.md)

(native byte order). A TXN_ACKED record is its transaction's TXN_ACK and
TXN_COMMIT at once: applying it locks whatever of its ranges the
transaction does not hold yet, then commits what it holds. Live, the
broker locked the ranges in memory when it queued the record (`lock`), so
that a concurrent transaction conflicts; on replay nothing is locked yet.

Replaying the records in order through `Cursor.apply` rebuilds
the cursor; a fresh snapshot lets the ledger be trimmed before it
(`snapshot_then_trim`), and a reset of the cursor is a snapshot too. A record
whose transitions the table refuses changes nothing (`AckConflict`), live and
in replay alike. A transaction is a `proto.TxnID`.
"""

from __future__ import annotations

import itertools
import json
import logging
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from buffer import Position
from ledger import Entry, Ledger
from proto import TxnID, txn_text, wire_txnid
from subscriptions._ranges import LockTable, Range, RangeSet, positions_of, ranges_of
from subscriptions._state import AckEvent, InvalidAckTransition, MsgState, transition

__all__ = [
    "CUMULATIVE",
    "INDIVIDUAL",
    "SNAPSHOT",
    "SNAPSHOT_EVERY",
    "TXN_ABORT",
    "TXN_ACK",
    "TXN_ACKED",
    "TXN_COMMIT",
    "WHOLE_ENTRY",
    "AckConflict",
    "AckRecord",
    "Cursor",
    "PendingAckView",
    "Range",
    "RangeSet",
    "check_txn",
    "decode_record",
    "encode_record",
    "positions_of",
    "ranges_of",
    "replay_cursor",
    "snapshot_then_trim",
    "txn_end_record",
]

log = logging.getLogger(__name__)

# A batch index meaning "every message of the entry": mark-delete (e, WHOLE_ENTRY)
# says entry e is done.
WHOLE_ENTRY = (1 << 31) - 1

SNAPSHOT, INDIVIDUAL, CUMULATIVE, TXN_ACK, TXN_COMMIT, TXN_ABORT, TXN_ACKED = range(7)
SNAPSHOT_EVERY = 1000  # records between the snapshots of a cursor's ledger
_TXN_KINDS = frozenset({TXN_ACK, TXN_COMMIT, TXN_ABORT, TXN_ACKED})
_KIND_NAMES = {
    INDIVIDUAL: "INDIVIDUAL",
    CUMULATIVE: "CUMULATIVE",
    TXN_ACK: "TXN_ACK",
    TXN_COMMIT: "TXN_COMMIT",
    TXN_ABORT: "TXN_ABORT",
    TXN_ACKED: "TXN_ACKED",
}
_U64 = (1 << 64) - 1
_ENTRY_OF = itemgetter(0)


def _pos_text(pos: Position) -> str:
    return f"{pos[0]}:{pos[1]}"


def check_txn(txn: object) -> TxnID:
    """``txn`` as a `TxnID`; ValueError unless it is two integers in [0, 2**64)."""
    if (
        not isinstance(txn, tuple)
        or len(txn) != 2
        or not all(type(x) is int and 0 <= x <= _U64 for x in txn)
    ):
        raise ValueError(f"not a transaction id: {txn!r} (expected (most_bits, least_bits))")
    return wire_txnid(txn[0], txn[1])


class AckConflict(InvalidAckTransition):
    """The table refused an event on one message of a record: nothing changed.

    ``position`` is the message, ``holder`` the transaction that holds it in
    PENDING_ACK (None if it is not locked), ``txn`` the transaction of the
    refused record (None outside a transaction).
    """

    def __init__(
        self,
        position: Position,
        state: MsgState,
        event: AckEvent,
        txn: TxnID | None = None,
        holder: TxnID | None = None,
    ) -> None:
        super().__init__(state, event)
        self.position = position
        self.txn = txn
        self.holder = holder
        by = f" in transaction {txn_text(txn)}" if txn is not None else ""
        held = f" held by transaction {txn_text(holder)}" if holder is not None else ""
        self.args = (
            f"cannot apply {event.value}{by} to message {_pos_text(position)}: "
            f"it is {state.value}{held}",
        )


@dataclass(frozen=True, slots=True)
class AckRecord:
    """One record of the cursor ledger: an ack, a transaction's TXN_ACK or
    end, or a reset (a SNAPSHOT naming the new mark-delete position)."""

    kind: int
    positions: tuple[Position, ...] = ()
    txn: TxnID | None = None
    # A TXN_ACK whose transitions were checked against the state it is
    # applied to (nothing queued before it can change them): `Cursor.apply`
    # need not plan it again. Not stored.
    checked: bool = field(default=False, compare=False)
    # TXN_ACKED: its messages, as ranges (``positions`` is empty).
    ranges: tuple[Range, ...] = ()

    def encode(self) -> bytes:
        if self.kind == SNAPSHOT and len(self.positions) == 1:
            return Cursor(self.positions[0]).snapshot()  # a reset
        if self.kind not in _KIND_NAMES:
            raise ValueError(f"unknown cursor record kind {self.kind}")
        if self.kind not in _TXN_KINDS:
            return encode_record(self.positions)
        if self.txn is None:
            raise ValueError(f"a {_KIND_NAMES[self.kind]} record needs a transaction id")
        head = array("Q", check_txn(self.txn)).tobytes()
        if self.kind == TXN_ACKED:
            return head + array("q", itertools.chain.from_iterable(self.ranges)).tobytes()
        return head + encode_record(self.positions) if self.kind == TXN_ACK else head

    @classmethod
    def decode(cls, kind: int, data: bytes) -> AckRecord:
        """The record of ``kind`` stored as ``data``; ValueError if it is not one."""
        if kind not in _KIND_NAMES:
            raise ValueError(f"unknown cursor record kind {kind}")
        if kind not in _TXN_KINDS:
            return cls(kind, tuple(decode_record(data)))
        if len(data) < 16 or (kind not in (TXN_ACK, TXN_ACKED) and len(data) != 16):
            raise ValueError(f"torn {_KIND_NAMES[kind]} record ({len(data)} bytes)")
        head = array("Q")
        head.frombytes(data[:16])
        txn = wire_txnid(head[0], head[1])
        if kind == TXN_ACKED:
            if (len(data) - 16) % 24:
                raise ValueError(f"torn TXN_ACKED record ({len(data)} bytes)")
            flat = array("q")
            flat.frombytes(data[16:])
            ranges = tuple(zip(flat[::3], flat[1::3], flat[2::3], strict=True))
            return cls(kind, (), txn, ranges=ranges)
        return cls(kind, tuple(decode_record(data[16:])), txn)


def txn_end_record(txn: TxnID, commit: bool) -> AckRecord:
    """The record that ends ``txn`` on a cursor (EndTxnOnSubscription):
    TXN_COMMIT or TXN_ABORT. Stored as ``record.encode()`` with ledger meta
    ``record.kind``."""
    return AckRecord(TXN_COMMIT if commit else TXN_ABORT, (), txn)


_EVENTS = {
    INDIVIDUAL: AckEvent.ACK,
    CUMULATIVE: AckEvent.ACK,
    TXN_ACK: AckEvent.TXN_ACK,
    TXN_COMMIT: AckEvent.TXN_COMMIT,
    TXN_ABORT: AckEvent.TXN_ABORT,
    TXN_ACKED: AckEvent.TXN_COMMIT,  # (after locking what it names)
}

Change = tuple[Position, MsgState]  # a message and its state after a record


class PendingAckView(Mapping[Position, TxnID]):
    """The PENDING_ACK messages of a cursor, each with its transaction: a
    read-only view of its `LockTable`, one position at a time."""

    __slots__ = ("_locks",)

    def __init__(self, locks: LockTable) -> None:
        self._locks = locks

    def __getitem__(self, pos: Position) -> TxnID:
        txn = self._locks.holder(pos)
        if txn is None:
            raise KeyError(pos)
        return txn

    def get(self, pos: Position, default: TxnID | None = None) -> TxnID | None:  # type: ignore[override]
        txn = self._locks.holder(pos)
        return default if txn is None else txn

    def __contains__(self, pos: object) -> bool:
        return self._locks.holder(pos) is not None  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Position]:
        return (pos for pos, _ in self._locks.positions())

    def __len__(self) -> int:
        return len(self._locks)


class Cursor:
    """The mark-delete position, the messages after it acknowledged one by
    one (``acked``, a `RangeSet`) and those locked in PENDING_ACK by a
    transaction (``locks``, a `LockTable`; ``txn_acks``: each transaction's
    ranges, ``pending_ack``: a view by position). Ranges, not positions:
    a batch acknowledged or locked in order is one range, whatever its size."""

    def __init__(self, mark_delete: Position) -> None:
        self.mark_delete: Position = mark_delete
        self.acked = RangeSet()
        self.locks = LockTable()

    def __repr__(self) -> str:
        return (
            f"Cursor(mark_delete={self.mark_delete}, acked={len(self.acked)}, "
            f"pending_ack={len(self.locks)})"
        )

    @property
    def txn_acks(self) -> dict[TxnID, list[Range]]:
        """Each transaction holding messages here, and its ranges."""
        return self.locks.held

    @property
    def pending_ack(self) -> PendingAckView:
        """The PENDING_ACK messages and their transactions, by position."""
        return PendingAckView(self.locks)

    def state(self, pos: Position) -> MsgState:
        if pos <= self.mark_delete or pos in self.acked:
            return MsgState.DELETED
        if self.locks.has_entry(pos[0]) and self.locks.holder(pos) is not None:
            return MsgState.PENDING_ACK
        return MsgState.PENDING

    def first_open_entry(self) -> int:
        """The first entry that may still hold a message not DELETED."""
        entry_id, index = self.mark_delete
        return entry_id + 1 if index == WHOLE_ENTRY else entry_id

    def all_pending(self, entry_id: int) -> bool:
        """Is every message of entry ``entry_id`` PENDING (none DELETED or locked)?"""
        return (
            entry_id > self.mark_delete[0]
            and not self.locks.has_entry(entry_id)
            and not self.acked.has_entry(entry_id)
        )

    def messages_through(self, bound: Position, count: Callable[[int], int]) -> Iterator[Position]:
        """Every message after mark-delete up to and including ``bound``."""
        entry_id, index = self.mark_delete
        if index == WHOLE_ENTRY:
            entry_id, index = entry_id + 1, -1
        while entry_id <= bound[0]:
            n = count(entry_id)
            stop = min(bound[1], n - 1) if entry_id == bound[0] else n - 1
            for i in range(index + 1, stop + 1):
                yield (entry_id, i)
            entry_id, index = entry_id + 1, -1

    def expand_cumulative(self, bound: Position, count: Callable[[int], int]) -> list[Position]:
        """The positions a cumulative ack up to ``bound`` names inside a transaction.

        Every message after mark-delete up to ``bound`` that is not DELETED,
        and ``bound`` itself whatever its state (so that a DELETED bound is
        refused by the table). Messages locked by another transaction are
        named too: the table refuses them, so a cumulative ack never leaves
        a silent hole.
        """
        out = [
            p
            for p in self.messages_through(bound, count)
            if p != bound and self.state(p) is not MsgState.DELETED
        ]
        out.append(bound)
        return out

    # -- applying records ---------------------------------------------------------

    def plan(
        self,
        kind: int,
        positions: Iterable[Position],
        count: Callable[[int], int],
        txn: TxnID | None = None,
        ranges: Sequence[Range] = (),
    ) -> list[Change]:
        """The state changes a record would make; changes nothing.

        Raises `AckConflict` (an `InvalidAckTransition`) naming a message
        the table refuses, and ValueError for a malformed record.
        """
        if kind == INDIVIDUAL:
            return self._plan(self._states(dict.fromkeys(positions)), AckEvent.ACK, None)
        if kind == CUMULATIVE:
            bound = max(positions, default=None)
            if bound is None:
                return []
            if bound <= self.mark_delete:
                self._plan(self._states([bound]), AckEvent.ACK, None)  # DELETED: the table decides
                return []
            return self._plan_cumulative(bound, count)
        if kind not in _TXN_KINDS:
            raise ValueError(f"unknown cursor record kind {kind}")
        if txn is None:
            raise ValueError(f"a {_KIND_NAMES[kind]} record needs a transaction id")
        if kind == TXN_ACK:
            locked = self.plan_txn_ack(positions, txn)
            return [(pos, MsgState.PENDING_ACK) for pos in locked]
        if kind == TXN_ACKED:
            if txn not in self.locks.held:
                self.check_ranges(ranges, txn)  # (raises if it cannot lock them)
            acked = RangeSet(positions_of(self.locks.held.get(txn, ())))
            for r in ranges:
                acked.add_range(*r)
            return [(pos, MsgState.DELETED) for pos in acked]
        after, held = self._end_ranges(kind, txn)
        return [(pos, after) for pos in positions_of(held)]

    def plan_txn_ack(self, positions: Iterable[Position], txn: TxnID) -> list[Position]:
        """`plan` of a TXN_ACK, as the positions it locks: they all become
        PENDING_ACK (the table allows a TXN_ACK nothing else)."""
        wanted = list(dict.fromkeys(positions))
        if self._all_pending(wanted):  # the usual case: ask the table once
            self._ask(wanted[0], MsgState.PENDING, AckEvent.TXN_ACK, txn)
            return wanted
        # A transaction re-sending its ack of a message it holds: a retry, not a conflict.
        holder = self.locks.holder
        wanted = [p for p in wanted if holder(p) != txn]
        return [pos for pos, _ in self._plan(self._states(wanted), AckEvent.TXN_ACK, txn)]

    def check_ranges(self, ranges: Iterable[Range], txn: TxnID) -> None:
        """Raise `AckConflict` naming the first message of ``ranges`` that
        is not PENDING (``txn`` may not lock it); changes nothing. Range by
        range: a local transaction's acks, before it locks them."""
        md = self.mark_delete
        first: Position | None = None
        for entry_id, a, b in ranges:
            if (entry_id, a) <= md:
                self._ask((entry_id, a), MsgState.DELETED, AckEvent.TXN_ACK, txn)
            at = self.acked.overlap(entry_id, a, b)
            if at is not None:
                self._ask((entry_id, at), MsgState.DELETED, AckEvent.TXN_ACK, txn)
            locked = self.locks.overlap(entry_id, a, b)
            if locked is not None:
                self._ask((entry_id, locked[0]), MsgState.PENDING_ACK, AckEvent.TXN_ACK, txn)
            if first is None:
                first = (entry_id, a)
        if first is not None:  # (every one PENDING: ask the table once)
            self._ask(first, MsgState.PENDING, AckEvent.TXN_ACK, txn)

    def lock_ranges(self, ranges: Sequence[Range], txn: TxnID) -> None:
        """Lock ``ranges`` (every message PENDING: `check_ranges`) in
        PENDING_ACK for ``txn``, in memory: a local transaction's acks while
        their TXN_ACKED record is being written."""
        self.locks.lock(txn, ranges)

    def _end_ranges(self, kind: int, txn: TxnID) -> tuple[MsgState, list[Range]]:
        """A TXN_COMMIT / TXN_ABORT: the state after it, and the ranges
        ``txn`` holds, sorted (every message of them moves to that state)."""
        mine = self.locks.held.get(txn)
        if not mine:
            return MsgState.PENDING_ACK, []
        # Every message a transaction holds is PENDING_ACK: ask the table once.
        entry_id, first, _ = mine[0]
        after = self._ask((entry_id, first), MsgState.PENDING_ACK, _EVENTS[kind], txn)
        return after, sorted(mine)

    def _all_pending(self, positions: list[Position]) -> bool:
        """Are all of ``positions`` (at least one) PENDING? Range by range."""
        if not positions or min(positions) <= self.mark_delete:
            return False
        acked, locks = self.acked, self.locks
        for entry_id, a, b in ranges_of(positions):
            if acked.overlap(entry_id, a, b) is not None or locks.overlap(entry_id, a, b):
                return False
        return True

    def _states(self, positions: Iterable[Position]) -> list[Change]:
        """Each position with its state (`state`)."""
        state = self.state
        return [(pos, state(pos)) for pos in positions]

    def _plan_cumulative(self, bound: Position, count: Callable[[int], int]) -> list[Change]:
        """`plan` of a cumulative ack past mark-delete: one pass over the
        range, the table asked once for each state present rather than
        once for each message."""
        acked = [p for p in self.acked if p <= bound]
        locked = [p for p, _ in self.locks.positions() if p <= bound]
        skip = set(acked).union(locked)
        pending = [p for p in self.messages_through(bound, count) if p not in skip]
        changes: list[Change] = []
        for state, members in (
            (MsgState.PENDING, pending),
            (MsgState.DELETED, acked),
            (MsgState.PENDING_ACK, locked),
        ):
            if members:
                after = self._ask(members[0], state, AckEvent.ACK, None)
                if after is not state:
                    changes.extend((pos, after) for pos in members)
        if len(changes) > len(pending):
            changes.sort()
        return changes

    def _plan(self, states: Iterable[Change], event: AckEvent, txn: TxnID | None) -> list[Change]:
        """The changes ``event`` makes to messages in these states, as the table says."""
        changes: list[Change] = []
        last: MsgState | None = None  # the table is asked again when the state changes
        after = MsgState.PENDING
        for pos, state in states:
            if state is not last:
                after = self._ask(pos, state, event, txn)
                last = state
            if after is not state:
                changes.append((pos, after))
        return changes

    def _ask(self, pos: Position, state: MsgState, event: AckEvent, txn: TxnID | None) -> MsgState:
        """`transition`, refusing with an `AckConflict` that names ``pos``."""
        try:
            return transition(state, event)
        except InvalidAckTransition:
            raise AckConflict(pos, state, event, txn, self.locks.holder(pos)) from None

    def apply(
        self,
        kind: int,
        positions: Iterable[Position],
        count: Callable[[int], int],
        last: int,
        txn: TxnID | None = None,
        checked: bool = False,
        ranges: Sequence[Range] = (),
    ) -> list[Position]:
        """Apply a record; returns the positions whose state changed.

        They became DELETED (INDIVIDUAL, CUMULATIVE, TXN_COMMIT, TXN_ACKED),
        PENDING_ACK (TXN_ACK) or PENDING again (TXN_ABORT). Every transition
        is checked before anything changes: a refused record raises
        `AckConflict` and changes nothing. ``count(entry_id)`` gives an
        entry's message count and ``last`` the last entry id, for advancing
        the mark-delete position. ``checked``: a TXN_ACK planned already
        (`plan_txn_ack`) against this very state; its positions are locked
        as they are. ``ranges``: a TXN_ACKED record's. A SNAPSHOT naming one
        position is a reset: every message after it PENDING, every one at
        or before it DELETED.
        """
        if kind == SNAPSHOT:
            self.mark_delete = next(iter(positions))
            self.acked = RangeSet()
            self.locks = LockTable()
            return []
        if kind in _TXN_KINDS and txn is not None:
            changed: list[Position]
            if kind == TXN_ACK:  # every one PENDING: the table allows nothing else
                changed = list(positions) if checked else self.plan_txn_ack(positions, txn)
                if changed:
                    self.locks.lock(txn, ranges_of(changed))
            elif kind == TXN_ACKED:
                changed = positions_of(self._commit_acked(ranges, txn))
            else:
                after, held = self._end_ranges(kind, txn)
                if held:
                    self.locks.unlock(txn)
                    if after is MsgState.DELETED:
                        self._delete_ranges(held)
                changed = positions_of(held)
            self._advance(count, last)
            return changed
        positions = list(positions)
        changes = self.plan(kind, positions, count, txn)
        changed = [pos for pos, _ in changes]
        if kind == CUMULATIVE and changes:
            self._delete_through(max(positions), changes)
        else:
            self.acked.update(changed)  # an INDIVIDUAL ack's: PENDING ones, now DELETED
        self._advance(count, last)
        return changed

    def _commit_acked(self, ranges: Sequence[Range], txn: TxnID) -> list[Range]:
        """A TXN_ACKED record: lock ``ranges`` unless ``txn`` holds them
        already (on replay it holds nothing; live, `lock_ranges` locked them
        as the record was queued), through the table (a conflict raises,
        changing nothing); then commit every range it holds. Returns them,
        now DELETED."""
        if txn not in self.locks.held:
            self.check_ranges(ranges, txn)
            self.locks.lock(txn, ranges)
        elif self.locks.held[txn] != list(ranges):
            wanted = positions_of(ranges)
            holder = self.locks.holder
            locked = self.plan_txn_ack([p for p in wanted if holder(p) != txn], txn)
            if locked:
                self.locks.lock(txn, ranges_of(locked))
        after, held = self._end_ranges(TXN_COMMIT, txn)
        self.locks.unlock(txn)
        if after is MsgState.DELETED:
            self._delete_ranges(held)
        return held

    def _delete_ranges(self, ranges: Iterable[Range]) -> None:
        """Make the messages of ``ranges`` DELETED: they join ``acked``, and
        `_advance` moves mark-delete over the runs that continue it."""
        add = self.acked.add_range
        for entry_id, first, last in ranges:
            add(entry_id, first, last)

    def _delete_through(self, bound: Position, changes: list[Change]) -> None:
        """A cumulative ack up to ``bound`` whose PENDING messages are ``changes``.

        Mark-delete moves to ``bound``, or, if a PENDING_ACK message lies on
        the way, to just before the first one; the messages deleted after it
        join the individually acknowledged set.
        """
        md = self.mark_delete
        locked = [p for p, _ in self.locks.positions() if md < p <= bound]
        if locked:
            first = min(locked)
            before = (first[0], first[1] - 1) if first[1] > 0 else (first[0] - 1, WHOLE_ENTRY)
            md = max(md, before)
            self.acked.update(p for p, _ in changes if p > md)
        else:
            md = max(md, bound)
        self.mark_delete = md
        self.acked.drop_through(md)

    def _advance(self, count: Callable[[int], int], last: int) -> None:
        """Move the mark-delete position over acknowledged messages.

        Never over an entry holding a PENDING_ACK message, whatever ``count``
        says of it (a trimmed entry counts 0).
        """
        entry_id, index = self.mark_delete
        acked, locks = self.acked, self.locks
        while True:
            if index != WHOLE_ENTRY and index + 1 >= count(entry_id):
                if locks.has_entry(entry_id):
                    break
                index = WHOLE_ENTRY
            if index == WHOLE_ENTRY:
                if entry_id + 1 > last:
                    break
                if count(entry_id + 1) == 0:
                    if locks.has_entry(entry_id + 1):
                        break
                    entry_id += 1
                    continue
                nxt = (entry_id + 1, 0)
            else:
                nxt = (entry_id, index + 1)
            if not acked:
                break
            # The run of consecutive acknowledged messages from there, at once.
            run_last = acked.take_run(nxt)
            if run_last is None:
                break
            entry_id, index = nxt[0], run_last
        self.mark_delete = (entry_id, index)

    # -- records ----------------------------------------------------------------

    def snapshot(self) -> bytes:
        acked = [x for r in self.acked.ranges() for x in r]
        locks = [
            x
            for txn, ranges in sorted(self.locks.held.items())
            for r in sorted(ranges)
            for x in (*r, *txn)
        ]
        return json.dumps(
            {"md": list(self.mark_delete), "acked_ranges": acked, "locked_ranges": locks}
        ).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> Cursor:
        """The cursor a snapshot holds (ranges; or, as older snapshots hold
        them, positions one by one)."""
        record = json.loads(data)
        cursor = cls((int(record["md"][0]), int(record["md"][1])))
        flat = record.get("acked_ranges")
        if flat is not None:
            for e, a, b in zip(flat[::3], flat[1::3], flat[2::3], strict=True):
                cursor.acked.add_range(int(e), int(a), int(b))
        else:
            positions = record.get("acked", [])
            cursor.acked.update(sorted(zip(positions[::2], positions[1::2], strict=True)))
        flat = record.get("locked_ranges")
        if flat is not None:
            for e, a, b, most, least in zip(
                flat[::5], flat[1::5], flat[2::5], flat[3::5], flat[4::5], strict=True
            ):
                cursor.locks.lock(check_txn((most, least)), [(int(e), int(a), int(b))])
        else:
            old = record.get("pending_ack", [])
            by_txn: dict[TxnID, list[Position]] = {}
            for e, i, most, least in zip(old[::4], old[1::4], old[2::4], old[3::4], strict=True):
                by_txn.setdefault(check_txn((most, least)), []).append((e, i))
            for txn, held in by_txn.items():
                cursor.locks.lock(txn, ranges_of(sorted(held)))
        return cursor

    def copy(self) -> Cursor:
        other = Cursor(self.mark_delete)
        other.acked = self.acked.copy()
        other.locks = self.locks.copy()
        return other


def replay_cursor(
    name: str, entries: Sequence[Entry], count: Callable[[int], int], last: int
) -> tuple[Cursor, list[TxnID]]:
    """Rebuild a cursor from the entries of its ledger ``name``: a snapshot
    first, then records (and later snapshots), each through `Cursor.apply`;
    ``count`` and ``last`` as there. Returns the cursor and the transactions
    whose end (TXN_COMMIT / TXN_ABORT) it replayed, in order. A record the
    table refuses changes nothing, as when it was applied live. Raises
    RuntimeError naming the ledger and entry if the ledger does not start
    with a snapshot or holds a malformed record."""
    if not entries or entries[0].meta != SNAPSHOT:
        raise RuntimeError(f"cursor ledger {name} does not start with a snapshot")
    cursor = Cursor.from_snapshot(entries[0].data)
    ended: list[TxnID] = []
    for entry in entries[1:]:
        if entry.meta == SNAPSHOT:
            cursor = Cursor.from_snapshot(entry.data)
            continue
        try:
            record = AckRecord.decode(entry.meta, entry.data)
        except ValueError as exc:
            raise RuntimeError(f"cursor ledger {name}, entry {entry.entry_id}: {exc}") from exc
        try:
            cursor.apply(
                record.kind, record.positions, count, last, record.txn, ranges=record.ranges
            )
        except InvalidAckTransition as exc:
            # Refused when it was applied live too: it changes nothing.
            log.info("%s: record %d refused on replay: %s", name, entry.entry_id, exc)
        if record.kind in (TXN_COMMIT, TXN_ABORT) and record.txn is not None:
            ended.append(record.txn)
    return cursor, ended


def snapshot_then_trim(ledger: Ledger, snapshot: bytes, meta: int) -> None:
    """Append ``snapshot``; once it is durable, trim every record before it."""
    fut = ledger.append(snapshot, meta=meta)

    def trim(_f: object) -> None:
        if not fut.cancelled() and fut.exception() is None:
            ledger.trim(fut.result())

    fut.add_done_callback(trim)


def encode_record(positions: Iterable[Position]) -> bytes:
    return array("q", itertools.chain.from_iterable(positions)).tobytes()


def decode_record(data: bytes) -> list[Position]:
    flat = array("q")
    flat.frombytes(data)
    return list(zip(flat[::2], flat[1::2], strict=True))
