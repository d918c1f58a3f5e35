"""One topic partition: its ledger, message counts and deduplication.

An entry of the partition ledger is DATA, the messages of one send as a
serialized `EntryBatch`; a COMMIT_MARKER of a transaction, which stands for
the transaction's messages held in the partition's sidecar transaction log
(PIP-31 §Sidecar Approach, see `buffer._txnbuffer`); or COMMITTED_TXN, the
messages of a local transaction committed in one record (`append_committed`,
see docs/architecture.md), visible once durable. Its ledger ``meta``
packs the kind and the message count (`entry_meta`), so that subscriptions
know entry sizes and kinds without reading entries. Message ids are
(partition, entry id, batch index); a committed transaction's messages take
the marker's entry id.
"""

from __future__ import annotations

import array
import asyncio
import bisect
import json
import logging
from collections.abc import Awaitable, Callable, Sequence

from buffer._dedup import DedupState, ProducerSequence
from buffer._entries import (
    COMMIT_MARKER,
    COMMITTED_TXN,
    COUNT_MASK,
    DATA,
    DUPLICATE_POSITION,
    DuplicateTooOldError,
    PublishResult,
    SendRejectedError,
    committed_entry,
    entry_batch,
    entry_count,
    entry_kind,
    entry_meta,
    send_sequence_ids,
    stored_sequence_ids,
)
from buffer._names import Position
from buffer._retention import Retention
from buffer._sidecar import sidecar_ledger_name
from buffer._txnbuffer import TransactionBuffer
from buffer._txnstate import TransactionBufferError
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


def _dedup_ledger_name(topic: str, index: int) -> str:
    return f"d/{topic}/{index}"


