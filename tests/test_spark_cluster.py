"""The copy example on a real standalone Spark cluster on this machine: one
master and two workers (``spark-class org.apache.spark.deploy.master.Master``
and ``...deploy.worker.Worker`` from the pyspark package), the job submitted
with ``--master spark://...`` and nothing else changed: executors in the
workers' own processes read and write through the broker's address, the
checkpoint is the driver's."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import BrokerProcess, free_port
from tests.spark_support import ROOT, produce, read_all, sink_transactions

pytestmark = pytest.mark.integration

ORDERS = 2000


class Cluster:
    """A standalone master and two workers, each in a process group of its own."""

    def __init__(self, where: Path) -> None:
        import pyspark

        self.where = where
        self.spark_home = Path(pyspark.__file__).parent
        self.port = free_port()
        self.ui_port = free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, name: str, *args: str) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "SPARK_LOG_DIR": str(self.where),
            "PYSPARK_PYTHON": sys.executable,
        }
        with open(self.where / f"{name}.log", "ab") as log:
            self.procs.append(
                subprocess.Popen(
                    [str(self.spark_home / "bin" / "spark-class"), *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def start(self) -> None:
        self._start(
            "master",
            "org.apache.spark.deploy.master.Master",
            "--host", "127.0.0.1",
            "--port", str(self.port),
            "--webui-port", str(self.ui_port),
        )  # fmt: skip
        for n in (1, 2):
            work = self.where / f"work{n}"
            work.mkdir()
            self._start(
                f"worker{n}",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                "--host", "127.0.0.1",
                "--cores", "1",
                "--memory", "1g",
                "--webui-port", "0",
                "--work-dir", str(work),
            )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/") as r:
                    state = json.loads(r.read())
                if sum(w["state"] == "ALIVE" for w in state["workers"]) == 2:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not come up:\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(
            f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.where.glob("*.log"))
        )

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    found = Cluster(tmp_path / "cluster")
    found.where.mkdir()
    found.start()
    try:
        yield found
    finally:
        found.stop()


def test_the_copy_example_runs_unchanged_on_a_standalone_cluster(
    broker: BrokerProcess, cluster: Cluster, tmp_path: Path
) -> None:
    assert broker.admin("PUT", "/admin/v1/topics/cluster-in", b'{"partitions": 2}')[0] == 200
    orders = [
        {"order_id": f"o-{i}", "customer": f"c-{i % 5}", "amount": 5.0, "currency": "USD"}
        for i in range(ORDERS)
    ]
    produce(
        broker.url,
        "cluster-in",
        [json.dumps(o).encode() for o in orders],
        [o["customer"] for o in orders],
    )
    log = tmp_path / "driver.log"
    args = [
        sys.executable,
        str(ROOT / "examples" / "spark_transform.py"),
        "--master", cluster.url,
        "--service-url", broker.url,
        "--input", "cluster-in",
        "--output", "cluster-out",
        "--checkpoint", (tmp_path / "checkpoint").as_uri(),
        "--available-now",
    ]  # fmt: skip
    with open(log, "wb") as out:
        done = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, timeout=600)
    assert done.returncode == 0, log.read_text(errors="replace")[-5000:] + cluster.logs()
    out_orders = [json.loads(m.value)["order_id"] for m in read_all(broker.url, "cluster-out")]
    assert collections.Counter(out_orders) == collections.Counter(o["order_id"] for o in orders)
    # Both workers ran executors of the job.
    for n in (1, 2):
        assert list((cluster.where / f"work{n}").glob("app-*/*/stderr")), cluster.logs()
    assert sink_transactions(broker, "PREPARED") == []
