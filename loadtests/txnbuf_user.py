"""A locust ``User`` that speaks txnbuf through the asyncio client.

Locust runs every user as a greenlet on gevent's hub, in a process that
gevent has monkey-patched; txnbuf's client is asyncio. The two meet here:

- One asyncio event loop per locust process runs on its own OS thread
  (`LoopThread`), started with the unpatched ``_thread.start_new_thread``
  (a patched ``threading.Thread`` would be one more greenlet). It is a
  uvloop loop where uvloop is installed: uvloop does its I/O through libuv,
  so neither gevent's patched ``socket`` nor its ``selectors`` are in the
  loop's path. Each user has its own `client.Client` (its own WebSocket)
  on that loop.
- A greenlet hands a coroutine to the loop with ``call_soon_threadsafe``
  and waits on a ``gevent.event.AsyncResult``; the hub runs the other
  greenlets meanwhile. When the coroutine ends, the loop thread has the
  result set through the hub's ``loop.run_callback_threadsafe``, so it is
  set on the hub's own thread. (``asyncio.run_coroutine_threadsafe`` is
  not used: its ``concurrent.futures.Future`` guards itself with a
  ``threading.Condition``, which in a patched process is a gevent lock
  that the loop thread would then take from a second OS thread.)
- A request's latency is timed on the loop thread, around the client call
  alone (``time.perf_counter``), and that is what locust records. The
  greenlet also times the round trip from its side; the difference, the
  bridge's own delay, is kept apart (``Recorder.bridge_ms``) and reported
  in the summary, so a run shows what the bridge added.

Every request fires exactly one ``events.request`` (locust's custom-client
pattern), with its latency and, if it failed, its exception. A
`workload.Recorder` keeps every latency too (``--summary-json``): locust's
own percentiles are whole milliseconds below 100 ms, too coarse for a
broker that answers in a fraction of one.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import gevent
from gevent import monkey
from gevent.event import AsyncResult
from locust import User, events
from workload import Recorder, new_event_loop

from client import Client

T = TypeVar("T")

REQUEST_TYPE = "txnbuf"


class LoopThread:
    """An asyncio event loop on its own OS thread, serving greenlets."""

    def __init__(self) -> None:
        self.loop = new_event_loop()
        self._hub = gevent.get_hub()
        start_new_thread = monkey.get_original("_thread", "start_new_thread")
        start_new_thread(self._run, ())

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, make: Callable[[], Awaitable[T]]) -> tuple[T, float]:
        """Run the coroutine ``make()`` on the loop while this greenlet
        waits. Returns its result and the seconds it took on the loop;
        raises what it raised (with the seconds in ``elapsed``)."""
        result: AsyncResult = AsyncResult()
        self.loop.call_soon_threadsafe(self._start, make, result)
        return result.get()  # type: ignore[no-any-return]

    def _start(self, make: Callable[[], Awaitable[T]], result: AsyncResult) -> None:
        task = self.loop.create_task(_timed(make))
        task.add_done_callback(functools.partial(self._finished, result))

    def _finished(self, result: AsyncResult, task: asyncio.Task[tuple[T, float]]) -> None:
        settle = self._hub.loop.run_callback_threadsafe
        if task.cancelled():
            settle(result.set_exception, asyncio.CancelledError())
        elif (exc := task.exception()) is not None:
            settle(result.set_exception, exc)
        else:
            settle(result.set, task.result())


async def _timed(make: Callable[[], Awaitable[T]]) -> tuple[T, float]:
    started = time.perf_counter()
    try:
        value = await make()
    except Exception as exc:
        exc.elapsed = time.perf_counter() - started  # type: ignore[attr-defined]
        raise
    return value, time.perf_counter() - started


_loop_thread: LoopThread | None = None


def loop_thread() -> LoopThread:
    """This process's loop thread (started on first use)."""
    global _loop_thread
    if _loop_thread is None:
        _loop_thread = LoopThread()
    return _loop_thread


recorder = Recorder()


@events.request.add_listener
def _record(
    request_type: str,
    name: str,
    response_time: float,
    exception: BaseException | None = None,
    **_: Any,
) -> None:
    recorder.add(request_type, name, response_time, exception is not None)


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--summary-json",
        default="",
        help="write requests/s and p50/p95/p99 per request (exact, in ms) to this file",
    )


@events.quitting.add_listener
def _write_summary(environment: Any, **_: Any) -> None:
    path = environment.parsed_options.summary_json if environment.parsed_options else ""
    if path:
        Path(path).write_text(json.dumps(recorder.summary(), indent=2) + "\n")


class TxnbufUser(User):
    """A user with its own txnbuf `Client` (``self.txnbuf``, connected in
    ``on_start``, closed in ``on_stop``) on the process's loop thread.

    ``self.request(name, make)`` runs one client operation as one locust
    request; ``self.call(make)`` runs one that is not timed (waiting for
    input); ``self.record(name, ms)`` records a latency measured otherwise.
    """

    abstract = True

    txnbuf: Client

    def __init__(self, environment: Any) -> None:
        super().__init__(environment)
        self._loop = loop_thread()

    def on_start(self) -> None:
        async def new_client() -> Client:  # (made on the loop it will run on)
            return Client(self.host)

        self.txnbuf = self.call(new_client)
        self.request("connect", self.txnbuf.connect)

    def on_stop(self) -> None:
        self.call(self.txnbuf.close)

    def call(self, make: Callable[[], Awaitable[T]]) -> T:
        return self._loop.call(make)[0]

    def request(self, name: str, make: Callable[[], Awaitable[T]]) -> T:
        """Run ``make()`` on the loop as the request ``name``: fires one
        request event with the loop-side latency and, on failure, the
        exception (then re-raised: the task stops there)."""
        started = time.perf_counter()
        try:
            value, elapsed = self._loop.call(make)
        except Exception as exc:
            elapsed = getattr(exc, "elapsed", time.perf_counter() - started)
            self.record(name, elapsed * 1000, exc)
            raise
        recorder.bridge_ms.append((time.perf_counter() - started - elapsed) * 1000)
        self.record(name, elapsed * 1000)
        return value

    def record(self, name: str, ms: float, exception: BaseException | None = None) -> None:
        self.environment.events.request.fire(
            request_type=REQUEST_TYPE,
            name=name,
            response_time=ms,
            response_length=0,
            exception=exception,
            context={},
        )
