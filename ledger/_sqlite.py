"""The SQLite engine of a `LedgerStore`: one database file, written by a
writer process of the store's own (`ledger._writer`), read through an
aiosqlite connection of this process.

Every write goes to the writer process, fed through a pipe: the store
hands it what a turn of the event loop appended, and the writer commits
whatever reached it while its previous commit ran, together, as one SQLite
transaction (WAL, ``synchronous=FULL``: one fsync). It shares no
interpreter lock with the busy event loop (see `ledger._writer`). Requests
are pipelined: the store does not wait for one answer before it sends the
next, and the writer answers in order.

Reads that miss the in-memory tail cache go to an aiosqlite connection of
this process, used for nothing else (each read is one hop to its thread and
back); in WAL mode they never queue behind a commit.

Layout: table ``ledgers(id, name, first_entry_id, next_entry_id)`` and
table ``entries(id, meta, data)`` whose integer primary key is
``ledger_id << 40 | entry_id``: one B-tree, each ledger a contiguous key
range.

SQLite has no slots: a store on it is never fenced (one broker per file,
which the writer's lock file enforces).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import aiosqlite

from ledger import _writer
from ledger._base import EngineSink, Entry, LedgerError

__all__ = ["SqliteEngine"]

log = logging.getLogger(__name__)

_MAX_ENTRY_ID = _writer.MAX_ENTRY_ID
_key = _writer.key
STOP_WAIT = 10.0  # seconds a closing store waits for its writer process to exit
_T = TypeVar("_T")


async def _on_thread(conn: aiosqlite.Connection, fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(sqlite3_connection, *args)`` on the connection's own thread.

    aiosqlite has no public call for "run this function on your thread";
    `Connection._execute` is that call (checked against aiosqlite 0.20-0.22,
    pinned in pyproject.toml). This is the only place that uses it.
    """
    raw: sqlite3.Connection = conn._conn
    result: _T = await conn._execute(fn, raw, *args)  # type: ignore[no-untyped-call]
    return result


class _WriterProtocol(asyncio.SubprocessProtocol):
    """Reads the writer's answers as they come and hands each to the store."""

    def __init__(self) -> None:
        self.sink: EngineSink | None = None
        self.ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.exited: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        self._buffer += data
        for seq, error, result in _writer.take_frames(self._buffer):
            if seq == 0:
                if not self.ready.done():
                    if error is None:
                        self.ready.set_result(None)
                    else:
                        self.ready.set_exception(LedgerError(error))
            elif self.sink is not None:
                self.sink._answered(seq, error, result)

    def process_exited(self) -> None:
        if not self.ready.done():
            self.ready.set_exception(LedgerError("the writer process exited before it was ready"))
        if not self.exited.done():
            self.exited.set_result(None)
        if self.sink is not None:
            self.sink._engine_lost("the writer process exited")


async def _stop(transport: asyncio.SubprocessTransport, protocol: _WriterProtocol) -> None:
    """Close the writer's stdin (it exits once it has answered everything)
    and wait for it; kill it if it does not go."""
    stdin = transport.get_pipe_transport(0)
    if stdin is not None:
        stdin.close()
    try:
        await asyncio.wait_for(asyncio.shield(protocol.exited), STOP_WAIT)
    except TimeoutError:
        log.error("the ledger writer process did not exit; killing it")
        transport.kill()
        await protocol.exited
    transport.close()


def _read_catalog(raw: sqlite3.Connection, pack: Callable[[int, int, int], int]) -> dict[str, int]:
    """Every ledger's name -> its packed ids (``pack``), on the reader's
    thread: each with its greatest entry key, in one statement (one range
    seek per ledger), row by row (no list of every row at once: the start of
    a store of many ledgers leaves less memory behind)."""
    catalog: dict[str, int] = {}
    for ledger_id, name, first, nxt, max_key in raw.execute(
        "SELECT id, name, first_entry_id, next_entry_id, (SELECT max(e.id) FROM "
        "entries AS e WHERE e.id >= ledgers.id << ? AND e.id <= (ledgers.id << ?) + ?) "
        "FROM ledgers",
        (_writer.ENTRY_BITS, _writer.ENTRY_BITS, _MAX_ENTRY_ID),
    ):
        # next_entry_id is written by trims only (so that ids never repeat
        # once every entry is trimmed); otherwise the entries tell.
        nxt = max(nxt, first)
        if max_key is not None:
            nxt = max(nxt, (max_key & _MAX_ENTRY_ID) + 1)
        catalog[name] = pack(ledger_id, first, nxt)
    return catalog


