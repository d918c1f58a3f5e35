"""Shared fixtures: a real broker process on a free port.

`broker` starts ``python -m broker serve`` as a subprocess with its own data
directory, waits until /admin/v1/health answers, and always stops it. A
test can `kill()` it (SIGKILL) and `start()` it again on the same port and
data directory. On failure the broker's log is shown (captured teardown output).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from broker._connection import PROTOCOL_VERSION
from proto import txnbuf_pb2 as pb


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerProcess:
    """A `txnbuf serve` subprocess that tests may kill and restart."""

    def __init__(self, data_dir: Path, log_path: Path, port: int | None = None) -> None:
        self.data_dir = data_dir
        self.log_path = log_path
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}  # extra environment, e.g. TXNBUF_FAULT
        self.args: list[str] = []  # extra `txnbuf serve` arguments
        self.new_session = False  # its own process group (a terminal's Ctrl-C reaches all of it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 30.0) -> None:
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
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=self.new_session
        )
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with urllib.request.urlopen(self.url + "/admin/v1/health", timeout=1) as r:
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

    def admin(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.url + path, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerProcess]:
    proc = BrokerProcess(tmp_path / "data", tmp_path / "broker.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        # pytest shows captured teardown output only when the test failed.
        sys.stderr.write(f"----- broker log ({proc.log_path}) -----\n{proc.log()}\n")


class RawConnection:
    """A bare WebSocket speaking BaseCommand frames (the broker's protocol
    version), for protocol-level tests. The broker may answer several
    commands in one BATCH frame: `receive` hands out the commands one by
    one, `receive_frame` a frame as it came."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._unread: deque[Any] = deque()  # commands of a BATCH not handed out yet

    async def __aenter__(self) -> RawConnection:
        self._session = aiohttp.ClientSession()
        self.ws = await self._session.ws_connect(self.url + "/ws")
        connected = await self.request(
            pb.BaseCommand.CONNECT,
            "connect",
            pb.CommandConnect(protocol_version=PROTOCOL_VERSION),
        )
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
