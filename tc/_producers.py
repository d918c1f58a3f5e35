"""The producer-epoch mode's registry: transactional ids as data, no I/O.

Kafka's transactional producer (KIP-98), with KIP-890's epoch bump per
transaction and KIP-939's two-phase commit, on top of the coordinator's
transactions: a transactional id maps to one entry (`ProducerEntry`) in the
registry of the coordinator its hash picks. The entry holds

- the identity the client uses now, (producer id, epoch): its sends, acks
  and ENDs must carry it; an older epoch is fenced;
- the ongoing transaction (a `TxnID` of this coordinator) and its identity,
  which differs from the client's only after ``init_transactions(
  keep_prepared_txn=True)`` (KIP-939: the prepared transaction keeps its
  identity, the new instance gets a new one);
- the identity before the last END and that END's outcome, so that a
  retried END is answered with success (KIP-890 §Bump Epoch);
- why the identity last changed (``bumped_by``): a new instance (``init``:
  an older one is fenced), an END (``end``: a late write of the ended
  transaction is refused), or the coordinator aborting the transaction
  (``coordinator``: a timeout or a restart; the client may abort and go on).

Every change is a PRODUCER record of the whole entry in the coordinator's
log, applied as it is appended, replayed on start (`apply`). The registry
builds those records (`first_init`, `init`, `begin`, `end`,
`coordinator_abort`, `expire`: pure functions of the registry, like
`tc.TxnTable.decide`) and returns them, not applied: the coordinator logs a
record, then applies it (`tc._epoch_mode` does the I/O).

Producer ids are unique across coordinators: a producer id carries the
coordinator that issued it (`producer_id`, `coordinator_of_producer`: the
one home of that layout), and a counter above every id the coordinator
logged. An epoch bump that would reach `MAX_EPOCH` allocates a new producer
id with epoch 0 (KIP-890's overflow case).
"""

from __future__ import annotations

import dataclasses
import zlib
from dataclasses import dataclass
from typing import Any

from proto import TxnID, wire_txnid
from proto import txnbuf_pb2 as pb

__all__ = [
    "DEFAULT_EXPIRATION_MS",
    "MAX_EPOCH",
    "MAX_TXN_TIMEOUT_MS",
    "ConcurrentTransactionsError",
    "InvalidPidMappingError",
    "InvalidProducerEpochError",
    "InvalidTransactionTimeoutError",
    "InvalidTxnStateError",
    "ProducerEntry",
    "ProducerEpochError",
    "ProducerFencedError",
    "ProducerRegistry",
    "TransactionAbortableError",
    "coordinator_of",
    "coordinator_of_producer",
    "identity_of",
    "producer_id",
]

MAX_EPOCH = 32767  # Kafka's Short.MAX_VALUE: a bump that would reach it takes a new id
MAX_TXN_TIMEOUT_MS = 15 * 60 * 1000  # transaction.max.timeout.ms
DEFAULT_EXPIRATION_MS = 7 * 24 * 3600 * 1000  # transactional.id.expiration.ms
_COUNTER_BITS = 47  # a producer id is tcid << 47 | counter: a positive int64
_NONE = -1

Record = pb.TransactionMetadataEntry


def producer_id(tcid: int, counter: int) -> int:
    """The producer id number ``counter`` issued by coordinator ``tcid``."""
    return (tcid << _COUNTER_BITS) | counter


def coordinator_of_producer(producer_id: int) -> int:
    """The coordinator that issued ``producer_id`` (it holds the producer's
    entry: its requests go there)."""
    return producer_id >> _COUNTER_BITS


def _counter_of(producer_id: int) -> int:
    return producer_id & ((1 << _COUNTER_BITS) - 1)


def identity_of(rec: Record) -> tuple[int, int]:
    """The (producer id, epoch) a PRODUCER record gives its client."""
    return (rec.producer.producer_id, rec.producer.producer_epoch)


# -- errors (Kafka's names; the broker answers each with its code: `broker._errors`) -


class ProducerEpochError(Exception):
    """Base of the producer-epoch mode's refusals; nothing changed."""


class ProducerFencedError(ProducerEpochError):
    """A newer instance of the transactional id has initialized: this one is
    fenced for good (fatal to the producer)."""


class InvalidProducerEpochError(ProducerEpochError):
    """An epoch this producer id does not hold now (a late write of an ended
    transaction, say)."""


class InvalidTxnStateError(ProducerEpochError):
    """Not allowed in the transaction's state (a send after prepare, 2PC not
    enabled, a write after init_transactions(keep_prepared_txn=True), ...)."""


class TransactionAbortableError(ProducerEpochError):
    """The coordinator aborted the transaction (timeout, restart, an
    operator): abort it and go on with the next one."""


