"""The Kafka listener of a cluster broker: who leads what, who coordinates what.

A broker of a cluster (`broker._cluster.ClusterHost`) records its Kafka
listener's address with its membership (its row's ``urls``:
``cluster.kafka_address``), so every broker's listener knows the others'.
From the last look at the cluster's tables (a third of the lease old at
most) this module answers, for the Kafka handlers:

- **node ids**: a broker's Kafka node id is the crc32 of its Kafka address
  (``host:port``) in 31 bits (`node_id`): the same in every broker's
  answers, and the same across a restart at the same address, as Kafka's
  configured broker ids are. Metadata lists the live brokers that have a
  Kafka listener (this one always);
- **leaders**: a partition's leader is the owner of its topic's slot, its
  leader epoch that slot's epoch (it goes up at every takeover, so a
  client's fencing by leader epoch follows ownership); a slot whose owner is
  not live (a failover under way) or has no Kafka listener has no leader
  (LEADER_NOT_AVAILABLE); the controller is the owner of slot 0 (the one
  that writes the broker-wide records);
- **coordinators**: a group's and a transactional id's coordinator is the
  owner of their slot, ``crc32(id) % slots`` (`broker._slots.slot_of_key`);
  a transactional id's producer ids come from transaction coordinator k of
  that slot. A group or transaction API at a broker that does not hold
  the slot is refused NOT_COORDINATOR, and at the broker that took it but
  has not loaded it yet COORDINATOR_LOAD_IN_PROGRESS (both retriable: the
  clients look the coordinator up again, or wait);
- **transactions across brokers**: a Kafka transaction's partitions and
  group offsets may be on other brokers than its coordinator
  (`coordinator_here`): AddPartitionsToTxn records them at the
  coordinator, and the partition's (the offsets') broker checks each
  transactional Produce (TxnOffsetCommit) with the coordinator over the
  peers' channel before taking it, answering once durable
  (`broker._peers.Peers.register_producer`, KIP-890's verification); the
  END reaches them by the coordinator's remote tells;
- **partitions elsewhere**: a topic whose slot another broker owns is not
  loaded here; Metadata reads its partition count from the slot's topic
  list in the database (`topic_partitions`, kept `TOPICS_FRESH` seconds),
  and a Metadata for every topic reads every other slot's list
  (`other_topics`).
"""

from __future__ import annotations

import json
import time
import zlib
from typing import TYPE_CHECKING

from broker._slots import slot_of_key
from broker.kafka._session import KafkaError
from tc import coordinator_of_producer

if TYPE_CHECKING:
    from broker._broker import Broker
    from broker._cluster import ClusterHost

__all__ = [
    "COORDINATOR_LOAD_IN_PROGRESS",
    "COORDINATOR_NOT_AVAILABLE",
    "LEADER_NOT_AVAILABLE",
    "NOT_COORDINATOR",
    "NOT_LEADER_OR_FOLLOWER",
    "KafkaCluster",
    "node_id",
]

LEADER_NOT_AVAILABLE = 5
NOT_LEADER_OR_FOLLOWER = 6
COORDINATOR_LOAD_IN_PROGRESS = 14
COORDINATOR_NOT_AVAILABLE = 15
NOT_COORDINATOR = 16

TOPICS_FRESH = 1.0  # seconds a slot's topic list read from the database is kept
_TOPIC_LIST = "__meta/topics"

Node = tuple[int, str, int]  # (node id, host, port)


def node_id(address: str) -> int:
    """The Kafka node id of the broker whose Kafka listener is at
    ``address`` (``host:port``): crc32 in 31 bits (non-negative int32)."""
    return zlib.crc32(address.encode()) & 0x7FFFFFFF


def _node(address: str) -> Node:
    host, _, port = address.rpartition(":")
    return node_id(address), host, int(port)


