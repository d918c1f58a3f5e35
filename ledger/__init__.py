"""The one storage primitive: append-only ledgers in SQLite (see DESIGN.md).

Everything durable in txnbuf is a ledger: partition logs, sidecar transaction
logs, subscription cursors and coordinator logs. A `LedgerStore` is one
SQLite database (WAL, ``synchronous=FULL``) holding many ledgers, written by
group commits; `ReadOnlyStore` opens one for reading only (tools that inspect
a stopped broker's data). `faults.hit(step)` is the test-only crash hook
every layer uses, and `ledger._futures` the idioms that chain futures
without tasks (`then`, `all_of`, ...): both sit here, on the lowest floor.
"""

from ledger import _faults as faults
from ledger._futures import (
    all_of,
    on_outcome,
    pass_failure,
    resolved,
    settled,
    then,
    unawaited,
)
from ledger._readonly import ReadOnlyLedger, ReadOnlyStore
from ledger._stats import Buckets
from ledger._store import (
    Entry,
    Ledger,
    LedgerError,
    LedgerStore,
    read_runs,
)

__all__ = [
    "Buckets",
    "Entry",
    "Ledger",
    "LedgerError",
    "LedgerStore",
    "ReadOnlyLedger",
    "ReadOnlyStore",
    "all_of",
    "faults",
    "on_outcome",
    "pass_failure",
    "read_runs",
    "resolved",
    "settled",
    "then",
    "unawaited",
]