class InvalidPidMappingError(ProducerEpochError):
    """No such producer id (never, or its transactional id expired): fatal
    to the producer (KIP-890)."""


class ConcurrentTransactionsError(ProducerEpochError):
    """The transactional id's previous transaction is still ending; retry."""


class InvalidTransactionTimeoutError(ProducerEpochError):
    """A transaction timeout out of range."""


# -- the entry --------------------------------------------------------------------


@dataclass(slots=True)
class ProducerEntry:
    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    two_phase: bool
    updated_ms: int
    txn_producer_id: int = _NONE
    txn_epoch: int = _NONE
    ongoing: TxnID | None = None
    prev_producer_id: int = _NONE
    prev_epoch: int = _NONE
    prev_outcome: str = ""  # "commit" / "abort"
    bumped_by: str = "init"  # "init" / "end" / "coordinator"

    @property
    def identity(self) -> tuple[int, int]:
        return (self.producer_id, self.epoch)

    @property
    def txn_identity(self) -> tuple[int, int] | None:
        """The ongoing transaction's (producer id, epoch), if one is ongoing."""
        return None if self.ongoing is None else (self.txn_producer_id, self.txn_epoch)

    def to_record(self) -> pb.TransactionalProducer:
        rec = pb.TransactionalProducer(
            transactional_id=self.transactional_id,
            producer_id=self.producer_id,
            producer_epoch=self.epoch,
            txn_producer_id=self.txn_producer_id,
            txn_epoch=self.txn_epoch,
            has_ongoing=self.ongoing is not None,
            prev_producer_id=self.prev_producer_id,
            prev_epoch=self.prev_epoch,
            prev_outcome=self.prev_outcome,
            bumped_by=self.bumped_by,
            timeout_ms=self.timeout_ms,
            two_phase=self.two_phase,
            updated_ms=self.updated_ms,
        )
        if self.ongoing is not None:
            rec.ongoing_most_bits, rec.ongoing_least_bits = self.ongoing
        return rec

    @classmethod
    def from_record(cls, rec: pb.TransactionalProducer) -> ProducerEntry:
        return cls(
            transactional_id=rec.transactional_id,
            producer_id=rec.producer_id,
            epoch=rec.producer_epoch,
            timeout_ms=rec.timeout_ms,
            two_phase=rec.two_phase,
            updated_ms=rec.updated_ms,
            txn_producer_id=rec.txn_producer_id,
            txn_epoch=rec.txn_epoch,
            ongoing=wire_txnid(rec.ongoing_most_bits, rec.ongoing_least_bits)
            if rec.has_ongoing
            else None,
            prev_producer_id=rec.prev_producer_id,
            prev_epoch=rec.prev_epoch,
            prev_outcome=rec.prev_outcome,
            bumped_by=rec.bumped_by,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.epoch,
            "ongoing_txnid": None if self.ongoing is None else str(self.ongoing),
            "ongoing_txn_producer_id": self.txn_producer_id if self.ongoing else _NONE,
            "ongoing_txn_epoch": self.txn_epoch if self.ongoing else _NONE,
            "previous_producer_id": self.prev_producer_id,
            "previous_epoch": self.prev_epoch,
            "previous_outcome": self.prev_outcome or None,
            "bumped_by": self.bumped_by,
            "transaction_timeout_ms": self.timeout_ms,
            "two_phase": self.two_phase,
            "updated_ms": self.updated_ms,
        }


def coordinator_of(transactional_id: str, tc_ids: list[int]) -> int:
    """The coordinator a transactional id maps to: the same one for every
    instance and every restart (a stable hash over the sorted ids)."""
    ids = sorted(tc_ids)
    return ids[zlib.crc32(transactional_id.encode()) % len(ids)]


# -- the registry -------------------------------------------------------------------


