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
commit marker) lives in memory, as data (`buffer._txnindex.TxnIndex`: the
transactions not ended here, the ended ones remembered, the retention
blocks, the producer-epoch producers, and its snapshots). This module is its
I/O: sends, ENDs, the records and markers that move it, recovery,
materialization and sweep. Each transaction's state follows the table
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
bounded set of ended ones (`buffer._txnindex.ENDED_TXNS_KEPT`, the newest
`ENDED_IN_SNAPSHOT` of them kept in snapshots too), so late writes and
retried ENDs stay answered correctly. Older ones are forgotten: the
broker's check that the coordinator knows the transaction as OPEN (KIP-890
§Ensure Ongoing Transaction) covers them.

Retention (PIP-31 §Retention Cursor): a committed transaction's sidecar
records are needed while its commit marker is in the partition ledger; the
index keeps them as retention blocks (`TxnIndex.retire`). `sweep` drops a
block once the partition is trimmed past its highest marker, and trims the
sidecar up to the lowest entry still needed.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import json
import logging
from collections.abc import Awaitable, Sequence
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
from buffer._txnindex import EpochProducer, IndexedTxn, TxnIndex, TxnInfo, check_key, read_ids
from buffer._txnstate import PartitionTxnEvent, PartitionTxnState, TransactionBufferError, step
from ledger import Entry, Ledger, faults, pass_failure, settled, unawaited
from proto import TxnID, txn_text
from proto import txnbuf_pb2 as pb

__all__ = ["SNAPSHOT_EVERY", "TransactionBuffer"]

log = logging.getLogger(__name__)

_S, _E = PartitionTxnState, PartitionTxnEvent

# Write an index snapshot after this many sidecar records, or after as many
# records as the index has (open) transactions if that is more: a record pays
# for about one transaction's worth of snapshot, and recovery replays at most
# as many records after the snapshot as the snapshot itself holds.
SNAPSHOT_EVERY = 1000
# Recently materialized commit markers kept in memory.
MATERIALIZED_CACHE_ENTRIES = 64
MATERIALIZED_CACHE_BYTES = 8 << 20
_REPLAY_CHUNK = 256

