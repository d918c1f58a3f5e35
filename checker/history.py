"""Histories: what clients did, one JSON object a line (Jepsen style).

Format (the contract between the workload, which writes histories, and the
checker, which reads them)::

    {"index": 0, "time": 1200, "process": 3, "type": "invoke", "f": "txn",
     "value": [["send", "orders/0", 17], ["poll"]]}
    {"index": 1, "time": 98000, "process": 3, "type": "ok", "f": "txn",
     "value": [["send", "orders/0", [null, 17]],
               ["poll", {"orders/1": [[[12, 0], 4], [[12, 1], 5]]}]]}

* ``index`` is the line's position in the history (0, 1, 2, ...); ``time``
  monotonic nanoseconds (never decreasing along the file); ``process`` an int
  or a string naming a single-threaded logical client.
* Every operation is an ``invoke`` line followed later by exactly one
  completion from the same process with the same ``f``: ``ok`` (it
  happened), ``fail`` (it certainly did not happen: an aborted transaction)
  or ``info`` (unknown: a timeout or a crash). An invoke still open at the end
  of the file counts as ``info``. A process invokes nothing while one of its
  operations is open, and after a client operation of a process completed
  ``info`` that process is crashed: the workload continues with a new
  process id (as Jepsen does).
* Client operations have ``f`` ``"txn"`` (a transaction), ``"send"`` or
  ``"poll"`` (the same micro-ops outside a transaction), and ``value`` a list
  of micro-ops:

  - ``["send", key, value]`` on invoke; on completion ``["send", key,
    [offset, value]]`` (or still ``["send", key, value]``). ``key`` is the
    partition ``"topic/partition"``, ``value`` an int unique for that key
    across the whole history.
  - ``["poll"]`` on invoke; on completion ``["poll", {key: [[offset, value],
    ...], ...}]`` with the messages received, in the order received.

  ``offset`` is the message id within the partition, ``[entry_id,
  batch_index]``, compared as a tuple; ``null`` when unknown (a transactional
  send is answered with entry id -1: record ``null``; any offset with a
  negative entry id is read as unknown). Reads always carry offsets. A
  ``fail`` / ``info`` completion may repeat the invoke's value, carry what was
  learnt (the polls done before the abort, say), or be ``null`` (it sent what
  it invoked; nothing is known of its polls).
* A process is one consumer that keeps its position: each poll of a key
  must continue right after what that process's last ``ok`` operation read
  of it (else poll-skip / nonmonotonic-poll). So a process consumes its keys
  alone (no sharing a subscription with other processes); after an aborted
  transaction it resumes from its last committed position (txnbuf
  redelivers what the transaction acknowledged, or the client seeks back);
  whenever the workload cannot promise that -- a new consumer, a crash --
  it continues under a new process id.
* Any other ``f`` (a nemesis event, say) is carried along and ignored by the
  checker, with one exception: ``"final-reads-complete"``. The workload
  records it (`Recorder.final_reads`) after its final read phase: ``ok`` if
  every acknowledged send was read, ``fail`` if the phase hit its time limit
  on some key. Its completion's ``value`` says, per key, whether that key's
  final reads completed: ``{"orders/0": true, "orders/1": false}`` (a key
  not named there, or a ``null`` value, goes as the whole phase: every key
  on ``ok``, none on ``fail``). On a key read to its end, an acknowledged
  send nobody read is *unseen*; on a key whose reads stopped short it is an
  *incomplete-read*; both are anomalies. Without this op, *unseen* is
  counted for information only.
* Further fields (``"error"``, say) are allowed and kept. The workload adds
  ``"worker"`` to the invoke of every client operation but the final reads
  (the worker whose subscriptions, ``w<worker>``, the op read from: its
  successive processes share them), and,
  on a ``txn`` completion, ``"txn"`` (its id), ``"path"`` (``"local"`` or
  ``"full"``) and ``"awaited"``: one entry per micro-op, whether its
  answer was awaited before the commit: ``true`` for a send awaited
  (``send``), ``false`` for one queued and not awaited (``send_nowait``: on
  the full path, END_TXN then goes right behind it), and for a poll
  ``false`` if it acknowledged messages in the transaction (a
  transactional ack returns once queued; the commit answers for it) or
  ``null`` if it acknowledged nothing.

`History` loads, saves, pairs and validates histories; `Recorder` writes one
while the workload runs.
"""

