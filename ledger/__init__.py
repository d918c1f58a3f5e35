"""The one storage primitive: append-only ledgers (see DESIGN.md).

Everything durable in txnbuf is a ledger: partition logs, sidecar transaction
logs, subscription cursors and coordinator logs. A `LedgerStore` is one
database holding many ledgers, written by group commits: SQLite (WAL,
``synchronous=FULL``, the default) or PostgreSQL (a ``postgresql://`` URL,
with fencing by slots: `LedgerFencedError`). `ReadOnlyStore` opens a SQLite
one for reading only (tools that inspect a stopped broker's data).
`faults.hit(step)` is the test-only crash hook every layer uses, and
`ledger._futures` the idioms that chain futures without tasks (`then`,
`all_of`, ...): both sit here, on the lowest floor.
"""

from ledger import _faults as faults
from ledger._base import LedgerFailedError, LedgerFencedError
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
    is_postgres_url,
    read_runs,
)

__all__ = [
    "Buckets",
    "Entry",
    "Ledger",
    "LedgerError",
    "LedgerFailedError",
    "LedgerFencedError",
    "LedgerStore",
    "ReadOnlyLedger",
    "ReadOnlyStore",
    "all_of",
    "faults",
    "is_postgres_url",
    "on_outcome",
    "pass_failure",
    "read_runs",
    "resolved",
    "settled",
    "then",
    "unawaited",
]
