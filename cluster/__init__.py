"""Several brokers, one cluster: membership and slot ownership.

A cluster database holds a fixed number of *slots*; a topic, a coordinator
id, a Kafka transactional id or group belongs to slot ``slot_of(name, S)``.
Each slot has one owning broker and an epoch. This package decides who owns
what and carries it out, and imports nothing else of ours (asyncpg for
the PostgreSQL tables):

- `decide` (`cluster._ownership`): the pure core: one snapshot of the
  tables, what this broker holds -> the actions to take (join, renew, take
  a slot at the epoch seen, release one, leave, drop everything);
- `MembershipStore` (`cluster._store`): the tables as an interface, with
  the PostgreSQL statements an implementation runs; `ModelStore` and
  `ModelConnection`, an in-memory model with the same semantics, the
  ledger engine's per-commit fence included, and `check_history`, which
  checks a model's history for a slot written by two brokers;
- `PostgresMembership` (`cluster._postgres`): `MembershipStore` on
  PostgreSQL (asyncpg), the statements of the docstring, over the tables of
  the schema ``txnbuf`` that the ledger engine creates;
- `Member` (`cluster._member`): the driver loop of one broker, calling a
  `SlotHost` (the broker) to load, unload and drop slots.

docs/scaling.md has the rules, the measurements behind the placement, and
how a cluster grows.
"""

from cluster._member import Member, SlotHost
from cluster._ownership import (
    SLOT_RULES,
    Action,
    DropAll,
    Join,
    LeaseTiming,
    Leave,
    Local,
    Release,
    Renew,
    SlotAction,
    SlotRelation,
    SlotRow,
    Take,
    View,
    decide,
    placement,
    quotas,
    relation,
    score,
    slot_of,
    watch,
)
from cluster._postgres import (
    BrokerRow,
    ClusterTables,
    Move,
    PostgresMembership,
    kafka_address,
    service_url,
)
from cluster._store import (
    Event,
    EventKind,
    MembershipError,
    MembershipStore,
    ModelConnection,
    ModelStore,
    Network,
    Violation,
    check_history,
    direct,
)

__all__ = [
    "SLOT_RULES",
    "Action",
    "BrokerRow",
    "ClusterTables",
    "DropAll",
    "Event",
    "EventKind",
    "Join",
    "LeaseTiming",
    "Leave",
    "Local",
    "Member",
    "MembershipError",
    "MembershipStore",
    "ModelConnection",
    "ModelStore",
    "Move",
    "Network",
    "PostgresMembership",
    "Release",
    "Renew",
    "SlotAction",
    "SlotHost",
    "SlotRelation",
    "SlotRow",
    "Take",
    "View",
    "Violation",
    "check_history",
    "decide",
    "direct",
    "kafka_address",
    "placement",
    "quotas",
    "relation",
    "score",
    "service_url",
    "slot_of",
    "watch",
]
