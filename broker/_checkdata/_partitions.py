"""check-data's pass over each partition: its commit markers against its
sidecar transaction log, both against the coordinators' decisions; then its
cursors (`broker._checkdata._cursors`); and the ledgers of partitions that
do not exist."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from broker._checkdata._cursors import check_cursor
from broker._checkdata._findings import Repair
from broker._checkdata._state import (
    CHUNK,
    Check,
    chunks,
    entry_counts,
    ids_text,
    no_entries,
    txn_name,
)
from buffer import (
    COMMIT_MARKER,
    CommitMarker,
    TransactionBufferError,
    TxnAbort,
    TxnCommit,
    TxnData,
    decode_sidecar_record,
    entry_kind,
)
from ledger import read_runs
from tc import TxnID, TxnStatus

__all__ = ["check_dangling", "check_partition"]


@dataclass(slots=True)
class Sidecar:
    """What the check learns of a sidecar log."""

    data: dict[int, tuple[TxnID, int]] = field(default_factory=dict)  # TXN_DATA: txn, count
    other: dict[int, int] = field(default_factory=dict)  # entry id -> kind, other records
    commits: dict[TxnID, list[tuple[int, int]]] = field(default_factory=dict)  # (entry, marker)
    aborts: dict[TxnID, int] = field(default_factory=dict)
    first_data: dict[TxnID, int] = field(default_factory=dict)  # txn -> its first TXN_DATA


async def check_partition(
    check: Check, topic: str, index: int, group: dict[str, list[str]]
) -> None:
    pname, xname = f"p/{topic}/{index}", f"x/{topic}/{index}"
    plog = check.store.get_ledger(pname)
    first, last = (plog.first_entry_id, plog.last_entry_id) if plog else (0, -1)
    check.report.counts["partitions"] += 1
    counts: Callable[[int], int] = no_entries
    marker_ids: list[int] = []
    markers: dict[int, tuple[TxnID, tuple[int, ...], int]] = {}
    if plog is not None:
        check.tick()
        metas = await plog.read_meta()
        if metas and metas[-1][0] - metas[0][0] + 1 != len(metas):
            check.find(
                "unreadable",
                [pname],
                "its entry ids are not contiguous (an entry was deleted): the broker "
                "refuses to load the partition",
            )
        counts = entry_counts(metas)
        marker_ids.extend(e for e, m in metas if entry_kind(m) == COMMIT_MARKER)
        for entry_id, entry in (await read_runs(plog, marker_ids, CHUNK)).items():
            try:
                marker = CommitMarker.decode(entry.meta, entry.data)
            except TransactionBufferError as exc:
                check.find("unreadable", [f"{pname}@{entry_id}"], str(exc))
                continue
            markers[entry_id] = (marker.txn, tuple(marker.entries), marker.count)
        check.report.counts["commit markers"] += len(markers)
    sidecar = await read_sidecar(check, xname) if group.get("x") else None
    check_markers(check, pname, xname, first, last, markers, sidecar)
    subs = {name.rsplit("/", 1)[1] for name in group.get("c", [])}
    in_markers = set(marker_ids)
    for cname in group.get("c", []):
        sub = cname.rsplit("/", 1)[1]
        # A read_uncommitted subscription counts commit markers as empty.
        skip = in_markers if f"u/{topic}/{index}/{sub}" in group.get("u", []) else set()
        await check_cursor(check, cname, topic, pname, first, last, counts, skip)
    for uname in group.get("u", []):
        check.tick()
        if uname.rsplit("/", 1)[1] not in subs:
            check.find(
                "leftover-ledger",
                [uname],
                "a read_uncommitted ledger whose subscription has no cursor ledger",
                Repair("drop", uname),
            )
    check.tick(len(group.get("d", [])))


async def read_sidecar(check: Check, xname: str) -> Sidecar | None:
    xlog = check.store.get_ledger(xname)
    if xlog is None:
        return None
    check.tick()
    check.report.counts["sidecars"] += 1
    sc = Sidecar()
    async for entry in chunks(xlog):
        try:
            record = decode_sidecar_record(entry.meta, entry.data)
        except TransactionBufferError as exc:
            check.find("unreadable", [f"{xname}@{entry.entry_id}"], str(exc))
            continue
        if isinstance(record, TxnData):
            sc.data[entry.entry_id] = (record.txn, record.count)
            sc.first_data.setdefault(record.txn, entry.entry_id)
            continue
        sc.other[entry.entry_id] = entry_kind(entry.meta)
        if isinstance(record, TxnCommit):
            sc.commits.setdefault(record.txn, []).append((entry.entry_id, record.marker))
        elif isinstance(record, TxnAbort):
            sc.aborts[record.txn] = entry.entry_id
    return sc


def check_markers(
    check: Check,
    pname: str,
    xname: str,
    first: int,
    last: int,
    markers: dict[int, tuple[TxnID, tuple[int, ...], int]],
    sc: Sidecar | None,
) -> None:
    """Commit markers against the sidecar records, both against the coordinators."""
    by_txn: dict[TxnID, list[int]] = {}
    complete: set[int] = set()  # markers whose sidecar records are all there and theirs
    for entry_id, (key, ids, count) in sorted(markers.items()):
        by_txn.setdefault(key, []).append(entry_id)
        objects = [f"{pname}@{entry_id}", xname, txn_name(key)]
        if sc is None:
            check.find(
                "marker-data-missing",
                objects,
                f"commit marker {entry_id} names sidecar entries {ids_text(ids)}, but the "
                "partition has no sidecar ledger",
            )
            continue
        gone = [i for i in ids if i not in sc.data and i not in sc.other]
        if gone:
            check.find(
                "marker-data-missing",
                objects,
                f"commit marker {entry_id} names sidecar entries {ids_text(gone)}, which are gone",
            )
            continue
        wrong = [i for i in ids if i in sc.other or sc.data[i][0] != key]
        if wrong:
            check.find(
                "marker-data-mismatch",
                objects,
                f"commit marker {entry_id} names sidecar entries {ids_text(wrong)}, which are "
                "not TXN_DATA records of its transaction",
            )
            continue
        held = sum(sc.data[i][1] for i in ids)
        if held != count:
            check.find(
                "marker-data-mismatch",
                objects,
                f"commit marker {entry_id} counts {count} messages, its sidecar records "
                f"hold {held}",
            )
            continue
        complete.add(entry_id)
    for key, entries in by_txn.items():
        if len(entries) > 1:
            check.find(
                "duplicate-marker",
                [*(f"{pname}@{e}" for e in entries), txn_name(key)],
                f"{len(entries)} commit markers of one transaction: {ids_text(entries)}",
            )
    commits = sc.commits if sc is not None else {}
    aborts = sc.aborts if sc is not None else {}
    for key, records in commits.items():
        for record, marker in records:
            if marker < 0 or marker < first:
                continue  # (wrote nothing here, or the marker was trimmed)
            found = markers.get(marker)
            if found is None or found[0] != key:
                where = "past the partition's end" if marker > last else "not its marker"
                check.find(
                    "commit-record-without-marker",
                    [f"{xname}@{record}", pname, txn_name(key)],
                    f"TXN_COMMIT record {record} names commit marker {marker}, which is "
                    f"{where} (the partition holds entries {first}..{last})",
                )
    committed = set(by_txn) | set(commits)
    for key in sorted(committed):
        objects = [pname, xname, txn_name(key)]
        if key in aborts:
            check.find(
                "commit-and-abort",
                objects,
                f"committed here (marker or TXN_COMMIT) and aborted (TXN_ABORT record "
                f"{aborts[key]})",
            )
        _, meta = check.decision(key)
        contradicts = meta is not None and meta.status in (
            TxnStatus.ABORTING,
            TxnStatus.ABORTED,
        )
        if contradicts:
            assert meta is not None
            check.find(
                "commit-contradicts-coordinator",
                objects,
                f"committed on this partition, {meta.status.name} at coordinator {meta.txnid.tcid}",
            )
        entries = by_txn.get(key, [])
        if key not in commits and key not in aborts and len(entries) == 1 and sc is not None:
            marker = entries[0]
            if marker not in complete:
                continue
            repair = None
            if not contradicts:
                data, meta_bits = TxnCommit(key, marker).encode()
                repair = Repair("append", xname, data, meta_bits, f"TXN_COMMIT (marker {marker})")
            check.find(
                "commit-unrecorded",
                [f"{pname}@{marker}", xname, txn_name(key)],
                f"commit marker {marker} is durable, its TXN_COMMIT record is not",
                repair,
            )
    if sc is None:
        return
    check.report.counts["transactions on partitions"] += len(sc.first_data)
    for key in sorted(aborts):
        _, meta = check.decision(key)
        if meta is not None and meta.status in (TxnStatus.COMMITTING, TxnStatus.COMMITTED):
            check.find(
                "abort-contradicts-coordinator",
                [f"{xname}@{aborts[key]}", txn_name(key)],
                f"aborted on {pname}, {meta.status.name} at coordinator {meta.txnid.tcid}",
            )
    for key, entry_id in sorted(sc.first_data.items(), key=lambda kv: kv[1]):
        if key in committed or key in aborts:
            continue
        here, meta = check.decision(key)
        if not here:
            continue
        objects = [xname, txn_name(key)]
        if meta is None or meta.status is TxnStatus.ABORTED:
            state = "unknown to" if meta is None else "ABORTED at"
            data, meta_bits = TxnAbort(key).encode()
            check.find(
                "orphan-open-txn",
                objects,
                f"open on {pname} (sidecar records from entry {entry_id}), {state} "
                f"coordinator {TxnID(*key).tcid}",
                Repair("append", xname, data, meta_bits, "TXN_ABORT"),
            )
        elif meta.status is TxnStatus.COMMITTED:
            check.find(
                "commit-not-applied",
                objects,
                f"open on {pname} (sidecar records from entry {entry_id}, no commit "
                f"marker), COMMITTED at coordinator {meta.txnid.tcid}",
            )


def check_dangling(check: Check, topic: str, index: int, group: dict[str, list[str]]) -> None:
    names = [n for kind in ("p", "d", "x", "c", "u") for n in group.get(kind, [])]
    check.tick(len(names))
    known = check.topics is not None and not check.blind
    why = (
        f"topic {topic!r} is not in the topic list"
        if topic not in (check.topics or {})
        else f"topic {topic!r} has {(check.topics or {})[topic]} partitions"
    )
    if group.get("p"):
        check.find(
            "orphan-partition",
            names,
            f"partition {index} of {topic!r} has a partition ledger, but {why}",
        )
        return
    for name in names:
        kind, sub = name.split("/")[0], name.split("/")[-1]
        busy = check.unfinished_on(
            (topic, index) if kind == "x" else None, (topic, sub) if kind == "c" else None
        )
        repair = Repair("drop", name) if known and not busy else None
        detail = f"no partition ledger, and {why}"
        if busy:
            detail += f"; transaction {busy} of a coordinator here is unfinished on it"
        check.find("dangling-ledger", [name], detail, repair)