from __future__ import annotations

import gc
import io
import json
import os
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

__all__ = [
    "CLIENT_FS",
    "COMPLETION_TYPES",
    "FINAL_READS",
    "History",
    "HistoryError",
    "Op",
    "Process",
    "Recorder",
    "parse_offset",
]

Process = int | str

INVOKE: Final = "invoke"
COMPLETION_TYPES: Final = frozenset({"ok", "fail", "info"})
TYPES: Final = COMPLETION_TYPES | {INVOKE}
CLIENT_FS: Final = frozenset({"txn", "send", "poll"})
FINAL_READS: Final = "final-reads-complete"
_FIELDS: Final = ("index", "time", "process", "type", "f", "value")


class HistoryError(ValueError):
    """A history breaks the format; ``problems`` lists every problem found."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = problems[:20]
        more = f"\n... and {len(problems) - 20} more" if len(problems) > 20 else ""
        super().__init__(f"{len(problems)} problem(s) in history:\n" + "\n".join(shown) + more)


@dataclass(slots=True)
class Op:
    """One line of a history."""

    index: int
    time: int
    process: Process
    type: str
    f: str
    value: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "index": self.index,
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }
        d.update(self.extra)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Op:
        """An op from a parsed line; raises `HistoryError` if a field is missing or mistyped."""
        index, time_, process, type_, f = (d.get(name) for name in _FIELDS[:5])
        if (
            type(index) is int
            and type(time_) is int
            and (type(process) is int or type(process) is str)
            and type(type_) is str
            and type_ in TYPES
            and type(f) is str
        ):
            if len(d) == 6 and "value" in d:
                return cls(index, time_, process, type_, f, d["value"])
            extra = {k: v for k, v in d.items() if k not in _FIELDS}
            return cls(index, time_, process, type_, f, d.get("value"), extra)
        problems = []
        where = f"line with index {d.get('index')!r}"
        for name in ("index", "time"):
            if not _is_int(d.get(name)):
                problems.append(f"{where}: {name!r} must be an int")
        process = d.get("process")
        if not (_is_int(process) or isinstance(process, str)):
            problems.append(f"{where}: 'process' must be an int or a string")
        if not isinstance(type_, str) or type_ not in TYPES:
            problems.append(f"{where}: 'type' must be one of {sorted(TYPES)}")
        if not isinstance(d.get("f"), str):
            problems.append(f"{where}: 'f' must be a string")
        raise HistoryError(problems or [f"{where}: malformed line"])


def _is_int(x: object) -> bool:
    return type(x) is int


def parse_offset(raw: Any) -> tuple[int, int] | None:
    """``[entry_id, batch_index]`` as a tuple; None when unknown (null or entry id < 0).

    Raises ValueError when ``raw`` is neither null nor a pair of ints.
    """
    if raw is None:
        return None
    if type(raw) in (list, tuple) and len(raw) == 2:
        entry, batch = raw
        if type(entry) is int and type(batch) is int:
            return None if entry < 0 else (entry, batch)
    raise ValueError(f"offset must be null or [entry_id, batch_index], not {raw!r}")


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector: parsing and checking allocate
    millions of small acyclic objects, and the collections they trigger cost
    a third of the time on large histories."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class History:
    """A list of `Op` lines, with invokes paired to their completions.

    ``History(ops)`` takes the lines as they are; `validate` checks them.
    `pairs` yields ``(invoke, completion)`` for every operation (completion
    None for an invoke never completed).
    """

    def __init__(self, ops: Iterable[Op]) -> None:
        self.ops: list[Op] = list(ops)
        self._completion: dict[int, Op | None] | None = None
        self._invocation: dict[int, Op] | None = None

    # -- construction and files ------------------------------------------------

    @classmethod
    def from_dicts(cls, dicts: Iterable[dict[str, Any]]) -> History:
        return cls(Op.from_dict(d) for d in dicts)

    @classmethod
    def loads(cls, text: str) -> History:
        """Parse JSONL text (blank lines ignored)."""
        return cls.read(io.StringIO(text))

    @classmethod
    def read(cls, stream: IO[str]) -> History:
        """Parse a JSONL stream."""
        with gc_paused():
            return cls._read(stream)

    @classmethod
    def _read(cls, stream: IO[str]) -> History:
        ops = []
        for lineno, line in enumerate(stream, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HistoryError([f"line {lineno}: not JSON: {exc}"]) from None
            if not isinstance(d, dict):
                raise HistoryError([f"line {lineno}: not a JSON object"])
            ops.append(Op.from_dict(d))
        return cls(ops)

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, validate: bool = True) -> History:
        """Read a JSONL file; `validate` it unless told not to."""
        with open(path, encoding="utf-8") as stream:
            history = cls.read(stream)
        if validate:
            history.validate()
        return history

    def dumps(self) -> str:
        return "".join(op.to_json() + "\n" for op in self.ops)

    def save(self, path: str | os.PathLike[str]) -> None:
        Path(path).write_text(self.dumps(), encoding="utf-8")

    # -- access ----------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.ops)

    def __iter__(self) -> Iterator[Op]:
        return iter(self.ops)

    def __getitem__(self, index: int) -> Op:
        return self.ops[index]

    def _pair(self) -> tuple[dict[int, Op | None], dict[int, Op]]:
        if self._completion is None or self._invocation is None:
            completion: dict[int, Op | None] = {}
            invocation: dict[int, Op] = {}
            open_by_process: dict[Process, Op] = {}
            for op in self.ops:
                if op.type == INVOKE:
                    completion[op.index] = None
                    open_by_process[op.process] = op
                else:
                    inv = open_by_process.pop(op.process, None)
                    if inv is not None:
                        completion[inv.index] = op
                        invocation[op.index] = inv
            self._completion, self._invocation = completion, invocation
        return self._completion, self._invocation

    def completion(self, invoke: Op) -> Op | None:
        """The completion of ``invoke`` (None if it never completed)."""
        return self._pair()[0].get(invoke.index)

    def invocation(self, completion: Op) -> Op | None:
        """The invoke that ``completion`` completes (None if there was none)."""
        return self._pair()[1].get(completion.index)

    def pairs(self) -> Iterator[tuple[Op, Op | None]]:
        """``(invoke, completion or None)`` for every operation, in invoke order."""
        completion = self._pair()[0]
        for op in self.ops:
            if op.type == INVOKE:
                yield op, completion[op.index]

    # -- validation ------------------------------------------------------------

    def validate(self) -> None:
        """Raise `HistoryError` listing every way this history breaks the format.

        Checks: ``index`` is the line's position; ``time`` never decreases;
        every completion follows an invoke of the same process and ``f``;
        no process invokes while it has an operation open or after a client
        operation of it completed ``info`` (crashed); client micro-ops are
        well formed, completions send what their invoke sent, and no value is
        sent twice to one key.
        """
        with gc_paused():
            problems = self._problems()
        if problems:
            raise HistoryError(problems)

    def _problems(self) -> list[str]:
        problems: list[str] = []
        open_by_process: dict[Process, Op] = {}
        crashed: dict[Process, int] = {}
        sent: dict[tuple[str, int], int] = {}
        last_time: int | None = None
        for position, op in enumerate(self.ops):
            where = _Where(op)
            if op.index != position:
                problems.append(f"{where}: index {op.index} at position {position}")
            if last_time is not None and op.time < last_time:
                problems.append(f"{where}: time {op.time} goes back from {last_time}")
            last_time = op.time
            if op.type == INVOKE:
                pending = open_by_process.get(op.process)
                if pending is not None:
                    problems.append(
                        f"{where}: invoked while op {pending.index} of the same process is"
                        " still open (a process is single-threaded)"
                    )
                if op.f in CLIENT_FS and op.process in crashed:
                    problems.append(
                        f"{where}: process crashed (op {crashed[op.process]} completed info);"
                        " use a new process id after a crash"
                    )
                open_by_process[op.process] = op
                if op.f in CLIENT_FS:
                    problems.extend(_check_mops(op, where, invoke=True))
                    for key, value in _invoke_sends(op):
                        first = sent.setdefault((key, value), op.index)
                        if first != op.index:
                            problems.append(
                                f"{where}: value {value} sent to {key!r} again (first by op"
                                f" {first}); values must be unique per key"
                            )
                continue
            inv = open_by_process.pop(op.process, None)
            if inv is None:
                problems.append(f"{where}: {op.type} completion without an open invoke")
                continue
            if inv.f != op.f:
                problems.append(
                    f"{where}: completes invoke {inv.index} of f {inv.f!r} with f {op.f!r}"
                )
                continue
            if op.f in CLIENT_FS and not (op.value is None and op.type != "ok"):
                mop_problems = _check_mops(op, where, invoke=False)
                problems.extend(mop_problems)
                if not mop_problems and _invoke_sends(inv) != _completion_sends(op):
                    problems.append(
                        f"{where}: sends {_completion_sends(op)} differ from invoke"
                        f" {inv.index}'s {_invoke_sends(inv)}"
                    )
            if op.f in CLIENT_FS and op.type == "info":
                crashed[op.process] = op.index
            if op.f == FINAL_READS and not _final_value_ok(op.value):
                problems.append(
                    f"{where}: the value of {FINAL_READS!r} must be null or"
                    f" {{key: true or false}}, not {op.value!r}"
                )
        return problems


class _Where:
    """Names an op in a problem; formatted only when there is a problem."""

    __slots__ = ("op",)

    def __init__(self, op: Op) -> None:
        self.op = op

    def __str__(self) -> str:
        return f"op {self.op.index} (process {self.op.process!r})"


def _final_value_ok(value: Any) -> bool:
    return value is None or (
        isinstance(value, dict)
        and all(isinstance(k, str) and type(v) is bool for k, v in value.items())
    )


def _read_ok(pair: Any) -> bool:
    if type(pair) is list and len(pair) == 2 and type(pair[1]) is int:
        offset = pair[0]
        return (
            type(offset) is list
            and len(offset) == 2
            and type(offset[0]) is int
            and type(offset[1]) is int
            and offset[0] >= 0
        )
    return False


def _check_mops(op: Op, where: _Where, *, invoke: bool) -> list[str]:
    if not isinstance(op.value, list):
        return [f"{where}: value of a {op.f!r} op must be a list of micro-ops"]
    problems = []
    for i, mop in enumerate(op.value):
        at = _At(where, i)
        if not isinstance(mop, list) or not mop or mop[0] not in ("send", "poll"):
            problems.append(f"{at}: must be ['send', key, value] or ['poll', ...], not {mop!r}")
            continue
        if mop[0] == "send":
            if op.f == "poll":
                problems.append(f"{at}: a 'poll' op holds only polls")
            if len(mop) != 3 or not isinstance(mop[1], str):
                problems.append(f"{at}: must be ['send', key, value] with a string key")
                continue
            raw = mop[2]
            if isinstance(raw, list) and not invoke:
                if len(raw) != 2 or not _is_int(raw[1]):
                    problems.append(f"{at}: must be ['send', key, [offset, value]]")
                    continue
                try:
                    parse_offset(raw[0])
                except ValueError as exc:
                    problems.append(f"{at}: {exc}")
            elif not _is_int(raw):
                problems.append(f"{at}: the value must be an int, not {raw!r}")
        else:
            if op.f == "send":
                problems.append(f"{at}: a 'send' op holds only sends")
            if invoke or len(mop) == 1:
                if len(mop) != 1 and invoke:
                    problems.append(f"{at}: a poll is invoked as ['poll']")
                continue
            if len(mop) != 2 or not isinstance(mop[1], dict):
                problems.append(f"{at}: must be ['poll', {{key: [[offset, value], ...]}}]")
                continue
            for key, pairs in mop[1].items():
                if not isinstance(pairs, list):
                    problems.append(f"{at}: reads of {key!r} must be a list")
                    continue
                for pair in pairs:
                    if not _read_ok(pair):
                        problems.append(
                            f"{at}: read of {key!r} must be [[entry_id, batch_index], value]"
                            f" with a known offset, not {pair!r}"
                        )
    return problems


class _At:
    __slots__ = ("i", "where")

    def __init__(self, where: _Where, i: int) -> None:
        self.where, self.i = where, i

    def __str__(self) -> str:
        return f"{self.where} micro-op {self.i}"


def _invoke_sends(op: Op) -> list[tuple[str, int]]:
    if not isinstance(op.value, list):
        return []
    return [
        (mop[1], mop[2])
        for mop in op.value
        if isinstance(mop, list) and len(mop) == 3 and mop[0] == "send" and _is_int(mop[2])
    ]


def _completion_sends(op: Op) -> list[tuple[str, int]]:
    out = []
    for mop in op.value:
        if mop[0] == "send":
            raw = mop[2]
            out.append((mop[1], raw[1] if isinstance(raw, list) else raw))
    return out


_SAME: Any = object()


class Recorder:
    """Writes a history while the workload runs, one flushed line per event.

    ::

        rec = Recorder("history.jsonl")
        op = rec.invoke(3, "txn", [["send", "orders/0", 17], ["poll"]])
        ...
        rec.complete(op, "ok", [["send", "orders/0", [None, 17]],
                                ["poll", {"orders/1": [[[12, 0], 4]]}]])
        rec.final_reads(complete=True)
        rec.close()

    ``sink`` is a path (opened for writing, closed by `close`) or an open
    text stream (left open). Values must be JSON-serializable (tuples become
    lists); the returned ops hold the values as written. ``time`` is nanoseconds from the recorder's
    creation on a monotonic clock. Calls are serialized by a lock, so threads
    and the tasks of one event loop may share a recorder; each call writes
    and flushes its line before returning. The recorder refuses what
    `History.validate` would reject about pairing: a second invoke while a
    process has one open, completing an op twice. It keeps the ops for
    `history` unless ``keep=False``.
    """

    def __init__(self, sink: str | os.PathLike[str] | IO[str], *, keep: bool = True) -> None:
        if isinstance(sink, str | os.PathLike):
            self._stream: IO[str] = open(sink, "w", encoding="utf-8")
            self._owned = True
        else:
            self._stream = sink
            self._owned = False
        self._lock = threading.Lock()
        self._start = time.monotonic_ns()
        self._last_time = 0
        self._next_index = 0
        self._open: dict[Process, Op] = {}
        self._ops: list[Op] | None = [] if keep else None

    def _write(self, process: Process, type_: str, f: str, value: Any, extra: dict[str, Any]) -> Op:
        # Called with the lock held.
        now = max(time.monotonic_ns() - self._start, self._last_time)
        line = Op(self._next_index, now, process, type_, f, value, extra).to_json()
        self._stream.write(line + "\n")
        self._stream.flush()
        # Keep what the file says (lists, not the caller's tuples or objects).
        op = Op.from_dict(json.loads(line))
        self._last_time = now
        self._next_index += 1
        if self._ops is not None:
            self._ops.append(op)
        return op

    def invoke(self, process: Process, f: str, value: Any = None, **extra: Any) -> Op:
        """Record that ``process`` starts operation ``f``; returns the invoke `Op`."""
        with self._lock:
            if process in self._open:
                raise RuntimeError(
                    f"process {process!r} already has op {self._open[process].index} open"
                )
            op = self._write(process, INVOKE, f, value, extra)
            self._open[process] = op
            return op

    def complete(self, op: Op, type: str, value: Any = _SAME, **extra: Any) -> Op:
        """Record how ``op`` ended: ``"ok"``, ``"fail"`` or ``"info"``.

        ``value`` defaults to the invoke's value. Returns the completion `Op`.
        """
        if type not in COMPLETION_TYPES:
            raise ValueError(f"completion type must be one of {sorted(COMPLETION_TYPES)}")
        with self._lock:
            if self._open.get(op.process) is not op:
                raise RuntimeError(f"op {op.index} of process {op.process!r} is not open")
            del self._open[op.process]
            return self._write(op.process, type, op.f, op.value if value is _SAME else value, extra)

    def final_reads(self, complete: bool | Mapping[str, bool], process: Process = "final") -> None:
        """Record the end of the final read phase: ok if every acknowledged
        send was read. ``complete`` is one answer for every key, or one per
        key (``{key: whether its final reads completed}``, kept as the
        completion's value)."""
        if isinstance(complete, Mapping):
            by_key = {str(k): bool(v) for k, v in sorted(complete.items())}
            op = self.invoke(process, FINAL_READS, None)
            self.complete(op, "ok" if all(by_key.values()) else "fail", by_key)
            return
        op = self.invoke(process, FINAL_READS, None)
        self.complete(op, "ok" if complete else "fail")

    def history(self) -> History:
        """What was recorded so far (needs ``keep=True``)."""
        if self._ops is None:
            raise RuntimeError("this recorder does not keep its ops (keep=False)")
        with self._lock:
            return History(list(self._ops))

    def close(self) -> None:
        with self._lock:
            if self._owned:
                self._stream.close()
            else:
                self._stream.flush()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
