"""A private PostgreSQL server in a temporary folder, for the benchmarks and
the tests (Debian's binaries: ``/usr/lib/postgresql/N/bin``, off PATH).

`PostgresCluster` is a data folder made once by ``initdb`` (as the
``postgres`` user when we are root: the server refuses to run as root);
`PostgresServer` runs it on a free port of 127.0.0.1 with ``fsync=on`` and
``synchronous_commit=on`` until `PostgresServer.stop`. Nothing of the
machine's own PostgreSQL service is used.

High availability: `PostgresCluster.standby_of` makes a data folder with
``pg_basebackup -R -X stream`` from a running server (a hot standby that
streams from it, named ``application_name`` in its ``primary_conninfo``);
the primary acknowledges a commit only once that standby has flushed it
when it runs with ``synchronous_standby_names`` naming it
(`synchronous_primary`). `PostgresServer.promote` turns a standby into a
primary (``pg_ctl promote``).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

__all__ = ["PostgresCluster", "PostgresServer", "postgres_bin", "synchronous_primary"]

START_TIMEOUT = 60.0  # s a server may take to accept connections


def postgres_bin() -> str | None:
    """The folder of PostgreSQL's server programs (Debian keeps them off PATH)."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    if not found and (on_path := shutil.which("postgres")):
        found = [os.path.realpath(on_path)]
    if not found or not os.path.exists(os.path.join(os.path.dirname(found[-1]), "initdb")):
        return None
    return os.path.dirname(found[-1])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresCluster:
    """A PostgreSQL data folder made by ``initdb`` in a temporary folder (as the
    ``postgres`` user when we are root: the server refuses to run as root)."""

    def __init__(self, prefix: str = "txnbuf-postgres-", *, primary: PostgresServer | None = None,
                 application_name: str = "standby") -> None:  # fmt: skip
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError("no postgres binary (bench/install-peers installs it)")
        self.bin = bindir
        self.user = "postgres" if os.geteuid() == 0 else None
        self.dir = tempfile.mkdtemp(prefix=prefix)
        if self.user:
            shutil.chown(self.dir, self.user)
        self.data = os.path.join(self.dir, "data")
        if primary is None:
            command = [os.path.join(bindir, "initdb"), "-D", self.data, "-U", "postgres",
                       "--auth=trust", "--no-sync", "-E", "UTF8"]  # fmt: skip
        else:  # (-R: standby.signal, and primary_conninfo with the connection's settings)
            conninfo = (f"host=127.0.0.1 port={primary.port} user=postgres "
                        f"application_name={application_name}")  # fmt: skip
            command = [os.path.join(bindir, "pg_basebackup"), "-D", self.data, "-d", conninfo,
                       "-R", "-X", "stream", "-c", "fast", "--no-sync"]  # fmt: skip
        subprocess.run(command, user=self.user, cwd=self.dir, check=True, capture_output=True)
        self.version = subprocess.run(
            [os.path.join(bindir, "postgres"), "--version"], capture_output=True, text=True
        ).stdout.split()[2]  # (postgres (PostgreSQL) 15.18 ...)

    @classmethod
    def standby_of(cls, primary: PostgresServer, application_name: str) -> PostgresCluster:
        """A hot standby's data folder, copied from the running ``primary``
        by ``pg_basebackup -R -X stream``; started as a `PostgresServer`, it
        streams from ``primary`` as ``application_name``."""
        return cls("txnbuf-standby-", primary=primary, application_name=application_name)

    def remove(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def synchronous_primary(*standbys: str) -> list[str]:
    """`PostgresServer` options of a primary that acknowledges a commit
    only once the first of ``standbys`` (application names) that is
    connected has flushed it (``synchronous_commit=on``)."""
    return [f"synchronous_standby_names=FIRST 1 ({', '.join(standbys)})"]


class PostgresServer:
    """The server of a `PostgresCluster`, started at once on a free port;
    ``options`` are more ``-c name=value`` settings."""

    def __init__(self, cluster: PostgresCluster, options: Sequence[str] = ()) -> None:
        self.cluster = cluster
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = os.path.join(cluster.dir, "log")
        settings = ["fsync=on", "synchronous_commit=on", *options]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [os.path.join(cluster.bin, "postgres"), "-D", cluster.data, "-p", str(self.port),
                 "-k", cluster.dir, "-c", "listen_addresses=127.0.0.1",
                 *(arg for s in settings for arg in ("-c", s))],
                user=cluster.user, cwd=cluster.dir, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self._wait_ready()

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _ready(self) -> bool:
        probe = [os.path.join(self.cluster.bin, "pg_isready"), "-q", "-h", "127.0.0.1",
                 "-p", str(self.port)]  # fmt: skip
        return subprocess.run(probe).returncode == 0

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self._ready():
                return
            time.sleep(0.05)
        self.stop()
        with contextlib.suppress(OSError), open(self.log, errors="replace") as f:
            sys.stderr.write(f.read()[-5000:])
        raise RuntimeError(f"PostgreSQL did not start (log: {self.log})")

    def promote(self, timeout: float = START_TIMEOUT) -> None:
        """``pg_ctl promote``: a standby ends recovery and becomes a primary
        (waits until it accepts writes)."""
        subprocess.run(
            [os.path.join(self.cluster.bin, "pg_ctl"), "promote", "-D", self.cluster.data,
             "-w", "-t", str(int(timeout))],
            user=self.cluster.user, cwd=self.cluster.dir, check=True, capture_output=True,
        )  # fmt: skip

    def kill(self) -> None:
        """SIGKILL the postmaster (its backends end when they see it gone)."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then wait; SIGKILL if it does not go."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
