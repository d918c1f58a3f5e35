"""The locust load test (loadtests/): a short headless run against the real
broker has every kind of request, none failed, and the broker logged no
error; a failed request fails the run.

locust runs as a subprocess (loadtests/run.py): its gevent monkey-patching
stays out of the pytest process.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import BrokerProcess, free_port

ROOT = Path(__file__).resolve().parent.parent
RUN = ROOT / "loadtests" / "run.py"

TXNBUF_REQUESTS = {
    "connect", "create producer", "subscribe",
    "send", "send x100", "deliver", "ack", "transaction", "commit",
}  # fmt: skip
ADMIN_REQUESTS = {
    "/admin/v1/topics", "/admin/v1/topics/[t]/stats", "/admin/v1/transactions?state=OPEN",
    "/admin/v1/coordinators", "/metrics", "/ (admin page)",
}  # fmt: skip


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(RUN), *args], cwd=ROOT, capture_output=True, text=True, timeout=180
    )


def load_run_module() -> ModuleType:
    sys.path.insert(0, str(RUN.parent))
    try:
        spec = importlib.util.spec_from_file_location("loadtests_run", RUN)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(RUN.parent))


@pytest.mark.integration
def test_short_headless_run_has_every_request_and_no_failure(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = run(
        "--host", broker.url, "--broker-log", str(broker.log_path), "--prefix", "lt",
        "--run-time", "10s", "--users", "4", "--out", str(out),
    )  # fmt: skip
    locust_log = (out / "locust.log").read_text() if (out / "locust.log").exists() else ""
    assert result.returncode == 0, result.stdout + result.stderr + locust_log

    summary = json.loads((out / "summary.json").read_text())
    rows = {(row["type"], row["name"]): row for row in summary["requests"]}
    expected = {("txnbuf", n) for n in TXNBUF_REQUESTS} | {("GET", n) for n in ADMIN_REQUESTS}
    assert expected <= set(rows), sorted(expected - set(rows))
    for key in expected:
        assert rows[key]["requests"] > 0 and rows[key]["failures"] == 0, (key, rows[key])
        assert rows[key]["p50"] <= rows[key]["p95"] <= rows[key]["p99"], rows[key]
    # What run.py printed is that summary.
    assert "txnbuf  transaction" in result.stdout and "p99 ms" in result.stdout

    # locust's own statistics counted the requests too (its CSV is rewritten
    # each second, so it may miss the last second's).
    with open(out / "locust_stats.csv", newline="") as f:
        stats = {(r["Type"], r["Name"]): r for r in csv.DictReader(f)}
    for key in expected:
        assert 0 < int(stats[key]["Request Count"]) <= rows[key]["requests"], key
        assert int(stats[key]["Failure Count"]) == 0, key
    assert (out / "report.html").stat().st_size > 10_000

    # The broker did the work: committed transactions wrote to lt-out, and
    # both subscriptions on lt-in acknowledged messages.
    status, body = broker.admin("GET", "/admin/v1/topics/lt-out/stats")
    assert status == 200
    assert sum(p["messages"] for p in json.loads(body)["partitions"]) > 0
    status, body = broker.admin("GET", "/admin/v1/topics/lt-in/stats")
    subs = json.loads(body)["partitions"][0]["subscriptions"]
    assert {"lt-ack", "lt-ctp"} <= set(subs)

    log = broker.log()
    assert "ERROR" not in log and "Traceback" not in log, log


def test_a_failed_request_fails_the_run(tmp_path: Path) -> None:
    # Nothing listens on the port: the admin user's requests fail at once.
    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "report"
    result = run(
        "--host", url, "--run-time", "2s", "--users", "1", "--out", str(out), "--", "AdminUser"
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "requests failed" in result.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert sum(row["failures"] for row in summary["requests"]) > 0


def test_broker_log_check_finds_errors_and_tracebacks(tmp_path: Path) -> None:
    run_module = load_run_module()
    log = tmp_path / "broker.log"
    log.write_text(
        "2026-01-01 00:00:00,000 INFO txnbuf: listening\n"
        "2026-01-01 00:00:01,000 INFO broker: topic errors-topic created\n"
    )
    assert run_module.bad_lines(log) == []
    log.write_text(
        log.read_text()
        + "2026-01-01 00:00:02,000 ERROR broker._connection: boom\n"
        + "Traceback (most recent call last):\n"
    )
    assert len(run_module.bad_lines(log)) == 2


def test_run_time_is_read_like_locust_reads_it() -> None:
    run_module = load_run_module()
    assert run_module.seconds("90") == 90
    assert run_module.seconds("10s") == 10
    assert run_module.seconds("1m30s") == 90
    assert run_module.seconds("1h") == 3600
    with pytest.raises(Exception, match="run time must look like"):
        run_module.seconds("ten")
