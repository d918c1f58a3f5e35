"""Brokers that differ in one part, side by side: the README loop and the
fastest loop of `bench.ctp`, with what each transaction costs on the way to
disk.

    python -m bench.hops [--messages 30000] [--rounds 3] [--workers 1,4]
                         [--per-txn 100] [--loops readme,fastest]
                         --broker LABEL[,root=DIR][,env=NAME=VALUE][,scheme=S] ...

Each ``--broker`` is a way to run ``txnbuf serve``: ``root`` another
checkout's code (its directory first on the path: the broker before a
change), ``env`` an environment variable for it (repeatable), ``scheme``
the URL scheme the workers connect with (``http``, the WebSocket, by
default). The workers are always this checkout's client. A round runs
every broker with every loop and worker count once, each on a fresh
broker loaded with ``--messages`` inputs, in an order that rotates from
round to round (this machine's speed drifts: only rows of one run compare).

Per run, over the copying stage alone: msgs/s; CPU µs per message of the
workers, of the broker's process (without its writer) and of its ledger
writer (its process, or its thread named ``txnbuf-writer``), from /proc;
the broker's group commits (``txnbuf_ledger_commits``) per transaction
committed and per second; and ``fdatasync`` + ``fsync`` calls of the
broker and its writer per transaction, counted by ``perf stat`` on their
syscall tracepoints (from before the workers start: their set-up's few
calls are in it; ``-`` where perf cannot count). CPU per transaction is
the per-message figure times ``--per-txn``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench._progress import Runs
from bench._results import recorded
from bench.ctp import (
    DIGITS,
    Txnbuf,
    Variant,
    _loop_factory,
    check,
    copy_stage,
)

WRITER_THREAD = "txnbuf-writer"  # (ledger._sqlite names its writer thread so)
COMMITS, TXNS = "txnbuf_ledger_commits", "txnbuf_transactions_committed"
CPUS = ("client", "broker", "writer")


@dataclass(frozen=True, slots=True)
class Spec:
    """One way to run the broker (see the module docstring)."""

    label: str
    root: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    scheme: str = "http"

    @classmethod
    def parse(cls, text: str) -> Spec:
        label, *parts = text.split(",")
        root, scheme, env = None, "http", []
        for part in parts:
            key, _, value = part.partition("=")
            if key == "root":
                root = value
            elif key == "scheme":
                scheme = value
            elif key == "env" and "=" in value:
                name, _, val = value.partition("=")
                env.append((name, val))
            else:
                raise argparse.ArgumentTypeError(f"--broker {text!r}: what is {part!r}?")
        if not label:
            raise argparse.ArgumentTypeError(f"--broker {text!r} needs a label")
        return cls(label, root, tuple(env), scheme)


@dataclass(frozen=True, slots=True)
class Row:
    spec: Spec
    variant: Variant

    @property
    def label(self) -> str:
        return f"{self.spec.label}: {self.variant.label.removeprefix('txnbuf, ')}"


@dataclass(slots=True)
class Run:
    rate: float
    client: float  # CPU µs per message
    broker: float
    writer: float
    commits_per_txn: float
    commits_per_s: float
    syncs_per_txn: float | None
    txns: int
    extra: dict[str, float] = field(default_factory=dict)


class Broker(Txnbuf):
    """`bench.ctp`'s txnbuf server, run as ``spec`` says."""

    def __init__(self, tmp: str, spec: Spec) -> None:
        stream = spec.scheme != "http"  # (the stream listener, on a port of its own)
        super().__init__(tmp, stream=stream, scheme=spec.scheme, root=spec.root,
                         env=dict(spec.env))  # fmt: skip

    def cpu(self) -> tuple[float, float | None]:
        """CPU seconds of the broker without its writer, and of its writer
        (its child processes, and its thread named `WRITER_THREAD`)."""
        pid = self.proc.pid
        broker, thread = _task_cpu(pid, WRITER_THREAD)
        children = sum(sum(_task_cpu(child, "")) for child in self.pids()[1:])
        return broker, thread + children

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.address + "/metrics", timeout=30) as reply:
            text = reply.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            match = re.match(
                r"(txnbuf_ledger_commits|txnbuf_transactions_committed)\S* (\S+)$", line
            )
            if match:
                out[match[1]] = out.get(match[1], 0.0) + float(match[2])
        return out

    def pids(self) -> list[int]:
        """The broker's process and its children (an older checkout's writer process)."""
        pid = self.proc.pid
        found = [pid]
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as stat:
                        if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                            found.append(int(entry))
                except OSError:
                    pass
        return found


def _task_cpu(pid: int, name: str) -> tuple[float, float]:
    """CPU seconds of the threads of process ``pid`` not called ``name``,
    and of those called ``name``: from each thread's schedstat (nanoseconds
    on a CPU; /proc's stat counts in ticks of 10 ms)."""
    others = named = 0
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/comm") as comm:
                    called = comm.read().strip()
                with open(f"/proc/{pid}/task/{tid}/schedstat") as stat:
                    ns = int(stat.read().split()[0])
            except OSError:
                continue
            if name and called == name:
                named += ns
            else:
                others += ns
    return others / 1e9, named / 1e9


