"""Chaining futures without tasks: the idioms the transaction path uses, by name.

A transaction's path (a send queued, its decision logged, its markers
written, END answered) is a chain of futures: each step starts when the
one before is done, in a done callback, not in a task (a task per step costs
a turn of the loop and ~10 us of CPU, on every transaction). These are the
links of such chains, in one place, so that a reader sees ``then(written,
...)`` where a chain goes on and ``all_of(...)`` where it waits for several:

- `resolved`: a future done already (an answer known at once);
- `then`: done with a function of another's result, or failed as it failed;
- `all_of`: done when every one of several is, failed with the first failure;
- `on_outcome`: call one function with the result, another with the failure;
- `pass_failure`: in a callback, carry a failure (or a cancel) on;
- `unawaited`: the callback of a write nobody awaits;
- `settled`: await a future whatever its outcome.

They sit on the lowest floor (`ledger`) because every package above uses them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["all_of", "on_outcome", "pass_failure", "resolved", "settled", "then", "unawaited"]

_T = TypeVar("_T")
_R = TypeVar("_R")


def resolved(value: _T) -> asyncio.Future[_T]:
    """A future done with ``value`` already."""
    future: asyncio.Future[_T] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future


def then(source: asyncio.Future[_T], result: Callable[[_T], _R]) -> asyncio.Future[_R]:
    """A future done with ``result(source's result)`` once ``source``
    succeeds, or failed (cancelled) as ``source`` fails (is cancelled).
    ``result`` runs in ``source``'s done callback."""
    target: asyncio.Future[_R] = asyncio.get_running_loop().create_future()

    def done(f: asyncio.Future[_T]) -> None:
        if not pass_failure(f, target) and not target.done():
            target.set_result(result(f.result()))

    source.add_done_callback(done)
    return target


def all_of(futures: Iterable[asyncio.Future[Any]]) -> asyncio.Future[None]:
    """Done when every one of ``futures`` is done; failed with the first
    failure (done at once if there are none)."""
    waiting = list(futures)
    target: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    left = len(waiting)
    if not left:
        target.set_result(None)
        return target

    def one_done(f: asyncio.Future[Any]) -> None:
        nonlocal left
        left -= 1
        if pass_failure(f, target) or target.done():  # (a later failure is retrieved too)
            return
        if left == 0:
            target.set_result(None)

    for future in waiting:
        future.add_done_callback(one_done)
    return target


def on_outcome(
    future: asyncio.Future[_T],
    answer: Callable[[_T], None],
    fail: Callable[[BaseException], None],
) -> None:
    """Once ``future`` is done: ``answer(result)``, or ``fail(error)``
    (`asyncio.CancelledError` if it was cancelled)."""

    def done(f: asyncio.Future[_T]) -> None:
        if f.cancelled():
            fail(asyncio.CancelledError())
        elif (error := f.exception()) is not None:
            fail(error)
        else:
            answer(f.result())

    future.add_done_callback(done)


def pass_failure(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> bool:
    """If ``source`` failed or was cancelled, fail or cancel ``target`` the
    same way (unless it is done already) and return True; False if
    ``source`` succeeded (what follows is the caller's). For callbacks that
    carry one future's outcome to another without a task."""
    if source.cancelled():
        if not target.done():
            target.cancel()
        return True
    error = source.exception()
    if error is None:
        return False
    if not target.done():
        target.set_exception(error)
    return True


def unawaited(f: asyncio.Future[Any]) -> None:
    """Done callback of a write nobody awaits: mark its error seen (a failed
    write stops the store, and whatever comes after it reports that)."""
    if not f.cancelled():
        f.exception()


async def settled(future: asyncio.Future[Any]) -> None:
    """Wait until ``future`` is done, whatever its outcome: ``asyncio.wait``
    for one future, without its sets and callbacks (on every END's path)."""
    if future.done():
        return
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: object) -> None:
        if not waiter.done():
            waiter.set_result(None)

    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        future.remove_done_callback(wake)
