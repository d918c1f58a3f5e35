"""``txnbuf check-data``: its passes in order, its repairs, its command line
(see `broker._checkdata`)."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

from broker._checkdata._coordinators import check_coordinator
from broker._checkdata._findings import Finding, Report
from broker._checkdata._partitions import check_dangling, check_partition
from broker._checkdata._state import TOPICS, Check, chunks
from broker._metrics import COUNTERS_LEDGER
from ledger import LedgerError, LedgerStore, ReadOnlyStore

__all__ = ["DB_NAME", "PROGRESS_EVERY", "add_check_data_parser", "check_data", "run_check_data"]

DB_NAME = "broker.db"
PROGRESS_EVERY = 1000  # ledgers between progress lines


async def run(check: Check) -> None:
    groups: dict[tuple[str, int], dict[str, list[str]]] = {}
    coordinators: list[tuple[int, str]] = []
    for name in check.names:
        parts = name.split("/")
        if name in (TOPICS, COUNTERS_LEDGER):
            continue
        if parts[0] == "tc" and len(parts) == 2 and parts[1].isdigit():
            coordinators.append((int(parts[1]), name))
            continue
        if parts[0] in ("p", "d", "x") and len(parts) == 3 and parts[2].isdigit():
            group = groups.setdefault((parts[1], int(parts[2])), {})
            group.setdefault(parts[0], []).append(name)
            continue
        if parts[0] in ("c", "u") and len(parts) == 4 and parts[2].isdigit():
            group = groups.setdefault((parts[1], int(parts[2])), {})
            group.setdefault(parts[0], []).append(name)
            continue
        check.find("unknown-ledger", [name], "not a ledger txnbuf writes")
        check.tick()
    await read_topics(check)
    for tcid, name in coordinators:
        await check_coordinator(check, tcid, name)
    partitions = topic_partitions(check)
    for key in sorted(set(groups) | set(partitions)):
        group = groups.get(key, {})
        if key in partitions:
            await check_partition(check, key[0], key[1], group)
        else:
            check_dangling(check, key[0], key[1], group)


async def read_topics(check: Check) -> None:
    log = check.store.get_ledger(TOPICS)
    if log is None:
        return
    check.tick()
    topics: dict[str, int] = {}
    try:
        async for entry in chunks(log):
            record = json.loads(entry.data)
            if record.get("deleted"):  # (its ledgers are dangling until deleted)
                topics.pop(str(record["topic"]), None)
            else:
                topics[str(record["topic"])] = int(record["partitions"])
    except (ValueError, KeyError, TypeError) as exc:
        check.topics = None
        check.find(
            "unreadable",
            [TOPICS],
            f"the topic list cannot be read ({exc}); no ledger is dropped while it is",
        )
        return
    check.topics = topics
    check.report.counts["topics"] = len(topics)


def topic_partitions(check: Check) -> set[tuple[str, int]]:
    return {(t, i) for t, n in (check.topics or {}).items() for i in range(n)}


async def _repair(store: LedgerStore, findings: list[Finding]) -> None:
    """Apply the repairs of ``findings`` (appends first, then drops)."""
    appends = []
    todo = [f for f in findings if f.repair is not None]
    for f in todo:
        r = f.repair
        assert r is not None
        if r.action == "append":
            ledger = store.get_ledger(r.ledger)
            assert ledger is not None
            appends.append(ledger.append(r.data, r.meta))
    await asyncio.gather(*appends)
    for f in todo:
        assert f.repair is not None
        if f.repair.action == "drop":
            await store.delete_ledger(f.repair.ledger)
        f.fixed = True


async def check_data(
    data_dir: str | Path,
    *,
    fix: bool = False,
    progress: Callable[[str], None] | None = None,
    progress_every: int = PROGRESS_EVERY,
) -> Report:
    """Check the data of a stopped broker in ``data_dir``; with ``fix``,
    repair what is safely repairable. Raises `LedgerError` if there is no
    broker data there or a broker has it open."""
    path = Path(data_dir) / DB_NAME
    if not path.is_file():
        raise LedgerError(f"no broker data in {data_dir} ({DB_NAME} not found)")
    report = Report(str(path), fix)
    if not fix:
        ro = ReadOnlyStore.open(path)
        try:
            check = Check(ro, report, progress, progress_every)
            report.ledgers = len(check.names)
            await run(check)
        finally:
            ro.close()
        return report
    ReadOnlyStore.open(path).close()  # (a ledger database, not in use: else nothing is written)
    store = await LedgerStore.open(path, lock_wait=0.0)
    try:
        check = Check(store, report, progress, progress_every)
        report.ledgers = len(check.names)
        await run(check)
        await _repair(store, report.findings)
    finally:
        await store.close()
    return report


def add_check_data_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser(
        "check-data",
        help="check a stopped broker's data for consistency (read-only unless --fix)",
        description="Cross-check the coordinators' decisions, the commit markers, the sidecar "
        "logs and the cursors of a stopped broker's data. Exit code 0: no problem "
        "(informational findings only), 1: problems, 2: usage error or data in use.",
    )
    p.add_argument("data_dir", metavar="DIR", help="the broker's data directory")
    p.add_argument("--fix", action="store_true", help="repair what is safely repairable")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument(
        "--progress-every",
        type=int,
        default=PROGRESS_EVERY,
        metavar="N",
        help=f"print a progress line to stderr every N ledgers ({PROGRESS_EVERY})",
    )


def run_check_data(args: argparse.Namespace) -> int:
    if args.progress_every < 1:
        print("txnbuf check-data: --progress-every must be at least 1", file=sys.stderr)
        return 2
    if not Path(args.data_dir).is_dir():
        print(f"txnbuf check-data: {args.data_dir} is not a directory", file=sys.stderr)
        return 2

    def progress(line: str) -> None:
        print(f"txnbuf check-data: {line}", file=sys.stderr, flush=True)

    try:
        report = asyncio.run(
            check_data(
                args.data_dir,
                fix=args.fix,
                progress=progress,
                progress_every=args.progress_every,
            )
        )
    except LedgerError as exc:
        print(f"txnbuf check-data: refused: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.text())
    return report.exit_code
