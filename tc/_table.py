"""A coordinator's transactions as data: the transaction table, no I/O.

`TxnTable` holds what one coordinator knows (PIP-31 §Transaction Log): its
transactions that have not ended (status, timeout, participants), the
recently ended ones, the deadlines of the OPEN ones, and where its ids are.
It changes in exactly two ways:

- `apply(record)`: a `TransactionMetadataEntry` of the log (NEW, UPDATE,
  BOOT, GROUP), live and on recovery alike;
- `register`: a participant joins an OPEN transaction. Registrations are
  not logged: the decision record names every participant, which is all a
  restart needs to finish a decided transaction (one left OPEN by a crash
  is aborted, and its participants abort what they hold of it).

The records it is asked for (`new`, `decide`, `finish`, `boot`, `group`) are built,
checked against the status table (`tc._status`) and returned, not applied:
the coordinator logs a record, then applies it (see `tc._coordinator`).
`snapshot` / `restore` turn the table into plain data and back.

A TxnID's 112-bit counter is a boot epoch and a sequence (`TxnID.issued`):
each start of the coordinator logs BOOT with a new epoch before it hands out
an id, so an id answered before its NEW record was durable (and lost in a
crash) is never handed out again, and ids grow across restarts.

Transaction groups (an exactly-once sink's batches, `pipelines`): a
transaction may carry a ``tag`` (indexed while it has not ended, so that
the undecided ones of a tag are found and aborted) and a prepared timeout
(once PREPARED, it is aborted if not decided within it: a sink's job may
die before it decides). A GROUP record commits a set of PREPARED
transactions and aborts others, as one decision, under the key (group,
sequence); the table remembers each group's highest committed sequence
(the `GROUPS_KEPT` groups used last, all of them in snapshots), so a GROUP
asked for again at that sequence or below is a duplicate: it commits
nothing, and aborts what it names.
"""

from __future__ import annotations

import collections
import time
from dataclasses import dataclass, field
from typing import Any

from sortedcontainers import SortedList

from proto import TxnID, wire_txnid
from proto import txnbuf_pb2 as pb
from tc._status import (
    InvalidTxnStatusError,
    TxnEvent,
    TxnStatus,
    check_update,
    status_of,
    transition,
    wire_status,
)

__all__ = [
    "DEFAULT_TIMEOUT_MS",
    "ENDED_IN_SNAPSHOT",
    "ENDED_KEPT",
    "GROUPS_KEPT",
    "MAX_TIMEOUT_MS",
    "Record",
    "TxnArgumentError",
    "TxnMeta",
    "TxnNotFoundError",
    "TxnTable",
    "TxnTimeoutError",
    "now_ms",
]

Record = pb.TransactionMetadataEntry
DEFAULT_TIMEOUT_MS = 60_000
MAX_TIMEOUT_MS = 3_600_000
MAX_PREPARED_TIMEOUT_MS = 7 * 24 * 3_600_000
MAX_TAG_LENGTH = 1024
ENDED_KEPT = 10_000  # ended transactions remembered, so a repeated END is answered
ENDED_IN_SNAPSHOT = 1000  # of which the newest survive a restart
GROUPS_KEPT = 10_000  # groups whose highest committed sequence is remembered
_UNDECIDED = (TxnStatus.OPEN, TxnStatus.PREPARED)


def now_ms() -> int:
    """The wall clock in milliseconds, as the records hold times (the
    coordinator passes it in: the table reads no clock)."""
    return time.time_ns() // 1_000_000


class TxnNotFoundError(LookupError):
    """No such transaction on this coordinator (never, or ended long ago)."""


class TxnTimeoutError(InvalidTxnStatusError):
    """The transaction was aborted by its timeout (TRANSACTION_TIMEOUT: an
    `InvalidTxnStatusError` whose status allows nothing more)."""


class TxnArgumentError(ValueError):
    """An argument of a transaction request out of range (a timeout, a tag,
    a group's name or sequence); nothing changed."""


