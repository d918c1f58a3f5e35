"""The producer-epoch mode of a coordinator (KIP-98, KIP-890, KIP-939): the
requests of Kafka's transactional producer, as I/O around a `ProducerRegistry`.

The registry (`tc._producers`) holds the transactional ids as data and
builds every record of a change; this module checks a request against it,
logs the record (which applies it), and chains what the answer waits for.
The producer's transactions are the coordinator's own (OPEN, decided,
told to their participants as any other); what the mode asks of its
coordinator is `Transactions` (`tc.TransactionCoordinator` is one).

- InitProducerId (`init_producer`): a new producer id, or the next identity
  of a known one (older instances are fenced), its unfinished transaction
  rolled back (aborted) or forward (its decision awaited) first, unless
  KIP-939 keeps it prepared.
- A send or ack (`producer_txn`, `producer_add_partition`,
  `producer_add_subscription`) begins the producer's transaction if it has
  none (KIP-890 part 2), lazily logged; Kafka's AddPartitionsToTxn
  (`producer_begin`) waits until the begin is durable;
  `producer_verified_partition` is KIP-890 part 1's check of a send.
- PREPARE (`prepare_producer_txn`, KIP-939) and END (`end_producer_txn`):
  decide the ongoing transaction through the coordinator and bump the
  identity (KIP-890), one record each.
- A transaction's begin and its end are one coordinator record each: the
  NEW record carries the registry's change (the ongoing transaction), the
  decision (an END's, or the coordinator's abort) the next identity
  (`tc._log.apply_record` applies both parts, live and on replay).
- Transactional ids idle longer than the expiration are forgotten (a timer).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from ledger import all_of, resolved, then
from proto import TxnID
from tc._producers import (
    DEFAULT_EXPIRATION_MS,
    MAX_TXN_TIMEOUT_MS,
    ConcurrentTransactionsError,
    InvalidPidMappingError,
    InvalidTransactionTimeoutError,
    InvalidTxnStateError,
    ProducerEntry,
    ProducerEpochError,
    ProducerRegistry,
    TransactionAbortableError,
    identity_of,
)
from tc._status import TxnEvent, TxnStatus
from tc._table import Record, TxnMeta, now_ms, same_outcome

__all__ = ["ProducerEpochMode", "ProducerSettings", "Transactions", "TwoPhaseCommitNotAllowedError"]

log = logging.getLogger(__name__)

_UNDECIDED = (TxnStatus.OPEN, TxnStatus.PREPARED)


class TwoPhaseCommitNotAllowedError(ProducerEpochError):
    """A producer asked for two-phase commit (KIP-939) where the broker does
    not allow it (AUTHORIZATION_ERROR, as Kafka answers); nothing changed."""


@dataclass(frozen=True, slots=True)
class ProducerSettings:
    """The producer-epoch mode's limits (Kafka's names in brackets)."""

    max_txn_timeout_ms: int = MAX_TXN_TIMEOUT_MS  # (transaction.max.timeout.ms)
    expiration_ms: int = DEFAULT_EXPIRATION_MS  # (transactional.id.expiration.ms)
    allow_two_phase: bool = False  # (transaction.two.phase.commit.enable)


class Transactions(Protocol):
    """What the producer-epoch mode asks of its coordinator: its
    transactions, its log, and its decisions."""

    @property
    def tcid(self) -> int: ...

    def get(self, txnid: TxnID) -> TxnMeta | None: ...

    def new_txn(
        self, timeout_ms: int = 0, producer: tuple[int, int] | None = None, two_phase: bool = False
    ) -> TxnID: ...

    def add_partition(self, txnid: TxnID, topic: str, partition: int) -> None: ...

    def add_subscription(self, txnid: TxnID, topic: str, subscription: str) -> None: ...

    def verify_partition(self, txnid: TxnID, topic: str, partition: int) -> None: ...

    def prepare_txn(self, txnid: TxnID) -> asyncio.Future[int]: ...

    def new_producer_txn(
        self,
        timeout_ms: int,
        producer: tuple[int, int],
        two_phase: bool,
        carry: Callable[[TxnID], Record],
        lazy: bool,
    ) -> tuple[TxnID, asyncio.Future[int]]:
        """Open a producer's transaction with one NEW record that carries
        the registry's change ``carry(txnid)`` too; the id and its write."""

    def decide(
        self, meta: TxnMeta, event: TxnEvent, producer: Record | None = None
    ) -> asyncio.Future[None]:
        """Log the decision on an undecided transaction (with the registry's
        change ``producer`` in the same record) and tell its participants;
        done as END's answer."""

    def when_applied(self, txnid: TxnID) -> asyncio.Future[None]:
        """Done once the decision on ``txnid`` (durable) is applied (END's
        answer to a repeated END)."""

    def log_record(self, rec: Record, lazy: bool = False) -> asyncio.Future[int]:
        """Append ``rec`` to the log and apply it; done once durable."""


