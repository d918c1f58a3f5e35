"""Shared fixtures: a real broker process on a free port.

`broker` starts ``python -m broker serve`` as a subprocess with its own data
directory, waits until /admin/v1/health answers, and always stops it. A
test can `kill()` it (SIGKILL) and `start()` it again on the same port and
data directory. On failure the broker's log is shown (captured teardown output).

`postgres` is one private PostgreSQL server for the whole session
(`bench._postgres`: ``initdb`` in a temporary folder, Debian's binaries);
`pg_url` a fresh database on it for one test, dropped after it.

`until` waits for a condition: a test waits for the condition it means,
never for a length of time (a busy machine stretches any length).

A test (or module) marked ``auth`` gets a broker that authenticates: a
secret key beside its data directory, and a superuser's token in
``TXNBUF_TOKEN`` (which `client.Client` reads) and in `BrokerProcess.token`
(which `BrokerProcess.admin` sends).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bench._postgres import PostgresServer, private_postgres
from broker._auth import create_secret_key, create_token, load_signing_key
from broker._connection import PROTOCOL_VERSION
from ledger import faults
from proto import txnbuf_pb2 as pb

# Markers of whole modules, for the contributor's quicker loop (README:
# ``pytest -m "not slow"``); CI runs every test. `spark`, `browser` and
# `kafka` tests are also `slow`. A test may mark itself as well.
MODULE_MARKS: dict[str, tuple[str, ...]] = {
    "test_spark": ("spark",),
    "test_spark_cluster": ("spark",),
    "test_spark_crash": ("spark",),
    "test_spark_on_cluster": ("spark",),
    "test_admin_page": ("browser",),
    "test_kafka": ("kafka",),
}
SLOW_MODULES = {  # each takes a minute or more of the suite's time
    "test_jepsen",
    "test_copy",
    "test_bench",
    "test_loadtest",
    "test_txn_crash",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if item.module else ""
        for name in MODULE_MARKS.get(module, ()):
            item.add_marker(name)
        if module in SLOW_MODULES or any(
            item.get_closest_marker(m) for m in ("spark", "browser", "kafka")
        ):
            item.add_marker("slow")
    # Files with slow tests first (a stable sort: each file's tests stay
    # together and in their order), so that the workers (pyproject's -n, a
    # file each) do not end on one long file.
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)


async def until(condition: Callable[[], object], what: str = "", timeout: float = 60.0) -> None:
    """Return once ``condition()`` (or what it returns, awaited) is true,
    asked every 20 ms; fail after ``timeout`` seconds, saying ``what`` was
    awaited. The timeout only bounds a hang: the wait ends as soon as the
    condition holds."""
    deadline = time.monotonic() + timeout
    while True:
        held = condition()
        if inspect.isawaitable(held):
            held = await held
        if held:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or condition}")
        await asyncio.sleep(0.02)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortTaken(Exception):
    """The port chosen for a broker was taken before it could bind it."""


class BrokerProcess:
    """A `txnbuf serve` subprocess that tests may kill and restart."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        port: int | None = None,
        auth: bool = False,
        store: str | None = None,
    ) -> None:
        self.data_dir = data_dir
        self.store = store  # a PostgreSQL URL: `--store` (None: SQLite in data_dir)
        self.log_path = log_path
        self.port = port or free_port()
        # A port `free_port` chose may be taken by another process before the
        # broker binds it (a shared machine): the first start then takes
        # another. Once started, a broker keeps its port (restarts use it).
        self._port_movable = port is None
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}  # extra environment, e.g. TXNBUF_FAULT
        self.args: list[str] = []  # extra `txnbuf serve` arguments
        self.new_session = False  # its own process group (a terminal's Ctrl-C reaches all of it)
        self.secret_key_file: Path | None = None  # set: the broker authenticates
        self.token: str | None = None  # a superuser's, sent by `admin`
        self.tls: tuple[Path, Path, Path] | None = None  # (cert, key, CA): serve https
        self.stream_port: int | None = None  # set: serve the stream listener there too
        if auth:
            self.enable_auth()

    def enable_auth(self) -> None:
        """Authenticate tokens signed with a secret key kept beside the data
        directory; `token` becomes a superuser's (role ``admin``)."""
        key_file = self.data_dir.parent / f"{self.data_dir.name}-secret.key"
        if not key_file.exists():
            key_file.write_text(create_secret_key())
        self.secret_key_file = key_file
        self.token = self.make_token("admin")

    def make_token(self, role: str, expires_in: float | None = None) -> str:
        """A token for ``role`` signed with this broker's secret key."""
        assert self.secret_key_file is not None, "enable_auth() first"
        key, algorithm = load_signing_key(self.secret_key_file)
        return create_token(role, key, algorithm, expires_in)

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def stream_url(self) -> str:
        """The stream listener's URL (``txnbuf://``, ``txnbufs://`` with TLS)."""
        assert self.stream_port is not None, "set stream_port before start()"
        scheme = "txnbufs" if self.tls is not None else "txnbuf"
        return f"{scheme}://127.0.0.1:{self.stream_port}"

    def _ssl_context(self) -> ssl.SSLContext | None:
        return None if self.tls is None else ssl.create_default_context(cafile=self.tls[2])

    def start(self, timeout: float = 30.0) -> None:
        for _ in range(3 if self._port_movable else 1):
            try:
                self._start(timeout)
                break
            except PortTaken:
                self.port = free_port()
        else:
            raise RuntimeError(f"no free port for the broker:\n{self.log()}")
        self._port_movable = False

    def _start(self, timeout: float) -> None:
        assert self.proc is None or self.proc.poll() is not None, "broker already running"
        log = open(self.log_path, "ab")
        env = {**os.environ, **self.env, "PYTHONUNBUFFERED": "1"}
        cmd = [
            sys.executable,
            "-m",
            "broker",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--port",
            str(self.port),
            "--log-level",
            "INFO",
            *self.args,
        ]
        if self.store is not None:
            cmd += ["--store", self.store]
        if self.secret_key_file is not None:
            cmd += ["--auth-secret-key-file", str(self.secret_key_file)]
        if self.tls is not None:
            cmd += ["--tls-cert", str(self.tls[0]), "--tls-key", str(self.tls[1])]
        if self.stream_port is not None:
            cmd += ["--stream-port", str(self.stream_port)]
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=self.new_session
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                if self._port_movable and f"cannot listen on 127.0.0.1:{self.port}: in use" in (
                    self.log()
                ):
                    raise PortTaken(self.port)
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                health = self.url + "/admin/v1/health"
                with urllib.request.urlopen(health, timeout=1, context=self._ssl_context()) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker did not answer within {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        """SIGKILL: no clean shutdown, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def restart(self) -> None:
        self.kill()
        self.start()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""

    def admin(
        self, method: str, path: str, body: bytes | None = None, token: str | None = None
    ) -> tuple[int, bytes]:
        """An admin API request with ``token`` (default: `token`, if any)."""
        token = token if token is not None else self.token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10, context=self._ssl_context()) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


STORES = ["sqlite", "postgresql"]
# A test (or a module's ``pytestmark``) with this runs once per store: its
# `broker` keeps its data in SQLite, then in a fresh PostgreSQL database.
both_stores = pytest.mark.parametrize("broker", STORES, indirect=True)


@pytest.fixture
def broker(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[BrokerProcess]:
    """A running broker; on SQLite unless parametrized (`both_stores`)."""
    auth = request.node.get_closest_marker("auth") is not None
    kind = getattr(request, "param", "sqlite")
    store = request.getfixturevalue("pg_url") if kind == "postgresql" else None
    proc = BrokerProcess(tmp_path / "data", tmp_path / "broker.log", auth=auth, store=store)
    if proc.token is not None:
        monkeypatch.setenv("TXNBUF_TOKEN", proc.token)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        # pytest shows captured teardown output only when the test failed.
        sys.stderr.write(f"----- broker log ({proc.log_path}) -----\n{proc.log()}\n")


@pytest.fixture
def logs() -> Iterator[list[BrokerProcess]]:
    """The brokers a test starts itself (a cluster's: tests/_cluster.py);
    at its end each is woken if paused, killed, and its log shown."""
    procs: list[BrokerProcess] = []
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGCONT)
            proc.kill()
            print(f"----- {proc.log_path} -----\n{proc.log()}")


class RawConnection:
    """A bare WebSocket speaking BaseCommand frames (the broker's protocol
    version), for protocol-level tests. The broker may answer several
    commands in one BATCH frame: `receive` hands out the commands one by
    one, `receive_frame` a frame as it came."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url = url
        self.token = token if token is not None else os.environ.get("TXNBUF_TOKEN", "")
        self._unread: deque[Any] = deque()  # commands of a BATCH not handed out yet

    async def __aenter__(self) -> RawConnection:
        self._session = aiohttp.ClientSession()
        self.ws = await self._session.ws_connect(self.url + "/ws")
        hello = pb.CommandConnect(protocol_version=PROTOCOL_VERSION)
        if self.token:
            hello.auth_method = "token"
            hello.auth_data = self.token.encode()
        connected = await self.request(pb.BaseCommand.CONNECT, "connect", hello)
        assert connected.type == pb.BaseCommand.CONNECTED
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.ws.close()
        await self._session.close()

    async def send_raw(self, data: bytes) -> None:
        await self.ws.send_bytes(data)

    async def send(self, kind: int, field: str, body: object) -> None:
        cmd = pb.BaseCommand(type=kind)  # type: ignore[arg-type]
        getattr(cmd, field).CopyFrom(body)
        await self.ws.send_bytes(cmd.SerializeToString())

    async def receive_frame(self, timeout: float = 10.0) -> Any:
        """The next WebSocket message, a BaseCommand (maybe a BATCH)."""
        assert not self._unread, "commands of a BATCH are still to be received"
        msg = await self.ws.receive(timeout=timeout)
        return pb.BaseCommand.FromString(msg.data)

    async def receive(self, timeout: float = 10.0) -> Any:
        """The next command, out of a BATCH frame if one came."""
        if not self._unread:
            frame = await self.receive_frame(timeout)
            self._unread.extend(unbatch(frame))
        return self._unread.popleft()

    async def request(self, kind: int, field: str, body: object) -> Any:
        await self.send(kind, field, body)
        return await self.receive()


def unbatch(frame: Any) -> list[Any]:
    """The commands of one frame: those of a BATCH, else the frame itself."""
    return list(frame.batch.commands) if frame.type == pb.BaseCommand.BATCH else [frame]


def send_command(*messages: Any, **fields: Any) -> Any:
    """A CommandSend with ``fields``, carrying ``messages`` (SingleMessage)
    as its batch, as a client sends them."""
    return pb.CommandSend(batch=pb.EntryBatch(messages=messages).SerializeToString(), **fields)


@pytest.fixture(autouse=True, scope="session")
def _bench_results_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Benchmarks run small by the tests record their figures in a temporary
    folder, not in bench/results (bench/_results.py)."""
    os.environ["TXNBUF_BENCH_RESULTS"] = str(tmp_path_factory.mktemp("bench-results"))


class Crash(Exception):
    """Raised by a patched `faults.hit` (the `crash_at` fixture): the process
    'dies' here."""


@pytest.fixture
def crash_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Steps listed in the yielded list raise `Crash` when hit."""
    armed: list[str] = []
    real = faults.hit

    def hit(step: str) -> None:
        if step in armed:
            armed.remove(step)
            raise Crash(step)
        real(step)

    monkeypatch.setattr(faults, "hit", hit)
    yield armed


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the session (its databases: `pg_url`)."""
    with private_postgres(options=["max_connections=300"]) as server:
        yield server


_databases = itertools.count()


async def _admin_sql(url: str, *statements: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
    finally:
        await conn.close()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    """The URL of a fresh database on the session's server, dropped after the test."""
    name = f"t{os.getpid()}_{next(_databases)}"
    asyncio.run(_admin_sql(postgres.url(), f"CREATE DATABASE {name}"))
    try:
        yield postgres.url(name)
    finally:
        asyncio.run(_admin_sql(postgres.url(), f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
