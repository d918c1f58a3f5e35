"""The anomaly checker: Jepsen's Kafka queue analysis, ported to txnbuf's model.

The definitions follow ``jepsen/src/jepsen/tests/kafka.clj`` in
jepsen-io/jepsen (the workload Jepsen ran against Kafka, Redpanda and
Bufstream); each function below cites the Jepsen function it ports. Our
mapping: Jepsen's integer key is our partition ``"topic/partition"``; its
integer offset is our ``(entry_id, batch_index)`` message id, compared as a
tuple; like Jepsen we then work with dense *indices* into each key's version
order (`checker._model.KeyOrder`), so gaps in offsets (commit markers) do not
count.

Reads are taken from every completion that carries them -- ok, and also fail
or info ones that recorded what their polls returned (Jepsen builds its
version orders from all polls too: a read-committed poller must return only
committed data whether or not its own transaction commits).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Final

from ._cycles import find_cycles
from ._model import ClientOp, Model, Offset
from .history import History, gc_paused

__all__ = ["CLASSES", "DEFAULT_INFORMATIONAL", "LEGEND", "Result", "check", "legend"]

Example = dict[str, Any]

#: Every anomaly class, in report order, with a one-line description.
CLASSES: Final[dict[str, str]] = {
    "lost-write": "committed send never read, though later values of its key were",
    "duplicate": "one value at two offsets of a key",
    "inconsistent-offsets": "two values at one offset of a key",
    "G1a": "read a value whose send failed (aborted read)",
    "garbage-read": "read a value nobody sent",
    "precommitted-read": "a transaction read its own send",
    "poll-skip": "a process's next poll skipped values of a key",
    "nonmonotonic-poll": "a process's next poll went back (or repeated) on a key",
    "int-poll-skip": "one op's reads of a key skipped values",
    "int-nonmonotonic-poll": "one op's reads of a key went back",
    "nonmonotonic-send": "a process's later send landed before its earlier one",
    "int-nonmonotonic-send": "one op's later send landed before its earlier one",
    "redelivered": "a value acknowledged (ok poll or committed txn) came again on its subscription",
    "unseen": "acknowledged send never read by the end (a key read to its end)",
    "incomplete-read": "acknowledged send never read, on a key whose final reads stopped short",
    "G0": "write cycle (ww edges only)",
    "G1c": "circular information flow (wr, process, realtime edges)",
    "G-single": "cycle with exactly one anti-dependency (rw) edge",
}

#: Classes reported but not counted against validity unless the caller says so.
#: G0: offsets are assigned per partition as messages land, so concurrent
#: transactions interleave -- Jepsen's ``allowed-error-types`` always allows G0
#: for Kafka. G-single: an rw edge may be plain consumer lag (see `checker._cycles`).
DEFAULT_INFORMATIONAL: Final = frozenset({"G0", "G-single"})

# Examples kept per class (counts are always complete).
MAX_EXAMPLES = 1000
SKIPPED_SHOWN = 16
READERS_SHOWN = 10


@dataclass
class Result:
    """What `check` found.

    ``anomalies`` maps every class of `CLASSES` to its examples (JSON-able
    dicts; ops are named by `ClientOp` ids, the index of their completion
    line); ``counts`` gives how many were found (examples stop at
    ``MAX_EXAMPLES``). ``informational`` are the classes that do not make
    the history invalid (``unseen`` joins them when the history has no
    final read phase). ``valid`` is true when every other class is empty.
    ``final_reads_complete``: the final reads completed on every key;
    ``incomplete_keys``: the keys whose final reads did not (stopped at
    their time limit before reading every acknowledged value).
    """

    valid: bool
    anomalies: dict[str, list[Example]]
    counts: dict[str, int]
    informational: frozenset[str]
    final_reads_complete: bool
    stats: dict[str, int] = field(default_factory=dict)
    incomplete_keys: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[str]:
        """The classes that make the history invalid, in report order."""
        return [c for c in CLASSES if self.counts[c] and c not in self.informational]

    def to_dict(self) -> dict[str, Any]:
        return {
            "valid": self.valid,
            "failures": self.failures,
            "counts": self.counts,
            "informational": sorted(self.informational),
            "final_reads_complete": self.final_reads_complete,
            "incomplete_keys": self.incomplete_keys,
            "stats": self.stats,
            "anomalies": {k: v for k, v in self.anomalies.items() if v},
        }

    def summary_table(self) -> str:
        """A plain-text table: operations by type, then every class and its count."""
        s = self.stats
        lines = [
            f"{'operations':<24}{s.get('ops', 0):>10}",
            f"{'  ok':<24}{s.get('ok', 0):>10}",
            f"{'  fail':<24}{s.get('fail', 0):>10}",
            f"{'  info':<24}{s.get('info', 0):>10}",
            f"{'sends / values read':<24}{s.get('sends', 0):>10} / {s.get('values_read', 0)}",
            f"{'keys':<24}{s.get('keys', 0):>10}",
            f"{'final reads complete':<24}{'yes' if self.final_reads_complete else 'no':>10}",
            *(
                [f"{'  keys read short':<24}{len(self.incomplete_keys):>10}"]
                if self.incomplete_keys
                else []
            ),
            "",
            f"{'anomaly class':<24}{'count':>10}  status",
            "-" * 56,
        ]
        for name in CLASSES:
            n = self.counts[name]
            if name in self.informational:
                status = "found (informational)" if n else "ok (informational)"
            else:
                status = "ANOMALY" if n else "ok"
            lines.append(f"{name:<24}{n:>10}  {status}".rstrip())
        lines.append("-" * 56)
        verdict = "valid" if self.valid else "INVALID: " + ", ".join(self.failures)
        lines.append(f"result: {verdict}")
        return "\n".join(lines)


LEGEND = """\
ok / fail / info: operations that certainly happened / certainly did not (refused,
  or their transaction aborted) / whose outcome is unknown (a timeout, a crash
  while in flight): the checker accepts either outcome for those.