class ProducerEpochMode:
    """The producer-epoch mode of the coordinator ``txns`` (see the module
    docstring); ``registry`` is the coordinator's, applied by its log."""

    def __init__(
        self, txns: Transactions, registry: ProducerRegistry, settings: ProducerSettings
    ) -> None:
        self.txns = txns
        self.registry = registry
        self.settings = settings
        self._initializing: set[str] = set()  # transactional ids in InitProducerId now
        # Producers' transactions whose begin is not durable yet: the write of
        # the NEW record that names them ongoing (`producer_begin`).
        self._begins: dict[TxnID, asyncio.Future[int]] = {}
        self._expiry: asyncio.TimerHandle | None = None
        self._closed = False

    def close(self) -> None:
        self._closed = True
        if self._expiry is not None:
            self._expiry.cancel()

    # -- queries --------------------------------------------------------------------

    def producer_of(self, producer_id: int) -> ProducerEntry | None:
        """The entry holding ``producer_id`` (None if none does): whose
        transactional id a request carrying only the producer id acts for."""
        try:
            return self.registry.of_producer(producer_id)
        except InvalidPidMappingError:
            return None

    # -- InitProducerId ---------------------------------------------------------------

    async def init_producer(
        self,
        transactional_id: str,
        timeout_ms: int,
        two_phase: bool = False,
        keep_prepared: bool = False,
    ) -> tuple[int, int, int, int]:
        """InitProducerId: (producer id, epoch, ongoing transaction's producer
        id, its epoch; -1 when nothing is kept ongoing).

        A new transactional id gets a new producer id, epoch 0. A known one
        gets the next identity (an older instance is fenced from now on), and
        its unfinished transaction is rolled back (aborted if OPEN or
        PREPARED) or forward (waited for if decided) before the answer, unless
        ``keep_prepared``: then it stays, with its own identity, for the new
        instance to commit, abort or complete. Answered once durable."""
        if not transactional_id:
            raise InvalidTxnStateError("a transactional id is required")
        if two_phase and not self.settings.allow_two_phase:
            raise TwoPhaseCommitNotAllowedError(
                f"transactional id {transactional_id!r} asked for two-phase commit "
                "(TWO_PHASE_COMMIT), which this broker does not allow (txnbuf serve --allow-2pc)"
            )
        if not two_phase and not 1 <= timeout_ms <= self.settings.max_txn_timeout_ms:
            raise InvalidTransactionTimeoutError(
                f"transaction timeout must be 1..{self.settings.max_txn_timeout_ms} ms, "
                f"got {timeout_ms}"
            )
        if transactional_id in self._initializing:
            raise ConcurrentTransactionsError(
                f"transactional id {transactional_id!r} is being initialized; retry"
            )
        self._initializing.add(transactional_id)
        try:
            entry = self.registry.get(transactional_id)
            if entry is None:
                rec = self.registry.first_init(transactional_id, timeout_ms, two_phase, now_ms())
                await self.txns.log_record(rec)
                return (*identity_of(rec), -1, -1)
            if entry.ongoing is not None and not keep_prepared:
                await self._roll(entry.ongoing)
                entry = self.registry.get(transactional_id) or entry
            rec = self.registry.init(entry, timeout_ms, two_phase, keep_prepared, now_ms())
            await self.txns.log_record(rec)
            updated = self.registry.get(transactional_id)
            ongoing = (updated.txn_identity if updated is not None else None) or (-1, -1)
            return (*identity_of(rec), *ongoing)
        finally:
            self._initializing.discard(transactional_id)

    async def terminate_producer(self, transactional_id: str) -> tuple[int, int]:
        """KIP-939's forceTerminateTransaction: InitProducerId without keeping
        the ongoing transaction (it is aborted, the producer fenced)."""
        entry = self.registry.get(transactional_id)
        if entry is None:
            raise KeyError(transactional_id)
        pid, epoch, _, _ = await self.init_producer(
            transactional_id, entry.timeout_ms, entry.two_phase and self.settings.allow_two_phase
        )
        return pid, epoch

    async def _roll(self, txnid: TxnID) -> None:
        """Roll an unfinished transaction back (abort it if OPEN or PREPARED)
        or forward (wait until its decision is applied)."""
        meta = self.txns.get(txnid)
        if meta is None:
            return
        if meta.status in _UNDECIDED:
            await self.txns.decide(meta, TxnEvent.ABORT)
        else:
            await self.txns.when_applied(txnid)

    # -- sends and acks -----------------------------------------------------------------

    def producer_txn(self, producer_id: int, epoch: int, what: str) -> TxnID:
        """The ongoing transaction of the producer a send or ack (``what``)
        comes from, begun now if it has none (KIP-890 part 2); raises the
        producer's refusal (fenced, not allowed in its state, ...)."""
        entry = self.registry.check(producer_id, epoch, what)
        ongoing = self._ongoing_of(entry, what)
        if ongoing is not None:
            return ongoing
        return self._begin(entry, producer_id, epoch, lazy=True)

    def producer_begin(self, producer_id: int, epoch: int, what: str) -> asyncio.Future[TxnID]:
        """`producer_txn` for a producer that begins its transactions
        explicitly (Kafka's AddPartitionsToTxn and AddOffsetsToTxn): its
        ongoing transaction once the begin is durable (at once if it is).

        Sends and acks are answered before they are durable, and a crash
        aborts their transaction; but one that came before the transaction's
        begin was durable loses it altogether, and a Kafka client's EndTxn
        names no transaction: it would find nothing ongoing and succeed,
        committing nothing of what the client was told it wrote. Once the
        begin is durable, a restart finds the transaction OPEN, aborts it and
        bumps the producer's epoch: the client learns it was aborted."""
        entry = self.registry.check(producer_id, epoch, what)
        ongoing = self._ongoing_of(entry, what)
        if ongoing is None:
            ongoing = self._begin(entry, producer_id, epoch, lazy=False)
        txnid = ongoing
        written = self._begins.get(txnid)
        if written is None:
            return resolved(txnid)
        return then(written, lambda _: txnid)

    def _begin(self, entry: ProducerEntry, producer_id: int, epoch: int, lazy: bool) -> TxnID:
        """Open the producer's next transaction and log it as its ongoing one
        (``lazy``: see `ledger.Ledger.append`)."""
        # One NEW record carries the begin (its registry change) too.
        txnid, written = self.txns.new_producer_txn(
            0 if entry.two_phase else entry.timeout_ms,
            entry.identity,
            entry.two_phase,
            lambda txnid: self.registry.begin(entry, txnid, producer_id, epoch, now_ms()),
            lazy,
        )
        self._begins[txnid] = written
        written.add_done_callback(lambda _: self._begins.pop(txnid, None))
        return txnid

    def producer_verified_partition(
        self, producer_id: int, epoch: int, topic: str, partition: int
    ) -> TxnID:
        """A send of a producer that adds its partitions explicitly (Kafka's
        AddPartitionsToTxn before KIP-890 part 2): its ongoing transaction, if
        the partition was added to it (KIP-890 part 1's verification);
        `InvalidTxnStateError` if not, and nothing begins."""
        what = f"send to {topic}/{partition}"
        entry = self.registry.check(producer_id, epoch, what)
        ongoing = self._ongoing_of(entry, what)
        if ongoing is None:
            raise InvalidTxnStateError(
                f"{what} refused: {entry.transactional_id!r} has no ongoing transaction "
                "(add the partition to one first)"
            )
        try:
            self.txns.verify_partition(ongoing, topic, partition)
        except Exception as exc:
            raise InvalidTxnStateError(
                f"{what} refused: the partition was not added to the transaction of "
                f"{entry.transactional_id!r}"
            ) from exc
        return ongoing

    def _ongoing_of(self, entry: ProducerEntry, what: str) -> TxnID | None:
        """``entry``'s OPEN transaction (None if none); raises if it has one
        that a send or ack may not join."""
        tid = entry.transactional_id
        if entry.ongoing is not None:
            if entry.txn_identity != entry.identity:
                raise InvalidTxnStateError(
                    f"{what} refused: {tid!r} was initialized keeping its prepared transaction: "
                    "commit, abort or complete it first"
                )
            meta = self.txns.get(entry.ongoing)
            if meta is not None and meta.status is TxnStatus.OPEN:
                return entry.ongoing
            if meta is not None and meta.status is TxnStatus.PREPARED:
                raise InvalidTxnStateError(
                    f"{what} refused: the transaction of {tid!r} is prepared: commit, abort or "
                    "complete it"
                )
            raise TransactionAbortableError(
                f"{what} refused: the transaction of {tid!r} was aborted; abort it and begin "
                "the next"
            )
        return None

    def producer_add_partition(
        self, producer_id: int, epoch: int, topic: str, partition: int
    ) -> TxnID:
        """A producer's send to a partition: its transaction, with the partition added."""
        txnid = self.producer_txn(producer_id, epoch, f"send to {topic}/{partition}")
        self.txns.add_partition(txnid, topic, partition)
        return txnid

    def producer_add_subscription(
        self, producer_id: int, epoch: int, topic: str, subscription: str
    ) -> TxnID:
        """send_offsets_to_transaction: the producer's transaction, with the subscription added."""
        txnid = self.producer_txn(producer_id, epoch, f"acknowledge on {topic}/{subscription}")
        self.txns.add_subscription(txnid, topic, subscription)
        return txnid

    # -- PREPARE and END ------------------------------------------------------------------

    def prepare_producer_txn(self, producer_id: int, epoch: int) -> asyncio.Future[tuple[int, int]]:
        """KIP-939's prepareTransaction: the ongoing transaction PREPARED
        (`tc.TransactionCoordinator.prepare_txn`, its record queued now, so
        it shares a group commit with the transaction's last writes); the
        result, its identity, once that is durable; refused with nothing
        ongoing, as a commit is (`end_producer_txn`). A refusal is raised at
        once, changing nothing."""
        entry = self.registry.check(producer_id, epoch, "prepare")
        if not entry.two_phase:
            raise InvalidTxnStateError(
                f"prepare refused: {entry.transactional_id!r} did not enable two-phase commit"
            )
        if entry.ongoing is None:
            raise TransactionAbortableError(
                f"prepare refused: producer {producer_id} epoch {epoch} "
                f"({entry.transactional_id!r}) has no transaction here; a broker restart lost "
                "it before any of its writes were durable: abort it and begin the next"
            )
        if entry.txn_identity != entry.identity:
            raise InvalidTxnStateError(
                f"prepare refused: {entry.transactional_id!r} was initialized keeping its "
                "prepared transaction: commit, abort or complete it"
            )
        meta = self.txns.get(entry.ongoing)
        if meta is None or meta.status not in _UNDECIDED:
            raise TransactionAbortableError(
                f"prepare refused: the transaction of {entry.transactional_id!r} was aborted"
            )
        identity = entry.identity
        return then(self.txns.prepare_txn(entry.ongoing), lambda _: identity)

    def end_producer_txn(
        self, producer_id: int, epoch: int, commit: bool, bump: bool = True
    ) -> asyncio.Future[tuple[int, int]]:
        """EndTxn: commit or abort the producer's ongoing transaction and
        bump its identity (KIP-890). With nothing ongoing an abort only
        bumps, and a commit is refused (TRANSACTION_ABORTABLE): clients send
        no END for a transaction that wrote nothing, so the transaction was
        lost in a restart before any of it was durable. The result, the
        identity for its next transaction, once the decision is applied and
        the new identity durable. A retried END (the identity it ended, the
        same outcome) is answered with the identity it was given.

        ``bump=False``: Kafka's EndTxn before version 5 (transactions before
        KIP-890 part 2), whose producer keeps its identity for the next
        transaction: the identity stays, and the producer's sends must name
        partitions added explicitly (`producer_verified_partition`)."""
        outcome = "commit" if commit else "abort"
        entry = self.registry.of_producer(producer_id)
        if (
            (producer_id, epoch) == (entry.prev_producer_id, entry.prev_epoch)
            and entry.prev_outcome == outcome
            and ((producer_id, epoch) != entry.identity or entry.ongoing is None)
        ):
            return resolved(entry.identity)  # (a retry of the END that ended it)
        entry = self.registry.check(producer_id, epoch, f"{outcome} transaction")
        if entry.ongoing is None and commit:
            raise TransactionAbortableError(
                f"commit refused: producer {producer_id} epoch {epoch} "
                f"({entry.transactional_id!r}) has no transaction here; a broker restart lost "
                "it before any of its writes were durable: abort it and begin the next"
            )
        waits: list[asyncio.Future[None] | asyncio.Future[int]] = []
        decide: TxnMeta | None = None
        if entry.ongoing is not None:
            meta = self.txns.get(entry.ongoing)
            if meta is not None and meta.status in _UNDECIDED:
                decide = meta
            elif meta is not None and same_outcome(meta.status, commit):
                waits.append(self.txns.when_applied(entry.ongoing))
            else:
                raise TransactionAbortableError(
                    f"{outcome} refused: the transaction of {entry.transactional_id!r} was "
                    "aborted; abort it and begin the next"
                )
        rec = self.registry.end(entry, producer_id, epoch, commit, bump, now_ms())
        if decide is not None:  # (the decision and the identity's change: one record)
            event = TxnEvent.COMMIT if commit else TxnEvent.ABORT
            waits.append(self.txns.decide(decide, event, rec))
        else:
            waits.append(self.txns.log_record(rec))
        identity = identity_of(rec)
        return then(all_of(waits), lambda _: identity)

    # -- expiry ---------------------------------------------------------------------------

    def expire_producers(self) -> None:
        """Forget the transactional ids idle for longer than their expiration
        (a producer of one gets INVALID_PRODUCER_ID_MAPPING); again later."""
        self._expiry = None
        if self._closed:
            return
        for tid in self.registry.expired(now_ms(), self.settings.expiration_ms):
            log.info("coordinator %d: transactional id %r expired", self.txns.tcid, tid)
            self.txns.log_record(self.registry.expire(tid), lazy=True)
        every = min(60.0, max(0.05, self.settings.expiration_ms / 4000))
        self._expiry = asyncio.get_running_loop().call_later(every, self.expire_producers)
