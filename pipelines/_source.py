"""The source: ``spark.readStream.format("txnbuf")`` and ``spark.read.format("txnbuf")``.

Offsets are positions in each partition's committed order (`client.Position`,
(entry id, batch index)), as JSON::

    {"subscription": "spark-orders", "partitions": {"0": [12, 0], "1": [7, 3]}}

A micro-batch reads, per partition, the messages from its start position
up to (not including) its end position. The partition holds committed
messages only, in committed order, so a range always reads the same
messages: a batch replayed after a crash returns the same rows, and only
committed messages are read (a transaction's messages appear where it
committed, once it has).

Progress is Spark's (its checkpoint). The broker keeps, for the query, a
durable subscription (`client.SubscriptionCursor`), named by the
``subscription`` option (``spark-<topic>`` by default): created at the
query's first start (``initialOffset``) at ``startingOffsets``, and
acknowledged up to a batch's end when Spark commits that batch
(``commit``), so retention trims only what the query will never read
again. Until then its position is where the query started, so every
``initialOffset`` (Spark asks again when it runs, or after a restart
reruns, the first batch) answers the same: the first batch reads the same
range every time. An existing subscription is resumed where it stands
(``startingOffsets`` only matters when it is created). Each query reading a
topic needs a subscription of its own: name it after the query (two
queries sharing one would acknowledge for each other, and retention could
trim what the slower one has not read: its next read fails, naming the
trimmed range).

Admission control: ``maxMessagesPerBatch`` (or the limit Spark asks for)
caps a batch, shared fairly between the partitions with messages. A
partition added to the topic joins at the next batch, from its first
message. ``Trigger.AvailableNow`` reads up to the ends of the partitions
when the query started.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from client import Client, Message, Position, SubscriptionCursor
from pipelines._options import SourceOptions
from pipelines._runner import with_client

try:  # (pyspark is the spark extra; the broker and client do not need it)
    import pyarrow as pa
    from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        MapType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )
except ImportError as exc:  # pragma: no cover
    raise ImportError("pipelines needs pyspark and pyarrow: pip install 'txnbuf[spark]'") from exc

__all__ = ["SCHEMA", "TxnbufBatchReader", "TxnbufStreamReader", "positions_of", "source_schema"]

SCHEMA = (
    "key string, value binary, topic string, partition int, message_id string, "
    "publish_time timestamp, properties map<string,string>"
)


def source_schema() -> StructType:
    """`SCHEMA` as a StructType (made without a Spark session)."""
    return StructType(
        [
            StructField("key", StringType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("message_id", StringType()),
            StructField("publish_time", TimestampType()),
            StructField("properties", MapType(StringType(), StringType())),
        ]
    )


@dataclass(frozen=True, slots=True)
class _Range(InputPartition):
    """One task's work: a partition's messages from ``start`` to ``end``."""

    partition: int
    start: Position
    end: Position


def _range(partition: InputPartition) -> _Range:
    if not isinstance(partition, _Range):
        raise TypeError(f"txnbuf: not a partition of this source: {partition!r}")
    return partition


def positions_of(offset: dict[str, Any]) -> dict[int, Position]:
    """The positions of an offset (see the module docstring)."""
    return {int(p): Position(*pos) for p, pos in offset["partitions"].items()}


def _offset(subscription: str, positions: dict[int, Position]) -> dict[str, Any]:
    return {
        "subscription": subscription,
        "partitions": {str(p): [pos[0], pos[1]] for p, pos in sorted(positions.items())},
    }


def _share(available: dict[int, int], limit: int) -> dict[int, int]:
    """How many of each partition's ``available`` messages a batch of at
    most ``limit`` takes: equal shares, what one partition does not use
    going to the others."""
    take = dict.fromkeys(available, 0)
    left = limit
    wanting = [p for p, n in sorted(available.items()) if n > 0]
    while left > 0 and wanting:
        share = max(1, left // len(wanting))
        for p in list(wanting):
            more = min(share, available[p] - take[p], left)
            take[p] += more
            left -= more
            if take[p] >= available[p]:
                wanting.remove(p)
            if left == 0:
                break
    return take


def _rows(schema: Any, topic: str, partition: int, messages: list[Message]) -> pa.RecordBatch:
    """Messages as an Arrow batch of the source's schema (Spark takes it as is)."""
    ids = [m.message_id for m in messages]
    return pa.RecordBatch.from_arrays(
        [
            pa.array([m.key for m in messages], pa.string()),
            pa.array([m.value for m in messages], pa.binary()),
            pa.array([topic] * len(messages), pa.string()),
            pa.array([partition] * len(messages), pa.int32()),
            pa.array([f"{p}:{e}:{i}" for p, e, i in ids], pa.string()),
            pa.array([m.publish_time_ms * 1000 for m in messages], pa.timestamp("us", tz="UTC")),
            pa.array(
                [list(m.properties.items()) for m in messages],
                pa.map_(pa.string(), pa.string()),
            ),
        ],
        schema=schema,
    )


