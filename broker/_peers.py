"""A cluster broker's requests to the other brokers: transactions across
brokers (docs/cluster.md, "Transactions across brokers").

Two requests go from broker to broker, over the brokers' own protocol, on
connections of the `cluster` role (`Peers.token`, signed with the
cluster's secret, docs/security.md):

- **A coordinator tells a participant on another broker**
  (`Peers.end_on_partition`, `Peers.end_on_subscription`):
  END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION to the owner of the
  participant's slot, carrying what the participant needs (`tc.TxnEnd`:
  the outcome, the producer and its epoch, the coordinator's boot epoch)
  and the coordinator's slot epoch. `tc.ParticipantChannel` calls it only
  once the decision is durable. It is tried until that owner answers done:
  the owner is looked up again from the cluster tables at each try (read
  again when the last look names nobody live), and a refusal NOT_OWNER, a
  connection lost or a broker not answering is never taken as done. If
  the slot has come to this broker meanwhile, the decision is applied
  here. Any other refusal is raised: the channel lists the participant as
  stuck and tries again, backing off.
- **A participant checks with a coordinator on another broker**
  (`Peers.register`): before a broker takes the first transactional SEND
  (or ACK) of a transaction on one of its partitions (subscriptions) whose
  coordinator is elsewhere, it sends ADD_PARTITION_TO_TXN
  (ADD_SUBSCRIPTION_TO_TXN) with ``from_participant`` to the coordinator's
  owner, which refuses a transaction not OPEN and otherwise logs the
  registration (so its recovery still knows whom to tell) and answers
  once durable. A yes is cached per transaction and participant until the
  transaction ends there.

A third goes from a Kafka group's coordinator to a topic's owner
(`Peers.group_cursors`): GROUP_CURSORS commits or fetches the group's
offsets, the cursors of its subscription there (`broker._group_cursors`).
It is tried once, at the owner the last look names (the tables read again
if it names none live): a failure is the Kafka client's to retry.

Connections are made on first use, one per broker URL, and closed when a
broker stops answering (the next try looks the owner up again).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Callable
from typing import Protocol

import jwt

from broker._auth import CLUSTER_ISSUER, CLUSTER_METHOD
from broker._broker import Broker
from broker._slots import slot_of_key
from client._connection import Command, Connection
from client.errors import (
    ConnectionLostError,
    NotOwnerError,
    OperationTimeoutError,
    TxnbufError,
)
from proto import refusals
from proto import txnbuf_pb2 as pb
from tc import TxnEnd, TxnID, coordinator_of_producer, wire_txnid

__all__ = ["Peers", "cluster_token"]

log = logging.getLogger(__name__)

REQUEST_TIMEOUT = 5.0  # seconds one try at a broker may take
RETRY_MIN, RETRY_MAX = 0.05, 1.0  # seconds between tries after a move or a lost broker
REGISTERED_KEPT = 100_000  # (transaction, participant) checks remembered, newest kept

T = pb.BaseCommand


def _as_refusal(exc: TxnbufError) -> Exception:
    """A peer's refusal (raised by the client library) as this broker's own
    refusal of the same wire code, for the answer to its client; a failure
    of the client's own (no wire code) as SERVICE_NOT_READY (retriable)."""
    code = exc.code
    for cls in _REFUSALS:
        if cls.code == code:
            return cls(str(exc))
    return refusals.ServiceNotReady(f"{exc}")


_REFUSALS: list[type[refusals.Refusal]] = [
    c
    for c in vars(refusals).values()
    if isinstance(c, type) and issubclass(c, refusals.Refusal) and "code" in vars(c)
]


def _reason(exc: Exception) -> str:
    """The label of a peer's failure in the metrics: ``not_owner``,
    ``unreachable`` (no connection, or it was lost), ``timeout`` (no answer
    within `REQUEST_TIMEOUT`), or the refusal's wire code in lower case
    (``not_allowed``: a participant refused a stale coordinator's END;
    ``transaction_not_found``, ``invalid_txn_status``, ...)."""
    if isinstance(exc, (NotOwnerError, refusals.NotOwner)):
        return "not_owner"
    if isinstance(exc, ConnectionLostError):
        return "unreachable"
    if isinstance(exc, OperationTimeoutError):
        return "timeout"
    code = getattr(exc, "code", None)
    if isinstance(code, int) and code in pb.ServerError.values():
        return pb.ServerError.Name(code).lower()
    return "other"


