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
topics' partitions, written by the owner of each topic's slot: the
coordinator commits and fetches those of the topics it serves itself, and
forwards the others to their topic's owner (`_Forward`: one GROUP_CURSORS
per owner and request, `broker._group_cursors`), looked up at each
request. The Kafka client's rights are checked here first, as for its
local partitions. A partition whose owner cannot be reached now (moving,
lost, not answering) is answered COORDINATOR_LOAD_IN_PROGRESS, retriable
for every client (OffsetFetch v2+ answers it for the whole request: the
Java client takes no per-partition retriable code there); the client asks
again, and the owner is looked up again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from broker._errors import KAFKA_CODES, wire_code
from broker._group_cursors import ack_bound, first_unacknowledged
from broker.kafka._cluster import COORDINATOR_LOAD_IN_PROGRESS
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
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions import PartitionSubscription

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
            bound = ack_bound(sub, position_of(offset))
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
        producer = (pid, epoch, req.transactional_id)
        return await self._commit_offsets(req.topics, commit, session, name, producer)

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
            bound = ack_bound(sub, position_of(offset))
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
        producer: tuple[int, int, str] | None = None,
    ) -> Response:
        """Commit each partition's offset (refused there, nothing changed,
        unless the role may consume on its topic as ``group``): here if this
        broker serves its topic, else at its owner (``producer``: in that
        producer's transaction, TxnOffsetCommit)."""
        forward = _Forward(self.broker, group, True, producer)

        def one(topic_name: str, index: int, offset: int) -> Awaitable[Any]:
            try:
                session.allow_group(topic_name, group)
                if self.cluster is not None and not self.cluster.serves(topic_name):
                    return forward.add(topic_name, index, position_of(offset))
                partition = partition_of(self.broker, topic_name, index)
            except Exception as exc:
                return failed(exc)
            topic = self.broker.topics.get(partition.topic)
            assert topic is not None
            return asyncio.ensure_future(commit(topic, index, offset))

        return await self._offsets_answer(topics, one, forward.send)

    async def _offsets_answer(
        self,
        topics: Any,
        one: Callable[[str, int, int], Awaitable[Any]],
        sent: Callable[[], None] = lambda: None,
    ) -> Response:
        """Each partition's answer (``one``), once ``sent`` has sent what
        goes to other brokers."""
        jobs = [
            (t.name, p.partition_index, one(t.name, p.partition_index, p.committed_offset))
            for t in topics
            for p in t.partitions
        ]
        sent()
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
            return await self._fetch_offsets(req, session, name)
        except KafkaError as exc:
            # (v0-1 have no error code of their own: each partition's)
            topics = [
                {
                    "name": t.name,
                    "partitions": [_fetched(i, -1, exc.code) for i in t.partition_indexes],
                }
                for t in (req.topics or [])
            ]
            return {
                "throttle_time": 0,
                "topics": topics if version < 2 else [],
                "error_code": exc.code,
            }

    async def _fetch_offsets(self, req: Any, session: KafkaSession, name: str) -> Response:
        """OffsetFetch at the group's coordinator: each partition's committed
        offset, read here or at its topic's owner; a KafkaError (retriable)
        if an owner cannot be read now."""
        subs = self.broker.subscriptions
        cluster = self.cluster

        def refusal(topic: str) -> int:
            """The code that refuses this role the group's offsets on ``topic``."""
            try:
                session.allow_group(topic, name)
            except KafkaError as exc:
                return exc.code
            return NONE

        def here(topic: str) -> bool:
            return cluster is None or cluster.serves(topic)

        # The topics here that may hold the group's offsets, loaded (a topic
        # not loaded has its cursors in the store only); asked for all of
        # them, the ones this role may read as the group.
        known = self.broker.topics
        store = self.broker.store
        for t in (
            [t.name for t in req.topics if here(t.name) and not refusal(t.name)]
            if req.topics is not None
            else [
                t
                for t in known.names()
                if known.get(t) is None
                and here(t)
                and store.has_ledger(PartitionSubscription.ledger_name(t, 0, name))
                and not refusal(t)
            ]
        ):
            await known.load_topic(t)
        forward = _Forward(self.broker, name, False)
        wanted: list[tuple[str, list[int]]]
        if req.topics is None:
            wanted = [
                (t, [s.partition.index for s in found])
                for t in known.names()
                if here(t) and (found := subs.of_topic(t).get(name)) and not refusal(t)
            ]
            if cluster is not None:
                elsewhere: dict[str, list[int]] = {}
                for at in await forward.every(await cluster.slot_owners()):
                    elsewhere.setdefault(at.topic, []).append(at.partition)
                wanted += [(t, sorted(i)) for t, i in elsewhere.items() if not refusal(t)]
        else:
            wanted = [(t.name, list(t.partition_indexes)) for t in req.topics]
        jobs: list[tuple[str, int, int, Awaitable[int] | None]] = []
        for topic_name, indexes in wanted:
            code = refusal(topic_name)
            for index in indexes:
                job: Awaitable[int] | None = None
                if not code and not here(topic_name):
                    job = forward.fetch(topic_name, index)
                jobs.append((topic_name, index, code, job))
        forward.send()
        results = iter(
            await asyncio.gather(*(j for *_, j in jobs if j is not None), return_exceptions=True)
        )
        topics: dict[str, list[Response]] = {}
        for topic_name, index, code, job in jobs:
            offset = -1
            if job is not None:
                got = next(results)
                if isinstance(got, KafkaError) and got.code != COORDINATOR_LOAD_IN_PROGRESS:
                    code = got.code
                elif isinstance(got, BaseException):
                    raise got
                else:
                    offset = got
            elif not code:
                sub = subs.get(topic_name, index, name)
                offset = -1 if sub is None else _committed_offset(sub)
            topics.setdefault(topic_name, []).append(_fetched(index, offset, code))
        return {
            "throttle_time": 0,
            "topics": [{"name": t, "partitions": p} for t, p in topics.items()],
            "error_code": NONE,
        }

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


