"""The transaction commands of one connection (PIP-31 §TC Request Processing).

A `Transactions` belongs to one connection (its `broker._context.Context`),
whose dispatch table takes its `handlers`: NEW_TXN (with a tag or a
prepared timeout too: a transaction group's, see `broker._groups`),
ADD_PARTITION_TO_TXN, ADD_SUBSCRIPTION_TO_TXN, END_TXN and the
coordinator's END_TXN_ON_PARTITION / END_TXN_ON_SUBSCRIPTION. The
connection tells it of each transactional SEND and ACK it reads and answers
(`op_read`, `op_answered`): what an END_TXN ``after_ops`` waits for.
Answers go out through the connection's writer, like every other answer. A
handler answers at once or from a callback of the coordinator's future;
only an END that must wait for operations still unanswered, and the ends on
participants, run in a task.

END_TXN may also open the client's next transaction (``next_txn_ttl_ms``):
it is opened alongside the END and answered with it only if the END
succeeds; otherwise it is aborted and the client asks with NEW_TXN.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable
from typing import Any

from broker._context import Context, Handlers
from broker._errors import error_code, error_text
from buffer import check_subscription_name, check_topic_name
from proto import refusals
from proto import txnbuf_pb2 as pb
from tc import TxnID, wire_txnid

__all__ = ["CLUSTER_ROLE", "Transactions"]

log = logging.getLogger(__name__)

CLUSTER_ROLE = "cluster"  # coordinator-to-participant commands need it

T = pb.BaseCommand


class _TxnOps:
    """A transaction's SENDs and ACKs that a connection has read and not yet
    answered, and the first error it answered one with: what an END_TXN
    ``after_ops`` waits for."""

    __slots__ = ("error", "pending", "settled")

    def __init__(self) -> None:
        self.pending = 0
        self.error: str | None = None
        self.settled: asyncio.Future[None] | None = None


class Transactions:
    """The transaction commands of the connection ``ctx`` (see the module docstring)."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        self.broker = ctx.broker
        self.send = ctx.send
        # Per transaction (most, least bits): its SENDs and ACKs read here and
        # not answered yet, or one answered with an error (END_TXN after_ops).
        self._txn_ops: dict[tuple[int, int], _TxnOps] = {}

    def handlers(self) -> Handlers:
        """This connection's handlers of the transaction commands."""
        return {
            T.NEW_TXN: self.on_new_txn,
            T.ADD_PARTITION_TO_TXN: self.on_add_partition,
            T.ADD_SUBSCRIPTION_TO_TXN: self.on_add_subscription,
            T.END_TXN: self.on_end_txn,
            T.END_TXN_ON_PARTITION: self.on_end_txn_on_partition,
            T.END_TXN_ON_SUBSCRIPTION: self.on_end_txn_on_subscription,
        }

    # -- the operations an END_TXN after_ops waits for ------------------------------

    def op_read(self, req: pb.CommandSend | pb.CommandAck) -> None:
        """A transactional SEND or ACK is read: END_TXN after_ops waits for it."""
        key = (req.txnid_most_bits, req.txnid_least_bits)
        ops = self._txn_ops.get(key)
        if ops is None:
            ops = self._txn_ops[key] = _TxnOps()
        ops.pending += 1

    def op_answered(
        self, req: pb.CommandSend | pb.CommandAck, error: str | None, code: int = 0
    ) -> None:
        """A transactional SEND or ACK is answered, with ``error`` (and its
        ``code``) if it failed: logged at INFO (a send or ack refused in a
        transaction its client may still commit, e.g. one that reached its
        partition after the END), but NOT_OWNER at DEBUG (the client sends
        it again at the owner: routine while a slot moves)."""
        key = (req.txnid_most_bits, req.txnid_least_bits)
        if error is not None:
            log.log(
                logging.DEBUG if code == pb.NOT_OWNER else logging.INFO,
                "connection %s: %s of transaction %s refused: %s",
                self.ctx.peer,
                "send" if isinstance(req, pb.CommandSend) else "ack",
                wire_txnid(*key),
                error,
            )
        ops = self._txn_ops.get(key)
        if ops is None:
            return
        ops.pending -= 1
        if error is not None and ops.error is None:
            ops.error = error
        if ops.pending == 0:
            if ops.settled is not None and not ops.settled.done():
                ops.settled.set_result(None)
            if ops.error is None:  # (a failure is kept for the END that comes)
                del self._txn_ops[key]

    async def ops_answered(self, req: pb.CommandEndTxn) -> None:
        """END_TXN after_ops: wait until every transactional SEND and ACK of
        the transaction read earlier on this connection is answered. For a
        COMMIT, raise NOT_ALLOWED (nothing changes) if one failed and the
        transaction is still open: the client aborts it. (A transaction that
        an earlier END committed already answers this one as a repeat.)"""
        key = (req.txnid_most_bits, req.txnid_least_bits)
        ops = self._txn_ops.get(key)
        if ops is None:
            return
        if ops.pending:
            if ops.settled is None:
                ops.settled = asyncio.get_running_loop().create_future()
            await asyncio.shield(ops.settled)
        if ops.error is not None and req.txn_action == pb.COMMIT:
            txnid = wire_txnid(*key)
            if self.broker.coordinator(txnid).is_open(txnid):
                raise refusals.NotAllowed(
                    f"commit of {txnid} refused: a send or ack of it failed ({ops.error}); "
                    "nothing changed: abort it",
                )

    def _forget_ops(self, key: tuple[int, int]) -> None:
        """The transaction ``key`` ended: forget its operations read here
        (and a failure remembered for its END)."""
        ops = self._txn_ops.get(key)
        if ops is not None and not ops.pending:
            del self._txn_ops[key]

    # -- answers --------------------------------------------------------------------

    def _txn_respond(
        self,
        req: Any,
        what: str,
        exc: BaseException | None,
        following: TxnID | None = None,
        holder: str = "",
    ) -> None:
        """Answer TXN_RESPONSE to ``req``: with the error set if ``exc``,
        and with the next transaction if ``following`` (END_TXN's
        ``next_txn_ttl_ms``); ``holder``: a producer's check from a
        participant, answered with its transactional id (in ``message``)."""
        cmd = pb.BaseCommand(type=T.TXN_RESPONSE)
        resp = cmd.txn_response  # (filled in place: no copy)
        resp.request_id = req.request_id
        resp.txnid_most_bits = req.txnid_most_bits
        resp.txnid_least_bits = req.txnid_least_bits
        if following is not None:
            resp.next_txnid_most_bits = following.most_bits
            resp.next_txnid_least_bits = following.least_bits
        if exc is not None:
            resp.error = error_code(exc, f"connection {self.ctx.peer}: {what}")
            resp.message = error_text(exc)
            log.log(
                logging.DEBUG if resp.error == pb.NOT_OWNER else logging.INFO,
                "connection %s: %s of transaction %s refused: %s",
                self.ctx.peer,
                what,
                wire_txnid(req.txnid_most_bits, req.txnid_least_bits),
                resp.message,
            )
        elif holder:
            resp.message = holder
        self.send(cmd)

    def _txn_answer(self, req: Any, work: Awaitable[None], what: str) -> None:
        """Await ``work`` in a task; answer TXN_RESPONSE with its error, if any."""

        async def run() -> None:
            try:
                await work
            except Exception as exc:
                self._txn_respond(req, what, exc)
                return
            self._txn_respond(req, what, None)

        self.ctx.spawn(run())

    # -- the client's commands ------------------------------------------------------

    def on_new_txn(self, cmd: pb.BaseCommand) -> None:
        """NEW_TXN; with a ``tag`` or a ``prepared_ttl_ms``, a transaction
        that carries them (a transaction group's, `broker._groups`)."""
        req = cmd.new_txn
        out = pb.BaseCommand(type=T.NEW_TXN_RESPONSE)
        resp = out.new_txn_response
        resp.request_id = req.request_id
        try:
            txnid = self._open_txn(req.tc_id, req.txn_ttl_ms, req.tag, req.prepared_ttl_ms)
            resp.txnid_most_bits = txnid.most_bits
            resp.txnid_least_bits = txnid.least_bits
        except Exception as exc:
            resp.error = error_code(exc, f"connection {self.ctx.peer}: new transaction")
            resp.message = error_text(exc)
        self.send(out)

    def _from_participant(
        self, req: pb.CommandAddPartitionToTxn | pb.CommandAddSubscriptionToTxn
    ) -> None:
        """ADD_*_TO_TXN ``from_participant``: a participant on another
        broker checks that the transaction is OPEN and registers with its
        coordinator here (`broker._peers`). The cluster role only (the
        participant's broker checked its client's permissions); the
        registration is logged and answered once durable."""
        what = "register a participant on another broker"
        try:
            self.ctx.require_role(CLUSTER_ROLE, f"{what} (from_participant)")
            holder = ""
            if req.HasField("producer_id"):
                # (the producer-epoch mode: its ongoing transaction, the
                # partition or subscription added or verified first)
                txnid, holder = self._producer_participant(req)
                req.txnid_most_bits, req.txnid_least_bits = txnid  # (answered)
            else:
                txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
            tc = self.broker.coordinator(txnid)
            if isinstance(req, pb.CommandAddPartitionToTxn):
                parts = [(check_topic_name(r.topic), r.partition) for r in req.partitions]
                written = tc.register_remote(txnid, partitions=parts)
            else:
                subs = [
                    (check_topic_name(r.topic), check_subscription_name(r.subscription))
                    for r in req.subscriptions
                ]
                written = tc.register_remote(txnid, subscriptions=subs)
        except Exception as exc:
            self._txn_respond(req, what, exc)
            return
        if not holder:
            self._txn_answer(req, _durable(written), what)
            return

        async def answer() -> None:
            try:
                await _durable(written)
            except Exception as exc:
                self._txn_respond(req, what, exc)
                return
            self._txn_respond(req, what, None, holder=holder)

        self.ctx.spawn(answer())

    def _producer_participant(
        self, req: pb.CommandAddPartitionToTxn | pb.CommandAddSubscriptionToTxn
    ) -> tuple[TxnID, str]:
        """`_from_participant` for a send or ack of the producer-epoch mode:
        the producer's ongoing transaction, with the one partition (or
        subscription) added (begun if it had none, KIP-890 part 2), or with
        ``verify_only`` verified as added (KIP-890 part 1); raises the
        producer's refusal (fenced, nothing ongoing, not added). With the
        transactional id that holds the producer id (the participant checks
        its client's permission on it)."""
        pid, epoch = req.producer_id, req.producer_epoch
        tc = self.broker.producer_coordinator(pid)
        if isinstance(req, pb.CommandAddPartitionToTxn):
            if len(req.partitions) != 1:
                raise refusals.InvalidArgument("a producer's check names one partition")
            ref = req.partitions[0]
            topic = check_topic_name(ref.topic)
            if req.verify_only:
                txnid = tc.producer_verified_partition(pid, epoch, topic, ref.partition)
            else:
                txnid = tc.producer_add_partition(pid, epoch, topic, ref.partition)
        else:
            if len(req.subscriptions) != 1:
                raise refusals.InvalidArgument("a producer's check names one subscription")
            sub = req.subscriptions[0]
            txnid = tc.producer_add_subscription(
                pid, epoch, check_topic_name(sub.topic), check_subscription_name(sub.subscription)
            )
        entry = tc.producer_of(pid)
        assert entry is not None  # (checked above)
        return txnid, entry.transactional_id

    def on_add_partition(self, cmd: pb.BaseCommand) -> None:
        req = cmd.add_partition_to_txn
        if req.from_participant:
            self._from_participant(req)
            return
        try:
            txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
            tc = self.broker.coordinator(txnid)
            parts = []
            for ref in req.partitions:
                count = self.broker.topics.partition_count(check_topic_name(ref.topic))
                self.broker.security.allow_produce(self.ctx.who, ref.topic)
                if count is None or ref.partition >= count:
                    raise refusals.InvalidArgument(f"no partition {ref.topic}/{ref.partition}")
                parts.append((ref.topic, ref.partition))
            if not parts:
                raise refusals.InvalidArgument("name at least one partition")
            for topic_name, index in parts:
                tc.add_partition(txnid, topic_name, index)
        except Exception as exc:
            self._txn_respond(req, "add partition to transaction", exc)
            return
        self._txn_respond(req, "add partition to transaction", None)

    def on_add_subscription(self, cmd: pb.BaseCommand) -> None:
        req = cmd.add_subscription_to_txn
        if req.from_participant:
            self._from_participant(req)
            return
        try:
            txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
            tc = self.broker.coordinator(txnid)
            subs = [
                (check_topic_name(ref.topic), check_subscription_name(ref.subscription))
                for ref in req.subscriptions
            ]
            if not subs:
                raise refusals.InvalidArgument("name at least one subscription")
            for topic_name, sub in subs:  # (all checked before any is added)
                self.broker.security.allow_consume(self.ctx.who, topic_name, sub)
            for topic_name, sub in subs:
                tc.add_subscription(txnid, topic_name, sub)
        except Exception as exc:
            self._txn_respond(req, "add subscription to transaction", exc)
            return
        self._txn_respond(req, "add subscription to transaction", None)

    def on_end_txn(self, cmd: pb.BaseCommand) -> None:
        """END_TXN. The client may ask for its next transaction with it
        (``next_txn_ttl_ms``): it is opened now, alongside the END, and
        answered only if the END succeeds (else aborted: the client asks
        anew). An END ``after_ops`` whose transaction has SENDs or ACKs
        read here and not yet answered (or one failed) waits for them in a
        task: a COMMIT so that it commits only if they all succeeded, an
        ABORT so that an ACK read before it is in PENDING_ACK when it
        aborts, and so is redelivered. Otherwise the coordinator decides
        now, in the group commit of those sends and acks, and END is
        answered from a callback."""
        req = cmd.end_txn
        if not self._may_end(req):
            return
        following = self._open_next(req) if req.HasField("next_txn_ttl_ms") else None
        ops = self._txn_ops.get((req.txnid_most_bits, req.txnid_least_bits))
        if req.after_ops and ops is not None:
            self.ctx.spawn(self._end_after_ops(req, following))
            return
        self._end(req, following)

    def _may_end(self, req: pb.CommandEndTxn) -> bool:
        """END_TXN needs what writing the transaction needed (`broker._auth`).
        False, after a refusal, if this connection lacks it. A transaction
        unknown here is left to the END to answer."""
        who = self.ctx.who
        if who.superuser:
            return True
        txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
        tc = self.broker.coordinators.get(txnid.tcid)
        meta = tc.get(txnid) if tc is not None else None
        if meta is None:
            return True
        try:
            self.broker.security.allow_end(who, meta.partitions, meta.subscriptions)
        except refusals.Refusal as exc:
            self._txn_respond(req, "end transaction", exc)
            return False
        return True

    async def _end_after_ops(self, req: pb.CommandEndTxn, following: TxnID | None) -> None:
        try:
            await self.ops_answered(req)
        except Exception as exc:
            self._abort_following(following)
            self._txn_respond(req, "end transaction", exc)
            return
        self._end(req, following)

    def _end(self, req: pb.CommandEndTxn, following: TxnID | None) -> None:
        key = (req.txnid_most_bits, req.txnid_least_bits)
        txnid = wire_txnid(*key)
        decided_at = time.perf_counter()
        try:
            answered = self.broker.coordinator(txnid).end_txn(txnid, req.txn_action == pb.COMMIT)
        except Exception as exc:
            self._abort_following(following)
            self._txn_respond(req, "end transaction", exc)
            return

        def done(f: asyncio.Future[None]) -> None:
            if f.cancelled() or f.exception() is not None:
                self._abort_following(following)
                error = asyncio.CancelledError() if f.cancelled() else f.exception()
                self._txn_respond(req, "end transaction", error)
                return
            self._forget_ops(key)
            self._txn_respond(req, "end transaction", None, following)
            self.broker.metrics.commit_seconds.observe(time.perf_counter() - decided_at)

        answered.add_done_callback(done)

    # -- the next transaction -------------------------------------------------------

    def _open_txn(
        self,
        tc_id: int,
        ttl_ms: int,
        tag: str = "",
        prepared_ttl_ms: int = 0,
        spare: bool = False,
    ) -> TxnID:
        """A new transaction on coordinator ``tc_id`` (NEW_TXN, or the next
        one an END_TXN asks for)."""
        tc = self.broker.coordinators.get(tc_id)
        if tc is None and self.broker.cluster is not None:
            raise self.broker.cluster.coordinator_not_here(tc_id)
        if tc is None:
            raise refusals.TransactionCoordinatorNotFound(
                f"no coordinator {tc_id} here (coordinators: {sorted(self.broker.coordinators)})",
            )
        return tc.new_txn(ttl_ms, tag=tag, prepared_timeout_ms=prepared_ttl_ms, spare=spare)

    def _open_next(self, req: pb.CommandEndTxn | pb.CommandCommitTxn) -> TxnID | None:
        """Open the transaction an END_TXN or COMMIT_TXN asks for (its timeout, on its
        coordinator); None if it cannot be opened (the END stands, and the
        client asks with NEW_TXN)."""
        try:
            return self._open_txn(req.next_tc_id, req.next_txn_ttl_ms, spare=True)
        except Exception as exc:
            log.debug("connection %s: no next transaction: %s", self.ctx.peer, exc)
            return None

    def _abort_following(self, following: TxnID | None) -> None:
        """The END that asked for ``following`` failed: abort it (nobody
        learns its id; failing that, its timeout aborts it)."""
        if following is None:
            return
        try:
            self.broker.coordinator(following).end_txn(following, False).add_done_callback(_quietly)
        except Exception as exc:
            log.debug(
                "connection %s: aborting unanswered %s failed: %s", self.ctx.peer, following, exc
            )

    # -- the coordinator's commands to its participants -----------------------------

    def on_end_txn_on_partition(self, cmd: pb.BaseCommand) -> None:
        req = cmd.end_txn_on_partition
        txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
        try:
            self.ctx.require_role(CLUSTER_ROLE, "END_TXN_ON_PARTITION")
            work: Awaitable[None] = self.broker.end_txn_on_partition_durably(
                req.partition.topic,
                req.partition.partition,
                txnid,
                req.txn_action == pb.COMMIT,
                req,
            )
        except Exception as exc:
            work = _raise(exc)
        self._txn_answer(req, work, "end transaction on partition")

    def on_end_txn_on_subscription(self, cmd: pb.BaseCommand) -> None:
        req = cmd.end_txn_on_subscription
        txnid = wire_txnid(req.txnid_most_bits, req.txnid_least_bits)
        try:
            self.ctx.require_role(CLUSTER_ROLE, "END_TXN_ON_SUBSCRIPTION")
            work: Awaitable[None] = self.broker.end_txn_on_subscription_durably(
                req.subscription.topic,
                req.subscription.subscription,
                txnid,
                req.txn_action == pb.COMMIT,
                req,
            )
        except Exception as exc:
            work = _raise(exc)
        self._txn_answer(req, work, "end transaction on subscription")


async def _raise(exc: Exception) -> None:
    raise exc


async def _durable(written: asyncio.Future[int]) -> None:
    await written


def _quietly(f: asyncio.Future[None]) -> None:
    if not f.cancelled():
        f.exception()  # (retrieved: a failure here is nobody's to report)
