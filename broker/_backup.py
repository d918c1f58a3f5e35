"""``txnbuf backup DATA_DIR DEST``: a consistent copy of a broker's data,
taken while the broker runs, then checked.

The copy is SQLite's online backup (``sqlite3.Connection.backup``, all pages
in one step) of ``DATA_DIR/broker.db``, read through a connection of its own
in read-only mode. The database is in WAL mode, so that connection reads
one snapshot, the state after some group commit, while the broker goes on
writing; the broker never waits for it. A copy is therefore what a SIGKILL
at that instant would have left on disk, and a broker started on it
recovers from it as from such a crash (transactions decided and not yet
told to their participants are finished; open ones run to their timeout).
``acl.json`` is copied beside it (it is replaced whole by the broker, never
written in place). The copy and its folder are fsynced before the command
ends.

Then ``txnbuf check-data`` runs on the copy (``--no-check``: not), and its
report and exit code are the command's: 0 when the copy is consistent, 1
when the check found problems (the copy is kept, to look at), 2 when
nothing could be copied. It works the same on a stopped broker's data.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

from broker._checkdata import check_data
from ledger import LedgerError

__all__ = ["add_backup_parser", "backup", "run_backup"]

DATABASE = "broker.db"
ACL_FILE = "acl.json"


class BackupError(Exception):
    """Why nothing was copied (one line)."""


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup(data_dir: str | Path, dest: str | Path) -> int:
    """Copy ``data_dir``'s database (and ACL file) into the new folder
    ``dest``; returns the bytes of the copied database. `BackupError` if
    there is nothing to copy or ``dest`` is not new (or empty)."""
    data_dir, dest = Path(data_dir), Path(dest)
    source = data_dir / DATABASE
    if not source.is_file():
        raise BackupError(f"no {DATABASE} in {data_dir}: not a broker's data directory")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise BackupError(f"{dest} exists and is not an empty folder")
    dest.mkdir(parents=True, exist_ok=True)
    partial = dest / (DATABASE + ".partial")
    try:
        src = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
        try:
            out = sqlite3.connect(partial)
            try:
                src.backup(out)  # (pages=-1: every page in one step, one snapshot)
            finally:
                out.close()
        finally:
            src.close()
    except sqlite3.Error as exc:
        partial.unlink(missing_ok=True)
        raise BackupError(f"cannot copy {source}: {exc}") from None
    _fsync(partial)
    partial.rename(dest / DATABASE)
    acl = data_dir / ACL_FILE
    if acl.is_file():
        shutil.copyfile(acl, dest / ACL_FILE)
        _fsync(dest / ACL_FILE)
    _fsync(dest)
    return (dest / DATABASE).stat().st_size


def add_backup_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "backup", help="copy a broker's data while it runs (SQLite's online backup), then check it"
    )
    p.add_argument("data_dir", metavar="DATA_DIR", help="the broker's --data-dir")
    p.add_argument("dest", metavar="DEST", help="a new (or empty) folder for the copy")
    p.add_argument(
        "--no-check", action="store_true", help="do not run check-data on the copy afterwards"
    )


def run_backup(args: argparse.Namespace) -> int:
    started = time.monotonic()
    try:
        size = backup(args.data_dir, args.dest)
    except (BackupError, OSError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"txnbuf backup: {why}", file=sys.stderr)
        return 2
    print(
        f"txnbuf backup: copied {args.data_dir} to {args.dest} "
        f"({size:,} bytes in {time.monotonic() - started:.1f}s)",
        file=sys.stderr,
    )
    if args.no_check:
        return 0
    try:
        report = asyncio.run(check_data(args.dest))
    except LedgerError as exc:
        print(f"txnbuf backup: the copy cannot be checked: {exc}", file=sys.stderr)
        return 1
    print(report.text())
    return report.exit_code
