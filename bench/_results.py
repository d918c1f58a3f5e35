"""Where a benchmark's figures go: a section appended to
``bench/results/<name>.md`` with the date, the machine and the code they
came from, beside printing them. Only figures of one run compare (this
machine's speed moves 2x from day to day); the file keeps every run.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

__all__ = ["RESULTS", "machine_line", "recorded"]

ROOT = Path(__file__).resolve().parents[1]
# (TXNBUF_BENCH_RESULTS moves them elsewhere: the tests run benchmarks small.)
RESULTS = Path(os.environ.get("TXNBUF_BENCH_RESULTS") or ROOT / "bench" / "results")


def _out(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT).stdout.strip()
    except OSError:
        return ""


def machine_line() -> str:
    """The date, ``uname -a``, the cores, Python and the commit measured."""
    commit = _out("git", "rev-parse", "--short", "HEAD") or "?"
    dirty = " (with uncommitted changes)" if _out("git", "status", "--porcelain") else ""
    return (
        f"{datetime.datetime.now().astimezone():%Y-%m-%d %H:%M %Z}; "
        f"`{_out('uname', '-a') or ' '.join(os.uname())}`; {os.cpu_count()} cores; "
        f"Python {platform.python_version()}; txnbuf {commit}{dirty}"
    )


class _Tee(io.TextIOBase):
    def __init__(self, *streams: io.TextIOBase) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def recorded(name: str, command: str, path: Path | None = None) -> Iterator[None]:
    """Print as usual, and append what was printed (the figures: stdout;
    progress goes to stderr) to ``bench/results/<name>.md`` under the
    command, the date and the machine, once the run ends without error."""
    captured = io.StringIO()
    real = sys.stdout
    sys.stdout = _Tee(real, captured)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout = real
    target = path or RESULTS / f"{name}.md"
    target.parent.mkdir(parents=True, exist_ok=True)
    new = not target.exists()
    with open(target, "a") as out:
        if new:
            out.write(f"# `{name}`: figures, one section per run\n")
        out.write(
            f"\n## {machine_line()}\n\n`{command}`\n\n```\n{captured.getvalue().strip()}\n```\n"
        )
