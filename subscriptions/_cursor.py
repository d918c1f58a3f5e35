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

(native byte order). Replaying them in order through `Cursor.apply` rebuilds
the cursor; a fresh snapshot lets the ledger be trimmed before it
(`snapshot_then_trim`), and a reset of the cursor is a snapshot too. A record
whose transitions the table refuses changes nothing (`AckConflict`), live and
in replay alike. A transaction is a `proto.TxnID`.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import json
import logging
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from operator import itemgetter

from sortedcontainers import SortedSet

from buffer import Position
from ledger import Entry, Ledger
from proto import TxnID, txn_text, wire_txnid
from subscriptions._state import AckEvent, InvalidAckTransition, MsgState, transition

__all__ = [
    "CUMULATIVE",
    "INDIVIDUAL",
    "SNAPSHOT",
    "SNAPSHOT_EVERY",
    "TXN_ABORT",
    "TXN_ACK",
    "TXN_COMMIT",
    "WHOLE_ENTRY",
    "AckConflict",
    "AckRecord",
    "Cursor",
    "check_txn",
    "decode_record",
    "encode_record",
    "replay_cursor",
    "snapshot_then_trim",
    "txn_end_record",
]

log = logging.getLogger(__name__)

# A batch index meaning "every message of the entry": mark-delete (e, WHOLE_ENTRY)
# says entry e is done.
WHOLE_ENTRY = (1 << 31) - 1

SNAPSHOT, INDIVIDUAL, CUMULATIVE, TXN_ACK, TXN_COMMIT, TXN_ABORT = range(6)
SNAPSHOT_EVERY = 1000  # records between the snapshots of a cursor's ledger
_TXN_KINDS = frozenset({TXN_ACK, TXN_COMMIT, TXN_ABORT})
_KIND_NAMES = {
    INDIVIDUAL: "INDIVIDUAL",
    CUMULATIVE: "CUMULATIVE",
    TXN_ACK: "TXN_ACK",
    TXN_COMMIT: "TXN_COMMIT",
    TXN_ABORT: "TXN_ABORT",
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
        return head + encode_record(self.positions) if self.kind == TXN_ACK else head

    @classmethod
    def decode(cls, kind: int, data: bytes) -> AckRecord:
        """The record of ``kind`` stored as ``data``; ValueError if it is not one."""
        if kind not in _KIND_NAMES:
            raise ValueError(f"unknown cursor record kind {kind}")
        if kind not in _TXN_KINDS:
            return cls(kind, tuple(decode_record(data)))
        if len(data) < 16 or (kind != TXN_ACK and len(data) != 16):
            raise ValueError(f"torn {_KIND_NAMES[kind]} record ({len(data)} bytes)")
        head = array("Q")
        head.frombytes(data[:16])
        return cls(kind, tuple(decode_record(data[16:])), wire_txnid(head[0], head[1]))


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
}

Change = tuple[Position, MsgState]  # a message and its state after a record