class SyncCounter:
    """``perf stat`` counting fdatasync and fsync calls of some processes."""

    EVENTS = ("syscalls:sys_enter_fdatasync", "syscalls:sys_enter_fsync")

    def __init__(self, pids: Sequence[int]) -> None:
        self.proc: subprocess.Popen[str] | None = None
        self._stopped = False
        self._calls: int | None = None
        if shutil.which("perf") is None:
            return
        events = ",".join(self.EVENTS)
        pid_list = ",".join(map(str, pids))
        self.proc = subprocess.Popen(
            ["perf", "stat", "-x", ",", "-e", events, "-p", pid_list],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    def stop(self) -> int | None:
        """Stop counting; the calls counted (None: not counted). Again: the same."""
        if self.proc is None or self._stopped:
            return self._calls
        self._stopped = True
        self._calls = self._stop()
        return self._calls

    def _stop(self) -> int | None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return None
        total, seen = 0, 0
        for line in err.splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[2] in self.EVENTS:
                if not parts[0].strip().isdigit():
                    return None  # (<not supported> or <not counted>)
                total += int(parts[0])
                seen += 1
        return total if seen == len(self.EVENTS) else None


def one_run(row: Row, args: argparse.Namespace, tmp: str, runner: asyncio.Runner) -> Run:
    server = Broker(tmp, row.spec)
    variant = row.variant
    try:
        runner.run(server.load(args.messages, args.size, args.per_txn))
        syncs = SyncCounter(server.pids())  # (from before the workers start)
        try:
            sync, start, ((broker0, writer0), m0), ((broker1, writer1), m1, calls) = copy_stage(
                server, variant, args, row.label,
                lambda: (server.cpu(), server.metrics()),
                lambda: (server.cpu(), server.metrics(), syncs.stop()),
            )  # fmt: skip
        finally:
            syncs.stop()  # (a worker failed: not stopped yet)
        runner.run(check(server, args.messages, args.size, variant))
    finally:
        server.stop()
    per = 1e6 / args.messages
    elapsed = sync.end.value - start
    txns = int(m1[TXNS] - m0[TXNS])
    commits = m1[COMMITS] - m0[COMMITS]
    return Run(
        rate=args.messages / elapsed,
        client=sum(sync.cpu) * per,
        broker=(broker1 - broker0) * per,
        writer=((writer1 or 0.0) - (writer0 or 0.0)) * per,
        commits_per_txn=commits / max(txns, 1),
        commits_per_s=commits / elapsed,
        syncs_per_txn=None if calls is None else calls / max(txns, 1),
        txns=txns,
    )


def report(args: argparse.Namespace, rows: list[Row], runs: dict[Row, list[Run]]) -> str:
    lines = [
        f"consume-transform-produce: {args.messages:,} inputs of {args.size} B, "
        f"{args.per_txn} per transaction, {args.rounds} round(s) in rotation",
        "",
        *(f"- broker `{s.label}`: {_describe(s)}" for s in dict.fromkeys(r.spec for r in rows)),
        "",
        "| | msgs/s, each round | median | client | broker | writer | total "
        "| group commits / txn | group commits / s | fsyncs / txn |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        got = runs[row]

        def med(values: list[float]) -> float:
            return statistics.median(values)

        each = ", ".join(f"{r.rate:,.0f}" for r in got)
        client, broker, writer = (
            med([getattr(r, c) for r in got]) for c in ("client", "broker", "writer")
        )
        total = med([r.client + r.broker + r.writer for r in got])
        syncs = [r.syncs_per_txn for r in got if r.syncs_per_txn is not None]
        lines.append(
            f"| {row.label} | {each} | {med([r.rate for r in got]):,.0f} | {client:.2f} "
            f"| {broker:.2f} | {writer:.2f} | {total:.2f} "
            f"| {med([r.commits_per_txn for r in got]):.2f} "
            f"| {med([r.commits_per_s for r in got]):,.0f} "
            f"| {f'{med(syncs):.2f}' if syncs else '-'} |"
        )
    lines += [
        "",
        "CPU µs per message (times the transaction's size for µs per transaction): client = "
        "the worker processes; broker = the broker's process without its ledger writer; "
        "writer = its writer process or thread; total = their sum. Group commits: the "
        "store's, per transaction committed and per second of the copying stage; fsyncs: "
        "fdatasync + fsync calls of the broker and its writer (perf), per transaction.",
        f"Every run's output was checked: {args.messages:,} outputs, each input transformed "
        "exactly once, every input consumed.",
    ]
    return "\n".join(lines)


def _describe(spec: Spec) -> str:
    parts = [f"code of {spec.root}" if spec.root else "this checkout's code"]
    parts += [f"{k}={v}" for k, v in spec.env]
    if spec.scheme != "http":
        parts.append(f"workers connect with {spec.scheme}://")
    return ", ".join(parts)


def _list(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=_list, default=["1", "4"], help="e.g. 1,4")
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--loops", type=_list, default=["readme", "fastest"])
    parser.add_argument("--broker", type=Spec.parse, action="append", required=True,
                        help="LABEL[,root=DIR][,env=NAME=VALUE][,scheme=S]; repeat")  # fmt: skip
    args = parser.parse_args()
    if args.size < DIGITS:
        parser.error(f"--size must be at least {DIGITS}")
    rows = [
        Row(spec, Variant("txnbuf", int(n), True, loop))
        for loop in args.loops
        for n in args.workers
        for spec in args.broker
    ]
    runs: dict[Row, list[Run]] = {row: [] for row in rows}
    with (
        tempfile.TemporaryDirectory() as tmp,
        asyncio.Runner(loop_factory=_loop_factory()) as runner,
        Runs(args.rounds * len(rows), "hops") as progress,
    ):
        for r in range(args.rounds):
            shift = r * len(rows) // args.rounds
            for row in rows[shift:] + rows[:shift]:
                progress.start(f"round {r + 1}/{args.rounds}: {row.label}")
                run = one_run(row, args, tmp, runner)
                progress.done(f"{run.rate:,.0f} msgs/s")
                runs[row].append(run)
    print(report(args, rows, runs))


if __name__ == "__main__":
    with recorded("hops", " ".join(["python -m bench.hops", *sys.argv[1:]])):
        main()