class KafkaCluster:
    """The cluster as one broker's Kafka listener answers it (see the
    module docstring); ``address``: this listener's advertised
    ``host:port``."""

    def __init__(self, broker: Broker, host: ClusterHost, address: str) -> None:
        self.broker = broker
        self.host = host
        self.me = _node(address)
        self._topics: dict[int, tuple[float, dict[str, int]]] = {}  # slot -> (read at, topics)

    @property
    def slots(self) -> int:
        return self.broker.store.slot_count

    def _owner_node(self, slot: int) -> tuple[Node, int] | None:
        """(node, epoch) of the live owner of ``slot`` with a Kafka listener,
        as the last look saw it (this broker once it serves the slot)."""
        host = self.host
        if slot in host.served:
            epoch = host.member.held.get(slot)
            if epoch is not None:
                return self.me, epoch
        view = host.membership.last_view
        if view is None or slot >= len(view.slots):
            return None
        row = view.slots[slot]
        if row.owner is None or row.owner == host.me or not view.is_live(row.owner):
            return None
        address = host.membership.last_kafka.get(row.owner)
        if address is None:
            return None
        return _node(address), row.epoch

    # -- Metadata ---------------------------------------------------------------------

    def brokers(self) -> list[Node]:
        """The live brokers with a Kafka listener, this one first, each node
        once (a broker restarted at its address has a second row until the
        lease of its first runs out: one node)."""
        host = self.host
        out = {self.me[0]: self.me}
        view = host.membership.last_view
        if view is not None:
            for broker in view.live():
                address = host.membership.last_kafka.get(broker)
                if broker != host.me and address is not None:
                    node = _node(address)
                    out.setdefault(node[0], node)
        return list(out.values())

    def leader(self, topic: str) -> tuple[int, int] | None:
        """(leader's node id, leader epoch) of ``topic``'s partitions, or None
        if no live broker serves its slot now."""
        owner = self._owner_node(slot_of_key(topic, self.slots))
        return None if owner is None else (owner[0][0], owner[1])

    def controller(self) -> int:
        """The owner of slot 0 (-1: none now)."""
        owner = self._owner_node(0)
        return -1 if owner is None else owner[0][0]

    def serves(self, topic: str) -> bool:
        return slot_of_key(topic, self.slots) in self.host.served

    async def topic_partitions(self, topic: str) -> int | None:
        """The partition count of ``topic`` (None: no such topic), from the
        topic list of its slot in the database (read again after
        `TOPICS_FRESH` seconds): for a topic of a slot not served here."""
        return (await self._slot_topics(slot_of_key(topic, self.slots))).get(topic)

    async def other_topics(self) -> list[str]:
        """The topics of every slot not served here (as `topic_partitions`
        reads them): Metadata asked for every topic."""
        out: list[str] = []
        for slot in range(self.slots):
            if slot not in self.host.served:
                out.extend(await self._slot_topics(slot))
        return out

    async def _slot_topics(self, slot: int) -> dict[str, int]:
        now = time.monotonic()
        cached = self._topics.get(slot)
        if cached is None or now - cached[0] > TOPICS_FRESH:
            records = [
                *getattr(self.broker.topics, "_legacy", []),
                *(e.data for e in await self.broker.store.read_fresh(f"{_TOPIC_LIST}/{slot}")),
            ]
            cached = (now, _topic_list(records))
            self._topics[slot] = cached
        return cached[1]

    # -- refusals ---------------------------------------------------------------------

    def check_leader(self, topic: str) -> None:
        """NOT_LEADER_OR_FOLLOWER unless this broker serves ``topic``'s slot."""
        slot = slot_of_key(topic, self.slots)
        if slot not in self.host.served:
            raise KafkaError(
                NOT_LEADER_OR_FOLLOWER,
                f"topic {topic!r} is in slot {slot}, which this broker does not serve: "
                "refresh the metadata and ask its leader",
            )

    def check_coordinator(self, key: str, what: str, tcid: bool = False) -> int:
        """The slot of the group or transactional id ``key`` if this broker
        coordinates it now; else NOT_COORDINATOR, or COORDINATOR_LOAD_IN_PROGRESS
        while it loads the slot. With ``tcid``, the slot's transaction
        coordinator must be open too."""
        return self.check_slot(slot_of_key(key, self.slots), f"{what} {key!r}", tcid)

    def check_slot(self, slot: int, what: str, tcid: bool = False) -> int:
        host = self.host
        loaded = slot in host.served and (not tcid or slot in self.broker.coordinators)
        if loaded:
            return slot
        if slot in host.member.held:
            raise KafkaError(
                COORDINATOR_LOAD_IN_PROGRESS,
                f"{what} is in slot {slot}, which this broker is loading; try again",
            )
        raise KafkaError(
            NOT_COORDINATOR,
            f"{what} is in slot {slot}, which this broker does not serve: "
            "find its coordinator again",
        )

    def coordinator_here(
        self,
        producer_id: int,
        what: str,
        loading: int = COORDINATOR_LOAD_IN_PROGRESS,
    ) -> bool:
        """Where the coordinator that issued ``producer_id`` is, for a
        participant ``what`` served here (a partition, a group's offsets):
        True if it runs here, False if on another broker (the participant
        checks with it over the peers' channel, `broker._peers`); refused
        ``loading`` (retriable: by default COORDINATOR_LOAD_IN_PROGRESS)
        while this broker loads its slot."""
        tcid = coordinator_of_producer(producer_id)
        if tcid in self.broker.coordinators:
            return True
        slot = tcid % self.slots
        if slot in self.host.served or slot in self.host.member.held:
            raise KafkaError(
                loading,
                f"the transaction coordinator of {what} (slot {slot}) is loading here; try again",
            )
        return False

    async def fresh_owner(self, slot: int) -> None:
        """Read the cluster's tables again if the last look saw no live owner
        of ``slot`` (a failover under way: as a LOOKUP does, one read shared
        by the requests waiting, `ClusterHost._fresh`)."""
        if slot not in self.host.member.held and self._owner_node(slot) is None:
            await self.host._fresh()

    async def slot_owners(self) -> list[str]:
        """The URLs of the other brokers that own slots now (OffsetFetch of
        all of a group's offsets asks each); COORDINATOR_LOAD_IN_PROGRESS
        (retriable) while a slot has no live owner (the tables are read
        again first): a group's offsets there cannot be read now."""
        host = self.host
        for fresh in (False, True):
            if fresh:
                await host._fresh()
            view = host.membership.last_view
            if view is None:
                continue
            rows = [row for slot, row in enumerate(view.slots) if slot < self.slots]
            if all(row.owner is not None and view.is_live(row.owner) for row in rows):
                owners = {r.owner for r in rows if r.owner is not None and r.owner != host.me}
                urls = [host.membership.last_urls.get(o, "") for o in sorted(owners)]
                if all(urls):
                    return urls
        raise KafkaError(
            COORDINATOR_LOAD_IN_PROGRESS,
            "a slot has no live owner now (being taken over): the group's offsets there "
            "cannot be read yet; try again",
        )

    async def coordinator(self, key: str) -> Node:
        """FindCoordinator: the broker of the slot of the group or
        transactional id ``key`` (this one while it loads it), or
        COORDINATOR_NOT_AVAILABLE while no live broker owns it."""
        slot = slot_of_key(key, self.slots)
        await self.fresh_owner(slot)
        if slot in self.host.member.held:
            return self.me
        owner = self._owner_node(slot)
        if owner is None:
            raise KafkaError(
                COORDINATOR_NOT_AVAILABLE,
                f"{key!r} is in slot {slot}, which no live broker serves now (being taken over)",
            )
        return owner[0]


def _topic_list(records: list[bytes]) -> dict[str, int]:
    """Topic -> partition count, from the records of topic lists
    (`buffer.Topics`' format: later records win, a deletion removes)."""
    out: dict[str, int] = {}
    for data in records:
        record = json.loads(data)
        if record.get("deleted"):
            out.pop(record["topic"], None)
        else:
            out[record["topic"]] = int(record["partitions"])
    return out
