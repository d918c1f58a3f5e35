"""The `txnbuf` admin commands and the CLI's own errors against the real
broker: the admin commands through `broker.cli.main` in this process (what
``txnbuf topics ...`` runs), the rest as ``python -m broker ...``."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from broker.cli import main
from client import Client
from tests.conftest import BrokerProcess

pytestmark = pytest.mark.integration


def txnbuf(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=60
    )


def admin(*args: str) -> subprocess.CompletedProcess[str]:
    """``txnbuf *args`` in this process (an admin command)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = int(exc.code or 0)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def ok(broker: BrokerProcess, *args: str) -> str:
    result = admin(*args, "--url", broker.url)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    return result.stdout


def as_json(broker: BrokerProcess, *args: str) -> Any:
    return json.loads(ok(broker, *args, "--json"))


def refused(broker: BrokerProcess, *args: str) -> str:
    result = admin(*args, "--url", broker.url)
    assert result.returncode == 1, result
    assert result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    return result.stderr


async def test_topic_and_subscription_commands(broker: BrokerProcess) -> None:
    out = ok(broker, "topics", "create", "cli", "--partitions", "2", "--retention-time", "600")
    assert "cli: 2 partition(s), retention 600s/unlimited" in out
    listed = ok(broker, "topics", "list")
    assert listed.splitlines()[0].split() == ["NAME", "PARTITIONS", "RETENTION"]
    assert listed.splitlines()[1].split() == ["cli", "2", "600s/unlimited"]
    out = ok(broker, "topics", "create", "cli", "--retention-size", "1000000")  # (keeps 2)
    assert "cli: 2 partition(s), retention unlimited/1000000B" in out
    async with Client(broker.url) as client:
        consumer = await client.subscribe("cli", "s", initial_position="earliest")
        producer = await client.create_producer("cli")
        for i in range(6):
            await producer.send(f"m{i}".encode(), key=str(i))
        await consumer.close()

        assert "in use" in refused(broker, "topics", "delete", "cli")
        stats = as_json(broker, "topics", "stats", "cli")
        assert sum(p["messages"] for p in stats["partitions"]) == 6
        table = ok(broker, "topics", "stats", "cli")
        assert "BACKLOG" in table.splitlines()[1]

        subs = as_json(broker, "subscriptions", "list", "cli")["subscriptions"]
        assert [(s["name"], s["backlog"]) for s in subs] == [("s", 6)]
        skipped = as_json(broker, "subscriptions", "skip", "cli", "s", "1")
        assert sum(p["skipped"] for p in skipped["partitions"]) == 2  # one on each partition
        assert as_json(broker, "subscriptions", "list", "cli")["subscriptions"][0]["backlog"] == 4
        ok(broker, "subscriptions", "reset", "cli", "s", "--earliest")
        assert as_json(broker, "subscriptions", "list", "cli")["subscriptions"][0]["backlog"] == 6
        assert "one of --earliest" in refused(broker, "subscriptions", "reset", "cli", "s")
        assert "PARTITION:ENTRY" in refused(
            broker, "subscriptions", "reset", "cli", "s", "--message", "x"
        )
        out = ok(broker, "subscriptions", "delete", "cli", "s")
        assert "deleted subscription s of topic cli" in out
        await producer.close()
    out = ok(broker, "topics", "delete", "cli")
    assert out.startswith("deleted topic cli (2 partition(s)")
    assert "404 no topic 'cli'" in refused(broker, "topics", "stats", "cli")
    assert ok(broker, "topics", "list").strip() == "NAME  PARTITIONS  RETENTION"


async def test_transaction_and_producer_commands(broker: BrokerProcess) -> None:
    async with Client(broker.url) as client:
        producer = await client.create_producer("tx")
        txn = await client.new_transaction(timeout=60)
        await producer.send(b"x", txn=txn)
        txn.flush()  # (the full path: the broker knows its partition while it is open)
        await producer.flush()  # a transactional send returns once queued
        txnid = str(txn.id)
        listed = ok(broker, "transactions", "list", "--state", "OPEN")
        assert txnid in listed and "tx/0" in listed
        assert as_json(broker, "transactions", "show", txnid)["status"] == "OPEN"
        assert "ABORTED" in ok(broker, "transactions", "abort", txnid)
        assert as_json(broker, "transactions", "list", "--running-longer-than-ms", "0") == {
            "transactions": []
        }
        assert "409" in refused(broker, "transactions", "resolve", txnid, "retry")
        assert "404" in refused(broker, "transactions", "show", "(0,999999)")
        assert as_json(broker, "producers", "list") == {"producers": []}
        assert "404" in refused(broker, "producers", "show", "nobody")


def test_version_and_bad_options() -> None:
    result = txnbuf("--version")
    assert result.returncode == 0 and result.stdout.startswith("txnbuf ")
    for args, what in (
        (["serve", "--log-level", "FOO"], "--log-level: choose from DEBUG"),
        (["serve", "--port", "99999"], "a port is a number"),
        (
            ["serve", "--port", "7000", "--stream-port", "7000"],
            "--port and --stream-port are both 7000",
        ),
        (
            ["serve", "--stream-port", "7001", "--kafka-port", "7001"],
            "--stream-port and --kafka-port are both 7001",
        ),
    ):
        result = txnbuf(*args)
        assert result.returncode == 2, result
        assert what in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    result = admin("topics")
    assert result.returncode == 2 and "required" in result.stderr


