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

Transactions (the producer-epoch mode, as `broker._epoch` drives it from
txnbuf's own protocol): InitProducerId goes to the coordinator the
transactional id hashes to; the transaction APIs to the coordinator that
issued the producer id. The clients served here speak Kafka's transactions
before KIP-890 part 2: AddPartitionsToTxn adds a partition (beginning the
transaction), a transactional Produce must name an added partition
(`TransactionCoordinator.producer_verified_partition`), EndTxn keeps the
producer's epoch (``bump=False``). A Kafka producer numbers its records
per partition from the start of its epoch, across transactions; a
partition numbers a producer's sends from 0 in each transaction, so the
first batch of a transaction on a partition sets the base the later ones
are counted from (`_TxnSequences`, in memory: a restart aborts the
transaction anyway). Idempotent producers without a transactional id get
a random producer id: their sends are deduplicated under
``~kafka.<producer id>.<epoch>``; plain sends are stored under ``~kafka``.

Consumer groups: a group is the txnbuf subscription of its name on each
partition it commits (`Subscriptions.cursor_of`): its committed offset is
the subscription's mark-delete position (the next offset after it), an
OffsetCommit a cumulative acknowledgement up to the message before the
committed offset, a TxnOffsetCommit the same acknowledgement in the
producer's transaction. Offsets only move forward: a commit at or below
the committed offset changes nothing. Membership is `broker.kafka._groups`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import secrets
import struct
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker._errors import error_text, kafka_code
from broker._operations import first_published_at_or_after
from broker.kafka._admin import KafkaAdmin
from broker.kafka._codec import VERSIONS, Api
from broker.kafka._groups import GroupError, Groups
from broker.kafka._offsets import MAX_ENTRY_MESSAGES, offset_of, position_of
from broker.kafka._records import RecordError, control_batch, data_batch, read_batches
from broker.kafka._session import (
    GROUP_AUTHORIZATION_FAILED,
    KafkaError,
    KafkaSession,
)
from buffer import (
    COMMIT_MARKER,
    InvalidNameError,
    Partition,
    PublishResult,
    Topic,
    check_subscription_name,
    check_topic_name,
    entry_kind,
    epoch_producer_name,
)
from ledger import Entry
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions import WHOLE_ENTRY, PartitionSubscription
from tc import TransactionCoordinator, TxnID, coordinator_of

if TYPE_CHECKING:
    from broker._server import Broker

__all__ = ["NODE_ID", "KafkaApis"]

log = logging.getLogger(__name__)

NODE_ID = 0
CLUSTER_ID = "txnbuf"
_PID_SHIFT = 47  # (tc._producers: a producer id carries its coordinator)
_IDEMPOTENT_PID_BITS = 46  # random producer ids of idempotent producers

# Kafka error codes answered here directly.
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC = 17
INVALID_GROUP_ID = 24
UNSUPPORTED_VERSION = 35
INVALID_REQUEST = 42
INVALID_TXN_STATE = 48
OPERATION_NOT_ATTEMPTED = 55
FETCH_SESSION_ID_NOT_FOUND = 70
RECORD_LIST_TOO_LARGE = 18

BATCH_CACHE_BYTES = 64 << 20  # encoded Kafka batches of recent entries
READ_ENTRIES = 64  # entries read at a time for a Fetch

Response = dict[str, Any]
Handler = Callable[[Any, int, KafkaSession], "Response | Awaitable[Response] | None"]


class KafkaApis:
    """The handlers of one listener; `handler` picks one by API key."""

    def __init__(self, broker: Broker, host: str, port: int) -> None:
        self.broker = broker
        self.host = host
        self.port = port
        self.groups = Groups()
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
            Api.INIT_PRODUCER_ID: self.init_producer_id,
            Api.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            Api.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            Api.END_TXN: self.end_txn,
            Api.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            Api.JOIN_GROUP: self.join_group,
            Api.SYNC_GROUP: self.sync_group,
            Api.HEARTBEAT: self.heartbeat,
            Api.LEAVE_GROUP: self.leave_group,
            Api.OFFSET_COMMIT: self.offset_commit,
            Api.OFFSET_FETCH: self.offset_fetch,
            Api.SASL_HANDSHAKE: lambda req, version, session: session.sasl_handshake(req, version),
            Api.SASL_AUTHENTICATE: (
                lambda req, version, session: session.sasl_authenticate(req, version)
            ),
        }
        self._handlers.update(KafkaAdmin(self).handlers())

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
        return {"node_id": NODE_ID, "host": self.host, "port": self.port, "rack": None}

    async def metadata(self, req: Any, version: int, session: KafkaSession) -> Response:
        wanted = req.topics
        if wanted is None or (version == 0 and not wanted):
            # (every topic this role may produce or consume on, as Kafka
            # lists the topics a principal may describe)
            names = [n for n in self.broker.topics.names() if session.may_describe(n)]
            create = False
        else:
            names = [t.name for t in wanted]
            create = getattr(req, "allow_auto_topic_creation", True)
        topics = []
        for name in names:
            topics.append(await self._topic_metadata(name, create, session))
        return {
            "throttle_time": 0,
            "brokers": [self._node()],
            "cluster_id": CLUSTER_ID,
            "controller_id": NODE_ID,
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
        topic = await self.broker.topics.load_topic(name)  # (loaded on first use)
        if topic is None and create:
            topic = await self.broker.topics.get_or_create(name)
        if topic is None:
            out["error_code"] = UNKNOWN_TOPIC_OR_PARTITION
            return out
        out["partitions"] = [
            {
                "error_code": NONE,
                "partition_index": p.index,
                "leader_id": NODE_ID,
                "leader_epoch": 0,
                "replica_nodes": [NODE_ID],
                "isr_nodes": [NODE_ID],
                "offline_replicas": [],
            }
            for p in topic.partitions
        ]
        return out

    def find_coordinator(self, req: Any, version: int, session: KafkaSession) -> Response:
        # Every group and every transaction coordinator of this broker is
        # here (any role may be told so: it names nothing it may not see).
        return {
            "throttle_time": 0,
            "error_code": NONE,
            "error_message": None,
            **{k: v for k, v in self._node().items() if k != "rack"},
        }

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
                out["error_code"], out["error_message"] = self._code(exc)
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
            partition = self._partition(topic_name, part.index)
            batches = read_batches(bytes(part.records or b""))
            for batch in batches:
                if batch.transactional:
                    self._allow_producer(session, batch.producer_id, req.transactional_id)
            results = [self._store_batch(req, partition, batch) for batch in batches]
        except Exception as exc:
            return _failed(exc)
        return _first_offset(results)

    def _store_batch(self, req: Any, partition: Partition, batch: Any) -> Awaitable[int]:
        pid, epoch = batch.producer_id, batch.producer_epoch
        if batch.transactional:
            if req.transactional_id is None:
                raise KafkaError(
                    INVALID_TXN_STATE, "a transactional batch needs a transactional id"
                )
            tc = self._coordinator_of_producer(pid)
            txnid = tc.producer_verified_partition(pid, epoch, partition.topic, partition.index)
            first = self._txn_first_sequence(partition, pid, txnid, batch.base_sequence)
            messages = batch.messages(first)
            buffer = partition.transaction_buffer
            status = None if buffer is None else buffer.status(txnid)
            if status is not None and status.count + len(messages) > MAX_ENTRY_MESSAGES:
                raise KafkaError(
                    RECORD_LIST_TOO_LARGE,
                    f"a transaction may hold up to {MAX_ENTRY_MESSAGES} messages per partition",
                )
            published = self.broker.publish_txn(
                partition,
                txnid,
                epoch_producer_name(pid, epoch),
                messages,
                None,
                True,
                first,
                (pid, epoch),
            )
            return asyncio.ensure_future(_txn_offset(published))
        if pid >= 0:
            name = f"~kafka.{pid}.{epoch}"
            first = batch.base_sequence
        else:
            name = "~kafka"
            first = partition.dedup.get(name).pushed + 1
        return asyncio.ensure_future(
            _plain_offset(partition.publish(name, batch.messages(first), None, first))
        )

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
            partition = self._partition(topic_name, index)
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
                    partition = self._partition(topic.name, p.partition_index)
                except KafkaError as exc:
                    out["error_code"] = exc.code
                    parts.append(out)
                    continue
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

    # -- transactions ----------------------------------------------------------------------

    async def init_producer_id(self, req: Any, version: int, session: KafkaSession) -> Response:
        out: Response = {
            "throttle_time": 0,
            "error_code": NONE,
            "producer_id": -1,
            "producer_epoch": -1,
        }
        if req.transactional_id is None:
            # An idempotent producer: an id no other producer gets (random).
            out["producer_id"] = secrets.randbits(_IDEMPOTENT_PID_BITS)
            out["producer_epoch"] = 0
            return out
        try:
            session.allow_transactional_id(req.transactional_id)
            coordinators = self.broker.coordinators
            tc = coordinators[coordinator_of(req.transactional_id, list(coordinators))]
            timeout_ms = round(req.transaction_timeout.total_seconds() * 1000)
            pid, epoch, _, _ = await tc.init_producer(req.transactional_id, timeout_ms)
        except Exception as exc:
            out["error_code"], _ = self._code(exc)
            return out
        out["producer_id"], out["producer_epoch"] = pid, epoch
        return out

    def add_partitions_to_txn(
        self, req: Any, version: int, session: KafkaSession
    ) -> Awaitable[Response]:
        pid = req.v3_and_below_producer_id
        epoch = req.v3_and_below_producer_epoch
        failed: Exception | None = None
        begun: Awaitable[TxnID] | None = None
        results: list[tuple[str, list[tuple[int, int]]]] = []
        # Refused (nothing added, nothing begun) unless the role may produce
        # on the transactional id and on every topic: the topics refused are
        # TOPIC_AUTHORIZATION_FAILED, the others OPERATION_NOT_ATTEMPTED.
        refused: dict[str, int] = {}
        try:
            self._allow_producer(session, pid, req.v3_and_below_transactional_id)
        except KafkaError as exc:
            refused = {t.name: exc.code for t in req.v3_and_below_topics}
        for topic in req.v3_and_below_topics:
            try:
                session.allow_produce(topic.name)
            except KafkaError as exc:
                refused.setdefault(topic.name, exc.code)
        for topic in req.v3_and_below_topics:
            codes = []
            for index in topic.partitions:
                if refused:
                    codes.append((index, refused.get(topic.name, OPERATION_NOT_ATTEMPTED)))
                    continue
                if failed is not None:
                    codes.append((index, OPERATION_NOT_ATTEMPTED))
                    continue
                try:
                    self._partition(topic.name, index)
                    tc = self._coordinator_of_producer(pid)
                    if begun is None:
                        begun = tc.producer_begin(pid, epoch, f"add {topic.name}/{index}")
                    tc.producer_add_partition(pid, epoch, topic.name, index)
                    codes.append((index, NONE))
                except Exception as exc:
                    failed = exc
                    codes.append((index, self._code(exc)[0]))
            results.append((topic.name, codes))

        async def answer() -> Response:
            nonlocal results
            if begun is not None:
                try:
                    await begun
                except Exception as exc:
                    code = self._code(exc)[0]
                    results = [(name, [(i, code) for i, _ in codes]) for name, codes in results]
            return {
                "throttle_time": 0,
                "results_by_topic_v3_and_below": [
                    {
                        "name": name,
                        "results_by_partition": [
                            {"partition_index": i, "partition_error_code": code}
                            for i, code in codes
                        ],
                    }
                    for name, codes in results
                ],
            }

        return answer()

    def add_offsets_to_txn(
        self, req: Any, version: int, session: KafkaSession
    ) -> Response | Awaitable[Response]:
        try:
            self._allow_producer(session, req.producer_id, req.transactional_id)
            _group_subscription(req.group_id)
            begun = self._coordinator_of_producer(req.producer_id).producer_begin(
                req.producer_id, req.producer_epoch, f"add the offsets of group {req.group_id!r}"
            )
        except Exception as exc:
            return {"throttle_time": 0, "error_code": self._code(exc)[0]}

        async def answer() -> Response:
            try:
                await begun
            except Exception as exc:
                return {"throttle_time": 0, "error_code": self._code(exc)[0]}
            return {"throttle_time": 0, "error_code": NONE}

        return answer()

    async def end_txn(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            self._allow_producer(session, req.producer_id, req.transactional_id)
            tc = self._coordinator_of_producer(req.producer_id)
            await tc.end_producer_txn(
                req.producer_id, req.producer_epoch, req.committed, bump=False
            )
        except Exception as exc:
            return {"throttle_time": 0, "error_code": self._code(exc)[0]}
        return {"throttle_time": 0, "error_code": NONE}

    async def txn_offset_commit(self, req: Any, version: int, session: KafkaSession) -> Response:
        pid, epoch = req.producer_id, req.producer_epoch

        async def commit(topic: Topic, index: int, offset: int) -> None:
            sub = await self.broker.subscriptions.cursor_of(topic, index, name)
            bound = _ack_bound(sub, offset)
            if bound is None:
                return
            txnid = self._coordinator_of_producer(pid).producer_add_subscription(
                pid, epoch, topic.name, name
            )
            await sub.ack([bound], True, txnid, True)

        try:
            self._allow_producer(session, pid, req.transactional_id)
            name = _group_subscription(req.group_id)
            entry = self._coordinator_of_producer(pid).producer_of(pid)
            if entry is not None and entry.identity == (pid, epoch) and entry.ongoing is None:
                # (a refused identity is left to producer_add_subscription)
                raise KafkaError(
                    INVALID_TXN_STATE,
                    f"offsets of group {req.group_id!r} refused: {entry.transactional_id!r} "
                    "has no ongoing transaction (AddOffsetsToTxn begins one)",
                )
        except Exception as exc:
            refused: BaseException = exc
            return await self._offsets_answer(req.topics, lambda *_: _failed(refused))
        return await self._commit_offsets(req.topics, commit, session, name)

    # -- consumer groups ------------------------------------------------------------------

    async def join_group(self, req: Any, version: int, session: KafkaSession) -> Response:
        out: Response = {
            "throttle_time": 0,
            "error_code": NONE,
            "generation_id": -1,
            "protocol_name": "",
            "leader": "",
            "member_id": req.member_id,
            "members": [],
        }
        session_ms = round(req.session_timeout.total_seconds() * 1000)
        rebalance = getattr(req, "rebalance_timeout", None)
        rebalance_ms = session_ms if rebalance is None else round(rebalance.total_seconds() * 1000)
        try:
            _group_subscription(req.group_id)
            self._allow_join(session, req)
            joined = await self.groups.join(
                req.group_id,
                req.member_id,
                getattr(req, "group_instance_id", None),
                session.client_id,
                req.protocol_type,
                [(p.name, bytes(p.metadata)) for p in req.protocols],
                session_ms,
                rebalance_ms,
                version >= 4,
                session.who.role,
                session.host,
            )
        except (GroupError, KafkaError) as exc:
            out["error_code"] = exc.code
            if isinstance(exc, GroupError) and exc.member_id:
                out["member_id"] = exc.member_id
            return out
        out.update(
            generation_id=joined.generation,
            protocol_name=joined.protocol,
            leader=joined.leader,
            member_id=joined.member_id,
            members=[
                {"member_id": m, "group_instance_id": i, "metadata": meta}
                for m, i, meta in joined.members
            ],
        )
        return out

    async def sync_group(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            assignment = await self.groups.sync(
                req.group_id,
                req.member_id,
                req.generation_id,
                [(a.member_id, bytes(a.assignment)) for a in req.assignments],
                session.who.role,
            )
        except GroupError as exc:
            return {"throttle_time": 0, "error_code": exc.code, "assignment": b""}
        return {"throttle_time": 0, "error_code": NONE, "assignment": assignment}

    def heartbeat(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            self.groups.heartbeat(req.group_id, req.member_id, req.generation_id, session.who.role)
        except GroupError as exc:
            return {"throttle_time": 0, "error_code": exc.code}
        return {"throttle_time": 0, "error_code": NONE}

    def leave_group(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            self.groups.leave(req.group_id, req.member_id, session.who.role)
        except GroupError as exc:
            return {"throttle_time": 0, "error_code": exc.code}
        return {"throttle_time": 0, "error_code": NONE}

    async def offset_commit(self, req: Any, version: int, session: KafkaSession) -> Response:
        generation = req.generation_id_or_member_epoch

        async def commit(topic: Topic, index: int, offset: int) -> None:
            sub = await self.broker.subscriptions.cursor_of(topic, index, name)
            bound = _ack_bound(sub, offset)
            if bound is not None:
                await sub.ack([bound], True)

        try:
            name = _group_subscription(req.group_id)
            self.groups.check_member(req.group_id, req.member_id, generation, session.who.role)
        except (GroupError, KafkaError) as exc:
            refused: BaseException = exc
            return await self._offsets_answer(req.topics, lambda *_: _failed(refused))
        return await self._commit_offsets(req.topics, commit, session, name)

    async def _commit_offsets(
        self,
        topics: Any,
        commit: Callable[[Topic, int, int], Awaitable[None]],
        session: KafkaSession,
        group: str,
    ) -> Response:
        """Commit each partition's offset (refused there, nothing changed,
        unless the role may consume on its topic as ``group``)."""

        def one(topic_name: str, index: int, offset: int) -> Awaitable[None]:
            try:
                session.allow_group(topic_name, group)
                partition = self._partition(topic_name, index)
            except Exception as exc:
                return _failed(exc)
            topic = self.broker.topics.get(partition.topic)
            assert topic is not None
            return asyncio.ensure_future(commit(topic, index, offset))

        return await self._offsets_answer(topics, one)

    async def _offsets_answer(
        self, topics: Any, one: Callable[[str, int, int], Awaitable[Any]]
    ) -> Response:
        jobs = [
            (t.name, p.partition_index, one(t.name, p.partition_index, p.committed_offset))
            for t in topics
            for p in t.partitions
        ]
        by_topic: dict[str, list[Response]] = {}
        for name, index, job in jobs:
            try:
                await job
                code = NONE
            except Exception as exc:
                code = self._code(exc)[0]
            by_topic.setdefault(name, []).append({"partition_index": index, "error_code": code})
        return {
            "throttle_time": 0,
            "topics": [{"name": n, "partitions": p} for n, p in by_topic.items()],
        }

    async def offset_fetch(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            name = _group_subscription(req.group_id)
        except KafkaError as exc:
            return {"throttle_time": 0, "topics": [], "error_code": exc.code}
        subs = self.broker.subscriptions

        def refusal(topic: str) -> int:
            """The code that refuses this role the group's offsets on ``topic``."""
            try:
                session.allow_group(topic, name)
            except KafkaError as exc:
                return exc.code
            return NONE

        # The topics that may hold the group's offsets, loaded (a topic not
        # loaded has its cursors in the store only); asked for all of them,
        # the ones this role may read as the group.
        known = self.broker.topics
        store = self.broker.store
        for t in (
            [t.name for t in req.topics if not refusal(t.name)]
            if req.topics is not None
            else [
                t
                for t in known.names()
                if known.get(t) is None
                and store.has_ledger(PartitionSubscription.ledger_name(t, 0, name))
                and not refusal(t)
            ]
        ):
            await known.load_topic(t)
        if req.topics is None:
            wanted = [
                (t, [s.partition.index for s in found])
                for t in self.broker.topics.names()
                if (found := subs.of_topic(t).get(name)) and not refusal(t)
            ]
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in req.topics]
        topics = []
        for topic_name, indexes in wanted:
            parts = []
            code = refusal(topic_name)
            for index in indexes:
                sub = None if code else subs.get(topic_name, index, name)
                parts.append(
                    {
                        "partition_index": index,
                        "committed_offset": -1 if sub is None else _committed_offset(sub),
                        "committed_leader_epoch": -1,
                        "metadata": "",
                        "error_code": code,
                    }
                )
            topics.append({"name": topic_name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics, "error_code": NONE}

    # -- helpers -------------------------------------------------------------------------

    def _partition(self, topic_name: str, index: int) -> Partition:
        topic = self.broker.topics.get(topic_name)
        if topic is None and topic_name in self.broker.topics:
            # Not loaded (topics load on first use): the client asks again,
            # after a metadata request that waits for the load.
            self.broker.topics.request_load(topic_name)
            raise KafkaError(
                UNKNOWN_TOPIC_OR_PARTITION, f"topic {topic_name!r} is loading; try again"
            )
        if topic is None or not 0 <= index < len(topic.partitions):
            raise KafkaError(
                UNKNOWN_TOPIC_OR_PARTITION, f"no partition {index} of topic {topic_name!r}"
            )
        return topic.partitions[index]

    def _allow_producer(
        self, session: KafkaSession, producer_id: int, transactional_id: str | None
    ) -> None:
        """A transactional request: refused (TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
        unless the role may produce on the transactional id it names and on
        the one that holds its producer id (as `broker._epoch` checks the
        producer-epoch mode: without it, a role could end or write into
        another's transaction by naming its own transactional id)."""
        if session.superuser:
            return
        if transactional_id is not None:
            session.allow_transactional_id(transactional_id)
        tc = self.broker.coordinators.get(producer_id >> _PID_SHIFT)
        entry = tc.producer_of(producer_id) if tc is not None else None
        if entry is not None and entry.transactional_id != transactional_id:
            session.allow_transactional_id(entry.transactional_id)

    @staticmethod
    def _allow_join(session: KafkaSession, req: Any) -> None:
        """JoinGroup: a consumer group member subscribes to topics (its
        protocols' metadata, Kafka's ConsumerProtocolSubscription): the role
        must be allowed to consume on each as the group (else
        GROUP_AUTHORIZATION_FAILED, nothing joined). Another protocol type
        (Kafka Connect's, say) names no topics: a superuser's only."""
        if session.superuser:
            return
        group = req.group_id
        if req.protocol_type != "consumer":
            raise KafkaError(
                GROUP_AUTHORIZATION_FAILED,
                f"group {group!r}: only a superuser may join with protocol type "
                f"{req.protocol_type!r} (a consumer group's is 'consumer')",
            )
        for protocol in req.protocols:
            try:
                topics = subscribed_topics(bytes(protocol.metadata))
            except ValueError as exc:
                raise KafkaError(
                    GROUP_AUTHORIZATION_FAILED,
                    f"group {group!r}: protocol {protocol.name!r}'s subscription does not "
                    f"decode ({exc}), so its topics cannot be checked",
                ) from None
            for topic in topics:
                try:
                    session.allow_group(topic, group)
                except KafkaError as exc:
                    raise KafkaError(GROUP_AUTHORIZATION_FAILED, str(exc)) from None

    def _coordinator_of_producer(self, producer_id: int) -> TransactionCoordinator:
        tc = self.broker.coordinators.get(producer_id >> _PID_SHIFT)
        if tc is None:
            raise refusals.InvalidProducerIdMapping(
                f"producer id {producer_id} belongs to no coordinator running here",
            )
        return tc

    @staticmethod
    def _code(exc: BaseException) -> tuple[int, str]:
        """The Kafka error code and message that answer ``exc``: a Kafka
        refusal's own, else the refusal's (`broker._errors.kafka_code`,
        which logs what is no refusal)."""
        if isinstance(exc, (KafkaError, RecordError, GroupError)):
            return exc.code, str(exc)
        return kafka_code(exc), error_text(exc)


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


def subscribed_topics(metadata: bytes) -> list[str]:
    """The topics of a consumer's ConsumerProtocolSubscription (JoinGroup's
    protocol metadata): a version (int16), then an array (int32 count) of
    strings (int16 length, UTF-8); what follows is left unread. ValueError
    if it is not one."""
    try:
        _, count = struct.unpack_from(">hi", metadata, 0)
        if not 0 <= count <= len(metadata):
            raise ValueError(f"{count} topics")
        pos = 6
        topics = []
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, pos)
            pos += 2
            if size < 0 or pos + size > len(metadata):
                raise ValueError("a topic name runs past the metadata")
            topics.append(metadata[pos : pos + size].decode())
            pos += size
    except (struct.error, UnicodeDecodeError) as exc:
        raise ValueError(str(exc)) from None
    return topics


def _group_subscription(group_id: str) -> str:
    try:
        return check_subscription_name(group_id)
    except InvalidNameError as exc:
        raise KafkaError(INVALID_GROUP_ID, str(exc)) from None


def _ack_bound(sub: PartitionSubscription, offset: int) -> tuple[int, int] | None:
    """The last message before ``offset``, if after the subscription's
    mark-delete position (what committing ``offset`` acknowledges)."""
    partition = sub.partition
    last = partition.ledger.last_entry_id
    entry_id, index = position_of(offset)
    if entry_id > last:
        entry_id, index = last + 1, 0
    if index > 0:
        bound = (entry_id, min(index, partition.count(entry_id)) - 1)
    else:
        bound = (entry_id - 1, partition.count(entry_id - 1) - 1)
    if bound[1] < 0 or bound <= sub.cursor.mark_delete:
        return None
    return bound


def _committed_offset(sub: PartitionSubscription) -> int:
    """The next offset after the subscription's mark-delete position."""
    entry_id, index = sub.cursor.mark_delete
    if index == WHOLE_ENTRY or index + 1 >= sub.partition.count(entry_id):
        return offset_of(entry_id + 1, 0)
    return offset_of(entry_id, index + 1)


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


async def _failed(exc: BaseException) -> Any:
    raise exc


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
