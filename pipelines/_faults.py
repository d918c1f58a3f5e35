"""Failures injected at chosen steps of the sink, for the crash tests.

``TXNBUF_SPARK_FAULT_DIR=<dir>`` in the environment of every process of a
job (the driver's and the executors' Python workers inherit it; set it
before the session starts) and ``step[@N]=action,...`` in the file
``<dir>/faults`` (read at each step, so a test can arm a fault in a running
session) or in ``TXNBUF_SPARK_FAULTS`` arm them. The
N-th time any process reaches ``step`` (1 if not given) it does
``action``: ``raise`` (an `InjectedFault`), ``exit`` (the Python process
dies at once, as a killed executor would) or ``stall`` (it sleeps, so that
a test can SIGKILL the whole job there: it finds ``<dir>/<step>.stalled``).
Hits are counted with files in the directory, across processes. Steps:
``sink.task_write`` (after each Arrow batch a task sends),
``sink.before_prepare``, ``sink.after_prepare`` (a task),
``sink.before_commit``, ``sink.after_commit`` (the driver's commit, before
and after the group commit).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["InjectedFault", "hit"]


class InjectedFault(RuntimeError):
    """Raised at a step armed with ``raise``."""


def _armed(directory: str) -> dict[str, tuple[int, str]]:
    spec = os.environ.get("TXNBUF_SPARK_FAULTS", "")
    if not spec:
        try:
            spec = (Path(directory) / "faults").read_text()
        except OSError:
            return {}
    out = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        where, _, action = item.partition("=")
        step, _, nth = where.partition("@")
        out[step] = (int(nth or 1), action or "raise")
    return out


def hit(step: str) -> None:
    """Act here if ``step`` is armed and this is its N-th hit."""
    directory = os.environ.get("TXNBUF_SPARK_FAULT_DIR")
    if not directory:
        return
    armed = _armed(directory).get(step)
    if armed is None:
        return
    nth, action = armed
    count = 1
    while True:  # (claim the next hit number: one file per hit, across processes)
        try:
            os.close(os.open(Path(directory) / f"{step}.{count}", os.O_CREAT | os.O_EXCL))
            break
        except FileExistsError:
            count += 1
    if count != nth:
        return
    if action == "exit":
        os._exit(17)
    if action == "stall":
        (Path(directory) / f"{step}.stalled").touch()
        time.sleep(3600)
    raise InjectedFault(f"fault injected at {step} (hit {count})")
