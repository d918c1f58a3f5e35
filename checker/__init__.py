"""txnbuf's correctness checker: histories and Jepsen's Kafka queue anomalies.

::

    from checker import History, Recorder, check

    with Recorder("history.jsonl") as rec:        # the workload
        op = rec.invoke(0, "txn", [["send", "orders/0", 1], ["poll"]])
        rec.complete(op, "ok", [["send", "orders/0", [None, 1]], ["poll", {}]])
        rec.final_reads(complete=True)

    result = check(History.load("history.jsonl"))
    print(result.summary_table())
    assert result.valid, result.failures

The history format is documented in `checker.history`; each anomaly class in
`checker._check` (and the dependency cycles in `checker._cycles`), with the
Jepsen definitions they port. `checker.synthetic` makes histories of a
simulated correct broker, for tests and benchmarks.
"""

from ._check import CLASSES, DEFAULT_INFORMATIONAL, Result, check
from .history import History, HistoryError, Op, Recorder

__all__ = [
    "CLASSES",
    "DEFAULT_INFORMATIONAL",
    "History",
    "HistoryError",
    "Op",
    "Recorder",
    "Result",
    "check",
]
