"""``txnbuf check-data DIR [--fix] [--json]``: a consistency check of a stopped broker's data.

It cross-checks what the broker's ledgers in ``DIR/broker.db`` say of each
transaction: the coordinators' logs (``tc/<tcid>``, replayed with `tc.TxnLog`
into a `tc.TxnTable`, as a coordinator's start does), the partitions'
commit markers (``p/<topic>/<index>``), their sidecar transaction logs
(``x/<topic>/<index>``, see `buffer._sidecar`) and the subscriptions'
cursors (``c/<topic>/<index>/<name>``, replayed with
`subscriptions.replay_cursor`), against the topic list ``__meta/topics``.

The check is split by what it checks: the coordinators' logs
(`broker._checkdata._coordinators`), each partition's commit markers and
sidecar log and the ledgers of partitions that do not exist
(`._partitions`), the subscriptions' cursors (`._cursors`); the passes share
a `Check` (`._state`), run in order (`._run`), and write a `Report` of
findings (`._findings`).

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

from broker._checkdata._findings import (
    CLASSES,
    INFO,
    PROBLEM,
    Finding,
    FindingClass,
    Repair,
    Report,
)
from broker._checkdata._run import add_check_data_parser, check_data, run_check_data

__all__ = [
    "CLASSES",
    "INFO",
    "PROBLEM",
    "Finding",
    "FindingClass",
    "Repair",
    "Report",
    "add_check_data_parser",
    "check_data",
    "run_check_data",
]
