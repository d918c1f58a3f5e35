"""format("txnbuf") on a real local Spark (one session for the module,
``local[2,3]``: two threads, a task tried up to three times) against a real
broker process: what the source reads, task retries in the sink, batch
reads and writes, admission control, bad options, and the example jobs
``spark_windowed.py`` and ``spark_join.py`` run end to end in this session.
The driver crash and the 5,000-message exactly-once run are in
tests/test_spark_crash.py."""

from __future__ import annotations

import argparse
import asyncio
import collections
import importlib.util
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from client import Client
from tests.conftest import BrokerProcess
from tests.spark_support import (
    ROOT,
    module_broker,
    produce,
    read_all,
    sink_transactions,
    start_spark,
)

__all__ = ["module_broker"]  # (the fixture, imported for these tests)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="module")
def spark(faults: Path) -> Iterator[Any]:
    session = start_spark("local[2,3]", faults)
    try:
        yield session
    finally:
        session.stop()
        os.environ.pop("TXNBUF_SPARK_FAULT_DIR", None)


@pytest.fixture
def arm(faults: Path) -> Iterator[Any]:
    """Arm faults for one test (`pipelines._faults`); disarmed after it."""

    def arm_with(spec: str) -> None:
        for old in faults.iterdir():
            old.unlink()
        (faults / "faults").write_text(spec)

    yield arm_with
    (faults / "faults").write_text("")


