"""The Kafka APIs, served from the broker's topics, coordinators and subscriptions.

Each handler takes a decoded request, its version and the connection's
`KafkaSession`, and returns the response as a dict
(`broker.kafka._codec.build` turns it into the version's class), or an
awaitable of one. It checks what the session's principal may do
(`KafkaSession.allow_*`, the broker's ACL) before anything changes; a
refusal is answered with the Kafka code of the resource refused. The
admin APIs are `broker.kafka._admin`'s. A handler does its synchronous
part when it is called, in the order requests arrive on a connection, so
Produce requests are stored in that order (`broker.kafka._listener`
answers them in that order too).

The transaction APIs are `broker.kafka._txn_apis`', the consumer group
APIs `broker.kafka._group_apis`'; this module serves ApiVersions,
Metadata, FindCoordinator, Produce, Fetch and ListOffsets, and holds the
listener's table of every handler. A transactional Produce must name a
partition its transaction added
(`TransactionCoordinator.producer_verified_partition`). A Kafka producer
numbers its records per partition from the start of its epoch, across
transactions; a partition numbers a producer's sends from 0 in each
transaction, so the first batch of a transaction on a partition sets the
base the later ones are counted from (`_txn_sequences`, in memory: a
restart aborts the transaction anyway). Idempotent producers without a
transactional id send under ``~kafka.<producer id>.<epoch>`` (deduplicated
there); plain sends are stored under ``~kafka``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from broker._operations import first_published_at_or_after
from broker._slots import slot_of_key
from broker.kafka._admin import KafkaAdmin
from broker.kafka._cluster import LEADER_NOT_AVAILABLE, NOT_LEADER_OR_FOLLOWER, KafkaCluster
from broker.kafka._codec import CLUSTER_ID, NODE_ID, VERSIONS, Api
from broker.kafka._common import (
    INVALID_TXN_STATE,
    NONE,
    UNKNOWN_TOPIC_OR_PARTITION,
    Handler,
    Response,
    allow_producer,
    error_code,
    failed,
    partition_of,
)
from broker.kafka._group_apis import GroupApis
from broker.kafka._groups import Groups
from broker.kafka._offsets import MAX_ENTRY_MESSAGES, offset_of, position_of
from broker.kafka._records import control_batch, data_batch, read_batches
from broker.kafka._session import TRANSACTIONAL_ID_AUTHORIZATION_FAILED, KafkaError, KafkaSession
from broker.kafka._txn_admin import TxnAdmin
from broker.kafka._txn_apis import TxnApis
from buffer import (
    COMMIT_MARKER,
    InvalidNameError,
    Partition,
    PublishResult,
    check_topic_name,
    entry_kind,
    epoch_producer_name,
)
from ledger import Entry
from proto import txnbuf_pb2 as pb
from tc import TxnID

if TYPE_CHECKING:
    from broker._broker import Broker

__all__ = ["NODE_ID", "KafkaApis"]

log = logging.getLogger(__name__)

# Kafka error codes answered here directly (the shared ones are
# `broker.kafka._common`'s).
OFFSET_OUT_OF_RANGE = 1
INVALID_TOPIC = 17
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
FETCH_SESSION_ID_NOT_FOUND = 70
RECORD_LIST_TOO_LARGE = 18

BATCH_CACHE_BYTES = 64 << 20  # encoded Kafka batches of recent entries
READ_ENTRIES = 64  # entries read at a time for a Fetch


class KafkaApis:
    """The handlers of one listener; `handler` picks one by API key."""

    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.groups = Groups()
        # (a broker of a cluster: who leads and coordinates what, `broker.kafka._cluster`)
        self.cluster: KafkaCluster | None = None
        if broker.cluster is not None:
            from broker._cluster import ClusterHost

            assert isinstance(broker.cluster, ClusterHost)
            self.cluster = KafkaCluster(broker, broker.cluster, f"{host}:{port}")
        # (topic, partition, producer id) -> (transaction, its base sequence there)
        self._txn_sequences: dict[tuple[str, int, int], tuple[TxnID, int]] = {}
        self._batches: collections.OrderedDict[tuple[str, int], bytes] = collections.OrderedDict()
        self._batch_bytes = 0
        self._handlers: dict[int, Handler] = {
            Api.API_VERSIONS: self.api_versions,
            Api.METADATA: self.metadata,
            Api.PRODUCE: self.produce,
            Api.FETCH: self.fetch,
            Api.LIST_OFFSETS: self.list_offsets,
            Api.FIND_COORDINATOR: self.find_coordinator,
            Api.SASL_HANDSHAKE: lambda req, version, session: session.sasl_handshake(req, version),
            Api.SASL_AUTHENTICATE: (
                lambda req, version, session: session.sasl_authenticate(req, version)
            ),
        }
        for part in (
            TxnApis(broker, self.cluster).handlers(),
            GroupApis(broker, self.groups, self.cluster).handlers(),
            KafkaAdmin(self).handlers(),
            TxnAdmin(broker, self.txn_sequence, self.cluster).handlers(),
        ):
            self._handlers.update(part)

    def close(self) -> None:
        self.groups.close()

    def handler(self, api_key: int) -> Handler:
        return self._handlers[api_key]

    # -- ApiVersions, Metadata, FindCoordinator -------------------------------------------

    @staticmethod
    def api_versions_body(error: int = NONE) -> Response:
        return {
            "error_code": error,
            "api_keys": [
                {"api_key": int(api), "min_version": low, "max_version": high}
                for api, (low, high) in sorted(VERSIONS.items())
            ],
            "throttle_time": 0,
        }

    def api_versions(self, req: Any, version: int, session: KafkaSession) -> Response:
        return self.api_versions_body()

    def _node(self) -> Response:
        if self.cluster is not None:
            return _node_body(self.cluster.me)
        return {"node_id": NODE_ID, "host": self.host, "port": self.port, "rack": None}

    async def metadata(self, req: Any, version: int, session: KafkaSession) -> Response:
        wanted = req.topics
        if wanted is None or (version == 0 and not wanted):
            # (every topic this role may produce or consume on, as Kafka
            # lists the topics a principal may describe)
            names = self.broker.topics.names()
            if self.cluster is not None:
                names = [*names, *await self.cluster.other_topics()]
            names = [n for n in names if session.may_describe(n)]
            create = False
        else:
            names = [t.name for t in wanted]
            create = getattr(req, "allow_auto_topic_creation", True)
        topics = []
        for name in names:
            topics.append(await self._topic_metadata(name, create, session))
        cluster = self.cluster
        return {
            "throttle_time": 0,
            "brokers": (
                [self._node()] if cluster is None else [_node_body(n) for n in cluster.brokers()]
            ),
            "cluster_id": CLUSTER_ID,
            "controller_id": NODE_ID if cluster is None else cluster.controller(),
            "topics": topics,
            "cluster_authorized_operations": -(2**31),
        }

    async def _topic_metadata(self, name: str, create: bool, session: KafkaSession) -> Response:
        out: Response = {
            "error_code": NONE,
            "name": name,
            "is_internal": False,
            "partitions": [],
            "topic_authorized_operations": -(2**31),
        }
        try:
            check_topic_name(name)
        except InvalidNameError:
            out["error_code"] = INVALID_TOPIC
            return out
        try:
            session.allow_describe(name)  # (before it is created)
        except KafkaError as exc:
            out["error_code"] = exc.code
            return out
        cluster = self.cluster
        count: int | None
        if cluster is not None:
            await cluster.fresh_owner(slot_of_key(name, cluster.slots))
        if cluster is not None and not cluster.serves(name):
            # (another broker's topic: its count from its slot's topic list;
            # created by its owner only, not auto-created here)
            count = await cluster.topic_partitions(name)
        else:
            topic = await self.broker.topics.load_topic(name)  # (loaded on first use)
            if topic is None and create:
                topic = await self.broker.topics.get_or_create(name)
            count = None if topic is None else len(topic.partitions)
        if count is None:
            out["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
            return out
        leader, epoch, code = NODE_ID, 0, NONE
        if cluster is not None:
            found = cluster.leader(name)
            leader, epoch = found if found is not None else (-1, -1)
            code = NONE if found is not None else LEADER_NOT_AVAILABLE
        replicas = [leader] if leader >= 0 else []
        out["partitions"] = [
            {
                "error_code": code,
                "partition_index": index,
                "leader_id": leader,
                "leader_epoch": epoch,
                "replica_nodes": replicas,
                "isr_nodes": replicas,
                "offline_replicas": [],
            }
            for index in range(count)
        ]
        return out

    async def find_coordinator(self, req: Any, version: int, session: KafkaSession) -> Response:
        """A single broker: every group and every transaction coordinator is
        here. A cluster's: the owner of the key's slot. v4 asks for several
        keys at once. (Any role may be told so: it names nothing it may not
        see.)"""
        if version >= 4:
            coordinators = []
            for key in req.coordinator_keys:
                node, code, message = await self._coordinator(key)
                coordinators.append(
                    {"key": key, **node, "error_code": code, "error_message": message}
                )
            return {"throttle_time": 0, "coordinators": coordinators}
        node, code, message = await self._coordinator(req.key)
        return {"throttle_time": 0, "error_code": code, "error_message": message, **node}

    async def _coordinator(self, key: str) -> tuple[Response, int, str | None]:
        """(node id, host and port; error code; message) of the coordinator of ``key``."""
        if self.cluster is None:
            return {"node_id": NODE_ID, "host": self.host, "port": self.port}, NONE, None
        try:
            node_id, host, port = await self.cluster.coordinator(key)
        except KafkaError as exc:
            return {"node_id": -1, "host": "", "port": -1}, exc.code, str(exc)
        return {"node_id": node_id, "host": host, "port": port}, NONE, None

    # -- Produce -----------------------------------------------------------------------

    def produce(self, req: Any, version: int, session: KafkaSession) -> Awaitable[Response] | None:
        pending: list[tuple[str, int, Awaitable[int]]] = []
        for topic_data in req.topic_data:
            for part in topic_data.partition_data:
                pending.append(
                    (
                        topic_data.name,
                        part.index,
                        self._produce_partition(req, topic_data.name, part, session),
                    )
                )
        if req.acks == 0:
            for _, _, result in pending:
                asyncio.ensure_future(result).add_done_callback(_quiet)
            return None
        return self._produce_answer(pending)

    async def _produce_answer(self, pending: list[tuple[str, int, Awaitable[int]]]) -> Response:
        by_topic: dict[str, list[Response]] = {}
        for topic, index, result in pending:
            out: Response = {
                "index": index,
                "error_code": NONE,
                "base_offset": -1,
                "log_append_time": -1,
                "log_start_offset": -1,
                "record_errors": [],
                "error_message": None,
            }
            try:
                out["base_offset"] = await result
            except Exception as exc:
                out["error_code"], out["error_message"] = error_code(exc)
            by_topic.setdefault(topic, []).append(out)
        return {
            "responses": [{"name": t, "partition_responses": p} for t, p in by_topic.items()],
            "throttle_time": 0,
        }

    def _produce_partition(
        self, req: Any, topic_name: str, part: Any, session: KafkaSession
    ) -> Awaitable[int]:
        """Queue one partition's batches; the awaitable gives the base offset
        (-1 for a transactional send: its offsets are its commit marker's).
        Refused (nothing stored) unless the role may produce on the topic,
        and for a transactional batch on the transactional id."""
        try:
            session.allow_produce(topic_name)
            self._check_leader(topic_name)
            partition = partition_of(self.broker, topic_name, part.index)
            batches = read_batches(bytes(part.records or b""))
            for batch in batches:
                if batch.transactional:
                    allow_producer(self.broker, session, batch.producer_id, req.transactional_id)
            results = [self._store_batch(req, partition, batch) for batch in batches]
        except Exception as exc:
            return failed(exc)
        return _first_offset(results)

    def _store_batch(self, req: Any, partition: Partition, batch: Any) -> Awaitable[int]:
        pid, epoch = batch.producer_id, batch.producer_epoch
        if batch.transactional:
            if req.transactional_id is None:
                raise KafkaError(
                    INVALID_TXN_STATE, "a transactional batch needs a transactional id"
                )
            if self.cluster is not None and not self.cluster.coordinator_here(
                pid,
                f"partition {partition}",
                NOT_LEADER_OR_FOLLOWER,  # (what a Produce's clients retry)
            ):
                return asyncio.ensure_future(
                    self._store_checked(partition, batch, req.transactional_id)
                )
            tc = self.broker.producer_coordinator(pid)
            txnid = tc.producer_verified_partition(pid, epoch, partition.topic, partition.index)
            return asyncio.ensure_future(
                _txn_offset(self._publish_txn(partition, batch, txnid, True))
            )
        if pid >= 0:
            name = f"~kafka.{pid}.{epoch}"
            first = batch.base_sequence
        else:
            name = "~kafka"
            first = partition.dedup.get(name).pushed + 1
        return asyncio.ensure_future(
            _plain_offset(partition.publish(name, batch.messages(first), None, first))
        )

    async def _store_checked(self, partition: Partition, batch: Any, named: str) -> int:
        """A transactional batch whose coordinator is on another broker:
        verified there (the producer's ongoing transaction, the partition
        added: `broker._peers.Peers.register_producer`), then stored and
        answered once durable (a commit decided there must not overtake it).
        Refused unless the producer id is held by the transactional id the
        request names (whose permission was checked)."""
        assert self.broker.cluster is not None
        txnid, holder = await self.broker.cluster.peers.register_producer(
            (batch.producer_id, batch.producer_epoch),
            partition.topic,
            partition=partition.index,
            verify_only=True,
            keep=False,  # (its identity stays across transactions: every send checked)
        )
        if holder != named:
            raise KafkaError(
                TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                f"producer id {batch.producer_id} is held by another transactional id "
                f"than {named!r}",
            )
        return await _txn_offset(self._publish_txn(partition, batch, txnid, False))

    def _publish_txn(
        self, partition: Partition, batch: Any, txnid: TxnID, early: bool
    ) -> Awaitable[PublishResult]:
        pid, epoch = batch.producer_id, batch.producer_epoch
        first = self._txn_first_sequence(partition, pid, txnid, batch.base_sequence)
        messages = batch.messages(first)
        buffer = partition.transaction_buffer
        status = None if buffer is None else buffer.status(txnid)
        if status is not None and status.count + len(messages) > MAX_ENTRY_MESSAGES:
            raise KafkaError(
                RECORD_LIST_TOO_LARGE,
                f"a transaction may hold up to {MAX_ENTRY_MESSAGES} messages per partition",
            )
        return self.broker.publish_txn(
            partition,
            txnid,
            epoch_producer_name(pid, epoch),
            messages,
            None,
            early,
            first,
            (pid, epoch),
        )

    def _check_leader(self, topic: str) -> None:
        """A cluster's: NOT_LEADER_OR_FOLLOWER unless this broker serves the
        slot of ``topic`` (the versions served have no leader hints: the
        client refreshes its metadata)."""
        if self.cluster is not None:
            self.cluster.check_leader(topic)

    def txn_sequence(self, partition: Partition, pid: int) -> tuple[TxnID, int] | None:
        """(transaction, the producer's base sequence in it) of producer
        ``pid``'s last transaction on ``partition``, if known."""
        return self._txn_sequences.get((partition.topic, partition.index, pid))

    def _txn_first_sequence(self, partition: Partition, pid: int, txnid: TxnID, base: int) -> int:
        key = (partition.topic, partition.index, pid)
        known = self._txn_sequences.get(key)
        if known is None or known[0] != txnid:
            self._txn_sequences[key] = (txnid, base)
            return 0
        first = base - known[1]
        if first < 0:
            raise KafkaError(
                45, f"sequence {base} is below the transaction's first, {known[1]}, on {partition}"
            )
        return first

    # -- Fetch, ListOffsets ----------------------------------------------------------------

    async def fetch(self, req: Any, version: int, session: KafkaSession) -> Response:
        if getattr(req, "session_id", 0) or getattr(req, "session_epoch", -1) > 0:
            return {
                "throttle_time": 0,
                "error_code": FETCH_SESSION_ID_NOT_FOUND,
                "session_id": 0,
                "responses": [],
            }
        wait_ms = req.max_wait.total_seconds() * 1000
        deadline = time.monotonic() + max(0.0, wait_ms) / 1000
        while True:
            total = 0
            watch: list[Partition] = []
            responses = []
            for topic in req.topics:
                parts = []
                for p in topic.partitions:
                    out, partition = await self._fetch_partition(
                        topic.topic, p.partition, p.fetch_offset, p.partition_max_bytes, session
                    )
                    total += len(out["records"] or b"")
                    if partition is not None and out["error_code"] == NONE and not out["records"]:
                        watch.append(partition)
                    parts.append(out)
                responses.append({"topic": topic.topic, "partitions": parts})
            left = deadline - time.monotonic()
            if total >= max(req.min_bytes, 1) or total or left <= 0 or not watch:
                return {
                    "throttle_time": 0,
                    "error_code": NONE,
                    "session_id": 0,
                    "responses": responses,
                }
            await _any_grows(watch, left)

    async def _fetch_partition(
        self, topic_name: str, index: int, offset: int, max_bytes: int, session: KafkaSession
    ) -> tuple[Response, Partition | None]:
        out: Response = {
            "partition_index": index,
            "error_code": NONE,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            "aborted_transactions": [],
            "preferred_read_replica": -1,
            "records": b"",
        }
        try:
            session.allow_read(topic_name)
            self._check_leader(topic_name)
            partition = partition_of(self.broker, topic_name, index)
        except KafkaError as exc:
            out["error_code"] = exc.code
            return out, None
        ledger = partition.ledger
        first, last = ledger.first_entry_id, ledger.last_entry_id
        end = offset_of(last + 1, 0)
        out["high_watermark"] = out["last_stable_offset"] = end
        out["log_start_offset"] = offset_of(first, 0)
        entry_id, i = position_of(offset)
        if first <= entry_id <= last and i > _last_index(partition, entry_id):
            entry_id, i = entry_id + 1, 0  # past an entry's last offset: the next entry
        if entry_id < first or offset_of(entry_id, i) > end:
            out["error_code"] = OFFSET_OUT_OF_RANGE
            return out, partition
        chunks: list[bytes] = []
        size = 0
        while entry_id <= last and (not chunks or size < max_bytes):
            upto = min(last, entry_id + READ_ENTRIES - 1)
            for entry in await ledger.read(entry_id, upto):
                batch = await self._kafka_batches(partition, entry)
                chunks.append(batch)
                size += len(batch)
                if size >= max_bytes:
                    break
            else:
                entry_id = upto + 1  # (read all of them, or they were trimmed meanwhile)
                continue
            break
        out["records"] = b"".join(chunks)
        return out, partition

    async def _kafka_batches(self, partition: Partition, entry: Entry) -> bytes:
        """The Kafka record batches of a partition entry (cached)."""
        key = (partition.name, entry.entry_id)
        cached = self._batches.get(key)
        if cached is not None:
            self._batches.move_to_end(key)
            return cached
        batch = pb.EntryBatch.FromString(await partition.materialize(entry))
        base = offset_of(entry.entry_id, 0)
        messages = batch.messages[:MAX_ENTRY_MESSAGES]
        if entry_kind(entry.meta) == COMMIT_MARKER:
            producer = _epoch_producer(batch.producer_name)
            last_ts = max((m.publish_time_ms for m in messages), default=0)
            encoded = data_batch(base, messages, producer) + control_batch(
                base + len(messages), producer, True, last_ts
            )
        else:
            encoded = data_batch(base, messages)
        self._batches[key] = encoded
        self._batch_bytes += len(encoded)
        while self._batch_bytes > BATCH_CACHE_BYTES and self._batches:
            _, dropped = self._batches.popitem(last=False)
            self._batch_bytes -= len(dropped)
        return encoded

    def list_offsets(
        self, req: Any, version: int, session: KafkaSession
    ) -> Response | Awaitable[Response]:
        """Earliest (-2), latest (-1), or the first offset of a message
        published at or after a time (`_offset_for_time`)."""
        topics = []
        by_time: list[tuple[Response, Partition, int]] = []
        for topic in req.topics:
            parts = []
            for p in topic.partitions:
                out: Response = {
                    "partition_index": p.partition_index,
                    "error_code": NONE,
                    "timestamp": -1,
                    "offset": -1,
                    "leader_epoch": 0,
                }
                try:
                    session.allow_describe(topic.name)
                    self._check_leader(topic.name)
                    partition = partition_of(self.broker, topic.name, p.partition_index)
                except KafkaError as exc:
                    out["error_code"] = exc.code
                    parts.append(out)
                    continue
                if self.cluster is not None:
                    found = self.cluster.leader(topic.name)
                    out["leader_epoch"] = -1 if found is None else found[1]
                ledger = partition.ledger
                if p.timestamp == -1:  # latest
                    out["offset"] = offset_of(ledger.last_entry_id + 1, 0)
                elif p.timestamp == -2:  # earliest
                    out["offset"] = offset_of(ledger.first_entry_id, 0)
                elif p.timestamp >= 0:
                    by_time.append((out, partition, p.timestamp))
                else:  # (-3, the largest timestamp, came with v7)
                    out["error_code"] = INVALID_REQUEST
                parts.append(out)
            topics.append({"name": topic.name, "partitions": parts})
        answer = {"throttle_time": 0, "topics": topics}
        if not by_time:
            return answer

        async def timed() -> Response:
            for out, partition, time_ms in by_time:
                out["offset"], out["timestamp"] = await _offset_for_time(partition, time_ms)
            return answer

        return timed()


def _node_body(node: tuple[int, str, int]) -> Response:
    node_id, host, port = node
    return {"node_id": node_id, "host": host, "port": port, "rack": None}


def _last_index(partition: Partition, entry_id: int) -> int:
    """The last offset index entry ``entry_id`` uses (its control record's, for a marker)."""
    count = partition.count(entry_id)
    return count if partition.is_marker(entry_id) else count - 1


def _epoch_producer(name: str) -> tuple[int, int]:
    """(producer id, epoch) of a producer-epoch send's producer name, (-1, -1) if not one."""
    if name.startswith("~") and "." in name:
        pid, _, epoch = name[1:].partition(".")
        if pid.isdigit() and epoch.isdigit():
            return int(pid), int(epoch)
    return -1, -1


async def _offset_for_time(partition: Partition, time_ms: int) -> tuple[int, int]:
    """(offset, publish time) of the first message of ``partition``
    published at or after ``time_ms``, or (-1, -1) if none was (Kafka's
    ListOffsets by timestamp). The entries are searched by their first
    message's publish time, as a consumer's seek by time does
    (`broker._operations.first_published_at_or_after`), then the entry
    before the one found, whose later messages may be that late, and that
    one are read message by message."""
    ledger = partition.ledger
    found = await first_published_at_or_after(partition, time_ms)
    for entry_id in (found - 1, found):
        if not ledger.first_entry_id <= entry_id <= ledger.last_entry_id:
            continue
        entries = await ledger.read(entry_id, entry_id)
        if not entries:
            continue
        batch = pb.EntryBatch.FromString(await partition.materialize(entries[0]))
        for index, message in enumerate(batch.messages[:MAX_ENTRY_MESSAGES]):
            if message.publish_time_ms >= time_ms:
                return offset_of(entry_id, index), message.publish_time_ms
    return -1, -1


async def _any_grows(partitions: list[Partition], timeout: float) -> None:
    waits = [
        asyncio.ensure_future(p.ledger.wait_for(p.ledger.last_entry_id + 1)) for p in partitions
    ]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def _quiet(f: asyncio.Future[Any]) -> None:
    if not f.cancelled():
        f.exception()


async def _first_offset(results: list[Awaitable[int]]) -> int:
    offsets = await asyncio.gather(*results)
    return offsets[0]


async def _plain_offset(pending: Awaitable[PublishResult]) -> int:
    result = await pending
    if result.ids is None:
        return offset_of(result.entry_id, result.first)
    return offset_of(*result.ids[0])


async def _txn_offset(pending: Awaitable[PublishResult]) -> int:
    await pending
    return -1