# The sidecar records that move a transaction's state.
_RECORD_EVENTS: dict[type, PartitionTxnEvent] = {
    TxnData: _E.DATA,
    TxnCommit: _E.COMMIT_RECORD,
    TxnAbort: _E.ABORT_RECORD,
}


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
        self._index = TxnIndex(name)  # what it knows of the transactions (no I/O)
        self._since_snapshot = 0
        self._snapshot: tuple[int, int] | None = None  # latest durable: (entry id, covers)
        self._cache: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._cache_bytes = 0
        self.snapshots_written = 0
        sidecar.add_listener(self._on_sidecar)
        partition_ledger.add_listener(self._on_partition)

    def __repr__(self) -> str:
        return f"TransactionBuffer({self.name!r}, {len(self._index.txns)} transactions)"

    def detach(self) -> None:
        """Stop following the ledgers (the buffer is no longer used)."""
        self.sidecar.remove_listener(self._on_sidecar)
        self.partition_ledger.remove_listener(self._on_partition)

    # -- admin and stats ------------------------------------------------------------

    @property
    def epoch_producers(self) -> dict[int, EpochProducer]:
        """The producer-epoch mode: producer id -> what this partition knows of it."""
        return self._index.epoch_producers

    def status(self, txn: TxnID) -> TxnInfo | None:
        """What this partition knows of ``txn`` (None: nothing, or forgotten)."""
        return self._index.status(txn)

    def idle(self) -> bool:
        """Does every transaction that touched this partition have its end
        here durable (none open, none ending)?"""
        return not self._index.txns

    def open_transactions(self) -> list[TxnID]:
        """Transactions with durable writes here that have not ended, in key order."""
        return self._index.open_transactions()

    def transactions(self) -> list[TxnInfo]:
        """The transaction index (those not ended here, durably), in key order."""
        return self._index.transactions()

    def stats(self) -> dict[str, Any]:
        """``committed``: committed transactions whose markers are still in
        the partition; ``aborted``: aborted ones among the remembered."""
        return {
            **self._index.stats(),
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
        check_key(txn, SendRejectedError)
        seqs = send_sequence_ids(messages, first_seq)
        t = self._index.txns.get(txn)
        if t is None:
            ended = self._index.ended.get(txn)
            if ended is not None:
                step(txn, ended[0], _E.SEND)  # (refused)
            t = self._index.txns[txn] = IndexedTxn(txn)  # durable with its first record
        else:
            step(txn, t.state, _E.SEND)
        state = t.producer(producer)
        if epoch_producer is not None:
            self._index.check_epoch_send(txn, epoch_producer, seqs[0], state)
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

    def _append(
        self,
        t: IndexedTxn,
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

    async def _new(self, t: IndexedTxn, appended: asyncio.Future[int]) -> PublishResult:
        entry_id = await appended
        faults.hit("buffer.after_txn_data_write")
        base = t.base_of(entry_id)
        return PublishResult(-1, None, base)

    async def _mixed(
        self,
        t: IndexedTxn,
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
    ) -> IndexedTxn | None:
        """Check an END of ``txn`` against its state and move it on (sends
        are refused from now on); None if it ended here already (the same way)."""
        check_key(txn)
        event = _E.COMMIT if commit else _E.ABORT
        ended = self._index.ended.get(txn)
        if ended is not None:
            step(txn, ended[0], event)  # (a repeated END, or refused)
            return None
        if producer is not None:
            self._index.check_epoch_marker(txn, producer)
        t = self._index.txns.get(txn)
        if t is None:
            t = self._index.txns[txn] = IndexedTxn(txn)
        t.state = step(txn, t.state, event)
        return t

    def _write_end(self, t: IndexedTxn, early: bool) -> asyncio.Future[Any] | None:
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

    def _append_marker(self, t: IndexedTxn) -> asyncio.Future[int]:
        """The commit marker of every TXN_DATA record of ``t``, durable or queued."""
        marker = CommitMarker(t.key, [*t.entries, *t.unapplied], max(t.queued, t.count))
        return self.partition_ledger.append(*marker.encode())

    def _commit_record(self, t: IndexedTxn) -> asyncio.Future[int]:
        data, meta = TxnCommit(t.key, t.marker).encode()
        # (answered at the marker: nobody waits for the record)
        return self.sidecar.append(data, meta, lazy=t.marker >= 0)

    def _after_marker(
        self, t: IndexedTxn, marker: asyncio.Future[int], answered: asyncio.Future[Any] | None
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

    def _written(self, t: IndexedTxn, writes: asyncio.Future[Any]) -> None:
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
        pending = [t.writes for t in self._index.txns.values() if t.writes is not None]
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
        if self._since_snapshot >= max(SNAPSHOT_EVERY, len(self._index.txns)):
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
        t = self._index.txns.get(key)
        if t is None:
            t = self._index.txns[key] = IndexedTxn(key)
        try:
            t.state = step(key, t.state, _RECORD_EVENTS[type(record)])
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
        self._index.retire(t)

    def _on_partition(self, _ledger: Ledger, entries: list[Entry]) -> None:
        for entry in entries:
            if entry_kind(entry.meta) == COMMIT_MARKER:
                self._on_marker(entry)

    def _on_marker(self, entry: Entry) -> None:
        """A commit marker is durable in the partition ledger: note it in the index."""
        key = CommitMarker.decode(entry.meta, entry.data).txn
        t = self._index.txns.get(key)
        if t is None:
            if key not in self._index.ended:
                log.error(
                    "%s: commit marker %d of unknown transaction %s",
                    self.name,
                    entry.entry_id,
                    txn_text(key),
                )
            return
        try:
            t.state = step(key, t.state, _E.MARKER)
        except TransactionBufferError as exc:  # (a second marker: the first one stands)
            log.error("%s: commit marker %d ignored: %s", self.name, entry.entry_id, exc)
            return
        t.marker = entry.entry_id

    # -- snapshots and recovery -----------------------------------------------------

    def _snapshot_record(self) -> bytes:
        """The index as of every durable sidecar record and commit marker
        (`TxnIndex.snapshot`)."""
        return self._index.snapshot(
            self.sidecar.last_entry_id, self.partition_ledger.last_entry_id + 1
        )

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
            covers, scan_from = self._index.restore(json.loads(snap.data))
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
                    self._index.note_epoch_producer(data.txn, name)
        self._since_snapshot = records

        if partition_meta is None:
            partition_meta = await self.partition_ledger.read_meta()
        markers = [
            e for e, m in partition_meta if e >= scan_from and entry_kind(m) == COMMIT_MARKER
        ]
        for entry in await read_ids(self.partition_ledger, markers):
            self._on_marker(entry)

        # Sequence state of open transactions, so that re-sends are not stored twice.
        opened = sorted(e for t in self._index.txns.values() for e in t.entries)
        for entry in await read_ids(sidecar, opened):
            data = TxnData.decode(entry.meta, entry.data)
            t = self._index.txns[data.txn]
            batch = pb.EntryBatch.FromString(bytes(data.batch))
            seqs = stored_sequence_ids(batch.messages)
            t.producer(batch.producer_name).record(seqs, t.base_of(entry.entry_id))

        # A crash between a commit marker and its TXN_COMMIT record: complete it.
        interrupted = [t for t in self._index.txns.values() if t.state is _S.MARKED]
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
        records = await read_ids(self.sidecar, commit.entries)
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
        released = self._index.release(self.partition_ledger.first_entry_id)
        if released or self._snapshot is None or self._snapshot[0] != self.sidecar.last_entry_id:
            written, covers = self._write_snapshot()
            await written
        else:
            covers = self._snapshot[1]  # nothing happened since the latest snapshot
        keep = covers + 1
        if keep_from is not None:
            keep = min(keep, keep_from)
        keep = self._index.needed_from(keep)
        drop = keep - self.sidecar.first_entry_id
        if drop <= 0:
            return 0
        await self.sidecar.trim(keep)
        return drop
