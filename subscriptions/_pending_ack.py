"""PIP-31's PENDING_ACK on one subscription: its acknowledgements as records
of the cursor ledger.

An ack inside a transaction locks its messages in PENDING_ACK (TXN_ACK)
until the transaction's end commits them (TXN_COMMIT: DELETED) or aborts
them (TXN_ABORT: PENDING, delivered again); another transaction's ack of a
locked message is a conflict, a plain ack of it is dropped. Every change is
a row of the table in `subscriptions._state`, applied by `Cursor.apply`.

Persist, then act: every record is checked against the cursor, appended,
and applied when it is durable, in ledger order (in the append's done
callback, so that a caller that stops waiting cannot leave a durable record
unapplied); `PendingAckLog.on_applied` then hears what changed. A record that a
concurrent one made invalid in between is refused when applied: it changes
nothing, live and in replay, and its caller gets the conflict. Plain acks,
the transactions' records and a reset (a SNAPSHOT record) share this one
order; a snapshot every ``SNAPSHOT_EVERY`` records lets the ledger be
trimmed. Early answers (`PendingAckLog.ack`, `PendingAckLog.end_txn_early`) are for
transactions that a restart aborts if it finds them open
(docs/decisions.md, Transactions).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence

from buffer import Partition, Position
from ledger import Ledger, faults, unawaited
from proto import TxnID, refusals, txn_text
from subscriptions._cursor import (
    CUMULATIVE,
    INDIVIDUAL,
    SNAPSHOT,
    SNAPSHOT_EVERY,
    TXN_ABORT,
    TXN_ACK,
    TXN_ACKED,
    TXN_COMMIT,
    AckConflict,
    AckRecord,
    Cursor,
    Range,
    RangeSet,
    check_txn,
    replay_cursor,
    snapshot_then_trim,
    txn_end_record,
)
from subscriptions._state import InvalidAckTransition

__all__ = ["PendingAckLog"]

log = logging.getLogger(__name__)

ENDED_MEMORY = 10_000  # ended transactions remembered, to refuse their late acks


class PendingAckLog:
    """The acknowledgements of subscription ``name`` on ``partition``:
    ``cursor``, kept by the records of ``ledger``. ``count`` gives an entry's
    message count (see `Cursor.apply`). Create with `create` or `load`."""

    def __init__(
        self,
        ledger: Ledger,
        cursor: Cursor,
        partition: Partition,
        name: str,
        count: Callable[[int], int],
    ) -> None:
        self.ledger = ledger
        self.cursor = cursor
        # Told of each record applied, with the positions it changed.
        self.on_applied: Callable[[AckRecord, list[Position]], None] = lambda r, changed: None
        self._partition = partition
        self._where = f"subscription {name!r} of {partition.name}"
        self.count = count
        self._inflight: list[AckRecord] = []  # appended, not yet applied (ledger order)
        self._since_snapshot = 0
        self._ended: OrderedDict[TxnID, None] = OrderedDict()

    @classmethod
    async def create(
        cls,
        ledger: Ledger,
        mark_delete: Position,
        partition: Partition,
        name: str,
        count: Callable[[int], int],
    ) -> PendingAckLog:
        """A new cursor at ``mark_delete``, durably (its first snapshot)."""
        cursor = Cursor(mark_delete)
        await ledger.append(cursor.snapshot(), meta=SNAPSHOT)
        return cls(ledger, cursor, partition, name, count)

    @classmethod
    async def load(
        cls, ledger: Ledger, partition: Partition, name: str, count: Callable[[int], int]
    ) -> PendingAckLog:
        """The cursor rebuilt from ``ledger`` (`replay_cursor`)."""
        entries = await ledger.read(ledger.first_entry_id, ledger.last_entry_id)
        cursor, ended = replay_cursor(ledger.name, entries, count, partition.ledger.last_entry_id)
        acks = cls(ledger, cursor, partition, name, count)
        acks._since_snapshot = len(entries) - 1
        for txn in ended:
            acks._remember_ended(txn)
        return acks

    @property
    def settled(self) -> bool:
        """No record in flight and no transaction holding acknowledgements."""
        return not self._inflight and not self.cursor.txn_acks and self.ledger.settled

    # -- acknowledgements ---------------------------------------------------------

    async def ack(
        self,
        positions: list[Position],
        cumulative: bool,
        txn: TxnID | None = None,
        early: bool = False,
    ) -> None:
        """Acknowledge ``positions`` (at least one, all existing) durably,
        then apply.

        Outside a transaction a PENDING message becomes DELETED; an ack of a
        PENDING_ACK message is dropped (PIP-31: it stays locked by its
        transaction). A cumulative ack deletes every message up to the
        highest position except the PENDING_ACK ones, which stay locked:
        mark-delete stops before the first of them.

        Inside a transaction the messages become PENDING_ACK; a cumulative
        ack names every message after mark-delete up to the position that is
        not DELETED. Re-sending an ack of messages this transaction already
        holds is a retry and writes nothing. ``early``: return once the
        record is queued when no record in flight can change the messages
        it names (it is then applied to exactly the state it was checked
        against, so it cannot turn out void). Raises (`proto.refusals`):
        TRANSACTION_CONFLICT (nothing changed) if a message is DELETED or
        held by another transaction, INVALID_TXN_STATUS if ``txn`` has
        already ended here, INVALID_ARGUMENT for a malformed ``txn``.
        """
        if txn is None:
            if cumulative:
                record = AckRecord(CUMULATIVE, (max(positions),))
            else:
                record = AckRecord(INDIVIDUAL, tuple(positions))
        else:
            txn_record = self._txn_ack(positions, cumulative, txn)
            if txn_record is None:
                return  # every message is durably held by this transaction already
            record = txn_record
            if early and record.checked:
                # (Lazy: the transaction's END is what waits for it to be
                # durable, and the END's group commit takes it along.)
                self._persist(record, lazy=True).add_done_callback(unawaited)
                return
        try:
            await self._persist(record)
        except AckConflict as exc:
            raise self._conflict(exc) from exc

    def _txn_ack(self, positions: list[Position], cumulative: bool, txn: TxnID) -> AckRecord | None:
        """The TXN_ACK record of an ack in ``txn``; None if it locks nothing new."""
        txn = self._check_txn(txn)
        if txn in self._ended:
            raise refusals.InvalidTxnStatus(
                f"transaction {txn_text(txn)} has already ended on {self._where}"
            )
        cursor = self.cursor
        wanted = cursor.expand_cumulative(max(positions), self.count) if cumulative else positions
        try:
            locked = cursor.plan_txn_ack(wanted, txn)
        except AckConflict as exc:
            raise self._conflict(exc) from exc
        if not locked:
            return None
        # Checked against the state it will be applied to, unless a record
        # in flight may change it first (then it is planned again).
        return AckRecord(TXN_ACK, tuple(locked), txn, self._unaffected_by_inflight(locked))

    def _unaffected_by_inflight(self, positions: Sequence[Position]) -> bool:
        """Can no record in flight change the state of ``positions`` (all
        PENDING as applied so far)? Then a record about them is applied to
        the state it was checked against. Plain and transactional acks
        change the messages they name (a cumulative one, all up to its
        bound); a transaction's commit or abort only the messages it holds,
        which are not PENDING or are named by its acks in flight; a local
        transaction's TXN_ACKED only the messages it locked already; a reset
        every message."""
        if not self._inflight:
            return True
        first = min(positions)
        mine: set[Position] | None = None
        for record in self._inflight:
            if record.kind == SNAPSHOT:
                return False
            if record.kind == CUMULATIVE:
                if max(record.positions) >= first:
                    return False
            elif record.kind in (INDIVIDUAL, TXN_ACK):
                if mine is None:
                    mine = set(positions)
                if not mine.isdisjoint(record.positions):
                    return False
        return True

    # -- a local transaction's acks (docs/architecture.md) -------------------------

    def check_acked(self, txn: TxnID, ranges: Sequence[Range]) -> None:
        """Before a local transaction's commit: raise TRANSACTION_CONFLICT
        (nothing changed) unless every message of ``ranges`` (sorted,
        apart, existing) is PENDING now and no record in flight can change
        it before a TXN_ACKED record queued now is applied."""
        txn = self._check_txn(txn)
        try:
            self.cursor.check_ranges(ranges, txn)
        except AckConflict as exc:
            raise self._conflict(exc) from exc
        if self._inflight and not self._ranges_unaffected(ranges):
            raise refusals.TransactionConflict(
                f"{self._where}: an acknowledgement or reset of these messages is being "
                "written; nothing changed",
            )

    def _ranges_unaffected(self, ranges: Sequence[Range]) -> bool:
        """`_unaffected_by_inflight` of ``ranges``."""
        mine = RangeSet()
        for r in ranges:
            mine.add_range(*r)
        first = ranges[0][:2] if ranges else (0, 0)
        for record in self._inflight:
            if record.kind == SNAPSHOT:
                return False
            if record.kind == CUMULATIVE:
                if max(record.positions) >= first:
                    return False
            elif record.kind in (INDIVIDUAL, TXN_ACK):
                if any(pos in mine for pos in record.positions):
                    return False
        return True

    def queue_acked(self, txn: TxnID, ranges: tuple[Range, ...]) -> asyncio.Future[list[Position]]:
        """A local transaction's acks of ``ranges``, checked by
        `check_acked` in this turn of the loop: lock them in PENDING_ACK now
        (in memory: a concurrent transaction's ack conflicts, dispatch holds
        them back), and queue the TXN_ACKED record that commits them; they
        are DELETED once it is durable. The result is what changed."""
        self.cursor.lock_ranges(ranges, txn)
        return self._persist(AckRecord(TXN_ACKED, (), txn, True, ranges))

    async def end_txn(self, txn: TxnID, commit: bool) -> None:
        """EndTxnOnSubscription: commit (DELETED) or abort (PENDING) ``txn``'s
        acks, durably. A transaction with no acks here writes nothing;
        repeating the call is harmless (the TC retries it). From now on an
        ack in ``txn`` is refused (INVALID_TXN_STATUS)."""
        outcome = self._queue_end(txn, commit)
        if outcome is not None:
            await outcome

    def end_txn_early(self, txn: TxnID, commit: bool) -> None:
        """`end_txn` answered before it is durable, without a turn of the
        loop: the acks change when the record is durable."""
        outcome = self._queue_end(txn, commit)
        if outcome is not None:
            outcome.add_done_callback(unawaited)

    def _queue_end(self, txn: TxnID, commit: bool) -> asyncio.Future[list[Position]] | None:
        """Refuse acks in ``txn`` from now on and queue its end record, if it
        has acks here (None if not: nothing to write)."""
        txn = self._check_txn(txn)
        self._remember_ended(txn)
        if txn not in self.cursor.txn_acks and not any(
            r.kind == TXN_ACK and r.txn == txn for r in self._inflight
        ):
            return None
        return self._persist(txn_end_record(txn, commit))

    def check_no_txn_acks(self, what: str) -> None:
        """Raise `refusals.NotAllowed` if a transaction holds
        acknowledgements here (PENDING_ACK, or on their way)."""
        held = set(self.cursor.txn_acks)
        held.update(r.txn for r in self._inflight if r.kind == TXN_ACK and r.txn is not None)
        if held:
            raise refusals.NotAllowed(
                f"cannot {what} {self._where}: transaction(s) "
                f"{', '.join(txn_text(t) for t in sorted(held))} hold acknowledgements of "
                "it (PENDING_ACK); end or abort them first",
            )

    async def reset(self, mark_delete: Position) -> None:
        """Move the cursor, durably: every message after ``mark_delete``
        PENDING, every one at or before it DELETED. Refused
        (`refusals.NotAllowed`, nothing changed) while a transaction holds
        acknowledgements here."""
        while self._inflight:  # (records already queued apply to the old cursor)
            await self.ledger.wait_for(self.ledger.next_entry_id - 1)
            await asyncio.sleep(0)
        self.check_no_txn_acks("reset")
        await self._persist(AckRecord(SNAPSHOT, (mark_delete,)))

    def _check_txn(self, txn: object) -> TxnID:
        try:
            return check_txn(txn)
        except ValueError as exc:
            raise refusals.InvalidArgument(str(exc)) from exc

    def _remember_ended(self, txn: TxnID) -> None:
        self._ended[txn] = None
        self._ended.move_to_end(txn)
        while len(self._ended) > ENDED_MEMORY:
            self._ended.popitem(last=False)

    def _conflict(self, exc: AckConflict) -> refusals.TransactionConflict:
        return refusals.TransactionConflict(f"{self._where}: {exc}")

    # -- persist, then act --------------------------------------------------------

    def _persist(self, record: AckRecord, lazy: bool = False) -> asyncio.Future[list[Position]]:
        """Append ``record``, apply it once durable; the result is what
        changed. ``lazy``: see `ledger.Ledger.append`.

        It raises what the append raised, or `AckConflict` if the record was
        refused when applied (it is void: it changed nothing).
        """
        outcome: asyncio.Future[list[Position]] = asyncio.get_running_loop().create_future()
        appended = self.ledger.append(record.encode(), meta=record.kind, lazy=lazy)
        self._inflight.append(record)
        appended.add_done_callback(functools.partial(self._on_durable, record, outcome))
        return outcome

    def _on_durable(
        self,
        record: AckRecord,
        outcome: asyncio.Future[list[Position]],
        appended: asyncio.Future[int],
    ) -> None:
        # Done callbacks run in append order: records are applied in ledger order.
        self._inflight.remove(record)
        if appended.cancelled():
            outcome.cancel()
            return
        error = appended.exception()
        if error is not None:
            if not outcome.done():
                outcome.set_exception(error)
            return
        kind = record.kind
        if kind == TXN_ACK:
            faults.hit("subscriptions.after_pending_ack_write")
        elif kind in (TXN_COMMIT, TXN_ABORT):
            faults.hit("subscriptions.after_txn_end_write")
        changed: list[Position] | None = None
        try:
            changed = self.cursor.apply(
                kind,
                record.positions,
                self.count,
                self._partition.ledger.last_entry_id,
                record.txn,
                record.checked,
                record.ranges,
            )
            self.on_applied(record, changed)
        except Exception as exc:
            if not isinstance(exc, InvalidAckTransition):
                log.exception("applying %r on %s failed", record, self._where)
            if not outcome.done():
                outcome.set_exception(exc)
            changed = None
        if kind == SNAPSHOT:
            self._since_snapshot = 0
        else:
            self._since_snapshot += 1
            if self._since_snapshot >= SNAPSHOT_EVERY:
                self._since_snapshot = 0
                self._write_snapshot()
        if changed is not None and not outcome.done():
            outcome.set_result(changed)

    def _write_snapshot(self) -> None:
        # The snapshot must include the records queued before it.
        state = self.cursor.copy()
        last = self._partition.ledger.last_entry_id
        for record in self._inflight:
            try:
                state.apply(
                    record.kind, record.positions, self.count, last, record.txn,
                    ranges=record.ranges,
                )  # fmt: skip
            except InvalidAckTransition:
                pass  # refused, as it will be when applied: it changes nothing
        snapshot_then_trim(self.ledger, state.snapshot(), SNAPSHOT)