class ProducerRegistry:
    def __init__(self, tcid: int) -> None:
        self.tcid = tcid
        self.entries: dict[str, ProducerEntry] = {}
        # Every producer id an entry holds (now, of its ongoing transaction,
        # or before its last END) -> the transactional id.
        self._by_pid: dict[int, str] = {}
        self._next_counter = 0

    # -- queries --------------------------------------------------------------------

    def get(self, transactional_id: str) -> ProducerEntry | None:
        return self.entries.get(transactional_id)

    def of_producer(self, producer_id: int) -> ProducerEntry:
        """The entry that holds ``producer_id``; `InvalidPidMappingError` if none."""
        tid = self._by_pid.get(producer_id)
        entry = None if tid is None else self.entries.get(tid)
        if entry is None:
            raise InvalidPidMappingError(
                f"producer id {producer_id} is not known to coordinator {self.tcid} (never "
                "initialized here, or its transactional id expired): initialize a new producer"
            )
        return entry

    def check(self, producer_id: int, epoch: int, what: str) -> ProducerEntry:
        """The entry of a request (``what``) carrying (``producer_id``,
        ``epoch``), if that is the identity its client holds now; raises
        the refusal Kafka's producer understands otherwise."""
        entry = self.of_producer(producer_id)
        if (producer_id, epoch) == entry.identity:
            return entry
        tid = entry.transactional_id
        newer = producer_id != entry.producer_id or epoch < entry.epoch
        if not newer:
            raise InvalidProducerEpochError(
                f"{what} refused: transactional id {tid!r} holds epoch {entry.epoch} of producer "
                f"{producer_id}, not {epoch}"
            )
        if entry.bumped_by == "init":
            raise ProducerFencedError(
                f"{what} refused: producer {producer_id} epoch {epoch} of transactional id "
                f"{tid!r} is fenced by a newer instance (producer {entry.producer_id} epoch "
                f"{entry.epoch})"
            )
        if entry.bumped_by == "coordinator" and (producer_id, epoch) == (
            entry.prev_producer_id,
            entry.prev_epoch,
        ):
            raise TransactionAbortableError(
                f"{what} refused: the coordinator aborted the transaction of producer "
                f"{producer_id} epoch {epoch} ({tid!r}; it timed out, or the broker restarted): "
                "abort it and begin the next"
            )
        raise InvalidProducerEpochError(
            f"{what} refused: producer {producer_id} epoch {epoch} of transactional id {tid!r} "
            f"ended its transaction; the current epoch is {entry.epoch}"
        )

    def expired(self, now_ms: int, expiration_ms: int) -> list[str]:
        """Transactional ids idle (nothing ongoing) for longer than ``expiration_ms``."""
        return [
            tid
            for tid, e in self.entries.items()
            if e.ongoing is None and now_ms - e.updated_ms > expiration_ms
        ]

    def active_open_time_max_ms(self, start_of: dict[TxnID, int], now_ms: int) -> int:
        """KIP-939's active-transaction-open-time-max: the longest an ongoing
        transaction has been open (``start_of``: its start), 0 if none."""
        starts = [start_of[e.ongoing] for e in self.entries.values() if e.ongoing in start_of]
        return max((now_ms - s for s in starts), default=0)

    # -- identities -----------------------------------------------------------------

    def allocate(self) -> int:
        """A producer id never handed out by this coordinator (it is taken
        once the record holding it is applied)."""
        return producer_id(self.tcid, self._next_counter)

    def bump(self, producer_id: int, epoch: int) -> tuple[int, int]:
        """The next identity: the next epoch, or a new producer id with epoch 0
        where the next epoch would reach `MAX_EPOCH`."""
        if epoch + 1 >= MAX_EPOCH:
            return self.allocate(), 0
        return producer_id, epoch + 1

    # -- records asked for ---------------------------------------------------------

    def first_init(
        self, transactional_id: str, timeout_ms: int, two_phase: bool, now_ms: int
    ) -> Record:
        """The record of a transactional id's first InitProducerId: a new
        producer id, epoch 0."""
        entry = ProducerEntry(transactional_id, self.allocate(), 0, timeout_ms, two_phase, now_ms)
        return _record(entry)

    def init(
        self,
        entry: ProducerEntry,
        timeout_ms: int,
        two_phase: bool,
        keep_prepared: bool,
        now_ms: int,
    ) -> Record:
        """The record of a known transactional id's InitProducerId: the next
        identity, fencing every older instance (``bumped_by`` "init"). The
        ongoing transaction stays, with its own identity, only if
        ``keep_prepared`` (KIP-939); otherwise it has been rolled already."""
        pid, epoch = self.bump(*entry.identity)
        kept = entry.ongoing is not None and keep_prepared
        return _record(
            dataclasses.replace(
                entry,
                producer_id=pid,
                epoch=epoch,
                timeout_ms=timeout_ms,
                two_phase=two_phase,
                updated_ms=now_ms,
                bumped_by="init",
                ongoing=entry.ongoing if kept else None,
                txn_producer_id=entry.txn_producer_id if kept else _NONE,
                txn_epoch=entry.txn_epoch if kept else _NONE,
            )
        )

    @staticmethod
    def begin(
        entry: ProducerEntry, txnid: TxnID, producer_id: int, epoch: int, now_ms: int
    ) -> Record:
        """The record that makes ``txnid`` the producer's ongoing transaction,
        of identity (``producer_id``, ``epoch``)."""
        return _record(
            dataclasses.replace(
                entry,
                ongoing=txnid,
                txn_producer_id=producer_id,
                txn_epoch=epoch,
                updated_ms=now_ms,
            )
        )

    def end(
        self,
        entry: ProducerEntry,
        producer_id: int,
        epoch: int,
        commit: bool,
        bump: bool,
        now_ms: int,
    ) -> Record:
        """The record of EndTxn by (``producer_id``, ``epoch``): nothing
        ongoing, that identity and outcome remembered (a retried END is
        answered with success), and the next identity (KIP-890; ``bump``
        False: Kafka's EndTxn before version 5, which keeps it)."""
        pid, next_epoch = self.bump(*entry.identity) if bump else entry.identity
        return _record(
            _ended(
                entry,
                (pid, next_epoch),
                (producer_id, epoch),
                "commit" if commit else "abort",
                "end" if bump else entry.bumped_by,
                now_ms,
            )
        )

    def coordinator_abort(self, txnid: TxnID, producer: int, now_ms: int) -> Record | None:
        """The record of the coordinator aborting ``txnid`` (a timeout, a
        restart, an operator), a transaction of producer id ``producer``:
        if it is that producer's ongoing one, of its current identity, the
        next identity (``bumped_by`` "coordinator": a late write of it is
        refused, and its client learns it may abort and go on). None if
        there is nothing to change."""
        tid = self._by_pid.get(producer)
        entry = None if tid is None else self.entries.get(tid)
        if entry is None or entry.ongoing != txnid or entry.txn_identity != entry.identity:
            return None
        return _record(
            _ended(
                entry, self.bump(*entry.identity), entry.identity, "abort", "coordinator", now_ms
            )
        )

    @staticmethod
    def expire(transactional_id: str) -> Record:
        """The record that forgets ``transactional_id`` (its producer ids
        are then unknown: INVALID_PRODUCER_ID_MAPPING)."""
        return Record(
            metadata_op=Record.PRODUCER_EXPIRED,
            producer=pb.TransactionalProducer(transactional_id=transactional_id),
        )

    # -- changes ----------------------------------------------------------------------

    def apply(self, rec: Record) -> bool:
        """Apply a PRODUCER / PRODUCER_EXPIRED record, or the entry a
        producer's NEW or UPDATE carries (live and in recovery)."""
        if rec.metadata_op == Record.PRODUCER or (
            rec.metadata_op in (Record.NEW, Record.UPDATE) and rec.HasField("producer")
        ):
            self._put(ProducerEntry.from_record(rec.producer))
            return True
        if rec.metadata_op == Record.PRODUCER_EXPIRED:
            entry = self.entries.pop(rec.producer.transactional_id, None)
            if entry is not None:
                self._unindex(entry)
            return True
        return False

    def _put(self, entry: ProducerEntry) -> None:
        old = self.entries.get(entry.transactional_id)
        if old is not None:
            self._unindex(old)
        self.entries[entry.transactional_id] = entry
        for pid in (entry.producer_id, entry.txn_producer_id, entry.prev_producer_id):
            if pid != _NONE:
                self._by_pid[pid] = entry.transactional_id
                if coordinator_of_producer(pid) == self.tcid:
                    self._next_counter = max(self._next_counter, _counter_of(pid) + 1)

    def _unindex(self, entry: ProducerEntry) -> None:
        for pid in (entry.producer_id, entry.txn_producer_id, entry.prev_producer_id):
            if self._by_pid.get(pid) == entry.transactional_id:
                del self._by_pid[pid]

    # -- snapshots ------------------------------------------------------------------

    def snapshot(self) -> list[str]:
        return [e.to_record().SerializeToString().hex() for e in self.entries.values()]

    def restore(self, snap: list[str]) -> None:
        for text in snap:
            self._put(
                ProducerEntry.from_record(pb.TransactionalProducer.FromString(bytes.fromhex(text)))
            )


def _record(entry: ProducerEntry) -> Record:
    return Record(metadata_op=Record.PRODUCER, producer=entry.to_record())


def _ended(
    entry: ProducerEntry,
    identity: tuple[int, int],
    ended: tuple[int, int],
    outcome: str,
    bumped_by: str,
    now_ms: int,
) -> ProducerEntry:
    """``entry`` once its transaction ended (``outcome``) as ``ended``:
    nothing ongoing, the identity ``identity``."""
    return dataclasses.replace(
        entry,
        producer_id=identity[0],
        epoch=identity[1],
        ongoing=None,
        txn_producer_id=_NONE,
        txn_epoch=_NONE,
        prev_producer_id=ended[0],
        prev_epoch=ended[1],
        prev_outcome=outcome,
        bumped_by=bumped_by,
        updated_ms=now_ms,
    )
