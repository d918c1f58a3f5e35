"""Run the locust load test headless and print what it measured.

    .venv/bin/python loadtests/run.py                      # 60 s, 8 users, its own broker
    .venv/bin/python loadtests/run.py --run-time 10s --users 4 --out /tmp/load
    .venv/bin/python loadtests/run.py --host http://127.0.0.1:6650 --broker-log broker.log

Without ``--host`` it starts a broker (``python -m broker serve`` on a free
port, data and log in the output folder) and stops it afterwards. Then it
runs ``locustfile.py`` headless for ``--run-time`` with ``--users`` users
(the four user classes in equal numbers) and prints, per request,
requests/s, p50/p95/p99 in ms (exact, from every latency) and the
failures. The output folder gets locust's CSV files (``locust_stats.csv``
...), its HTML report (``report.html``), ``summary.json``, locust's log
and the broker's. With ``--baseline`` the same txnbuf work then runs
without locust (`baseline.py`) against the same broker, for comparison.

Exits 1 if any request failed, a user raised, locust failed, or the
broker's log (its own, or ``--broker-log``) has an ERROR, CRITICAL or
Traceback line. Arguments after ``--`` go to locust as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import workload

HERE = Path(__file__).resolve().parent
BAD_LOG_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback \(most recent call last\)")


def seconds(run_time: str) -> float:
    """Locust's run time (``90``, ``90s``, ``1m30s``, ``1h``) in seconds."""
    if run_time.isdigit():
        return float(run_time)
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", run_time)
    if not run_time or parts is None:
        raise argparse.ArgumentTypeError(f"run time must look like 60s, 2m or 1h30m: {run_time!r}")
    h, m, s = (int(p or 0) for p in parts.groups())
    return float(h * 3600 + m * 60 + s)


def start_broker(out: Path) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with open(out / "broker.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", "serve", "--data-dir", str(out / "broker-data"),
             "--port", str(port), "--log-level", "INFO"],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(url + "/admin/v1/health", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.05)
    proc.kill()
    proc.wait()
    raise SystemExit(f"the broker did not start; its log: {out / 'broker.log'}")


def stop_broker(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


def bad_lines(log: Path) -> list[str]:
    return [
        line for line in log.read_text(errors="replace").splitlines() if BAD_LOG_LINE.search(line)
    ]


def run_locust(args: argparse.Namespace, url: str, out: Path) -> int:
    cmd = [
        sys.executable, "-m", "locust", "-f", str(HERE / "locustfile.py"), "--headless",
        "--host", url, "--users", str(args.users),
        "--spawn-rate", str(args.spawn_rate or args.users),
        "--run-time", args.run_time, "--stop-timeout", "10", "--only-summary",
        "--csv", str(out / "locust"), "--html", str(out / "report.html"),
        "--summary-json", str(out / "summary.json"), "--txnbuf-prefix", args.prefix,
        *args.locust_args,
    ]  # fmt: skip
    print(f"locust: {args.users} users for {args.run_time} against {url} ...", flush=True)
    with open(out / "locust.log", "wb") as log:
        proc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, timeout=seconds(args.run_time) + 120
        )
    return proc.returncode


def run_baseline(args: argparse.Namespace, url: str, out: Path) -> None:
    cmd = [
        sys.executable, str(HERE / "baseline.py"), "--host", url, "--prefix", args.prefix + "-base",
        "--users", str(max(1, args.users // 4)), "--seconds", str(seconds(args.run_time)),
        "--summary-json", str(out / "baseline.json"),
    ]  # fmt: skip
    print("\nthe same txnbuf work without locust (baseline.py), against the same broker:")
    subprocess.run(cmd, check=True, timeout=seconds(args.run_time) + 120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run-time", default="60s", help="locust's --run-time (default 60s)")
    parser.add_argument("--users", type=int, default=8, help="users in all (default 8)")
    parser.add_argument("--spawn-rate", type=float, default=0, help="users/s (default: all)")
    parser.add_argument("--host", help="an existing broker's URL (default: start one)")
    parser.add_argument("--broker-log", type=Path, help="that broker's log, checked for errors")
    parser.add_argument("--out", type=Path, default=Path("loadtest-report"), help="output folder")
    parser.add_argument("--prefix", default=f"load-{int(time.time())}", help="topic name prefix")
    parser.add_argument("--baseline", action="store_true", help="then run baseline.py as well")
    parser.add_argument("locust_args", nargs="*", help="after --: more locust arguments")
    args = parser.parse_args()
    seconds(args.run_time)  # (a bad run time fails here, before anything starts)
    args.out.mkdir(parents=True, exist_ok=True)

    broker, url = (None, args.host) if args.host else start_broker(args.out)
    try:
        code = run_locust(args, url, args.out)
        if args.baseline and code == 0:
            run_baseline(args, url, args.out)
    finally:
        broker_code = stop_broker(broker) if broker is not None else 0

    problems = []
    summary_path = args.out / "summary.json"
    if summary_path.exists():
        summary = json.loads(summary_path.read_text())
        print(f"\nlocust, {summary['seconds']:.1f} s:")
        print(workload.table(summary))
        failed = sum(row["failures"] for row in summary["requests"])
        if failed:
            problems.append(f"{failed} requests failed (see {args.out / 'locust_failures.csv'})")
    else:
        problems.append("locust wrote no summary")
    if code != 0:
        problems.append(f"locust exited with {code} (see {args.out / 'locust.log'})")
    log = args.broker_log or (None if args.host else args.out / "broker.log")
    if log is not None:
        found = bad_lines(log)
        if found:
            problems.append(f"the broker logged {len(found)} errors, first: {found[0]}")
    if broker_code != 0:
        problems.append(f"the broker exited with {broker_code}")
    print(f"\nreport: {args.out / 'report.html'}, CSV: {args.out / 'locust_stats.csv'}")
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