@dataclass(slots=True)
class TxnMeta:
    txnid: TxnID
    status: TxnStatus
    timeout_ms: int
    start_ms: int
    last_modified_ms: int
    partitions: list[tuple[str, int]] = field(default_factory=list)
    subscriptions: list[tuple[str, str]] = field(default_factory=list)
    timed_out: bool = False
    # The producer-epoch mode: the (producer id, epoch) the transaction
    # belongs to, and whether it is two-phase (never times out).
    producer: tuple[int, int] | None = None
    two_phase: bool = False
    # A label (a sink's "<query id>/<batch id>"), and how long it may stay
    # PREPARED (0: for ever).
    tag: str = ""
    prepared_timeout_ms: int = 0
    # A local transaction's commit: the number its client drew for it.
    commit_id: int = 0

    @property
    def deadline_ms(self) -> int | None:
        """When it times out: OPEN, at its start plus its timeout (never
        for a two-phase one); PREPARED, at its prepare (its last change)
        plus its prepared timeout, if it has one; else None."""
        if self.status is TxnStatus.PREPARED:
            if self.prepared_timeout_ms > 0:
                return self.last_modified_ms + self.prepared_timeout_ms
            return None
        if self.two_phase or self.status is not TxnStatus.OPEN:
            return None
        return self.start_ms + self.timeout_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "txnid": str(self.txnid),
            "tc_id": self.txnid.tcid,
            "status": self.status.name,
            "timeout_ms": self.timeout_ms,
            "start_ms": self.start_ms,
            "last_modified_ms": self.last_modified_ms,
            "partitions": [{"topic": t, "partition": p} for t, p in self.partitions],
            "subscriptions": [{"topic": t, "subscription": s} for t, s in self.subscriptions],
            "timed_out": self.timed_out,
            "producer": None
            if self.producer is None
            else {"producer_id": self.producer[0], "producer_epoch": self.producer[1]},
            "two_phase": self.two_phase,
            "tag": self.tag,
            "prepared_timeout_ms": self.prepared_timeout_ms,
            "commit_id": self.commit_id,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TxnMeta:
        return cls(
            txnid=TxnID.parse(d["txnid"]),
            status=TxnStatus[d["status"]],
            timeout_ms=int(d["timeout_ms"]),
            start_ms=int(d["start_ms"]),
            last_modified_ms=int(d["last_modified_ms"]),
            partitions=[(p["topic"], int(p["partition"])) for p in d["partitions"]],
            subscriptions=[(s["topic"], s["subscription"]) for s in d["subscriptions"]],
            timed_out=bool(d["timed_out"]),
            producer=None
            if d.get("producer") is None
            else (int(d["producer"]["producer_id"]), int(d["producer"]["producer_epoch"])),
            two_phase=bool(d.get("two_phase", False)),
            tag=str(d.get("tag", "")),
            prepared_timeout_ms=int(d.get("prepared_timeout_ms", 0)),
            commit_id=int(d.get("commit_id", 0)),
        )


def same_outcome(status: TxnStatus, commit: bool) -> bool:
    """Has a transaction in ``status`` been decided the way ``commit`` asks?"""
    if commit:
        return status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED)
    return status in (TxnStatus.ABORTING, TxnStatus.ABORTED)


