"""Transaction groups: the coordinator's side of an exactly-once sink.

A job writes each task's output in a transaction of its own, tagged with
what the job's batch is (``new_transaction(tag=...)``), makes it durable
and PREPARED (``Transaction.prepare()``), and hands its TxnID to the job's
driver, which commits all of one batch's transactions as one decision
(``commit(group, sequence, txn_ids)``): one record on their coordinator,
idempotent under the key (group, sequence). A batch committed before is
answered as a duplicate and commits nothing again (the transactions of the
replayed attempt are aborted). ``abort_tagged`` aborts what a failed
batch's tasks prepared, by tag, whatever the driver knows of them.

All of a batch's transactions must be on one coordinator: pick it with
``coordinator_for(key)`` from something every task and the driver know (a
query id), as long as the broker's set of coordinators stays the same (in
a cluster it does: the coordinators are its slots, a number fixed when
its database was made).

In a cluster (docs/cluster.md) each request goes to the owner of its
coordinator's slot, and follows it when it moves (`client._brokers`'
``Route``); ``abort_tagged`` asks every slot's coordinator. Until a
transaction may span brokers, a group transaction's topics must be served
by its coordinator's broker: pick the coordinator in the slot of the
topic (``coordinator_near(topic)``).

Each request is a control request: retried across reconnects until the
operation timeout. All are idempotent: PREPARE_TXN of a prepared
transaction, COMMIT_GROUP of a committed key (a duplicate) and
ABORT_TAGGED answer as if done once.
"""

from __future__ import annotations

import asyncio
import math
import zlib
from collections.abc import Iterable
from typing import NamedTuple

from proto import TxnID

from ._brokers import ClientLink, Route, slot_of
from ._connection import Command, Type, command
from ._txn import Transaction
from .errors import InvalidInputError

__all__ = ["GroupResult", "TransactionGroups"]

MAX_TTL_MS = 2**64 - 1


class GroupResult(NamedTuple):
    """COMMIT_GROUP's or ABORT_TAGGED's answer: ``duplicate``, the group
    committed this sequence before (nothing committed now); how many
    transactions this request committed and aborted."""

    duplicate: bool
    committed: int
    aborted: int


def _ms(seconds: float, what: str, zero: bool = False) -> int:
    if (
        isinstance(seconds, bool)
        or not isinstance(seconds, int | float)
        or not math.isfinite(seconds)
        or seconds < 0
        or (seconds == 0 and not zero)
    ):
        raise InvalidInputError(f"{what} must be a positive number of seconds, not {seconds!r}")
    ms = max(1, round(seconds * 1000)) if seconds else 0
    if ms > MAX_TTL_MS:
        raise InvalidInputError(f"{what} {seconds} s is too long")
    return ms


