"""The Kafka consumer group APIs: membership (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup: `broker.kafka._groups`) and offsets (OffsetCommit,
TxnOffsetCommit, OffsetFetch).

A group is the txnbuf subscription of its name on each partition it
commits (`Subscriptions.cursor_of`): its committed offset is the
subscription's mark-delete position (the next offset after it), an
OffsetCommit a cumulative acknowledgement up to the message before the
committed offset, a TxnOffsetCommit the same acknowledgement in the
producer's transaction (as Kafka's group coordinator writes a
transaction's offsets). Offsets only move forward: a commit at or below
the committed offset changes nothing.

In a cluster, a group's coordinator is the owner of its slot
(``crc32(group) % slots``): every API here at another broker is refused
NOT_COORDINATOR (the broker forgets what it held of the group in memory),
at the broker loading the slot COORDINATOR_LOAD_IN_PROGRESS
(`broker.kafka._cluster`). The offsets themselves are the cursors of the
topics' partitions, written by the owner of each topic's slot: a group
commits offsets only on partitions whose slot its coordinator serves too
(elsewhere NOT_LEADER_OR_FOLLOWER for that partition, nothing changed).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker.kafka._codec import Api
from broker.kafka._common import (
    INVALID_TXN_STATE,
    NONE,
    Handler,
    Response,
    allow_producer,
    error_code,
    failed,
    group_subscription,
    partition_of,
)
from broker.kafka._groups import GroupError, Groups, subscribed_topics
from broker.kafka._offsets import offset_of, position_of
from broker.kafka._session import (
    GROUP_AUTHORIZATION_FAILED,
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
    KafkaError,
    KafkaSession,
)
from buffer import Topic
from subscriptions import WHOLE_ENTRY, PartitionSubscription

if TYPE_CHECKING:
    from broker._broker import Broker
    from broker.kafka._cluster import KafkaCluster

__all__ = ["GroupApis"]


class GroupApis:
    """The consumer group API handlers of one listener (`handlers` for its table)."""

    def __init__(self, broker: Broker, groups: Groups, cluster: KafkaCluster | None = None) -> None:
        self.broker = broker
        self.groups = groups
        self.cluster = cluster

    def _check_coordinator(self, group_id: str) -> None:
        """A cluster's: NOT_COORDINATOR (what is held of the group here is
        dropped) or COORDINATOR_LOAD_IN_PROGRESS unless this broker
        coordinates ``group_id`` now."""
        if self.cluster is None:
            return
        try:
            self.cluster.check_coordinator(group_id, "group")
        except KafkaError as exc:
            self.groups.drop(group_id, exc.code, str(exc))
            raise

    def handlers(self) -> dict[int, Handler]:
        return {
            Api.JOIN_GROUP: self.join_group,
            Api.SYNC_GROUP: self.sync_group,
            Api.HEARTBEAT: self.heartbeat,
            Api.LEAVE_GROUP: self.leave_group,
            Api.OFFSET_COMMIT: self.offset_commit,
            Api.TXN_OFFSET_COMMIT: self.txn_offset_commit,
            Api.OFFSET_FETCH: self.offset_fetch,
        }

    async def txn_offset_commit(self, req: Any, version: int, session: KafkaSession) -> Response:
        pid, epoch = req.producer_id, req.producer_epoch

        async def commit(topic: Topic, index: int, offset: int) -> None:
            sub = await self.broker.subscriptions.cursor_of(topic, index, name)
            bound = _ack_bound(sub, offset)
            if bound is None:
                return
            if here:
                txnid = self.broker.producer_coordinator(pid).producer_add_subscription(
                    pid, epoch, topic.name, name
                )
            else:
                # (checked with the coordinator elsewhere; answered once durable)
                assert self.broker.cluster is not None
                txnid, holder = await self.broker.cluster.peers.register_producer(
                    (pid, epoch), topic.name, subscription=name, keep=False
                )
                if holder != req.transactional_id:
                    raise KafkaError(
                        TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
                        f"producer id {pid} is held by another transactional id than "
                        f"{req.transactional_id!r}",
                    )
            await sub.ack([bound], True, txnid, here)

        try:
            allow_producer(self.broker, session, pid, req.transactional_id)
            name = group_subscription(req.group_id)
            self._check_coordinator(req.group_id)
            here = self.cluster is None or self.cluster.coordinator_here(
                pid, f"the offsets of group {req.group_id!r}"
            )
            entry = self.broker.producer_coordinator(pid).producer_of(pid) if here else None
            if entry is not None and entry.identity == (pid, epoch) and entry.ongoing is None:
                # (a refused identity is left to producer_add_subscription)
                raise KafkaError(
                    INVALID_TXN_STATE,
                    f"offsets of group {req.group_id!r} refused: {entry.transactional_id!r} "
                    "has no ongoing transaction (AddOffsetsToTxn begins one)",
                )
        except Exception as exc:
            refused: BaseException = exc
            return await self._offsets_answer(req.topics, lambda *_: failed(refused))
        return await self._commit_offsets(req.topics, commit, session, name)

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
            group_subscription(req.group_id)
            self._allow_join(session, req)
            self._check_coordinator(req.group_id)
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
            self._check_coordinator(req.group_id)
            assignment = await self.groups.sync(
                req.group_id,
                req.member_id,
                req.generation_id,
                [(a.member_id, bytes(a.assignment)) for a in req.assignments],
                session.who.role,
            )
        except (GroupError, KafkaError) as exc:
            return {"throttle_time": 0, "error_code": exc.code, "assignment": b""}
        return {"throttle_time": 0, "error_code": NONE, "assignment": assignment}

    def heartbeat(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            self._check_coordinator(req.group_id)
            self.groups.heartbeat(req.group_id, req.member_id, req.generation_id, session.who.role)
        except (GroupError, KafkaError) as exc:
            return {"throttle_time": 0, "error_code": exc.code}
        return {"throttle_time": 0, "error_code": NONE}

    def leave_group(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            self._check_coordinator(req.group_id)
            self.groups.leave(req.group_id, req.member_id, session.who.role)
        except (GroupError, KafkaError) as exc:
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
            name = group_subscription(req.group_id)
            self._check_coordinator(req.group_id)
            self.groups.check_member(req.group_id, req.member_id, generation, session.who.role)
        except (GroupError, KafkaError) as exc:
            refused: BaseException = exc
            return await self._offsets_answer(req.topics, lambda *_: failed(refused))
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
                if self.cluster is not None:
                    self.cluster.check_leader(topic_name)
                partition = partition_of(self.broker, topic_name, index)
            except Exception as exc:
                return failed(exc)
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
                code = error_code(exc)[0]
            by_topic.setdefault(name, []).append({"partition_index": index, "error_code": code})
        return {
            "throttle_time": 0,
            "topics": [{"name": n, "partitions": p} for n, p in by_topic.items()],
        }

    async def offset_fetch(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            name = group_subscription(req.group_id)
            self._check_coordinator(req.group_id)
        except KafkaError as exc:
            # (v0-1 have no error code of their own: each partition's)
            topics = [
                {
                    "name": t.name,
                    "partitions": [
                        {
                            "partition_index": i,
                            "committed_offset": -1,
                            "committed_leader_epoch": -1,
                            "metadata": "",
                            "error_code": exc.code,
                        }
                        for i in t.partition_indexes
                    ],
                }
                for t in (req.topics or [])
            ]
            return {
                "throttle_time": 0,
                "topics": topics if version < 2 else [],
                "error_code": exc.code,
            }
        subs = self.broker.subscriptions

        def refusal(topic: str) -> int:
            """The code that refuses this role the group's offsets on ``topic``
            (or that this broker does not serve its slot: its cursors are
            written there)."""
            try:
                session.allow_group(topic, name)
                if self.cluster is not None:
                    self.cluster.check_leader(topic)
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
