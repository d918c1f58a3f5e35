"""One topic partition: its ledger, message counts and deduplication.

An entry of the partition ledger is either DATA, the messages of one send as
a serialized `EntryBatch`, or a COMMIT_MARKER of a transaction, which stands
for the transaction's messages held in the partition's sidecar transaction
log (PIP-31 §Sidecar Approach, see `buffer._txnbuffer`). Its ledger ``meta``
packs the kind and the message count (`entry_meta`), so that subscriptions
know entry sizes and kinds without reading entries. Message ids are
(partition, entry id, batch index); a committed transaction's messages take
the marker's entry id.
"""

from __future__ import annotations

import array
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

from buffer._dedup import DedupState, ProducerSequence
from buffer._entries import (
    COMMIT_MARKER,
    COUNT_MASK,
    DATA,
    DuplicateTooOldError,
    PublishResult,
    SendRejectedError,
    entry_batch,
    entry_count,
    entry_kind,
    entry_meta,
    send_sequence_ids,
    stored_sequence_ids,
)
from buffer._names import Position
from buffer._txnbuffer import TransactionBuffer, TransactionBufferError, sidecar_ledger_name
from ledger import Entry, Ledger, LedgerStore
from proto import txnbuf_pb2 as pb

__all__ = [
    "COMMIT_MARKER",
    "DATA",
    "DuplicateTooOldError",
    "Partition",
    "PublishResult",
    "SendRejectedError",
    "entry_count",
    "entry_kind",
    "entry_meta",
]

log = logging.getLogger(__name__)

# Write a dedup snapshot after this many appends to the partition.
DEDUP_SNAPSHOT_EVERY = 1000
# On start, replay at least this many recent entries to rebuild the id lookup.
DEDUP_REPLAY_ENTRIES = 256


