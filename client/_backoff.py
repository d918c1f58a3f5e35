"""The pause between two attempts of a request that follows a cluster's owner.

Every retry loop of the client that looks an owner up again after
``NOT_OWNER`` (or after no answer, or a connection lost) pauses here: a
transaction's END_TXN (``client._txn``), the creation of a producer or
consumer (``Client._at_owner``), a producer or consumer moved to its
topic's owner (``Brokers._move``), a routed request of a reader, cursor,
transaction group or epoch producer (``Route.request``), and a lookup
itself (``Brokers.lookup``).

Decisions written down here:

* An attempt at a broker not tried yet by this loop goes at once: the
  loop follows a real move, and the delay starts again from the first.
* An attempt at a broker this loop tried already (a lookup named the same
  broker again: its tables say nothing new yet), or when no owner is
  known, waits first: ``RETRY_FIRST`` (0.05 s), doubling each time, to at
  most ``RETRY_MOST`` (1 s; a lookup's own loop: 0.5 s, `Brokers.lookup`).
  While a slot is between owners (released or lost by the old one, not
  loaded yet by the new one) the owner named is the same for a while, and
  without the pause every client re-sends at once, as fast as the round
  trip allows (thousands of refusals a minute, each costing the broker).
* Never past the operation's deadline: a pause that would end at or after
  it is not taken (`Backoff.wait` answers False), and the caller raises
  the error of its last attempt rather than make one more with no time
  left.
"""

from __future__ import annotations

import asyncio

__all__ = ["RETRY_FIRST", "RETRY_MOST", "Backoff"]

RETRY_FIRST = 0.05  # seconds: the first pause before an attempt at the same broker
RETRY_MOST = 1.0  # seconds: the longest pause


class Backoff:
    """The pauses of one retry loop (see the module docstring), until
    ``deadline`` (loop time). ``at``: where its first attempt went (None:
    nowhere yet). ``pauses`` counts the pauses taken, ``paused`` their
    seconds."""

    def __init__(self, deadline: float, at: object = None, *, most: float = RETRY_MOST) -> None:
        self.deadline = deadline
        self._tried: list[object] = [] if at is None else [at]
        self._delay = RETRY_FIRST
        self._most = most
        self.pauses = 0
        self.paused = 0.0

    def delay(self, target: object = None) -> float:
        """The pause before the next attempt, at ``target`` (None: no owner
        known), and note the attempt: 0 at a broker not tried yet (the
        first delay again after it), else the next of the doubling delays."""
        if target is not None and not any(target is t for t in self._tried):
            self._tried.append(target)
            self._delay = RETRY_FIRST
            return 0.0
        delay = self._delay
        self._delay = min(self._delay * 2, self._most)
        return delay

    async def wait(self, target: object = None) -> bool:
        """Pause before the next attempt at ``target`` (`delay`); False, at
        once, if the pause would reach the deadline (the caller gives up)."""
        delay = self.delay(target)
        now = asyncio.get_running_loop().time()
        if now + delay >= self.deadline:
            return False
        if delay <= 0:
            return True
        self.pauses += 1
        self.paused += delay
        await asyncio.sleep(delay)
        return True
