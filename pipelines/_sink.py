"""The exactly-once sink: ``df.writeStream.format("txnbuf")`` and
``df.write.format("txnbuf")``.

Input columns (as Spark's Kafka sink): ``value`` (binary or string,
required), ``key`` (string), ``properties`` (map<string,string>), ``topic``
(string; else the ``topic`` option). Other columns are ignored.

The protocol (a two-phase commit whose decision is one coordinator record):

1. Each task attempt writes its rows in a transaction of its own
   (`client.TransactionGroups.new_transaction`), tagged
   ``spark:<query id>/<batch id>``, on the coordinator picked from the
   query id, or in a cluster the output topic's slot's (`batch_coordinator`:
   a batch's transactions share one coordinator), and
   prepares it (`client.Transaction.prepare`): its messages are durable,
   invisible, and wait for a decision. The task returns the TxnID in its
   commit message. A task that fails aborts its transaction.
2. The driver's ``commit(messages, batchId)`` commits all of them as one
   decision, under the idempotency key (query id, batch id)
   (`client.TransactionGroups.commit`): the batch becomes visible as one
   unit, and every other undecided transaction tagged for the batch (a
   failed or speculative attempt's) is aborted in the same record.
3. If the driver dies after that record and before Spark records the batch
   in its commit log, the restarted query runs the batch again: its tasks
   write new transactions, and the same key is answered as a duplicate:
   nothing is committed twice, and the new transactions are aborted.
4. ``abort(messages, batchId)`` aborts the batch by its tag (its messages
   may all be None): the query id comes from any message, or from
   ``<checkpointLocation>/metadata`` when the checkpoint is on a local path.
   What it cannot reach (no message, a checkpoint elsewhere) is aborted by
   the next run of the batch (step 3), or by its prepared timeout
   (``preparedTimeoutMs``, 1 hour by default; an open one by
   ``transactionTimeoutMs``), or by an operator (admin API: the
   ``spark:<query id>/`` tag prefix).

The query id is Spark's (``sql.streaming.queryId``, kept in the
checkpoint), not the checkpoint's path: a checkpoint deleted and started
again is a new query whose batch ids start again at 0.

A batch write (``df.write``) is one group under a job id made up on the
driver, batch 0.
"""

from __future__ import annotations

import functools
import json
import logging
import uuid
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from client import Client, Producer, Transaction, TransactionGroups, TxnID
from pipelines import _faults
from pipelines._options import SinkOptions
from pipelines._runner import run, with_client

try:
    import pyarrow as pa
    from pyspark import TaskContext
    from pyspark.sql.datasource import (
        DataSourceArrowWriter,
        DataSourceStreamArrowWriter,
        WriterCommitMessage,
    )
    from pyspark.sql.types import StructType
except ImportError as exc:  # pragma: no cover
    raise ImportError("pipelines needs pyspark and pyarrow: pip install 'txnbuf[spark]'") from exc

__all__ = ["SinkCommit", "TxnbufBatchWriter", "TxnbufStreamWriter", "batch_tag"]

log = logging.getLogger("pipelines")

MAX_IN_FLIGHT = 20_000  # messages a task has unanswered before it waits


def batch_tag(query_id: str, batch_id: int) -> str:
    """The tag of a batch's transactions."""
    return f"spark:{query_id}/{batch_id}"


@dataclass(frozen=True, slots=True)
class SinkCommit(WriterCommitMessage):
    """What a task attempt hands the driver: its prepared transaction (None
    if it wrote no row) and what for."""

    query_id: str
    batch_id: int
    txn: tuple[int, int] | None
    rows: int


def _check_schema(schema: StructType, options: SinkOptions) -> None:
    names = {f.name: f.dataType.typeName() for f in schema.fields}
    if "value" not in names:
        raise ValueError(
            'format("txnbuf") writes a column "value" (binary or string); the input has '
            f"{sorted(names)}"
        )
    if names["value"] not in ("binary", "string"):
        raise ValueError(f'column "value" must be binary or string, not {names["value"]}')
    if options.topic is None and "topic" not in names:
        raise ValueError('format("txnbuf") needs the option "topic" or a "topic" column')
    for name, kind in (("key", "string"), ("topic", "string"), ("properties", "map")):
        if name in names and names[name] != kind:
            raise ValueError(f'column "{name}" must be {kind}, not {names[name]}')


