"""A cluster set up as on a real network, against real broker processes
sharing one PostgreSQL database: three brokers listening on every
interface (``--host 0.0.0.0``) publish their ``--advertised-url`` (here
https://127.0.0.1:PORT), and serve TLS with a certificate no system CA
trusts, which each broker is told to trust at the others
(``--cluster-tls-ca``). A client given one broker's URL reaches all three;
a transaction whose coordinator, output partition and input subscription
are on three brokers commits (the brokers' tells and checks go over TLS,
and show in /metrics); an admin request asked at one broker is answered by
the owner; a lookup on the stream listener names the advertised host.
A cluster broker on a wildcard address without an advertised
URL, and bad advertised URLs, are refused at start. Tests wait for
conditions, never for a length of time."""

from __future__ import annotations

import asyncio
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from broker.cli import main
from client import Client
from client._connection import Command, Connection, command
from client._foreign import tls_context
from client._txn import TxnState
from tests._cluster import cluster_broker, owner_id, placed, received, scrape, three_topics
from tests.conftest import BrokerProcess, PortTaken, free_port
from tests.test_metrics import value
from tests.test_security import self_signed

pytestmark = pytest.mark.integration


class Advertised(BrokerProcess):
    """A cluster broker listening on 0.0.0.0 that advertises
    https://127.0.0.1:PORT and trusts ``ca`` at the other brokers."""

    def __init__(self, tmp_path: Path, pg_url: str, name: str, cert: Path, key: Path) -> None:
        base = cluster_broker(tmp_path, pg_url, name, 2.0)
        super().__init__(base.data_dir, base.log_path, store=pg_url)
        self.cluster_args = base.args
        self.tls = (cert, key, cert)
        self.kafka_port = free_port()  # (on 0.0.0.0 too: advertised at the URL's host)

    def _start(self, timeout: float) -> None:
        self.args = [
            *self.cluster_args,
            "--host",
            "0.0.0.0",
            "--insecure",
            "--advertised-url",
            self.url,  # (its port: a restart on another port advertises that one)
            "--cluster-tls-ca",
            str(self.tls[2] if self.tls else ""),
            "--kafka-port",
            str(self.kafka_port),
        ]
        try:
            super()._start(timeout)
        except RuntimeError as exc:
            if self._port_movable and f"cannot listen on 0.0.0.0:{self.port}: in use" in str(exc):
                raise PortTaken(self.port) from exc
            raise


def admin_call(proc: BrokerProcess, path: str) -> tuple[int, Any, dict[str, str]]:
    """(status, JSON answer, headers) of ``GET path`` at ``proc`` over TLS."""
    assert proc.tls is not None
    context = ssl.create_default_context(cafile=proc.tls[2])
    try:
        with urllib.request.urlopen(proc.url + path, timeout=30, context=context) as answer:
            return answer.status, json.loads(answer.read()), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


