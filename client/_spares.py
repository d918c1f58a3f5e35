"""Spare transactions: the next TxnID is asked for while a transaction ends.

A consume-transform-produce loop ends a transaction and at once opens the
next one, so NEW_TXN's round trip sits on its critical path every time.
Kafka has no such trip (``beginTransaction`` is local; the coordinator
learns of a transaction at its first AddPartitionsToTxn). Here a TxnID
must come from a coordinator, so the client asks for it early instead:

* When a transaction sends END_TXN (commit or abort), the client also sends
  NEW_TXN with the same timeout: a *spare*. ``Client.new_transaction`` with
  that timeout takes a spare that is answered or still in flight, instead
  of asking anew. So a spare exists only where the application has just
  ended a transaction, and there are never more of them than transactions
  ending at once (at most ``MAX_SPARES``).
* A coordinator counts a transaction's timeout from NEW_TXN. A spare is
  taken only while it is younger than ``MAX_AGE`` seconds and a tenth of
  its timeout, so a transaction loses at most that much of its timeout.
  A spare not taken by then is aborted (END_TXN ABORT), as is one that a
  reconnect made doubtful (a broker restart aborts open transactions).
* ``Client.close`` aborts the spares it holds. A client that dies leaves
  its spares open until their timeout, like any other open transaction;
  they hold nothing.

The admin API lists a spare as an OPEN transaction with no partitions and
no subscriptions, for its short life.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

from .errors import TxnbufError

log = logging.getLogger("client")

MAX_AGE = 1.0  # seconds; a spare older than this (or a tenth of its timeout) is aborted
MAX_SPARES = 32  # answered or in flight, over all timeouts


def _max_age(ttl_ms: int) -> float:
    """How long a spare with a timeout of ``ttl_ms`` may wait to be taken (s)."""
    return min(MAX_AGE, ttl_ms / 10_000)


class Spare(NamedTuple):
    """An open transaction nobody uses yet: what NEW_TXN answered."""

    most_bits: int
    least_bits: int
    tc_id: int
    born: float  # loop time when NEW_TXN was sent
    gen: int  # the link generation it was answered on


class SparePool:
    """The spares of one client, by timeout in milliseconds.

    ``fetch(ttl_ms)`` makes a NEW_TXN request and returns its ``Spare``;
    ``abort(spare)`` sends END_TXN ABORT for one; ``is_current(gen)`` tells
    whether the link a spare was answered on is still up.
    """

    def __init__(
        self,
        fetch: Callable[[int], Coroutine[Any, Any, Spare]],
        abort: Callable[[Spare], Coroutine[Any, Any, None]],
        is_current: Callable[[int], bool],
    ) -> None:
        self._fetch = fetch
        self._abort = abort
        self._is_current = is_current
        self._spares: dict[int, deque[asyncio.Task[Spare]]] = {}
        self._count = 0
        self._closed = False
        self._aborts: set[asyncio.Task[None]] = set()

    def prefetch(self, ttl_ms: int) -> None:
        """Ask for a spare with a timeout of ``ttl_ms`` (a transaction with
        that timeout is ending now)."""
        if self._closed or self._count >= MAX_SPARES:
            return
        task = asyncio.get_running_loop().create_task(self._fetch(ttl_ms))
        task.add_done_callback(functools.partial(self._fetched, ttl_ms))
        self._spares.setdefault(ttl_ms, deque()).append(task)
        self._count += 1

    async def take(self, ttl_ms: int) -> Spare | None:
        """A spare with a timeout of ``ttl_ms`` that is still fresh, waiting
        for one in flight; None if there is none."""
        queue = self._spares.get(ttl_ms)
        while queue:
            task = queue.popleft()
            self._count -= 1
            try:
                await asyncio.wait((task,))
            except asyncio.CancelledError:
                task.add_done_callback(self._discard_untaken)
                raise
            if task.cancelled() or task.exception() is not None:
                continue  # the caller asks anew, and sees the error if it persists
            spare = task.result()
            if self._fresh(spare, ttl_ms):
                return spare
            self._discard(spare)
        return None

    def _fresh(self, spare: Spare, ttl_ms: int) -> bool:
        age = asyncio.get_running_loop().time() - spare.born
        return age < _max_age(ttl_ms) and self._is_current(spare.gen)

    def _fetched(self, ttl_ms: int, task: asyncio.Task[Spare]) -> None:
        """Retrieve a failed fetch's error; abort the spare when it grows old
        untaken."""
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            log.debug("asking for a spare transaction failed: %s", error)
            self._forget(task)
            return
        spare = task.result()
        loop = asyncio.get_running_loop()
        delay = max(0.0, spare.born + _max_age(ttl_ms) - loop.time())
        loop.call_later(delay, self._expire, task)

    def _forget(self, task: asyncio.Task[Spare]) -> bool:
        """Drop ``task`` from the pool; False if it was taken already."""
        for queue in self._spares.values():
            if task in queue:
                queue.remove(task)
                self._count -= 1
                return True
        return False

    def _expire(self, task: asyncio.Task[Spare]) -> None:
        if self._forget(task):
            self._discard(task.result())

    def _discard_untaken(self, task: asyncio.Task[Spare]) -> None:
        if not task.cancelled() and task.exception() is None:
            self._discard(task.result())

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
            log.debug("aborting spare transaction (%d,%d) failed: %s",
                      spare.most_bits, spare.least_bits, exc)  # fmt: skip

    async def close(self, timeout: float) -> None:
        """Abort every spare, waiting at most ``timeout`` seconds for the
        fetches in flight and the aborts; no more spares are made."""
        self._closed = True
        tasks = [task for queue in self._spares.values() for task in queue]
        self._spares.clear()
        self._count = 0
        if tasks:
            await asyncio.wait(tasks, timeout=timeout)
        for task in tasks:
            if not task.done():
                task.cancel()
            elif not task.cancelled() and task.exception() is None:
                self._discard(task.result())
        if self._aborts:
            await asyncio.wait(self._aborts, timeout=timeout)
