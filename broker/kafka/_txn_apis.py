"""The Kafka transaction APIs: InitProducerId, AddPartitionsToTxn,
AddOffsetsToTxn, EndTxn (TxnOffsetCommit, which writes a group's offsets,
is `broker.kafka._group_apis`').

They drive the producer-epoch mode (`tc.ProducerEpochMode`) as
`broker._epoch` does from txnbuf's own protocol: InitProducerId goes to
the coordinator the transactional id hashes to; the others to the
coordinator that issued the producer id (`Broker.producer_coordinator`).
The clients served here speak Kafka's transactions before KIP-890 part 2:
AddPartitionsToTxn adds a partition (beginning the transaction), EndTxn
keeps the producer's epoch (``bump=False``). Producers without a
transactional id (idempotent only) get a random producer id.

In a cluster, a transactional id's coordinator is transaction coordinator
k of its slot k (``crc32(id) % slots``, on the slot's owner), and a
producer id's the one that issued it: a broker that does not hold that
slot answers NOT_COORDINATOR, one loading it COORDINATOR_LOAD_IN_PROGRESS
(`broker.kafka._cluster`), after the permission checks.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from broker.kafka._codec import Api
from broker.kafka._common import (
    NONE,
    OPERATION_NOT_ATTEMPTED,
    UNKNOWN_TOPIC_OR_PARTITION,
    Handler,
    Response,
    allow_producer,
    error_code,
    group_subscription,
    partition_of,
)
from broker.kafka._session import KafkaError, KafkaSession
from tc import TransactionCoordinator, TxnID, coordinator_of_producer

if TYPE_CHECKING:
    from broker._broker import Broker
    from broker.kafka._cluster import KafkaCluster

__all__ = ["TxnApis"]

_IDEMPOTENT_PID_BITS = 46  # random producer ids of idempotent producers


class TxnApis:
    """The transaction API handlers of one listener (`handlers` for its table)."""

    def __init__(self, broker: Broker, cluster: KafkaCluster | None = None) -> None:
        self.broker = broker
        self.cluster = cluster

    def _coordinator(self, producer_id: int) -> TransactionCoordinator:
        """The coordinator that issued ``producer_id`` (a cluster's: refused
        NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS unless open here)."""
        if self.cluster is not None:
            tcid = coordinator_of_producer(producer_id)
            self.cluster.check_slot(
                tcid % self.cluster.slots, f"producer id {producer_id}", tcid=True
            )
        return self.broker.producer_coordinator(producer_id)

    def handlers(self) -> dict[int, Handler]:
        return {
            Api.INIT_PRODUCER_ID: self.init_producer_id,
            Api.ADD_PARTITIONS_TO_TXN: self.add_partitions_to_txn,
            Api.ADD_OFFSETS_TO_TXN: self.add_offsets_to_txn,
            Api.END_TXN: self.end_txn,
        }

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
            if self.cluster is not None:  # (Kafka's codes while it is elsewhere or loading)
                self.cluster.check_coordinator(req.transactional_id, "transactional id", tcid=True)
            # (the one mapping of transactional ids, txnbuf's INIT_PRODUCER_ID's too)
            tc = self.broker.transactional_coordinator(req.transactional_id)
            timeout_ms = round(req.transaction_timeout.total_seconds() * 1000)
            pid, epoch, _, _ = await tc.init_producer(req.transactional_id, timeout_ms)
        except Exception as exc:
            out["error_code"], _ = error_code(exc)
            return out
        out["producer_id"], out["producer_epoch"] = pid, epoch
        return out

    def add_partitions_to_txn(
        self, req: Any, version: int, session: KafkaSession
    ) -> Awaitable[Response]:
        cluster = self.cluster
        elsewhere = (
            []
            if cluster is None
            else [t.name for t in req.v3_and_below_topics if not cluster.serves(t.name)]
        )
        if not elsewhere:
            return self._add_partitions(req, session, {})

        async def counted() -> Response:
            # (partitions of another broker's topics: their counts from its
            # slot's topic list, read before anything is added)
            assert cluster is not None
            counts = {name: await cluster.topic_partitions(name) for name in elsewhere}
            return await self._add_partitions(req, session, counts)

        return counted()

    def _add_partitions(
        self, req: Any, session: KafkaSession, elsewhere: dict[str, int | None]
    ) -> Awaitable[Response]:
        """AddPartitionsToTxn; ``elsewhere``: the partition counts of the
        topics of other brokers (None: no such topic), which are recorded
        as the transaction's participants there (the partition's broker
        checks each send with this coordinator, `broker._peers`)."""
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
            allow_producer(self.broker, session, pid, req.v3_and_below_transactional_id)
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
                    tc = self._coordinator(pid)
                    if topic.name in elsewhere:
                        count = elsewhere[topic.name]
                        if count is None or not 0 <= index < count:
                            raise KafkaError(
                                UNKNOWN_TOPIC_OR_PARTITION,
                                f"no partition {topic.name}/{index}",
                            )
                    else:
                        partition_of(self.broker, topic.name, index)
                    if begun is None:
                        begun = tc.producer_begin(pid, epoch, f"add {topic.name}/{index}")
                    tc.producer_add_partition(pid, epoch, topic.name, index)
                    codes.append((index, NONE))
                except Exception as exc:
                    failed = exc
                    codes.append((index, error_code(exc)[0]))
            results.append((topic.name, codes))

        async def answer() -> Response:
            nonlocal results
            if begun is not None:
                try:
                    await begun
                except Exception as exc:
                    code = error_code(exc)[0]
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
            allow_producer(self.broker, session, req.producer_id, req.transactional_id)
            group_subscription(req.group_id)
            begun = self._coordinator(req.producer_id).producer_begin(
                req.producer_id, req.producer_epoch, f"add the offsets of group {req.group_id!r}"
            )
        except Exception as exc:
            return {"throttle_time": 0, "error_code": error_code(exc)[0]}

        async def answer() -> Response:
            try:
                await begun
            except Exception as exc:
                return {"throttle_time": 0, "error_code": error_code(exc)[0]}
            return {"throttle_time": 0, "error_code": NONE}

        return answer()

    async def end_txn(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            allow_producer(self.broker, session, req.producer_id, req.transactional_id)
            tc = self._coordinator(req.producer_id)
            await tc.end_producer_txn(
                req.producer_id, req.producer_epoch, req.committed, bump=False
            )
        except Exception as exc:
            return {"throttle_time": 0, "error_code": error_code(exc)[0]}
        return {"throttle_time": 0, "error_code": NONE}