ANOMALY: a class that makes the result INVALID; ok: none found.
(informational): found but allowed by this model, so not counted against the
  result: G0 (write cycles: a partition orders concurrent transactions' messages
  as they land, which Jepsen allows for Kafka too) and G-single (one
  anti-dependency edge: plain consumer lag looks like one).
unseen: an acknowledged send never read, on a key whose final reads completed
  (read every acknowledged value of it). On a key whose final reads stopped at
  their time limit, such a send is an incomplete-read instead, also an ANOMALY:
  it was lost, or the key was not served again within the limit; either way
  the result cannot say valid. A history without final reads counts unseen
  as informational."""


def legend(result: Result) -> str:
    """What the summary table's words mean, and each class it found."""
    lines = [LEGEND]
    found = [name for name in CLASSES if result.counts[name]]
    if found:
        lines.append("found:")
        lines += [f"  {name}: {CLASSES[name]}" for name in found]
    return "\n".join(lines)


class _Found:
    def __init__(self) -> None:
        self.examples: dict[str, list[Example]] = {name: [] for name in CLASSES}
        self.counts: dict[str, int] = dict.fromkeys(CLASSES, 0)

    def add(self, name: str, example: Example) -> None:
        self.counts[name] += 1
        if len(self.examples[name]) < MAX_EXAMPLES:
            self.examples[name].append(example)


def check(
    history: History,
    *,
    informational: frozenset[str] = DEFAULT_INFORMATIONAL,
    cycles: bool = True,
) -> Result:
    """Validate ``history`` (raising `HistoryError`), then look for every anomaly class.

    ``informational`` names the classes that are reported without making the
    history invalid (pass ``frozenset()`` to count everything); ``cycles=False``
    skips the dependency graph.
    """
    unknown = informational - CLASSES.keys()
    if unknown:
        raise ValueError(f"unknown anomaly classes: {sorted(unknown)}")
    with gc_paused():
        return _check(history, informational, cycles)


def _check(history: History, informational: frozenset[str], cycles: bool) -> Result:
    history.validate()
    model = Model(history)
    found = _Found()
    _version_order_errors(model, found)
    _aborted_and_garbage_reads(model, found)
    _precommitted_reads(model, found)
    lost = _lost_writes(model, found)
    _unseen(model, found, lost)
    _poll_order(model, found)
    _redelivered(model, found)
    _send_order(model, found)
    if cycles:
        for name, examples in find_cycles(model).items():
            for example in examples:
                found.add(name, example)

    informational = frozenset(informational)
    if not model.final_reads_recorded:
        informational |= {"unseen"}
    valid = not any(found.counts[c] for c in CLASSES if c not in informational)
    return Result(
        valid=valid,
        anomalies=found.examples,
        counts=found.counts,
        informational=informational,
        final_reads_complete=model.final_reads_complete,
        stats=_stats(model),
        incomplete_keys=model.incomplete_keys(),
    )


