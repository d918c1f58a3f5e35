"""What the Spark tests share: a broker for a whole module, a Spark session
for a whole module (starting one takes 10-20 s), reading a topic back, and
the broker's view of the sink's transactions."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client import Client, Message
from tests.conftest import BrokerProcess

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def module_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    where = tmp_path_factory.mktemp("broker")
    proc = BrokerProcess(where / "data", where / "broker.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        sys.stderr.write(f"----- broker log ({proc.log_path}) -----\n{proc.log()[-5000:]}\n")


def start_spark(master: str, fault_dir: Path) -> Any:
    """A session for this test process: its Python workers (and the
    driver's source and commit processes) run this interpreter and see
    ``fault_dir`` (`pipelines._faults`)."""
    os.environ["TXNBUF_SPARK_FAULT_DIR"] = str(fault_dir)
    from pipelines import spark_session

    return spark_session(
        master,
        "txnbuf-tests",
        {
            "spark.executorEnv.TXNBUF_SPARK_FAULT_DIR": str(fault_dir),
            "spark.sql.streaming.forceDeleteTempCheckpointLocation": "true",
        },
    )


def read_all(url: str, topic: str) -> list[Message]:
    """Every committed message of ``topic``, partition by partition."""

    async def go() -> list[Message]:
        async with Client(url) as client:
            out: list[Message] = []
            for partition in range(await client.partitions(topic)):
                reader = await client.create_reader(topic, partition)
                while batch := await reader.read_batch(10_000):
                    out.extend(batch)
            return out

    return asyncio.run(go())


def produce(url: str, topic: str, values: list[bytes], keys: list[str] | None = None) -> None:
    async def go() -> None:
        async with Client(url) as client:
            producer = await client.create_producer(topic)
            await asyncio.gather(
                *(
                    producer.send(v, key=None if keys is None else keys[i])
                    for i, v in enumerate(values)
                )
            )

    asyncio.run(go())


def sink_transactions(broker: BrokerProcess, status: str | None = None) -> list[dict[str, Any]]:
    """The sink's transactions the broker still knows (undecided, or ended
    recently), optionally in one status."""
    code, body = broker.admin("GET", "/admin/v1/transactions")
    assert code == 200
    found = [t for t in json.loads(body)["transactions"] if t["tag"].startswith("spark:")]
    return [t for t in found if status is None or t["status"] == status]
