"""Kafka record batches (message format v2) <-> txnbuf messages.

A Produce request carries record batches; each becomes one send of
`pb.SingleMessage`s: the record key (UTF-8) is the message key, the value its
payload, the headers its properties (UTF-8 keys and values, each key once),
the timestamp its ``publish_time_ms``, and its place in the batch, from the
batch's base sequence on, its sequence id. A record batch that cannot be
said so (a binary key or header, a header without a value or named twice)
is refused whole (`RecordError`, Kafka's INVALID_RECORD): nothing is stored.

A Fetch answer carries a partition entry as one batch of its messages at
the entry's offsets (`broker.kafka._offsets`), and a commit marker as a
transactional batch of its transaction's messages followed by a COMMIT
control batch. Every batch carries a CRC-32C of its body.

A produced batch may be compressed with any of Kafka's codecs
(`COMPRESSION`): gzip, snappy (raw, or in the xerial framing Kafka's Java
producer and kafka-python write), lz4 (the LZ4 frame format) or zstd, each
read with cramjam (one well-kept wheel with the four; aiokafka reads and
writes them with it too). A batch inflates to `MAX_INFLATED` bytes at
most: one that would inflate further (a decompression bomb), or that does
not decompress, is refused CORRUPT_MESSAGE. Fetched batches are written
uncompressed (txnbuf keeps messages, not Kafka's batches, and every client
reads an uncompressed batch).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import cramjam
from crc32c import crc32c

from proto import txnbuf_pb2 as pb

__all__ = [
    "COMPRESSION",
    "CORRUPT_MESSAGE",
    "INVALID_RECORD",
    "MAX_INFLATED",
    "UNSUPPORTED_COMPRESSION_TYPE",
    "ProducedBatch",
    "RecordError",
    "control_batch",
    "data_batch",
    "read_batches",
]

# Kafka error codes a batch is refused with.
CORRUPT_MESSAGE = 2
UNSUPPORTED_COMPRESSION_TYPE = 76
INVALID_RECORD = 87

_HEAD = struct.Struct(">qiibI")  # base offset, length, leader epoch, magic, crc
_BODY = struct.Struct(">hiqqqhii")  # attributes .. record count (after the crc)
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_COMPRESSION_MASK = 0x07
COMPRESSION = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
MAX_INFLATED = 100 << 20  # bytes a compressed batch's records may inflate to (a request's most)
_FIRST_GUESS = 1 << 20  # the first output buffer tried is 16 times the input, at least this
_XERIAL = b"\x82SNAPPY\x00"  # (then a version and a compatible version, int32 each)
_NO_PRODUCER = -1


class RecordError(ValueError):
    """A record batch refused whole; ``code`` is Kafka's error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(slots=True)
class ProducedBatch:
    """One record batch of a Produce request: its header, read; its records
    become txnbuf messages with `messages`."""

    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    count: int
    _base_ts: int
    _records: bytes

    def messages(self, first_seq: int) -> list[pb.SingleMessage]:
        """The records as messages numbered ``first_seq``, ``first_seq + 1``, ...;
        raises `RecordError` for a record txnbuf cannot hold."""
        return _read_records(self._records, self.count, self._base_ts, first_seq)


# -- varints (zigzag, as record fields use them) ------------------------------------


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    raw = 0
    while True:
        try:
            b = buf[pos]
        except IndexError:
            raise RecordError(CORRUPT_MESSAGE, "a record ends inside a varint") from None
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise RecordError(CORRUPT_MESSAGE, "a varint longer than 10 bytes")


def _put_varint(out: bytearray, value: int) -> None:
    raw = (value << 1) ^ (value >> 63)
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)


