"""The asyncio client from Spark's synchronous callbacks.

Spark calls a data source from plain threads (the driver's source and
commit processes, the executors' Python workers), and a Python worker is
reused for many tasks. Each process gets one event loop in a daemon thread
and keeps one `client.Client` per broker URL and token on it, so a reused worker or
the long-lived source process connects once. `run` submits a coroutine to
that loop and waits for its result. A process forked after the loop was
started (Spark's workers are forked from a daemon) starts its own.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import threading
from collections.abc import Awaitable, Callable
from typing import TypeVar

from client import Client

__all__ = ["close_all", "run", "with_client"]

T = TypeVar("T")
OPERATION_TIMEOUT = 60.0  # seconds a request to the broker may take


class _Loop:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clients: dict[tuple[str, str | None], Client] = {}
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="txnbuf-pipelines", daemon=True
        )
        self.thread.start()

    async def client(self, url: str, token: str | None) -> Client:
        client = self.clients.get((url, token))
        if client is None or client._closed:
            client = Client(url, operation_timeout=OPERATION_TIMEOUT, token=token)
            self.clients[(url, token)] = client
            await client.connect()
        return client

    def close(self) -> None:
        async def close_clients() -> None:
            await asyncio.gather(
                *(c.close() for c in self.clients.values()), return_exceptions=True
            )
            self.clients.clear()

        if self.thread.is_alive():
            try:
                asyncio.run_coroutine_threadsafe(close_clients(), self.loop).result(5)
            except Exception:  # (closing on the way out: nothing left to tell)
                pass
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(5)
        if not self.thread.is_alive():
            self.loop.close()


_loops: dict[int, _Loop] = {}
_lock = threading.Lock()


def _current() -> _Loop:
    pid = os.getpid()
    with _lock:
        found = _loops.get(pid)
        if found is None:
            found = _loops[pid] = _Loop()
        return found


def run(coro: Awaitable[T], timeout: float | None = None) -> T:
    """Run ``coro`` on this process's client loop; its result (or exception)."""
    future = asyncio.run_coroutine_threadsafe(_wrap(coro), _current().loop)
    return future.result(timeout)


async def _wrap(coro: Awaitable[T]) -> T:
    return await coro


def with_client(url: str, work: Callable[[Client], Awaitable[T]], token: str | None = None) -> T:
    """``work(client)`` on this process's client of ``url`` (authenticated
    with ``token``; None: ``TXNBUF_TOKEN``, if set), run to its end."""
    loop = _current()

    async def go() -> T:
        return await work(await loop.client(url, token))

    return run(go())


def close_all() -> None:
    """Close this process's clients and stop its loop."""
    with _lock:
        found = _loops.pop(os.getpid(), None)
    if found is not None:
        found.close()


atexit.register(close_all)
