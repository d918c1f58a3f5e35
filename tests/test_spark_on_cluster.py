"""format("txnbuf") against a txnbuf cluster: ``examples/spark_transform.py``
(its own driver process, ``local[2]``) given the three brokers' URLs in one
string with commas copies orders with a transform from a topic to another,
exactly once, over three brokers sharing one PostgreSQL, while the broker
that owns the output topic (and so the sink's coordinator,
`pipelines._sink.batch_coordinator`) is SIGKILLed in the middle of the job.
The client follows the slots to their new owners; a task or a batch that
fails meanwhile is retried by Spark (a task) or by running the query again
from its checkpoint (the job, up to twice). The output then holds each input
exactly once, and no sink transaction is left undecided. Before the job,
the sink's steps themselves (tasks' prepared transactions, the driver's
group commit, a replay) write rows whose ``topic`` column names topics of
the two brokers other than the coordinator's: transactions across brokers."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest

from broker._slots import slot_of_key
from client import Client, Message, errors
from pipelines._options import SinkOptions
from pipelines._runner import close_all
from pipelines._sink import SinkCommit, commit_batch, write_task
from tests._cluster import (
    SLOTS,
    owner_id,
    owners,
    served_by,
    slots,
    start_all,
    topic_in,
    wait_for,
)
from tests.conftest import BrokerProcess
from tests.spark_support import ROOT, sink_transactions

pytestmark = [pytest.mark.integration, pytest.mark.crash]

ORDERS = 2000
PER_BATCH = 200
SOURCE, TARGET = "orders-in", "orders-out"


async def read_all(url: str, topic: str) -> list[Message]:
    """Every committed message of ``topic`` (one partition)."""
    async with Client(url, operation_timeout=60.0) as client:
        try:
            reader = await client.create_reader(topic, 0)
        except errors.TopicNotFoundError:  # (not written yet)
            return []
        out: list[Message] = []
        while batch := await reader.read_batch(10_000):
            out.extend(batch)
        return out


async def produce(url: str, topic: str, values: list[bytes]) -> None:
    async with Client(url, operation_timeout=60.0) as client:
        producer = await client.create_producer(topic)
        for value in values:
            producer.send_nowait(value)
        await producer.flush()


def driver(url: str, tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    args = [
        sys.executable,
        str(ROOT / "examples" / "spark_transform.py"),
        "--service-url",
        url,
        "--input",
        SOURCE,
        "--output",
        TARGET,
        "--checkpoint",
        str(tmp_path / "checkpoint"),
        "--max-messages-per-batch",
        str(PER_BATCH),
        "--available-now",
    ]
    with open(log, "ab") as out:
        return subprocess.Popen(
            args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


async def sink_across_brokers(service: str, pg_url: str, procs: list[BrokerProcess]) -> None:
    """The sink's own steps (two tasks' prepared transactions, the driver's
    group commit, then a replay of the batch) with rows whose ``topic``
    column names topics of the two brokers other than the coordinator's
    (the ``topic`` option's slot's owner): each row once in its topic, the
    replay's transaction aborted, nothing left PREPARED."""
    found = await owners(pg_url)
    home, *others = (min(found[owner_id(p)]) for p in procs)
    option, first, second = (topic_in(slot, "sink-x") for slot in (home, *others))
    options = SinkOptions.parse({"service_url": service, "topic": option})
    rows = {first: [b"a0", b"a1", b"a2"], second: [b"b0", b"b1"]}

    def task(values: list[bytes], topics: list[str | None]) -> SinkCommit:
        batch = pa.RecordBatch.from_pydict(
            {"value": values, "topic": topics},
            pa.schema([("value", pa.binary()), ("topic", pa.string())]),
        )
        return write_task(options, "q-across", 0, iter([batch]))

    try:
        tasks = [
            await asyncio.to_thread(task, [b"a0", b"b0", b"o0"], [first, second, None]),
            await asyncio.to_thread(task, [b"a1", b"b1", b"a2"], [first, second, first]),
        ]
        await asyncio.to_thread(commit_batch, options, tasks, 0, None)
        replay = await asyncio.to_thread(task, [b"late"], [second])
        await asyncio.to_thread(commit_batch, options, [replay], 0, None)  # (a duplicate)
    finally:
        await asyncio.to_thread(close_all)
    for topic, values in (*rows.items(), (option, [b"o0"])):
        assert sorted(m.value for m in await read_all(service, topic)) == values, topic
    for proc in procs:
        assert sink_transactions(proc, "PREPARED") == [], proc.url
    ended = [t["status"] for t in sink_transactions(procs[0])]  # (the coordinator's broker)
    assert sorted(ended) == ["ABORTED", "COMMITTED", "COMMITTED"], ended


async def test_the_copy_job_runs_exactly_once_through_a_sigkill_of_the_sinks_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    started = time.monotonic()
    start_all(tmp_path, pg_url, 3, 2.0, logs)

    async def placed() -> bool:
        held = [owner for _, owner, _ in await slots(pg_url)]
        return None not in held and set(held) == {owner_id(p) for p in logs}

    await wait_for("slots spread over the 3 brokers", placed)
    service = ",".join(p.url for p in logs)
    across = time.monotonic()
    await sink_across_brokers(service, pg_url, logs)
    across = time.monotonic() - across
    orders = [
        {"order_id": f"o-{i}", "customer": f"c-{i % 11}", "amount": i % 90 + 1.0, "currency": "EUR"}
        for i in range(ORDERS)
    ]
    await produce(service, SOURCE, [json.dumps(o).encode() for o in orders])
    # The broker that owns the output topic's slot: its partitions and the
    # sink's coordinator (`batch_coordinator`).
    victim = served_by(await owners(pg_url), slot_of_key(TARGET, SLOTS), logs)
    log = tmp_path / "driver.log"
    job = driver(service, tmp_path, log)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and job.poll() is None:
        if len(await read_all(service, TARGET)) >= 2 * PER_BATCH:
            break
        await asyncio.sleep(0.3)
    assert job.poll() is None, log.read_text(errors="replace")[-5000:]
    partial = len(await read_all(service, TARGET))
    victim.kill()
    killed = time.monotonic()
    runs = 1
    while await asyncio.to_thread(job.wait, 300) != 0 and runs < 3:
        runs += 1  # (the query failed: run it again from its checkpoint)
        job = driver(service, tmp_path, log)
    assert job.returncode == 0, log.read_text(errors="replace")[-5000:]
    out = [json.loads(m.value) for m in await read_all(service, TARGET)]
    counts = collections.Counter(o["order_id"] for o in out)
    assert len(counts) == ORDERS and set(counts.values()) == {1}, [
        k for k, n in counts.items() if n != 1
    ][:10]
    for proc in logs:
        if proc is not victim:
            assert sink_transactions(proc, "PREPARED") == [], proc.url
            assert sink_transactions(proc, "OPEN") == [], proc.url
    print(
        f"{ORDERS} orders copied once: {partial} before the SIGKILL of the sink's broker, the "
        f"rest in {time.monotonic() - killed:.1f}s after it; the job ran {runs} time(s); "
        f"the test took {time.monotonic() - started:.1f}s (the sink across brokers {across:.1f}s)"
    )
