"""Kafka's framing, request and response headers, and the versions served.

A Kafka request is a size-prefixed frame: a request header (API key,
version, correlation id, client id; tagged fields too for a flexible
version) and the request body. The bodies are read and written with
kio's classes, generated from Kafka's own message specs; a response is
built from a plain dict (`build`), whose keys the version's class picks
from (a field a version lacks is left out; one it needs and the dict lacks
takes its default).

`VERSIONS` is what ApiVersions advertises: for the data plane the
non-flexible versions of each API, plus ApiVersions v3, which the three
common Python clients (aiokafka, kafka-python, confluent-kafka) negotiate
down to, and FindCoordinator v3-4 (v4 asks for several keys at once); for
the admin APIs, flexible versions too (some exist only so).
A flexible request's header has tagged fields after the client id, and
its response header is v1 (tagged fields after the correlation id) --
except ApiVersions's, which is always v0.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import functools
import io
import struct
import typing
from collections.abc import Callable
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

__all__ = [
    "API_NAMES",
    "CLUSTER_ID",
    "NODE_ID",
    "VERSIONS",
    "Api",
    "KafkaRequestError",
    "RequestHeader",
    "build",
    "encode_response",
    "read_request",
]

# What the listener calls itself in its answers: the one node of a cluster.
NODE_ID = 0
CLUSTER_ID = "txnbuf"


class Api(enum.IntEnum):
    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    INIT_PRODUCER_ID = 22
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    OFFSET_DELETE = 47
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


# API -> (lowest, highest) version served. Produce is advertised from 0
# because librdkafka misreads a range that starts above it (Kafka does the
# same, KAFKA-18659); versions 0-2 (message format v0/v1) are refused.
VERSIONS: dict[Api, tuple[int, int]] = {
    Api.PRODUCE: (0, 8),
    Api.FETCH: (4, 11),
    Api.LIST_OFFSETS: (1, 5),
    Api.METADATA: (0, 8),
    Api.OFFSET_COMMIT: (2, 7),
    Api.OFFSET_FETCH: (1, 5),
    Api.FIND_COORDINATOR: (0, 4),  # (v3-4 flexible, v4 batched)
    Api.JOIN_GROUP: (0, 5),
    Api.HEARTBEAT: (0, 3),
    Api.LEAVE_GROUP: (0, 2),
    Api.SYNC_GROUP: (0, 3),
    Api.API_VERSIONS: (0, 3),
    Api.INIT_PRODUCER_ID: (0, 1),
    Api.ADD_PARTITIONS_TO_TXN: (0, 2),
    Api.ADD_OFFSETS_TO_TXN: (0, 2),
    Api.END_TXN: (0, 2),
    Api.TXN_OFFSET_COMMIT: (0, 2),
    Api.SASL_HANDSHAKE: (1, 1),  # (v0 sends raw SASL tokens after it: not served)
    Api.SASL_AUTHENTICATE: (0, 1),
    # The admin APIs (`broker.kafka._admin`): every version kio has, most
    # of them flexible (compact arrays, tagged fields).
    Api.CREATE_TOPICS: (2, 7),
    Api.DELETE_TOPICS: (1, 6),
    Api.CREATE_PARTITIONS: (0, 3),
    Api.DESCRIBE_CONFIGS: (1, 4),
    Api.LIST_GROUPS: (0, 5),
    Api.DESCRIBE_GROUPS: (0, 6),
    Api.DELETE_GROUPS: (0, 2),
    Api.OFFSET_DELETE: (0, 0),
    Api.DESCRIBE_CLUSTER: (0, 2),
    Api.LIST_TRANSACTIONS: (0, 2),
    Api.DESCRIBE_TRANSACTIONS: (0, 0),
    Api.DESCRIBE_PRODUCERS: (0, 0),
}
PRODUCE_MIN_DECODED = 3

API_NAMES = {api: api.name for api in Api}


class KafkaRequestError(ValueError):
    """A frame that is not a request this listener can read."""


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None


_HEADER = struct.Struct(">hhih")


def read_request(frame: bytes) -> tuple[RequestHeader, Any]:
    """The header and the body of one request frame (its size prefix
    removed). The body is None for an API or version not served (the
    caller answers an ApiVersions one, and closes the connection for any
    other). Raises `KafkaRequestError` for a frame that is not a request."""
    if len(frame) < _HEADER.size:
        raise KafkaRequestError(f"a request frame of {len(frame)} bytes has no header")
    api_key, version, correlation_id, id_len = _HEADER.unpack_from(frame, 0)
    pos = _HEADER.size
    client_id = None
    if id_len >= 0:
        client_id = frame[pos : pos + id_len].decode(errors="replace")
        pos += id_len
    header = RequestHeader(api_key, version, correlation_id, client_id)
    if not _served(api_key, version):
        return header, None
    cls = load_request_schema(api_key, version)
    if cls.__flexible__:
        pos = _skip_tagged_fields(frame, pos)
    try:
        body, _ = _reader(cls)(frame, pos)
    except Exception as exc:
        raise KafkaRequestError(
            f"{API_NAMES.get(Api(api_key), api_key)} v{version} request does not decode: {exc}"
        ) from exc
    return header, body


def _served(api_key: int, version: int) -> bool:
    try:
        low, high = VERSIONS[Api(api_key)]
    except ValueError:
        return False
    if api_key == Api.PRODUCE:
        low = PRODUCE_MIN_DECODED
    return low <= version <= high


@functools.cache
def _reader(cls: Any) -> Callable[[bytes, int], tuple[Any, int]]:
    return entity_reader(cls)


def _uvarint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise KafkaRequestError("a request header ends inside a varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = _uvarint(buf, pos)
    for _ in range(count):
        _, pos = _uvarint(buf, pos)
        size, pos = _uvarint(buf, pos)
        pos += size
    return pos


# -- responses ----------------------------------------------------------------------


def encode_response(header: RequestHeader, api_key: int, version: int, body: Any) -> bytes:
    """The frame (size prefix included) answering ``header`` with ``body``
    (a kio response of ``api_key`` at ``version``). The response header is
    v1 (with tagged fields) for a flexible version, except ApiVersions's,
    which is always v0."""
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    out.write(struct.pack(">i", header.correlation_id))
    cls: Any = type(body)
    if cls.__flexible__ and api_key != Api.API_VERSIONS:
        out.write(b"\0")  # (response header v1: no tagged fields)
    _writer(cls)(out, body)
    frame = out.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


@functools.cache
def _writer(cls: Any) -> Callable[[io.BytesIO, Any], None]:
    return entity_writer(cls)


def build(api_key: int, version: int, data: dict[str, Any]) -> Any:
    """The kio response of ``api_key`` at ``version`` holding ``data``."""
    return _make(load_response_schema(api_key, version), data)


def _make(cls: type, data: dict[str, Any]) -> Any:
    kwargs = {}
    for name, convert in _plan(cls):
        if name in data:
            kwargs[name] = convert(data[name])
    return cls(**kwargs)


@functools.cache
def _plan(cls: type) -> list[tuple[str, Callable[[Any], Any]]]:
    """Per field of ``cls``: how a plain value becomes what kio writes."""
    hints = typing.get_type_hints(cls)
    plan = []
    for f in dataclasses.fields(cls):
        plan.append((f.name, _converter(hints[f.name], f.metadata.get("kafka_type"))))
    return plan


def _converter(hint: Any, kafka_type: str | None) -> Callable[[Any], Any]:
    if kafka_type == "error_code":
        return ErrorCode
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return _millis
    if kafka_type == "datetime_i64":
        if type(None) in typing.get_args(hint):
            return _timestamp
        return _instant  # (not nullable: -1 is written as -1)
    args = typing.get_args(hint)
    if type(None) in args and len(args) == 2:  # (a nullable array of entities, say)
        inner = next(a for a in args if a is not type(None))
        if typing.get_origin(inner) is tuple:
            convert = _converter(inner, kafka_type)
            return lambda value: None if value is None else convert(value)
    nested = _nested_entity(hint)
    if nested is not None:
        entity, many = nested
        if many:
            return lambda items: tuple(_make(entity, item) for item in items)
        return lambda item: None if item is None else _make(entity, item)
    if typing.get_origin(hint) is tuple:
        return tuple
    return _same


def _nested_entity(hint: Any) -> tuple[type, bool] | None:
    if typing.get_origin(hint) is tuple:
        (item, *_) = typing.get_args(hint)
        if dataclasses.is_dataclass(item):
            return typing.cast(type, item), True
        return None
    for arg in (hint, *typing.get_args(hint)):
        if isinstance(arg, type) and dataclasses.is_dataclass(arg):
            return arg, False
    return None


def _same(value: Any) -> Any:
    return value


def _millis(value: Any) -> datetime.timedelta:
    return datetime.timedelta(milliseconds=value)


def _timestamp(value: Any) -> datetime.datetime | None:
    if value is None or value < 0:
        return None
    return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)


def _instant(value: Any) -> datetime.datetime:
    """Milliseconds since the epoch (-1 for none, as Kafka writes it) as
    the datetime kio writes back as that number."""
    return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
