"""An asyncio event loop on a virtual clock, for discrete-event simulations.

`VirtualTimeLoop` is an ordinary selector event loop whose ``time()`` is a
number that only moves when nothing is ready to run: then it jumps to the
next timer. So ``asyncio.sleep``, ``asyncio.timeout`` and ``call_later``
behave as usual, a simulated hour takes as long as its callbacks take to
run, and a run is the same every time for the same inputs (one thread,
callbacks in the order asyncio runs them). Waiting with nothing scheduled
is a deadlock in a simulation: the loop raises `Deadlock`.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["Deadlock", "VirtualTimeLoop", "run"]

_T = TypeVar("_T")


class Deadlock(RuntimeError):
    """Every task waits and no timer is scheduled: virtual time cannot move."""


class _Selector(selectors.DefaultSelector):
    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._loop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready: list[tuple[selectors.SelectorKey, int]] = super().select(0)
        if ready:
            return ready
        if timeout is None:
            raise Deadlock("every task waits for something no timer will bring")
        self._loop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        super().__init__(_Selector(self))
        # Timers due within this of now run now (jumps land exactly on them).
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds


def run(main: Coroutine[Any, Any, _T], start: float = 0.0) -> _T:
    """Run ``main`` to its end on a fresh `VirtualTimeLoop`; cancel what is
    left (tasks of brokers that were killed wait forever)."""
    loop = VirtualTimeLoop(start)
    try:
        return loop.run_until_complete(main)
    finally:
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
