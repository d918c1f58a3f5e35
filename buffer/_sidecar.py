"""The records of a partition's sidecar transaction log, and its commit markers.

PIP-31 §Sidecar Approach. Each record is a small frozen type whose
``encode()`` gives ``(data, meta)``, what a ledger stores;
`decode_sidecar_record` and `CommitMarker.decode` read them back, raising
`TransactionBufferError` for anything malformed. The ledger meta is
``entry_meta(kind, message count)``; integers are big-endian and a
transaction id is two uint64 (``>QQ``).

In the sidecar ledger ``x/{topic}/{index}``:

    TXN_DATA      `TxnData`: txn + a serialized EntryBatch (the messages of
                  one transactional send, with their sequence ids, and the
                  producer name); count = its messages
    TXN_COMMIT    `TxnCommit`: txn + int64 commit marker entry id (-1: the
                  transaction wrote nothing here, so it has no marker)
    TXN_ABORT     `TxnAbort`: txn
    TXN_SNAPSHOT  `TxnSnapshot`: the transaction index as JSON (its format
                  is `TransactionBuffer`'s)

In the partition ledger, kind COMMIT_MARKER: `CommitMarker`, txn + uint32 n
+ n int64 sidecar entry ids (its TXN_DATA records, in order); count = its
messages. Its messages are the concatenation of those records' EntryBatch
bytes, which protobuf parses as one EntryBatch whose messages are all of
theirs, in order (its ``producer_name`` is the last record's).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from buffer._entries import COMMIT_MARKER, entry_count, entry_kind, entry_meta
from buffer._txnstate import TransactionBufferError
from proto import TxnID, wire_txnid

__all__ = [
    "TXN_ABORT",
    "TXN_COMMIT",
    "TXN_DATA",
    "TXN_SNAPSHOT",
    "CommitMarker",
    "SidecarRecord",
    "TxnAbort",
    "TxnCommit",
    "TxnData",
    "TxnSnapshot",
    "decode_sidecar_record",
    "sidecar_ledger_name",
]

# Sidecar record kinds, in the high bits of the entry meta (as `entry_meta`).
TXN_DATA, TXN_COMMIT, TXN_ABORT, TXN_SNAPSHOT = 1, 2, 3, 4

_TXN = struct.Struct(">QQ")
_COMMIT = struct.Struct(">QQq")
_MARKER = struct.Struct(">QQI")


def sidecar_ledger_name(topic: str, index: int) -> str:
    """The name of a partition's sidecar transaction log ledger."""
    return f"x/{topic}/{index}"


@dataclass(frozen=True, slots=True)
class TxnData:
    """TXN_DATA: the messages of one transactional send, ``batch`` a
    serialized EntryBatch of ``count`` messages."""

    txn: TxnID
    batch: bytes | memoryview
    count: int

    def encode(self) -> tuple[bytes, int]:
        return _TXN.pack(*self.txn) + self.batch, entry_meta(TXN_DATA, self.count)

    @staticmethod
    def decode(meta: int, data: bytes) -> TxnData:
        """The TXN_DATA record stored as ``(meta, data)``; `TransactionBufferError`
        if it is another record or malformed."""
        record = decode_sidecar_record(meta, data)
        if not isinstance(record, TxnData):
            raise TransactionBufferError(
                f"sidecar record of kind {entry_kind(meta)} is not TXN_DATA"
            )
        return record


@dataclass(frozen=True, slots=True)
class TxnCommit:
    """TXN_COMMIT: the transaction committed here; ``marker`` is its commit
    marker's entry id in the partition ledger (-1: it wrote nothing here)."""

    txn: TxnID
    marker: int

    def encode(self) -> tuple[bytes, int]:
        return _COMMIT.pack(self.txn[0], self.txn[1], self.marker), entry_meta(TXN_COMMIT, 0)


@dataclass(frozen=True, slots=True)
class TxnAbort:
    """TXN_ABORT: the transaction aborted here."""

    txn: TxnID

    def encode(self) -> tuple[bytes, int]:
        return _TXN.pack(*self.txn), entry_meta(TXN_ABORT, 0)


@dataclass(frozen=True, slots=True)
class TxnSnapshot:
    """TXN_SNAPSHOT: the transaction index, ``data`` its JSON."""

    data: bytes

    def encode(self) -> tuple[bytes, int]:
        return self.data, entry_meta(TXN_SNAPSHOT, 0)


SidecarRecord = TxnData | TxnCommit | TxnAbort | TxnSnapshot


def decode_sidecar_record(meta: int, data: bytes) -> SidecarRecord:
    """The sidecar record stored as ``(meta, data)``; `TransactionBufferError`
    if it is malformed or of no known kind."""
    kind = entry_kind(meta)
    try:
        if kind == TXN_DATA:
            most, least = _TXN.unpack_from(data)
            return TxnData(
                wire_txnid(most, least), memoryview(data)[_TXN.size :], entry_count(meta)
            )
        if kind == TXN_COMMIT:
            most, least, marker = _COMMIT.unpack(data)
            return TxnCommit(wire_txnid(most, least), marker)
        if kind == TXN_ABORT:
            return TxnAbort(wire_txnid(*_TXN.unpack(data)))
    except struct.error:
        raise TransactionBufferError(f"malformed sidecar record of kind {kind}") from None
    if kind == TXN_SNAPSHOT:
        return TxnSnapshot(data)
    raise TransactionBufferError(f"unknown sidecar record kind {kind}")


@dataclass(frozen=True, slots=True)
class CommitMarker:
    """A COMMIT_MARKER entry of the partition ledger: transaction ``txn``
    committed here, its ``count`` messages held by the TXN_DATA records
    ``entries`` of the sidecar log, in order."""

    txn: TxnID
    entries: Sequence[int]
    count: int

    def encode(self) -> tuple[bytes, int]:
        n = len(self.entries)
        data = _MARKER.pack(self.txn[0], self.txn[1], n) + struct.pack(f">{n}q", *self.entries)
        return data, entry_meta(COMMIT_MARKER, self.count)

    @staticmethod
    def decode(meta: int, data: bytes) -> CommitMarker:
        """The commit marker stored as ``(meta, data)``; `TransactionBufferError`
        if it is not one."""
        if entry_kind(meta) != COMMIT_MARKER or len(data) < _MARKER.size:
            raise TransactionBufferError(f"malformed commit marker ({len(data)} bytes)")
        most, least, n = _MARKER.unpack_from(data)
        if len(data) != _MARKER.size + 8 * n:
            raise TransactionBufferError(f"malformed commit marker ({len(data)} bytes)")
        entries = struct.unpack_from(f">{n}q", data, _MARKER.size)
        return CommitMarker(wire_txnid(most, least), entries, entry_count(meta))