def _fetched(index: int, offset: int, code: int) -> Response:
    return {
        "partition_index": index,
        "committed_offset": offset,
        "committed_leader_epoch": -1,
        "metadata": "",
        "error_code": code,
    }


def _committed_offset(sub: PartitionSubscription) -> int:
    """The next offset after the subscription's mark-delete position."""
    return offset_of(*first_unacknowledged(sub))


def _kafka_refusal(code: int, message: str) -> KafkaError:
    """A topic owner's refusal (a `ServerError` ``code``) as the Kafka
    client is told it: retriable (COORDINATOR_LOAD_IN_PROGRESS) when the
    owner moved or cannot answer now, else the refusal's Kafka code."""
    if code in (pb.NOT_OWNER, pb.SERVICE_NOT_READY, pb.PERSISTENCE_ERROR):
        return KafkaError(COORDINATOR_LOAD_IN_PROGRESS, f"{message}; try again")
    return KafkaError(KAFKA_CODES.get(code, -1), message)  # type: ignore[call-overload]


class _Forward:
    """A group's partitions of topics served by other brokers, in one
    request of a Kafka client: each owner (looked up now) is sent one
    GROUP_CURSORS with all of its partitions, a commit (``producer``: in
    that producer's transaction) or a fetch; each partition's answer is a
    future. A failure to reach an owner fails its partitions with a
    retriable KafkaError (`_kafka_refusal`)."""

    def __init__(
        self,
        broker: Broker,
        subscription: str,
        commit: bool,
        producer: tuple[int, int, str] | None = None,
    ) -> None:
        self.broker = broker
        self.subscription = subscription
        self.commit = commit
        self.producer = producer
        self._todo: dict[tuple[str, int], tuple[tuple[int, int], asyncio.Future[pb.CursorAt]]] = {}

    def _add(self, topic: str, index: int, pos: tuple[int, int]) -> asyncio.Future[pb.CursorAt]:
        old = self._todo.get((topic, index))
        if old is not None:  # (a partition named twice: one request, one answer)
            return old[1]
        future: asyncio.Future[pb.CursorAt] = asyncio.get_running_loop().create_future()
        self._todo[(topic, index)] = (pos, future)
        return future

    def add(self, topic: str, index: int, pos: tuple[int, int]) -> Awaitable[Any]:
        """Commit ``pos`` (everything before it acknowledged) on ``topic``/``index``."""
        return self._add(topic, index, pos)

    def fetch(self, topic: str, index: int) -> Awaitable[int]:
        """The committed offset of ``topic``/``index`` (-1: none)."""
        future = self._add(topic, index, (0, 0))

        async def offset() -> int:
            at = await future
            return -1 if at.none else offset_of(at.entry_id, at.index)

        return offset()

    def send(self) -> None:
        """Send what was added (the answers come to their futures)."""
        if self._todo:
            todo, self._todo = self._todo, {}
            task = asyncio.get_running_loop().create_task(self._send(todo))
            _tasks.add(task)
            task.add_done_callback(_tasks.discard)

    async def _send(
        self,
        todo: dict[tuple[str, int], tuple[tuple[int, int], asyncio.Future[pb.CursorAt]]],
    ) -> None:
        assert self.broker.cluster is not None
        peers = self.broker.cluster.peers
        by_owner: dict[str, list[tuple[str, int]]] = {}
        for topic in {t for t, _ in todo}:
            keys = [k for k in todo if k[0] == topic]
            try:
                url = await peers.topic_owner(topic)
                if not url:  # (its slot came here since: asked again, it is served here)
                    raise refusals.ServiceNotReady(f"topic {topic!r} is moving to this broker")
            except Exception as exc:
                _fail([todo[k][1] for k in keys], exc)
                continue
            by_owner.setdefault(url, []).extend(keys)
        await asyncio.gather(*(self._ask(url, keys, todo) for url, keys in by_owner.items()))

    async def _ask(
        self,
        url: str,
        keys: list[tuple[str, int]],
        todo: dict[tuple[str, int], tuple[tuple[int, int], asyncio.Future[pb.CursorAt]]],
    ) -> None:
        def fill(req: pb.CommandGroupCursors) -> None:
            req.subscription = self.subscription
            req.commit = self.commit
            for topic, index in keys:
                (entry_id, pos_index), _ = todo[(topic, index)]
                req.positions.add(topic=topic, partition=index, entry_id=entry_id, index=pos_index)
            if self.producer is not None:
                req.producer_id, req.producer_epoch, req.transactional_id = self.producer

        what = (
            f"{'commit' if self.commit else 'fetch'} of group {self.subscription!r}'s offsets "
            f"at {url}"
        )
        try:
            assert self.broker.cluster is not None
            resp = await self.broker.cluster.peers.group_cursors(url, fill, what)
            if resp.HasField("error"):
                raise _kafka_refusal(resp.error, f"{what}: {resp.message}")
        except Exception as exc:
            _fail([todo[k][1] for k in keys], exc)
            return
        answers = {(at.topic, at.partition): at for at in resp.positions}
        for key in keys:
            future = todo[key][1]
            at = answers.get(key)
            if future.done():
                continue
            if at is None:
                future.set_exception(_kafka_refusal(pb.SERVICE_NOT_READY, f"{what}: no answer"))
                future.exception()
            elif at.HasField("error"):
                future.set_exception(_kafka_refusal(at.error, at.message))
                future.exception()  # (retrieved: the waiter raises it, if any)
            else:
                future.set_result(at)

    async def every(self, urls: list[str]) -> list[pb.CursorAt]:
        """Every cursor of the group at each broker of ``urls`` (their
        topics'), or a retriable KafkaError if one cannot be read now."""
        assert self.broker.cluster is not None
        peers = self.broker.cluster.peers

        async def at(url: str) -> list[pb.CursorAt]:
            def fill(req: pb.CommandGroupCursors) -> None:
                req.subscription = self.subscription
                req.all = True

            what = f"fetch of all of group {self.subscription!r}'s offsets at {url}"
            try:
                resp = await peers.group_cursors(url, fill, what)
            except Exception as exc:
                raise _as_kafka(exc) from None
            if resp.HasField("error"):
                raise _kafka_refusal(resp.error, f"{what}: {resp.message}")
            return list(resp.positions)

        found = await asyncio.gather(*(at(url) for url in urls))
        return [cursor for cursors in found for cursor in cursors]


_tasks: set[asyncio.Task[None]] = set()  # (forwarding tasks, kept until done)


def _as_kafka(exc: BaseException) -> BaseException:
    """A failure to reach a topic's owner as the Kafka client is told it."""
    if isinstance(exc, KafkaError):
        return exc
    code = wire_code(exc)
    return exc if code is None else _kafka_refusal(code, str(exc))


def _fail(futures: list[asyncio.Future[pb.CursorAt]], exc: BaseException) -> None:
    failure = _as_kafka(exc)
    for future in futures:
        if not future.done():
            future.set_exception(failure)
            future.exception()  # (retrieved: the waiter raises it, if any)
