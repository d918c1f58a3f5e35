"""The one storage primitive: append-only ledgers (see DESIGN.md).

Everything durable in txnbuf is a ledger: partition logs, sidecar transaction
logs, subscription cursors and coordinator logs. A `LedgerStore` is one
database holding many ledgers, written by group commits: SQLite (WAL,
``synchronous=FULL``, the default) or PostgreSQL (a ``postgresql://`` URL,
with fencing by slots: `LedgerFencedError`). `ReadOnlyStore` opens a SQLite
one for reading only (tools that inspect a stopped broker's data).
`faults.hit(step)` is the test-only crash hook every layer uses (it sits
here, on the lowest floor).
"""

from ledger import _faults as faults
from ledger._base import LedgerFencedError
from ledger._readonly import ReadOnlyLedger, ReadOnlyStore
from ledger._stats import Buckets
from ledger._store import (
    Entry,
    Ledger,
    LedgerError,
    LedgerStore,
    is_postgres_url,
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
    "LedgerFencedError",
    "LedgerStore",
    "ReadOnlyLedger",
    "ReadOnlyStore",
    "faults",
    "is_postgres_url",
    "pass_failure",
    "read_runs",
    "settled",
    "unawaited",
]