class Partition:
    """A partition of a topic. Create with `Partition.load`."""

    def __init__(self, topic: str, index: int, ledger: Ledger, dedup_ledger: Ledger) -> None:
        self.topic = topic
        self.index = index
        self.ledger = ledger
        self._dedup_ledger = dedup_ledger
        self.dedup = DedupState()
        # Per stored entry, from entry id _counts_base on: its message count
        # and its kind (4 + 1 bytes each: a partition that is never trimmed
        # keeps them for every entry it ever stored).
        self._counts = array.array("I")
        self._kinds = bytearray()
        self._counts_base = ledger.first_entry_id  # entry id of _counts[0]
        self._since_snapshot = 0
        self.messages_in = 0  # messages stored since start, for stats
        self.bytes_in = 0  # bytes of the entries stored since start, for stats
        self._txn_buffer: TransactionBuffer | None = None
        self._buffer_watchers: list[Callable[[TransactionBuffer], None]] = []
        ledger.add_listener(self._on_entries)

    def __repr__(self) -> str:
        return f"Partition({self.topic!r}, {self.index})"

    @property
    def name(self) -> str:
        return f"{self.topic}-partition-{self.index}"

    @classmethod
    async def load(cls, store: LedgerStore, topic: str, index: int) -> Partition:
        ledger = await store.open_ledger(f"p/{topic}/{index}")
        dedup_ledger = await store.open_ledger(f"d/{topic}/{index}")
        part = cls(topic, index, ledger, dedup_ledger)
        meta = await ledger.read_meta()
        if meta:
            part._counts_base = meta[0][0]
            part._counts = array.array("I", [entry_count(m) for _, m in meta])
            part._kinds = bytearray(entry_kind(m) for _, m in meta)
            # Entry ids are contiguous; ids missing in meta were trimmed.
            if meta[-1][0] - meta[0][0] + 1 != len(meta):
                raise RuntimeError(f"{ledger.name}: entry ids are not contiguous")
        else:
            part._counts_base = ledger.last_entry_id + 1
        await part._restore_dedup()
        sidecar = store.get_ledger(sidecar_ledger_name(topic, index))
        if sidecar is not None:  # transactions wrote here: recover their index
            part._txn_buffer = await TransactionBuffer.load(part.name, ledger, sidecar, meta)
        return part

    # -- transactions -----------------------------------------------------------

    @property
    def transaction_buffer(self) -> TransactionBuffer | None:
        """The transaction buffer, or None if no transaction touched this partition."""
        return self._txn_buffer

    async def txn_buffer(self) -> TransactionBuffer:
        """The transaction buffer, created (with its sidecar ledger) on first use."""
        if self._txn_buffer is not None:
            return self._txn_buffer
        sidecar = await self.ledger.store.open_ledger(sidecar_ledger_name(self.topic, self.index))
        if self._txn_buffer is None:  # not created by a concurrent caller meanwhile
            self._txn_buffer = TransactionBuffer(self.name, self.ledger, sidecar)
            for watcher in self._buffer_watchers:
                watcher(self._txn_buffer)
        return self._txn_buffer

    def watch_txn_buffer(self, callback: Callable[[TransactionBuffer], None]) -> None:
        """Call ``callback(buffer)`` when the transaction buffer is created
        (at once if it exists)."""
        if self._txn_buffer is not None:
            callback(self._txn_buffer)
        else:
            self._buffer_watchers.append(callback)

    def unwatch_txn_buffer(self, callback: Callable[[TransactionBuffer], None]) -> None:
        if callback in self._buffer_watchers:
            self._buffer_watchers.remove(callback)

    # -- entry sizes ----------------------------------------------------------

    def _on_entries(self, _ledger: Ledger, entries: list[Entry]) -> None:
        for e in entries:
            n = e.meta & COUNT_MASK
            self._counts.append(n)
            self._kinds.append(entry_kind(e.meta))
            self.messages_in += n
            self.bytes_in += len(e.data)

    def count(self, entry_id: int) -> int:
        """Number of messages in entry ``entry_id`` (0 if trimmed or unknown)."""
        i = entry_id - self._counts_base
        if 0 <= i < len(self._counts):
            return self._counts[i]
        return 0

    def is_marker(self, entry_id: int) -> bool:
        """Is entry ``entry_id`` a commit marker (stored, not trimmed)?"""
        i = entry_id - self._counts_base
        return 0 <= i < len(self._kinds) and self._kinds[i] == COMMIT_MARKER

    def exists(self, pos: Position) -> bool:
        """Is there a message at ``pos`` (stored now or trimmed earlier)?"""
        entry_id, index = pos
        if entry_id > self.ledger.last_entry_id or entry_id < 0 or index < 0:
            return False
        if entry_id < self._counts_base:
            return True  # trimmed: it existed
        return index < self.count(entry_id)

    def messages_after(self, pos: Position) -> int:
        """Messages stored after position ``pos``."""
        entry_id, index = pos
        first = max(entry_id, self._counts_base)
        i = first - self._counts_base
        total = sum(self._counts[i:]) if i < len(self._counts) else 0
        if entry_id >= self._counts_base and entry_id == first:
            total -= min(index + 1, self.count(entry_id))
        return total

    def trimmed(self, before: int) -> None:
        """Forget the sizes of entries below ``before`` (after a trim)."""
        drop = before - self._counts_base
        if drop > 0:
            del self._counts[:drop]
            del self._kinds[:drop]
            self._counts_base = before

    async def materialize(self, entry: Entry) -> bytes:
        """The serialized `EntryBatch` to deliver for a partition entry.

        A DATA entry is delivered as stored; a COMMIT_MARKER is resolved into
        its transaction's messages, in order, from the sidecar log.
        """
        kind = entry_kind(entry.meta)
        if kind == DATA:
            return entry.data
        if kind != COMMIT_MARKER:
            raise TransactionBufferError(
                f"{self.name}: entry {entry.entry_id} has unknown kind {kind}"
            )
        if self._txn_buffer is None:
            raise TransactionBufferError(
                f"{self.name}: entry {entry.entry_id} is a commit marker, "
                "but the partition has no transaction log"
            )
        return await self._txn_buffer.materialize(entry)

    # -- publishing -----------------------------------------------------------

    def publish(
        self,
        producer: str,
        messages: Sequence[pb.SingleMessage],
        encoded: bytes | None = None,
        first_seq: int | None = None,
    ) -> Awaitable[PublishResult]:
        """Store one send's messages as one entry, dropping re-sent ones.

        Everything up to queueing the append happens now, so sends are stored
        in the order `publish` is called; await the result for their ids.
        ``encoded``: ``messages`` as a serialized `EntryBatch` with no
        producer name, stored as it is when no message is dropped.
        ``first_seq``: see `send_sequence_ids`.
        Raises `SendRejectedError` (nothing stored) for bad input.
        """
        seqs = send_sequence_ids(messages, first_seq)
        state = self.dedup.get(producer)
        if seqs[0] > state.pushed:  # the usual case: nothing re-sent
            return self._new(self._append(producer, messages, seqs, state, encoded))
        waits = state.last_append if state.pushed > state.persisted else None
        fresh = [i for i, s in enumerate(seqs) if s > state.pushed]
        appended = None
        if fresh:
            appended = self._append(
                producer, [messages[i] for i in fresh], [seqs[i] for i in fresh], state
            )
        return self._mixed(seqs, fresh, state, waits, appended)

    def _append(
        self,
        producer: str,
        messages: Sequence[pb.SingleMessage],
        seqs: Sequence[int],
        state: ProducerSequence,
        encoded: bytes | None = None,
    ) -> Awaitable[int]:
        data = entry_batch(producer, messages, encoded)
        fut = self.ledger.append(data, meta=entry_meta(DATA, len(messages)))
        state.pushed = seqs[-1]
        state.last_append = fut

        def done(f: Awaitable[int]) -> None:
            if fut.cancelled() or fut.exception() is not None:
                state.pushed = state.persisted  # not stored: a retry must be accepted
                return
            state.record(seqs, fut.result())
            self._since_snapshot += 1
            if self._since_snapshot >= DEDUP_SNAPSHOT_EVERY:
                self._since_snapshot = 0
                self._write_dedup_snapshot(fut.result())

        fut.add_done_callback(done)
        return fut

    async def _new(self, appended: Awaitable[int]) -> PublishResult:
        return PublishResult(await appended, None)

    async def _mixed(
        self,
        seqs: Sequence[int],
        fresh: list[int],
        state: ProducerSequence,
        waits: Awaitable[int] | None,
        appended: Awaitable[int] | None,
    ) -> PublishResult:
        if waits is not None:
            try:
                await waits  # re-sent messages still in flight: learn their ids
            except Exception:
                log.debug("an earlier append failed; its retry was stored anew")
        entry_id = -1 if appended is None else await appended
        ids: list[Position] = []
        fresh_set = {seqs[i]: n for n, i in enumerate(fresh)}
        for s in seqs:
            if s in fresh_set:
                ids.append((entry_id, fresh_set[s]))
                continue
            where = state.lookup(s)
            if where is None:
                raise DuplicateTooOldError(
                    f"sequence id {s} of this producer is stored already, too long ago "
                    "to answer with its message id"
                )
            ids.append(where)
        return PublishResult(entry_id, ids)

    # -- dedup persistence ----------------------------------------------------

    def _write_dedup_snapshot(self, entry_id: int) -> None:
        """Snapshot the sequence state as of ``entry_id`` (recorded in entry order).

        Not ``ledger.last_entry_id``: later entries of the same group commit
        have not been recorded yet when this runs.
        """
        record = {"entry": entry_id, "producers": self.dedup.snapshot()}
        fut = self._dedup_ledger.append(json.dumps(record).encode(), meta=0)

        def trim(f: Awaitable[int]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                self._dedup_ledger.trim(fut.result())

        fut.add_done_callback(trim)

    async def _restore_dedup(self) -> None:
        replay_from = self.ledger.last_entry_id - DEDUP_REPLAY_ENTRIES + 1
        last = self._dedup_ledger.last_entry_id
        if last >= self._dedup_ledger.first_entry_id:
            (snap,) = await self._dedup_ledger.read(last, last)
            record = json.loads(snap.data)
            self.dedup.restore(record["producers"])
            replay_from = min(replay_from, record["entry"] + 1)
        else:
            replay_from = self.ledger.first_entry_id
        for entry in await self.ledger.read(replay_from, self.ledger.last_entry_id):
            if entry_kind(entry.meta) != DATA:
                continue
            batch = pb.EntryBatch.FromString(entry.data)
            if batch.messages:
                seqs = stored_sequence_ids(batch.messages)
                self.dedup.get(batch.producer_name).record(seqs, entry.entry_id)
