"""The broker: storage, topics, subscriptions and coordinators behind one aiohttp app.

Routes: ``/ws`` (the data plane, see `broker._connection`), the HTTP admin
API under ``/admin/v1`` (see `broker._admin`) and Prometheus text at
``/metrics``.

The broker runs the transaction coordinators named by ``tc_ids`` (each with
its own log, a ledger in the broker's store) and is their `tc.Participant`:
ending a transaction on a partition goes to the partition's transaction
buffer, on a subscription to the subscription's pending acks.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from broker._auth import AuthConfig, Security
from broker._connection import Connection, txn_key
from broker._errors import BrokerError
from broker._metrics import BrokerMetrics
from buffer import Partition, PublishResult, Topics, TransactionBuffer, TxnKey
from ledger import LedgerError, LedgerStore, faults
from proto import FRAME_SLACK, MAX_MESSAGE_SIZE
from proto import txnbuf_pb2 as pb
from subscriptions import Subscriptions
from tc import (
    ProducerSettings,
    TransactionCoordinator,
    TxnID,
    TxnMeta,
    TxnNotFoundError,
    TxnStatus,
)

__all__ = ["BROKER_KEY", "MAX_REQUEST_LINE", "Broker", "make_app"]

log = logging.getLogger(__name__)

BROKER_KEY: web.AppKey[Broker] = web.AppKey("broker")
SWEEP_INTERVAL = 5.0  # seconds between transaction buffer sweeps
# The longest request line aiohttp reads (AppRunner's max_line_size): a URL
# longer than the admin API's limit still reaches it, and is answered 414.
MAX_REQUEST_LINE = 64 << 10
_ABORT_DECIDED = (TxnStatus.ABORTING, TxnStatus.ABORTED)


class Broker:
    """Create with `Broker.open`; `close` stops everything in order."""

    def __init__(
        self,
        data_dir: Path,
        store: LedgerStore,
        topics: Topics,
        subs: Subscriptions,
        url: str,
        security: Security | None = None,
    ) -> None:
        self.data_dir = data_dir
        # Authentication, the ACL and the limits on one client (`broker._auth`).
        self.security = security or Security.load(data_dir)
        self.store = store
        self.topics = topics
        self.subscriptions = subs
        self.url = url
        self.connections: set[Connection] = set()
        self.coordinators: dict[int, TransactionCoordinator] = {}
        self._sweeper: asyncio.Task[None] | None = None
        self._producer_owners: dict[tuple[str, str], Connection] = {}
        # Transactional sends waiting for their partition's buffer to be created.
        self._awaiting_buffer: dict[Partition, list[_TxnSend]] = {}
        self.started = time.time()
        self.metrics = BrokerMetrics(self)

    @classmethod
    async def open(
        cls,
        data_dir: str | Path,
        url: str = "",
        tc_ids: tuple[int, ...] = (0,),
        auth: AuthConfig | None = None,
        producer_settings: ProducerSettings | None = None,
    ) -> Broker:
        """``auth``: authentication, superusers and limits (none, the
        default: see `broker._auth`)."""
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        security = Security.load(data_dir, auth)
        t0 = time.perf_counter()
        store = await LedgerStore.open(data_dir / "broker.db")
        topics = await Topics.load(store)
        subs = await Subscriptions.load(topics)
        for name in sorted(topics.deleted):  # (a deletion that a crash interrupted)
            await subs.delete_leftovers(name)
            await topics.delete_ledgers(name)
        broker = cls(data_dir, store, topics, subs, url, security)
        log.info(
            "recovered %d topics from %s in %.2fs",
            len(topics.all()),
            data_dir,
            time.perf_counter() - t0,
        )
        try:
            await broker.metrics.load(store)
            for tcid in tc_ids:
                broker.coordinators[tcid] = await broker._open_coordinator(tcid, producer_settings)
            await broker._abort_orphans()
        except BaseException:
            await broker.close()
            raise
        broker._sweeper = asyncio.get_running_loop().create_task(broker._sweep_loop())
        broker.metrics.start()
        return broker

    async def _open_coordinator(
        self, tcid: int, settings: ProducerSettings | None = None
    ) -> TransactionCoordinator:
        """Coordinator ``tcid`` keeps its log in the broker's store, next to
        the partitions and subscriptions it ends transactions on, so that
        they write right behind its records (see `tc`)."""
        if (self.data_dir / f"tc-{tcid}.db").exists():
            raise LedgerError(
                f"{self.data_dir / f'tc-{tcid}.db'} is a coordinator log in a separate file, "
                "which this version of txnbuf does not read (coordinators log in broker.db)"
            )
        return await TransactionCoordinator.open(tcid, self.store, self, settings)

    async def _abort_orphans(self) -> None:
        """Abort, on the partitions and subscriptions that hold it, every
        transaction left open by a crash that its coordinator will not end.

        A coordinator whose participants answer early does not log
        registrations (see `tc`): after a restart it aborts the transactions
        it found OPEN without knowing where they wrote. Their participants
        know: each one still holding a transaction its coordinator has not
        decided to commit (ABORTING, ABORTED, or forgotten) aborts it here.
        A committing one is left to its coordinator, whose decision record
        names every participant. Transactions of a coordinator not running
        here are left alone."""
        held: list[tuple[TxnKey, str, Callable[[], Awaitable[None]]]] = []

        def decided_abort(key: TxnKey) -> bool:
            txnid = TxnID(*key)
            tc = self.coordinators.get(txnid.tcid)
            if tc is None:
                return False
            meta = tc.get(txnid)
            return meta is None or meta.status in (TxnStatus.ABORTING, TxnStatus.ABORTED)

        for _, part, buffer in self._buffers():
            for key in buffer.open_transactions():
                if decided_abort(key):
                    held.append((key, part.name, functools.partial(buffer.end, key, commit=False)))
        for sub in self.subscriptions.all():
            for key in list(sub.cursor.txn_acks):
                if decided_abort(key):
                    where = f"subscription {sub.name!r} of {sub.partition.name}"
                    held.append((key, where, functools.partial(sub.end_txn, key, commit=False)))
        # All at once: they share group commits.
        results = await asyncio.gather(*(end() for _, _, end in held), return_exceptions=True)
        for (key, where, _), result in zip(held, results, strict=True):
            if isinstance(result, BaseException):
                # (It stays open there, never committed; the next start tries again.)
                log.error("aborting transaction (%d,%d) on %s failed: %s", *key, where, result)
            else:
                log.debug("aborted transaction (%d,%d) left open on %s", *key, where)
        if held:
            log.info(
                "aborted %d transactions left open by the restart on %d partitions and "
                "subscriptions",
                len({key for key, _, _ in held}),
                len({where for _, where, _ in held}),
            )

    async def _sweep_loop(self) -> None:
        """Reclaim sidecar entries of aborted transactions and of committed ones
        whose markers were trimmed (PIP-31 §Retention Cursor)."""
        while True:
            await asyncio.sleep(SWEEP_INTERVAL)
            for name, part, buffer in self._buffers():
                try:
                    await buffer.sweep(self.subscriptions.uncommitted_floor(name, part.index))
                except Exception:
                    log.exception("sweeping the transaction buffer of %s failed", part.name)

    def _buffers(self) -> list[tuple[str, Partition, TransactionBuffer]]:
        """(topic name, partition, its transaction buffer) of every partition
        that has one."""
        return [
            (topic.name, part, part.transaction_buffer)
            for topic in self.topics.all()
            for part in topic.partitions
            if part.transaction_buffer is not None
        ]

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for conn in list(self.connections):
            conn.close()
            await conn.ws.close()
        for tc in self.coordinators.values():
            await tc.close()
        await self.metrics.close()
        await self.subscriptions.close()
        await self.store.close()

    # -- transactions ------------------------------------------------------------

    def coordinator(self, txnid: TxnID) -> TransactionCoordinator:
        """The coordinator that owns ``txnid`` (its TCID), if it runs here."""
        tc = self.coordinators.get(txnid.tcid)
        if tc is None:
            raise TxnNotFoundError(
                f"transaction {txnid} belongs to coordinator {txnid.tcid}, which does not run "
                f"here (coordinators: {sorted(self.coordinators)})"
            )
        return tc

    def publish_txn(
        self,
        partition: Partition,
        txn: TxnKey,
        producer: str,
        messages: Sequence[pb.SingleMessage],
        encoded: bytes | None = None,
        early: bool = False,
        first_seq: int | None = None,
        epoch_producer: tuple[int, int] | None = None,
    ) -> Awaitable[PublishResult]:
        """Queue a transactional send to ``partition``'s transaction buffer.

        Sends are queued in call order even while the buffer (and its sidecar
        ledger) is being created by the first of them. ``early`` and
        ``epoch_producer``: see `TransactionBuffer.publish` (``early`` not
        for a send that creates the buffer).
        """
        buffer = partition.transaction_buffer
        if buffer is not None and partition not in self._awaiting_buffer:
            return buffer.publish(
                txn, producer, messages, encoded, early, first_seq, epoch_producer
            )
        fut: asyncio.Future[Awaitable[PublishResult]] = asyncio.get_running_loop().create_future()
        waiting = self._awaiting_buffer.setdefault(partition, [])
        waiting.append(_TxnSend(txn, producer, messages, first_seq, fut, epoch_producer))
        if len(waiting) == 1:
            asyncio.get_running_loop().create_task(self._create_buffer(partition))
        return _published(fut)

    async def _create_buffer(self, partition: Partition) -> None:
        try:
            buffer = await partition.txn_buffer()
        except Exception as exc:
            for job in self._awaiting_buffer.pop(partition):
                job.future.set_exception(exc)
            return
        for job in self._awaiting_buffer.pop(partition):
            try:
                job.future.set_result(
                    buffer.publish(
                        job.txn,
                        job.producer,
                        job.messages,
                        first_seq=job.first_seq,
                        epoch_producer=job.epoch_producer,
                    )
                )
            except Exception as exc:
                job.future.set_exception(exc)

    def check_decided(self, txnid: TxnID, commit: bool) -> TxnMeta:
        """A participant applies only the outcome the transaction's
        coordinator decided: raise (nothing changes) unless ``txnid``'s
        coordinator runs here and has decided to commit (``commit``) or to
        abort it. The coordinator's own calls always pass; an end from
        anywhere else (END_TXN_ON_PARTITION / _SUBSCRIPTION on the wire) is
        checked against it."""
        tc = self.coordinators.get(txnid.tcid)
        if tc is None:
            raise BrokerError(
                "NOT_ALLOWED",
                f"transaction {txnid} belongs to coordinator {txnid.tcid}, which does not run "
                "here: its decision cannot be checked, so nothing was changed",
            )
        meta = tc.get(txnid)
        decided = (TxnStatus.COMMITTING, TxnStatus.COMMITTED) if commit else _ABORT_DECIDED
        if meta is None or meta.status not in decided:
            state = "unknown" if meta is None else meta.status.name
            raise BrokerError(
                "INVALID_TXN_STATUS",
                f"cannot {'commit' if commit else 'abort'} transaction {txnid} on a participant: "
                f"its coordinator {txnid.tcid} did not decide so (it is {state} there); "
                "nothing was changed",
            )
        return meta

    def end_txn_on_partition(
        self, topic: str, partition: int, txnid: TxnID, commit: bool
    ) -> Awaitable[None] | None:
        """`tc.Participant`: commit (marker) or abort the transaction on a
        partition, as its coordinator decided (`check_decided`): queued at
        once where its transaction buffer exists and no other END of it is
        under way there, else once it can be."""
        producer = self.check_decided(txnid, commit).producer
        faults.refuse("broker.end_txn_on_participant")
        part = self._partition(topic, partition, txnid)
        if part is None:
            return None
        buffer = part.transaction_buffer
        if buffer is not None and buffer.end_now(txn_key(txnid), commit, producer):
            return None
        return self._end_on_partition(part, txnid, commit, False, producer)

    async def end_txn_on_partition_durably(
        self, topic: str, partition: int, txnid: TxnID, commit: bool
    ) -> None:
        """END_TXN_ON_PARTITION from the wire: `end_txn_on_partition`,
        returning once what it wrote is durable."""
        producer = self.check_decided(txnid, commit).producer
        part = self._partition(topic, partition, txnid)
        if part is not None:
            await self._end_on_partition(part, txnid, commit, True, producer)

    def _partition(self, topic: str, partition: int, txnid: TxnID) -> Partition | None:
        found = self.topics.get(topic)
        if found is None or partition >= len(found.partitions):
            log.warning("end %s on %s/%d: no such partition", txnid, topic, partition)
            return None
        return found.partitions[partition]

    @staticmethod
    async def _end_on_partition(
        part: Partition,
        txnid: TxnID,
        commit: bool,
        durable: bool,
        producer: tuple[int, int] | None,
    ) -> None:
        buffer = await part.txn_buffer()
        await buffer.end(txn_key(txnid), commit, durable, producer)

    def end_txn_on_subscription(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool
    ) -> Awaitable[None] | None:
        """`tc.Participant`: commit or abort the transaction's pending acks,
        as its coordinator decided (`check_decided`), queued at once."""
        self.check_decided(txnid, commit)
        faults.refuse("broker.end_txn_on_participant")
        self.subscriptions.end_txn_now(topic, subscription, txn_key(txnid), commit)
        return None

    async def end_txn_on_subscription_durably(
        self, topic: str, subscription: str, txnid: TxnID, commit: bool
    ) -> None:
        """END_TXN_ON_SUBSCRIPTION from the wire: `end_txn_on_subscription`,
        returning once what it wrote is durable."""
        self.check_decided(txnid, commit)
        await self.subscriptions.end_txn(topic, subscription, txn_key(txnid), commit)

    def producer_count(self, topic: str) -> int:
        return sum(1 for t, _ in self._producer_owners if t == topic)

    def claim_producer(self, topic: str, name: str, conn: Connection) -> None:
        """Producer names are unique per topic among connected producers."""
        owner = self._producer_owners.get((topic, name))
        if owner is not None and owner is not conn:
            raise BrokerError(
                "PRODUCER_BUSY", f"producer {name!r} is already connected to topic {topic!r}"
            )
        self._producer_owners[(topic, name)] = conn

    def release_producer(self, topic: str, name: str, conn: Connection) -> None:
        if self._producer_owners.get((topic, name)) is conn:
            del self._producer_owners[(topic, name)]


@dataclass(slots=True)
class _TxnSend:
    txn: TxnKey
    producer: str
    messages: Sequence[pb.SingleMessage]
    first_seq: int | None
    future: asyncio.Future[Awaitable[PublishResult]]
    epoch_producer: tuple[int, int] | None


async def _published(fut: asyncio.Future[Awaitable[PublishResult]]) -> PublishResult:
    return await (await fut)


async def _websocket(request: web.Request) -> web.WebSocketResponse:
    broker = request.app[BROKER_KEY]
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_SIZE + FRAME_SLACK, heartbeat=30.0)
    await ws.prepare(request)
    refusal = broker.security.refuse_connection(len(broker.connections))
    if refusal is not None:  # (TOO_MANY_REQUESTS: the client tries again later)
        await ws.send_bytes(refusal)
        await ws.close()
        return ws
    peer = f"{request.remote}:{id(ws) % 100000}"
    conn = Connection(broker, ws, peer)
    broker.connections.add(conn)
    log.debug("connection %s opened", peer)
    try:
        await conn.run()
    finally:
        broker.connections.discard(conn)
        log.debug("connection %s closed", peer)
    return ws


class _QuietParseErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (a request line over
    `MAX_REQUEST_LINE`, a malformed header) at ERROR with a traceback, and
    answers it 400: one line at INFO says it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            log.info("refused an HTTP request that could not be read: %s", exc.message)
            return False
        return True


def make_app(broker: Broker) -> web.Application:
    from broker._admin import add_admin_routes
    from broker._groups import add_group_routes

    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietParseErrors) for f in server_log.filters):
        server_log.addFilter(_QuietParseErrors())

    app = web.Application(client_max_size=1 << 20)
    app[BROKER_KEY] = broker
    app.router.add_get("/ws", _websocket)
    add_admin_routes(app)
    add_group_routes(app)
    return app