def _stats(model: Model) -> dict[str, int]:
    stats: dict[str, int] = defaultdict(int)
    for op in model.ops:
        stats["ops"] += 1
        stats[op.type] += 1
        if op.complete_index is None:
            stats["pending"] += 1
        stats["sends"] += len(op.sends)
        stats["values_read"] += sum(len(p) for p in op.reads.values())
    stats["keys"] = len({k for k, _ in model.writer_of} | set(model.orders))
    for f, n in model.non_client.items():
        stats[f"other:{f}"] = n
    return dict(stats)


# -- offsets ------------------------------------------------------------------


def _ops_at(model: Model, wanted: set[tuple[str, Offset]]) -> dict[tuple[str, Offset], list[int]]:
    """Ids of the ops that sent (with a known offset) or read each wanted (key, offset)."""
    out: dict[tuple[str, Offset], list[int]] = defaultdict(list)
    for op in model.ops:
        hit: set[tuple[str, Offset]] = set()
        if op.id in model.committed:
            hit.update((k, o) for k, _, o in op.sends if o is not None and (k, o) in wanted)
        for key, pairs in op.reads.items():
            hit.update((key, o) for o, _ in pairs if (key, o) in wanted)
        for ko in hit:
            out[ko].append(op.id)
    return out


def _version_order_errors(model: Model, found: _Found) -> None:
    """inconsistent-offsets and duplicate.

    Jepsen ``version-orders`` reports *inconsistent offsets*: one offset of a
    key at which sends and polls saw different values. Jepsen
    ``duplicate-cases``: a value that appears at more than one offset of a key.
    Offsets come from all reads and from the sends of operations that must have
    committed.
    """
    bad: list[tuple[str, Example]] = []
    wanted: set[tuple[str, Offset]] = set()
    for key in sorted(model.orders):
        order = model.orders[key]
        for i, values in enumerate(order.values_at):
            if len(values) > 1:
                offset = order.offsets[i]
                wanted.add((key, offset))
                bad.append(
                    (
                        "inconsistent-offsets",
                        {"key": key, "offset": list(offset), "values": list(values)},
                    )
                )
        for value in sorted(order.first_index):
            first, last = order.first_index[value], order.last_index[value]
            if first != last:
                offsets = [
                    order.offsets[i] for i in range(first, last + 1) if value in order.values_at[i]
                ]
                wanted.update((key, o) for o in offsets)
                bad.append(
                    (
                        "duplicate",
                        {"key": key, "value": value, "offsets": [list(o) for o in offsets]},
                    )
                )
    if not bad:
        return
    ops_at = _ops_at(model, wanted)
    for name, example in bad:
        key = example["key"]
        offsets = [example["offset"]] if name == "inconsistent-offsets" else example["offsets"]
        example["ops"] = sorted({i for o in offsets for i in ops_at[(key, tuple(o))]})
        found.add(name, example)


# -- reads of values that should not be there ------------------------------------------


def _aborted_and_garbage_reads(model: Model, found: _Found) -> None:
    """G1a and garbage-read.

    Jepsen ``g1a-cases``: an *aborted read* is a read of a value whose writer
    failed (``fail`` means the transaction or send certainly did not happen).
    Jepsen throws when a read value has no writer at all; we report it as a
    *garbage read*. One example per (key, value), naming the readers (the
    first ``READERS_SHOWN``).
    """
    for (key, value), readers in sorted(model.readers_of.items()):
        writer = model.writer_of.get((key, value))
        if writer is not None and writer.type != "fail":
            continue
        ids = [r.id for r in readers[:READERS_SHOWN]]
        if writer is None:
            found.add("garbage-read", {"key": key, "value": value, "readers": ids})
        elif writer.type == "fail":
            found.add("G1a", {"key": key, "value": value, "writer": writer.id, "readers": ids})


def _precommitted_reads(model: Model, found: _Found) -> None:
    """precommitted-read.

    Jepsen ``precommitted-read-cases``: an operation that observed a value it
    sent itself. Legal in most databases, but a Kafka-style read-committed
    poller must never see a transaction's sends before that transaction
    commits -- and a transaction cannot commit before it ends. (The realtime
    variant -- a value read by an op that completed before its writer was
    invoked -- is a wr + realtime cycle and shows up as G1c-realtime.)
    """
    for op in model.ops:
        if not op.sends or not op.reads:
            continue
        own = defaultdict(set)
        for key, value, _ in op.sends:
            own[key].add(value)
        for key, pairs in op.reads.items():
            for value in sorted({v for _, v in pairs} & own.get(key, set())):
                found.add("precommitted-read", {"key": key, "value": value, "op": op.id})