class SqliteEngine:
    """A SQLite database file and its writer process (see the module docstring)."""

    fences = False  # (no slots: `LedgerStore` computes none for its writes)

    def __init__(
        self,
        path: Path,
        transport: asyncio.SubprocessTransport,
        protocol: _WriterProtocol,
        reader: aiosqlite.Connection,
    ) -> None:
        self.path = path
        self.location = str(path)
        self._transport = transport
        self._protocol = protocol
        # (opened with stdin=PIPE; uvloop's pipe transports are not WriteTransport subclasses)
        self._stdin = cast(asyncio.WriteTransport, transport.get_pipe_transport(0))
        self._reader = reader

    @classmethod
    async def open(cls, path: Path, lock_wait: float) -> SqliteEngine:
        """Start the writer process on ``path`` (it creates the schema) and
        open the reader; `LedgerError` if the writer cannot start, for
        instance when another process's writer still holds this database
        after ``lock_wait`` seconds."""
        path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        transport, protocol = await loop.subprocess_exec(
            _WriterProtocol,
            sys.executable,
            _writer.__file__,
            str(path),
            str(os.getpid()),
            str(lock_wait),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None,
        )
        reader: aiosqlite.Connection | None = None
        try:
            await protocol.ready
            reader = await aiosqlite.connect(path, isolation_level=None)
        except BaseException:
            if reader is not None:
                await reader.close()
            await _stop(transport, protocol)
            raise
        return cls(path, transport, protocol, reader)

    def attach(self, sink: EngineSink) -> None:
        self._protocol.sink = sink

    async def load_catalog(self, pack: Callable[[int, int, int], int]) -> dict[str, int]:
        return await _on_thread(self._reader, _read_catalog, pack)

    def submit(self, seq: int, request: tuple[Any, ...]) -> None:
        self._stdin.write(_writer.frame((seq, *request)))

    async def close(self) -> None:
        """Stop the writer (it answers what it has first) and the reader."""
        await _stop(self._transport, self._protocol)
        await self._reader.close()

    async def abandon(self) -> None:
        """Kill the writer and close the reader, answering nothing more (a
        test's cleanup after a close that hung)."""
        self._transport.kill()
        await self._reader.close()

    # -- reads --------------------------------------------------------------

    async def read(self, ledger_id: int, start: int, end: int) -> list[Entry]:
        def read(raw: sqlite3.Connection) -> list[Entry]:
            cur = raw.execute(
                "SELECT id, meta, data FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger_id, start), _key(ledger_id, end)),
            )
            return [Entry(k & _MAX_ENTRY_ID, m, d) for k, m, d in cur]

        return await _on_thread(self._reader, read)

    async def read_meta(self, ledger_id: int) -> list[tuple[int, int]]:
        def read(raw: sqlite3.Connection) -> list[tuple[int, int]]:
            cur = raw.execute(
                "SELECT id, meta FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger_id, 0), _key(ledger_id, _MAX_ENTRY_ID)),
            )
            return [(k & _MAX_ENTRY_ID, m) for k, m in cur]

        return await _on_thread(self._reader, read)

    async def read_sizes(self, ledger_id: int) -> list[tuple[int, int]]:
        def read(raw: sqlite3.Connection) -> list[tuple[int, int]]:
            cur = raw.execute(
                "SELECT id, length(data) FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
                (_key(ledger_id, 0), _key(ledger_id, _MAX_ENTRY_ID)),
            )
            return [(k & _MAX_ENTRY_ID, n) for k, n in cur]

        return await _on_thread(self._reader, read)
