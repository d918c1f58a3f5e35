"""The benchmarks of single pieces run and check their own results (small sizes)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import acks

ROOT = Path(__file__).resolve().parent.parent


def test_entry_order_shuffles_only_within_windows() -> None:
    order = acks.entry_order(10, 4)
    assert sorted(order) == list(range(10))
    assert [sorted(order[i : i + 4]) for i in (0, 4, 8)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_run_refuses_a_cursor_left_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    from subscriptions import _cursor

    monkeypatch.setattr(_cursor.Cursor, "_advance", lambda self, count, last: None)
    with pytest.raises(SystemExit, match="did not end past every message"):
        acks.run(_cursor, acks.entry_order(8, 4), 5)


def test_acks_benchmark_prints_both_sides() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.acks", "--entries", "40", "--per-entry", "10",
         "--rounds", "1", "--baseline", str(ROOT)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    assert "baseline" in out
    assert "in order (1 worker)" in out and "windows of 4 (4 workers)" in out
    # The figures are also recorded, with the machine and the code they came from.
    recorded = (Path(os.environ["TXNBUF_BENCH_RESULTS"]) / "acks.md").read_text()
    assert "python -m bench.acks --entries 40" in recorded and " cores; Python " in recorded
    assert "in order (1 worker)" in recorded


async def test_txnpath_round_checks_that_every_transaction_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import txnpath
    from tc import TransactionCoordinator

    result = await txnpath.one_round(30, 10, 2)
    assert result["main_us"] > 0 and result["wall_us"] > 0
    end_txn = TransactionCoordinator.end_txn

    def abort_instead(self: TransactionCoordinator, txnid: object, commit: bool) -> object:
        return end_txn(self, txnid, False)  # type: ignore[arg-type]

    monkeypatch.setattr(TransactionCoordinator, "end_txn", abort_instead)
    with pytest.raises(SystemExit, match="0 of 30 transactions committed, 300 inputs"):
        await txnpath.one_round(30, 10, 2)


def test_txnpath_benchmark_prints_both_sides() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.txnpath", "--txns", "20", "--per-txn", "5",
         "--rounds", "1", "--concurrency", "1", "--baseline", str(ROOT)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert "      1      this" in out and "      1  baseline" in out


@pytest.mark.integration
def test_txn_benchmark_runs_small() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.txn", "--messages", "2000", "--workers", "1", "2",
         "--produce-rounds", "2", "--produce-messages", "2000"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["1"], ["2"])]
    assert [row[0] for row in rows] == ["1", "2"]
    assert all(float(row[1].replace(",", "")) > 0 for row in rows)
    assert "median of 2 runs of each" in out and "each round: " in out
    assert "ratio to plain in windows" in out and "to plain with as many in flight" in out


async def test_txnmemory_side_reports_an_index_that_commits_leave() -> None:
    from bench import txnmemory

    result = await txnmemory.one_side(300, 2)
    assert result["index"] == 0  # every transaction ended: none left in the index
    assert 0 < result["snapshot_bytes"] < 30_000 and result["held_per_commit"] > 0


def test_txnmemory_benchmark_prints_both_sides() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.txnmemory", "--commits", "200", "--baseline", str(ROOT)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert "after 200 commits" in out
    table, legend = out.strip().split("\n\n")  # (the table, then what its columns mean)
    assert [line.split()[0] for line in table.splitlines()[-2:]] == ["this", "baseline"]
    assert legend.startswith("index: ")


async def test_topicmemory_side_reports_what_a_topic_holds_and_where() -> None:
    from bench import topicmemory

    result = await topicmemory.one_side(30, 2, 40, 1)
    assert 0 < result["unloaded"] < result["loaded"]
    lines = result["breakdown"]
    assert lines[0].startswith("by source line") and any(" x " in line for line in lines)
    # (A loaded topic holds a Ledger object per ledger: the store makes them.)
    assert any("ledger/_store.py" in line for line in lines)


def test_topicmemory_benchmark_prints_every_side(tmp_path: Path) -> None:
    env = {**os.environ, "TXNBUF_BENCH_RESULTS": str(tmp_path)}
    args = ["--topics", "20", "--baseline", f"same={ROOT}"]
    out = subprocess.run(
        [sys.executable, "-m", "bench.topicmemory", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    table, legend = out.strip().split("\n\n")
    rows = [line.split() for line in table.splitlines()[-2:]]
    assert [row[0] for row in rows] == ["this", "same"]
    assert all(0 < float(row[1].replace(",", "")) < float(row[2].replace(",", "")) for row in rows)
    assert legend.startswith("not loaded B: ")
    assert "20 topics" in (tmp_path / "topicmemory.md").read_text()


@pytest.mark.integration
async def test_txnceiling_free_broker_keeps_transactions_out_of_the_machinery(
    tmp_path: Path,
) -> None:
    """bench.txnceiling's stand-in broker stores a transaction's sends as plain
    messages and answers its END once they are durable: its messages are
    there to read after commit(), and the partition never gets a transaction
    buffer (the real broker's would have one)."""
    import aiohttp

    from bench import txnceiling
    from client import Client

    broker = txnceiling.broker_process(str(tmp_path / "data"), free=True)
    try:
        async with Client(broker.url) as client:
            producer = await client.create_producer("ceiling")
            consumer = await client.subscribe("ceiling", "s", initial_position="earliest")
            ids = []
            for round_ in range(2):
                txn = await client.new_transaction(timeout=60)
                for i in range(5):
                    producer.send_nowait(b"%d-%d" % (round_, i), txn=txn)
                txn.flush()  # (the full path: the stand-in replaces its SEND and END)
                await txn.commit()
                ids.append(txn.id.least_bits)
            # The first was opened by the coordinator (NEW_TXN), the second
            # by the stand-in's END.
            assert ids[0] < txnceiling.FREE_IDS_FROM <= ids[1]
            values = [(await consumer.receive()).value for _ in range(10)]
        assert values == [b"%d-%d" % (r, i) for r in range(2) for i in range(5)]
        async with (
            aiohttp.ClientSession() as session,
            session.get(broker.url + "/admin/v1/topics/ceiling/stats") as reply,
        ):
            stats = await reply.json()
        assert [p["transaction_buffer"] for p in stats["partitions"]] == [None]
    finally:
        broker.stop()


@pytest.mark.integration
def test_txnceiling_benchmark_runs_small() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.txnceiling", "--messages", "2000", "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    table, legend = out.strip().split("\n\n")  # (the table, then what its columns mean)
    rows = {line[:18].strip(): line[18:].split() for line in table.splitlines()[1:]}
    assert list(rows) == ["way", *txnceiling_ways()]
    assert legend.startswith("ratio: ")
    for way in txnceiling_ways():
        assert float(rows[way][0].replace(",", "")) > 0  # msgs/s
    assert rows["plain"][1] == "1.00"  # the ratio to itself


def txnceiling_ways() -> tuple[str, ...]:
    from bench.txnceiling import WAYS

    return WAYS


def test_ctp_output_check_finds_duplicates_and_losses() -> None:
    from bench import ctp

    outputs = [ctp.transform(ctp.value_of(n, 20)) for n in range(5)]
    ctp.check_output(outputs, 5, 20)
    with pytest.raises(ctp.OutputError, match="6 outputs for 5 inputs: 1 duplicates, 0 inputs"):
        ctp.check_output([*outputs, outputs[2]], 5, 20)
    with pytest.raises(ctp.OutputError, match="4 outputs for 5 inputs: 0 duplicates, 1 inputs"):
        ctp.check_output(outputs[1:], 5, 20)
    with pytest.raises(ctp.OutputError, match="1 outputs are not their input transformed"):
        ctp.check_output([*outputs[:4], ctp.value_of(4, 20)], 5, 20)


@pytest.mark.integration
def test_ctp_benchmark_runs_every_system_installed(tmp_path: Path) -> None:
    """bench.ctp runs txnbuf's two loops and each peer installed here
    (bench/install-peers), checks every run's output, and reports a peer
    that is not installed as not run, with no ratio against it."""
    from bench import ctp

    results = tmp_path / "ctp.md"
    out = subprocess.run(
        [sys.executable, "-m", "bench.ctp", "--messages", "2000", "--rounds", "1",
         "--workers", "1", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    installed = [peer for peer in ctp.PEERS if ctp.missing(peer) is None]
    expected = [f"{ctp.NAMES[peer]}, 1 process" for peer in installed]
    expected += ["txnbuf, README loop, 1 process", "txnbuf, fastest loop, 1 process"]
    assert [label for label in rows if label] == expected
    for label in expected:
        assert float(rows[label][1].replace(",", "")) > 0  # the median msgs/s
    for peer in set(ctp.PEERS) - set(installed):
        assert f"{ctp.NAMES[peer]}: not run: " in out
    ratio = rows["txnbuf, fastest loop, 1 process"][-1]
    if installed:  # the ratio to the best peer, who is named
        best = max(
            installed, key=lambda p: float(rows[f"{ctp.NAMES[p]}, 1 process"][1].replace(",", ""))
        )
        assert ratio.endswith(f"({ctp.NAMES[best]})") and float(ratio.split()[0]) > 0
    else:
        assert ratio == "no peer ran"
    assert (
        "Every run's output was checked: 2,000 outputs, each input transformed exactly once" in out
    )
    assert "- 1 process: " in out  # README loop / fastest loop
    assert out.strip() in results.read_text()


@pytest.mark.integration
def test_ctp_benchmark_runs_a_baseline_checkout_in_the_same_rotation(tmp_path: Path) -> None:
    """bench.ctp --baseline runs txnbuf's rows again with another
    checkout's code (here this one, as a folder given by path), checks their
    output too, and gives each row's ratio to the baseline's; with
    --stream, both sides' workers on the raw TCP listener."""
    results = tmp_path / "ctp.md"
    out = subprocess.run(
        [sys.executable, "-m", "bench.ctp", "--messages", "1000", "--rounds", "1",
         "--workers", "1", "--systems", "txnbuf", "--loops", "readme", "--stream",
         "--baseline", f"other={ROOT}", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=180,
    ).stdout  # fmt: skip
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| t")]
    assert rows == ["txnbuf, README loop, 1 process", "txnbuf (other), README loop, 1 process"]
    assert f"baseline other: txnbuf's rows again with the code of {ROOT}" in out
    assert "- txnbuf, README loop, 1 process / other: " in out
    assert "txnbuf's workers connect to the raw TCP listener" in out
    assert "Every run's output was checked: 1,000 outputs" in out


def test_ctp_refuses_a_baseline_that_is_not_a_checkout(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.ctp", "--baseline", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "not a txnbuf checkout" in done.stderr


@pytest.mark.integration
def test_epoch_benchmark_runs_small(tmp_path: Path) -> None:
    results = tmp_path / "epoch.md"
    out = subprocess.run(
        [sys.executable, "-m", "bench.epoch", "--messages", "300", "--per-txn", "10",
         "--rounds", "1", "--workers", "2", "--write-txns", "10", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    rows = {
        cells[1].strip(): cells[2:]
        for line in out.stdout.splitlines()
        if line.startswith("| ") and len(cells := line.split("|")) > 3
    }
    for label in (
        "transactional produce, PIP-31, 2 workers",
        "transactional produce, epoch, 2 workers",
        "transactional produce, epoch 2PC, 2 workers",
        "consume-transform-produce, PIP-31, 2 workers",
        "consume-transform-produce, epoch, 2 workers",
    ):
        assert float(rows[label][0].replace(",", "")) > 0, label  # round 1's msgs/s
    for api in ("PIP-31", "epoch", "epoch 2PC"):
        assert float(rows[api][1]) >= 1  # a transaction takes at least one group commit
    assert "consume-transform-produce, epoch, 2 workers: " in out.stdout  # its ratio
    assert "2PC (prepare + complete) costs " in out.stdout
    assert out.stderr.count("output checked") == 2  # both consume-transform-produce runs
    assert results.read_text().strip().endswith(out.stdout.strip().splitlines()[-1])


@pytest.mark.integration
async def test_epoch_benchmark_output_check_catches_a_wrong_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consume-transform-produce run whose loop copies its inputs untransformed
    stops the benchmark."""
    import argparse

    from bench import epoch

    monkeypatch.setattr(epoch, "transform", lambda value: value)
    args = argparse.Namespace(messages=50, per_txn=10, size=20)
    server = epoch.Server(str(tmp_path))
    try:
        with pytest.raises(SystemExit, match="50 outputs are not their input transformed"):
            await epoch.ctp_run(server, epoch.Variant("ctp", "epoch", 1), args)
    finally:
        server.stop()


@pytest.mark.integration
def test_scale_benchmark_runs_small_and_records_its_figures(tmp_path: Path) -> None:
    """bench.scale at 50 topics and 20 connections: both tables with figures,
    appended to the results file with the machine it ran on."""
    results = tmp_path / "scale.md"
    out = subprocess.run(
        [sys.executable, "-m", "bench.scale", "--topics", "50", "--connections", "20",
         "--rounds", "2", "--quiet-sends", "20", "--results", str(results),
         "--work-dir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    rows = {line.split("|")[2].strip(): line.split("|")[3:-1] for line in out.splitlines()
            if line.startswith("| this | ")}  # fmt: skip
    topics, connections = rows["50"], rows["20"]
    healthy, read_again, rss, per_topic = (float(topics[i].replace(",", "")) for i in (1, 2, 5, 7))
    assert 0 < healthy <= read_again and rss > 0 and per_topic > 0
    assert topics[9].strip() == "-"  # (no writer process: the writer is a thread of the broker)
    assert [float(connections[i]) > 0 for i in (1, 3)] == [True, True]  # quiet, loaded p50
    recorded = results.read_text()
    assert recorded.startswith("## ") and "nproc" in recorded and "| 50 |" in recorded


def test_versus_runs_a_benchmark_on_two_checkouts_and_compares_its_rows() -> None:
    # (this checkout against itself: the harness, not a speed, is under test)
    out = subprocess.run(
        [sys.executable, "-m", "bench.versus", str(ROOT), "--rounds", "2", "--",
         "txn", "--no-produce", "--workers", "2", "--messages", "400", "--per-txn", "20"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=300,
    ).stdout  # fmt: skip
    assert out.count("### round") == 4  # two rounds of each side, interleaved
    (summary,) = [line for line in out.splitlines() if line.startswith("  2 worker(s): ")]
    assert "msgs/s " in summary and "broker us/msg " in summary and "(" in summary
    recorded = (Path(os.environ["TXNBUF_BENCH_RESULTS"]) / "versus.md").read_text()
    assert "python -m bench.versus" in recorded and "2 worker(s)" in recorded


def test_versus_reads_the_rows_of_txn_and_ctp() -> None:
    from bench.versus import rows_of

    txn = "workers msgs/s ...\n      4    54,188     5.8     16.0     6.9     8.3\n"
    assert rows_of("txn", txn) == {
        "4 worker(s)": {
            "msgs/s": 54188.0,
            "commit p50 ms": 5.8,
            "commit p99 ms": 16.0,
            "client us/msg": 6.9,
            "broker us/msg": 8.3,
        }
    }
    ctp = (
        "| txnbuf, README loop, 1 process | 47,582 | 50,233 | 51,764 | 50,233 | 6.16 | 7.20 "
        "| 4.40 | - |\n| PostgreSQL, 1 process | 74,234 | 72,382 | 71,620 | 72,382 | 2.45 "
        "| 8.70 | - | - |\n"
    )
    assert rows_of("ctp", ctp) == {
        "txnbuf, README loop, 1 process": {
            "msgs/s": 50233.0,
            "client us": 6.16,
            "server us": 7.2,
            "writer us": 4.4,
        }
    }


@pytest.mark.integration
def test_kafka_benchmark_measures_sasl_ssl_and_each_codec_beside_plaintext() -> None:
    from bench.kafka import CODECS

    out = subprocess.run(
        [sys.executable, "-m", "bench.kafka", "--messages", "300", "--per-txn", "50",
         "--rounds", "1", "--no-tansu"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    for client in ("aiokafka", "confluent-kafka"):
        for protocol in ("PLAINTEXT", "SASL_SSL"):
            assert f"{client} -> txnbuf {protocol}" in out
        for codec in CODECS:
            assert f"plain produce, 100 B JSON, {codec}, median of 1" in out
    recorded = (Path(os.environ["TXNBUF_BENCH_RESULTS"]) / "kafka.md").read_text()
    assert "| plain fetch, median of 1 | confluent-kafka -> txnbuf SASL_SSL |" in recorded
    assert " cores; Python " in recorded and "broker CPU us/msg" in recorded


@pytest.mark.integration
def test_cluster_benchmark_runs_both_stores_and_counts_what_postgresql_wrote(
    tmp_path: Path,
) -> None:
    results = tmp_path / "cluster.md"
    out = subprocess.run(
        [sys.executable, "-m", "bench.cluster", "--messages", "1000", "--rounds", "1",
         "--workers", "1", "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=180,
    ).stdout  # fmt: skip
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    for label in ("SQLite, 1 process", "PostgreSQL, 1 process"):
        assert float(rows[label][1].replace(",", "")) > 0, out  # the median msgs/s
    assert "- 1 process: " in out.split("PostgreSQL / SQLite:")[1]
    written = out.split("per message copied (all rounds):")[1].splitlines()[1]
    rows_per_message = float(written.split(": ")[1].split(" rows")[0])
    assert rows_per_message > 0, written
    assert "Every run's output was checked: 1,000 outputs" in out
    assert results.read_text().count("PostgreSQL, 1 process") == 1


@pytest.mark.integration
def test_pgdriver_benchmark_runs_asyncpg(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.pgdriver", "--commits", "20", "--rounds", "1",
         "--rows", "1,10", "--results", str(tmp_path / "pgdriver.md")],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert "| asyncpg | 1 |" in out and "| asyncpg | 10 |" in out


def test_hops_benchmark_runs_brokers_side_by_side() -> None:
    """bench.hops runs each broker given (here: the WebSocket and the stream
    listener), checks every run's output, and counts group commits per
    transaction."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.hops", "--messages", "2000", "--rounds", "1",
         "--workers", "1", "--loops", "fastest", "--broker", "ws",
         "--broker", "stream,scheme=txnbuf"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=180,
    ).stdout  # fmt: skip
    rows = {
        cells[0]: cells[1:]
        for line in out.splitlines()
        if line.startswith("| ") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    for label in ("ws: fastest loop, 1 process", "stream: fastest loop, 1 process"):
        assert float(rows[label][1].replace(",", "")) > 0  # the median msgs/s
        assert 0 < float(rows[label][6]) < 3  # group commits per transaction
    assert "Every run's output was checked: 2,000 outputs" in out
    recorded = (Path(os.environ["TXNBUF_BENCH_RESULTS"]) / "hops.md").read_text()
    assert "--broker stream,scheme=txnbuf" in recorded


def test_framing_benchmark_runs_both_transports() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.framing", "--txns", "50", "--rounds", "1"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert "| aiohttp WebSocket |" in out and "| raw TCP (length + bytes) |" in out


def test_sqlitecommit_benchmark_runs_every_shape() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.sqlitecommit", "--commits", "5", "--rounds", "1",
         "--rows", "2"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    for shape in ("one statement", "executemany", "row by row"):
        assert f"| 2 | {shape} |" in out


@pytest.mark.integration
def test_xbroker_benchmark_runs_both_placements_and_checks_the_copy(tmp_path: Path) -> None:
    results = tmp_path / "xbroker.md"
    out = subprocess.run(
        [sys.executable, "-m", "bench.xbroker", "--messages", "50", "--rounds", "1",
         "--results", str(results)],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=180,
    ).stdout  # fmt: skip
    assert "round 1 local:" in out and "round 1 across:" in out
    assert "across / local rate:" in out
    assert results.read_text().count("| across |") == 1