# -- writes that should have been read ---------------------------------------------------


def _lost_writes(model: Model, found: _Found) -> set[tuple[str, int]]:
    """lost-write; returns the (key, value) pairs reported.

    Jepsen ``lost-write-cases``: for each key take the highest index any
    operation read (a value's *earliest* index); every value whose *latest*
    index is at or below it should have been read by someone. A value nobody
    read is lost if its writer must have committed (ok, or info with some of
    its sends read). Only values with a known offset are in the version order:
    a transactional send's offset is known only once read, so an unread one is
    `unseen`, not lost.
    """
    lost: set[tuple[str, int]] = set()
    for key in sorted(model.orders):
        order = model.orders[key]
        read_values = [v for v in order.first_index if (key, v) in model.readers_of]
        if not read_values:
            continue
        top_value = max(read_values, key=lambda v: order.first_index[v])
        bound = order.first_index[top_value]
        for value, last in sorted(order.last_index.items(), key=lambda kv: kv[1]):
            if last > bound:
                break
            if (key, value) in model.readers_of:
                continue
            writer = model.writer_of.get((key, value))
            if writer is None or writer.id not in model.committed:
                continue
            lost.add((key, value))
            found.add(
                "lost-write",
                {
                    "key": key,
                    "value": value,
                    "offset": list(order.offsets[order.first_index[value]]),
                    "writer": writer.id,
                    "max_read": {
                        "value": top_value,
                        "offset": list(order.offsets[bound]),
                        "reader": model.readers_of[(key, top_value)][0].id,
                    },
                },
            )
    return lost


def _unseen(model: Model, found: _Found, lost: set[tuple[str, int]]) -> None:
    """unseen and incomplete-read.

    Jepsen ``unseen``: sends acknowledged ok whose values no poll returned by
    the end of the history. Values already reported as lost writes are left
    out. Judged per key, by its final reads (`Model.read_to_end`): on a key
    whose final reads completed, such a send is *unseen*, an anomaly; on a
    key whose final reads stopped at their time limit, it is an
    *incomplete-read*, an anomaly too (where Jepsen would report unseen for
    information, while reads may simply not have caught up): a value that a
    quiet system did not serve within the limit, while other keys were read
    to their end, is lost or stuck, and one stuck key must not hide another
    key's loss. Without a final read phase in the history, every such send
    is unseen, and unseen is informational (`check`).
    """
    for op in model.ops:
        if op.type != "ok":
            continue
        for key, value, _ in op.sends:
            if (key, value) not in model.readers_of and (key, value) not in lost:
                name = "incomplete-read" if model.read_to_end(key) is False else "unseen"
                found.add(name, {"key": key, "value": value, "writer": op.id})


# -- order within a process --------------------------------------------------------------


def _poll_order(model: Model, found: _Found) -> None:
    """poll-skip, nonmonotonic-poll, int-poll-skip, int-nonmonotonic-poll.

    Jepsen ``poll-skip+nonmonotonic-cases``: walk each process's operations
    in order, remembering for each key the last ok operation that read it.
    Compare the index of the last value that operation read with the index of
    the first value the next reading operation (of any completion type) reads:
    a delta above 1 skipped values that the version order shows exist
    (*poll-skip*); a delta of 1 or less went back or repeated
    (*nonmonotonic-poll*). Only ok operations move the remembered position, so
    after an aborted transaction a consumer is expected to resume where its
    last ok operation left off (txnbuf redelivers what an aborted transaction
    acknowledged; a client that cannot resume must continue as a new process).
    A process that crashed (info) never returns: the workload uses a new id.

    Jepsen ``int-poll-skip+nonmonotonic-cases`` does the same for consecutive
    values read of one key within a single operation.
    """
    last: dict[tuple[object, str], tuple[ClientOp, int, int]] = {}
    for op in model.ops:
        if not op.reads:
            continue
        for key, pairs in op.reads.items():
            if not pairs:
                continue
            order = model.orders[key]
            ranks = [order.rank[o] for o, _ in pairs]
            for j in range(1, len(pairs)):
                delta = ranks[j] - ranks[j - 1]
                if delta != 1:
                    example = _order_example(order, key, [op.id], pairs[j - 1], pairs[j], delta)
                    found.add("int-poll-skip" if delta > 1 else "int-nonmonotonic-poll", example)
            prev = last.get((op.process, key))
            if prev is not None:
                prev_op, prev_rank, prev_value = prev
                delta = ranks[0] - prev_rank
                if delta != 1:
                    example = _order_example(
                        order,
                        key,
                        [prev_op.id, op.id],
                        (order.offsets[prev_rank], prev_value),
                        pairs[0],
                        delta,
                    )
                    example["process"] = op.process
                    found.add("poll-skip" if delta > 1 else "nonmonotonic-poll", example)
            if op.type == "ok":
                last[(op.process, key)] = (op, ranks[-1], pairs[-1][1])


