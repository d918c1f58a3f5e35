"""What ``txnbuf check-data`` can find: each class of finding (`CLASSES`:
what it means, whether it is a problem or only informational, what an
operator can do), a finding, a repair ``--fix`` makes, and the report."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tc import TxnID

__all__ = ["CLASSES", "INFO", "PROBLEM", "Finding", "FindingClass", "Repair", "Report"]

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
