"""Exactly once end to end, through crashes: 5,000 orders copied with a
transform by ``examples/spark_transform.py`` (its own driver process, on
``local[2]``) from a topic of two partitions to another, while

1. the whole driver (JVM and Python workers) is SIGKILLed in the middle of
   a batch, and the query restarted from its checkpoint;
2. the sink's commit fails right after its group commit, before Spark
   records the batch (the query stops with that error), and the query is
   restarted again: the batch runs again and its group commit is a
   duplicate.

The output then holds each input exactly once."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess
from tests.spark_support import ROOT, produce, read_all, sink_transactions

pytestmark = [pytest.mark.integration, pytest.mark.crash]

ORDERS = 5000


def driver(
    broker: BrokerProcess, tmp_path: Path, faults: str, log: Path
) -> subprocess.Popen[bytes]:
    """The transform job, in a process group of its own (SIGKILL takes all of it)."""
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "TXNBUF_SPARK_FAULT_DIR": str(fault_dir),
        "TXNBUF_SPARK_FAULTS": faults,
    }
    args = [
        sys.executable,
        str(ROOT / "examples" / "spark_transform.py"),
        "--service-url",
        broker.url,
        "--input",
        "crash-in",
        "--output",
        "crash-out",
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--max-messages-per-batch",
        "800",
        "--available-now",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_each_input_once_through_a_driver_kill_and_a_failed_commit(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    assert broker.admin("PUT", "/admin/v1/topics/crash-in", b'{"partitions": 2}')[0] == 200
    orders = [
        {"order_id": f"o-{i}", "customer": f"c-{i % 11}", "amount": i % 90 + 1.0, "currency": "EUR"}
        for i in range(ORDERS)
    ]
    produce(
        broker.url,
        "crash-in",
        [json.dumps(o).encode() for o in orders],
        [o["customer"] for o in orders],
    )
    log = tmp_path / "driver.log"

    # 1. SIGKILL the driver while a task of its third batch is writing.
    first = driver(broker, tmp_path, "sink.task_write@5=stall", log)
    stalled = tmp_path / "faults" / "sink.task_write.stalled"
    deadline = time.monotonic() + 240
    while not stalled.exists() and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert stalled.exists(), log.read_text(errors="replace")[-5000:]
    kill_group(first)
    partial = read_all(broker.url, "crash-out")
    assert 0 < len(partial) < ORDERS  # (some batches were committed, not all)

    # 2. The commit of the next batch fails after its group commit.
    second = driver(broker, tmp_path, "sink.after_commit@1=raise", log)
    assert second.wait(timeout=300) != 0  # the query stopped with the injected error
    text = log.read_text(errors="replace")
    assert "fault injected at sink.after_commit" in text

    # 3. Restarted: it runs the failed batch again (a duplicate), then the rest.
    third = driver(broker, tmp_path, "", log)
    assert third.wait(timeout=300) == 0, log.read_text(errors="replace")[-5000:]
    text = log.read_text(errors="replace")
    assert "was committed before (a replay after a crash)" in text

    out = [json.loads(m.value) for m in read_all(broker.url, "crash-out")]
    counts = collections.Counter(o["order_id"] for o in out)
    assert len(counts) == ORDERS and set(counts.values()) == {1}, [
        k for k, n in counts.items() if n != 1
    ][:10]
    assert sink_transactions(broker, "PREPARED") == [] and sink_transactions(broker, "OPEN") == []