def wait_for(predicate: Any, timeout: float = 90.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def stream(spark: Any, broker: BrokerProcess, topic: str, subscription: str, **options: str) -> Any:
    reader = (
        spark.readStream.format("txnbuf")
        .option("service_url", broker.url)
        .option("topic", topic)
        .option("subscription", subscription)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_the_source_reads_committed_messages_only(
    spark: Any, module_broker: BrokerProcess, tmp_path: Path
) -> None:
    url = module_broker.url

    async def setup() -> Any:
        client = Client(url)
        producer = await client.create_producer("committed")
        await producer.send(b"plain", key="k1", properties={"source": "test"})
        async with client.transaction() as done:
            await producer.send(b"committed", txn=done)
        aborted = await client.new_transaction()
        await producer.send(b"aborted", txn=aborted)
        await aborted.abort()
        still_open = await client.new_transaction(timeout=300)
        await producer.send(b"open-then-committed", txn=still_open)
        return client, still_open

    loop = asyncio.new_event_loop()
    client, still_open = loop.run_until_complete(setup())
    query = (
        stream(spark, module_broker, "committed", "committed-test")
        .writeStream.format("memory")
        .queryName("committed_out")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:

        def values() -> list[bytes]:
            return [bytes(r.value) for r in spark.sql("select value from committed_out").collect()]

        wait_for(lambda: len(values()) >= 2, what="the committed messages")
        time.sleep(1.0)  # (more batches: the open and the aborted transaction stay unread)
        assert sorted(values()) == [b"committed", b"plain"]
        loop.run_until_complete(still_open.commit())
        wait_for(lambda: len(values()) >= 3, what="the transaction committed meanwhile")
        time.sleep(0.5)
        assert sorted(values()) == [b"committed", b"open-then-committed", b"plain"]
        row = spark.sql("select * from committed_out where value = 'plain'").collect()[0]
        assert (row.key, row.topic, row.partition, row.message_id) == (
            "k1",
            "committed",
            0,
            "0:0:0",
        )
        assert row.properties == {"source": "test"} and row.publish_time.year >= 2024
    finally:
        query.stop()
        loop.run_until_complete(client.close())
        loop.close()
    # The source acknowledged what Spark committed on its subscription.
    code, body = module_broker.admin("GET", "/admin/v1/topics/committed/stats")
    subs = json.loads(body)["partitions"][0]["subscriptions"]
    assert code == 200 and subs["committed-test"]["mark_delete"][0] >= 1
    # A batch read sees the same committed messages.
    batch = spark.read.format("txnbuf").option("service_url", url).option("topic", "committed")
    assert sorted(bytes(r.value) for r in batch.load().collect()) == [
        b"committed",
        b"open-then-committed",
        b"plain",
    ]


def test_a_failed_task_attempt_leaves_no_duplicate(
    spark: Any, module_broker: BrokerProcess, tmp_path: Path, arm: Any, faults: Path
) -> None:
    url = module_broker.url
    assert module_broker.admin("PUT", "/admin/v1/topics/retry-in", b'{"partitions": 2}')[0] == 200
    values = [b"m-%d" % i for i in range(600)]
    produce(url, "retry-in", values, keys=[str(i) for i in range(600)])
    # One attempt's Python worker dies after its transaction is prepared,
    # another raises halfway through its rows: Spark retries both tasks.
    arm("sink.after_prepare@1=exit,sink.task_write@2=raise")
    aborted_before = transactions_aborted(module_broker)
    query = (
        stream(spark, module_broker, "retry-in", "retry-test")
        .selectExpr("key", "value")
        .writeStream.format("txnbuf")
        .option("service_url", url)
        .option("topic", "retry-out")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(240)
    assert query.exception() is None
    assert (faults / "sink.after_prepare.1").exists() and (faults / "sink.task_write.2").exists()
    out = read_all(url, "retry-out")
    assert collections.Counter(m.value for m in out) == collections.Counter(values)
    # The dead attempt's prepared transaction was aborted by the batch's
    # group commit (by tag), the other by its task (it had written nothing:
    # its sends were held by its client, so the broker lists it no more
    # once it ended, but counts it); none is left undecided.
    assert len(sink_transactions(module_broker, "ABORTED")) >= 1
    assert transactions_aborted(module_broker) - aborted_before >= 2
    assert sink_transactions(module_broker, "PREPARED") == []
    assert sink_transactions(module_broker, "OPEN") == []


def transactions_aborted(broker: BrokerProcess) -> float:
    """The broker's count of aborted transactions (its coordinators' metric)."""
    code, body = broker.admin("GET", "/metrics")
    assert code == 200
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in body.decode().splitlines()
        if line.startswith("txnbuf_transactions_aborted")
    )


def test_batch_write_and_read(spark: Any, module_broker: BrokerProcess) -> None:
    url = module_broker.url
    rows = [(f"k{i}", f"v{i}".encode(), {"i": str(i)}, f"batch-{i % 2}") for i in range(50)]
    df = spark.createDataFrame(
        rows, "key string, value binary, properties map<string,string>, topic string"
    )
    df.write.format("txnbuf").option("service_url", url).mode("append").save()
    for parity in (0, 1):
        got = (
            spark.read.format("txnbuf")
            .option("service_url", url)
            .option("topic", f"batch-{parity}")
            .load()
            .collect()
        )
        assert sorted((r.key, bytes(r.value), r.properties["i"]) for r in got) == sorted(
            (k, v, p["i"]) for k, v, p, t in rows if t == f"batch-{parity}"
        )
    assert sink_transactions(module_broker, "PREPARED") == []


def test_admission_control_caps_each_batch(
    spark: Any, module_broker: BrokerProcess, tmp_path: Path
) -> None:
    url = module_broker.url
    produce(url, "capped", [b"%d" % i for i in range(350)])
    query = (
        stream(spark, module_broker, "capped", "capped-test", maxMessagesPerBatch="100")
        .writeStream.format("memory")
        .queryName("capped_out")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(180)
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [100, 100, 100, 50]
    assert spark.sql("select count(distinct value) as n from capped_out").collect()[0].n == 350


def test_bad_options_are_refused_naming_the_option(
    spark: Any, module_broker: BrokerProcess
) -> None:
    with pytest.raises(Exception, match="service_url"):
        spark.read.format("txnbuf").option("topic", "t").load().collect()
    with pytest.raises(Exception, match="startingOffsets"):
        (
            spark.read.format("txnbuf")
            .option("service_url", module_broker.url)
            .option("topic", "t")
            .option("startingOffsets", "yesterday")
            .load()
            .collect()
        )
    df = spark.createDataFrame([("x",)], "body string")
    with pytest.raises(Exception, match='column "value"'):
        df.write.format("txnbuf").option("service_url", module_broker.url).option(
            "topic", "t"
        ).mode("append").save()


def load_example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_windowed_example_emits_each_window_once(
    spark: Any, module_broker: BrokerProcess, tmp_path: Path
) -> None:
    example = load_example("spark_windowed")
    common = ["--service-url", module_broker.url, "--checkpoint", str(tmp_path / "ckpt")]
    assert example.main([*common, "--demo", "200", "--available-now"]) == 0
    windows = [json.loads(m.value) for m in read_all(module_broker.url, "readings-windows")]
    # 200 readings of 4 sensors, 10 a second: 20 s of 5-second windows.
    assert len(windows) == len({(w["sensor"], w["window_start"]) for w in windows}) == 16
    assert sum(w["readings"] for w in windows) == 200


def test_the_join_example_enriches_each_order_once(
    spark: Any, module_broker: BrokerProcess, tmp_path: Path
) -> None:
    example = load_example("spark_join")
    common = ["--service-url", module_broker.url, "--checkpoint", str(tmp_path / "ckpt")]
    assert example.main([*common, "--demo", "140", "--available-now", "--input", "join-in"]) == 0
    joined = [json.loads(m.value) for m in read_all(module_broker.url, "orders-joined")]
    assert sorted(o["order_id"] for o in joined) == sorted(f"o-{i}" for i in range(140))
    assert {o["tier"] for o in joined if o["customer"] == "c-6"} == {"unknown"}
    assert {o["name"] for o in joined if o["customer"] == "c-1"} == {"Customer 1"}


def _readme_spark_examples() -> list[str]:
    from tests.test_docs import EXAMPLES

    return [command for command, _ in EXAMPLES if "/spark_" in command]


@pytest.mark.parametrize("command", _readme_spark_examples(), ids=lambda c: c.split()[1])
def test_the_readmes_spark_example_commands_run(
    command: str, spark: Any, module_broker: BrokerProcess, tmp_path: Path
) -> None:
    """The README's Spark example commands, with their arguments as written
    (the broker's address added, /tmp/ moved to this test's folder), on
    this module's Spark session: a JVM of their own each would cost the
    suite half a minute apiece. (tests/test_docs.py runs the README's other
    examples as processes of their own, and tests/test_spark_cluster.py
    runs spark_transform as one.)"""
    from tests.test_docs import localize

    argv = localize(command, tmp=tmp_path).split()
    assert argv[0] == ".venv/bin/python" and argv[1].startswith("examples/spark_")
    example = load_example(Path(argv[1]).stem)
    assert example.main([*argv[2:], "--service-url", module_broker.url]) == 0


def test_the_benchmark_runs_small(spark: Any, module_broker: BrokerProcess, tmp_path: Path) -> None:
    from bench import spark as bench_spark

    url = module_broker.url
    names = [bench_spark.subscription(f"{sink}-0") for sink in ("txnbuf", "parquet")]
    asyncio.run(bench_spark.load(url, 3000, 50, names))
    runs = {
        sink: [bench_spark.spark_run(spark, url, sink, 0, 500, tmp_path, 3000, 50)]
        for sink in ("txnbuf", "parquet")
    }
    # (each run checked its output: every input once, upper-cased)
    assert [len(r[0].batches) for r in runs.values()] == [6, 6]
    assert all(r[0].rate > 0 and r[0].latency(0.5) > 0 for r in runs.values())
    args = argparse.Namespace(messages=3000, size=50, batch=500, rounds=1)
    text = bench_spark.report(args, runs, [1000.0])
    assert "txnbuf sink / parquet sink" in text and "| direct CTP" in text
