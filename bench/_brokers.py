"""How a benchmark starts brokers: `BrokerProcess` (``txnbuf serve`` on a
free port, waited for until it answers, restartable), and a cluster's
brokers over one PostgreSQL database (`cluster_brokers`, and what a
benchmark asks of the slots table: `owners`, `spread`, `topic_in`,
`wait_until`). A private PostgreSQL server is `bench._postgres`'s
(`bench._postgres.private_postgres`)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from bench.txnpath import cpu_seconds, writer_seconds
from broker._slots import slot_of_key

__all__ = [
    "SLOTS",
    "BrokerProcess",
    "cluster_brokers",
    "free_port",
    "owners",
    "spread",
    "topic_in",
    "wait_until",
]

SLOTS = 64  # a cluster database's slots (its default)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerProcess:
    """``txnbuf serve [OPTIONS]`` on a free port, started by ``python ENTRY...``
    (``-m broker`` unless told), and waited for until it answers; `start`
    runs it again (on the same port and data).

    ``root``: run the broker from another checkout's code (its directory
    first on the path; nothing is written there). ``log``: a file for the
    broker's log (INFO), else WARNING to this stderr. ``timeout``: seconds
    to wait for /admin/v1/health. ``options``: more options of ``txnbuf
    serve``; ``env``: more environment variables. ``tls``: it serves TLS
    (``--tls-cert`` among ``options``), trusted with this context (its URL
    is https://). ``started_in`` is how long starting took."""

    def __init__(
        self,
        data_dir: str | os.PathLike[str],
        entry: Sequence[str] = ("-m", "broker"),
        *,
        port: int | None = None,
        root: str | None = None,
        log: str | os.PathLike[str] | None = None,
        timeout: float = 30.0,
        options: Sequence[str] = (),
        env: dict[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.port = port or free_port()
        self.tls = tls
        self.url = f"{'http' if tls is None else 'https'}://127.0.0.1:{self.port}"
        self.log = log
        self.timeout = timeout
        self.root = root
        self.cmd = [sys.executable, *entry, "serve", "--data-dir", str(data_dir),
                    "--port", str(self.port), "--log-level", "WARNING" if log is None else "INFO",
                    *options]  # fmt: skip
        if root is not None:
            env = {**(env or {}), "PYTHONPATH": root, "PYTHONDONTWRITEBYTECODE": "1"}
        self.env = None if env is None else {**os.environ, **env}
        self.start()

    def start(self) -> None:
        """Start the process and wait until it answers /admin/v1/health."""
        out = None if self.log is None else open(self.log, "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, cwd=self.root, env=self.env, stdout=out, stderr=out)
        if out is not None:
            out.close()
        deadline = t0 + self.timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                health = self.url + "/admin/v1/health"
                with urllib.request.urlopen(health, timeout=1, context=self.tls):
                    self.started_in = time.monotonic() - t0
                    return
            except OSError:
                time.sleep(0.02)
        code = self.proc.poll()
        self.kill()  # (not left running behind the benchmark)
        why = f"exited ({code})" if code is not None else f"not within {self.timeout:.0f} s"
        raise RuntimeError(
            f"broker did not start: {why}" + (f"; see {self.log}" if self.log else "")
        )

    @property
    def owner(self) -> str:
        """Who this broker is in a cluster's slots table."""
        return f"{self.url} pid {self.proc.pid}"

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far of the broker without its ledger writer, and of the writer."""
        writer = writer_seconds(self.proc.pid)
        return cpu_seconds(self.proc.pid) - writer, writer

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self) -> None:
        self.proc.wait()

    def kill(self) -> None:
        """SIGKILL it, if it runs."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def cluster_brokers(
    folder: Path, store: str, n: int = 3, ttl: float | None = None, timeout: float = 120.0
) -> list[BrokerProcess]:
    """``n`` brokers of a cluster over the database ``store`` (``txnbuf serve
    --store URL --cluster``; ``ttl``: their ``--lease-ttl``, else the
    default), each with its data in ``folder/bI`` and its log (INFO) in
    ``folder/bI.log``, started one after the other."""
    options = ["--store", store, "--cluster"]
    if ttl is not None:
        options += ["--lease-ttl", str(ttl)]
    brokers: list[BrokerProcess] = []
    try:
        for i in range(n):
            data, log = folder / f"b{i}", folder / f"b{i}.log"
            brokers.append(BrokerProcess(data, log=log, timeout=timeout, options=options))
    except BaseException:
        for broker in brokers:
            broker.kill()
        raise
    return brokers


async def owners(store: str) -> dict[int, str | None]:
    """Each slot's owner in the cluster database ``store`` (`BrokerProcess.owner`)."""
    import asyncpg

    conn = await asyncpg.connect(store)
    try:
        return dict(await conn.fetch("SELECT slot, owner FROM txnbuf.slots"))
    finally:
        await conn.close()


async def spread(store: str, brokers: Sequence[BrokerProcess]) -> bool:
    """Every slot owned by one of ``brokers``, their shares within one slot."""
    found = await owners(store)
    live = {b.owner for b in brokers}
    counts = [sum(1 for o in found.values() if o == b) for b in live]
    return set(found.values()) == live and max(counts) - min(counts) <= 1


def topic_in(slot: int, prefix: str = "f") -> str:
    """A topic name whose slot is ``slot``."""
    i = 0
    while slot_of_key(f"{prefix}{i}", SLOTS) != slot:
        i += 1
    return f"{prefix}{i}"


async def wait_until(
    check: Callable[[], Awaitable[bool]],
    state: Callable[[], str] = lambda: "",
    timeout: float = 120.0,
) -> None:
    """Poll ``check`` until it holds; `RuntimeError` (with ``state()``) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:.0f} s {state()}")
        await asyncio.sleep(0.02)
