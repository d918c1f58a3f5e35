"""The Jepsen-style queue workload, short, as part of the test command.

Runs `txnbuf check` (the real CLI: a broker subprocess, concurrent
transactional clients, faults, a history, the checker) and fails on any
anomaly. Faults: SIGSTOP/SIGCONT of the broker at seeded times and a client
crash mid-transaction. Broker kills are left out of this run for now: a long
run with kills still reports redelivery-order anomalies (poll-skip,
nonmonotonic-poll) after restarts, not yet fixed (see the README); broker
kills are covered here by tests/test_copy.py and tests/test_txn_crash.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.crash]


def test_queue_workload_under_pauses_and_a_client_crash_has_no_anomalies(
    tmp_path: Path,
) -> None:
    history = tmp_path / "history.jsonl"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "broker",
            "check",
            "--duration",
            "40",
            "--faults",
            "pause",
            "--seed",
            "20261122",
            "--clients",
            "4",
            "--history",
            str(history),
            "--workdir",
            str(tmp_path / "work"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert "result: valid" in result.stdout, out[-5000:]
    assert "final reads complete           yes" in result.stdout
    assert "client crashes 1" in result.stdout  # the timeout path ran
    ops = int(next(line.split()[-1] for line in result.stdout.splitlines()
                   if line.startswith("operations")))  # fmt: skip
    assert ops > 1000
    assert history.stat().st_size > 0