def test_a_busy_port_is_one_line_and_opens_no_data(broker: BrokerProcess, tmp_path: Path) -> None:
    data = tmp_path / "other"
    result = txnbuf("serve", "--port", str(broker.port), "--data-dir", str(data))
    assert result.returncode == 1
    assert (
        result.stderr.strip() == f"txnbuf serve: cannot listen on 127.0.0.1:{broker.port}: in use"
    )
    assert not data.exists()


def test_no_broker_is_one_line() -> None:
    result = admin("topics", "list", "--url", "http://127.0.0.1:1")
    assert result.returncode == 1
    assert result.stderr.startswith("txnbuf topics list: no answer from the broker at")
    assert len(result.stderr.strip().splitlines()) == 1


def test_commands_carry_a_token_to_a_broker_that_authenticates(tmp_path: Path) -> None:
    broker = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    broker.enable_auth()
    broker.start()
    try:
        assert broker.token is not None
        assert "401" in refused(broker, "topics", "list")
        app = broker.make_token("app")
        assert "403" in refused(broker, "topics", "create", "t", "--token", app)
        out = ok(broker, "topics", "create", "t", "--token", broker.token)
        assert "topic t: 1 partition(s)" in out
        with pytest.MonkeyPatch.context() as env:
            env.setenv("TXNBUF_TOKEN", broker.token)
            assert ok(broker, "topics", "list").splitlines()[1].split()[0] == "t"
    finally:
        broker.stop()


async def test_transactions_list_shows_those_in_progress_and_all_ended_ones_with_all(
    broker: BrokerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    import client._spares

    monkeypatch.setattr(client._spares, "MAX_AGE", 120.0)  # (the spare waits for the listing)
    async with Client(broker.url) as c:
        producer = await c.create_producer("tl")
        async with c.transaction(timeout=600) as done:  # (its END opens a spare)
            await producer.send(b"x", txn=done)
        running = await c.new_transaction(timeout=60)  # (another timeout: not the spare)
        await producer.send(b"y", txn=running)
        await producer.flush()
        listed = {t["txnid"]: t for t in as_json(broker, "transactions", "list")["transactions"]}
        assert list(listed) == [str(running.id)], "in progress only: not ended, no spare"
        everything = as_json(broker, "transactions", "list", "--all")["transactions"]
        statuses = {t["txnid"]: (t["status"], t["spare"]) for t in everything}
        assert statuses[str(done.id)] == ("COMMITTED", False)
        assert statuses[str(running.id)] == ("OPEN", False)
        spares = [t for t, (status, spare) in statuses.items() if spare]
        assert len(spares) == 1 and statuses[spares[0]][0] == "OPEN"
        table = ok(broker, "transactions", "list", "--all")
        assert "OPEN (spare, unused)" in table and "COMMITTED" in table
        assert "COMMITTED" not in ok(broker, "transactions", "list")
        await running.abort()


def _closed_pipe_runs(commands: list[list[str]]) -> list[tuple[list[str], int, str]]:
    """``txnbuf *args`` for each of ``commands`` at once, each writing to a
    pipe whose reader has gone: (args, exit code, stderr) of each. Their
    output is unbuffered, so that the first write meets the closed pipe
    while the command runs (as a long output does when ``head`` stops
    reading), not in the flush at exit."""
    import os

    runs = []
    for args in commands:
        read, write = os.pipe()
        os.close(read)
        proc = subprocess.Popen(
            [sys.executable, "-m", "broker", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        os.close(write)
        runs.append((args, proc))
    return [(args, proc.wait(timeout=120), proc.communicate()[1]) for args, proc in runs]


def test_every_command_survives_a_closed_pipe(broker: BrokerProcess, tmp_path: Path) -> None:
    """``txnbuf ... | head`` with the reader gone: no traceback, whatever the command."""
    url = ["--url", broker.url]
    ok(broker, "topics", "create", "piped", "--partitions", "2")
    key = tmp_path / "secret.key"
    assert txnbuf("token", "create-secret-key", "--output", str(key)).returncode == 0
    commands = [
        ["--version"],
        ["--help"],
        ["serve", "--help"],
        ["topics", "list", *url],
        ["topics", "stats", "piped", *url],
        ["subscriptions", "list", "piped", *url],
        ["transactions", "list", "--all", *url],
        ["producers", "list", "--json", *url],
        ["token", "create", "--subject", "a", "--secret-key-file", str(key)],
        ["acl", "list", *url],
        ["check", "--help"],
        ["check-data", "--help"],
        ["backup", str(broker.data_dir), str(tmp_path / "copy")],
    ]
    for args, code, stderr in _closed_pipe_runs(commands):
        assert "Traceback" not in stderr and "Error" not in stderr, (args, stderr)
        assert code in (0, 1), (args, code, stderr)


def test_one_line_errors_name_no_exception_class(broker: BrokerProcess, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    port = str(broker.port + 1 if broker.port < 65535 else broker.port - 1)
    for args in (
        ["serve", "--data-dir", str(broker.data_dir), "--port", port],  # in use by `broker`
        ["serve", "--data-dir", str(a_file), "--port", port],  # not a folder
        ["check-data", str(broker.data_dir)],  # a broker runs on it
        ["backup", str(tmp_path / "nothing"), str(tmp_path / "copy")],
    ):
        result = txnbuf(*args)
        assert result.returncode in (1, 2), (args, result)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1, (args, result.stderr)
        assert not re.search(r"\b[A-Z]\w*(Error|Exception)\b", lines[0]), lines[0]
