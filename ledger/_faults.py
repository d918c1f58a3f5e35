"""Test-only fault hooks: kill this process at a named step, or refuse one.

Crash tests start a process with ``TXNBUF_FAULT`` naming one or more steps,
comma-separated, each optionally ``@N`` (die at its N-th hit, default 1):

    TXNBUF_FAULT="tc.after_committing_logged"          # first hit
    TXNBUF_FAULT="buffer.after_commit_marker@3"        # third hit

When the running code reaches `hit("<step>")` for that step, the process
sends itself SIGKILL: no cleanup, no flush, exactly like a crash. Without the
variable `hit` is a dictionary lookup that finds nothing.

``TXNBUF_WRITER_STALL`` names a file: while it exists, the store's writer
thread (`ledger._writer`) holds every write before committing it, so a
test can kill the broker with writes answered early and not yet durable,
or gather the writes that arrive meanwhile into one group commit. While it
holds one, the file's name with ``.held`` appended exists.

``TXNBUF_REFUSE`` names steps where `refuse("<step>")` raises
`InjectedRefusal` instead, each optionally ``@N`` (the first N hits; without
it, every hit): a participant that refuses its coordinator's decision, say.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["InjectedRefusal", "hit", "refuse"]


def _parse(spec: str) -> dict[str, int]:
    steps: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, nth = part.partition("@")
        steps[name] = int(nth) if nth else 1
    return steps


_armed = _parse(os.environ.get("TXNBUF_FAULT", ""))


def hit(step: str) -> None:
    """Die here if the test armed ``step`` (and this is its N-th hit)."""
    if not _armed or step not in _armed:
        return
    _armed[step] -= 1
    if _armed[step] <= 0:
        sys.stderr.write(f"txnbuf fault: SIGKILL at {step}\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


class InjectedRefusal(Exception):
    """Raised by `refuse` at a step ``TXNBUF_REFUSE`` names."""


def _parse_refusals(spec: str) -> dict[str, int]:
    steps: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, times = part.partition("@")
        steps[name] = int(times) if times else -1  # (-1: every time)
    return steps


_refusing = _parse_refusals(os.environ.get("TXNBUF_REFUSE", ""))


def refuse(step: str) -> None:
    """Raise `InjectedRefusal` if the test armed ``step`` (and has refusals left)."""
    if not _refusing or not _refusing.get(step):
        return
    if _refusing[step] > 0:
        _refusing[step] -= 1
    raise InjectedRefusal(f"refused at {step} (TXNBUF_REFUSE)")
