"""The one storage primitive: append-only ledgers in SQLite (see DESIGN.md).

Everything durable in txnbuf is a ledger: partition logs, sidecar transaction
logs, subscription cursors and coordinator logs. A `LedgerStore` is one
SQLite database (WAL, ``synchronous=FULL``) holding many ledgers, written by
group commits; `ReadOnlyStore` opens one for reading only (tools that inspect
a stopped broker's data). `faults.hit(step)` is the test-only crash hook
every layer uses (it sits here, on the lowest floor).
"""

from ledger import _faults as faults
from ledger._readonly import ReadOnlyLedger, ReadOnlyStore
from ledger._stats import Buckets
from ledger._store import (
    Entry,
    Ledger,
    LedgerError,
    LedgerStore,
    pass_failure,
    read_runs,
    settled,
    unawaited,
)

__all__ = [
    "Buckets",
    "Entry",
    "Ledger",
    "LedgerError",
    "LedgerStore",
    "ReadOnlyLedger",
    "ReadOnlyStore",
    "faults",
    "pass_failure",
    "read_runs",
    "settled",
    "unawaited",
]
