"""check-data's pass over the coordinators' logs: replayed as a coordinator's
start replays them (`tc.TxnLog` into a `tc.TxnTable`), so that the other
passes check each partition and subscription against the decisions."""

from __future__ import annotations

from typing import cast

from broker._checkdata._state import Check, txn_name
from ledger import Ledger
from tc import ProducerRegistry, TxnLog, TxnStatus, TxnTable

__all__ = ["check_coordinator"]


async def check_coordinator(check: Check, tcid: int, name: str) -> None:
    log = check.store.get_ledger(name)
    assert log is not None
    table = TxnTable(tcid)
    check.tick()
    try:
        # TxnLog reads its ledger through read_meta, read and the entry ids only,
        # which a read-only ledger has as well.
        await TxnLog(cast(Ledger, log)).replay(table, ProducerRegistry(tcid))
    except Exception as exc:
        check.find(
            "unreadable",
            [name],
            f"coordinator {tcid}'s log cannot be replayed ({exc}); no ledger is dropped "
            "while it is",
        )
        check.blind = True
        return
    check.tables[tcid] = table
    check.report.counts["coordinators"] += 1
    check.report.counts["transactions at coordinators"] += len(table.txns) + len(table.ended)
    for meta in table.txns.values():
        where = [f"partition {t}/{i}" for t, i in meta.partitions]
        where += [f"subscription {t}/{s}" for t, s in meta.subscriptions]
        on = f" on {', '.join(where)}" if where else ""
        txn = meta.txnid
        if meta.status is TxnStatus.PREPARED:
            check.find(
                "prepared-at-coordinator",
                [name, txn_name(txn)],
                f"PREPARED at coordinator {tcid}{on}, waiting for its application's decision",
            )
        elif meta.status is TxnStatus.OPEN:
            check.find(
                "open-at-coordinator",
                [name, txn_name(txn)],
                f"OPEN at coordinator {tcid} (registrations are not logged; the sends and "
                "acks of it that were written are aborted where they are)",
            )
        else:
            check.find(
                "to-finish",
                [name, txn_name(txn)],
                f"{meta.status.name} at coordinator {tcid}, to be told{on}",
            )