class Cursor:
    def __init__(self, mark_delete: Position) -> None:
        self.mark_delete: Position = mark_delete
        self.acked: SortedSet = SortedSet()
        self.pending_ack: dict[Position, TxnID] = {}
        # Each transaction's positions, in the order it locked them (a dict:
        # sorting them for a commit is then one pass, they come in order).
        self.txn_acks: dict[TxnID, dict[Position, None]] = {}
        self._locked_entries: dict[int, int] = {}  # entry id -> its PENDING_ACK messages

    def __repr__(self) -> str:
        return (
            f"Cursor(mark_delete={self.mark_delete}, acked={len(self.acked)}, "
            f"pending_ack={len(self.pending_ack)})"
        )

    def state(self, pos: Position) -> MsgState:
        if pos <= self.mark_delete or pos in self.acked:
            return MsgState.DELETED
        if pos in self.pending_ack:
            return MsgState.PENDING_ACK
        return MsgState.PENDING

    def first_open_entry(self) -> int:
        """The first entry that may still hold a message not DELETED."""
        entry_id, index = self.mark_delete
        return entry_id + 1 if index == WHOLE_ENTRY else entry_id

    def all_pending(self, entry_id: int) -> bool:
        """Is every message of entry ``entry_id`` PENDING (none DELETED or locked)?"""
        if entry_id <= self.mark_delete[0] or self._locked_entries.get(entry_id):
            return False
        acked = self.acked
        i: int = acked.bisect_left((entry_id, 0))
        return not (i < len(acked) and acked[i][0] == entry_id)

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
        after, held = self._plan_end(kind, txn)
        return [(pos, after) for pos in held]

    def plan_txn_ack(self, positions: Iterable[Position], txn: TxnID) -> list[Position]:
        """`plan` of a TXN_ACK, as the positions it locks: they all become
        PENDING_ACK (the table allows a TXN_ACK nothing else)."""
        wanted = list(dict.fromkeys(positions))
        if self._all_pending(wanted):  # the usual case: ask the table once
            self._ask(wanted[0], MsgState.PENDING, AckEvent.TXN_ACK, txn)
            return wanted
        # A transaction re-sending its ack of a message it holds: a retry, not a conflict.
        wanted = [p for p in wanted if self.pending_ack.get(p) != txn]
        return [pos for pos, _ in self._plan(self._states(wanted), AckEvent.TXN_ACK, txn)]

    def _plan_end(self, kind: int, txn: TxnID) -> tuple[MsgState, list[Position]]:
        """`plan` of a TXN_COMMIT / TXN_ABORT: the state after it, and every
        position ``txn`` holds, sorted (they all move to that state)."""
        mine = self.txn_acks.get(txn)
        if not mine:
            return MsgState.PENDING_ACK, []
        # Every position a transaction holds is PENDING_ACK (locking and
        # unlocking keep txn_acks and pending_ack together): ask the table once.
        after = self._ask(next(iter(mine)), MsgState.PENDING_ACK, _EVENTS[kind], txn)
        return after, sorted(mine)

    def _all_pending(self, positions: list[Position]) -> bool:
        """Are all of ``positions`` (at least one) PENDING? Set operations,
        not a lookup per message."""
        return (
            bool(positions)
            and min(positions) > self.mark_delete
            and self.pending_ack.keys().isdisjoint(positions)
            and self.acked.isdisjoint(positions)
        )

    def _states(self, positions: Iterable[Position]) -> list[Change]:
        """Each position with its state (`state`, inlined: this is the hot path)."""
        md, acked, locked = self.mark_delete, self.acked, self.pending_ack
        deleted, pending_ack, pending = (
            MsgState.DELETED,
            MsgState.PENDING_ACK,
            MsgState.PENDING,
        )
        return [
            (
                pos,
                deleted if pos <= md or pos in acked else pending_ack if pos in locked else pending,
            )
            for pos in positions
        ]

    def _plan_cumulative(self, bound: Position, count: Callable[[int], int]) -> list[Change]:
        """`plan` of a cumulative ack past mark-delete: the hot path.

        One pass over the range, and the table asked once for each state
        present rather than once for each message.
        """
        acked = list(self.acked.irange(maximum=bound))
        locked = sorted(p for p in self.pending_ack if p <= bound)
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
            raise AckConflict(pos, state, event, txn, self.pending_ack.get(pos)) from None

    def apply(
        self,
        kind: int,
        positions: Iterable[Position],
        count: Callable[[int], int],
        last: int,
        txn: TxnID | None = None,
        checked: bool = False,
    ) -> list[Position]:
        """Apply a record; returns the positions whose state changed.

        They became DELETED (INDIVIDUAL, CUMULATIVE, TXN_COMMIT), PENDING_ACK
        (TXN_ACK) or PENDING again (TXN_ABORT). Every transition is checked
        before anything changes: a refused record raises `AckConflict` and
        changes nothing. ``count(entry_id)`` gives an entry's message count
        and ``last`` the last entry id, for advancing the mark-delete position.
        ``checked``: a TXN_ACK planned already (`plan_txn_ack`) against
        this very state; its positions are locked as they are. A SNAPSHOT
        naming one position is a reset: every message after it PENDING,
        every one at or before it DELETED.
        """
        if kind == SNAPSHOT:
            self.mark_delete = next(iter(positions))
            self.acked.clear()
            self.pending_ack.clear()
            self.txn_acks.clear()
            self._locked_entries.clear()
            return []
        if kind in _TXN_KINDS and txn is not None:
            if kind == TXN_ACK:  # every one PENDING: the table allows nothing else
                changed = list(positions) if checked else self.plan_txn_ack(positions, txn)
                if changed:
                    self._lock_all(changed, txn)
            else:
                after, changed = self._plan_end(kind, txn)
                if changed:
                    self._unlock_txn(txn, changed)
                    if after is MsgState.DELETED:
                        self._delete(changed)
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

    def _lock(self, pos: Position, txn: TxnID) -> None:
        self.pending_ack[pos] = txn
        self.txn_acks.setdefault(txn, {})[pos] = None
        self._locked_entries[pos[0]] = self._locked_entries.get(pos[0], 0) + 1

    def _lock_all(self, positions: list[Position], txn: TxnID) -> None:
        """`_lock` of many positions at once."""
        self.pending_ack.update(dict.fromkeys(positions, txn))
        self.txn_acks.setdefault(txn, {}).update(dict.fromkeys(positions))
        locked = self._locked_entries
        for entry_id, n in _per_entry(positions).items():
            locked[entry_id] = locked.get(entry_id, 0) + n

    def _delete(self, positions: list[Position]) -> None:
        """Make sorted ``positions`` DELETED: a leading run that continues
        the mark-delete position moves it (the usual case: a transaction
        acknowledged the next messages), the rest joins ``acked``."""
        entry_id, index = self.mark_delete
        nxt = (entry_id + 1, 0) if index == WHOLE_ENTRY else (entry_id, index + 1)
        run = 0
        if positions[0] == nxt:
            entry_id, first = nxt
            run = bisect.bisect_right(positions, (entry_id, WHOLE_ENTRY))
            while run and positions[run - 1][1] - first != run - 1:
                run -= 1  # (a gap: only the part before it is a run)
            if run:
                self.mark_delete = positions[run - 1]
        if run < len(positions):
            self.acked.update(positions[run:] if run else positions)

    def _unlock_txn(self, txn: TxnID, positions: list[Position]) -> None:
        """Unlock ``positions``, every message ``txn`` holds (sorted)."""
        del self.txn_acks[txn]
        pop = self.pending_ack.pop
        for pos in positions:
            pop(pos)
        locked = self._locked_entries
        for entry_id, n in _per_entry(positions).items():
            left = locked[entry_id] - n
            if left:
                locked[entry_id] = left
            else:
                del locked[entry_id]

    def _delete_through(self, bound: Position, changes: list[Change]) -> None:
        """A cumulative ack up to ``bound`` whose PENDING messages are ``changes``.

        Mark-delete moves to ``bound``, or, if a PENDING_ACK message lies on
        the way, to just before the first one; the messages deleted after it
        join the individually acknowledged set.
        """
        md = self.mark_delete
        locked = [p for p in self.pending_ack if md < p <= bound]
        if locked:
            first = min(locked)
            before = (first[0], first[1] - 1) if first[1] > 0 else (first[0] - 1, WHOLE_ENTRY)
            md = max(md, before)
            self.acked.update(p for p, _ in changes if p > md)
        else:
            md = max(md, bound)
        self.mark_delete = md
        acked = self.acked
        while acked and acked[0] <= md:
            acked.pop(0)

    def _advance(self, count: Callable[[int], int], last: int) -> None:
        """Move the mark-delete position over acknowledged messages.

        Never over an entry holding a PENDING_ACK message, whatever ``count``
        says of it (a trimmed entry counts 0).
        """
        entry_id, index = self.mark_delete
        acked = self.acked
        locked = self._locked_entries
        while True:
            if index != WHOLE_ENTRY and index + 1 >= count(entry_id):
                if entry_id in locked:
                    break
                index = WHOLE_ENTRY
            if index == WHOLE_ENTRY:
                if entry_id + 1 > last:
                    break
                if count(entry_id + 1) == 0:
                    if entry_id + 1 in locked:
                        break
                    entry_id += 1
                    continue
                nxt = (entry_id + 1, 0)
            else:
                nxt = (entry_id, index + 1)
            if not acked or acked[0] != nxt:
                break
            # Consume the run of consecutive acked messages of this entry at once.
            n = count(entry_id) if index != WHOLE_ENTRY else count(nxt[0])
            run = _run_length(acked, nxt, acked.bisect_left((nxt[0], n)))
            del acked[:run]
            entry_id, index = nxt[0], nxt[1] + run - 1
        self.mark_delete = (entry_id, index)

    # -- records ----------------------------------------------------------------

    def snapshot(self) -> bytes:
        flat = [x for pos in self.acked for x in pos]
        locked = [x for pos, txn in sorted(self.pending_ack.items()) for x in (*pos, *txn)]
        return json.dumps(
            {"md": list(self.mark_delete), "acked": flat, "pending_ack": locked}
        ).encode()

    @classmethod
    def from_snapshot(cls, data: bytes) -> Cursor:
        record = json.loads(data)
        cursor = cls((int(record["md"][0]), int(record["md"][1])))
        flat = record["acked"]
        cursor.acked.update(zip(flat[::2], flat[1::2], strict=True))
        locked = record.get("pending_ack", [])
        for e, i, most, least in zip(
            locked[::4], locked[1::4], locked[2::4], locked[3::4], strict=True
        ):
            cursor._lock((e, i), check_txn((most, least)))
        return cursor

    def copy(self) -> Cursor:
        other = Cursor(self.mark_delete)
        other.acked = SortedSet(self.acked)
        other.pending_ack = dict(self.pending_ack)
        other.txn_acks = {txn: dict(mine) for txn, mine in self.txn_acks.items()}
        other._locked_entries = dict(self._locked_entries)
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
            cursor.apply(record.kind, record.positions, count, last, record.txn)
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