async def batch_coordinator(client: Client, query_id: str, topic: str | None) -> int:
    """The coordinator of a batch's transactions: every task attempt of the
    batch and the driver's group commit pick the same one (one decision
    record: `client.TransactionGroups.commit`).

    One broker: a stable hash of the query id over the coordinators the
    broker serves. A cluster (its brokers said they have slots): coordinator
    k lives on the owner of slot k, with the topics of slot k, so the sink
    takes the coordinator of the slot of its ``topic`` option (of the query
    id's hash over the slots, without one). Then the transactions' sends,
    their prepares and the group commit are all on the broker that owns the
    output topic, whichever broker that is, before and after any move (a
    broker's list of coordinators, in CONNECTED, differs from broker to
    broker and changes with every move; a slot's number does not), and
    every process picks the same coordinator whichever broker it asked
    first. Why the output topic's slot: a batch that writes only to the
    ``topic`` option's topic keeps its sends, prepares and group commit on
    one broker (the paths of a single broker, the cheapest). Rows whose
    ``topic`` column names a topic of another broker make their task's
    transaction span brokers (docs/cluster.md, "Transactions across
    brokers"): the task's prepare waits until every send on every broker was
    answered durable, the group commit's decision names every participant,
    and the coordinator tells those on other brokers once it is durable."""
    await client.connect()
    if not client._brokers.cluster:
        return await TransactionGroups(client).coordinator_for(query_id)
    slots = client._conn.slots
    return zlib.crc32((topic if topic is not None else query_id).encode()) % slots


class _TaskWrite:
    """One task attempt's transaction and producers (on the process's client loop)."""

    def __init__(self, options: SinkOptions, query_id: str, batch_id: int) -> None:
        self.options = options
        self.query_id = query_id
        self.batch_id = batch_id
        self.txn: Transaction | None = None
        self.producers: dict[str, Producer] = {}
        self.rows = 0

    async def send(self, client: Client, batch: pa.RecordBatch) -> None:
        columns = batch.schema.names
        values = batch.column("value").to_pylist()
        keys = batch.column("key").to_pylist() if "key" in columns else None
        props = batch.column("properties").to_pylist() if "properties" in columns else None
        topics = batch.column("topic").to_pylist() if "topic" in columns else None
        if self.txn is None:
            groups = TransactionGroups(client)
            self.txn = await groups.new_transaction(
                batch_tag(self.query_id, self.batch_id),
                timeout=self.options.transaction_timeout_ms / 1000,
                prepared_timeout=self.options.prepared_timeout_ms / 1000,
                tc_id=await batch_coordinator(client, self.query_id, self.options.topic),
            )
        txn = self.txn
        for i, value in enumerate(values):
            topic = (topics[i] if topics is not None else None) or self.options.topic
            if topic is None:
                raise ValueError(f"row {self.rows + i} has no topic (null topic column, no option)")
            producer = self.producers.get(topic)
            if producer is None:
                producer = self.producers[topic] = await client.create_producer(
                    topic, max_pending_messages=MAX_IN_FLIGHT * 2
                )
            if value is None:
                raise ValueError(f"row {self.rows + i} has a null value")
            if isinstance(value, str):
                value = value.encode()
            properties = props[i] if props is not None else None
            producer.send_nowait(
                value,
                keys[i] if keys is not None else None,
                dict(properties) if properties else None,
                txn=txn,
            )
            if producer.pending >= MAX_IN_FLIGHT:
                await producer.flush()
        self.rows += len(values)

    async def prepare(self) -> tuple[int, int] | None:
        if self.txn is None:
            return None
        _faults.hit("sink.before_prepare")
        await self.txn.prepare()
        _faults.hit("sink.after_prepare")
        return (self.txn.id.most_bits, self.txn.id.least_bits)

    async def abort(self) -> None:
        if self.txn is not None:
            try:
                await self.txn.abort()
            except Exception as exc:  # (its timeout or the batch's tag aborts it)
                log.warning("aborting transaction %s failed: %s", self.txn.id, exc)

    async def close(self) -> None:
        for producer in self.producers.values():
            await producer.close()


async def _send(task: _TaskWrite, batch: pa.RecordBatch, client: Client) -> None:
    await task.send(client, batch)


def write_task(
    options: SinkOptions, query_id: str, batch_id: int, batches: Iterator[pa.RecordBatch]
) -> SinkCommit:
    """A task's ``write``: its rows in one prepared transaction."""
    task = _TaskWrite(options, query_id, batch_id)
    url = options.service_url
    try:
        for batch in batches:
            if batch.num_rows:
                with_client(url, functools.partial(_send, task, batch), options.token)
            _faults.hit("sink.task_write")
        txn = with_client(url, lambda client: task.prepare(), options.token)
    except BaseException:
        run(task.abort())
        raise
    finally:
        run(task.close())
    return SinkCommit(query_id, batch_id, txn, task.rows)