class TxnTable:
    def __init__(self, tcid: int) -> None:
        self.tcid = tcid
        self.txns: dict[TxnID, TxnMeta] = {}  # not ended
        self.ended: collections.OrderedDict[TxnID, TxnMeta] = collections.OrderedDict()
        # (deadline_ms, txnid) of the OPEN ones, and of the PREPARED ones
        # with a prepared timeout
        self.deadlines: SortedList = SortedList()
        self.tagged: dict[str, set[TxnID]] = {}  # tag -> its transactions not ended
        # group -> the highest sequence committed in it, least recently used first
        self.groups: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.epoch = 0  # the boot epoch of the ids handed out now
        self.next_seq = 0  # the next id's sequence in this epoch
        self.highest_epoch = 0  # the highest epoch any record names

    # -- queries --------------------------------------------------------------------

    def get(self, txnid: TxnID) -> TxnMeta | None:
        return self.txns.get(txnid) or self.ended.get(txnid)

    def live(self, txnid: TxnID) -> TxnMeta:
        """``txnid``'s record; `TxnNotFoundError` saying why if there is none."""
        meta = self.get(txnid)
        if meta is None or txnid.tcid != self.tcid:
            why = ""
            if txnid.tcid == self.tcid and txnid.epoch < self.epoch:
                why = (
                    " (it was open when the coordinator restarted, which aborted it, or it "
                    "ended long ago)"
                )
            raise TxnNotFoundError(
                f"transaction {txnid} is not known to coordinator {self.tcid}{why}"
            )
        return meta

    def is_open(self, txnid: TxnID) -> bool:
        meta = self.txns.get(txnid)
        return meta is not None and meta.status is TxnStatus.OPEN

    def open_one(self, txnid: TxnID, what: str) -> TxnMeta:
        """``txnid``'s record if it is OPEN; raises saying why not (``what``
        names the refused request)."""
        meta = self.live(txnid)
        if meta.status is not TxnStatus.OPEN:
            if meta.timed_out:
                raise TxnTimeoutError(meta.status, f"{what} (timed out)")
            raise InvalidTxnStatusError(meta.status, what)
        return meta

    def verify_partition(self, txnid: TxnID, topic: str, partition: int) -> None:
        """KIP-890's check before a transactional write: OPEN, partition registered."""
        meta = self.open_one(txnid, "write to")
        if (topic, partition) not in meta.partitions:
            raise InvalidTxnStatusError(
                meta.status, f"write to partition {topic}/{partition} (not added to) "
            )

    def verify_subscription(self, txnid: TxnID, topic: str, subscription: str) -> None:
        """The same check before a transactional acknowledgement."""
        meta = self.open_one(txnid, "acknowledge in")
        if (topic, subscription) not in meta.subscriptions:
            raise InvalidTxnStatusError(
                meta.status, f"acknowledge on {topic}/{subscription} (not added to) "
            )

    def expired(self, now_ms: int) -> list[TxnID]:
        """The OPEN (or PREPARED with a prepared timeout) transactions whose
        deadline has passed (each once: they leave the deadline index)."""
        out = []
        while self.deadlines and self.deadlines[0][0] <= now_ms:
            deadline, txnid = self.deadlines.pop(0)
            meta = self.txns.get(txnid)
            if meta is not None and meta.status in _UNDECIDED and meta.deadline_ms == deadline:
                out.append(txnid)
        return out

    def with_tag(self, tag: str, prefix: bool = False) -> list[TxnMeta]:
        """The transactions not ended that are tagged ``tag`` (with
        ``prefix``: whose tag starts with it), oldest first."""
        if prefix:
            ids = [t for name, ts in self.tagged.items() if name.startswith(tag) for t in ts]
        else:
            ids = list(self.tagged.get(tag, ()))
        return sorted((self.txns[t] for t in ids), key=lambda m: m.txnid)

    def group_sequence(self, group: str) -> int | None:
        """The highest sequence committed in ``group`` (None: none remembered)."""
        return self.groups.get(group)

    def next_deadline(self) -> int | None:
        return self.deadlines[0][0] if self.deadlines else None

    # -- records asked for ----------------------------------------------------------

    def boot(self) -> Record:
        """The BOOT record of a start: a new epoch above every one seen."""
        return Record(metadata_op=Record.BOOT, boot_epoch=self.highest_epoch + 1)

    def new(
        self,
        timeout_ms: int,
        now_ms: int,
        producer: tuple[int, int] | None = None,
        two_phase: bool = False,
        tag: str = "",
        prepared_timeout_ms: int = 0,
    ) -> Record:
        """The NEW record of the next transaction (its id: `next_txnid`);
        ``producer`` and ``two_phase`` for the producer-epoch mode, ``tag``
        and ``prepared_timeout_ms`` for transaction groups."""
        if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
            raise TxnArgumentError(
                f"transaction timeout must be 0..{MAX_TIMEOUT_MS} ms, got {timeout_ms}"
            )
        if not 0 <= prepared_timeout_ms <= MAX_PREPARED_TIMEOUT_MS:
            raise TxnArgumentError(
                f"prepared timeout must be 0..{MAX_PREPARED_TIMEOUT_MS} ms, "
                f"got {prepared_timeout_ms}"
            )
        if len(tag) > MAX_TAG_LENGTH:
            raise TxnArgumentError(f"a tag is at most {MAX_TAG_LENGTH} characters, got {len(tag)}")
        txnid = self.next_txnid()
        rec = Record(
            metadata_op=Record.NEW,
            txnid_most_bits=txnid.most_bits,
            txnid_least_bits=txnid.least_bits,
            new_status=pb.OPEN,
            txn_timeout_ms=timeout_ms or DEFAULT_TIMEOUT_MS,
            txn_start_time=now_ms,
            txn_last_modification_time=now_ms,
            two_phase=two_phase,
            tag=tag,
            prepared_timeout_ms=prepared_timeout_ms,
        )
        if producer is not None:
            rec.producer_id, rec.producer_epoch = producer
        return rec

    def next_txnid(self) -> TxnID:
        if self.epoch == 0:
            raise RuntimeError(f"coordinator {self.tcid} has not booted (no BOOT record)")
        return TxnID.issued(self.tcid, self.epoch, self.next_seq)

    def decide(self, txnid: TxnID, event: TxnEvent, now_ms: int) -> Record:
        """The decision record (COMMITTING / ABORTING) of an OPEN or
        PREPARED transaction, or the PREPARED record of an OPEN one
        (``event`` PREPARE); it names every participant, so a restart can
        finish it from this record alone. Raises if ``event`` does not apply."""
        meta = self.live(txnid)
        rec = self._update(meta, transition(meta.status, event), now_ms)
        rec.timed_out = event is TxnEvent.TIMEOUT
        for topic, index in meta.partitions:
            rec.partitions.add(topic=topic, partition=index)
        for topic, sub in meta.subscriptions:
            rec.subscriptions.add(topic=topic, subscription=sub)
        return rec

    def local_commit(
        self,
        txnid: TxnID,
        partitions: list[tuple[str, int]],
        subscriptions: list[tuple[str, str]],
        now_ms: int,
        commit_id: int,
    ) -> Record:
        """The one record of a local transaction's commit (OPEN ->
        COMMITTED, `TxnEvent.COMMIT_LOCAL`), naming the partitions and
        subscriptions it wrote and the commit's number: written in the group
        commit of those writes, it is the decision and the end at once.
        Raises (nothing built) unless `may_commit_local`."""
        meta = self.may_commit_local(txnid, now_ms)
        rec = self._update(meta, transition(meta.status, TxnEvent.COMMIT_LOCAL), now_ms)
        rec.commit_id = commit_id
        for topic, index in partitions:
            rec.partitions.add(topic=topic, partition=index)
        for topic, sub in subscriptions:
            rec.subscriptions.add(topic=topic, subscription=sub)
        return rec

    def may_commit_local(self, txnid: TxnID, now_ms: int) -> TxnMeta:
        """``txnid``'s record if it may commit as a local transaction now:
        OPEN and not past its deadline, not a producer's (the producer-epoch
        mode ends its own), not two-phase, and nothing of it written the
        full way yet (no participant registered: such writes need their
        markers). Raises saying why not, changing nothing."""
        meta = self.open_one(txnid, "commit")
        if meta.producer is not None or meta.two_phase:
            raise InvalidTxnStatusError(
                meta.status,
                f"commit {txnid} in one record (a producer's or two-phase transaction ends "
                "through its producer or its prepare) ",
            )
        if meta.partitions or meta.subscriptions:
            raise InvalidTxnStatusError(
                meta.status,
                f"commit {txnid} in one record (sends or acks of it were written already: "
                "end it with END_TXN) ",
            )
        deadline = meta.deadline_ms
        if deadline is not None and now_ms >= deadline:
            raise TxnTimeoutError(meta.status, "commit (its timeout has passed)")
        return meta

    def finish(self, txnid: TxnID, now_ms: int) -> Record:
        """The end record (COMMITTED / ABORTED) of a decided transaction,
        every participant having applied its decision."""
        meta = self.live(txnid)
        return self._update(meta, transition(meta.status, TxnEvent.FINISH), now_ms)

    def group(
        self,
        group: str,
        sequence: int,
        commit: list[TxnID],
        abort_tag: str,
        now_ms: int,
    ) -> Record:
        """The GROUP record that commits ``commit`` (every one PREPARED) as
        one decision under the key (``group``, ``sequence``), and aborts the
        undecided transactions tagged ``abort_tag`` that it does not commit.
        If ``group`` has committed ``sequence`` or a later one already, the
        record is a duplicate: it commits nothing and aborts the undecided
        ones of ``commit`` too. Raises (nothing built) for an empty
        ``group``, an unknown transaction, one of a producer, or one to
        commit that is not PREPARED."""
        if not group:
            raise TxnArgumentError("a group commit needs a group name")
        if not 0 <= sequence < 1 << 63:
            raise TxnArgumentError(f"a group sequence is 0..2**63-1, got {sequence}")
        members = list(dict.fromkeys(commit))
        known = self.groups.get(group)
        duplicate = known is not None and sequence <= known
        rec = Record(
            metadata_op=Record.GROUP,
            group_id=group,
            group_sequence=sequence,
            group_duplicate=duplicate,
        )
        metas = [self.live(txnid) for txnid in members]
        for meta in metas:
            if meta.producer is not None:
                raise InvalidTxnStatusError(
                    meta.status,
                    f"commit in group {group!r}: transaction {meta.txnid} belongs to producer "
                    f"{meta.producer[0]}, which commits it",
                )
            if not duplicate and meta.status is not TxnStatus.PREPARED:
                raise InvalidTxnStatusError(
                    meta.status, f"commit in group {group!r} (only a PREPARED transaction may be)"
                )
        for meta in metas:
            if not duplicate:
                rec.group_updates.append(self.decide(meta.txnid, TxnEvent.COMMIT, now_ms))
            elif meta.status in _UNDECIDED:
                rec.group_updates.append(self.decide(meta.txnid, TxnEvent.ABORT, now_ms))
        if abort_tag:
            named = set(members)
            for meta in self.with_tag(abort_tag):
                if meta.txnid not in named and meta.status in _UNDECIDED:
                    rec.group_updates.append(self.decide(meta.txnid, TxnEvent.ABORT, now_ms))
        return rec

    @staticmethod
    def _update(meta: TxnMeta, new: TxnStatus, now_ms: int) -> Record:
        return Record(
            metadata_op=Record.UPDATE,
            txnid_most_bits=meta.txnid.most_bits,
            txnid_least_bits=meta.txnid.least_bits,
            expected_status=wire_status(meta.status),
            new_status=wire_status(new),
            txn_last_modification_time=now_ms,
        )

    # -- changes ----------------------------------------------------------------------

    def register(
        self,
        txnid: TxnID,
        partitions: list[tuple[str, int]] = (),  # type: ignore[assignment]
        subscriptions: list[tuple[str, str]] = (),  # type: ignore[assignment]
        now_ms: int = 0,
    ) -> bool:
        """Add participants to an OPEN transaction (each once); raises if it
        is not OPEN. True if one of them is new to it."""
        meta = self.open_one(txnid, "add participants to")
        added = False
        for p in partitions:
            if p not in meta.partitions:
                meta.partitions.append(p)
                added = True
        for s in subscriptions:
            if s not in meta.subscriptions:
                meta.subscriptions.append(s)
                added = True
        meta.last_modified_ms = max(meta.last_modified_ms, now_ms)
        return added

    def apply(self, rec: Record) -> bool:
        """Apply one log record (live and in recovery). False: ignored, the
        transaction being unknown or no longer in the status it expects."""
        op = rec.metadata_op
        if op == Record.NEW:
            return self._apply_new(rec)
        if op == Record.UPDATE:
            return self._apply_update(rec)
        if op == Record.BOOT:
            self.epoch = rec.boot_epoch
            self.next_seq = 0
            self.highest_epoch = max(self.highest_epoch, rec.boot_epoch)
            return True
        if op == Record.GROUP:
            self._apply_group(rec)
            return True
        if op == Record.REGISTER:
            return self._apply_register(rec)
        return False

    def _apply_register(self, rec: Record) -> bool:
        """A REGISTER record: participants added to an OPEN transaction
        (on other brokers; in a cluster, on this one too: see `tc`), ignored
        if it is no longer OPEN."""
        meta = self.txns.get(wire_txnid(rec.txnid_most_bits, rec.txnid_least_bits))
        if meta is None or meta.status is not TxnStatus.OPEN:
            return False
        for p in rec.partitions:
            if (p.topic, p.partition) not in meta.partitions:
                meta.partitions.append((p.topic, p.partition))
        for s in rec.subscriptions:
            if (s.topic, s.subscription) not in meta.subscriptions:
                meta.subscriptions.append((s.topic, s.subscription))
        meta.last_modified_ms = max(meta.last_modified_ms, rec.txn_last_modification_time)
        return True

    def _apply_group(self, rec: Record) -> None:
        """A GROUP record: every update it carries (those no longer
        applicable are ignored, as a lone UPDATE's would be), and, unless it
        is a duplicate, the group's committed sequence."""
        for update in rec.group_updates:
            self._apply_update(update)
        if not rec.group_duplicate:
            self._remember_group(rec.group_id, rec.group_sequence)

    def _remember_group(self, group: str, sequence: int) -> None:
        groups = self.groups
        groups[group] = max(sequence, groups.get(group, sequence))
        groups.move_to_end(group)
        while len(groups) > GROUPS_KEPT:
            groups.popitem(last=False)

    def _apply_new(self, rec: Record) -> bool:
        txnid = wire_txnid(rec.txnid_most_bits, rec.txnid_least_bits)
        meta = TxnMeta(
            txnid=txnid,
            status=TxnStatus.OPEN,
            timeout_ms=rec.txn_timeout_ms,
            start_ms=rec.txn_start_time,
            last_modified_ms=rec.txn_last_modification_time,
            producer=(rec.producer_id, rec.producer_epoch) if rec.HasField("producer_id") else None,
            two_phase=rec.two_phase,
            tag=rec.tag,
            prepared_timeout_ms=rec.prepared_timeout_ms,
        )
        self.txns[txnid] = meta
        if meta.tag:
            self.tagged.setdefault(meta.tag, set()).add(txnid)
        epoch, seq = txnid.epoch, txnid.sequence
        self.highest_epoch = max(self.highest_epoch, epoch)
        if epoch == self.epoch:
            self.next_seq = max(self.next_seq, seq + 1)
        if meta.deadline_ms is not None:
            self.deadlines.add((meta.deadline_ms, txnid))
        return True

    def _apply_update(self, rec: Record) -> bool:
        txnid = wire_txnid(rec.txnid_most_bits, rec.txnid_least_bits)
        meta = self.txns.get(txnid)
        expected = status_of(rec.expected_status)
        if meta is None or meta.status is not expected:
            return False
        new = check_update(expected, status_of(rec.new_status))
        if expected is TxnStatus.OPEN:  # a decision (or PREPARED): it names the participants
            for p in rec.partitions:
                if (p.topic, p.partition) not in meta.partitions:
                    meta.partitions.append((p.topic, p.partition))
            for s in rec.subscriptions:
                if (s.topic, s.subscription) not in meta.subscriptions:
                    meta.subscriptions.append((s.topic, s.subscription))
        deadline = meta.deadline_ms
        if deadline is not None:
            self.deadlines.discard((deadline, txnid))
        meta.status = new
        meta.timed_out = meta.timed_out or rec.timed_out
        if rec.commit_id:
            meta.commit_id = rec.commit_id
        meta.last_modified_ms = max(meta.last_modified_ms, rec.txn_last_modification_time)
        if meta.status.ended:
            del self.txns[txnid]
            self._untag(meta)
            self.ended[txnid] = meta
            while len(self.ended) > ENDED_KEPT:
                self.ended.popitem(last=False)
        elif (deadline := meta.deadline_ms) is not None:  # (PREPARED with a prepared timeout)
            self.deadlines.add((deadline, txnid))
        return True

    def _untag(self, meta: TxnMeta) -> None:
        if meta.tag:
            ids = self.tagged.get(meta.tag)
            if ids is not None:
                ids.discard(meta.txnid)
                if not ids:
                    del self.tagged[meta.tag]

    # -- snapshots ------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The table as plain data (JSON-ready); `restore` reads it back."""
        return {
            "highest_epoch": self.highest_epoch,
            "txns": [m.to_json() for m in self.txns.values()],
            "ended": [m.to_json() for m in list(self.ended.values())[-ENDED_IN_SNAPSHOT:]],
            "groups": list(self.groups.items()),
        }

    def restore(self, snap: dict[str, Any]) -> None:
        self.highest_epoch = max(self.highest_epoch, int(snap["highest_epoch"]))
        for d in snap["txns"]:
            meta = TxnMeta.from_json(d)
            self.txns[meta.txnid] = meta
            if meta.deadline_ms is not None:
                self.deadlines.add((meta.deadline_ms, meta.txnid))
            if meta.tag:
                self.tagged.setdefault(meta.tag, set()).add(meta.txnid)
        for d in snap["ended"]:
            meta = TxnMeta.from_json(d)
            self.ended[meta.txnid] = meta
        for group, sequence in snap.get("groups", []):
            self._remember_group(str(group), int(sequence))
