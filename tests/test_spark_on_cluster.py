"""format("txnbuf") against a txnbuf cluster: ``examples/spark_transform.py``
(its own driver process, ``local[2]``) given the three brokers' URLs in one
string with commas copies orders with a transform from a topic to another,
exactly once, over three brokers sharing one PostgreSQL, while the broker
that owns the output topic (and so the sink's coordinator,
`pipelines._sink.batch_coordinator`) is SIGKILLed in the middle of the job.
The client follows the slots to their new owners; a task or a batch that
fails meanwhile is retried by Spark (a task) or by running the query again
from its checkpoint (the job, up to twice). The output then holds each input
exactly once, and no sink transaction is left undecided."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from broker._slots import slot_of_key
from client import Client, Message, TransactionGroups, errors
from tests.conftest import BrokerProcess
from tests.spark_support import ROOT, sink_transactions
from tests.test_cluster_brokers import (
    SLOTS,
    logs,  # noqa: F401 (a fixture)
    owner_id,
    owners,
    served_by,
    slots,
    start_all,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.crash]

ORDERS = 2000
PER_BATCH = 200
SOURCE, TARGET = "orders-in", "orders-out"

if not hasattr(TransactionGroups, "coordinator_near"):  # (routing in a cluster)
    pytestmark.append(
        pytest.mark.skip(reason="transaction groups and cursors are not routed in a cluster here")
    )


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


async def test_the_copy_job_runs_exactly_once_through_a_sigkill_of_the_sinks_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],  # noqa: F811
) -> None:
    started = time.monotonic()
    start_all(tmp_path, pg_url, 3, 2.0, logs)

    async def placed() -> bool:
        held = [owner for _, owner, _ in await slots(pg_url)]
        return None not in held and set(held) == {owner_id(p) for p in logs}

    await wait_for("slots spread over the 3 brokers", placed)
    service = ",".join(p.url for p in logs)
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
        f"the test took {time.monotonic() - started:.1f}s"
    )
