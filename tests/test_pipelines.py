"""pipelines/ without a Spark session: option checks, the source's share of a
limited batch, faults, and the sink's driver side (commit and abort of a
batch by its tag) against a real broker."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from client import Client, TransactionGroups, TxnID
from pipelines import OptionError, SinkCommit, batch_tag
from pipelines import _faults as faults
from pipelines._options import SinkOptions, SourceOptions
from pipelines._runner import close_all
from pipelines._sink import abort_batch, checkpoint_query_id, commit_batch
from pipelines._source import _share, positions_of
from tests.conftest import BrokerProcess


def test_source_options_are_checked_and_name_what_is_wrong() -> None:
    base = {"service_url": "http://h:1", "topic": "orders"}
    parsed = SourceOptions.parse(base, streaming=True)
    assert (parsed.subscription, parsed.starting, parsed.max_messages_per_batch) == (
        "spark-orders",
        "latest",
        None,
    )
    assert SourceOptions.parse({**base, "STARTINGOFFSETS": "earliest"}, True).starting == "earliest"
    assert SourceOptions.parse(base, streaming=False).starting == "earliest"
    assert (
        SourceOptions.parse({**base, "maxMessagesPerBatch": "50"}, True).max_messages_per_batch
        == 50
    )
    for bad, named in (
        ({"topic": "orders"}, "service_url"),
        ({**base, "service_url": "broker:6650"}, "service_url"),
        ({"service_url": "http://h:1"}, "topic"),
        ({**base, "startingOffsets": "yesterday"}, "startingOffsets"),
        ({**base, "maxMessagesPerBatch": "many"}, "maxMessagesPerBatch"),
        ({**base, "maxMessagesPerBatch": "0"}, "maxMessagesPerBatch"),
    ):
        with pytest.raises(OptionError, match=named):
            SourceOptions.parse(bad, streaming=True)
    sink = SinkOptions.parse({"service_url": "http://h:1", "checkpointLocation": "/c"})
    assert (sink.topic, sink.checkpoint, sink.prepared_timeout_ms) == (None, "/c", 3_600_000)
    with pytest.raises(OptionError, match="preparedTimeoutMs"):
        SinkOptions.parse({"service_url": "http://h:1", "preparedTimeoutMs": "-5"})


def test_a_limited_batch_is_shared_fairly() -> None:
    assert _share({0: 100, 1: 100}, 50) == {0: 25, 1: 25}
    assert _share({0: 10, 1: 100, 2: 0}, 50) == {0: 10, 1: 40, 2: 0}  # (what 0 leaves to 1)
    assert _share({0: 3, 1: 4}, 100) == {0: 3, 1: 4}
    assert sum(_share({0: 7, 1: 7, 2: 7}, 10).values()) == 10
    assert positions_of({"subscription": "s", "partitions": {"1": [3, 2]}}) == {1: (3, 2)}


def test_faults_fire_at_their_nth_hit_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TXNBUF_SPARK_FAULT_DIR", str(tmp_path))
    monkeypatch.delenv("TXNBUF_SPARK_FAULTS", raising=False)
    faults.hit("sink.after_commit")  # (nothing armed: nothing happens)
    (tmp_path / "faults").write_text("sink.after_commit@2=raise")
    faults.hit("sink.after_commit")
    with pytest.raises(faults.InjectedFault, match=r"sink\.after_commit"):
        faults.hit("sink.after_commit")
    faults.hit("sink.after_commit")  # (past its hit)
    faults.hit("sink.before_commit")  # (another step)


def test_the_query_id_is_read_from_a_local_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_text('{"id":"8d1c2f1e-query"}\n')
    assert checkpoint_query_id(str(tmp_path)) == "8d1c2f1e-query"
    assert checkpoint_query_id(tmp_path.as_uri()) == "8d1c2f1e-query"
    assert checkpoint_query_id(str(tmp_path / "none")) is None
    assert checkpoint_query_id("hdfs://namenode/ckpt") is None
    assert checkpoint_query_id(None) is None


@pytest.mark.integration
async def test_the_driver_commits_a_batch_once_and_aborts_by_tag(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    (tmp_path / "metadata").write_text(json.dumps({"id": "q-1"}))
    options = SinkOptions.parse({"service_url": broker.url, "checkpointLocation": str(tmp_path)})

    async def prepared(batch: int, value: bytes) -> TxnID:
        async with Client(broker.url) as client:
            groups = TransactionGroups(client)
            txn = await groups.new_transaction(
                batch_tag("q-1", batch), tc_id=await groups.coordinator_for("q-1")
            )
            await (await client.create_producer("sink-out")).send(value, txn=txn)
            await txn.prepare()
            return txn.id

    first = await prepared(0, b"first")
    stray = await prepared(0, b"stray")
    try:  # (the driver's calls run on pipelines' own loop, in a thread, as in Spark)
        commit = [SinkCommit("q-1", 0, tuple(first), 1)]
        await asyncio.to_thread(commit_batch, options, commit, 0, None)
        again = await prepared(0, b"again")
        commit = [SinkCommit("q-1", 0, tuple(again), 1)]
        await asyncio.to_thread(commit_batch, options, commit, 0, None)  # (a replay)
        failed = await prepared(1, b"failed")
        await asyncio.to_thread(abort_batch, options, [None, None], 1)  # (id: the checkpoint's)
    finally:
        close_all()
    async with Client(broker.url) as client:
        reader = await client.create_reader("sink-out")
        assert [m.value for m in await reader.read_batch()] == [b"first"]
    for txnid, status in ((stray, "ABORTED"), (again, "ABORTED"), (failed, "ABORTED")):
        code, body = broker.admin("GET", f"/admin/v1/transactions/{txnid}")
        assert code == 200 and json.loads(body)["status"] == status
    with pytest.raises(RuntimeError, match="several query ids"):
        commit_batch(options, [SinkCommit("a", 2, None, 0), SinkCommit("b", 2, None, 0)], 2, None)
