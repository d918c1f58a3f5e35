"""check-data's pass over a partition's subscription cursors: replayed as a
broker's start replays them (`subscriptions.replay_cursor`), their
positions checked against the partition, their PENDING_ACK transactions
against their coordinators."""

from __future__ import annotations

from collections.abc import Callable

from broker._checkdata._findings import Repair
from broker._checkdata._state import Check, txn_name
from subscriptions import Cursor, replay_cursor, txn_end_record
from tc import TxnID, TxnStatus

__all__ = ["check_cursor"]


async def check_cursor(
    check: Check,
    cname: str,
    topic: str,
    pname: str,
    first: int,
    last: int,
    counts: Callable[[int], int],
    empty: set[int],
) -> None:
    clog = check.store.get_ledger(cname)
    assert clog is not None
    check.tick()
    check.report.counts["subscription cursors"] += 1

    def count(entry_id: int) -> int:  # (as the broker counts: 0 if trimmed)
        return 0 if entry_id in empty else counts(entry_id)

    try:
        entries = await clog.read(clog.first_entry_id, clog.last_entry_id)
        cursor = replay_cursor(cname, entries, count, last)[0]
    except Exception as exc:
        check.find("unreadable", [cname], f"the cursor cannot be replayed: {exc}")
        return
    check_positions(check, cname, pname, first, last, cursor)
    sub = cname.rsplit("/", 1)[1]
    for key in cursor.txn_acks:
        here, meta = check.decision(key)
        if not here or (
            meta is not None and meta.status not in (TxnStatus.ABORTED, TxnStatus.COMMITTED)
        ):
            continue  # (not checked, or its coordinator ends it on start)
        objects = [cname, txn_name(key)]
        n = cursor.locks.count(key)
        if meta is not None and meta.status is TxnStatus.COMMITTED:
            check.find(
                "pending-ack-of-committed",
                objects,
                f"{n} messages of {topic} held in PENDING_ACK for subscription {sub!r}, "
                f"COMMITTED at coordinator {meta.txnid.tcid}",
            )
            continue
        state = "unknown to" if meta is None else "ABORTED at"
        record = txn_end_record(key, commit=False)
        check.find(
            "stale-pending-ack",
            objects,
            f"{n} messages of {topic} held in PENDING_ACK for subscription {sub!r}, "
            f"{state} coordinator {TxnID(*key).tcid}",
            Repair("append", cname, record.encode(), record.kind, "TXN_ABORT"),
        )


def check_positions(
    check: Check, cname: str, pname: str, first: int, last: int, cur: Cursor
) -> None:
    md = cur.mark_delete
    positions = [*cur.acked, *cur.pending_ack]
    beyond = [p for p in positions if p[0] > last]
    if md[0] > last or beyond:
        at = f"mark-delete {md[0]}:{md[1]}" if md[0] > last else f"position {max(beyond)}"
        check.find(
            "cursor-past-end",
            [cname, pname],
            f"{at} is past the partition's last entry {last}",
        )
    locked_before = sorted(p for p in cur.pending_ack if p[0] < first)
    if cur.first_open_entry() < first or locked_before:
        what = (
            f"PENDING_ACK message {locked_before[0][0]}:{locked_before[0][1]}"
            if locked_before
            else f"mark-delete {md[0]}:{md[1]}"
        )
        check.find(
            "cursor-behind-trim",
            [cname, pname],
            f"{what} is before the partition's first entry {first}",
        )