def _redelivered(model: Model, found: _Found) -> None:
    """redelivered: exactly-once on the consuming side (no Jepsen function).

    Every worker reads through subscriptions of its own (``w<worker>``),
    which its successive processes share. A message that an ``ok`` poll
    acknowledged (the ack was answered: durable), or that an ``ok``
    transaction acknowledged (committed), is done on that subscription: it
    must never be delivered there again, to any later operation of the same
    worker (whatever its completion: a failed or crashed op's reads are
    deliveries too). A fail or info op acknowledged nothing for sure, so it
    marks nothing done. Offsets, not values, are compared (a duplicate send
    is another message). Ops that name no worker are left out.
    """
    done: dict[tuple[int, str, Offset], ClientOp] = {}
    for op in model.ops:  # (completion order)
        worker = op.worker
        if worker is None or not op.reads:
            continue
        for key, pairs in op.reads.items():
            for offset, value in pairs:
                acked_by = done.get((worker, key, offset))
                if acked_by is None or acked_by.complete_index is None:
                    continue
                if acked_by.complete_index >= op.invoke_index:
                    continue  # (not before this op began)
                found.add(
                    "redelivered",
                    {
                        "key": key,
                        "worker": worker,
                        "value": value,
                        "offset": list(offset),
                        "ops": [acked_by.id, op.id],
                        "acked_by": acked_by.f,
                        "type": op.type,
                    },
                )
        if op.type == "ok":
            for key, pairs in op.reads.items():
                for offset, _ in pairs:
                    done.setdefault((worker, key, offset), op)


def _order_example(
    order: Any,
    key: str,
    ops: list[int],
    a: tuple[Offset, int],
    b: tuple[Offset, int],
    delta: int,
) -> Example:
    example: Example = {
        "key": key,
        "ops": ops,
        "values": [a[1], b[1]],
        "offsets": [list(a[0]), list(b[0])],
        "delta": delta,
    }
    if delta > 1:
        i, j = order.rank[a[0]], order.rank[b[0]]
        example["skipped"] = [order.values_at[x][0] for x in range(i + 1, j)][:SKIPPED_SHOWN]
    return example


def _send_order(model: Model, found: _Found) -> None:
    """nonmonotonic-send and int-nonmonotonic-send.

    Jepsen ``nonmonotonic-send-cases``: walk each process's ok and info
    operations in order; for each key, the first value an operation sent must
    land after the last value the process's previous sending operation sent to
    that key. Positions are version-order indices (from the send's own offset,
    or where the value was read); values whose position is unknown are not
    compared. Jepsen ``int-send-skip+nonmonotonic-cases``: the same for
    consecutive sends to one key within one operation (its *skips* are normal
    -- other transactions interleave -- and not reported).
    """
    last: dict[tuple[object, str], tuple[int, int, int | None]] = {}
    for op in model.ops:
        if op.type not in ("ok", "info") or not op.sends:
            continue
        per_key: dict[str, list[tuple[int, Offset | None, int | None]]] = defaultdict(list)
        for key, value, offset in op.sends:
            order = model.orders.get(key)
            index = None if order is None else order.index_of(value, offset)
            per_key[key].append((value, offset, index))
        for key, sends in per_key.items():
            for (v1, _, i1), (v2, _, i2) in itertools.pairwise(sends):
                if i1 is not None and i2 is not None and i2 <= i1:
                    found.add(
                        "int-nonmonotonic-send",
                        {"key": key, "ops": [op.id], "values": [v1, v2], "delta": i2 - i1},
                    )
            prev = last.get((op.process, key))
            first_value, _, first_index = sends[0]
            if prev is not None:
                prev_id, prev_value, prev_index = prev
                if prev_index is not None and first_index is not None and first_index <= prev_index:
                    found.add(
                        "nonmonotonic-send",
                        {
                            "key": key,
                            "process": op.process,
                            "ops": [prev_id, op.id],
                            "values": [prev_value, first_value],
                            "delta": first_index - prev_index,
                        },
                    )
            last_value, _, last_index = sends[-1]
            last[(op.process, key)] = (op.id, last_value, last_index)
