"""Spare transactions: the next TxnID comes with the END of the last one.

A consume-transform-produce loop ends a transaction and at once opens the
next one, so NEW_TXN's round trip would sit on its critical path every
time. Kafka has no such trip (``beginTransaction`` is local; the
coordinator learns of a transaction at its first AddPartitionsToTxn). Here
a TxnID must come from a coordinator, so the client asks for it early:

* A transaction's first END_TXN (commit or abort) also asks the broker to
  open the next transaction, with the same timeout, on the next
  coordinator in turn (``next_txn_ttl_ms``); the END's answer carries its
  id: a *spare*. So the next ``Client.new_transaction`` with that timeout
  sends nothing. Folding the request into END saves a request and an
  answer per transaction on both ends (a NEW_TXN of its own, sent with the
  END, would cost them). An END retried after a lost answer does not ask
  again; an END that fails brings no spare (the broker aborts the one it
  opened).
* There are never more spares, held or asked for, than ``MAX_SPARES``: a
  spare exists only where the application has just ended a transaction.
* A coordinator counts a transaction's timeout from its opening. A spare is
  taken only while it is younger than ``MAX_AGE`` seconds and a tenth of
  its timeout (counted from when its END was sent), so a transaction loses
  at most that much of its timeout. A spare not taken by then is aborted
  (END_TXN ABORT), as is one that a reconnect made doubtful (a broker
  restart aborts open transactions).
* ``Client.close`` aborts the spares it holds. A client that dies leaves
  its spares open until their timeout, like any other open transaction;
  they hold nothing.

The admin API lists a spare as an OPEN transaction with no partitions and
no subscriptions, for its short life.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

from proto import txn_text

from .errors import TxnbufError

log = logging.getLogger("client")

MAX_AGE = 1.0  # seconds; a spare older than this (or a tenth of its timeout) is aborted
MAX_SPARES = 128  # held or asked for, over all timeouts


def _max_age(ttl_ms: int) -> float:
    """How long a spare with a timeout of ``ttl_ms`` may wait to be taken (s)."""
    return min(MAX_AGE, ttl_ms / 10_000)


class Spare(NamedTuple):
    """An open transaction nobody uses yet."""

    most_bits: int
    least_bits: int
    tc_id: int
    born: float  # loop time when it was asked for
    gen: int  # the link generation it was answered on


class Ask(NamedTuple):
    """A spare asked for with an END_TXN: put it in the END, then hand the
    answer to `SparePool.answered`."""

    ttl_ms: int
    tc_id: int
    born: float


class SparePool:
    """The spares of one client, by timeout in milliseconds.

    ``next_tc()`` names the coordinator for the next spare;
    ``abort(spare)`` sends END_TXN ABORT for one; ``is_current(gen)`` tells
    whether the link a spare was answered on is still up.
    """

    def __init__(
        self,
        next_tc: Callable[[], int],
        abort: Callable[[Spare], Coroutine[Any, Any, None]],
        is_current: Callable[[int], bool],
    ) -> None:
        self._next_tc = next_tc
        self._abort = abort
        self._is_current = is_current
        self._spares: dict[int, deque[Spare]] = {}
        self._count = 0  # held and asked for
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None
        self._aborts: set[asyncio.Task[None]] = set()

    def ask(self, ttl_ms: int) -> Ask | None:
        """A spare to ask for with an END_TXN now (a transaction with a
        timeout of ``ttl_ms`` is ending), or None if there is no room. Every
        Ask is answered with `answered`."""
        if self._closed or self._count >= MAX_SPARES:
            return None
        self._count += 1
        return Ask(ttl_ms, self._next_tc(), asyncio.get_running_loop().time())

    def answered(self, ask: Ask, most_bits: int, least_bits: int, gen: int) -> None:
        """The END that asked answered with the spare ``(most_bits,
        least_bits)`` on the link of generation ``gen``."""
        spare = Spare(most_bits, least_bits, ask.tc_id, ask.born, gen)
        if self._closed:
            self._count -= 1
            self._discard(spare)
            return
        self._spares.setdefault(ask.ttl_ms, deque()).append(spare)
        if self._timer is None:
            loop = asyncio.get_running_loop()
            delay = max(0.0, ask.born + _max_age(ask.ttl_ms) - loop.time())
            self._timer = loop.call_later(delay, self._expire)

    def unanswered(self, ask: Ask) -> None:
        """The END that asked brought no spare (it failed, or the broker
        could not open one)."""
        self._count -= 1

    def take(self, ttl_ms: int) -> Spare | None:
        """A fresh spare with a timeout of ``ttl_ms``, or None."""
        queue = self._spares.get(ttl_ms)
        while queue:
            spare = queue.popleft()
            self._count -= 1
            if self._fresh(spare, ttl_ms):
                return spare
            self._discard(spare)
        return None

    def _fresh(self, spare: Spare, ttl_ms: int) -> bool:
        age = asyncio.get_running_loop().time() - spare.born
        return age < _max_age(ttl_ms) and self._is_current(spare.gen)

    def _expire(self) -> None:
        """Abort the spares grown too old untaken; wake again for the next
        one to grow old. (Spares are queued about in the order they were
        asked for: one behind a fresher one is caught by the next wake-up
        or by `take`.)"""
        self._timer = None
        loop = asyncio.get_running_loop()
        wake: float | None = None
        for ttl_ms, queue in self._spares.items():
            while queue and not self._fresh(queue[0], ttl_ms):
                self._count -= 1
                self._discard(queue.popleft())
            if queue:
                due = queue[0].born + _max_age(ttl_ms)
                wake = due if wake is None else min(wake, due)
        if wake is not None:
            self._timer = loop.call_at(wake, self._expire)

    def _discard(self, spare: Spare) -> None:
        """Abort a spare nobody will use, in the background."""
        if not self._is_current(spare.gen):
            return  # a reconnect: a restarted broker aborted it; else its timeout will
        task = asyncio.get_running_loop().create_task(self._abort_quietly(spare))
        self._aborts.add(task)
        task.add_done_callback(self._aborts.discard)

    async def _abort_quietly(self, spare: Spare) -> None:
        try:
            await self._abort(spare)
        except TxnbufError as exc:
            log.debug(
                "aborting spare transaction %s failed: %s",
                txn_text((spare.most_bits, spare.least_bits)),
                exc,
            )

    async def close(self, timeout: float) -> None:
        """Abort every spare held (and those still to come with an END),
        waiting at most ``timeout`` seconds for the aborts; no more spares
        are asked for."""
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for queue in self._spares.values():
            for spare in queue:
                self._count -= 1
                self._discard(spare)
        self._spares.clear()
        if self._aborts:
            await asyncio.wait(self._aborts, timeout=timeout)