async def test_brokers_on_every_interface_with_tls_advertise_reach_and_trust_each_other(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
) -> None:
    cert, key = self_signed(tmp_path)
    for i in range(3):
        proc = Advertised(tmp_path, pg_url, f"b{i}", cert, key)
        if i == 0:
            proc.stream_port = free_port()
        logs.append(proc)
        proc.start()
    found = await placed(pg_url, logs)

    # The membership publishes the advertised URLs, never the wildcard; the
    # Kafka listener's address takes the advertised URL's host.
    conn = await asyncpg.connect(pg_url)
    try:
        rows = await conn.fetch("SELECT urls FROM txnbuf.brokers")
    finally:
        await conn.close()
    published = sorted(
        f"{p.url},kafka://127.0.0.1:{p.kafka_port}" for p in logs if isinstance(p, Advertised)
    )
    assert len(published) == 3
    assert sorted(r["urls"] for r in rows) == published
    assert all("0.0.0.0" not in r["urls"] for r in rows)

    a, b, c = logs
    anchor, out, into = three_topics(found, logs)
    async with Client(a.url, tls_ca=cert, operation_timeout=30.0) as client:
        source = await client.create_producer(into)
        for i in range(2):
            await source.send(f"in-{i}".encode())
        consumer = await client.subscribe(into, "copy", initial_position="earliest")
        producer = await client.create_producer(out)
        reader = await client.subscribe(out, "check", initial_position="earliest")
        # One URL given; the lookups' redirects named the others' advertised URLs.
        txn = await client.new_transaction(near=anchor)
        assert {txn._conn.url, producer._conn.url, consumer._conn.url} == {p.url for p in logs}
        for _ in range(2):
            message = await consumer.receive(timeout=60)
            await producer.send(b"copy of " + message.value, txn=txn)
            await consumer.acknowledge(message, txn=txn)
        await txn.commit()
        assert txn.state is TxnState.COMMITTED
        assert sorted(await received(reader, 2)) == [b"copy of in-0", b"copy of in-1"]

    # The peers' figures moved: the coordinator (a) told both participants,
    # each participant (b: a partition, c: a subscription) checked with it.
    tells = value(scrape(a), "txnbuf_cluster_peer_tells_total")
    assert tells >= 2
    for participant in (b, c):
        samples = scrape(participant)
        assert value(samples, "txnbuf_cluster_peer_checks_total") >= 1
        assert value(samples, "txnbuf_cluster_stale_end_refusals_total") == 0

    # On the stream listener (listening on 0.0.0.0 too), LOOKUP's CONNECT
    # names the advertised host, and a REDIRECT the owner's advertised URL.
    conn = Connection(a.stream_url, 10.0, "", tls_context(cert))
    try:
        await conn.start()
        for topic, url in ((anchor, a.stream_url), (out, b.url)):

            def build(request_id: int, topic: str = topic) -> Command:
                return command(Command.LOOKUP, "lookup", request_id=request_id, topic=topic)

            reply = await conn.request(build, Command.LOOKUP_RESPONSE, "lookup")
            assert reply.lookup_response.broker_service_url == url, reply
    finally:
        await conn.close()

    # An admin request at a broker that does not own the topic: forwarded
    # over TLS to the owner's advertised URL, answered by it.
    status, stats, headers = await asyncio.to_thread(admin_call, a, f"/admin/v1/topics/{out}/stats")
    assert status == 200, stats
    assert headers.get("X-Txnbuf-Answered-By") == owner_id(b)
    status, view, _ = await asyncio.to_thread(admin_call, a, "/admin/v1/cluster")
    assert status == 200, view
    assert not view.get("missing"), view


def serve(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    """``txnbuf serve ARGS`` in this process (each case here is refused
    before anything starts): its exit status and stderr."""
    with pytest.raises(SystemExit) as exited:
        main(["serve", *args])
    return int(exited.value.code or 0), capsys.readouterr().err


def test_a_cluster_broker_on_a_wildcard_address_needs_an_advertised_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ["--store", "postgresql://txnbuf@127.0.0.1:1/none", "--cluster", "--insecure"]
    code, err = serve(capsys, *store, "--host", "0.0.0.0", "--data-dir", str(tmp_path / "d"))
    assert code == 2
    assert "--cluster with --host '0.0.0.0' needs --advertised-url" in err
    assert not (tmp_path / "d").exists()  # (refused before anything was opened)
    for bad, why in (
        ("http://0.0.0.0:6650", "names a wildcard address"),
        ("tcp://b:6650", "an advertised URL is http://host:port or https://host:port"),
        ("http://b:6650/ws", "names a host and a port only"),
        ("http://b:x", "not a URL"),
    ):
        code, err = serve(capsys, *store, "--host", "0.0.0.0", "--advertised-url", bad)
        assert code == 2, (bad, err)
        assert why in err, (bad, err)
    code, err = serve(capsys, *store, "--advertised-url", "https://b:6650")  # (no --tls-cert)
    assert code == 2
    assert "must start with http://" in err
    code, err = serve(capsys, "--cluster-tls-ca", "ca.pem")
    assert code == 2
    assert "--cluster-tls-ca is for --cluster" in err
