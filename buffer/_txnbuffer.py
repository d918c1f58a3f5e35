"""The transaction buffer of one partition: its sidecar transaction log and index (PIP-31).

PIP-31 §Sidecar Approach and §Broker - Transaction Buffer. Transactional
sends do not go to the partition ledger ``p/{topic}/{index}`` but to a
sidecar ledger ``x/{topic}/{index}`` in the same `LedgerStore`, created when
a transaction first touches the partition (`Partition.txn_buffer`). Nothing
in it is visible to consumers. Committing appends a commit marker to the
partition ledger that names the transaction's sidecar records; the
dispatcher resolves it into the messages (`materialize`), which take the
marker's entry id: message i of the transaction is at (partition, marker
entry id, i). The records and the marker are `buffer._sidecar`'s types.

The transaction index (PIP-31 §Transaction Index: state, sidecar entries,
commit marker) lives in memory. Each transaction's state follows the table
of `buffer._txnstate`: requests (a send, an END) are checked against it
before anything is appended, and durable records move it on, through two
ledger listeners -- one on the sidecar (each durable record, `_apply`), one
on the partition ledger (each durable commit marker, `_on_marker`).
Recovery replays the latest snapshot's tail and the partition's markers
after it through the same two functions. Persist, then act: a record
changes the index only once it is durable.

END (`end`, `end_early`) queues its writes at once: COMMIT appends the
marker, naming every TXN_DATA record queued before it, durable or not
(entry ids are known once queued, and append order is durability order, so
the marker can go in their group commit), then, once the marker is
durable, the TXN_COMMIT record; ABORT appends TXN_ABORT. The durable marker
is the commit here: END answers then, and a crash before its TXN_COMMIT
record leaves a MARKED transaction that recovery completes (it scans the
partition's COMMIT_MARKER entries after the snapshot's ``scan_from`` by
ledger meta, reading only the markers), so a retried COMMIT never appends a
second marker. An early END answers once its writes are queued. Crash hooks
(`ledger.faults`): ``buffer.after_txn_data_write`` (a send is durable, not
yet answered) and ``buffer.after_commit_marker`` (the marker is durable,
its TXN_COMMIT record not yet queued).

The index holds the transactions that have not ended here; once its
TXN_COMMIT or TXN_ABORT record is durable, a transaction leaves it for a
bounded set of ended ones (the last `ENDED_TXNS_KEPT`, the newest
`ENDED_IN_SNAPSHOT` of them kept in snapshots too), so late writes and
retried ENDs stay answered correctly. Older ones are forgotten: the
broker's check that the coordinator knows the transaction as OPEN (KIP-890
§Ensure Ongoing Transaction) covers them.

Retention (PIP-31 §Retention Cursor): a committed transaction's sidecar
records are needed while its commit marker is in the partition ledger. The
buffer keeps that as retention blocks of up to `RETENTION_BLOCK` committed
transactions each: the highest marker and the lowest sidecar entry of the
block. `sweep` drops a block once the partition is trimmed past its highest
marker, and trims the sidecar up to the lowest entry still needed. So memory
and snapshots do not grow by a transaction's worth for each commit on a
partition that is never trimmed (one without subscriptions), at the price of
keeping up to a block's worth of sidecar records a little longer.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import functools
import itertools
import json
import logging
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from buffer._dedup import ProducerSequence
from buffer._entries import (
    COMMIT_MARKER,
    DuplicateTooOldError,
    PublishResult,
    SendRejectedError,
    entry_batch,
    entry_kind,
    send_sequence_ids,
    stored_sequence_ids,
    txn_run_start,
)
from buffer._names import Position
from buffer._sidecar import (
    TXN_DATA,
    TXN_SNAPSHOT,
    CommitMarker,
    TxnAbort,
    TxnCommit,
    TxnData,
    TxnSnapshot,
    decode_sidecar_record,
)
from buffer._txnstate import (
    OutOfOrderSequenceError,
    PartitionTxnEvent,
    PartitionTxnState,
    StaleEpochError,
    TransactionBufferError,
    transition,
    txn_text,
)
from ledger import Entry, Ledger, faults, pass_failure, settled, unawaited
from proto import TxnID, wire_txnid
from proto import txnbuf_pb2 as pb

__all__ = [
    "ENDED_IN_SNAPSHOT",
    "ENDED_TXNS_KEPT",
    "RETENTION_BLOCK",
    "SNAPSHOT_EVERY",
    "EpochProducer",
    "TransactionBuffer",
    "TxnInfo",
    "epoch_producer_name",
]

log = logging.getLogger(__name__)

_S, _E = PartitionTxnState, PartitionTxnEvent

# Write an index snapshot after this many sidecar records, or after as many
# records as the index has (open) transactions if that is more: a record pays
# for about one transaction's worth of snapshot, and recovery replays at most
# as many records after the snapshot as the snapshot itself holds.
SNAPSHOT_EVERY = 1000
# Committed transactions per retention block (see the module docstring).
RETENTION_BLOCK = 256
# How many swept (forgotten) ended transactions are still remembered, and
# how many of the newest of them a snapshot keeps (a snapshot is JSON
# written every SNAPSHOT_EVERY records, so it keeps fewer).
ENDED_TXNS_KEPT = 10_000
ENDED_IN_SNAPSHOT = 1_000
# Recently materialized commit markers kept in memory.
MATERIALIZED_CACHE_ENTRIES = 64
MATERIALIZED_CACHE_BYTES = 8 << 20
# Read a marker's sidecar entries as one range when it is at most this many
# times longer than the entries themselves (else run by run).
_DENSE_READ = 4
_REPLAY_CHUNK = 256

_U64 = 1 << 64
# The snapshot format: 2 keeps committed transactions as retention blocks;
# 1, which listed each committed transaction whose marker is in the
# partition, is read too.
_SNAPSHOT_VERSION = 2
# The sidecar records that move a transaction's state.
_RECORD_EVENTS: dict[type, PartitionTxnEvent] = {
    TxnData: _E.DATA,
    TxnCommit: _E.COMMIT_RECORD,
    TxnAbort: _E.ABORT_RECORD,
}


@dataclass(slots=True)
class EpochProducer:
    """What a partition knows of a producer-epoch producer (KIP-98 §Broker
    PID-Sequence Management): its latest epoch here, its transaction that
    has not ended here (if any), and the highest coordinator epoch (the
    boot epoch in that transaction's id) of its transactions here. The last
    sequence is the transaction's (its `ProducerSequence`)."""

    epoch: int
    txn: TxnID | None
    coordinator_epoch: int


def epoch_producer_name(producer_id: int, epoch: int) -> str:
    """The producer name a producer-epoch send is stored under (no user
    producer name starts with '~')."""
    return f"~{producer_id}.{epoch}"


def _parse_epoch_producer(name: str) -> tuple[int, int] | None:
    if not name.startswith("~"):
        return None
    pid, _, epoch = name[1:].partition(".")
    return int(pid), int(epoch)


def _coordinator_epoch(txn: TxnID) -> int:
    """The boot epoch of the coordinator that issued ``txn`` (see `tc`)."""
    return (((txn[0] & ((1 << 48) - 1)) << 64) | txn[1]) >> 64


def _check_key(txn: object, error: type[ValueError] = ValueError) -> None:
    if isinstance(txn, tuple) and len(txn) == 2:
        most, least = txn
        if isinstance(most, int) and isinstance(least, int):
            if 0 <= most < _U64 and 0 <= least < _U64:
                return
    raise error(
        f"a transaction id is (most_bits, least_bits), two unsigned 64-bit integers; got {txn!r}"
    )


# -- the index ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TxnInfo:
    """What the index knows of one transaction (for admin and stats).

    ``entries`` are its TXN_DATA records in the sidecar (empty once it ended here),
    ``count`` its messages here, ``marker`` its commit marker's entry id in
    the partition ledger (-1: none).
    """

    txn: TxnID
    state: PartitionTxnState
    count: int
    marker: int
    entries: tuple[int, ...]


@dataclass(slots=True, eq=False)
class _Txn:
    key: TxnID
    state: PartitionTxnState = PartitionTxnState.OPEN
    entries: list[int] = field(default_factory=list)  # sidecar TXN_DATA entry ids
    starts: list[int] = field(default_factory=list)  # batch index of each one's first message
    count: int = 0
    marker: int = -1
    # Live only, never persisted:
    queued: int = 0  # messages in the records queued so far (``count`` once all are applied)
    # TXN_DATA records queued and not yet applied (durable), in order: with
    # ``entries``, what its commit marker names (ids are known when queued).
    unapplied: collections.deque[int] = field(default_factory=collections.deque)
    producers: dict[str, ProducerSequence] = field(default_factory=dict)
    writes: asyncio.Future[Any] | None = None  # its END's writes (the last one's append)

    def base_of(self, entry_id: int) -> int:
        """Batch index of the first message of the TXN_DATA record ``entry_id``."""
        i = bisect.bisect_left(self.entries, entry_id)
        if i == len(self.entries) or self.entries[i] != entry_id:
            raise TransactionBufferError(
                f"sidecar entry {entry_id} is not a record of transaction {txn_text(self.key)}"
            )
        return self.starts[i]

    def producer(self, name: str) -> ProducerSequence:
        seq = self.producers.get(name)
        if seq is None:
            seq = self.producers[name] = ProducerSequence()
        return seq

    def writing(self) -> asyncio.Future[Any] | None:
        """Its END's writes while they are in flight (None if none are)."""
        writes = self.writes
        return None if writes is None or writes.done() else writes

    def info(self) -> TxnInfo:
        return TxnInfo(self.key, self.state, self.count, self.marker, tuple(self.entries))


async def _read_ids(ledger: Ledger, ids: Sequence[int]) -> list[Entry]:
    """The entries ``ids`` (increasing) that still exist, in few range reads."""
    if not ids:
        return []
    first, last = ids[0], ids[-1]
    if last - first + 1 <= _DENSE_READ * len(ids):
        wanted = set(ids)
        return [e for e in await ledger.read(first, last) if e.entry_id in wanted]
    out: list[Entry] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:  # a run ends at i - 1
            out.extend(await ledger.read(ids[start], ids[i - 1]))
            start = i
    return out


# -- the buffer ---------------------------------------------------------------------


class TransactionBuffer:
    """The sidecar transaction log of one partition and its transaction index.

    Create it with `Partition.txn_buffer` (new) or `TransactionBuffer.load`
    (recovery; `Partition.load` does this when the sidecar ledger exists).
    """

    def __init__(self, name: str, partition_ledger: Ledger, sidecar: Ledger) -> None:
        self.name = name
        self.partition_ledger = partition_ledger
        self.sidecar = sidecar
        self._txns: dict[TxnID, _Txn] = {}  # those not ended here (durably)
        # Swept transactions still remembered: key -> (state, marker, count).
        self._ended: collections.OrderedDict[TxnID, tuple[PartitionTxnState, int, int]] = (
            collections.OrderedDict()
        )
        # Retention blocks: [highest marker, lowest sidecar entry, transactions].
        self._retained: list[list[int]] = []
        self._since_snapshot = 0
        self._snapshot: tuple[int, int] | None = None  # latest durable: (entry id, covers)
        self._cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cache_bytes = 0
        self.snapshots_written = 0
        # The producer-epoch mode: producer id -> what this partition knows of it.
        self.epoch_producers: dict[int, EpochProducer] = {}
        sidecar.add_listener(self._on_sidecar)
        partition_ledger.add_listener(self._on_partition)

    def __repr__(self) -> str:
        return f"TransactionBuffer({self.name!r}, {len(self._txns)} transactions)"

    def detach(self) -> None:
        """Stop following the ledgers (the buffer is no longer used)."""
        self.sidecar.remove_listener(self._on_sidecar)
        self.partition_ledger.remove_listener(self._on_partition)

    # -- admin and stats ------------------------------------------------------------

    def status(self, txn: TxnID) -> TxnInfo | None:
        """What this partition knows of ``txn`` (None: nothing, or forgotten)."""
        t = self._txns.get(txn)
        if t is not None:
            return t.info()
        ended = self._ended.get(txn)
        if ended is not None:
            state, marker, count = ended
            return TxnInfo(txn, state, count, marker, ())
        return None

    def _remember(self, key: TxnID, state: PartitionTxnState, marker: int, count: int) -> None:
        self._ended[key] = (state, marker, count)
        self._ended.move_to_end(key)
        while len(self._ended) > ENDED_TXNS_KEPT:
            self._ended.popitem(last=False)

    def _retire(self, t: _Txn) -> None:
        """``t`` ended here, durably: from the index to the ended ones, and a
        committed one's sidecar records into a retention block."""
        self._txns.pop(t.key, None)
        self._remember(t.key, t.state, t.marker, t.count)
        if t.state is _S.COMMITTED and t.marker >= 0 and t.entries:
            block = self._retained[-1] if self._retained else None
            if block is None or block[2] >= RETENTION_BLOCK:
                self._retained.append([t.marker, t.entries[0], 1])
            else:
                block[0] = max(block[0], t.marker)
                block[1] = min(block[1], t.entries[0])
                block[2] += 1

    def idle(self) -> bool:
        """Does every transaction that touched this partition have its end
        here durable (none open, none ending)?"""
        return not self._txns

    def open_transactions(self) -> list[TxnID]:
        """Transactions with durable writes here that have not ended, in key order."""
        return sorted(k for k, t in self._txns.items() if t.entries)

    def transactions(self) -> list[TxnInfo]:
        """The transaction index (those not ended here, durably), in key order."""
        return [self._txns[k].info() for k in sorted(self._txns)]

    def stats(self) -> dict[str, Any]:
        """``committed``: committed transactions whose markers are still in
        the partition; ``aborted``: aborted ones among the remembered."""
        ended = collections.Counter(state for state, _, _ in self._ended.values())
        return {
            "open": sum(1 for t in self._txns.values() if t.entries),
            "committed": sum(block[2] for block in self._retained),
            "aborted": ended[_S.ABORTED],
            "ended_remembered": len(self._ended),
            "retention_blocks": len(self._retained),
            "sidecar_first_entry": self.sidecar.first_entry_id,
            "sidecar_last_entry": self.sidecar.last_entry_id,
            "snapshots_written": self.snapshots_written,
        }

    # -- transactional send ---------------------------------------------------------

    def publish(
        self,
        txn: TxnID,
        producer: str,
        messages: Sequence[pb.SingleMessage],
        encoded: bytes | None = None,
        early: bool = False,
        first_seq: int | None = None,
        epoch_producer: tuple[int, int] | None = None,
    ) -> Awaitable[PublishResult]:
        """Store one transactional send as one TXN_DATA record, dropping re-sent messages.

        ``epoch_producer``: (producer id, epoch) of a producer-epoch send,
        stored under `epoch_producer_name`: refused with `StaleEpochError`
        if this partition has seen a newer epoch (or coordinator epoch) of
        the producer, and with `OutOfOrderSequenceError` unless its first
        sequence is the next one of the producer in the transaction here (0
        for the first send of each epoch); a re-sent one is a duplicate.

        ``encoded`` and ``first_seq``: as for `Partition.publish`. ``early``: when nothing is
        re-sent, the result is ready at once, before the record is durable
        (the ids are known: records are stored in the order they are
        queued). Only for a transaction that a crash aborts (an OPEN
        transaction is aborted on recovery: see `tc._coordinator`). Its
        record is then a lazy append (`ledger.Ledger.append`): no group
        commit of its own; the END's takes it along (append order is
        durability order, so the decision is never durable without it).

        Everything up to queueing the append happens now, so sends are stored
        in the order `publish` is called; await the result for their ids,
        ``(-1, i)`` with i the message's place in the transaction here.
        Raises (nothing stored) `SendRejectedError` for bad input and
        `TxnEndedError` when the transaction has ended (or is ending) here.
        """
        _check_key(txn, SendRejectedError)
        seqs = send_sequence_ids(messages, first_seq)
        t = self._txns.get(txn)
        if t is None:
            ended = self._ended.get(txn)
            if ended is not None:
                transition(txn, ended[0], _E.SEND)  # (refused)
            t = self._txns[txn] = _Txn(txn)  # durable with its first record
        else:
            transition(txn, t.state, _E.SEND)
        state = t.producer(producer)
        if epoch_producer is not None:
            self._check_epoch_send(txn, epoch_producer, seqs[0], state)
        if seqs[0] > state.pushed:  # the usual case: nothing re-sent
            # (An early send is lazy: the transaction's END is what waits for
            # it to be durable, and the END's group commit takes it along.)
            queued = self._append(t, producer, messages, seqs, state, encoded, lazy=early)
            if not early:
                return self._new(t, queued)
            queued.add_done_callback(unawaited)
            base = t.queued - len(seqs)  # the batch index of its first message
            ready: asyncio.Future[PublishResult] = asyncio.get_running_loop().create_future()
            ready.set_result(PublishResult(-1, None, base))
            return ready
        waits = state.last_append if state.pushed > state.persisted else None
        fresh = [i for i, s in enumerate(seqs) if s > state.pushed]
        appended = None
        if fresh:
            appended = self._append(
                t, producer, [messages[i] for i in fresh], [seqs[i] for i in fresh], state
            )
        return self._mixed(t, seqs, fresh, state, waits, appended)

    def _check_epoch_send(
        self, txn: TxnID, producer: tuple[int, int], first: int, state: ProducerSequence
    ) -> None:
        """The producer-epoch checks of a send (see `publish`); notes the
        producer's epoch and transaction here."""
        pid, epoch = producer
        known = self.epoch_producers.get(pid)
        coordinator_epoch = _coordinator_epoch(txn)
        if known is not None and (
            epoch < known.epoch or coordinator_epoch < known.coordinator_epoch
        ):
            raise StaleEpochError(
                f"producer {pid} epoch {epoch} is older than epoch {known.epoch} on {self.name}: "
                "a write of a finished transaction is refused"
            )
        if first > state.pushed + 1:
            expected = state.pushed + 1
            raise OutOfOrderSequenceError(
                f"producer {pid} epoch {epoch} sent sequence {first} to {self.name}, where "
                f"{expected} comes next{' (an epoch starts at 0)' if expected == 0 else ''}"
            )
        self.epoch_producers[pid] = EpochProducer(epoch, txn, coordinator_epoch)

    def _note_epoch_producer(self, txn: TxnID, name: str) -> None:
        """Recovery: a stored send of ``name`` in ``txn``, if a producer-epoch one."""
        producer = _parse_epoch_producer(name)
        if producer is None:
            return
        pid, epoch = producer
        known = self.epoch_producers.get(pid)
        coordinator_epoch = _coordinator_epoch(txn)
        if known is None or (coordinator_epoch, epoch) >= (known.coordinator_epoch, known.epoch):
            self.epoch_producers[pid] = EpochProducer(epoch, txn, coordinator_epoch)

    def _append(
        self,
        t: _Txn,
        producer: str,
        messages: Sequence[pb.SingleMessage],
        seqs: Sequence[int],
        state: ProducerSequence,
        encoded: bytes | None = None,
        lazy: bool = False,
    ) -> asyncio.Future[int]:
        batch = entry_batch(producer, messages, encoded)
        t.unapplied.append(self.sidecar.next_entry_id)
        data, meta = TxnData(t.key, batch, len(messages)).encode()
        fut = self.sidecar.append(data, meta, lazy=lazy)
        t.queued = max(t.queued, t.count) + len(messages)
        state.pushed = seqs[-1]
        state.last_append = fut

        def done(f: asyncio.Future[int]) -> None:
            if f.cancelled() or f.exception() is not None:
                state.pushed = state.persisted  # not stored: a retry must be accepted
                return
            # The sidecar listener has applied the record: its base is known.
            state.record(seqs, t.base_of(f.result()))

        fut.add_done_callback(done)
        return fut

    async def _new(self, t: _Txn, appended: asyncio.Future[int]) -> PublishResult:
        entry_id = await appended
        faults.hit("buffer.after_txn_data_write")
        base = t.base_of(entry_id)
        return PublishResult(-1, None, base)

    async def _mixed(
        self,
        t: _Txn,
        seqs: Sequence[int],
        fresh: list[int],
        state: ProducerSequence,
        waits: asyncio.Future[int] | None,
        appended: asyncio.Future[int] | None,
    ) -> PublishResult:
        if waits is not None:
            await settled(waits)  # re-sent messages still in flight: learn their ids
        base = -1
        if appended is not None:
            entry_id = await appended
            faults.hit("buffer.after_txn_data_write")
            base = t.base_of(entry_id)
        fresh_at = {seqs[i]: n for n, i in enumerate(fresh)}
        ids: list[Position] = []
        for s in seqs:
            if s in fresh_at:
                ids.append((-1, base + fresh_at[s]))
                continue
            where = state.lookup(s)
            if where is None:
                raise DuplicateTooOldError(
                    f"sequence id {s} of this producer is stored already in this "
                    "transaction, too long ago to answer with its message id"
                )
            ids.append((-1, where[0] + where[1]))
        first = txn_run_start(ids)
        return PublishResult(-1, ids) if first is None else PublishResult(-1, None, first)

    # -- end on partition -----------------------------------------------------------

    async def end(
        self,
        txn: TxnID,
        commit: bool,
        early: bool = False,
        producer: tuple[int, int] | None = None,
    ) -> None:
        """End ``txn`` here (EndTxnOnPartition); idempotent, so retry until it returns.

        COMMIT appends the commit marker to the partition ledger, then a
        TXN_COMMIT record naming it, and returns once the marker is durable
        (the record follows; recovery completes it from the marker); ABORT
        appends TXN_ABORT and returns once it is durable. A transaction
        that never wrote here gets just its TXN_COMMIT (marker -1) or
        TXN_ABORT record, so that late writes for it are refused. Raises
        `TxnConflictError` (changing nothing) if it ended (or is ending) the
        other way. An END while another one's writes are in flight waits
        for them.

        ``early``: return once the writes are queued, before they are
        durable. For a coordinator whose log shares this buffer's store: its
        decision is durable already, and what it logs after this call is
        durable only with the marker (``tc`` calls with it then, or
        `end_early`).

        ``producer``: the (producer id, epoch) the transaction belongs to
        (the producer-epoch mode): its marker is refused (`StaleEpochError`,
        nothing changes) if this partition has seen a newer epoch of it.
        """
        t = self._begin_end(txn, commit, producer)
        if t is None:
            return
        writing = t.writing()
        if writing is not None:
            await asyncio.shield(writing)
            return
        answered = self._write_end(t, early)
        if answered is not None:
            await answered

    def end_early(self, txn: TxnID, commit: bool, producer: tuple[int, int] | None = None) -> bool:
        """`end` with ``early=True``, without a turn of the loop: True once
        its writes are queued (or nothing was left to do), False if another
        END's writes are in flight here (call `end`, which waits for them).
        Raises as `end` does."""
        t = self._begin_end(txn, commit, producer)
        if t is None:
            return True
        if t.writing() is not None:
            return False
        self._write_end(t, early=True)
        return True

    def _begin_end(
        self, txn: TxnID, commit: bool, producer: tuple[int, int] | None = None
    ) -> _Txn | None:
        """Check an END of ``txn`` against its state and move it on (sends
        are refused from now on); None if it ended here already (the same way)."""
        _check_key(txn)
        event = _E.COMMIT if commit else _E.ABORT
        ended = self._ended.get(txn)
        if ended is not None:
            transition(txn, ended[0], event)  # (a repeated END, or refused)
            return None
        if producer is not None:
            known = self.epoch_producers.get(producer[0])
            if (
                known is not None
                and known.txn != txn
                and (known.epoch > producer[1] or known.coordinator_epoch > _coordinator_epoch(txn))
            ):
                raise StaleEpochError(
                    f"the marker of producer {producer[0]} epoch {producer[1]} is older than "
                    f"epoch {known.epoch} on {self.name}: refused"
                )
        t = self._txns.get(txn)
        if t is None:
            t = self._txns[txn] = _Txn(txn)
        t.state = transition(txn, t.state, event)
        return t

    def _write_end(self, t: _Txn, early: bool) -> asyncio.Future[Any] | None:
        """Queue the writes that end ``t`` here (its state says which); the
        future an END that is not ``early`` returns at (None: at once)."""
        answered: asyncio.Future[Any] | None
        if t.state is _S.ENDING_ABORT:
            writes = answered = self.sidecar.append(*TxnAbort(t.key).encode())
        elif t.state is _S.ENDING_COMMIT and (t.entries or t.unapplied):
            answered = None if early else asyncio.get_running_loop().create_future()
            writes = self._after_marker(t, self._append_marker(t), answered)
        else:  # MARKED, or nothing written here: the TXN_COMMIT record alone
            writes = answered = self._commit_record(t)
            if t.state is _S.MARKED:
                answered = None  # (the durable marker is the commit)
        t.writes = writes
        writes.add_done_callback(functools.partial(self._written, t))
        return None if early else answered

    def _append_marker(self, t: _Txn) -> asyncio.Future[int]:
        """The commit marker of every TXN_DATA record of ``t``, durable or queued."""
        marker = CommitMarker(t.key, [*t.entries, *t.unapplied], max(t.queued, t.count))
        return self.partition_ledger.append(*marker.encode())

    def _commit_record(self, t: _Txn) -> asyncio.Future[int]:
        data, meta = TxnCommit(t.key, t.marker).encode()
        # (answered at the marker: nobody waits for the record)
        return self.sidecar.append(data, meta, lazy=t.marker >= 0)

    def _after_marker(
        self, t: _Txn, marker: asyncio.Future[int], answered: asyncio.Future[Any] | None
    ) -> asyncio.Future[int]:
        """Append the TXN_COMMIT record once ``marker`` is durable; the result
        is the record's append (failed if the marker failed). ``answered``
        gets the outcome once the record is queued. Callbacks, not a task:
        this is on every commit's path."""
        recorded: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def copy(record: asyncio.Future[int]) -> None:
            if not recorded.done() and not pass_failure(record, recorded):
                recorded.set_result(record.result())

        def marked(m: asyncio.Future[int]) -> None:
            if pass_failure(m, recorded):
                if answered is not None:
                    pass_failure(m, answered)
                return
            t.marker = m.result()  # (the partition listener noted it, unless detached)
            try:
                faults.hit("buffer.after_commit_marker")
                record = self._commit_record(t)
            except Exception as exc:  # (a closed store; in tests, a crash hook)
                recorded.set_exception(exc)
                if answered is not None and not answered.done():
                    answered.set_exception(exc)
                return
            record.add_done_callback(copy)
            if answered is not None and not answered.done():
                answered.set_result(None)

        marker.add_done_callback(marked)
        return recorded

    def _written(self, t: _Txn, writes: asyncio.Future[Any]) -> None:
        if not writes.cancelled() and writes.exception() is not None:
            # Recovery completes a TXN_COMMIT from its marker; a retried END writes again.
            log.error("%s: ending %s failed: %s", self.name, txn_text(t.key), writes.exception())

    @staticmethod
    def uncommitted_batch(entry: Entry) -> bytes | None:
        """The serialized `EntryBatch` of a sidecar TXN_DATA record (None for
        any other record), for read_uncommitted subscriptions."""
        if entry_kind(entry.meta) != TXN_DATA:
            return None
        return bytes(TxnData.decode(entry.meta, entry.data).batch)

    async def settled(self) -> None:
        """Wait until the writes of the ENDs answered so far are durable."""
        pending = [t.writes for t in self._txns.values() if t.writes is not None]
        if pending:
            await asyncio.wait(pending)

    # -- applying records (live and on recovery) ---------------------------------------

    def _on_sidecar(self, _ledger: Ledger, entries: list[Entry]) -> None:
        records = 0
        for entry in entries:
            if entry_kind(entry.meta) != TXN_SNAPSHOT:
                self._apply(entry)
                records += 1
        self._since_snapshot += records
        if self._since_snapshot >= max(SNAPSHOT_EVERY, len(self._txns)):
            self._write_snapshot()

    def _apply(self, entry: Entry) -> None:
        """Apply one durable sidecar record to the index."""
        try:
            record = decode_sidecar_record(entry.meta, entry.data)
        except TransactionBufferError as exc:
            log.error("%s: sidecar entry %d ignored: %s", self.name, entry.entry_id, exc)
            return
        if isinstance(record, TxnSnapshot):
            return
        key = record.txn
        t = self._txns.get(key)
        if t is None:
            t = self._txns[key] = _Txn(key)
        try:
            t.state = transition(key, t.state, _RECORD_EVENTS[type(record)])
        except TransactionBufferError as exc:  # the checks before appending prevent this
            log.error("%s: sidecar entry %d ignored: %s", self.name, entry.entry_id, exc)
            return
        if isinstance(record, TxnData):
            if t.unapplied and t.unapplied[0] == entry.entry_id:
                t.unapplied.popleft()
            t.entries.append(entry.entry_id)
            t.starts.append(t.count)
            t.count += record.count
            return
        if isinstance(record, TxnCommit) and record.marker >= 0:
            t.marker = record.marker
        t.producers = {}  # ended: no more sends to deduplicate
        self._retire(t)

    def _on_partition(self, _ledger: Ledger, entries: list[Entry]) -> None:
        for entry in entries:
            if entry_kind(entry.meta) == COMMIT_MARKER:
                self._on_marker(entry)

    def _on_marker(self, entry: Entry) -> None:
        """A commit marker is durable in the partition ledger: note it in the index."""
        key = CommitMarker.decode(entry.meta, entry.data).txn
        t = self._txns.get(key)
        if t is None:
            if key not in self._ended:
                log.error(
                    "%s: commit marker %d of unknown transaction %s",
                    self.name,
                    entry.entry_id,
                    txn_text(key),
                )
            return
        try:
            t.state = transition(key, t.state, _E.MARKER)
        except TransactionBufferError as exc:  # (a second marker: the first one stands)
            log.error("%s: commit marker %d ignored: %s", self.name, entry.entry_id, exc)
            return
        t.marker = entry.entry_id

    # -- snapshots and recovery -----------------------------------------------------

    def _snapshot_record(self) -> bytes:
        """The index as JSON, as of every durable sidecar record and commit marker.

        ``{"v": 2, "covers": last sidecar entry applied, "scan_from": first
        partition entry whose markers are not applied, "txns": [[most, least,
        state, marker, count, entries, starts], ...], "ended": [[most, least,
        state, marker, count], ...], "retained": [[highest marker, lowest
        entry, transactions], ...], "epoch_producers": [[producer id, epoch,
        txn, coordinator epoch], ...]}``. The transactions in ``txns`` have
        not ended: their state is "open" (an END under way is not durable; a
        durable marker is ``marker``). Those without a durable record (a
        send still in flight) are left out: their records come after
        ``covers``.
        """
        txns = [
            [k[0], k[1], _S.OPEN.value, t.marker, t.count, t.entries, t.starts]
            for k, t in self._txns.items()
            if t.entries
        ]
        newest = itertools.islice(reversed(self._ended.items()), ENDED_IN_SNAPSHOT)
        ended = [[k[0], k[1], s.value, m, c] for k, (s, m, c) in newest][::-1]
        record = {
            "v": _SNAPSHOT_VERSION,
            "covers": self.sidecar.last_entry_id,
            "scan_from": self.partition_ledger.last_entry_id + 1,
            "txns": txns,
            "ended": ended,
            "retained": self._retained,
            "epoch_producers": [
                [pid, p.epoch, p.txn, p.coordinator_epoch]
                for pid, p in self.epoch_producers.items()
            ],
        }
        return json.dumps(record, separators=(",", ":")).encode()

    def _write_snapshot(self) -> tuple[asyncio.Future[int], int]:
        """Queue a snapshot; return its future and the last entry it covers."""
        covers = self.sidecar.last_entry_id
        self._since_snapshot = 0
        fut = self.sidecar.append(*TxnSnapshot(self._snapshot_record()).encode())

        def done(f: asyncio.Future[int]) -> None:
            if f.cancelled() or f.exception() is not None:
                log.warning("%s: index snapshot not written", self.name)
                return
            self.snapshots_written += 1
            if self._snapshot is None or f.result() > self._snapshot[0]:
                self._snapshot = (f.result(), covers)

        fut.add_done_callback(done)
        return fut, covers

    def _restore(self, record: dict[str, Any]) -> tuple[int, int]:
        version = record.get("v")
        if version not in (1, _SNAPSHOT_VERSION):
            raise TransactionBufferError(f"{self.name}: unknown snapshot version {version}")
        for most, least, state, marker, count in record["ended"]:
            self._remember(wire_txnid(most, least), _S(state), marker, count)
        self._retained = [list(block) for block in record.get("retained", [])]
        for pid, epoch, txn, coordinator_epoch in record.get("epoch_producers", []):
            self.epoch_producers[pid] = EpochProducer(
                epoch, None if txn is None else wire_txnid(txn[0], txn[1]), coordinator_epoch
            )
        for most, least, state, marker, count, entries, starts in record["txns"]:
            key = wire_txnid(most, least)
            t = self._txns[key] = _Txn(
                key, PartitionTxnState(state), entries, starts, count, marker
            )
            if t.state is not _S.OPEN:  # (version 1 kept the ended ones here)
                self._retire(t)
            elif marker >= 0:
                t.state = transition(key, t.state, _E.MARKER)
        return int(record["covers"]), int(record["scan_from"])

    @classmethod
    async def load(
        cls,
        name: str,
        partition_ledger: Ledger,
        sidecar: Ledger,
        partition_meta: list[tuple[int, int]] | None = None,
    ) -> TransactionBuffer:
        """Rebuild the index: latest snapshot, the sidecar records after it, then the
        partition's commit markers after it; complete interrupted commits.

        ``partition_meta`` is ``partition_ledger.read_meta()`` if the caller
        has it already.
        """
        tb = cls(name, partition_ledger, sidecar)
        try:
            await tb._recover(partition_meta)
        except BaseException:
            tb.detach()
            raise
        return tb

    async def _recover(self, partition_meta: list[tuple[int, int]] | None) -> None:
        sidecar = self.sidecar
        metas = await sidecar.read_meta()
        snapshot = next((e for e, m in reversed(metas) if entry_kind(m) == TXN_SNAPSHOT), None)
        replay_from, scan_from = sidecar.first_entry_id, self.partition_ledger.first_entry_id
        if snapshot is not None:
            (snap,) = await sidecar.read(snapshot, snapshot)
            covers, scan_from = self._restore(json.loads(snap.data))
            self._snapshot = (snapshot, covers)
            replay_from = covers + 1
        records = 0
        for start in range(replay_from, sidecar.last_entry_id + 1, _REPLAY_CHUNK):
            for entry in await sidecar.read(start, start + _REPLAY_CHUNK - 1):
                kind = entry_kind(entry.meta)
                if kind != TXN_SNAPSHOT:
                    self._apply(entry)
                    records += 1
                if kind == TXN_DATA:  # (the epochs of producer-epoch sends since the snapshot)
                    data = TxnData.decode(entry.meta, entry.data)
                    name = pb.EntryBatch.FromString(bytes(data.batch)).producer_name
                    self._note_epoch_producer(data.txn, name)
        self._since_snapshot = records

        if partition_meta is None:
            partition_meta = await self.partition_ledger.read_meta()
        markers = [
            e for e, m in partition_meta if e >= scan_from and entry_kind(m) == COMMIT_MARKER
        ]
        for entry in await _read_ids(self.partition_ledger, markers):
            self._on_marker(entry)

        # Sequence state of open transactions, so that re-sends are not stored twice.
        opened = sorted(e for t in self._txns.values() for e in t.entries)
        for entry in await _read_ids(sidecar, opened):
            data = TxnData.decode(entry.meta, entry.data)
            t = self._txns[data.txn]
            batch = pb.EntryBatch.FromString(bytes(data.batch))
            seqs = stored_sequence_ids(batch.messages)
            t.producer(batch.producer_name).record(seqs, t.base_of(entry.entry_id))

        # A crash between a commit marker and its TXN_COMMIT record: complete it.
        interrupted = [t for t in self._txns.values() if t.state is _S.MARKED]
        for t in interrupted:
            log.info(
                "%s: completing the commit of %s (marker %d)", self.name, txn_text(t.key), t.marker
            )
        await asyncio.gather(
            *(sidecar.append(*TxnCommit(t.key, t.marker).encode()) for t in interrupted)
        )

    # -- materialization -----------------------------------------------------------

    async def materialize(self, marker: Entry) -> bytes:
        """The serialized `EntryBatch` of a commit marker's messages, in send order."""
        cached = self._cache.get(marker.entry_id)
        if cached is not None:
            self._cache.move_to_end(marker.entry_id)
            return cached
        commit = CommitMarker.decode(marker.meta, marker.data)
        records = await _read_ids(self.sidecar, commit.entries)
        batches = []
        count = 0
        for record in records:
            data = TxnData.decode(record.meta, record.data)
            if data.txn != commit.txn:
                raise TransactionBufferError(
                    f"{self.name}: sidecar entry {record.entry_id} named by commit marker "
                    f"{marker.entry_id} is not a record of transaction {txn_text(commit.txn)}"
                )
            count += data.count
            batches.append(data.batch)
        if len(records) != len(commit.entries) or count != commit.count:
            raise TransactionBufferError(
                f"{self.name}: the messages of commit marker {marker.entry_id} are gone from "
                "the sidecar log (swept after the marker was trimmed?)"
            )
        joined = b"".join(batches)
        self._cache[marker.entry_id] = joined
        self._cache_bytes += len(joined)
        while self._cache and (
            len(self._cache) > MATERIALIZED_CACHE_ENTRIES
            or self._cache_bytes > MATERIALIZED_CACHE_BYTES
        ):
            _, dropped = self._cache.popitem(last=False)
            self._cache_bytes -= len(dropped)
        return joined

    # -- retention (PIP-31 §Retention Cursor) ----------------------------------------

    async def sweep(self, keep_from: int | None = None) -> int:
        """Trim the sidecar log up to the first entry still needed; return how many went.

        Needed: the records of OPEN transactions and of the retention blocks
        whose highest marker is still in the partition ledger, plus the latest
        snapshot and the records after what it covers, and everything from
        ``keep_from`` on (what read_uncommitted subscriptions have not
        acknowledged). A fresh snapshot (written when anything changed) lets
        the log go up to here.
        """
        first_marker = self.partition_ledger.first_entry_id
        retained = [block for block in self._retained if block[0] >= first_marker]
        released = len(retained) != len(self._retained)
        self._retained = retained
        if released or self._snapshot is None or self._snapshot[0] != self.sidecar.last_entry_id:
            written, covers = self._write_snapshot()
            await written
        else:
            covers = self._snapshot[1]  # nothing happened since the latest snapshot
        keep = covers + 1
        if keep_from is not None:
            keep = min(keep, keep_from)
        for block in self._retained:
            keep = min(keep, block[1])
        for t in self._txns.values():
            if t.entries:
                keep = min(keep, t.entries[0])
        drop = keep - self.sidecar.first_entry_id
        if drop <= 0:
            return 0
        await self.sidecar.trim(keep)
        return drop
