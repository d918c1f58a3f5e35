"""A ledger database opened for reading only, for tools that inspect a
stopped broker's data (``txnbuf check-data``).

`ReadOnlyStore` opens the database with SQLite's ``mode=ro``: nothing it does
changes the database or its write-ahead log, not even a checkpoint. (To read
a WAL database SQLite still creates the ``-wal`` and ``-shm`` files beside it
if they are missing, and rebuilds the ``-shm`` index of the log after a
crash, as any reader does.) It holds a
shared lock on the lock file that a `LedgerStore`'s writer holds
exclusively while the store is open (`ledger._writer.lock`), so it refuses a database a
broker has open, and a broker that starts meanwhile waits for it to close
(up to its own ``lock_wait``, then fails to start). With no lock file, no
writer ever ran on the database, and there is nothing to lock against.

Its ledgers answer the reads of `Ledger` (``read``, ``read_meta``,
``first_entry_id``, ``last_entry_id``) with the same layout and the same
first and last entry ids as `LedgerStore.open` computes; they cannot be
written.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
from pathlib import Path

from ledger import _writer
from ledger._base import Entry, LedgerError

__all__ = ["ReadOnlyLedger", "ReadOnlyStore"]

_MAX_ENTRY_ID = _writer.MAX_ENTRY_ID
_key = _writer.key


class ReadOnlyLedger:
    """One ledger of a `ReadOnlyStore`: the reads of `Ledger`, no writes."""

    def __init__(self, store: ReadOnlyStore, ledger_id: int, name: str, first: int, nxt: int):
        self.store = store
        self.id = ledger_id
        self.name = name
        self.first_entry_id = first
        self.last_entry_id = nxt - 1

    def __repr__(self) -> str:
        return (
            f"ReadOnlyLedger({self.name!r}, first={self.first_entry_id}, last={self.last_entry_id})"
        )

    @property
    def entry_count(self) -> int:
        return self.last_entry_id - self.first_entry_id + 1

    async def read(self, start: int, end: int) -> list[Entry]:
        """Entries with ``start <= entry_id <= end`` that exist."""
        start = max(start, self.first_entry_id)
        end = min(end, self.last_entry_id)
        if start > end:
            return []
        cur = self.store._conn.execute(
            "SELECT id, meta, data FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
            (_key(self.id, start), _key(self.id, end)),
        )
        return [Entry(k & _MAX_ENTRY_ID, m, d) for k, m, d in cur]

    async def read_meta(self) -> list[tuple[int, int]]:
        """``(entry_id, meta)`` of every entry, without reading the data."""
        cur = self.store._conn.execute(
            "SELECT id, meta FROM entries WHERE id >= ? AND id <= ? ORDER BY id",
            (_key(self.id, 0), _key(self.id, _MAX_ENTRY_ID)),
        )
        return [(k & _MAX_ENTRY_ID, m) for k, m in cur]


class ReadOnlyStore:
    """A ledger database opened read-only; create with `ReadOnlyStore.open`."""

    def __init__(self, path: Path, conn: sqlite3.Connection, lock_fd: int | None) -> None:
        self.path = path
        self._conn = conn
        self._lock_fd = lock_fd
        self._ledgers: dict[str, ReadOnlyLedger] = {}

    @classmethod
    def open(cls, path: str | Path) -> ReadOnlyStore:
        """Open the database at ``path`` for reading; raises `LedgerError` if
        it does not exist, is not a ledger database, or a writer (a running
        broker) has it open."""
        path = Path(path)
        if not path.is_file():
            raise LedgerError(f"{path} does not exist")
        lock_fd = _shared_lock(str(path))
        try:
            conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
            try:
                (version,) = conn.execute("PRAGMA user_version").fetchone()
                try:
                    _writer.check_format(version, str(path))
                except _writer.FormatError as exc:
                    raise LedgerError(str(exc)) from None
                rows = conn.execute(
                    "SELECT id, name, first_entry_id, next_entry_id FROM ledgers"
                ).fetchall()
                store = cls(path, conn, lock_fd)
                for ledger_id, name, first, nxt in rows:
                    # As `LedgerStore.open`: next_entry_id is written by trims
                    # only, otherwise the entries tell.
                    (max_key,) = conn.execute(
                        "SELECT max(id) FROM entries WHERE id >= ? AND id <= ?",
                        (_key(ledger_id, 0), _key(ledger_id, _MAX_ENTRY_ID)),
                    ).fetchone()
                    nxt = max(nxt, first)
                    if max_key is not None:
                        nxt = max(nxt, (max_key & _MAX_ENTRY_ID) + 1)
                    store._ledgers[name] = ReadOnlyLedger(store, ledger_id, name, first, nxt)
            except BaseException:
                conn.close()
                raise
        except sqlite3.Error as exc:
            if lock_fd is not None:
                os.close(lock_fd)
            raise LedgerError(f"{path} is not a readable ledger database: {exc}") from exc
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        return store

    def close(self) -> None:
        self._conn.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # (releases the shared lock)
            self._lock_fd = None

    def ledger_names(self, prefix: str = "") -> list[str]:
        return sorted(n for n in self._ledgers if n.startswith(prefix))

    def get_ledger(self, name: str) -> ReadOnlyLedger | None:
        return self._ledgers.get(name)


def _shared_lock(path: str) -> int | None:
    """A shared lock on the writer's lock file (None if there is none);
    `LedgerError` if a writer holds it."""
    try:
        fd = os.open(_writer.lock_path(path), os.O_RDONLY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LedgerError(f"cannot open the lock file of {path}: {exc}") from exc
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise LedgerError(
            f"{path} is in use: a broker (its ledger writer) holds {_writer.lock_path(path)}; "
            "stop the broker first"
        ) from None
    return fd