class TransactionGroups:
    """The group requests of one ``Client`` (``TransactionGroups(client)``)."""

    def __init__(self, client: ClientLink) -> None:
        self._client = client
        self._conn = client._conn
        self._brokers = client._brokers
        self._routes: dict[int, Route] = {}  # coordinator -> where its requests go

    def _route(self, tc_id: int) -> Route:
        route = self._routes.get(tc_id)
        if route is None:
            route = self._routes[tc_id] = Route(self._brokers, tc_id=tc_id)
        return route

    async def _coordinators(self) -> list[int]:
        """Every coordinator: the broker's, or in a cluster one per slot."""
        await self._client.connect()
        if self._brokers.cluster:
            return list(range(self._brokers.slots))
        return sorted(self._conn.tc_ids) or [0]

    async def coordinator_for(self, key: str) -> int:
        """The coordinator every holder of ``key`` picks (a stable hash over
        the coordinators the broker serves; in a cluster, over its slots)."""
        if not isinstance(key, str):
            raise InvalidInputError(f"key must be a str, not {type(key).__name__}")
        tc_ids = await self._coordinators()
        return tc_ids[zlib.crc32(key.encode()) % len(tc_ids)]

    async def coordinator_near(self, topic: str) -> int:
        """A coordinator on the broker serving ``topic``: in a cluster, the
        one in the topic's slot (it moves with the topic); on one broker,
        ``coordinator_for(topic)``."""
        if not isinstance(topic, str) or not topic:
            raise InvalidInputError(f"topic must be a non-empty str, not {topic!r}")
        await self._client.connect()
        if self._brokers.cluster:
            return slot_of(topic, self._brokers.slots)
        return await self.coordinator_for(topic)

    async def new_transaction(
        self,
        tag: str,
        *,
        timeout: float = 60.0,
        prepared_timeout: float = 0.0,
        tc_id: int = 0,
    ) -> Transaction:
        """A transaction on coordinator ``tc_id`` that carries ``tag``: it
        is aborted if it is not ended (or prepared) within ``timeout``
        seconds, and, once prepared, if it is not decided within
        ``prepared_timeout`` seconds (0: it waits for ever)."""
        if not isinstance(tag, str) or not tag:
            raise InvalidInputError(f"tag must be a non-empty str, not {tag!r}")
        ttl_ms = _ms(timeout, "timeout")
        prepared_ms = _ms(prepared_timeout, "prepared_timeout", zero=True)
        await self._client.connect()
        route = self._route(tc_id)
        # (Made again after a lost answer: the first one is left to its timeout.)
        reply = await route.request(
            lambda request_id: command(
                Type.NEW_TXN,
                "new_txn",
                request_id=request_id,
                txn_ttl_ms=ttl_ms,
                tc_id=tc_id,
                tag=tag,
                prepared_ttl_ms=prepared_ms,
            ),
            Command.NEW_TXN_RESPONSE,
            f"new transaction tagged {tag!r} on coordinator {tc_id}",
        )
        answer = reply.new_txn_response
        txn_id = TxnID(answer.txnid_most_bits, answer.txnid_least_bits)
        return Transaction(route.conn, txn_id, tc_id, timeout)

    async def commit(
        self,
        group: str,
        sequence: int,
        txn_ids: Iterable[TxnID],
        *,
        abort_tag: str = "",
        tc_id: int | None = None,
    ) -> GroupResult:
        """Commit the PREPARED transactions ``txn_ids`` as one decision
        under the key (``group``, ``sequence``), aborting the undecided
        ones tagged ``abort_tag`` it does not name (see the module
        docstring). ``tc_id``: their coordinator (required when
        ``txn_ids`` is empty)."""
        if not isinstance(group, str) or not group:
            raise InvalidInputError(f"group must be a non-empty str, not {group!r}")
        if type(sequence) is not int or not 0 <= sequence < 2**63:
            raise InvalidInputError(f"sequence must be an int in [0, 2**63), not {sequence!r}")
        ids = [TxnID(*t) for t in txn_ids]
        coordinators = {t.tcid for t in ids} | ({tc_id} if tc_id is not None else set())
        if len(coordinators) != 1:
            raise InvalidInputError(
                "a group's transactions are all on one coordinator; "
                f"got coordinators {sorted(coordinators)}"
            )
        (coordinator,) = coordinators

        def build(request_id: int) -> Command:
            cmd = command(
                Type.COMMIT_GROUP,
                "commit_group",
                request_id=request_id,
                tc_id=coordinator,
                group=group,
                sequence=sequence,
                abort_tag=abort_tag,
            )
            for t in ids:
                cmd.commit_group.txns.add(most_bits=t.most_bits, least_bits=t.least_bits)
            return cmd

        await self._client.connect()
        reply = await self._route(coordinator).request(
            build, Command.TXN_GROUP_RESPONSE, f"commit group {group!r} #{sequence}"
        )
        answer = reply.txn_group_response
        return GroupResult(answer.duplicate, answer.committed, answer.aborted)

    async def abort_tagged(self, tag: str, *, prefix: bool = False) -> int:
        """Abort the undecided (open or prepared) transactions tagged
        ``tag`` (``prefix``: whose tag starts with it) on every coordinator
        (of the broker, or of the cluster: each at its owner, all at once);
        how many there were."""
        if not isinstance(tag, str) or not tag:
            raise InvalidInputError(f"tag must be a non-empty str, not {tag!r}")

        async def abort_on(tc_id: int) -> int:
            reply = await self._route(tc_id).request(
                lambda request_id: command(
                    Type.ABORT_TAGGED,
                    "abort_tagged",
                    request_id=request_id,
                    tc_id=tc_id,
                    tag=tag,
                    prefix=prefix,
                ),
                Command.TXN_GROUP_RESPONSE,
                f"abort transactions tagged {tag!r} on coordinator {tc_id}",
            )
            return int(reply.txn_group_response.aborted)

        counts = await asyncio.gather(*(abort_on(t) for t in await self._coordinators()))
        return sum(counts)
