"""The checker's view of a history: client operations, writers, readers and
the version order of every key (shared by `checker._check` and `checker._cycles`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .history import CLIENT_FS, FINAL_READS, History, Op, Process, parse_offset

Offset = tuple[int, int]
KV = tuple[str, int]


@dataclass(slots=True, eq=False)
class ClientOp:
    """One client operation (invoke + completion).

    ``id`` names it in anomaly reports: the index of its completion line, or
    of its invoke when it never completed. ``type`` is ok / fail / info (an
    invoke never completed counts as info). ``sends`` are ``(key, value,
    offset or None)`` in order; ``reads`` map each key to the ``(offset,
    value)`` pairs received, in order, over all the op's polls. ``worker``
    is its invoke's ``"worker"`` (the worker whose subscriptions its polls
    read; its successive processes share them), else the worker another
    op of its process names, else None.
    """

    id: int
    invoke_index: int
    complete_index: int | None
    process: Process
    type: str
    f: str
    sends: list[tuple[str, int, Offset | None]]
    reads: dict[str, list[tuple[Offset, int]]]
    worker: int | None = None


@dataclass(slots=True)
class KeyOrder:
    """The version order of one key: every offset known to hold a value.

    Offsets come from every read and from the sends (with a known offset) of
    operations that must have committed. ``offsets`` is sorted; the dense
    *index* of an offset is its position there (gaps in offsets, e.g. commit
    markers, are ignored, as in Jepsen). ``values_at[i]`` holds every value seen
    at ``offsets[i]`` (more than one is an inconsistent offset);
    ``first_index`` / ``last_index`` give each value's lowest and highest index
    (they differ for a duplicate).
    """

    offsets: list[Offset] = field(default_factory=list)
    rank: dict[Offset, int] = field(default_factory=dict)
    values_at: list[list[int]] = field(default_factory=list)
    first_index: dict[int, int] = field(default_factory=dict)
    last_index: dict[int, int] = field(default_factory=dict)

    def index_of(self, value: int, offset: Offset | None) -> int | None:
        """The index of ``value`` sent or read at ``offset`` (or, unknown, its first index)."""
        if offset is not None:
            return self.rank.get(offset)
        return self.first_index.get(value)


class Model:
    """Indexes over a validated history, built once in O(size of history)."""

    def __init__(self, history: History) -> None:
        self.history = history
        self.ops: list[ClientOp] = []
        self.final_reads_complete = False
        # Whether a final read phase was recorded; then, per key named in
        # it, whether that key's final reads completed (`read_to_end`).
        self.final_reads_recorded = False
        self._final_by_key: dict[str, bool] = {}
        self.non_client: dict[str, int] = defaultdict(int)
        for inv, comp in history.pairs():
            if inv.f == FINAL_READS:
                self.final_reads_recorded = True
                self.final_reads_complete = comp is not None and comp.type == "ok"
                if comp is not None and isinstance(comp.value, dict):
                    self._final_by_key = {k: v is True for k, v in comp.value.items()}
                continue
            if inv.f not in CLIENT_FS:
                self.non_client[inv.f] += 1
                continue
            self.ops.append(_client_op(inv, comp))
        # A process is one client of one worker: an op that names no worker
        # (a history recorded before plain polls named theirs) is its
        # process's other ops' worker.
        worker_of = {op.process: op.worker for op in self.ops if op.worker is not None}
        for op in self.ops:
            if op.worker is None:
                op.worker = worker_of.get(op.process)
        # Completion order (never-completed ops last): the order a process did things in.
        self.ops.sort(key=_completion_order)
        self.by_id = {op.id: op for op in self.ops}

        self.writer_of: dict[KV, ClientOp] = {}
        readers: dict[KV, list[ClientOp]] = {}
        at: dict[str, dict[Offset, list[int]]] = defaultdict(dict)
        for op in self.ops:
            for key, value, _ in op.sends:
                self.writer_of[(key, value)] = op
            for key, pairs in op.reads.items():
                by_offset = at[key]
                for offset, value in pairs:
                    _add(by_offset, offset, value)
                    got = readers.get((key, value))
                    if got is None:
                        readers[(key, value)] = [op]
                    elif got[-1] is not op:
                        got.append(op)
        self.readers_of = readers

        # Jepsen's must-have-committed?: ok, or info and some value it sent was read.
        self.committed: set[int] = set()
        for op in self.ops:
            if op.type == "ok" or (
                op.type == "info" and any((k, v) in readers for k, v, _ in op.sends)
            ):
                self.committed.add(op.id)
                for key, value, sent_at in op.sends:
                    if sent_at is not None:
                        _add(at[key], sent_at, value)

        self.orders: dict[str, KeyOrder] = {}
        for key, by_offset in at.items():
            order = KeyOrder()
            for i, offset in enumerate(sorted(by_offset)):
                values = by_offset[offset]
                order.offsets.append(offset)
                order.rank[offset] = i
                order.values_at.append(values)
                for value in values:
                    order.first_index.setdefault(value, i)
                    order.last_index[value] = i
            self.orders[key] = order

    def read_to_end(self, key: str) -> bool | None:
        """Whether the final reads of ``key`` completed (read every
        acknowledged value of it): as the final-read op names the key, else
        as the whole phase went (``ok``: every key). None: the history has
        no final read phase."""
        if not self.final_reads_recorded:
            return None
        return self._final_by_key.get(key, self.final_reads_complete)

    def incomplete_keys(self) -> list[str]:
        """The keys whose final reads did not complete (known by name: named
        in the final-read op, or with a value sent or read), sorted."""
        if not self.final_reads_recorded:
            return []
        keys = set(self._final_by_key) | {k for k, _ in self.writer_of} | set(self.orders)
        return sorted(k for k in keys if self.read_to_end(k) is False)

    def writer_id(self, key: str, value: int) -> int | None:
        op = self.writer_of.get((key, value))
        return None if op is None else op.id


def _completion_order(op: ClientOp) -> int:
    return op.complete_index if op.complete_index is not None else 1 << 62


def _add(by_offset: dict[Offset, list[int]], offset: Offset, value: int) -> None:
    values = by_offset.get(offset)
    if values is None:
        by_offset[offset] = [value]
    elif value not in values:
        values.append(value)
        values.sort()


def _client_op(inv: Op, comp: Op | None) -> ClientOp:
    # A fail / info completion may leave its value out: it sent what it invoked.
    value = comp.value if comp is not None and isinstance(comp.value, list) else inv.value
    sends: list[tuple[str, int, Offset | None]] = []
    reads: dict[str, list[tuple[Offset, int]]] = {}
    if isinstance(value, list):
        for mop in value:
            if mop[0] == "send":
                raw = mop[2]
                if isinstance(raw, list):
                    sends.append((mop[1], raw[1], parse_offset(raw[0])))
                else:
                    sends.append((mop[1], raw, None))
            elif len(mop) == 2:
                for key, pairs in mop[1].items():
                    got = reads.setdefault(key, [])
                    # Validated: every read has a known [entry_id, batch_index].
                    got.extend(((o[0], o[1]), v) for o, v in pairs)
    raw_worker = inv.extra.get("worker")
    worker = raw_worker if type(raw_worker) is int else None
    if comp is None:
        return ClientOp(
            inv.index, inv.index, None, inv.process, "info", inv.f, sends, reads, worker
        )
    return ClientOp(
        comp.index, inv.index, comp.index, comp.process, comp.type, comp.f, sends, reads, worker
    )
