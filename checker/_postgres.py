"""A PostgreSQL server of the check's own (``txnbuf check --store
postgresql``): ``initdb`` in the work dir and ``postgres`` on a free port of
127.0.0.1 with ``fsync=on``, until `LocalPostgres.stop`. Debian's binaries
(``/usr/lib/postgresql/N/bin``, off PATH) or ``postgres`` on PATH. As root,
the server runs as the ``postgres`` user (it refuses to run as root), in a
temporary folder of its own (the work dir's parents may be closed to that
user), removed when it stops."""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

__all__ = ["LocalPostgres"]

START_TIMEOUT = 60.0  # seconds the server may take to accept connections


def _bin() -> str:
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0,
    )
    if not found and (on_path := shutil.which("initdb")):
        found = [os.path.realpath(on_path)]
    if not found:
        raise SystemExit(
            "txnbuf check: --store postgresql needs PostgreSQL's server programs "
            "(initdb, postgres; Debian: apt-get install postgresql), or give a database "
            "with --store postgresql://..."
        )
    return os.path.dirname(found[-1])


class LocalPostgres:
    """A fresh PostgreSQL cluster in ``folder``, started at once."""

    def __init__(self, folder: Path) -> None:
        self.bin = _bin()
        self.user = "postgres" if os.geteuid() == 0 else None
        self._temporary = self.user is not None
        if self._temporary:
            folder = Path(tempfile.mkdtemp(prefix="txnbuf-check-postgres-"))
            shutil.chown(folder, "postgres")
        else:
            folder.mkdir(parents=True, exist_ok=True)
        self.dir = folder
        data = folder / "data"
        made = subprocess.run(
            [os.path.join(self.bin, "initdb"), "-D", str(data), "-U", "postgres",
             "--auth=trust", "--no-sync", "-E", "UTF8"],
            user=self.user, capture_output=True, text=True,
        )  # fmt: skip
        if made.returncode != 0:
            raise RuntimeError(f"initdb failed: {made.stderr.strip()[-2000:]}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.log = folder / "postgres.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [os.path.join(self.bin, "postgres"), "-D", str(data), "-p", str(self.port),
                 "-k", str(folder), "-c", "listen_addresses=127.0.0.1", "-c", "fsync=on",
                 "-c", "synchronous_commit=on", "-c", "max_connections=200"],
                user=self.user, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT
        probe = [os.path.join(self.bin, "pg_isready"), "-q", "-h", "127.0.0.1",
                 "-p", str(self.port)]  # fmt: skip
        while subprocess.run(probe).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"PostgreSQL did not start; see {self.log}")
            time.sleep(0.05)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then wait; SIGKILL if it does not go."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self._temporary:
            shutil.rmtree(self.dir, ignore_errors=True)