def _bytes(buf: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _varint(buf, pos)
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(buf):
        raise RecordError(CORRUPT_MESSAGE, "a record field runs past its batch")
    return buf[pos:end], end


def _text(raw: bytes, what: str) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise RecordError(
            INVALID_RECORD,
            f"a record's {what} is not UTF-8 text (txnbuf keeps keys and properties as text)",
        ) from None


# -- reading a Produce request's records -------------------------------------------


def read_batches(data: bytes) -> list[ProducedBatch]:
    """The record batches of one partition of a Produce request; raises
    `RecordError` (nothing to store) for anything but well-formed v2 batches."""
    out: list[ProducedBatch] = []
    pos = 0
    n = len(data)
    while pos < n:
        if n - pos < _HEAD.size:
            raise RecordError(CORRUPT_MESSAGE, "records end inside a batch header")
        _, length, _, magic, crc = _HEAD.unpack_from(data, pos)
        end = pos + 12 + length
        if magic != 2:
            raise RecordError(
                INVALID_RECORD, f"record batch magic {magic}: only message format v2 is served"
            )
        if end > n or length < _BODY.size + 9:
            raise RecordError(CORRUPT_MESSAGE, "a record batch is cut short")
        body = data[pos + _HEAD.size : end]
        if crc32c(body) != crc:
            raise RecordError(CORRUPT_MESSAGE, "a record batch fails its CRC-32C check")
        out.append(_read_batch(body))
        pos = end
    if not out:
        raise RecordError(CORRUPT_MESSAGE, "a partition of a Produce request has no records")
    return out


def _read_batch(body: bytes) -> ProducedBatch:
    attributes, _, base_ts, _, pid, epoch, base_seq, count = _BODY.unpack_from(body, 0)
    if attributes & _CONTROL:
        raise RecordError(INVALID_RECORD, "a producer may not write control batches")
    compression = attributes & _COMPRESSION_MASK
    records = body[_BODY.size :]
    if compression:
        records = inflate(compression, records)
    if count <= 0:
        raise RecordError(CORRUPT_MESSAGE, "a record batch with no records")
    return ProducedBatch(
        pid, epoch, base_seq, bool(attributes & _TRANSACTIONAL), count, base_ts, records
    )


def inflate(compression: int, data: bytes, limit: int = MAX_INFLATED) -> bytes:
    """The records of a batch compressed with codec ``compression``;
    `RecordError` if the codec is unknown, the data does not decompress or
    would inflate past ``limit`` bytes."""
    name = COMPRESSION.get(compression)
    if name is None or name == "none":
        raise RecordError(
            UNSUPPORTED_COMPRESSION_TYPE,
            f"record batch compression {compression} is not a Kafka codec "
            "(1 gzip, 2 snappy, 3 lz4, 4 zstd)",
        )
    try:
        if name == "snappy":
            return _snappy(data, limit)
        return _bounded(_DECOMPRESS_INTO[name], data, limit)
    except (cramjam.DecompressionError, ValueError) as exc:
        raise RecordError(
            CORRUPT_MESSAGE,
            f"a {name} record batch does not decompress (corrupt, or larger than "
            f"{limit} bytes): {exc}",
        ) from None


_DECOMPRESS_INTO: dict[str, Callable[[bytes, bytearray], int]] = {
    "gzip": cramjam.gzip.decompress_into,
    "lz4": cramjam.lz4.decompress_into,
    "zstd": cramjam.zstd.decompress_into,
}


def _bounded(into: Callable[[bytes, bytearray], int], data: bytes, limit: int) -> bytes:
    """Decompress into an output buffer of a guessed size, four times larger
    on each try up to ``limit`` (cramjam refuses to write past its end)."""
    size = min(limit, max(_FIRST_GUESS, 16 * len(data)))
    while True:
        out = bytearray(size)
        try:
            n = into(data, out)
        except cramjam.DecompressionError:
            if size >= limit:
                raise
            size = min(limit, size * 4)
            continue
        return bytes(memoryview(out)[:n])


def _snappy(data: bytes, limit: int) -> bytes:
    """Raw snappy, or xerial-framed: a 16-byte header, then blocks each of
    an int32 length and raw snappy (Kafka's Java producer writes it so)."""
    if not data.startswith(_XERIAL):
        return _snappy_block(data, limit)
    pos = 16
    blocks = []
    total = 0
    while pos < len(data):
        if pos + 4 > len(data):
            raise ValueError("a xerial snappy block length is cut short")
        (size,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if size < 0 or pos + size > len(data):
            raise ValueError("a xerial snappy block runs past its batch")
        block = _snappy_block(data[pos : pos + size], limit - total)
        total += len(block)
        blocks.append(block)
        pos += size
    return b"".join(blocks)


def _snappy_block(data: bytes, limit: int) -> bytes:
    size = cramjam.snappy.decompress_raw_len(data)
    if size > limit:
        raise ValueError(f"it would inflate to {size} bytes")
    out = bytearray(size)
    n = cramjam.snappy.decompress_raw_into(data, out)
    return bytes(memoryview(out)[:n])


def _read_records(records: bytes, count: int, base_ts: int, seq: int) -> list[pb.SingleMessage]:
    messages: list[pb.SingleMessage] = []
    pos = 0
    for i in range(count):
        length, pos = _varint(records, pos)
        end = pos + length
        if end > len(records):
            raise RecordError(CORRUPT_MESSAGE, "a record runs past its batch")
        pos += 1  # attributes (unused)
        ts_delta, pos = _varint(records, pos)
        _, pos = _varint(records, pos)  # offset delta: records are taken in order
        key, pos = _bytes(records, pos)
        value, pos = _bytes(records, pos)
        n_headers, pos = _varint(records, pos)
        msg = pb.SingleMessage(
            payload=value or b"", sequence_id=seq + i, publish_time_ms=base_ts + ts_delta
        )
        if key is not None:
            msg.key = _text(key, "key")
        for _ in range(n_headers):
            hkey, pos = _bytes(records, pos)
            hvalue, pos = _bytes(records, pos)
            name = _text(hkey or b"", "header name")
            if hvalue is None:
                raise RecordError(INVALID_RECORD, f"record header {name!r} has no value")
            if name in msg.properties:
                raise RecordError(INVALID_RECORD, f"record header {name!r} appears twice")
            msg.properties[name] = _text(hvalue, f"header {name!r}")
        if pos != end:
            raise RecordError(CORRUPT_MESSAGE, "a record's length does not match its fields")
        messages.append(msg)
    if pos != len(records):
        raise RecordError(CORRUPT_MESSAGE, "a record batch holds more than its record count")
    return messages


# -- writing a Fetch answer's records ---------------------------------------------


def _batch(
    base_offset: int,
    attributes: int,
    last_delta: int,
    base_ts: int,
    max_ts: int,
    producer: tuple[int, int],
    count: int,
    records: bytes | bytearray,
) -> bytes:
    body = (
        _BODY.pack(attributes, last_delta, base_ts, max_ts, producer[0], producer[1], -1, count)
        + records
    )
    head = _HEAD.pack(base_offset, len(body) + 9, 0, 2, crc32c(body))
    return head + body


def data_batch(
    base_offset: int,
    messages: Sequence[pb.SingleMessage],
    producer: tuple[int, int] | None = None,
) -> bytes:
    """One record batch of ``messages`` at ``base_offset`` on; transactional
    with ``producer`` (producer id, epoch) if given."""
    base_ts = min((m.publish_time_ms for m in messages), default=0)
    max_ts = base_ts
    records = bytearray()
    rec = bytearray()
    for delta, m in enumerate(messages):
        ts = m.publish_time_ms
        if ts > max_ts:
            max_ts = ts
        rec.clear()
        rec.append(0)
        _put_varint(rec, ts - base_ts)
        _put_varint(rec, delta)
        if m.HasField("key"):
            key = m.key.encode()
            _put_varint(rec, len(key))
            rec += key
        else:
            rec.append(1)  # varint -1: no key
        _put_varint(rec, len(m.payload))
        rec += m.payload
        _put_varint(rec, len(m.properties))
        for name, value in m.properties.items():
            raw_name, raw_value = name.encode(), value.encode()
            _put_varint(rec, len(raw_name))
            rec += raw_name
            _put_varint(rec, len(raw_value))
            rec += raw_value
        _put_varint(records, len(rec))
        records += rec
    attributes = _TRANSACTIONAL if producer is not None else 0
    return _batch(
        base_offset,
        attributes,
        len(messages) - 1,
        base_ts,
        max_ts,
        producer or (_NO_PRODUCER, -1),
        len(messages),
        records,
    )


def control_batch(offset: int, producer: tuple[int, int], commit: bool, ts: int) -> bytes:
    """A COMMIT (or ABORT) control batch at ``offset`` for ``producer``."""
    key = struct.pack(">hh", 0, 1 if commit else 0)
    value = struct.pack(">hi", 0, 0)  # version, coordinator epoch
    rec = bytearray(b"\x00")
    _put_varint(rec, 0)  # timestamp delta
    _put_varint(rec, 0)  # offset delta
    _put_varint(rec, len(key))
    rec += key
    _put_varint(rec, len(value))
    rec += value
    _put_varint(rec, 0)  # headers
    records = bytearray()
    _put_varint(records, len(rec))
    records += rec
    return _batch(offset, _TRANSACTIONAL | _CONTROL, 0, ts, ts, producer, 1, records)