class Partition:
    """A partition of a topic. Create with `Partition.load`."""

    # (A broker holds one per partition of every loaded topic, most of them idle.)
    __slots__ = (
        "__weakref__",
        "_buffer_watchers",
        "_counts",
        "_counts_base",
        "_cum",
        "_cum_before",
        "_cum_pending",
        "_dedup_ledger",
        "_expired_below",
        "_kinds",
        "_since_snapshot",
        "_txn_buffer",
        "bytes_in",
        "dedup",
        "index",
        "ledger",
        "messages_in",
        "topic",
    )

    def __init__(self, topic: str, index: int, ledger: Ledger, dedup_ledger: Ledger) -> None:
        self.topic = topic
        self.index = index
        self.ledger = ledger
        # The deduplication snapshots' ledger: read by `load`, then given back
        # to the store until the first snapshot is written (None meanwhile:
        # most partitions of a broker never write one after they load).
        self._dedup_ledger: Ledger | None = dedup_ledger
        self.dedup = DedupState()
        # Per stored entry, from entry id _counts_base on: its message count
        # and its kind (4 + 1 bytes each: a partition that is never trimmed
        # keeps them for every entry it ever stored). The kinds are made when
        # the first commit marker comes (None: every entry is DATA).
        self._counts = array.array("I")
        self._kinds: bytearray | None = None
        self._counts_base = ledger.first_entry_id  # entry id of _counts[0]
        self._since_snapshot = 0
        self.messages_in = 0  # messages stored since start, for stats
        self.bytes_in = 0  # bytes of the entries stored since start, for stats
        # Retention by size (loaded when first needed): bytes of the entries
        # from _counts_base on, summed (_cum[i]: entries _counts_base .. +i),
        # and the entries stored while they load.
        self._cum: array.array[int] | None = None
        self._cum_before = 0  # what _cum counted of the entries trimmed since
        self._cum_pending: list[tuple[int, int]] | None = None
        # Retention by time: (its limit, the entry below which all are older).
        self._expired_below = (0.0, 0)
        self._txn_buffer: TransactionBuffer | None = None
        # (A tuple, replaced on a change: most partitions never have a watcher.)
        self._buffer_watchers: tuple[Callable[[TransactionBuffer], None], ...] = ()
        ledger.add_listener(self._on_entries)

    def __repr__(self) -> str:
        return f"Partition({self.topic!r}, {self.index})"

    @property
    def name(self) -> str:
        return f"{self.topic}-partition-{self.index}"

    @classmethod
    async def load(cls, store: LedgerStore, topic: str, index: int) -> Partition:
        ledger = await store.open_ledger(f"p/{topic}/{index}")
        dedup_ledger = await store.open_ledger(_dedup_ledger_name(topic, index))
        part = cls(topic, index, ledger, dedup_ledger)
        meta = await ledger.read_meta()
        if meta:
            part._counts_base = meta[0][0]
            part._counts = array.array("I", [entry_count(m) for _, m in meta])
            if any(entry_kind(m) != DATA for _, m in meta):
                part._kinds = bytearray(entry_kind(m) for _, m in meta)
            # Entry ids are contiguous; ids missing in meta were trimmed.
            if meta[-1][0] - meta[0][0] + 1 != len(meta):
                raise RuntimeError(f"{ledger.name}: entry ids are not contiguous")
        else:
            part._counts_base = ledger.last_entry_id + 1
        await part._restore_dedup(dedup_ledger)
        if store.release_ledger(dedup_ledger):
            part._dedup_ledger = None
        sidecar = store.get_ledger(sidecar_ledger_name(topic, index))
        if sidecar is not None:  # transactions wrote here: recover their index
            part._txn_buffer = await TransactionBuffer.load(part.name, ledger, sidecar, meta)
        return part

    # -- unloading --------------------------------------------------------------

    def settled(self) -> bool:
        """Nothing under way here: every append and trim durable (the
        deduplication state and the transaction index have seen them all),
        no transaction that has not ended, nobody waiting for the
        transaction buffer. Then `release` loses nothing: everything is in
        the ledgers, and `load` rebuilds the same state from them."""
        buffer = self._txn_buffer
        return (
            self.ledger.settled
            and (self._dedup_ledger is None or self._dedup_ledger.settled)
            and not self._buffer_watchers
            and (buffer is None or (buffer.idle() and buffer.sidecar.settled))
        )

    def release(self) -> None:
        """Stop following the ledgers and give their objects back to the
        store (`ledger.LedgerStore.release_ledger`); this object is not to
        be used any more. Only when `settled`."""
        self.ledger.remove_listener(self._on_entries)
        store = self.ledger.store
        if self._txn_buffer is not None:
            self._txn_buffer.detach()
            store.release_ledger(self._txn_buffer.sidecar)
        store.release_ledger(self.ledger)
        if self._dedup_ledger is not None:
            store.release_ledger(self._dedup_ledger)

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
            self._buffer_watchers = (*self._buffer_watchers, callback)

    def unwatch_txn_buffer(self, callback: Callable[[TransactionBuffer], None]) -> None:
        watchers = self._buffer_watchers
        if callback in watchers:
            i = watchers.index(callback)
            self._buffer_watchers = watchers[:i] + watchers[i + 1 :]

    # -- entry sizes ----------------------------------------------------------

    def _on_entries(self, _ledger: Ledger, entries: list[Entry]) -> None:
        for e in entries:
            n = e.meta & COUNT_MASK
            self._counts.append(n)
            kind = entry_kind(e.meta)
            if self._kinds is not None:
                self._kinds.append(kind)
            elif kind != DATA:  # (the first other kind: every entry before it is DATA)
                self._kinds = bytearray(len(self._counts) - 1)
                self._kinds.append(kind)
            self.messages_in += n
            self.bytes_in += len(e.data)
            if self._cum is not None:
                self._cum.append((self._cum[-1] if self._cum else 0) + len(e.data))
            elif self._cum_pending is not None:
                self._cum_pending.append((e.entry_id, len(e.data)))

    def count(self, entry_id: int) -> int:
        """Number of messages in entry ``entry_id`` (0 if trimmed or unknown)."""
        i = entry_id - self._counts_base
        if 0 <= i < len(self._counts):
            return self._counts[i]
        return 0

    def is_marker(self, entry_id: int) -> bool:
        """Is entry ``entry_id`` a commit marker (stored, not trimmed)?"""
        kinds = self._kinds
        i = entry_id - self._counts_base
        return kinds is not None and 0 <= i < len(kinds) and kinds[i] == COMMIT_MARKER

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
            if self._kinds is not None:
                del self._kinds[:drop]
            if self._cum is not None:
                if self._cum:
                    self._cum_before = self._cum[min(drop, len(self._cum)) - 1]
                del self._cum[:drop]
            self._counts_base = before

    # -- retention ------------------------------------------------------------

    async def retained_from(self, retention: Retention, before: int, now_ms: int) -> int:
        """The first entry below ``before`` (what every subscription has
        acknowledged) that ``retention`` keeps; ``before`` if none: the
        partition may be trimmed up to there (see `buffer._retention`)."""
        first = self.ledger.first_entry_id
        if retention.keeps_nothing or before <= first:
            return before
        keep = first
        if retention.size_bytes != -1:
            cum = await self._cumulative_sizes()
            if cum is None:
                return first  # (not known yet: keep everything this time)
            # cum[j]: bytes of entries base .. base + j. The first entry k
            # with bytes(k .. before - 1) <= size_bytes is one past the first
            # j with cum[j] >= cum[before - 1 - base] - size_bytes.
            base = self._counts_base
            target = (cum[before - 1 - base] if before > base else 0) - retention.size_bytes
            if target > self._cum_before:
                keep = max(keep, base + 1 + bisect.bisect_left(cum, target, 0, before - base))
        if retention.time_s != -1:
            horizon = now_ms - retention.time_s * 1000
            known = self._expired_below[1] if self._expired_below[0] == retention.time_s else 0
            if known >= before:
                return before  # (every entry below it is older than the limit)
            low, high = max(first, known), before  # (by time alone: what the cache holds)
            while low < high:
                mid = (low + high) // 2
                published = await self.publish_time(mid)
                if published is not None and published >= horizon:
                    high = mid
                else:
                    low = mid + 1
            self._expired_below = (retention.time_s, low)
            keep = max(keep, low)
        return keep

    async def publish_time(self, entry_id: int) -> int | None:
        """The ``publish_time_ms`` of entry ``entry_id``'s first message
        (None if the entry is trimmed or holds none)."""
        entries = await self.ledger.read(entry_id, entry_id)
        if not entries:
            return None
        try:
            batch = pb.EntryBatch.FromString(await self.materialize(entries[0]))
        except Exception as exc:
            log.debug("%s: no publish time for entry %d: %s", self.name, entry_id, exc)
            return None
        return batch.messages[0].publish_time_ms if batch.messages else None

    async def _cumulative_sizes(self) -> array.array[int] | None:
        """`_cum`, loaded on first use (None if the entries moved while they
        loaded: the next call tries again)."""
        if self._cum is not None:
            return self._cum
        if self._cum_pending is not None:
            return None  # (another call is loading them)
        self._cum_pending = []
        try:
            rows = await self.ledger.read_sizes()
        finally:
            pending, self._cum_pending = self._cum_pending, None
        base = self._counts_base
        rows = [row for row in rows if row[0] >= base]
        last = rows[-1][0] if rows else base - 1
        rows += [row for row in pending if row[0] > last]
        expected = range(base, base + len(rows))
        if any(entry_id != want for (entry_id, _), want in zip(rows, expected, strict=True)):
            return None
        if len(rows) != len(self._counts):
            return None
        cum: array.array[int] = array.array("q")
        total = 0
        for _, size in rows:
            total += size
            cum.append(total)
        self._cum, self._cum_before = cum, 0
        return cum

    async def materialize(self, entry: Entry) -> bytes:
        """The serialized `EntryBatch` to deliver for a partition entry.

        A DATA or COMMITTED_TXN entry is delivered as stored; a
        COMMIT_MARKER is resolved into its transaction's messages, in order,
        from the sidecar log.
        """
        kind = entry_kind(entry.meta)
        if kind == DATA or kind == COMMITTED_TXN:
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

    def append_committed(
        self, txn: tuple[int, int], producer: str, encoded: Sequence[bytes], count: int
    ) -> asyncio.Future[int]:
        """Queue a local transaction's ``count`` messages here as one
        COMMITTED_TXN entry (`committed_entry`: ``encoded``, its sends'
        serialized batches in order, naming ``producer`` and ``txn``). Its
        messages are visible once it is durable, at its entry id, in the
        order given; the caller writes the transaction's other records in
        the same group commit (docs/architecture.md). Nothing is
        deduplicated here: a retried commit is told apart by its
        transaction, at its coordinator."""
        data = committed_entry(txn, producer, encoded)
        return self.ledger.append(data, meta=entry_meta(COMMITTED_TXN, count))

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
            # Stored already: where, if still known; else too long ago to say.
            ids.append(state.lookup(s) or DUPLICATE_POSITION)
        return PublishResult(entry_id, ids)

    # -- dedup persistence ----------------------------------------------------

    def _write_dedup_snapshot(self, entry_id: int) -> None:
        """Snapshot the sequence state as of ``entry_id`` (recorded in entry order).

        Not ``ledger.last_entry_id``: later entries of the same group commit
        have not been recorded yet when this runs.
        """
        ledger = self._dedup_ledger
        if ledger is None:
            ledger = self.ledger.store.get_ledger(_dedup_ledger_name(self.topic, self.index))
            if ledger is None:
                return  # (the topic is being deleted)
            ledger.no_tail_cache()
            self._dedup_ledger = ledger
        record = {"entry": entry_id, "producers": self.dedup.snapshot()}
        fut = ledger.append(json.dumps(record).encode(), meta=0)

        def trim(f: Awaitable[int]) -> None:
            if not fut.cancelled() and fut.exception() is None:
                ledger.trim(fut.result())

        fut.add_done_callback(trim)

    async def _restore_dedup(self, dedup_ledger: Ledger) -> None:
        replay_from = self.ledger.last_entry_id - DEDUP_REPLAY_ENTRIES + 1
        last = dedup_ledger.last_entry_id
        if last >= dedup_ledger.first_entry_id:
            (snap,) = await dedup_ledger.read(last, last)
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