def _run_length(acked: SortedSet, first: Position, end: int) -> int:
    """How many of ``acked[:end]`` (``first`` and later messages of its
    entry) are consecutive from ``first``.

    They are distinct and sorted, so ``acked[i]`` is ``first`` plus ``i``
    up to the first gap, and past it ``acked[i][1] - first[1] - i`` is
    positive: one look when there is no gap (the usual case), a binary
    search when there is, never a look per message.
    """
    if acked[end - 1][1] - first[1] == end - 1:
        return end
    low, high = 1, end - 1  # acked[low - 1] is in the run; acked[high] is not
    while low < high:
        mid = (low + high) // 2
        if acked[mid][1] - first[1] == mid:
            low = mid + 1
        else:
            high = mid
    return low


def _per_entry(positions: list[Position]) -> dict[int, int]:
    """How many of ``positions`` each entry has."""
    entries = set(map(_ENTRY_OF, positions))  # (no Python loop per message)
    if len(entries) == 1:
        return {positions[0][0]: len(positions)}
    return dict(collections.Counter(map(_ENTRY_OF, positions)))


def encode_record(positions: Iterable[Position]) -> bytes:
    return array("q", itertools.chain.from_iterable(positions)).tobytes()


def decode_record(data: bytes) -> list[Position]:
    flat = array("q")
    flat.frombytes(data)
    return list(zip(flat[::2], flat[1::2], strict=True))
