"""``txnbuf check-data DIR [--fix] [--json]``: a consistency check of a stopped broker's data.

It cross-checks what the broker's ledgers in ``DIR/broker.db`` say of each
transaction: the coordinators' logs (``tc/<tcid>``, replayed with `tc.TxnLog`
into a `tc.TxnTable`, as a coordinator's start does), the partitions'
commit markers (``p/<topic>/<index>``), their sidecar transaction logs
(``x/<topic>/<index>``, see `buffer._sidecar`) and the subscriptions'
cursors (``c/<topic>/<index>/<name>``, replayed with
`subscriptions.replay_cursor`), against the topic list ``__meta/topics``.

Each finding has a class (`CLASSES`: what it means, whether it is a problem
or only informational, what an operator can do), the objects involved and a
one-line explanation. *Informational* findings need no repair: a crash
leaves them and the broker resolves them on its next start, or they wait
for someone else (a PREPARED transaction's application), or they are not
txnbuf's (an unknown ledger). *Problems* are states the broker does not
resolve.

Without ``--fix`` the database is opened read-only (`ledger.ReadOnlyStore`),
and refused while a broker has it open; a broker that starts meanwhile waits
for the check to end. With ``--fix`` it is opened as the broker opens it
(`ledger.LedgerStore`, whose writer holds the directory's lock: refused while
a broker runs, and no broker can start until the repairs are done), checked,
and repaired where that is safe. A repair is safe when the broker's own start
would do exactly the same, or when it drops a ledger nothing can read:

- ``commit-unrecorded``: write the TXN_COMMIT sidecar record that a crash
  between a commit marker and its record left out (`buffer.TxnCommit`,
  as `TransactionBuffer` recovery writes it);
- ``orphan-open-txn`` and ``stale-pending-ack``: write the TXN_ABORT
  record (sidecar, resp. cursor) of a transaction that its coordinator
  aborted or forgot, as the broker's start does (`Broker._abort_orphans`);
- ``dangling-ledger`` and ``leftover-ledger``: drop a ledger of a partition
  that does not exist (or a read_uncommitted ledger whose subscription was
  never created), unless a decided, unfinished transaction of a coordinator
  here names it.

Nothing else is repaired: every other class means data is lost, or two
durable records contradict each other and only an operator can say which is
right (see each class's advice). Exit code: 0 if there is no problem
(informational findings alone are fine), 1 if problems remain, 2 on a usage
error or data that cannot be opened (a running broker).
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast

from broker._metrics import COUNTERS_LEDGER
from buffer import (
    COMMIT_MARKER,
    CommitMarker,
    TransactionBufferError,
    TxnAbort,
    TxnCommit,
    TxnData,
    decode_sidecar_record,
    entry_count,
    entry_kind,
)
from ledger import Entry, Ledger, LedgerError, LedgerStore, ReadOnlyStore, read_runs
from proto import txn_text
from subscriptions import Cursor, replay_cursor, txn_end_record
from tc import ProducerRegistry, TxnID, TxnLog, TxnMeta, TxnStatus, TxnTable

__all__ = [
    "CLASSES",
    "Finding",
    "FindingClass",
    "Repair",
    "Report",
    "add_check_data_parser",
    "check_data",
    "run_check_data",
]

DB_NAME = "broker.db"
PROGRESS_EVERY = 1000  # ledgers between progress lines
_CHUNK = 256  # entries read at a time from a long ledger
_TOPICS = "__meta/topics"

PROBLEM, INFO = "problem", "info"


@dataclass(frozen=True, slots=True)
class FindingClass:
    severity: str  # PROBLEM or INFO
    meaning: str
    advice: str  # what happens to it / what an operator can do


CLASSES: dict[str, FindingClass] = {
    # -- informational: the broker resolves these on its next start ------------
    "to-finish": FindingClass(
        INFO,
        "a transaction decided (COMMITTING / ABORTING) at its coordinator and not yet "
        "ended everywhere",
        "the broker finishes it on start: its coordinator tells the participants again",
    ),
    "open-at-coordinator": FindingClass(
        INFO,
        "a transaction OPEN at its coordinator (its client had not ended it when the "
        "broker stopped)",
        "the broker aborts it on start; its client's commit then fails",
    ),
    "prepared-at-coordinator": FindingClass(
        INFO,
        "a transaction PREPARED at its coordinator (two-phase commit): its writes are "
        "durable and it waits for the decision its application makes",
        "kept across restarts, never timed out: the application commits or aborts it "
        "(complete_transaction), or an operator aborts it",
    ),
    "commit-unrecorded": FindingClass(
        INFO,
        "a durable commit marker whose TXN_COMMIT sidecar record is missing (a crash "
        "between the two)",
        "the broker writes the record on start; --fix writes the same record now",
    ),
    "orphan-open-txn": FindingClass(
        INFO,
        "a transaction open on a partition (sidecar records, no end) that its "
        "coordinator aborted or no longer knows",
        "the broker aborts it there on start; --fix writes the same TXN_ABORT record now",
    ),
    "stale-pending-ack": FindingClass(
        INFO,
        "messages held in PENDING_ACK by a transaction that its coordinator aborted or "
        "no longer knows",
        "the broker aborts it on the subscription on start (the messages are delivered "
        "again); --fix writes the same TXN_ABORT cursor record now",
    ),
    "leftover-ledger": FindingClass(
        INFO,
        "a read_uncommitted ledger (u/...) without its cursor ledger: a crash while its "
        "subscription was created",
        "nothing reads it (a subscription created later under that name reuses it); --fix drops it",
    ),
    "unknown-ledger": FindingClass(
        INFO,
        "a ledger whose name txnbuf does not use",
        "left alone: check what wrote it",
    ),
    # -- problems: the broker does not resolve these ---------------------------
    "marker-data-missing": FindingClass(
        PROBLEM,
        "a commit marker names sidecar entries that are gone: the committed messages are "
        "lost and dispatch stops at the marker",
        "not repairable automatically: restore broker.db from a backup; otherwise the "
        "subscriptions reading that partition must be moved past the marker",
    ),
    "marker-data-mismatch": FindingClass(
        PROBLEM,
        "a commit marker names sidecar entries that are not its transaction's messages "
        "(another transaction's, or not TXN_DATA records, or another message count)",
        "not repairable automatically: the broker refuses to deliver that marker; "
        "restore broker.db from a backup",
    ),
    "duplicate-marker": FindingClass(
        PROBLEM,
        "two commit markers of one transaction on one partition: its messages are delivered twice",
        "not repairable automatically (consumers may have read both): acknowledge the "
        "second copy's messages on every subscription",
    ),
    "commit-record-without-marker": FindingClass(
        PROBLEM,
        "a TXN_COMMIT sidecar record names a commit marker that is not in the partition "
        "(past its end, or another entry): the committed messages never became visible",
        "not repairable automatically: the transaction's messages are in the sidecar, "
        "but no marker makes them visible; restore broker.db from a backup",
    ),
    "commit-and-abort": FindingClass(
        PROBLEM,
        "a transaction both committed (marker or TXN_COMMIT) and aborted (TXN_ABORT) on "
        "one partition",
        "not repairable automatically: compare with its coordinator's decision",
    ),
    "commit-contradicts-coordinator": FindingClass(
        PROBLEM,
        "a transaction committed on a partition that its coordinator aborted "
        "(ABORTING / ABORTED): consumers may read messages of an aborted transaction",
        "not repairable automatically: the messages may have been delivered already; "
        "decide with the applications whether to keep them",
    ),
    "abort-contradicts-coordinator": FindingClass(
        PROBLEM,
        "a transaction aborted on a partition (TXN_ABORT) that its coordinator committed "
        "(COMMITTING / COMMITTED): that partition lost its committed messages",
        "not repairable automatically: the aborted sends are reclaimed by the sweep; the "
        "producers must send them again",
    ),
    "commit-not-applied": FindingClass(
        PROBLEM,
        "a partition holds the sends of a transaction that its coordinator COMMITTED, "
        "with no commit marker: the commit never reached it",
        "not repairable automatically (the broker does not tell ended transactions "
        "again): an END_TXN_ON_PARTITION command (commit) for it on that partition "
        "applies the coordinator's decision",
    ),
    "pending-ack-of-committed": FindingClass(
        PROBLEM,
        "messages held in PENDING_ACK by a transaction that its coordinator COMMITTED: "
        "the commit never reached the subscription, and the messages stay locked",
        "not repairable automatically (the broker does not tell ended transactions "
        "again): an END_TXN_ON_SUBSCRIPTION command (commit) for it applies the "
        "coordinator's decision",
    ),
    "cursor-past-end": FindingClass(
        PROBLEM,
        "a subscription cursor (mark-delete, acknowledged or PENDING_ACK positions) "
        "points past the last entry of its partition",
        "not repairable automatically: the partition lost entries the subscription had "
        "read; restore broker.db from a backup",
    ),
    "cursor-behind-trim": FindingClass(
        PROBLEM,
        "a subscription cursor has messages it did not acknowledge (or holds in "
        "PENDING_ACK) before its partition's first entry: they were trimmed unread",
        "not repairable automatically: those messages are lost to the subscription",
    ),
    "dangling-ledger": FindingClass(
        PROBLEM,
        "a sidecar, dedup, cursor or read_uncommitted ledger of a partition that does "
        "not exist (no topic record, no partition ledger): nothing reads it, and a topic "
        "created later under that name would pick it up",
        "--fix drops it (unless a decided, unfinished transaction of a coordinator here "
        "names it: then let the broker finish that transaction first)",
    ),
    "orphan-partition": FindingClass(
        PROBLEM,
        "a partition ledger (and its other ledgers) of a topic or partition index missing "
        "from the topic list: the broker does not load it, its messages are unreachable",
        "not repaired (its messages may be wanted): create the topic with enough "
        'partitions (PUT /admin/v1/topics/<topic> {"partitions": N}) to bring it back',
    ),
    "unreadable": FindingClass(
        PROBLEM,
        "a ledger whose entries cannot be decoded (or whose entry ids have a gap the "
        "broker refuses)",
        "not repairable automatically: restore broker.db from a backup",
    ),
}


@dataclass(frozen=True, slots=True)
class Repair:
    """What ``--fix`` does for a finding: append one entry to a ledger, or
    drop a ledger."""

    action: str  # "append" or "drop"
    ledger: str
    data: bytes = b""
    meta: int = 0
    what: str = ""  # the record appended, in words

    def describe(self) -> str:
        if self.action == "drop":
            return f"drop ledger {self.ledger}"
        return f"append {self.what} to {self.ledger}"


@dataclass(slots=True)
class Finding:
    kind: str  # a key of CLASSES
    objects: tuple[str, ...]
    detail: str
    repair: Repair | None = None
    fixed: bool = False

    @property
    def severity(self) -> str:
        return CLASSES[self.kind].severity

    def to_json(self) -> dict[str, Any]:
        return {
            "class": self.kind,
            "severity": self.severity,
            "objects": list(self.objects),
            "detail": self.detail,
            "repair": self.repair.describe() if self.repair else None,
            "fixed": self.fixed,
        }


@dataclass(slots=True)
class Report:
    database: str
    fix: bool
    findings: list[Finding] = field(default_factory=list)
    ledgers: int = 0
    counts: Counter[str] = field(default_factory=Counter)  # what was checked
    # Transactions on partitions and subscriptions whose coordinators' logs
    # are not in this data: not checked against their decisions.
    unchecked: set[TxnID] = field(default_factory=set)

    @property
    def problems(self) -> list[Finding]:
        """The problems not repaired."""
        return [f for f in self.findings if f.severity == PROBLEM and not f.fixed]

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    def by_class(self) -> Counter[str]:
        return Counter(f.kind for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "database": self.database,
            "mode": "fix" if self.fix else "read-only",
            "ledgers": self.ledgers,
            "checked": dict(self.counts),
            "unchecked_transactions": len(self.unchecked),
            "findings": [f.to_json() for f in self.findings],
            "classes": {
                kind: {"count": n, "severity": CLASSES[kind].severity}
                for kind, n in sorted(self.by_class().items())
            },
            "problems": len(self.problems),
            "fixed": sum(1 for f in self.findings if f.fixed),
            "clean": not self.findings,
        }

    def text(self) -> str:
        """The findings, then a summary: counts per class and what each means."""
        lines = [f"txnbuf check-data: {self.database} ({'fix' if self.fix else 'read-only'})"]
        for f in sorted(self.findings, key=lambda f: (f.severity != PROBLEM, f.kind)):
            lines.append(f"{f.severity.upper():8} {f.kind}: {' '.join(f.objects)}: {f.detail}")
            if f.fixed and f.repair is not None:
                lines.append(f"{'':9}fixed: {f.repair.describe()}")
            elif f.repair is not None:
                lines.append(f"{'':9}--fix would {f.repair.describe()}")
            elif f.severity == PROBLEM:
                lines.append(f"{'':9}{CLASSES[f.kind].advice}")
        checked = ", ".join(f"{what} {n}" for what, n in self.counts.items())
        lines.append(f"checked {self.ledgers} ledgers: {checked or 'nothing'}")
        if self.unchecked:
            lines.append(
                f"{len(self.unchecked)} transactions belong to coordinators whose logs are not in "
                "this data: not checked against their decisions"
            )
        counts = self.by_class()
        if counts:
            width = max(map(len, counts))
            order = sorted(counts.items(), key=lambda kv: (CLASSES[kv[0]].severity != PROBLEM, kv))
            for kind, n in order:
                c = CLASSES[kind]
                lines.append(f"  {kind:{width}} {n:6}  {c.severity:7}  {c.meaning}")
        fixed = sum(1 for f in self.findings if f.fixed)
        infos = sum(1 for f in self.findings if f.severity == INFO)
        left = self.problems
        fixable = sum(1 for f in left if f.repair is not None)
        if not self.findings:
            verdict = "clean"
        elif not left:
            verdict = f"no problems, {infos} informational"
        else:
            verdict = (
                f"{len(left)} problems ({fixable} repairable with --fix), {infos} informational"
            )
        if fixed:
            verdict += f"; {fixed} fixed"
        lines.append(f"result: {verdict}")
        return "\n".join(lines)


class _Log(Protocol):
    """What the check reads of a ledger (`Ledger` and `ReadOnlyLedger` both)."""

    name: str
    first_entry_id: int
    last_entry_id: int

    async def read(self, start: int, end: int) -> list[Entry]: ...

    async def read_meta(self) -> list[tuple[int, int]]: ...


class _Store(Protocol):
    def ledger_names(self, prefix: str = "") -> list[str]: ...

    def get_ledger(self, name: str) -> _Log | None: ...


def _txn(txn: TxnID) -> str:
    return f"txn {txn_text(txn)}"


def _ids(ids: Iterable[int], most: int = 8) -> str:
    ids = list(ids)
    text = ", ".join(map(str, ids[:most]))
    return text + (f" and {len(ids) - most} more" if len(ids) > most else "")


async def _chunks(log: _Log) -> AsyncIterator[Entry]:
    """Every entry of ``log``, read `_CHUNK` at a time."""
    for start in range(log.first_entry_id, log.last_entry_id + 1, _CHUNK):
        for entry in await log.read(start, start + _CHUNK - 1):
            yield entry


def _no_entries(entry_id: int) -> int:
    return 0


def _entry_counts(metas: list[tuple[int, int]]) -> Callable[[int], int]:
    """Message count of each entry of a partition, by entry id (0 if trimmed
    or unknown), from its ``(entry id, meta)``: an array, as the broker keeps
    them, when the ids are contiguous."""
    if not metas or metas[-1][0] - metas[0][0] + 1 != len(metas):
        by_id = {e: entry_count(m) for e, m in metas}
        return lambda entry_id: by_id.get(entry_id, 0)
    base = metas[0][0]
    counts = array.array("I", [entry_count(m) for _, m in metas])

    def count(entry_id: int) -> int:
        i = entry_id - base
        return counts[i] if 0 <= i < len(counts) else 0

    return count


@dataclass(slots=True)
class _Sidecar:
    """What the check learns of a sidecar log."""

    data: dict[int, tuple[TxnID, int]] = field(default_factory=dict)  # TXN_DATA: txn, count
    other: dict[int, int] = field(default_factory=dict)  # entry id -> kind, other records
    commits: dict[TxnID, list[tuple[int, int]]] = field(default_factory=dict)  # (entry, marker)
    aborts: dict[TxnID, int] = field(default_factory=dict)
    first_data: dict[TxnID, int] = field(default_factory=dict)  # txn -> its first TXN_DATA


class _Check:
    def __init__(
        self,
        store: _Store,
        report: Report,
        progress: Callable[[str], None] | None,
        progress_every: int,
    ) -> None:
        self.store = store
        self.report = report
        self.progress = progress
        self.progress_every = max(1, progress_every)
        self.names = store.ledger_names()
        self.done = 0
        self.tables: dict[int, TxnTable] = {}
        self.topics: dict[str, int] | None = {}  # None: the topic list is unreadable
        self.blind = False  # a coordinator log is unreadable: its decisions are unknown

    # -- helpers --------------------------------------------------------------------

    def find(
        self, kind: str, objects: Iterable[str], detail: str, repair: Repair | None = None
    ) -> None:
        self.report.findings.append(Finding(kind, tuple(objects), detail, repair))

    def tick(self, n: int = 1) -> None:
        before = self.done // self.progress_every
        self.done += n
        if self.progress is not None and self.done // self.progress_every > before:
            self.progress(f"checked {self.done} of {len(self.names)} ledgers")

    def decision(self, txn: TxnID) -> tuple[bool, TxnMeta | None]:
        """(is ``txn``'s coordinator log in this data, what it knows of ``txn``)."""
        table = self.tables.get(TxnID(*txn).tcid)
        if table is None:
            self.report.unchecked.add(txn)
            return False, None
        return True, table.get(TxnID(*txn))

    def unfinished_on(self, partition: tuple[str, int] | None, sub: tuple[str, str] | None) -> str:
        """A transaction of a coordinator here not ended that names this
        partition or subscription ('' if none)."""
        for table in self.tables.values():
            for meta in table.txns.values():
                if (partition is not None and partition in meta.partitions) or (
                    sub is not None and sub in meta.subscriptions
                ):
                    return f"{meta.txnid} ({meta.status.name})"
        return ""

    # -- the passes -----------------------------------------------------------------

    async def run(self) -> None:
        groups: dict[tuple[str, int], dict[str, list[str]]] = {}
        coordinators: list[tuple[int, str]] = []
        for name in self.names:
            parts = name.split("/")
            if name in (_TOPICS, COUNTERS_LEDGER):
                continue
            if parts[0] == "tc" and len(parts) == 2 and parts[1].isdigit():
                coordinators.append((int(parts[1]), name))
                continue
            if parts[0] in ("p", "d", "x") and len(parts) == 3 and parts[2].isdigit():
                group = groups.setdefault((parts[1], int(parts[2])), {})
                group.setdefault(parts[0], []).append(name)
                continue
            if parts[0] in ("c", "u") and len(parts) == 4 and parts[2].isdigit():
                group = groups.setdefault((parts[1], int(parts[2])), {})
                group.setdefault(parts[0], []).append(name)
                continue
            self.find("unknown-ledger", [name], "not a ledger txnbuf writes")
            self.tick()
        await self.read_topics()
        for tcid, name in coordinators:
            await self.check_coordinator(tcid, name)
        partitions = self.partitions()
        for key in sorted(set(groups) | set(partitions)):
            group = groups.get(key, {})
            if key in partitions:
                await self.check_partition(key[0], key[1], group)
            else:
                self.check_dangling(key[0], key[1], group)

    async def read_topics(self) -> None:
        log = self.store.get_ledger(_TOPICS)
        if log is None:
            return
        self.tick()
        topics: dict[str, int] = {}
        try:
            async for entry in _chunks(log):
                record = json.loads(entry.data)
                if record.get("deleted"):  # (its ledgers are dangling until deleted)
                    topics.pop(str(record["topic"]), None)
                else:
                    topics[str(record["topic"])] = int(record["partitions"])
        except (ValueError, KeyError, TypeError) as exc:
            self.topics = None
            self.find(
                "unreadable",
                [_TOPICS],
                f"the topic list cannot be read ({exc}); no ledger is dropped while it is",
            )
            return
        self.topics = topics
        self.report.counts["topics"] = len(topics)

    def partitions(self) -> set[tuple[str, int]]:
        return {(t, i) for t, n in (self.topics or {}).items() for i in range(n)}

    async def check_coordinator(self, tcid: int, name: str) -> None:
        log = self.store.get_ledger(name)
        assert log is not None
        table = TxnTable(tcid)
        self.tick()
        try:
            # TxnLog reads its ledger through read_meta, read and the entry ids only,
            # which a read-only ledger has as well.
            await TxnLog(cast(Ledger, log)).replay(table, ProducerRegistry(tcid))
        except Exception as exc:
            self.find(
                "unreadable",
                [name],
                f"coordinator {tcid}'s log cannot be replayed ({exc}); no ledger is dropped "
                "while it is",
            )
            self.blind = True
            return
        self.tables[tcid] = table
        self.report.counts["coordinators"] += 1
        self.report.counts["transactions at coordinators"] += len(table.txns) + len(table.ended)
        for meta in table.txns.values():
            where = [f"partition {t}/{i}" for t, i in meta.partitions]
            where += [f"subscription {t}/{s}" for t, s in meta.subscriptions]
            on = f" on {', '.join(where)}" if where else ""
            txn = meta.txnid
            if meta.status is TxnStatus.PREPARED:
                self.find(
                    "prepared-at-coordinator",
                    [name, _txn(txn)],
                    f"PREPARED at coordinator {tcid}{on}, waiting for its application's decision",
                )
            elif meta.status is TxnStatus.OPEN:
                self.find(
                    "open-at-coordinator",
                    [name, _txn(txn)],
                    f"OPEN at coordinator {tcid} (registrations are not logged; the sends and "
                    "acks of it that were written are aborted where they are)",
                )
            else:
                self.find(
                    "to-finish",
                    [name, _txn(txn)],
                    f"{meta.status.name} at coordinator {tcid}, to be told{on}",
                )

    async def check_partition(self, topic: str, index: int, group: dict[str, list[str]]) -> None:
        pname, xname = f"p/{topic}/{index}", f"x/{topic}/{index}"
        plog = self.store.get_ledger(pname)
        first, last = (plog.first_entry_id, plog.last_entry_id) if plog else (0, -1)
        self.report.counts["partitions"] += 1
        counts: Callable[[int], int] = _no_entries
        marker_ids: list[int] = []
        markers: dict[int, tuple[TxnID, tuple[int, ...], int]] = {}
        if plog is not None:
            self.tick()
            metas = await plog.read_meta()
            if metas and metas[-1][0] - metas[0][0] + 1 != len(metas):
                self.find(
                    "unreadable",
                    [pname],
                    "its entry ids are not contiguous (an entry was deleted): the broker "
                    "refuses to load the partition",
                )
            counts = _entry_counts(metas)
            marker_ids.extend(e for e, m in metas if entry_kind(m) == COMMIT_MARKER)
            for entry_id, entry in (await read_runs(plog, marker_ids, _CHUNK)).items():
                try:
                    marker = CommitMarker.decode(entry.meta, entry.data)
                except TransactionBufferError as exc:
                    self.find("unreadable", [f"{pname}@{entry_id}"], str(exc))
                    continue
                markers[entry_id] = (marker.txn, tuple(marker.entries), marker.count)
            self.report.counts["commit markers"] += len(markers)
        sidecar = await self.read_sidecar(xname) if group.get("x") else None
        self.check_markers(pname, xname, first, last, markers, sidecar)
        subs = {name.rsplit("/", 1)[1] for name in group.get("c", [])}
        in_markers = set(marker_ids)
        for cname in group.get("c", []):
            sub = cname.rsplit("/", 1)[1]
            # A read_uncommitted subscription counts commit markers as empty.
            skip = in_markers if f"u/{topic}/{index}/{sub}" in group.get("u", []) else set()
            await self.check_cursor(cname, topic, pname, first, last, counts, skip)
        for uname in group.get("u", []):
            self.tick()
            if uname.rsplit("/", 1)[1] not in subs:
                self.find(
                    "leftover-ledger",
                    [uname],
                    "a read_uncommitted ledger whose subscription has no cursor ledger",
                    Repair("drop", uname),
                )
        self.tick(len(group.get("d", [])))

    async def read_sidecar(self, xname: str) -> _Sidecar | None:
        xlog = self.store.get_ledger(xname)
        if xlog is None:
            return None
        self.tick()
        self.report.counts["sidecars"] += 1
        sc = _Sidecar()
        async for entry in _chunks(xlog):
            try:
                record = decode_sidecar_record(entry.meta, entry.data)
            except TransactionBufferError as exc:
                self.find("unreadable", [f"{xname}@{entry.entry_id}"], str(exc))
                continue
            if isinstance(record, TxnData):
                sc.data[entry.entry_id] = (record.txn, record.count)
                sc.first_data.setdefault(record.txn, entry.entry_id)
                continue
            sc.other[entry.entry_id] = entry_kind(entry.meta)
            if isinstance(record, TxnCommit):
                sc.commits.setdefault(record.txn, []).append((entry.entry_id, record.marker))
            elif isinstance(record, TxnAbort):
                sc.aborts[record.txn] = entry.entry_id
        return sc

    def check_markers(
        self,
        pname: str,
        xname: str,
        first: int,
        last: int,
        markers: dict[int, tuple[TxnID, tuple[int, ...], int]],
        sc: _Sidecar | None,
    ) -> None:
        """Commit markers against the sidecar records, both against the coordinators."""
        by_txn: dict[TxnID, list[int]] = {}
        complete: set[int] = set()  # markers whose sidecar records are all there and theirs
        for entry_id, (key, ids, count) in sorted(markers.items()):
            by_txn.setdefault(key, []).append(entry_id)
            objects = [f"{pname}@{entry_id}", xname, _txn(key)]
            if sc is None:
                self.find(
                    "marker-data-missing",
                    objects,
                    f"commit marker {entry_id} names sidecar entries {_ids(ids)}, but the "
                    "partition has no sidecar ledger",
                )
                continue
            gone = [i for i in ids if i not in sc.data and i not in sc.other]
            if gone:
                self.find(
                    "marker-data-missing",
                    objects,
                    f"commit marker {entry_id} names sidecar entries {_ids(gone)}, which are gone",
                )
                continue
            wrong = [i for i in ids if i in sc.other or sc.data[i][0] != key]
            if wrong:
                self.find(
                    "marker-data-mismatch",
                    objects,
                    f"commit marker {entry_id} names sidecar entries {_ids(wrong)}, which are "
                    "not TXN_DATA records of its transaction",
                )
                continue
            held = sum(sc.data[i][1] for i in ids)
            if held != count:
                self.find(
                    "marker-data-mismatch",
                    objects,
                    f"commit marker {entry_id} counts {count} messages, its sidecar records "
                    f"hold {held}",
                )
                continue
            complete.add(entry_id)
        for key, entries in by_txn.items():
            if len(entries) > 1:
                self.find(
                    "duplicate-marker",
                    [*(f"{pname}@{e}" for e in entries), _txn(key)],
                    f"{len(entries)} commit markers of one transaction: {_ids(entries)}",
                )
        commits = sc.commits if sc is not None else {}
        aborts = sc.aborts if sc is not None else {}
        for key, records in commits.items():
            for record, marker in records:
                if marker < 0 or marker < first:
                    continue  # (wrote nothing here, or the marker was trimmed)
                found = markers.get(marker)
                if found is None or found[0] != key:
                    where = "past the partition's end" if marker > last else "not its marker"
                    self.find(
                        "commit-record-without-marker",
                        [f"{xname}@{record}", pname, _txn(key)],
                        f"TXN_COMMIT record {record} names commit marker {marker}, which is "
                        f"{where} (the partition holds entries {first}..{last})",
                    )
        committed = set(by_txn) | set(commits)
        for key in sorted(committed):
            objects = [pname, xname, _txn(key)]
            if key in aborts:
                self.find(
                    "commit-and-abort",
                    objects,
                    f"committed here (marker or TXN_COMMIT) and aborted (TXN_ABORT record "
                    f"{aborts[key]})",
                )
            _, meta = self.decision(key)
            contradicts = meta is not None and meta.status in (
                TxnStatus.ABORTING,
                TxnStatus.ABORTED,
            )
            if contradicts:
                assert meta is not None
                self.find(
                    "commit-contradicts-coordinator",
                    objects,
                    f"committed on this partition, {meta.status.name} at coordinator "
                    f"{meta.txnid.tcid}",
                )
            entries = by_txn.get(key, [])
            if key not in commits and key not in aborts and len(entries) == 1 and sc is not None:
                marker = entries[0]
                if marker not in complete:
                    continue
                repair = None
                if not contradicts:
                    data, meta_bits = TxnCommit(key, marker).encode()
                    repair = Repair(
                        "append", xname, data, meta_bits, f"TXN_COMMIT (marker {marker})"
                    )
                self.find(
                    "commit-unrecorded",
                    [f"{pname}@{marker}", xname, _txn(key)],
                    f"commit marker {marker} is durable, its TXN_COMMIT record is not",
                    repair,
                )
        if sc is None:
            return
        self.report.counts["transactions on partitions"] += len(sc.first_data)
        for key in sorted(aborts):
            _, meta = self.decision(key)
            if meta is not None and meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
                self.find(
                    "abort-contradicts-coordinator",
                    [f"{xname}@{aborts[key]}", _txn(key)],
                    f"aborted on {pname}, {meta.status.name} at coordinator {meta.txnid.tcid}",
                )
        for key, entry_id in sorted(sc.first_data.items(), key=lambda kv: kv[1]):
            if key in committed or key in aborts:
                continue
            here, meta = self.decision(key)
            if not here:
                continue
            objects = [xname, _txn(key)]
            if meta is None or meta.status is TxnStatus.ABORTED:
                state = "unknown to" if meta is None else "ABORTED at"
                data, meta_bits = TxnAbort(key).encode()
                self.find(
                    "orphan-open-txn",
                    objects,
                    f"open on {pname} (sidecar records from entry {entry_id}), {state} "
                    f"coordinator {TxnID(*key).tcid}",
                    Repair("append", xname, data, meta_bits, "TXN_ABORT"),
                )
            elif meta.status is TxnStatus.COMMITTED:
                self.find(
                    "commit-not-applied",
                    objects,
                    f"open on {pname} (sidecar records from entry {entry_id}, no commit "
                    f"marker), COMMITTED at coordinator {meta.txnid.tcid}",
                )

    async def check_cursor(
        self,
        cname: str,
        topic: str,
        pname: str,
        first: int,
        last: int,
        counts: Callable[[int], int],
        empty: set[int],
    ) -> None:
        clog = self.store.get_ledger(cname)
        assert clog is not None
        self.tick()
        self.report.counts["subscription cursors"] += 1

        def count(entry_id: int) -> int:  # (as the broker counts: 0 if trimmed)
            return 0 if entry_id in empty else counts(entry_id)

        try:
            entries = await clog.read(clog.first_entry_id, clog.last_entry_id)
            cursor = replay_cursor(cname, entries, count, last)[0]
        except Exception as exc:
            self.find("unreadable", [cname], f"the cursor cannot be replayed: {exc}")
            return
        self.check_positions(cname, pname, first, last, cursor)
        sub = cname.rsplit("/", 1)[1]
        for key, held in cursor.txn_acks.items():
            here, meta = self.decision(key)
            if not here or (
                meta is not None and meta.status not in (TxnStatus.ABORTED, TxnStatus.COMMITTED)
            ):
                continue  # (not checked, or its coordinator ends it on start)
            objects = [cname, _txn(key)]
            n = len(held)
            if meta is not None and meta.status is TxnStatus.COMMITTED:
                self.find(
                    "pending-ack-of-committed",
                    objects,
                    f"{n} messages of {topic} held in PENDING_ACK for subscription {sub!r}, "
                    f"COMMITTED at coordinator {meta.txnid.tcid}",
                )
                continue
            state = "unknown to" if meta is None else "ABORTED at"
            record = txn_end_record(key, commit=False)
            self.find(
                "stale-pending-ack",
                objects,
                f"{n} messages of {topic} held in PENDING_ACK for subscription {sub!r}, "
                f"{state} coordinator {TxnID(*key).tcid}",
                Repair("append", cname, record.encode(), record.kind, "TXN_ABORT"),
            )

    def check_positions(self, cname: str, pname: str, first: int, last: int, cur: Cursor) -> None:
        md = cur.mark_delete
        positions = [*cur.acked, *cur.pending_ack]
        beyond = [p for p in positions if p[0] > last]
        if md[0] > last or beyond:
            at = f"mark-delete {md[0]}:{md[1]}" if md[0] > last else f"position {max(beyond)}"
            self.find(
                "cursor-past-end",
                [cname, pname],
                f"{at} is past the partition's last entry {last}",
            )
        locked_before = sorted(p for p in cur.pending_ack if p[0] < first)
        if cur.first_open_entry() < first or locked_before:
            what = (
                f"PENDING_ACK message {locked_before[0][0]}:{locked_before[0][1]}"
                if locked_before
                else f"mark-delete {md[0]}:{md[1]}"
            )
            self.find(
                "cursor-behind-trim",
                [cname, pname],
                f"{what} is before the partition's first entry {first}",
            )

    def check_dangling(self, topic: str, index: int, group: dict[str, list[str]]) -> None:
        names = [n for kind in ("p", "d", "x", "c", "u") for n in group.get(kind, [])]
        self.tick(len(names))
        known = self.topics is not None and not self.blind
        why = (
            f"topic {topic!r} is not in the topic list"
            if topic not in (self.topics or {})
            else f"topic {topic!r} has {(self.topics or {})[topic]} partitions"
        )
        if group.get("p"):
            self.find(
                "orphan-partition",
                names,
                f"partition {index} of {topic!r} has a partition ledger, but {why}",
            )
            return
        for name in names:
            kind, sub = name.split("/")[0], name.split("/")[-1]
            busy = self.unfinished_on(
                (topic, index) if kind == "x" else None, (topic, sub) if kind == "c" else None
            )
            repair = Repair("drop", name) if known and not busy else None
            detail = f"no partition ledger, and {why}"
            if busy:
                detail += f"; transaction {busy} of a coordinator here is unfinished on it"
            self.find("dangling-ledger", [name], detail, repair)


async def _repair(store: LedgerStore, findings: list[Finding]) -> None:
    """Apply the repairs of ``findings`` (appends first, then drops)."""
    appends = []
    todo = [f for f in findings if f.repair is not None]
    for f in todo:
        r = f.repair
        assert r is not None
        if r.action == "append":
            ledger = store.get_ledger(r.ledger)
            assert ledger is not None
            appends.append(ledger.append(r.data, r.meta))
    await asyncio.gather(*appends)
    for f in todo:
        assert f.repair is not None
        if f.repair.action == "drop":
            await store.delete_ledger(f.repair.ledger)
        f.fixed = True


async def check_data(
    data_dir: str | Path,
    *,
    fix: bool = False,
    progress: Callable[[str], None] | None = None,
    progress_every: int = PROGRESS_EVERY,
) -> Report:
    """Check the data of a stopped broker in ``data_dir``; with ``fix``,
    repair what is safely repairable. Raises `LedgerError` if there is no
    broker data there or a broker has it open."""
    path = Path(data_dir) / DB_NAME
    if not path.is_file():
        raise LedgerError(f"no broker data in {data_dir} ({DB_NAME} not found)")
    report = Report(str(path), fix)
    if not fix:
        ro = ReadOnlyStore.open(path)
        try:
            check = _Check(ro, report, progress, progress_every)
            report.ledgers = len(check.names)
            await check.run()
        finally:
            ro.close()
        return report
    ReadOnlyStore.open(path).close()  # (a ledger database, not in use: else nothing is written)
    store = await LedgerStore.open(path, lock_wait=0.0)
    try:
        check = _Check(store, report, progress, progress_every)
        report.ledgers = len(check.names)
        await check.run()
        await _repair(store, report.findings)
    finally:
        await store.close()
    return report


def add_check_data_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "check-data",
        help="check a stopped broker's data for consistency (read-only unless --fix)",
        description="Cross-check the coordinators' decisions, the commit markers, the sidecar "
        "logs and the cursors of a stopped broker's data. Exit code 0: no problem "
        "(informational findings only), 1: problems, 2: usage error or data in use.",
    )
    p.add_argument("data_dir", metavar="DIR", help="the broker's data directory")
    p.add_argument("--fix", action="store_true", help="repair what is safely repairable")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--progress-every",
        type=int,
        default=PROGRESS_EVERY,
        metavar="N",
        help=f"print a progress line to stderr every N ledgers ({PROGRESS_EVERY})",
    )


def run_check_data(args: argparse.Namespace) -> int:
    if args.progress_every < 1:
        print("txnbuf check-data: --progress-every must be at least 1", file=sys.stderr)
        return 2
    if not Path(args.data_dir).is_dir():
        print(f"txnbuf check-data: {args.data_dir} is not a directory", file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        print(f"txnbuf check-data: {line}", file=sys.stderr, flush=True)

    try:
        report = asyncio.run(
            check_data(
                args.data_dir,
                fix=args.fix,
                progress=progress,
                progress_every=args.progress_every,
            )
        )
    except LedgerError as exc:
        print(f"txnbuf check-data: refused: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    return report.exit_code
