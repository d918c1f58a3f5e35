"""Kafka's admin APIs, on the state the broker's admin API shows.

Every one needs a superuser (`KafkaSession.allow_admin`): a refusal is the
authorization code of the resource the API names (TOPIC_, GROUP_,
TRANSACTIONAL_ID_ or CLUSTER_AUTHORIZATION_FAILED) and changes nothing.

- Topics: CreateTopics, DeleteTopics, CreatePartitions do what
  ``PUT``/``DELETE /admin/v1/topics/{topic}`` do. A topic's settings are
  its partitions (Metadata) and its retention, which Kafka calls
  ``retention.ms`` and ``retention.bytes`` (-1: no limit; txnbuf's default,
  0, trims acknowledged messages at once: `buffer.Retention`); CreateTopics
  takes those two configs and refuses any other (INVALID_CONFIG), since
  txnbuf has no such setting to apply. One broker: a replication factor is
  -1 or 1, a replica assignment names broker 0. DeleteTopics is refused
  (INVALID_REQUEST, saying why) while the topic is in use as the admin API
  refuses it without ``force``: txnbuf producers or consumers connected, or
  a transaction not ended holding it.
- DescribeConfigs: a topic's two retention configs; the broker's
  (resource name "0" or "") ``num.partitions`` (what a topic Metadata
  creates gets), ``auto.create.topics.enable``, and the transaction
  settings of `txnbuf serve` (``transaction.max.timeout.ms``,
  ``transactional.id.expiration.ms``).
- Groups: a group is the txnbuf subscription of its name (on each topic it
  has one: `broker.kafka._handlers`) and, while Kafka consumers are in it,
  its membership (`broker.kafka._groups`). ListGroups lists both (a
  subscription without Kafka members is an ``Empty`` group with no
  protocol type); DescribeGroups shows the members; DeleteGroups deletes
  the group's subscription on every topic, refused (NON_EMPTY_GROUP,
  nothing deleted) while Kafka members are in it or the admin API would
  refuse one of those deletions. OffsetDelete deletes the group's
  committed offsets of a topic, which are one subscription over all its
  partitions: the request must name every partition of the topic (else
  INVALID_REQUEST), and a group whose members subscribe to the topic
  refuses it (GROUP_SUBSCRIBED_TO_TOPIC).
- DescribeCluster: this broker, node 0.

The transaction admin APIs (ListTransactions, DescribeTransactions,
DescribeProducers) are `broker.kafka._txn_admin`'s.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from broker._broker import Broker
from broker._operations import (
    AdminError,
    check_not_in_use,
    delete_subscription,
    delete_topic,
)
from broker.kafka._cluster import KafkaCluster
from broker.kafka._codec import CLUSTER_ID, NODE_ID, Api
from broker.kafka._common import Handler, Response, group_subscription
from broker.kafka._groups import Groups, subscribed_topics
from broker.kafka._session import (
    CLUSTER_AUTHORIZATION_FAILED,
    GROUP_AUTHORIZATION_FAILED,
    TOPIC_AUTHORIZATION_FAILED,
    KafkaError,
    KafkaSession,
)
from buffer import (
    MAX_PARTITIONS,
    NO_RETENTION,
    InvalidNameError,
    PartitionCountError,
    Retention,
    check_topic_name,
    quoted,
)

__all__ = ["KafkaAdmin"]

# Kafka error codes the admin APIs answer with.
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
NON_EMPTY_GROUP = 68
GROUP_ID_NOT_FOUND = 69
GROUP_SUBSCRIBED_TO_TOPIC = 86
UNKNOWN_TOPIC_ID = 100

NO_OPERATIONS = -(2**31)  # authorized operations: not asked for
RESOURCE_TOPIC = 2
RESOURCE_BROKER = 4
# DescribeConfigs: config sources and types (Kafka's numbers)
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5
TYPE_BOOLEAN = 1
TYPE_INT = 3
TYPE_LONG = 5

_RETENTION_DOCS = {
    "retention.ms": "acknowledged messages older than this are trimmed (-1: no limit; "
    "0: at once, txnbuf's default); unacknowledged ones are always kept",
    "retention.bytes": "acknowledged messages beyond the newest this many bytes are trimmed "
    "(-1: no limit; 0: at once, txnbuf's default)",
}


class Apis(Protocol):
    """What the admin APIs use of the listener's `broker.kafka._handlers.KafkaApis`
    (which imports this module: named here, not imported back)."""

    @property
    def broker(self) -> Broker: ...

    @property
    def groups(self) -> Groups: ...

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def cluster(self) -> KafkaCluster | None: ...


class KafkaAdmin:
    """The admin API handlers of one listener (`handlers` for its table)."""

    def __init__(self, apis: Apis) -> None:
        self.apis = apis
        self.broker = apis.broker
        # (CreateTopics checks that a topic does not exist, then creates it:
        # one at a time, or two could make, or grow, the same one)
        self._creating = asyncio.Lock()

    def handlers(self) -> dict[int, Handler]:
        return {
            Api.CREATE_TOPICS: self.create_topics,
            Api.DELETE_TOPICS: self.delete_topics,
            Api.CREATE_PARTITIONS: self.create_partitions,
            Api.DESCRIBE_CONFIGS: self.describe_configs,
            Api.LIST_GROUPS: self.list_groups,
            Api.DESCRIBE_GROUPS: self.describe_groups,
            Api.DELETE_GROUPS: self.delete_groups,
            Api.OFFSET_DELETE: self.offset_delete,
            Api.DESCRIBE_CLUSTER: self.describe_cluster,
        }

    # -- topics ----------------------------------------------------------------------

    async def create_topics(self, req: Any, version: int, session: KafkaSession) -> Response:
        names = [t.name for t in req.topics]
        results = []
        for t in req.topics:
            out: Response = {
                "name": t.name,
                "topic_id": None,
                "error_code": 0,
                "error_message": None,
                "topic_config_error_code": 0,
                "num_partitions": -1,
                "replication_factor": -1,
                "configs": [],
            }
            try:
                session.allow_admin(TOPIC_AUTHORIZATION_FAILED)
                self._topic_here(t.name)
                if names.count(t.name) > 1:
                    raise KafkaError(INVALID_REQUEST, f"topic {t.name!r} is named twice")
                partitions, retention = self._new_topic(t)
                async with self._creating:
                    if self.broker.topics.partition_count(t.name) is not None:
                        raise KafkaError(TOPIC_ALREADY_EXISTS, f"topic {t.name!r} exists already")
                    if not req.validate_only:
                        topic = await self.broker.topics.create(t.name, partitions)
                        if retention != NO_RETENTION:
                            await self.broker.topics.set_retention(t.name, retention)
                        await self.broker.subscriptions.extend(topic)
                out.update(
                    num_partitions=partitions,
                    replication_factor=1,
                    configs=[
                        {
                            "name": c["name"],
                            "value": c["value"],
                            "read_only": False,
                            "config_source": c["config_source"],
                            "is_sensitive": False,
                        }
                        for c in _retention_configs(retention, None, False)
                    ],
                )
            except KafkaError as exc:
                out.update(error_code=exc.code, error_message=str(exc))
            results.append(out)
        return {"throttle_time": 0, "topics": results}

    @staticmethod
    def _new_topic(t: Any) -> tuple[int, Retention]:
        """(partitions, retention) of a CreateTopics topic; KafkaError if
        txnbuf cannot make it as asked."""
        try:
            check_topic_name(t.name)
        except InvalidNameError as exc:
            raise KafkaError(INVALID_TOPIC, str(exc)) from None
        if t.replication_factor not in (-1, 1):
            raise KafkaError(
                INVALID_REPLICATION_FACTOR,
                f"replication factor {t.replication_factor}: this cluster is one broker (-1 or 1)",
            )
        partitions = t.num_partitions
        if t.assignments:
            if partitions != -1:
                raise KafkaError(
                    INVALID_REQUEST, "give either the number of partitions or their assignment"
                )
            if sorted(a.partition_index for a in t.assignments) != list(
                range(len(t.assignments))
            ) or any(tuple(a.broker_ids) != (0,) for a in t.assignments):
                raise KafkaError(
                    INVALID_REPLICA_ASSIGNMENT,
                    "an assignment must give partitions 0..n-1 each to broker 0 (the only one)",
                )
            partitions = len(t.assignments)
        if partitions == -1:
            partitions = 1  # (num.partitions)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise KafkaError(
                INVALID_PARTITIONS, f"partitions must be 1 to {MAX_PARTITIONS}, not {partitions}"
            )
        limits: dict[str, float] = {}
        for config in t.configs:
            if config.name not in ("retention.ms", "retention.bytes"):
                raise KafkaError(
                    INVALID_CONFIG,
                    f"config {quoted(config.name)}: txnbuf keeps no such topic setting (it "
                    "takes retention.ms and retention.bytes)",
                )
            limits[config.name] = _limit(config.name, config.value)
        retention = NO_RETENTION
        if limits:
            ms = limits.get("retention.ms", -1)
            retention = Retention(
                time_s=ms if ms == -1 else ms / 1000,
                size_bytes=int(limits.get("retention.bytes", -1)),
            )
        return partitions, retention

    async def delete_topics(self, req: Any, version: int, session: KafkaSession) -> Response:
        if version >= 6:
            wanted = [(t.name, t.topic_id) for t in req.topics]
        else:
            wanted = [(name, None) for name in req.topic_names]
        responses = []
        for name, topic_id in wanted:
            out: Response = {
                "name": name,
                "topic_id": topic_id,
                "error_code": 0,
                "error_message": None,
            }
            try:
                session.allow_admin(TOPIC_AUTHORIZATION_FAILED)
                if name is None:
                    raise KafkaError(UNKNOWN_TOPIC_ID, "topics are named here, not numbered")
                self._topic_here(name)
                await delete_topic(self.broker, name, force=False)
            except KafkaError as exc:
                out.update(error_code=exc.code, error_message=str(exc))
            except AdminError as exc:
                code = UNKNOWN_TOPIC_OR_PARTITION if exc.status == 404 else INVALID_REQUEST
                out.update(error_code=code, error_message=_admin_text(exc))
            responses.append(out)
        return {"throttle_time": 0, "responses": responses}

    async def create_partitions(self, req: Any, version: int, session: KafkaSession) -> Response:
        results = []
        for t in req.topics:
            out: Response = {"name": t.name, "error_code": 0, "error_message": None}
            try:
                session.allow_admin(TOPIC_AUTHORIZATION_FAILED)
                self._topic_here(t.name)
                have = self.broker.topics.partition_count(t.name)
                if have is None:
                    raise KafkaError(UNKNOWN_TOPIC_OR_PARTITION, f"no topic {t.name!r}")
                if t.count <= have:
                    raise KafkaError(
                        INVALID_PARTITIONS,
                        f"topic {t.name!r} has {have} partitions; the count can only grow",
                    )
                if t.count > MAX_PARTITIONS:
                    raise KafkaError(
                        INVALID_PARTITIONS, f"a topic has at most {MAX_PARTITIONS} partitions"
                    )
                if t.assignments is not None and any(
                    tuple(a.broker_ids) != (0,) for a in t.assignments
                ):
                    raise KafkaError(
                        INVALID_REPLICA_ASSIGNMENT, "every partition is on broker 0 (the only one)"
                    )
                if not req.validate_only:
                    topic = await self.broker.topics.create(t.name, t.count)
                    await self.broker.subscriptions.extend(topic)
            except KafkaError as exc:
                out.update(error_code=exc.code, error_message=str(exc))
            except PartitionCountError as exc:
                out.update(error_code=INVALID_PARTITIONS, error_message=str(exc))
            results.append(out)
        return {"throttle_time": 0, "results": results}

    async def describe_configs(self, req: Any, version: int, session: KafkaSession) -> Response:
        results = []
        docs = bool(getattr(req, "include_documentation", False))
        for r in req.resources:
            out: Response = {
                "error_code": 0,
                "error_message": None,
                "resource_type": r.resource_type,
                "resource_name": r.resource_name,
                "configs": [],
            }
            keys = None if r.configuration_keys is None else set(r.configuration_keys)
            try:
                if r.resource_type == RESOURCE_TOPIC:
                    session.allow_admin(TOPIC_AUTHORIZATION_FAILED)
                    self._topic_here(r.resource_name)
                    topic = await self.broker.topics.load_topic(r.resource_name)
                    if topic is None:
                        raise KafkaError(
                            UNKNOWN_TOPIC_OR_PARTITION, f"no topic {r.resource_name!r}"
                        )
                    configs = _retention_configs(topic.retention, keys, docs)
                elif r.resource_type == RESOURCE_BROKER:
                    session.allow_admin(CLUSTER_AUTHORIZATION_FAILED)
                    if r.resource_name not in ("", "0"):
                        raise KafkaError(
                            INVALID_REQUEST, f"no broker {r.resource_name!r} (this one is 0)"
                        )
                    configs = self._broker_configs(keys, docs)
                else:
                    raise KafkaError(
                        INVALID_REQUEST,
                        f"txnbuf keeps configs of topics (2) and brokers (4), not of resource "
                        f"type {r.resource_type}",
                    )
            except KafkaError as exc:
                out.update(error_code=exc.code, error_message=str(exc))
            else:
                out["configs"] = configs
            results.append(out)
        return {"throttle_time": 0, "results": results}

    def _broker_configs(self, keys: set[str] | None, docs: bool) -> list[Response]:
        settings = next(iter(self.broker.coordinators.values())).settings
        entries = [
            ("num.partitions", "1", TYPE_INT, "partitions of a topic Metadata creates"),
            ("auto.create.topics.enable", "true", TYPE_BOOLEAN, "Metadata creates topics"),
            (
                "transaction.max.timeout.ms",
                str(settings.max_txn_timeout_ms),
                TYPE_INT,
                "the longest transaction timeout a producer may ask for",
            ),
            (
                "transactional.id.expiration.ms",
                str(settings.expiration_ms),
                TYPE_INT,
                "a transactional id idle this long is forgotten",
            ),
        ]
        return [
            _config(
                name, value, kind, SOURCE_STATIC_BROKER, read_only=True, doc=doc if docs else None
            )
            for name, value, kind, doc in entries
            if keys is None or name in keys
        ]

    # -- groups ----------------------------------------------------------------------

    def _subscribed_topics(self, group: str) -> list[str]:
        """The topics on which ``group`` has a subscription (loaded or not)."""
        topics = set()
        for ledger in self.broker.store.ledger_names("c/"):
            _, topic, _, name = ledger.split("/", 3)
            if name == group:
                topics.add(topic)
        return sorted(topics)

    def _topic_here(self, name: str) -> None:
        """A cluster's: the topic admin APIs are served for the topics of
        this broker's slots only (INVALID_REQUEST, saying where, for the
        others: asking this broker again would not help)."""
        cluster = self.apis.cluster
        if cluster is not None and not cluster.serves(name):
            raise KafkaError(
                INVALID_REQUEST,
                f"topic {name!r} is in a slot this broker does not serve: manage it at the "
                "owner of its slot (txnbuf's admin API at any broker forwards there)",
            )

    def _check_coordinator(self, group_id: str) -> None:
        """A cluster's: NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS
        unless this broker coordinates ``group_id`` (`broker.kafka._cluster`)."""
        if self.apis.cluster is not None:
            self.apis.cluster.check_coordinator(group_id, "group")

    def _all_groups(self) -> dict[str, str]:
        """Every group: its name -> the name of a topic it has a
        subscription on ("" for a Kafka group with none yet). A cluster's
        broker: the groups it coordinates (those of its slots), as each
        Kafka broker lists its own."""
        found: dict[str, str] = {}
        for ledger in self.broker.store.ledger_names("c/"):
            _, topic, _, name = ledger.split("/", 3)
            found.setdefault(name, topic)
        for group_id in self.apis.groups.group_ids():
            found.setdefault(group_id, "")
        cluster = self.apis.cluster
        if cluster is not None:
            found = {g: t for g, t in found.items() if cluster.serves(g)}
        return found

    async def list_groups(self, req: Any, version: int, session: KafkaSession) -> Response:
        try:
            session.allow_admin(CLUSTER_AUTHORIZATION_FAILED)
        except KafkaError as exc:
            return {"throttle_time": 0, "error_code": exc.code, "groups": []}
        states = {s.lower() for s in getattr(req, "states_filter", ())}
        types = {t.lower() for t in getattr(req, "types_filter", ())}
        groups = []
        for group_id in sorted(self._all_groups()):
            info = self.apis.groups.describe(group_id)
            state = "Empty" if info is None else info.state
            if states and state.lower() not in states:
                continue
            if types and "classic" not in types:
                continue
            groups.append(
                {
                    "group_id": group_id,
                    "protocol_type": "" if info is None else info.protocol_type,
                    "group_state": state,
                    "group_type": "classic",
                }
            )
        return {"throttle_time": 0, "error_code": 0, "groups": groups}

    async def describe_groups(self, req: Any, version: int, session: KafkaSession) -> Response:
        groups = []
        for group_id in req.groups:
            out: Response = {
                "error_code": 0,
                "error_message": None,
                "group_id": group_id,
                "group_state": "Dead",
                "protocol_type": "",
                "protocol_data": "",
                "members": [],
                "authorized_operations": NO_OPERATIONS,
            }
            try:
                session.allow_admin(GROUP_AUTHORIZATION_FAILED)
                group_subscription(group_id)
                self._check_coordinator(group_id)
                info = self.apis.groups.describe(group_id)
                if info is not None:
                    out.update(
                        group_state=info.state,
                        protocol_type=info.protocol_type,
                        protocol_data=info.protocol if info.members else "",
                        members=[
                            {
                                "member_id": m.member_id,
                                "group_instance_id": m.group_instance_id,
                                "client_id": m.client_id,
                                "client_host": m.client_host,
                                "member_metadata": meta,
                                "member_assignment": assignment,
                            }
                            for m, meta, assignment in info.members
                        ],
                    )
                elif self._subscribed_topics(group_id):
                    out["group_state"] = "Empty"
                elif version >= 6:
                    raise KafkaError(GROUP_ID_NOT_FOUND, f"no group {group_id!r}")
            except KafkaError as exc:
                out.update(error_code=exc.code, error_message=str(exc))
            groups.append(out)
        return {"throttle_time": 0, "groups": groups}

    async def delete_groups(self, req: Any, version: int, session: KafkaSession) -> Response:
        results = []
        for group_id in req.groups_names:
            try:
                session.allow_admin(GROUP_AUTHORIZATION_FAILED)
                group_subscription(group_id)
                self._check_coordinator(group_id)
                await self._delete_group(group_id)
                code = 0
            except KafkaError as exc:
                code = exc.code
            results.append({"group_id": group_id, "error_code": code})
        return {"throttle_time": 0, "results": results}

    async def _delete_group(self, group_id: str) -> None:
        info = self.apis.groups.describe(group_id)
        if info is not None and info.members:
            raise KafkaError(NON_EMPTY_GROUP, f"group {group_id!r} has members")
        topics = self._subscribed_topics(group_id)
        if not topics and info is None:
            raise KafkaError(GROUP_ID_NOT_FOUND, f"no group {group_id!r}")
        for topic in topics:  # (checked on every topic before any deletion)
            await self.broker.topics.load_topic(topic)
            try:
                check_not_in_use(
                    self.broker, topic, group_id, f"subscription {group_id!r} of {topic!r}"
                )
            except AdminError as exc:
                raise KafkaError(NON_EMPTY_GROUP, _admin_text(exc)) from None
        for topic in topics:
            try:
                await delete_subscription(self.broker, topic, group_id, force=False)
            except AdminError as exc:
                if exc.status != 404:
                    raise KafkaError(NON_EMPTY_GROUP, _admin_text(exc)) from None
        self.apis.groups.forget(group_id)

    async def offset_delete(self, req: Any, version: int, session: KafkaSession) -> Response:
        def answer(error: int, codes: dict[str, int]) -> Response:
            return {
                "error_code": error,
                "throttle_time": 0,
                "topics": [
                    {
                        "name": t.name,
                        "partitions": [
                            {"partition_index": p.partition_index, "error_code": codes[t.name]}
                            for p in t.partitions
                        ],
                    }
                    for t in req.topics
                ],
            }

        group_id = req.group_id
        try:
            session.allow_admin(GROUP_AUTHORIZATION_FAILED)
            group_subscription(group_id)
            self._check_coordinator(group_id)
        except KafkaError as exc:
            return answer(exc.code, {t.name: 0 for t in req.topics})
        info = self.apis.groups.describe(group_id)
        in_use: set[str] = set()
        if info is not None:
            for _, meta, _ in info.members:
                try:
                    in_use.update(subscribed_topics(meta))
                except ValueError:
                    pass
        if info is None and not self._subscribed_topics(group_id):
            return answer(GROUP_ID_NOT_FOUND, {t.name: 0 for t in req.topics})
        codes: dict[str, int] = {}
        for t in req.topics:
            codes[t.name] = await self._delete_offsets(group_id, t, in_use)
        return answer(0, codes)

    async def _delete_offsets(self, group_id: str, t: Any, in_use: set[str]) -> int:
        """Delete ``group_id``'s offsets on topic ``t`` (every partition);
        the code answering its partitions."""
        if t.name in in_use:
            return GROUP_SUBSCRIBED_TO_TOPIC
        topic = await self.broker.topics.load_topic(t.name)
        if topic is None:
            return UNKNOWN_TOPIC_OR_PARTITION
        if sorted(p.partition_index for p in t.partitions) != list(range(len(topic.partitions))):
            return INVALID_REQUEST  # (a group's offsets on a topic are one subscription)
        if group_id not in self.broker.subscriptions.of_topic(t.name):
            return 0
        try:
            await delete_subscription(self.broker, t.name, group_id, force=False)
        except AdminError as exc:
            return 0 if exc.status == 404 else GROUP_SUBSCRIBED_TO_TOPIC
        return 0

    # -- the cluster --------------------------------------------------------------------

    def describe_cluster(self, req: Any, version: int, session: KafkaSession) -> Response:
        """This broker; a cluster's: its live brokers and controller, as
        Metadata names them (`broker.kafka._cluster`)."""
        cluster = self.apis.cluster
        nodes = (
            [(NODE_ID, self.apis.host, self.apis.port)] if cluster is None else cluster.brokers()
        )
        out: Response = {
            "throttle_time": 0,
            "error_code": 0,
            "error_message": None,
            "endpoint_type": getattr(req, "endpoint_type", 1),
            "cluster_id": CLUSTER_ID,
            "controller_id": NODE_ID if cluster is None else cluster.controller(),
            "brokers": [
                {"broker_id": node, "host": host, "port": port, "rack": None, "is_fenced": False}
                for node, host, port in nodes
            ],
            "cluster_authorized_operations": NO_OPERATIONS,
        }
        try:
            session.allow_admin(CLUSTER_AUTHORIZATION_FAILED)
        except KafkaError as exc:
            out.update(error_code=exc.code, error_message=str(exc), brokers=[])
        return out


def _admin_text(exc: AdminError) -> str:
    """An admin refusal's message, without what the HTTP route offers."""
    return str(exc).split("; add ?force=true")[0]