def read_range(
    options: SourceOptions, schema: StructType, part: _Range
) -> Iterator[pa.RecordBatch]:
    """The messages of ``part`` as Arrow batches (a task's ``read``)."""
    arrow_schema = to_arrow_schema(schema, timezone="UTC")
    start, end = Position(*part.start), Position(*part.end)

    async def next_batch(at: Position, client: Client) -> tuple[list[Message], Position]:
        reader = await client.create_reader(options.topic, part.partition, at)
        got = await reader.read_batch(options.read_batch, end=end)
        return got, reader.position

    while start < end:
        messages, after = with_client(
            options.service_url, functools.partial(next_batch, start), options.token
        )
        if not messages or after <= start:
            raise RuntimeError(
                f"txnbuf: {options.topic!r} partition {part.partition} gave no messages from "
                f"{start} though the batch ends at {end}"
            )
        yield _rows(arrow_schema, options.topic, part.partition, messages)
        start = after


class TxnbufStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming source (see the module docstring)."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema
        self._target: dict[int, Position] | None = None  # Trigger.AvailableNow's ends

    # -- driver ------------------------------------------------------------------------

    def _cursor(self, client: Client, subscription: str, initial: str) -> SubscriptionCursor:
        return SubscriptionCursor(client, self.options.topic, subscription, initial)

    def initialOffset(self) -> dict[str, Any]:
        name = self.options.subscription

        async def work(client: Client) -> dict[int, Position]:
            return await self._cursor(client, name, self.options.starting).positions()

        return _offset(name, with_client(self.options.service_url, work, self.options.token))

    def _ends(self, start: dict[str, Any], limit: int | None) -> dict[str, Any]:
        """The end offset of a batch from ``start``: every partition's end,
        at most ``limit`` messages in all, capped at the AvailableNow target."""
        name = start["subscription"]
        starts = positions_of(start)
        target = self._target
        topic = self.options.topic

        async def work(client: Client) -> dict[int, Position]:
            # (new partitions get a cursor, from their first message, and join next batch)
            current = await self._cursor(client, name, "earliest").positions()
            ends = {p: starts.get(p, pos) for p, pos in current.items()}
            readers = {p: await client.create_reader(topic, p, ends[p]) for p in starts}
            cap = {p: (target or {}).get(p) for p in starts}
            if limit is None:
                for p, reader in readers.items():
                    end = await reader.end()
                    capped = cap[p]
                    ends[p] = end if capped is None else min(end, capped)
                return ends
            available = {
                p: (await reader.look_ahead(limit, cap[p])).covered for p, reader in readers.items()
            }
            for p, n in _share(available, limit).items():
                if n:
                    ends[p] = (await readers[p].look_ahead(n, cap[p])).next
            return ends

        return _offset(name, with_client(self.options.service_url, work, self.options.token))

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        if isinstance(limit, ReadMaxRows):
            return self._ends(start, limit.max_rows)
        if not isinstance(limit, ReadAllAvailable):
            raise ValueError(f"txnbuf: read limit {limit!r} is not supported (max rows is)")
        return self._ends(start, None)

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.options.max_messages_per_batch
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return None

    def prepareForTriggerAvailableNow(self) -> None:
        topic = self.options.topic

        async def work(client: Client) -> dict[int, Position]:
            partitions = range(await client.partitions(topic))
            return {p: await (await client.create_reader(topic, p)).end() for p in partitions}

        self._target = with_client(self.options.service_url, work, self.options.token)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[_Range]:
        starts, ends = positions_of(start), positions_of(end)
        return [
            _Range(p, starts[p], pos)
            for p, pos in sorted(ends.items())
            if p in starts and starts[p] < pos
        ]

    def commit(self, end: dict[str, Any]) -> None:
        """Spark has committed every batch up to ``end``: acknowledge it,
        so retention may trim it."""
        positions = positions_of(end)

        async def work(client: Client) -> None:
            cursor = self._cursor(client, end["subscription"], self.options.starting)
            await cursor.acknowledge_before(positions)

        with_client(self.options.service_url, work, self.options.token)

    def stop(self) -> None:
        pass

    # -- executors ---------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, self.schema, _range(partition))


class TxnbufBatchReader(DataSourceReader):
    """``spark.read.format("txnbuf")``: every partition from
    ``startingOffsets`` (earliest by default) to its end when planned."""

    def __init__(self, options: SourceOptions, schema: StructType) -> None:
        self.options = options
        self.schema = schema

    def partitions(self) -> list[_Range]:
        topic = self.options.topic
        earliest = self.options.starting == "earliest"

        async def work(client: Client) -> list[_Range]:
            out = []
            for p in range(await client.partitions(topic)):
                reader = await client.create_reader(topic, p)
                first, end = await reader.first(), await reader.end()
                start = first if earliest else end
                if start < end:
                    out.append(_Range(p, start, end))
            return out

        return with_client(self.options.service_url, work, self.options.token)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return read_range(self.options, self.schema, _range(partition))
