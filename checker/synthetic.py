"""Histories of a simulated, correct broker: for the checker's tests and benchmarks.

`synthetic_history` plays a small model of txnbuf: partitions are logs of
``(entry_id, batch_index)`` offsets; a plain send is appended at once; a
transaction's sends wait in a buffer and are appended at commit as one batch
at the commit marker's entry id (aborted ones never appear). Consumers read
committed messages in order, at most a few per poll; an aborted transaction
rewinds its process's consumer to the last committed position (txnbuf
redelivers what it acknowledged); a crashed client completes ``info``, its
transaction commits or aborts at random, and its slot continues with a new
process id whose consumer starts from the committed position. At the end,
fresh consumers read every partition to its end and the final read phase is
marked complete.

With ``async_markers`` a transaction's markers are written after the client
was answered, one partition after another a few steps apart (as txnbuf's
coordinator does: it logs the decision, answers, then ends the transaction on
each partition in turn). Then
concurrent transactions interleave (G0), and a process's next send can land
before its previous transaction's messages (nonmonotonic-send).
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass, field
from typing import Any

from .history import History, Op, Process, Recorder

__all__ = ["synthetic_history"]


@dataclass
class _Slot:
    process: int
    position: dict[str, int] = field(default_factory=dict)  # consumed so far
    committed: dict[str, int] = field(default_factory=dict)  # as of the last ok op
    op: Op | None = None
    plan: list[list[Any]] = field(default_factory=list)
    done: list[list[Any]] = field(default_factory=list)
    buffered: dict[str, list[int]] = field(default_factory=dict)
    crash: bool = False


class _Broker:
    def __init__(self, keys: list[str]) -> None:
        self.logs: dict[str, list[tuple[tuple[int, int], int]]] = {k: [] for k in keys}
        self.next_entry = dict.fromkeys(keys, 0)
        self.markers: list[tuple[int, str, list[int]]] = []  # (due step, key, values)

    def append(self, key: str, values: list[int]) -> list[tuple[int, int]]:
        entry = self.next_entry[key]
        self.next_entry[key] = entry + 1
        offsets = [(entry, i) for i in range(len(values))]
        self.logs[key].extend(zip(offsets, values, strict=True))
        return offsets

    def commit(self, buffered: dict[str, list[int]], step: int, rng: random.Random | None) -> None:
        """Append a transaction's batches now, or (given ``rng``) one partition at a
        time over the next steps, like a coordinator that answered already."""
        due = step
        for key, values in buffered.items():
            if rng is None:
                self.append(key, values)
            else:
                due += rng.randint(1, 4)
                self.markers.append((due, key, values))

    def tick(self, step: int) -> None:
        due = [m for m in self.markers if m[0] <= step]
        if due:
            self.markers = [m for m in self.markers if m[0] > step]
            for _, key, values in due:
                self.append(key, values)


def synthetic_history(
    n_ops: int,
    *,
    seed: int = 0,
    processes: int = 8,
    keys: int = 4,
    p_abort: float = 0.1,
    p_crash: float = 0.01,
    async_markers: bool = False,
    poll_max: int = 3,
) -> History:
    """A valid history of about ``n_ops`` client operations (plus the final reads)."""
    rng = random.Random(seed)
    key_names = [f"t{k // 2}/{k % 2}" for k in range(keys)]
    broker = _Broker(key_names)
    rec = Recorder(io.StringIO())
    next_value = dict.fromkeys(key_names, 1)
    next_process = processes
    slots = [_Slot(p) for p in range(processes)]
    started = 0
    step = 0

    def poll(slot: _Slot) -> list[Any]:
        got: dict[str, list[list[Any]]] = {}
        for key in key_names:
            log = broker.logs[key]
            pos = slot.position.get(key, 0)
            take = log[pos : pos + rng.randint(0, poll_max)]
            if take:
                got[key] = [[list(o), v] for o, v in take]
                slot.position[key] = pos + len(take)
        return ["poll", got]

    while started < n_ops or any(s.op is not None for s in slots):
        step += 1
        broker.tick(step)
        slot = rng.choice(slots)
        if slot.op is None:
            if started >= n_ops:
                continue
            started += 1
            r = rng.random()
            f = "txn" if r < 0.6 else "send" if r < 0.8 else "poll"
            plan: list[list[Any]] = []
            for _ in range(rng.randint(1, 4) if f == "txn" else 1):
                if f == "poll" or (f == "txn" and rng.random() < 0.5):
                    plan.append(["poll"])
                else:
                    key = rng.choice(key_names)
                    plan.append(["send", key, next_value[key]])
                    next_value[key] += 1
            slot.op = rec.invoke(slot.process, f, plan)
            slot.plan, slot.done, slot.buffered = list(plan), [], {}
            slot.crash = rng.random() < p_crash
            continue
        op = slot.op
        if slot.plan:
            mop = slot.plan.pop(0)
            if mop[0] == "poll":
                slot.done.append(poll(slot))
            elif op.f == "txn":
                slot.buffered.setdefault(mop[1], []).append(mop[2])
                slot.done.append(["send", mop[1], [None, mop[2]]])
            elif slot.crash and rng.random() < 0.5:
                slot.done.append(mop)  # lost before it reached the broker
            else:
                (offset,) = broker.append(mop[1], [mop[2]])
                slot.done.append(["send", mop[1], [list(offset), mop[2]]])
            continue
        # Every micro-op done: end the operation.
        if slot.crash:
            if op.f == "txn" and rng.random() < 0.5:
                broker.commit(slot.buffered, step, rng if async_markers else None)
            rec.complete(op, "info", op.value)
            slot.process, next_process = next_process, next_process + 1
            slot.position = dict(slot.committed)
        elif op.f == "txn" and rng.random() < p_abort:
            rec.complete(op, "fail", slot.done)
            slot.position = dict(slot.committed)
        else:
            if op.f == "txn":
                broker.commit(slot.buffered, step, rng if async_markers else None)
            rec.complete(op, "ok", slot.done)
            slot.committed = dict(slot.position)
        slot.op = None

    step += len(key_names) + 10
    broker.tick(step)
    for key in key_names:
        final: Process = next_process
        next_process += 1
        log = broker.logs[key]
        for start in range(0, max(len(log), 1), 100):
            inv = rec.invoke(final, "poll", [["poll"]])
            chunk = [[list(o), v] for o, v in log[start : start + 100]]
            rec.complete(inv, "ok", [["poll", {key: chunk} if chunk else {}]])
    rec.final_reads(complete=True)
    return rec.history()