def cluster_token(secret: str, who: str) -> str:
    """The token a cluster's broker presents to the others (role ``cluster``)."""
    claims = {"sub": "cluster", "iss": CLUSTER_ISSUER, "broker": who, "iat": int(time.time())}
    return jwt.encode(claims, secret, algorithm="HS256")


# A transient failure at a peer: look its owner up again and try again.
_MOVED = (NotOwnerError, ConnectionLostError, OperationTimeoutError)


class Host(Protocol):
    """What `Peers` needs of its broker's cluster host (`broker._cluster.ClusterHost`)."""

    broker: Broker
    me: str

    async def fresh_view(self) -> None:
        """Read the cluster tables again (one read at a time, rate-limited)."""

    def owner_seen(self, slot: int, what: str) -> str:
        """The empty string if ``slot`` is served here, else its owner's URL as the last
        look saw it; `refusals.NotOwner` if it saw no live owner."""


class Peers:
    """The connections of one cluster broker to the others (see the module
    docstring)."""

    def __init__(self, host: Host, secret: str, tls_ca: ssl.SSLContext | None = None) -> None:
        """``tls_ca``: what to trust at brokers served over https
        (``--cluster-tls-ca``; None: the system's CAs)."""
        self.host = host
        self._tls_ca = tls_ca
        self.token = cluster_token(secret, host.me)
        self._conns: dict[str, Connection] = {}
        self._ids = 0
        # (txnid, participant) -> the coordinator's yes, for transactions
        # whose coordinator is elsewhere (newest last).
        self._registered: collections.OrderedDict[tuple[TxnID, str], None] = (
            collections.OrderedDict()
        )
        self._registering: dict[tuple[TxnID, str], asyncio.Future[None]] = {}
        # The producer-epoch mode's checks: (producer id, epoch, participant)
        # -> the producer's transaction, and back (dropped with its END).
        self._producer_txns: dict[tuple[int, int, str], tuple[TxnID, str]] = {}
        self._producer_keys: dict[tuple[TxnID, str], tuple[int, int, str]] = {}
        self._producer_checking: dict[tuple[int, int, str], asyncio.Future[tuple[TxnID, str]]] = {}
        # Figures since start, for /metrics (`broker._metrics`, "the peers"):
        self.tells = 0  # remote tells answered done
        # tries of a tell not done, to be tried again: reason -> count
        self.tell_retries: collections.Counter[str] = collections.Counter()
        # tells given up and handed back to the coordinator's channel (it
        # lists the participant as stuck and tries again): reason -> count
        self.tell_failures: collections.Counter[str] = collections.Counter()
        self.checks = 0  # checks asked of a coordinator elsewhere (one each, however many tries)
        self.check_retries: collections.Counter[str] = collections.Counter()
        # checks answered no (or not at all in time): reason -> count
        self.check_refusals: collections.Counter[str] = collections.Counter()

    async def close(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for conn in conns:
            await conn.close()

    # -- connections ----------------------------------------------------------------

    def _connection(self, url: str) -> Connection:
        conn = self._conns.get(url)
        if conn is None or conn.closed:
            self._ids += 1
            conn = Connection(
                url,
                REQUEST_TIMEOUT,
                self.token,
                self._tls_ca,
                id_base=self._ids << 40,
                auth_method=CLUSTER_METHOD,
            )
            self._conns[url] = conn
        return conn

    async def _forget(self, url: str) -> None:
        conn = self._conns.pop(url, None)
        if conn is not None:
            await conn.close()

    async def _request(
        self,
        url: str,
        build: Callable[[int], Command],
        what: str,
        expect: pb.BaseCommand.Type = Command.TXN_RESPONSE,
    ) -> Command:
        conn = self._connection(url)
        try:
            await conn.start()
        except TxnbufError as exc:
            await self._forget(url)
            hint = (
                " (the CA of the brokers' certificates: --cluster-tls-ca)"
                if ("certificate" in str(exc))
                else ""
            )
            raise ConnectionLostError(f"{what}: {url} cannot be reached: {exc}{hint}") from exc
        try:
            return await conn.request(build, expect, what, link_bound=False)
        except (ConnectionLostError, OperationTimeoutError):
            await self._forget(url)
            raise

    async def _owner(self, slot: int, what: str, fresh: bool) -> str:
        """The URL of ``slot``'s owner ("" if this broker serves it)."""
        if fresh:
            await self.host.fresh_view()
        return self.host.owner_seen(slot, what)

    # -- a coordinator telling a participant elsewhere ------------------------------

    async def end_on_partition(self, topic: str, partition: int, end: TxnEnd) -> None:
        def build(request_id: int) -> Command:
            cmd = Command(type=T.END_TXN_ON_PARTITION)
            req = cmd.end_txn_on_partition
            req.request_id = request_id
            req.partition.topic, req.partition.partition = topic, partition
            self._fill(req, end)
            return cmd

        await self._tell(
            topic,
            f"end {end.txnid} on partition {topic}/{partition}",
            build,
            lambda: self.host.broker.end_locally_on_partition(topic, partition, end),
        )

    async def end_on_subscription(self, topic: str, subscription: str, end: TxnEnd) -> None:
        def build(request_id: int) -> Command:
            cmd = Command(type=T.END_TXN_ON_SUBSCRIPTION)
            req = cmd.end_txn_on_subscription
            req.request_id = request_id
            req.subscription.topic, req.subscription.subscription = topic, subscription
            self._fill(req, end)
            return cmd

        await self._tell(
            topic,
            f"end {end.txnid} on subscription {topic}/{subscription}",
            build,
            lambda: self.host.broker.end_locally_on_subscription(topic, subscription, end),
        )

    def _fill(
        self, req: pb.CommandEndTxnOnPartition | pb.CommandEndTxnOnSubscription, end: TxnEnd
    ) -> None:
        req.txnid_most_bits, req.txnid_least_bits = end.txnid
        req.txn_action = pb.COMMIT if end.commit else pb.ABORT
        store = self.host.broker.store
        req.coordinator_slot_epoch = store.slot_epoch(end.txnid.tcid % store.slot_count) or 0
        req.coordinator_epoch = end.coordinator_epoch
        if end.producer is not None:
            req.producer_id, req.producer_epoch = end.producer

    async def _tell(
        self,
        topic: str,
        what: str,
        build: Callable[[int], Command],
        here: Callable[[], asyncio.Future[None] | object],
    ) -> None:
        slot = slot_of_key(topic, self.host.broker.store.slot_count)
        delay = RETRY_MIN
        fresh = False
        while True:
            try:
                url = await self._owner(slot, f"topic {topic!r}", fresh)
                if not url:  # (the slot came here meanwhile)
                    await here()  # type: ignore[misc]
                    return
                await self._request(url, build, what)
                self.tells += 1
                return
            except (*_MOVED, refusals.NotOwner) as exc:
                self.tell_retries[_reason(exc)] += 1
                log.info("%s: %s; looking its owner up again", what, exc)
            except TxnbufError as exc:
                self.tell_failures[_reason(exc)] += 1
                raise _as_refusal(exc) from None
            except refusals.Refusal as exc:  # (applied here, and refused)
                self.tell_failures[_reason(exc)] += 1
                raise
            fresh = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)

    # -- a Kafka group's offsets at their topic's owner ------------------------------

    async def topic_owner(self, topic: str) -> str:
        """The URL of the owner of ``topic``'s slot ("" if it is this broker)
        as the last look saw it, or, if it saw none live, as the tables read
        again say; `refusals.NotOwner` (retriable) while none is."""
        slot = slot_of_key(topic, self.host.broker.store.slot_count)
        try:
            return await self._owner(slot, f"topic {topic!r}", False)
        except refusals.NotOwner:
            return await self._owner(slot, f"topic {topic!r}", True)

    async def group_cursors(
        self, url: str, fill: Callable[[pb.CommandGroupCursors], None], what: str
    ) -> pb.CommandGroupCursorsResponse:
        """GROUP_CURSORS (``fill`` writes the request) to the broker at
        ``url``, once: its answer, or `refusals.ServiceNotReady` (retriable)
        if it cannot be reached or does not answer in time, or its refusal
        of the whole request (its own code: NOT_OWNER, ...)."""

        def build(request_id: int) -> Command:
            cmd = Command(type=T.GROUP_CURSORS)
            cmd.group_cursors.request_id = request_id
            fill(cmd.group_cursors)
            return cmd

        try:
            reply = await self._request(url, build, what, Command.GROUP_CURSORS_RESPONSE)
        except (ConnectionLostError, OperationTimeoutError) as exc:
            raise refusals.ServiceNotReady(f"{what}: {exc}") from None
        except TxnbufError as exc:
            raise _as_refusal(exc) from None
        return reply.group_cursors_response

    # -- a participant checking with a coordinator elsewhere ------------------------

    def registered(self, txnid: TxnID, participant: str) -> bool:
        return (txnid, participant) in self._registered

    async def register(
        self, txnid: TxnID, topic: str, partition: int | None = None, subscription: str = ""
    ) -> None:
        """Check with ``txnid``'s coordinator (on another broker) that the
        transaction is OPEN, registering this participant with it (logged
        there); raises its refusal (TRANSACTION_NOT_FOUND, INVALID_TXN_STATUS,
        TRANSACTION_TIMEOUT) if not. Cached per transaction and participant;
        concurrent checks of one share one request, and return in the order
        they were made (a producer's sends keep their order)."""
        participant = f"{topic}/{partition}" if partition is not None else f"{topic}/{subscription}"
        key = (txnid, participant)
        if key in self._registered:
            return
        pending = self._registering.get(key)
        if pending is None:
            pending = asyncio.get_running_loop().create_future()
            self._registering[key] = pending
            try:
                await self._ask(txnid, topic, partition, subscription)
            except BaseException as exc:
                if not pending.done():
                    pending.set_exception(exc)
                    pending.exception()  # (retrieved: the waiters raise it)
                raise
            finally:
                del self._registering[key]
            self._registered[key] = None
            while len(self._registered) > REGISTERED_KEPT:
                self._registered.popitem(last=False)
            if not pending.done():
                pending.set_result(None)
            return
        # (Awaited as it is, not shielded: the waiters wake in the order they
        # came, right after the first, so their sends are queued in order.)
        await pending

    def forget_all(self) -> None:
        """Slots moved away: every check is asked again when next needed."""
        self._registered.clear()
        self._producer_txns.clear()
        self._producer_keys.clear()

    def forget(self, txnid: TxnID, participant: str) -> None:
        """The transaction ended on ``participant``: its check goes."""
        self._registered.pop((txnid, participant), None)
        key = self._producer_keys.pop((txnid, participant), None)
        if key is not None and self._producer_txns.get(key, (None,))[0] == txnid:
            del self._producer_txns[key]

    async def register_producer(
        self,
        producer: tuple[int, int],
        topic: str,
        partition: int | None = None,
        subscription: str = "",
        verify_only: bool = False,
        keep: bool = True,
    ) -> tuple[TxnID, str]:
        """`register` for a send or ack of the producer-epoch mode, whose
        transaction the participant does not know: the coordinator that
        issued the producer id (on another broker) answers the producer's
        ongoing transaction, with this participant added (begun if none:
        KIP-890 part 2) or, ``verify_only``, verified as added by the
        client (Kafka's AddPartitionsToTxn: KIP-890 part 1), and the
        registration logged; raises its refusal (fenced, nothing ongoing,
        not added). With the transactional id holding the producer id (the
        participant checks its client's permission on it).

        With ``keep``, the answer is kept per producer identity and
        participant until the transaction's END reaches the participant:
        for producers whose identity changes with each transaction (the
        txnbuf client's, KIP-890 part 2). A Kafka producer before KIP-890
        part 2 keeps its identity from one transaction to the next, and its
        EndTxn may be answered before a participant that does not answer
        applied the END (`tc.ParticipantChannel.answer`'s wait is bounded):
        a kept answer could then put its next transaction's sends into the
        one before, so its checks pass ``keep=False`` (every send is
        checked). Concurrent checks share one request and return in order,
        as `register`'s (a client sends no END before its sends are
        answered, so checks in flight together are of one transaction)."""
        participant = f"{topic}/{partition}" if partition is not None else f"{topic}/{subscription}"
        key = (producer[0], producer[1], participant)
        known = self._producer_txns.get(key)
        if known is not None:
            return known
        pending = self._producer_checking.get(key)
        if pending is not None:
            return await pending
        pending = asyncio.get_running_loop().create_future()
        self._producer_checking[key] = pending
        try:
            found = await self._ask_producer(producer, topic, partition, subscription, verify_only)
        except BaseException as exc:
            pending.set_exception(exc)
            pending.exception()  # (retrieved: the waiters raise it)
            raise
        finally:
            del self._producer_checking[key]
        txnid = found[0]
        if not keep:
            pending.set_result(found)
            return found
        self._producer_txns[key] = found
        self._producer_keys[(txnid, participant)] = key
        self._registered[(txnid, participant)] = None
        while len(self._producer_txns) > REGISTERED_KEPT:
            old = next(iter(self._producer_txns))
            self._producer_keys.pop((self._producer_txns.pop(old)[0], old[2]), None)
        pending.set_result(found)
        return found

    async def _ask_producer(
        self,
        producer: tuple[int, int],
        topic: str,
        partition: int | None,
        subscription: str,
        verify_only: bool,
    ) -> tuple[TxnID, str]:
        def fill(add: pb.CommandAddPartitionToTxn | pb.CommandAddSubscriptionToTxn) -> None:
            add.producer_id, add.producer_epoch = producer
            if isinstance(add, pb.CommandAddPartitionToTxn):
                add.verify_only = verify_only

        tcid = coordinator_of_producer(producer[0])
        what = f"check of producer {producer[0]} epoch {producer[1]} with its coordinator {tcid}"
        reply = await self._ask(None, topic, partition, subscription, tcid, fill, what)
        resp = reply.txn_response
        return wire_txnid(resp.txnid_most_bits, resp.txnid_least_bits), resp.message

    async def _ask(
        self,
        txnid: TxnID | None,
        topic: str,
        partition: int | None,
        subscription: str,
        tcid: int | None = None,
        fill: Callable[[pb.CommandAddPartitionToTxn | pb.CommandAddSubscriptionToTxn], None]
        | None = None,
        what: str = "",
    ) -> Command:
        def build(request_id: int) -> Command:
            add: pb.CommandAddPartitionToTxn | pb.CommandAddSubscriptionToTxn
            if partition is not None:
                cmd = Command(type=T.ADD_PARTITION_TO_TXN)
                add = cmd.add_partition_to_txn
                add.partitions.add(topic=topic, partition=partition)
            else:
                cmd = Command(type=T.ADD_SUBSCRIPTION_TO_TXN)
                add = cmd.add_subscription_to_txn
                add.subscriptions.add(topic=topic, subscription=subscription)
            add.request_id = request_id
            if txnid is not None:
                add.txnid_most_bits, add.txnid_least_bits = txnid
            if fill is not None:
                fill(add)
            add.from_participant = True
            return cmd

        slots = self.host.broker.store.slot_count
        if tcid is None:
            assert txnid is not None
            tcid = txnid.tcid
        slot = tcid % slots
        what = what or f"check of {txnid} with its coordinator {tcid}"
        deadline = asyncio.get_running_loop().time() + 2 * REQUEST_TIMEOUT
        delay = RETRY_MIN
        fresh = False
        self.checks += 1
        while True:
            try:
                url = await self._owner(slot, f"transaction coordinator {tcid}", fresh)
                if not url:  # (it came here meanwhile: the caller asks it again)
                    raise refusals.ServiceNotReady(f"{what}: the coordinator moved here; try again")
                return await self._request(url, build, what)
            except (*_MOVED, refusals.NotOwner) as exc:
                failure: Exception = exc
            except TxnbufError as exc:
                self.check_refusals[_reason(exc)] += 1
                raise _as_refusal(exc) from None
            except refusals.ServiceNotReady:
                self.check_retries["moved_here"] += 1
                raise
            if asyncio.get_running_loop().time() + delay >= deadline:
                self.check_refusals["no_answer"] += 1
                raise refusals.ServiceNotReady(f"{what}: no answer in time ({failure})")
            self.check_retries[_reason(failure)] += 1
            fresh = True
            await asyncio.sleep(delay)
            delay = min(delay * 2, RETRY_MAX)
