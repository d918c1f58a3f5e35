"""Brokers whose store is PostgreSQL (`txnbuf serve --store URL`): a second
broker on the same database fences the first, which stops; what a broker
kept in its data directory (the ACL) is in the store; a bad URL is refused.
(Produce/consume, transactions, the epoch mode and crashes on PostgreSQL:
the tests marked `both_stores` in the other files.)"""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from broker.cli import main
from client import Client, errors
from tests.conftest import BrokerProcess, both_stores

pytestmark = pytest.mark.integration


def on_store(tmp_path: Path, url: str, name: str, auth: bool = False) -> BrokerProcess:
    return BrokerProcess(tmp_path / name, tmp_path / f"{name}.log", auth=auth, store=url)


def wait_exit(proc: BrokerProcess, timeout: float = 30.0) -> int:
    assert proc.proc is not None
    try:
        return proc.proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the broker did not stop:\n{proc.log()}")


async def test_a_second_broker_on_the_database_fences_the_first_which_stops(
    tmp_path: Path, pg_url: str
) -> None:
    first = on_store(tmp_path, pg_url, "first")
    second = on_store(tmp_path, pg_url, "second")
    first.start()
    try:
        async with Client(first.url) as client:
            producer = await client.create_producer("orders")
            acked = [await producer.send(b"%d" % i) for i in range(20)]
        assert len(acked) == 20
        second.start()  # (takes every slot: the first one's epochs are old now)
        try:
            async with Client(first.url, operation_timeout=10.0) as client:
                producer = await client.create_producer("orders")
                with pytest.raises(errors.TxnbufError):
                    await producer.send(b"written by a fenced broker")
        except (errors.TxnbufError, OSError):
            pass  # (it may be gone before the client connects)
        assert wait_exit(first) == 1
        log = first.log()
        assert "ERROR" in log and "fenced: another broker took over slots" in log, log
        # The second one serves everything acknowledged, and nothing else.
        async with Client(second.url) as client:
            consumer = await client.subscribe("orders", "check", initial_position="earliest")
            values = []
            with pytest.raises(errors.OperationTimeoutError):
                while True:
                    values.append((await consumer.receive(timeout=2)).value)
            assert values == [b"%d" % i for i in range(20)]
            producer = await client.create_producer("orders")
            await producer.send(b"by the second")
    finally:
        first.stop()
        second.stop()
        for proc in (first, second):
            print(f"----- {proc.log_path} -----\n{proc.log()}")


@pytest.mark.auth
async def test_the_acl_is_kept_in_the_store(
    tmp_path: Path, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker = on_store(tmp_path, pg_url, "b", auth=True)
    broker.start()
    try:
        body = {"role": "app", "permission": "produce", "resource": "topic:orders-*"}
        status, answer = broker.admin("POST", "/admin/v1/acl/grant", json.dumps(body).encode())
        assert status == 200, answer
        broker.kill()
        broker.start()
        status, answer = broker.admin("GET", "/admin/v1/acl")
        assert status == 200 and json.loads(answer) == {"acl": [body]}
        assert not (tmp_path / "b").exists()  # (no data directory at all)
        monkeypatch.setenv("TXNBUF_TOKEN", broker.make_token("app"))
        async with Client(broker.url) as client:
            producer = await client.create_producer("orders-1")
            await producer.send(b"allowed")
    finally:
        broker.stop()


def test_a_store_that_is_not_a_postgresql_url_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["serve", "--store", "mysql://x"])
    assert caught.value.code == 2
    assert "a store is a PostgreSQL URL" in capsys.readouterr().err


def test_a_store_that_cannot_be_reached_stops_the_start(tmp_path: Path) -> None:
    broker = on_store(tmp_path, "postgresql://postgres:pw@127.0.0.1:1/none", "b")
    with pytest.raises(RuntimeError, match="cannot open the data in the store") as caught:
        broker.start()
    assert "pw@" not in str(caught.value)


@both_stores
async def test_metrics_answer_on_either_store(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        await (await client.create_producer("m")).send(b"x")
    status, body = broker.admin("GET", "/metrics")
    assert status == 200 and b"txnbuf_ledger_commits_total" in body
    await asyncio.sleep(0)
