"""What every part of `ledger` shares: the entry, the errors, and what an
engine tells its store (`EngineSink`: the engines stand below the store,
which imports them).

The errors::

    LedgerError          the store failed to make an operation durable, or is
                         closed (after a failed write it refuses every later
                         one: fail-stop)
    └── LedgerFencedError  a write touched a slot this store no longer holds
                         (another broker took it over): nothing of that write
                         was stored
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["EngineSink", "Entry", "LedgerError", "LedgerFencedError"]


@dataclass(frozen=True, slots=True)
class Entry:
    entry_id: int
    meta: int
    data: bytes


class LedgerError(Exception):
    """The store failed to make an operation durable (or is closed)."""


class LedgerFailedError(LedgerError):
    """The store is out of service: a group commit failed (an error, or an
    outcome unknown, such as a connection lost during COMMIT: fail-stop,
    nothing more is written until the store is reopened), or the store is
    closed. Not about the request: the same request succeeds on the store
    opened again (a cluster broker reopens it, `broker._cluster`)."""


class LedgerFencedError(LedgerFailedError):
    """A group commit was refused because the store no longer holds a slot
    it wrote to: the slot's row in the database names another owner, or a
    later epoch. Nothing of the commit was written. ``slots`` names them."""

    def __init__(self, message: str, slots: Iterable[int] = ()) -> None:
        super().__init__(message)
        self.slots = tuple(sorted(slots))


class EngineSink(Protocol):
    """What an engine tells its store (`ledger.LedgerStore`)."""

    def _answered(self, seq: int, error: str | LedgerError | None, result: Any) -> None:
        """The answer to request ``seq``; answers come in the order of the requests."""

    def _engine_lost(self, reason: str) -> None:
        """The engine can answer nothing more (its writer or connection is gone)."""
