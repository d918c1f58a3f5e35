"""``txnbuf check``: run the queue workload under faults, then check the history.

    txnbuf check [--duration 60] [--faults kill,pause] [--seed N] [--clients 4]
                 [--topics 3] [--history PATH] [--workdir DIR] [--auth]
                 [--brokers N --store postgresql|postgresql://... [--lease-ttl 2]]
                 [--pause MIN,MAX]

With ``--store`` the brokers form a cluster over one PostgreSQL database
(``postgresql``: a server of the check's own, made with ``initdb`` in the
work dir; a URL: that database, which no other broker may serve) and each fault is
aimed at brokers chosen by role: the owner of the transactions'
coordinator, the owner of a key's partition, both, or one at random (see
`checker._workload`).

Shows progress bars while it runs (tqdm, on stderr: the workload with its
operation counts, faults done, then the final reads), then prints the
summary table (ops, ok/fail/info, each anomaly class and its count), what
its words mean, the seed and the fault schedule (to replay a failure: the
same seed gives the same schedule), and exits 1 if the checker found any
anomaly. The brokers log at INFO (slot moves, refused transactional sends
and acks, store failures) into the work dir; when the result is invalid,
the summary's last line names the history and the brokers' logs (copied
beside the history, ``NAME-logs/``, when the work dir is a temporary one).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Never

from tqdm import tqdm

from ._check import check, legend
from ._workload import WorkloadConfig, run_workload
from .history import History, Recorder

__all__ = ["add_check_parser", "run_check"]

FAULTS = ("kill", "pause")


def add_check_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = commands.add_parser("check", help="run the Jepsen-style queue workload and check it")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of workload (60)")
    p.add_argument("--faults", default="kill,pause", help="kill,pause or none (kill,pause)")
    p.add_argument("--seed", type=int, default=None, help="seed (random if not given)")
    p.add_argument("--clients", type=int, default=4, help="concurrent clients (4)")
    p.add_argument("--topics", type=int, default=3, help="keys: single-partition topics (3)")
    p.add_argument("--history", help="write the history here (default: in the work dir)")
    p.add_argument("--workdir", help="broker data and logs (default: a temporary dir)")
    p.add_argument(
        "--brokers", type=int, default=1, help="brokers of a cluster (1; above 1 needs --store)"
    )
    p.add_argument(
        "--store",
        default="",
        help="postgresql (a server of the check's own) or a postgresql:// URL: "
        "the brokers run with --cluster over it (default: one broker on SQLite)",
    )
    p.add_argument(
        "--lease-ttl", type=float, default=2.0, help="the cluster brokers' --lease-ttl (2)"
    )
    p.add_argument(
        "--pause",
        type=_pause,
        default=None,
        metavar="MIN,MAX",
        help="a pause's length in seconds, drawn from MIN to MAX (default 0.5,2 on one "
        "broker, 0.5 to twice the lease in a cluster)",
    )
    p.add_argument(
        "--auth",
        action="store_true",
        help="the broker authenticates; the clients hold a token of a role with grants",
    )


def _faults(text: str) -> tuple[str, ...]:
    if text in ("", "none"):
        return ()
    faults = tuple(f.strip() for f in text.split(","))
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise SystemExit(f"txnbuf check: unknown fault(s) {unknown}; choose from {FAULTS}")
    return faults


def _pause(text: str) -> tuple[float, float]:
    try:
        low, high = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--pause must be MIN,MAX in seconds (e.g. 2.5,5), not {text!r}"
        ) from None
    if not 0 <= low <= high:
        raise argparse.ArgumentTypeError(f"--pause needs 0 <= MIN <= MAX, not {text!r}")
    return low, high


def _store(text: str) -> str:
    if text and text != "postgresql" and not text.startswith(("postgresql://", "postgres://")):
        raise SystemExit(
            f"txnbuf check: --store must be postgresql or a postgresql:// URL, not {text!r}"
        )
    return text


def run_check(args: argparse.Namespace) -> int:
    import random

    if args.brokers < 1 or (args.brokers > 1 and not args.store):
        raise SystemExit("txnbuf check: --brokers must be 1, or more with --store postgresql")
    if not args.lease_ttl > 0:
        raise SystemExit("txnbuf check: --lease-ttl must be positive")

    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    bars = _Bars()
    cfg = WorkloadConfig(
        duration=args.duration,
        clients=args.clients,
        topics=args.topics,
        seed=seed,
        faults=_faults(args.faults),
        auth=args.auth,
        progress=bars,
        brokers=args.brokers,
        store=_store(args.store),
        lease_ttl=args.lease_ttl,
        pause=args.pause,
    )
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        history_path = Path(args.history) if args.history else workdir / "history.jsonl"
        history_path.parent.mkdir(parents=True, exist_ok=True)
        where = f", {cfg.brokers} brokers over PostgreSQL" if cfg.store else ""
        print(f"txnbuf check: seed {seed}, {cfg.duration:.0f}s, {cfg.clients} clients{where}, "
              f"faults {','.join(cfg.faults) or 'none'}{', tokens' if cfg.auth else ''}; "
              f"history {history_path}",
              file=sys.stderr)  # fmt: skip
        with Recorder(history_path) as rec:
            try:
                stats = asyncio.run(run_workload(cfg, workdir, rec))
            finally:
                bars.close()
        print("checking the history ...", file=sys.stderr)  # (its counts: the summary)
        started = time.monotonic()
        result = check(History.load(history_path))
        print(f"checked in {time.monotonic() - started:.1f}s", file=sys.stderr)
        print(result.summary_table())
        print(legend(result))
        print(
            f"client crashes {stats['client_crashes']}, broker kills {stats['kills']}, "
            f"pauses {stats['pauses']}, final reads complete: {stats['final_reads_complete']}"
        )
        for key, values in sorted(stats["unread"].items()):
            shown = ", ".join(map(str, values[:10])) + (" ..." if len(values) > 10 else "")
            print(f"final reads: {key}: {len(values)} acknowledged values not read ({shown})")
        paths = ", ".join(f"{k} {n}" for k, n in stats["paths"].items())
        print(f"transactions by path and outcome: {paths}")
        schedule = ", ".join(
            f"{fault} at {at:.1f}s" + (f" of {role} {'+'.join(hit)}" if cfg.store else "")
            for at, fault, role, hit in stats["fault_schedule"]
        )
        print(f"seed {seed}; faults (seconds from the start): {schedule or 'none'}")
        if cfg.store:
            print(f"brokers {', '.join(stats['brokers'])}; keys {', '.join(stats['topics'])}")
            where = "; ".join(
                f"{what} slot {slot} at {url}" for what, (slot, url) in stats["placement"].items()
            )
            print(f"placement at the start: {where}")
        if not result.valid:
            print("ANOMALIES FOUND; history kept at", history_path, file=sys.stderr)
            if not args.history and not args.workdir:
                keep = Path(f"txnbuf-check-{seed}.jsonl")
                keep.write_text(history_path.read_text())
                print(f"copied to {keep}", file=sys.stderr)
                history_path = keep
            logs = _keep_logs(workdir, history_path, temporary=not args.workdir)
            print(f"history {history_path}; the brokers' logs (INFO) {logs}")
            return 1
    return 0


def _keep_logs(workdir: Path, history: Path, temporary: bool) -> str:
    """Where the brokers' logs of an invalid run are: in the work dir
    given, else copied beside the history (``NAME-logs/`` for the history
    ``NAME.jsonl``), since the temporary work dir goes."""
    logs = sorted(workdir.glob("broker*.log"))
    if not temporary:
        return ", ".join(str(p) for p in logs) or "none"
    folder = history.with_name(f"{history.stem}-logs")
    folder.mkdir(parents=True, exist_ok=True)
    for log in logs:
        shutil.copyfile(log, folder / log.name)
    return f"{folder}/ ({', '.join(p.name for p in logs) or 'none'})"


class _Bars:
    """One tqdm bar per phase of the workload (see `WorkloadConfig.progress`)."""

    def __init__(self) -> None:
        self._bars: dict[str, tqdm[Never]] = {}

    def __call__(self, phase: str, done: float, counts: dict[str, int]) -> None:
        if phase not in self._bars:
            self.close()
            self._bars[phase] = tqdm(
                total=100,
                desc=phase,
                file=sys.stderr,
                bar_format="{desc}: {percentage:3.0f}%|{bar:30}| {elapsed}{postfix}",
            )
        bar = self._bars[phase]
        bar.n = round(done * 100)
        bar.set_postfix(counts, refresh=False)
        bar.refresh()

    def close(self) -> None:
        for bar in self._bars.values():
            if not bar.disable:
                bar.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="txnbuf")
    add_check_parser(parser.add_subparsers(dest="command", required=True))
    return run_check(parser.parse_args(argv))