def _limit(name: str, value: str | None) -> float:
    try:
        number = int(value or "")
    except ValueError:
        number = -2
    if number < -1:
        raise KafkaError(
            INVALID_CONFIG, f"{name} must be a whole number >= 0, or -1, not {quoted(value)}"
        )
    return number


def _config(
    name: str,
    value: str,
    kind: int,
    source: int,
    read_only: bool = False,
    doc: str | None = None,
) -> Response:
    return {
        "name": name,
        "value": value,
        "read_only": read_only,
        "config_source": source,
        "is_sensitive": False,
        "synonyms": [],
        "config_type": kind,
        "documentation": doc,
        "is_default": source == SOURCE_DEFAULT,
    }


def _retention_configs(retention: Retention, keys: set[str] | None, docs: bool) -> list[Response]:
    source = SOURCE_DEFAULT if retention == NO_RETENTION else SOURCE_TOPIC
    time_ms = retention.time_s if retention.time_s == -1 else round(retention.time_s * 1000)
    values = {"retention.ms": str(int(time_ms)), "retention.bytes": str(retention.size_bytes)}
    return [
        _config(name, value, TYPE_LONG, source, doc=_RETENTION_DOCS[name] if docs else None)
        for name, value in values.items()
        if keys is None or name in keys
    ]
