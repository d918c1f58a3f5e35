"""The Jepsen-style queue workload, short, as part of the test command.

Runs `txnbuf check` (the real CLI: a broker subprocess, concurrent
transactional clients, faults, a history, the checker) and fails on any
anomaly. Faults: SIGKILL and SIGSTOP/SIGCONT of the broker at seeded times,
and client crashes mid-transaction. The broker authenticates (``--auth``):
the clients hold a token of a role granted produce and consume on the
queues only. The long runs (README) use the same command with a longer
``--duration``.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.crash]


def test_queue_workload_under_kills_pauses_and_client_crashes_has_no_anomalies(
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
            "75",
            "--faults",
            "kill,pause",
            "--seed",
            "20261122",
            "--clients",
            "4",
            "--history",
            str(history),
            "--workdir",
            str(tmp_path / "work"),
            "--auth",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    assert "result: valid" in result.stdout, out[-5000:]
    assert "final reads complete           yes" in result.stdout
    # "client crashes 2, broker kills 3, pauses 2, final reads complete: True"
    for fault in ("client crashes", "broker kills", "pauses"):
        found = re.search(rf"{fault} (\d+)", result.stdout)
        assert found is not None and int(found.group(1)) >= 1, (fault, result.stdout[-2000:])
    ops = int(next(line.split()[-1] for line in result.stdout.splitlines()
                   if line.startswith("operations")))  # fmt: skip
    assert ops > 1000
    assert len(re.findall(r"\b\d+ operations\b|^operations\s", out, re.M)) == 1, "one count"
    table = result.stdout.split("anomaly class")[1].split("result:")[0]
    for row in table.splitlines()[2:-1]:  # (between the rules: every class has a status)
        assert re.fullmatch(r"[\w-]+\s+\d+  (ok|ANOMALY|(ok|found) \(informational\))", row), row
    # "faults (seconds from the start): kill at 12.3s, pause at 20.1s, ..."
    schedule = re.search(r"faults \(seconds from the start\): (.*)", result.stdout)
    assert schedule is not None, result.stdout[-2000:]
    for at in re.findall(r"(?:kill|pause) at ([\d.]+)s", schedule.group(1)):
        assert 0 < float(at) < 75
    assert history.stat().st_size > 0
    assert ", tokens;" in result.stderr
    grants = json.loads((tmp_path / "work" / "data" / "acl.json").read_text())["grants"]
    assert {(g["role"], g["permission"]) for g in grants} == {
        ("workload", "produce"),
        ("workload", "consume"),
    }


def test_queue_workload_on_a_cluster_of_three_brokers_with_faults_aimed_by_role(
    tmp_path: Path,
) -> None:
    """``--brokers 3 --store postgresql``: the check's own PostgreSQL, three
    brokers with --cluster, transactions across brokers (no key starts on
    the coordinator's broker: the history's placement), kills and pauses
    aimed at the transactions' coordinator's owner, a key's partition's
    owner, both and one at random
    (this seed: a kill of the coordinator's owner, a pause of both longer
    than the lease, a kill of the partitions' owner, ...); no anomaly, and
    each fault names its role and the brokers it hit, in the output and in
    the history."""
    history = tmp_path / "history.jsonl"
    result = subprocess.run(
        [sys.executable, "-m", "broker", "check", "--brokers", "3", "--store", "postgresql",
         "--duration", "45", "--faults", "kill,pause", "--seed", "40", "--clients", "3",
         "--history", str(history), "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=600,
    )  # fmt: skip
    out = result.stdout + result.stderr
    # (On failure: the summary table and the fault schedule, then the end of
    # the log; the history stays in pytest's tmp_path.)
    shown = f"{result.stdout[-6000:]}\n---\n{result.stderr[-3000:]}\nhistory: {history}"
    assert result.returncode == 0, shown
    assert "result: valid" in result.stdout, shown
    assert "final reads complete           yes" in result.stdout
    brokers = re.search(r"^brokers (.*); keys", result.stdout, re.M)
    assert brokers is not None, out[-3000:]
    urls = set(brokers.group(1).split(", "))
    assert len(urls) == 3
    # Transactions span brokers: no key starts on the coordinator's broker.
    layout = [json.loads(line) for line in history.read_text().splitlines() if '"layout"' in line]
    placement = layout[-1]["value"]
    coordinator = placement.pop("coordinator")[1]
    assert {url for _, url in placement.values()} <= urls - {coordinator}, placement
    assert len(placement) == 3 and "coordinator slot" in result.stdout
    schedule = re.search(r"faults \(seconds from the start\): (.*)", result.stdout)
    assert schedule is not None
    hits = re.findall(r"(kill|pause) at [\d.]+s of (\w+) ([^,]+)", schedule.group(1))
    assert [(f, r) for f, r, _ in hits[:3]] == [
        ("kill", "coordinator"),
        ("pause", "both"),
        ("kill", "partitions"),
    ], schedule.group(1)
    for _, _, hit in hits:
        assert set(hit.split("+")) <= urls
    faults = [json.loads(line) for line in history.read_text().splitlines() if '"nemesis"' in line]
    done = [f for f in faults if f["type"] == "ok"]
    assert [(f["f"], f["role"]) for f in done] == [(f, r) for f, r, _ in hits]
    assert all(set(f["brokers"]) <= urls and f["brokers"] for f in done)
    kills = re.search(r"broker kills (\d+), pauses (\d+)", result.stdout)
    assert kills is not None and int(kills.group(1)) >= 2 and int(kills.group(2)) >= 1
    # Before a new process reads, the previous one's doubtful transaction
    # ended: recorded with how it was found (its status, at its owner).
    ends = [json.loads(line) for line in history.read_text().splitlines() if "end-doubtful" in line]
    done = [e for e in ends if e["type"] != "invoke"]
    assert done and all(
        e["type"] == "ok" and re.fullmatch(r"(done|unknown) at http://\S+", e["value"]["how"])
        for e in done
    ), done


async def test_final_reads_that_stop_short_name_every_key_and_value_not_read(
    tmp_path: Path,
) -> None:
    """The final reads read every key at once, each to its own end: here
    they get no time at all, so every key stops short. The stats (and the
    summary) name, per key, the acknowledged values not read; the history's
    final-read op says per key that its reads did not complete, so the
    checker counts those nobody read as incomplete-read (not valid). Each
    transaction's completion says, per micro-op, whether its answer was
    awaited before the commit (a ``send_nowait`` send: false)."""
    from checker import History, Recorder, check
    from checker._workload import WorkloadConfig, run_workload

    cfg = WorkloadConfig(duration=2.0, clients=2, faults=(), final_read_timeout=0.0)
    with Recorder(tmp_path / "history.jsonl") as rec:
        stats = await run_workload(cfg, tmp_path / "work", rec)
    assert not stats["final_reads_complete"]
    keys = {f"{t}/0" for t in stats["topics"]}
    assert stats["unread"] and set(stats["unread"]) <= keys
    assert all(values == sorted(values) and values for values in stats["unread"].values())
    history = History.load(tmp_path / "history.jsonl")
    final = history[len(history) - 1]
    assert (final.f, final.type) == ("final-reads-complete", "fail")
    assert final.value == {key: key not in stats["unread"] for key in sorted(keys)}
    result = check(history)
    assert not result.valid and result.failures == ["incomplete-read"]
    assert result.incomplete_keys == sorted(stats["unread"])
    # (those nobody read at all: the workers' polls read some of them)
    assert all(e["value"] in stats["unread"][e["key"]] for e in result.anomalies["incomplete-read"])
    txns = [op for op in history if op.f == "txn" and op.type != "invoke"]
    assert txns and all(len(op.extra["awaited"]) == len(op.value) for op in txns)
    for op in txns:
        for mop, awaited in zip(op.value, op.extra["awaited"], strict=True):
            if mop[0] == "send" and op.type == "ok":
                assert awaited is not None
            if mop[0] == "poll" and len(mop) == 2 and not any(mop[1].values()):
                assert awaited is None
    # (every client op's invoke names its worker: its subscriptions are w<worker>)
    invokes = [op for op in history if op.f in ("txn", "send", "poll") and op.type == "invoke"]
    workers = {op.extra.get("worker") for op in invokes if not str(op.process).startswith("final")}
    assert workers == {0, 1}, workers
    seen = {a for op in txns for a in op.extra["awaited"]}
    assert {True, False} <= seen, seen  # (both kinds of send, over a few hundred ops)


def test_an_invalid_runs_broker_logs_are_kept_beside_its_history(tmp_path: Path) -> None:
    """`txnbuf check`'s brokers log at INFO into the work dir; an invalid
    run with a temporary work dir copies them beside the kept history."""
    from checker._cli import _keep_logs

    work = tmp_path / "work"
    work.mkdir()
    for i in range(2):
        (work / f"broker{i}.log").write_text(f"INFO serving slot {i}\n")
    history = tmp_path / "txnbuf-check-7.jsonl"
    where = _keep_logs(work, history, temporary=True)
    kept = tmp_path / "txnbuf-check-7-logs"
    assert where == f"{kept}/ (broker0.log, broker1.log)"
    assert (kept / "broker1.log").read_text() == "INFO serving slot 1\n"
    assert _keep_logs(work, history, temporary=False) == (
        f"{work / 'broker0.log'}, {work / 'broker1.log'}"
    )
