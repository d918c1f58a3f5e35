"""The transaction index of one partition, as data (PIP-31 §Transaction Index).

What a partition's transaction buffer (`buffer._txnbuffer`) knows of the
transactions that wrote to it, with no I/O: the transactions not ended here
(`IndexedTxn`: state, sidecar entries, commit marker, the producers'
sequences), a bounded memory of the ended ones (so that late writes and
retried ENDs stay answered correctly), the retention blocks of the committed
ones (see `TxnIndex.retire`), and the producer-epoch mode's producers
(`EpochProducer`: a partition refuses older epochs and sequence gaps). The
buffer changes it as records become durable; `snapshot` / `restore` turn it
into the JSON of a TXN_SNAPSHOT record and back.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from buffer._dedup import ProducerSequence
from buffer._txnstate import (
    OutOfOrderSequenceError,
    PartitionTxnEvent,
    PartitionTxnState,
    StaleEpochError,
    TransactionBufferError,
    step,
)
from ledger import Entry, Ledger
from proto import TxnID, boot_epoch, txn_text, wire_txnid

__all__ = [
    "ENDED_IN_SNAPSHOT",
    "ENDED_TXNS_KEPT",
    "RETENTION_BLOCK",
    "EpochProducer",
    "IndexedTxn",
    "TxnIndex",
    "TxnInfo",
    "check_key",
    "epoch_producer_name",
    "parse_epoch_producer",
    "read_ids",
]

_S, _E = PartitionTxnState, PartitionTxnEvent

# Committed transactions per retention block (see `TxnIndex.retire`).
RETENTION_BLOCK = 256
# How many swept (forgotten) ended transactions are still remembered, and
# how many of the newest of them a snapshot keeps (a snapshot is JSON
# written every SNAPSHOT_EVERY records, so it keeps fewer).
ENDED_TXNS_KEPT = 10_000
ENDED_IN_SNAPSHOT = 1_000
# Read entries as one range when it is at most this many times longer than
# the entries themselves (else run by run).
_DENSE_READ = 4
_U64 = 1 << 64
# The snapshot format: 2 keeps committed transactions as retention blocks;
# 1, which listed each committed transaction whose marker is in the
# partition, is read too.
_SNAPSHOT_VERSION = 2


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


def parse_epoch_producer(name: str) -> tuple[int, int] | None:
    """(producer id, epoch) of a name `epoch_producer_name` made; None for
    any other producer name."""
    if not name.startswith("~"):
        return None
    pid, _, epoch = name[1:].partition(".")
    return int(pid), int(epoch)


def check_key(txn: object, error: type[ValueError] = ValueError) -> None:
    """Raise ``error`` unless ``txn`` is a transaction id (two unsigned
    64-bit integers)."""
    if isinstance(txn, tuple) and len(txn) == 2:
        most, least = txn
        if isinstance(most, int) and isinstance(least, int):
            if 0 <= most < _U64 and 0 <= least < _U64:
                return
    raise error(
        f"a transaction id is (most_bits, least_bits), two unsigned 64-bit integers; got {txn!r}"
    )


async def read_ids(ledger: Ledger, ids: Sequence[int]) -> list[Entry]:
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
class IndexedTxn:
    """A transaction not ended here (durably)."""

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


class TxnIndex:
    """The transaction index of partition ``name`` (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.txns: dict[TxnID, IndexedTxn] = {}  # those not ended here (durably)
        # Swept transactions still remembered: key -> (state, marker, count).
        self.ended: collections.OrderedDict[TxnID, tuple[PartitionTxnState, int, int]] = (
            collections.OrderedDict()
        )
        # Retention blocks: [highest marker, lowest sidecar entry, transactions].
        self.retained: list[list[int]] = []
        # The producer-epoch mode: producer id -> what this partition knows of it.
        self.epoch_producers: dict[int, EpochProducer] = {}

    # -- queries --------------------------------------------------------------------

    def status(self, txn: TxnID) -> TxnInfo | None:
        """What this partition knows of ``txn`` (None: nothing, or forgotten)."""
        t = self.txns.get(txn)
        if t is not None:
            return t.info()
        ended = self.ended.get(txn)
        if ended is not None:
            state, marker, count = ended
            return TxnInfo(txn, state, count, marker, ())
        return None

    def open_transactions(self) -> list[TxnID]:
        """Transactions with durable writes here that have not ended, in key order."""
        return sorted(k for k, t in self.txns.items() if t.entries)

    def transactions(self) -> list[TxnInfo]:
        """The index (the transactions not ended here, durably), in key order."""
        return [self.txns[k].info() for k in sorted(self.txns)]

    def stats(self) -> dict[str, Any]:
        """``committed``: committed transactions whose markers are still in
        the partition; ``aborted``: aborted ones among the remembered."""
        ended = collections.Counter(state for state, _, _ in self.ended.values())
        return {
            "open": sum(1 for t in self.txns.values() if t.entries),
            "committed": sum(block[2] for block in self.retained),
            "aborted": ended[_S.ABORTED],
            "ended_remembered": len(self.ended),
            "retention_blocks": len(self.retained),
        }

    def needed_from(self, keep: int) -> int:
        """The first sidecar entry still needed, ``keep`` at most: the
        records of the transactions not ended and of the retention blocks."""
        for block in self.retained:
            keep = min(keep, block[1])
        for t in self.txns.values():
            if t.entries:
                keep = min(keep, t.entries[0])
        return keep

    # -- changes ----------------------------------------------------------------------

    def remember(self, key: TxnID, state: PartitionTxnState, marker: int, count: int) -> None:
        self.ended[key] = (state, marker, count)
        self.ended.move_to_end(key)
        while len(self.ended) > ENDED_TXNS_KEPT:
            self.ended.popitem(last=False)

    def retire(self, t: IndexedTxn) -> None:
        """``t`` ended here, durably: from the index to the ended ones, and a
        committed one's sidecar records into a retention block.

        Retention (PIP-31 §Retention Cursor): a committed transaction's
        sidecar records are needed while its commit marker is in the
        partition ledger. They are kept as blocks of up to `RETENTION_BLOCK`
        committed transactions each: the highest marker and the lowest
        sidecar entry of the block (`release` drops a block once the
        partition is trimmed past its highest marker). So memory and
        snapshots do not grow by a transaction's worth for each commit on a
        partition that is never trimmed, at the price of keeping up to a
        block's worth of sidecar records a little longer."""
        self.txns.pop(t.key, None)
        self.remember(t.key, t.state, t.marker, t.count)
        if t.state is _S.COMMITTED and t.marker >= 0 and t.entries:
            block = self.retained[-1] if self.retained else None
            if block is None or block[2] >= RETENTION_BLOCK:
                self.retained.append([t.marker, t.entries[0], 1])
            else:
                block[0] = max(block[0], t.marker)
                block[1] = min(block[1], t.entries[0])
                block[2] += 1

    def release(self, first_marker: int) -> bool:
        """Drop the retention blocks whose markers are all trimmed (the
        partition starts at ``first_marker``); whether any went."""
        retained = [block for block in self.retained if block[0] >= first_marker]
        released = len(retained) != len(self.retained)
        self.retained = retained
        return released

    # -- the producer-epoch mode ------------------------------------------------------

    def check_epoch_send(
        self, txn: TxnID, producer: tuple[int, int], first: int, state: ProducerSequence
    ) -> None:
        """A producer-epoch send of (producer id, epoch) ``producer`` whose
        first sequence is ``first``: refused (`StaleEpochError`) if this
        partition has seen a newer epoch (or coordinator epoch) of the
        producer, and (`OutOfOrderSequenceError`) unless ``first`` comes next
        in ``state``; notes the producer's epoch and transaction here."""
        pid, epoch = producer
        known = self.epoch_producers.get(pid)
        coordinator_epoch = boot_epoch(txn)
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

    def check_epoch_marker(self, txn: TxnID, producer: tuple[int, int]) -> None:
        """The commit marker of ``txn``, a transaction of (producer id,
        epoch) ``producer``: refused (`StaleEpochError`) if this partition
        has seen a newer epoch of the producer in another transaction."""
        known = self.epoch_producers.get(producer[0])
        if (
            known is not None
            and known.txn != txn
            and (known.epoch > producer[1] or known.coordinator_epoch > boot_epoch(txn))
        ):
            raise StaleEpochError(
                f"the marker of producer {producer[0]} epoch {producer[1]} is older than "
                f"epoch {known.epoch} on {self.name}: refused"
            )

    def note_epoch_producer(self, txn: TxnID, name: str) -> None:
        """Recovery: a stored send of ``name`` in ``txn``, if a producer-epoch one."""
        producer = parse_epoch_producer(name)
        if producer is None:
            return
        pid, epoch = producer
        known = self.epoch_producers.get(pid)
        coordinator_epoch = boot_epoch(txn)
        if known is None or (coordinator_epoch, epoch) >= (known.coordinator_epoch, known.epoch):
            self.epoch_producers[pid] = EpochProducer(epoch, txn, coordinator_epoch)

    # -- snapshots --------------------------------------------------------------------

    def snapshot(self, covers: int, scan_from: int) -> bytes:
        """The index as JSON, as of every durable sidecar record up to
        ``covers`` and every commit marker before ``scan_from``.

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
            for k, t in self.txns.items()
            if t.entries
        ]
        newest = itertools.islice(reversed(self.ended.items()), ENDED_IN_SNAPSHOT)
        ended = [[k[0], k[1], s.value, m, c] for k, (s, m, c) in newest][::-1]
        record = {
            "v": _SNAPSHOT_VERSION,
            "covers": covers,
            "scan_from": scan_from,
            "txns": txns,
            "ended": ended,
            "retained": self.retained,
            "epoch_producers": [
                [pid, p.epoch, p.txn, p.coordinator_epoch]
                for pid, p in self.epoch_producers.items()
            ],
        }
        return json.dumps(record, separators=(",", ":")).encode()

    def restore(self, record: dict[str, Any]) -> tuple[int, int]:
        """Read a `snapshot` back; its (covers, scan_from)."""
        version = record.get("v")
        if version not in (1, _SNAPSHOT_VERSION):
            raise TransactionBufferError(f"{self.name}: unknown snapshot version {version}")
        for most, least, state, marker, count in record["ended"]:
            self.remember(wire_txnid(most, least), _S(state), marker, count)
        self.retained = [list(block) for block in record.get("retained", [])]
        for pid, epoch, txn, coordinator_epoch in record.get("epoch_producers", []):
            self.epoch_producers[pid] = EpochProducer(
                epoch, None if txn is None else wire_txnid(txn[0], txn[1]), coordinator_epoch
            )
        for most, least, state, marker, count, entries, starts in record["txns"]:
            key = wire_txnid(most, least)
            t = self.txns[key] = IndexedTxn(
                key, PartitionTxnState(state), entries, starts, count, marker
            )
            if t.state is not _S.OPEN:  # (version 1 kept the ended ones here)
                self.retire(t)
            elif marker >= 0:
                t.state = step(key, t.state, _E.MARKER)
        return int(record["covers"]), int(record["scan_from"])
