"""A coordinator's log: the ledger ``tc/<tcid>`` of its records and snapshots.

Two kinds of entries (told apart by the ledger's meta): a record, a
serialized `TransactionMetadataEntry`; and a snapshot, the JSON of
`TxnTable.snapshot` and `ProducerRegistry.snapshot`. A snapshot covers
every entry before its own: the log is applied as it is appended (see
`tc._coordinator`), so when a snapshot is appended everything before it is
in the table. Once the snapshot is
durable, the log is trimmed up to it, so recovery reads one snapshot and
the records after it, and its time does not grow with history.

`replay` rebuilds a table and a registry through the same `apply` that
served the records live.
"""

from __future__ import annotations

import asyncio
import json

from ledger import Ledger
from tc._producers import ProducerRegistry
from tc._table import Record, TxnTable

__all__ = ["SNAPSHOT_EVERY", "TxnLog", "apply_record"]

SNAPSHOT_EVERY = 10_000  # records between snapshots
_RECORD, _SNAPSHOT = 0, 1  # ledger meta of the two entry kinds


def apply_record(table: TxnTable, registry: ProducerRegistry, rec: Record) -> None:
    """Apply one record, live and on replay: the table's (NEW, UPDATE, BOOT,
    GROUP) or the registry's (PRODUCER, PRODUCER_EXPIRED); a NEW or UPDATE
    of a producer's transaction that carries the producer's entry (its
    begin, its end) changes the registry too."""
    if not table.apply(rec) or rec.HasField("producer"):
        registry.apply(rec)


class TxnLog:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._since_snapshot = 0
        self.closed = False

    def append(self, rec: Record, lazy: bool = False) -> asyncio.Future[int]:
        """Queue ``rec``; the result is its entry id, once it is durable.
        ``lazy``: nobody waits for it soon (it goes with the next group commit)."""
        return self.ledger.append(rec.SerializeToString(), meta=_RECORD, lazy=lazy)

    def snapshot_due(self) -> bool:
        """Count one record applied; is a snapshot due?"""
        self._since_snapshot += 1
        if self._since_snapshot < SNAPSHOT_EVERY:
            return False
        self._since_snapshot = 0
        return True

    def write_snapshot(self, table: TxnTable, registry: ProducerRegistry) -> None:
        """Append a snapshot of ``table`` and ``registry`` (which hold every
        record appended so far); once it is durable, trim the log before it."""
        snap = {**table.snapshot(), "producers": registry.snapshot()}
        written = self.ledger.append(json.dumps(snap).encode(), meta=_SNAPSHOT)

        def trim(_f: object) -> None:
            # (Not once closing: the store may be closed; the next snapshot trims.)
            if not self.closed and not written.cancelled() and written.exception() is None:
                self.ledger.trim(written.result())

        written.add_done_callback(trim)

    async def replay(self, table: TxnTable, registry: ProducerRegistry) -> int:
        """Apply the latest snapshot and every record after it to ``table``
        and ``registry``; the number of records replayed."""
        ledger = self.ledger
        snapshots = [entry_id for entry_id, kind in await ledger.read_meta() if kind == _SNAPSHOT]
        start = ledger.first_entry_id
        if snapshots:
            (entry,) = await ledger.read(snapshots[-1], snapshots[-1])
            snap = json.loads(entry.data)
            table.restore(snap)
            registry.restore(snap.get("producers", []))
            start = snapshots[-1] + 1
        replayed = 0
        for entry in await ledger.read(start, ledger.last_entry_id):
            if entry.meta == _RECORD:
                rec = Record.FromString(entry.data)
                apply_record(table, registry, rec)
                replayed += 1
        self._since_snapshot = replayed
        return replayed
