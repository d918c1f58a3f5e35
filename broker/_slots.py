"""Which slot of a cluster database each of a broker's ledgers belongs to.

A cluster database (the PostgreSQL engine, `ledger._postgres`) has a fixed
number of slots, set when it is first created (64 by default). A slot is
the unit of ownership: one broker owns it at a time, at an epoch, and the
store refuses every write of a broker to a slot it no longer holds
(fencing). Slot k holds:

- the topics whose stable hash falls in k: ``crc32(topic name) % slots``
  (every ledger of the topic: partitions ``p/``, dedup ``d/``, sidecars
  ``x/``, cursors ``c/`` and read-uncommitted cursors ``u/``);
- transaction coordinator k (``tc/{k}``; coordinator ids above the number of
  slots wrap: ``tc/{id}`` is in ``id % slots``);
- the Kafka group-coordinator and transactional-id range k: the groups and
  transactional ids whose ``crc32`` falls in k (their ledgers are the
  subscriptions' and the coordinators', above: nothing more to map yet).

- the topic list of slot k, ``__meta/topics/{k}`` (a cluster: the records
  of the topics of slot k, written by its owner).

The broker-wide ledgers ``__meta/...`` (the topic list of a single broker,
``__meta/topics``; the ACL, ``__meta/acl``; the metrics' counters) are in
slot 0: written only by the owner of slot 0 (docs/cluster.md says how the
other brokers of a cluster read them). A name of any other shape is in no
slot.

The hash is `cluster.slot_of`'s (crc32, stable across processes, machines
and Python versions, unlike ``hash()``), the one the ownership core uses.
"""

from __future__ import annotations

import cluster

__all__ = ["slot_of", "slot_of_key"]

_TOPIC_KINDS = frozenset({"p", "d", "x", "c", "u"})


def slot_of_key(key: str, slots: int) -> int:
    """The slot of a topic, group or transactional id called ``key``
    (`cluster.slot_of`)."""
    return cluster.slot_of(key, slots)


def slot_of(ledger_name: str, slots: int) -> int | None:
    """The slot of the ledger ``ledger_name`` (see the module docstring)."""
    kind, _, rest = ledger_name.partition("/")
    if kind in _TOPIC_KINDS:
        return slot_of_key(rest.partition("/")[0], slots)
    if kind == "tc" and rest.isdigit():
        return int(rest) % slots
    if kind == "__meta":
        head, _, index = rest.partition("/")
        if head == "topics" and index.isdigit():
            return int(index) % slots
        return 0
    return None
