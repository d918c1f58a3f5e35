"""A private PostgreSQL server: ``initdb`` in a folder and ``postgres`` on a
free port of 127.0.0.1 with ``fsync=on`` and ``synchronous_commit=on``,
until it stops. Debian's binaries (``/usr/lib/postgresql/N/bin``, off PATH)
or ``postgres`` on PATH. As root, the server runs as the ``postgres`` user
(it refuses to run as root), in a temporary folder of its own (a given
folder's parents may be closed to that user). Nothing of the machine's own
PostgreSQL service is used.

`PostgresCluster` is the data folder, `PostgresServer` runs it;
`LocalPostgres` is both, for ``txnbuf check --store postgresql``. The
benchmarks and the tests build on these (``bench/_postgres.py``: a hot
standby, promotion).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["LocalPostgres", "PostgresCluster", "PostgresServer", "postgres_bin"]

START_TIMEOUT = 60.0  # seconds a server may take to accept connections


def postgres_bin() -> str | None:
    """The folder of PostgreSQL's server programs (Debian keeps them off PATH),
    or None if there are none."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/postgres"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    if not found and (on_path := shutil.which("postgres")):
        found = [os.path.realpath(on_path)]
    if not found or not os.path.exists(os.path.join(os.path.dirname(found[-1]), "initdb")):
        return None
    return os.path.dirname(found[-1])


class PostgresCluster:
    """A PostgreSQL data folder (``data`` in ``dir``), made at once by
    `make`: ``initdb`` here. ``folder``: where, made if missing; without
    one, or as root, a temporary folder named ``prefix...``, which `remove`
    removes."""

    def __init__(self, prefix: str = "txnbuf-postgres-", *, folder: Path | None = None) -> None:
        bindir = postgres_bin()
        if bindir is None:
            raise RuntimeError(
                "no PostgreSQL server programs (initdb, postgres; Debian: apt-get install "
                "postgresql)"
            )
        self.bin = bindir
        self.user = "postgres" if os.geteuid() == 0 else None
        self.temporary = folder is None or self.user is not None
        if folder is not None and not self.temporary:
            folder.mkdir(parents=True, exist_ok=True)
            self.dir = str(folder)
        else:
            self.dir = tempfile.mkdtemp(prefix=prefix)
            if self.user:
                shutil.chown(self.dir, self.user)
        self.data = os.path.join(self.dir, "data")
        self.make()

    def make(self) -> None:
        """Fill `data`: a fresh cluster by ``initdb``."""
        self.run("initdb", "-D", self.data, "-U", "postgres", "--auth=trust", "--no-sync",
                 "-E", "UTF8")  # fmt: skip

    def run(self, program: str, *args: str) -> None:
        """Run one of PostgreSQL's programs on this folder (as its user)."""
        done = subprocess.run(
            [os.path.join(self.bin, program), *args],
            user=self.user, cwd=self.dir, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"{program} failed: {done.stderr.strip()[-2000:]}")

    def remove(self) -> None:
        """Remove the folder if it is a temporary one."""
        if self.temporary:
            shutil.rmtree(self.dir, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """The server of a `PostgresCluster`, started at once on a free port and
    waited for until it accepts connections; ``options`` are more ``-c
    name=value`` settings. Its log is ``postgres.log`` in the cluster's
    folder."""

    def __init__(self, cluster: PostgresCluster, options: Sequence[str] = ()) -> None:
        self.cluster = cluster
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.log = os.path.join(cluster.dir, "postgres.log")
        settings = ["fsync=on", "synchronous_commit=on", *options]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [os.path.join(cluster.bin, "postgres"), "-D", cluster.data, "-p", str(self.port),
                 "-k", cluster.dir, "-c", "listen_addresses=127.0.0.1",
                 *(arg for s in settings for arg in ("-c", s))],
                user=cluster.user, cwd=cluster.dir, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        probe = [os.path.join(cluster.bin, "pg_isready"), "-q", "-h", "127.0.0.1",
                 "-p", str(self.port)]  # fmt: skip
        while subprocess.run(probe).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = ""
                with contextlib.suppress(OSError), open(self.log, errors="replace") as f:
                    tail = f.read()[-3000:]
                raise RuntimeError(f"PostgreSQL did not start (log: {self.log}):\n{tail}")
            time.sleep(0.05)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

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
            self.kill()


class LocalPostgres:
    """``txnbuf check --store postgresql``'s own server: a fresh cluster in
    ``folder`` (as root, a temporary folder), started at once, until `stop`
    (which removes a temporary folder)."""

    def __init__(self, folder: Path) -> None:
        if postgres_bin() is None:
            raise SystemExit(
                "txnbuf check: --store postgresql needs PostgreSQL's server programs "
                "(initdb, postgres; Debian: apt-get install postgresql), or give a database "
                "with --store postgresql://..."
            )
        self.cluster = PostgresCluster("txnbuf-check-postgres-", folder=folder)
        try:
            self.server = PostgresServer(self.cluster, ["max_connections=200"])
        except BaseException:
            self.cluster.remove()
            raise

    @property
    def url(self) -> str:
        return self.server.url()

    def stop(self) -> None:
        self.server.stop()
        self.cluster.remove()
