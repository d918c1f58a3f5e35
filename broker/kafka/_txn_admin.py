"""Kafka's transaction admin APIs, on the producer-epoch mode's registry (`tc`).

Every one needs a superuser (`KafkaSession.allow_admin`): a refusal is the
authorization code of the resource the API names
(TRANSACTIONAL_ID_, TOPIC_ or CLUSTER_AUTHORIZATION_FAILED) and changes
nothing.

ListTransactions and DescribeTransactions show each transactional id as
Kafka's coordinator would: ``Ongoing`` while its transaction is open (or
prepared), ``PrepareCommit``/``PrepareAbort`` while it ends,
``CompleteCommit``/``CompleteAbort`` after, ``Empty`` before its first.
DescribeProducers shows, per partition, the producer-epoch producers
that wrote there (their epoch, and the start offset of a transaction not
ended there: the partition's end, where its messages will appear) and
the idempotent ones (their last sequence).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.kafka._codec import Api
from broker.kafka._common import UNKNOWN_TOPIC_OR_PARTITION, Handler, Response
from broker.kafka._offsets import offset_of
from broker.kafka._session import (
    CLUSTER_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError,
    KafkaSession,
)
from buffer import Partition
from tc import ProducerEntry, TransactionCoordinator, TxnID, TxnStatus

if TYPE_CHECKING:
    from broker._broker import Broker
    from broker.kafka._cluster import KafkaCluster

__all__ = ["TXN_STATES", "TxnAdmin"]

INVALID_REQUEST = 42
TRANSACTIONAL_ID_NOT_FOUND = 105


def _txn_state(entry: ProducerEntry, tc: TransactionCoordinator) -> tuple[str, int]:
    """(Kafka's name for the state of a transactional id, its transaction's
    start in ms or -1)."""
    if entry.ongoing is not None:
        meta = tc.get(entry.ongoing)
        if meta is not None:
            status = meta.status
            if status is TxnStatus.COMMITTING:
                return "PrepareCommit", meta.start_ms
            if status is TxnStatus.ABORTING:
                return "PrepareAbort", meta.start_ms
            if not status.ended:
                return "Ongoing", meta.start_ms
    if entry.prev_outcome == "commit":
        return "CompleteCommit", -1
    if entry.prev_outcome == "abort":
        return "CompleteAbort", -1
    return "Empty", -1


TXN_STATES = (
    "Empty",
    "Ongoing",
    "PrepareCommit",
    "PrepareAbort",
    "CompleteCommit",
    "CompleteAbort",
    "Dead",
    "PrepareEpochFence",
)


class TxnAdmin:
    """The transaction admin API handlers of one listener (`handlers` for
    its table). ``txn_sequence`` is the listener's base sequence of a
    producer's transaction on a partition (`KafkaApis.txn_sequence`)."""

    def __init__(
        self,
        broker: Broker,
        txn_sequence: Callable[[Partition, int], tuple[TxnID, int] | None],
        cluster: KafkaCluster | None = None,
    ) -> None:
        self.broker = broker
        self.txn_sequence = txn_sequence
        self.cluster = cluster

    def handlers(self) -> dict[int, Handler]:
        return {
            Api.LIST_TRANSACTIONS: self.list_transactions,
            Api.DESCRIBE_TRANSACTIONS: self.describe_transactions,
            Api.DESCRIBE_PRODUCERS: self.describe_producers,
        }

    def list_transactions(self, req: Any, version: int, session: KafkaSession) -> Response:
        out: Response = {
            "throttle_time": 0,
            "error_code": 0,
            "unknown_state_filters": [],
            "transaction_states": [],
        }
        try:
            session.allow_admin(CLUSTER_AUTHORIZATION_FAILED)
            pattern = getattr(req, "transactional_id_pattern", None)
            try:
                regex = re.compile(pattern) if pattern else None
            except re.error as exc:
                raise KafkaError(INVALID_REQUEST, f"transactional id pattern: {exc}") from None
        except KafkaError as exc:
            out["error_code"] = exc.code
            return out
        states = set(req.state_filters)
        out["unknown_state_filters"] = sorted(states - set(TXN_STATES))
        pids = set(req.producer_id_filters)
        duration = getattr(req, "duration_filter", -1)
        now = int(time.time() * 1000)
        for tc in self.broker.coordinators.values():
            for entry in tc.producers():
                state, start = _txn_state(entry, tc)
                if states and state not in states:
                    continue
                if pids and entry.producer_id not in pids:
                    continue
                if duration >= 0 and (start < 0 or now - start < duration):
                    continue
                if regex is not None and not regex.fullmatch(entry.transactional_id):
                    continue
                out["transaction_states"].append(
                    {
                        "transactional_id": entry.transactional_id,
                        "producer_id": entry.producer_id,
                        "transaction_state": state,
                    }
                )
        return out

    def describe_transactions(self, req: Any, version: int, session: KafkaSession) -> Response:
        states = []
        coordinators = self.broker.coordinators
        for tid in req.transactional_ids:
            out: Response = {
                "error_code": 0,
                "transactional_id": tid,
                "transaction_state": "",
                "transaction_timeout": 0,
                "transaction_start_time": -1,
                "producer_id": -1,
                "producer_epoch": -1,
                "topics": [],
            }
            try:
                session.allow_admin(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
                if self.cluster is not None:  # (its coordinator: its slot's owner)
                    tc = coordinators[
                        self.cluster.check_coordinator(tid, "transactional id", tcid=True)
                    ]
                else:
                    tc = self.broker.transactional_coordinator(tid)
                entry = tc.producer(tid)
                if entry is None:
                    raise KafkaError(TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {tid!r}")
                state, start = _txn_state(entry, tc)
                topics: dict[str, list[int]] = {}
                meta = tc.get(entry.ongoing) if entry.ongoing is not None else None
                if meta is not None and start >= 0:
                    for topic, index in meta.partitions:
                        topics.setdefault(topic, []).append(index)
                out.update(
                    transaction_state=state,
                    transaction_timeout=entry.timeout_ms,
                    transaction_start_time=start,
                    producer_id=entry.producer_id,
                    producer_epoch=entry.epoch,
                    topics=[{"topic": t, "partitions": sorted(p)} for t, p in topics.items()],
                )
            except KafkaError as exc:
                out["error_code"] = exc.code
            states.append(out)
        return {"throttle_time": 0, "transaction_states": states}

    async def describe_producers(self, req: Any, version: int, session: KafkaSession) -> Response:
        topics = []
        for t in req.topics:
            parts = []
            for index in t.partition_indexes:
                out: Response = {
                    "partition_index": index,
                    "error_code": 0,
                    "error_message": None,
                    "active_producers": [],
                }
                try:
                    session.allow_admin(TOPIC_AUTHORIZATION_FAILED)
                    topic = await self.broker.topics.load_topic(t.name)
                    if topic is None or not 0 <= index < len(topic.partitions):
                        raise KafkaError(
                            UNKNOWN_TOPIC_OR_PARTITION, f"no partition {index} of {t.name!r}"
                        )
                    out["active_producers"] = self._producers(topic.partitions[index])
                except KafkaError as exc:
                    out.update(error_code=exc.code, error_message=str(exc))
                parts.append(out)
            topics.append({"name": t.name, "partitions": parts})
        return {"throttle_time": 0, "topics": topics}

    def _producers(self, partition: Any) -> list[Response]:
        found = []
        end = offset_of(partition.ledger.last_entry_id + 1, 0)
        buffer = partition.transaction_buffer
        if buffer is not None:
            for pid, known in sorted(buffer.epoch_producers.items()):
                status = None if known.txn is None else buffer.status(known.txn)
                ongoing = status is not None and status.state not in ("committed", "aborted")
                last = -1
                seq = self.txn_sequence(partition, pid)
                if ongoing and seq is not None and status is not None and seq[0] == known.txn:
                    last = seq[1] + status.count - 1
                found.append(
                    {
                        "producer_id": pid,
                        "producer_epoch": known.epoch,
                        "last_sequence": last,
                        "last_timestamp": -1,
                        "coordinator_epoch": known.coordinator_epoch,
                        "current_txn_start_offset": end if ongoing else -1,
                    }
                )
        for name, last_seq in sorted(partition.dedup.snapshot().items()):
            if not name.startswith("~kafka."):
                continue
            pid_text, _, epoch_text = name[len("~kafka.") :].partition(".")
            if not (pid_text.isdigit() and epoch_text.isdigit()):
                continue
            found.append(
                {
                    "producer_id": int(pid_text),
                    "producer_epoch": int(epoch_text),
                    "last_sequence": last_seq,
                    "last_timestamp": -1,
                    "coordinator_epoch": -1,
                    "current_txn_start_offset": -1,
                }
            )
        return found
