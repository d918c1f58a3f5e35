"""What the passes of ``txnbuf check-data`` share (`Check`), and the small
readers they use."""

from __future__ import annotations

import array
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Protocol

from broker._checkdata._findings import Finding, Repair, Report
from buffer import (
    entry_count,
)
from ledger import Entry
from proto import txn_text
from tc import TxnID, TxnMeta, TxnTable

__all__ = [
    "CHUNK",
    "TOPICS",
    "Check",
    "Log",
    "Store",
    "chunks",
    "entry_counts",
    "ids_text",
    "no_entries",
    "txn_name",
]

CHUNK = 256  # entries read at a time from a long ledger
TOPICS = "__meta/topics"


class Log(Protocol):
    """What the check reads of a ledger (`Ledger` and `ReadOnlyLedger` both)."""

    name: str
    first_entry_id: int
    last_entry_id: int

    async def read(self, start: int, end: int) -> list[Entry]: ...

    async def read_meta(self) -> list[tuple[int, int]]: ...


class Store(Protocol):
    def ledger_names(self, prefix: str = "") -> list[str]: ...

    def get_ledger(self, name: str) -> Log | None: ...


def txn_name(txn: TxnID) -> str:
    return f"txn {txn_text(txn)}"


def ids_text(ids: Iterable[int], most: int = 8) -> str:
    ids = list(ids)
    text = ", ".join(map(str, ids[:most]))
    return text + (f" and {len(ids) - most} more" if len(ids) > most else "")


async def chunks(log: Log) -> AsyncIterator[Entry]:
    """Every entry of ``log``, read `CHUNK` at a time."""
    for start in range(log.first_entry_id, log.last_entry_id + 1, CHUNK):
        for entry in await log.read(start, start + CHUNK - 1):
            yield entry


def no_entries(entry_id: int) -> int:
    return 0


def entry_counts(metas: list[tuple[int, int]]) -> Callable[[int], int]:
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


class Check:
    """What the passes of a check share: the store read, the report written,
    the coordinators' tables (their decisions), the topic list, progress."""

    def __init__(
        self,
        store: Store,
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
