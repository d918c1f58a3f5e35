"""TxnID: the 128-bit transaction id of PIP-31 §TxnID, and its one text.

The high 16 bits of ``most_bits`` are the id of the transaction coordinator
(TCID) that issued it; the rest of the 128 bits is that TC's counter, so a
TxnID says which TC owns it. A counter is the coordinator's boot epoch
(112 - `SEQUENCE_BITS` bits: each start of a coordinator logs a new one, see
`tc._table`) and a sequence within it (`SEQUENCE_BITS`): `TxnID.issued`,
`boot_epoch`. A partition compares the boot epochs of a producer's
transactions (the producer-epoch mode), so the layout lives here, below
both.

A transaction id is printed one way everywhere, in logs, errors and the
admin API: `txn_text`, ``(most_bits,least_bits)`` (`TxnID.parse` reads it
back), whether it is a `TxnID` or the plain tuple partitions key
transactions by.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MAX_TCID", "SEQUENCE_BITS", "TxnID", "boot_epoch", "txn_text", "wire_txnid"]

_U64 = (1 << 64) - 1
_TC_SHIFT = 48
MAX_TCID = (1 << 16) - 1
SEQUENCE_BITS = 64  # a counter is (the coordinator's boot epoch << 64) | sequence


def txn_text(txn: tuple[int, int]) -> str:
    """How a transaction id is printed: ``(most_bits,least_bits)``."""
    return f"({txn[0]},{txn[1]})"


def boot_epoch(txn: tuple[int, int]) -> int:
    """The boot epoch of the coordinator that issued ``txn`` (a `TxnID` or
    its plain tuple)."""
    return (((txn[0] & ((1 << _TC_SHIFT) - 1)) << 64) | txn[1]) >> SEQUENCE_BITS


class _Halves(NamedTuple):
    most_bits: int
    least_bits: int


class TxnID(_Halves):
    """A transaction id: two unsigned 64-bit halves, ordered, hashable.

    A tuple underneath (a NamedTuple with a checked constructor): hashing,
    comparing and reading a half are C-level, where a dataclass did them in
    Python (a TxnID is a dict key a dozen times per transaction). It equals
    the plain tuple ``(most_bits, least_bits)``, which is what the
    partitions and subscriptions key transactions by."""

    __slots__ = ()

    def __new__(cls, most_bits: int, least_bits: int) -> TxnID:
        if not (0 <= most_bits <= _U64 and 0 <= least_bits <= _U64):
            raise ValueError(
                f"TxnID halves must be unsigned 64-bit, got ({most_bits!r}, {least_bits!r})"
            )
        return super().__new__(cls, most_bits, least_bits)

    @classmethod
    def of(cls, tcid: int, counter: int) -> TxnID:
        """The id number ``counter`` issued by coordinator ``tcid``."""
        if not 0 <= tcid <= MAX_TCID:
            raise ValueError(f"TCID must be 0..{MAX_TCID}, got {tcid}")
        if not 0 <= counter < 1 << 112:
            raise ValueError(f"counter must fit in 112 bits, got {counter}")
        return cls((tcid << _TC_SHIFT) | (counter >> 64), counter & _U64)

    @classmethod
    def issued(cls, tcid: int, epoch: int, sequence: int) -> TxnID:
        """The id number ``sequence`` issued by coordinator ``tcid`` in its
        boot epoch ``epoch``."""
        return cls.of(tcid, (epoch << SEQUENCE_BITS) | sequence)

    @property
    def tcid(self) -> int:
        return self.most_bits >> _TC_SHIFT

    @property
    def epoch(self) -> int:
        """The boot epoch of the coordinator when it issued this id."""
        return self.counter >> SEQUENCE_BITS

    @property
    def sequence(self) -> int:
        """Its place among the ids of that boot epoch."""
        return self.counter & ((1 << SEQUENCE_BITS) - 1)

    @property
    def counter(self) -> int:
        return ((self.most_bits & ((1 << _TC_SHIFT) - 1)) << 64) | self.least_bits

    def __str__(self) -> str:
        return txn_text(self)

    @classmethod
    def parse(cls, text: str) -> TxnID:
        """Inverse of `str`: ``"(most,least)"``; raises ValueError on anything else."""
        body = text.strip()
        if not (body.startswith("(") and body.endswith(")")):
            raise ValueError(f"not a TxnID: {text!r} (expected '(most_bits,least_bits)')")
        parts = body[1:-1].split(",")
        if len(parts) != 2 or not all(p.strip().isascii() and p.strip().isdigit() for p in parts):
            raise ValueError(f"not a TxnID: {text!r} (expected '(most_bits,least_bits)')")
        return cls(int(parts[0]), int(parts[1]))


_tuple_new = tuple.__new__


def wire_txnid(most_bits: int, least_bits: int) -> TxnID:
    """The TxnID of two protobuf ``uint64`` fields, which hold nothing out
    of range: built without `TxnID`'s check (read several times per
    transaction off the wire and the log)."""
    return _tuple_new(TxnID, (most_bits, least_bits))