def commit_batch(
    options: SinkOptions, messages: list[SinkCommit | None], batch_id: int, query_id: str | None
) -> None:
    """The driver's ``commit``: the batch's transactions as one group."""
    found = {m.query_id for m in messages if m is not None}
    if query_id is not None:
        found.add(query_id)
    if len(found) > 1:
        raise RuntimeError(f"txnbuf sink: one batch, several query ids: {sorted(found)}")
    if not found:
        return  # (no task: nothing written)
    (qid,) = found
    txns = [TxnID(*m.txn) for m in messages if m is not None and m.txn is not None]

    async def work(client: Client) -> None:
        groups = TransactionGroups(client)
        tc_id = await batch_coordinator(client, qid, options.topic)
        result = await groups.commit(
            qid, batch_id, txns, abort_tag=batch_tag(qid, batch_id), tc_id=tc_id
        )
        if result.duplicate:
            log.warning(
                "txnbuf sink: batch %d of query %s was committed before (a replay after a "
                "crash): its %d new transactions were aborted",
                batch_id,
                qid,
                result.aborted,
            )

    with_client(options.service_url, work, options.token)
    _faults.hit("sink.after_commit")


def abort_batch(options: SinkOptions, messages: list[SinkCommit | None], batch_id: int) -> None:
    """The driver's ``abort``: the batch's undecided transactions, by tag."""
    ids = {m.query_id for m in messages if m is not None}
    if not ids:
        found = checkpoint_query_id(options.checkpoint)
        if found is None:
            log.warning(
                "txnbuf sink: batch %d aborted, but no task reported the query id and the "
                "checkpoint is not readable here; its transactions end by their timeouts or "
                "when the batch runs again",
                batch_id,
            )
            return
        ids = {found}

    async def work(client: Client) -> None:
        groups = TransactionGroups(client)
        for qid in ids:
            await groups.abort_tagged(batch_tag(qid, batch_id))

    with_client(options.service_url, work, options.token)


def checkpoint_query_id(checkpoint: str | None) -> str | None:
    """The query id in ``<checkpoint>/metadata``, if the checkpoint is a
    local path (or file: URI) readable here."""
    if not checkpoint:
        return None
    parsed = urlparse(checkpoint)
    if parsed.scheme not in ("", "file"):
        return None
    path = Path(parsed.path if parsed.scheme else checkpoint) / "metadata"
    try:
        first = path.read_text().splitlines()[0]
        return str(json.loads(first)["id"])
    except (OSError, IndexError, KeyError, ValueError):
        return None


def _task_batch() -> tuple[str, int]:
    ctx = TaskContext.get()
    if ctx is None:
        raise RuntimeError("txnbuf sink: write() outside a Spark task")
    query_id = ctx.getLocalProperty("sql.streaming.queryId")
    batch_id = ctx.getLocalProperty("streaming.sql.batchId")
    if not query_id or batch_id is None:
        raise RuntimeError("txnbuf sink: the task does not say its query id and batch id")
    return query_id, int(batch_id)


class TxnbufStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("txnbuf")`` (see the module docstring)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        _check_schema(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        query_id, batch_id = _task_batch()
        return write_task(self.options, query_id, batch_id, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _faults.hit("sink.before_commit")
        commit_batch(self.options, _ours(messages), batchId, None)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_batch(self.options, _ours(messages), batchId)


class TxnbufBatchWriter(DataSourceArrowWriter):
    """``df.write.format("txnbuf")``: one group, under a job id made up on
    the driver (this object travels to the tasks)."""

    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        _check_schema(schema, options)
        self.options = options
        self.job_id = f"batch-{uuid.uuid4().hex}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        return write_task(self.options, self.job_id, 0, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(self.options, _ours(messages), 0, self.job_id)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.options, [*_ours(messages), SinkCommit(self.job_id, 0, None, 0)], 0)


def _ours(messages: list[WriterCommitMessage | None]) -> list[SinkCommit | None]:
    for m in messages:
        if m is not None and not isinstance(m, SinkCommit):
            raise TypeError(f"txnbuf sink: not a commit message of this sink: {m!r}")
    return [m if isinstance(m, SinkCommit) else None for m in messages]
