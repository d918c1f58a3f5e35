"""A private PostgreSQL server in a temporary folder, for the benchmarks and
the tests: `checker._postgres`'s (``txnbuf check``'s own server), with what
only they need.

`PostgresCluster` is a data folder made once by ``initdb`` in a temporary
folder, with its server's ``version``; `PostgresServer` runs it on a free
port of 127.0.0.1 with ``fsync=on`` and ``synchronous_commit=on`` until
`PostgresServer.stop`. Nothing of the machine's own PostgreSQL service is
used.

High availability: `PostgresCluster.standby_of` makes a data folder with
``pg_basebackup -R -X stream`` from a running server (a hot standby that
streams from it, named ``application_name`` in its ``primary_conninfo``);
the primary acknowledges a commit only once that standby has flushed it
when it runs with ``synchronous_standby_names`` naming it
(`synchronous_primary`). `PostgresServer.promote` turns a standby into a
primary (``pg_ctl promote``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cached_property
from os import path

from checker import _postgres
from checker._postgres import START_TIMEOUT, postgres_bin

__all__ = [
    "PostgresCluster",
    "PostgresServer",
    "postgres_bin",
    "private_postgres",
    "synchronous_primary",
]


class PostgresCluster(_postgres.PostgresCluster):
    """A PostgreSQL data folder in a temporary folder: made by ``initdb``,
    or, given a ``primary``, copied from it (`standby_of`)."""

    def __init__(self, prefix: str = "txnbuf-postgres-", *, primary: PostgresServer | None = None,
                 application_name: str = "standby") -> None:  # fmt: skip
        self._primary = primary
        self._application_name = application_name
        super().__init__(prefix)

    def make(self) -> None:
        if self._primary is None:
            super().make()
            return
        # (-R: standby.signal, and primary_conninfo with the connection's settings)
        conninfo = (f"host=127.0.0.1 port={self._primary.port} user=postgres "
                    f"application_name={self._application_name}")  # fmt: skip
        self.run("pg_basebackup", "-D", self.data, "-d", conninfo, "-R", "-X", "stream",
                 "-c", "fast", "--no-sync")  # fmt: skip

    @classmethod
    def standby_of(cls, primary: PostgresServer, application_name: str) -> PostgresCluster:
        """A hot standby's data folder, copied from the running ``primary``
        by ``pg_basebackup -R -X stream``; started as a `PostgresServer`, it
        streams from ``primary`` as ``application_name``."""
        return cls("txnbuf-standby-", primary=primary, application_name=application_name)

    @cached_property
    def version(self) -> str:
        """The server's version, e.g. ``15.18``."""
        return subprocess.run(
            [path.join(self.bin, "postgres"), "--version"], capture_output=True, text=True
        ).stdout.split()[2]  # (postgres (PostgreSQL) 15.18 ...)


def synchronous_primary(*standbys: str) -> list[str]:
    """`PostgresServer` options of a primary that acknowledges a commit
    only once the first of ``standbys`` (application names) that is
    connected has flushed it (``synchronous_commit=on``)."""
    return [f"synchronous_standby_names=FIRST 1 ({', '.join(standbys)})"]


class PostgresServer(_postgres.PostgresServer):
    """The server of a `PostgresCluster`, started at once on a free port;
    ``options`` are more ``-c name=value`` settings."""

    def promote(self, timeout: float = START_TIMEOUT) -> None:
        """``pg_ctl promote``: a standby ends recovery and becomes a primary
        (waits until it accepts writes)."""
        self.cluster.run("pg_ctl", "promote", "-D", self.cluster.data, "-w", "-t",
                         str(int(timeout)))  # fmt: skip


@contextmanager
def private_postgres(
    prefix: str = "txnbuf-postgres-", options: Sequence[str] = ()
) -> Iterator[PostgresServer]:
    """A fresh `PostgresCluster` and its server (``options``: more ``-c
    name=value`` settings), for a ``with``; stopped and removed on leaving
    it (``server.cluster.version``: its version)."""
    cluster = PostgresCluster(prefix)
    try:
        server = PostgresServer(cluster, options)
        try:
            yield server
        finally:
            server.stop()
    finally:
        cluster.remove()
