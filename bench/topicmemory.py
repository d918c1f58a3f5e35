"""Python memory per topic on one broker: a topic not loaded, and a topic
loaded and idle, traced with tracemalloc (in process, through the client).

    python -m bench.topicmemory [--topics 10000] [--clients 4]
                                [--breakdown 25] [--baseline DIR]

The topics are made as `bench.scale` makes them: each gets one producer,
one subscription (``earliest``) and one message, received and left
unacknowledged, producer and consumer closed; then the broker closes. A
broker (and the client) run in this process, on a real store, over the
loopback; then:

- not loaded: the broker is opened on that data (and serves) without
  loading any topic (``preload=False``); the memory it holds, less what a
  broker opened on an empty directory holds, per topic;
- loaded, idle: every topic is read again over the wire (its subscription
  subscribed, its message received and acknowledged, the consumer
  closed, every client closed); the memory the broker holds then, less
  what the empty one holds, per topic: a topic with one partition, one
  subscription without a consumer, one message, after it was read. "load
  adds" is the difference of the two.

Both are measured settled: the dispatch tasks ended and the counters'
record written (as the periodic write does).

``--breakdown N``: also the N source lines that hold the most of what
loading a topic adds (tracemalloc, by file:line, bytes and blocks per topic, with
``--frames`` frames of call stack each) and the N types with the most
objects per topic (``gc.get_objects``: containers and objects the
collector tracks; their shallow size by ``sys.getsizeof``).

Each side runs in a fresh process; with ``--baseline [NAME=]DIR`` (as many
as wanted) another checkout runs the same in its own code. Traced memory does not drift with this
machine's speed; RSS (`bench.scale`) adds the allocator's overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import sys
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

from bench._progress import Runs, legend
from bench._results import recorded

ROOT = Path(__file__).resolve().parent.parent


def _type_census() -> collections.Counter[str]:
    """Objects the collector tracks, by type: counts under the name, shallow
    bytes under ``name + " B"``."""
    out: collections.Counter[str] = collections.Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        name = f"{kind.__module__}.{kind.__qualname__}"
        out[name] += 1
        out[name + " B"] += sys.getsizeof(obj)
    return out


async def _serve(broker: Any) -> tuple[Any, str]:
    from aiohttp import web

    from broker import make_app

    runner = web.AppRunner(make_app(broker), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def _settle(broker: Any) -> None:
    """Let what the last requests left run out (dispatch tasks, lazy writes),
    and write the counters' record as the periodic write would."""
    for _ in range(3):
        await asyncio.sleep(0.1)
    await broker.metrics.write_totals()
    gc.collect()


def _traced() -> int:
    return tracemalloc.get_traced_memory()[0]


async def _held_by_broker(data: Path) -> int:
    """Traced memory held by a broker opened (and serving) on ``data``, settled."""
    from broker import Broker

    gc.collect()
    before = _traced()
    broker = await Broker.open(data, preload=False, unload_after=None)
    runner, _ = await _serve(broker)
    try:
        await _settle(broker)
        return _traced() - before
    finally:
        await broker.close()
        await runner.cleanup()


async def one_side(topics: int, clients: int, breakdown: int, frames: int) -> dict[str, Any]:
    """Run in the checkout on ``sys.path``; the figures as a dict."""
    from bench.scale import read_again, set_up_topics
    from broker import Broker

    names = [f"t{i}" for i in range(topics)]
    with tempfile.TemporaryDirectory() as tmp:
        data, empty = Path(tmp) / "data", Path(tmp) / "empty"
        broker = await Broker.open(data, preload=False, unload_after=None)
        runner, url = await _serve(broker)
        try:
            await set_up_topics(url, names, clients)
        finally:
            await broker.close()
            await runner.cleanup()

        tracemalloc.start(frames)
        await _held_by_broker(empty)  # (once first: what the first open caches stays)
        held_empty = await _held_by_broker(empty)
        gc.collect()
        before = _traced()
        broker = await Broker.open(data, preload=False, unload_after=None)
        runner, url = await _serve(broker)
        try:
            await _settle(broker)
            held_unloaded = _traced() - before
            census0, census_bytes = None, 0
            if breakdown:
                mark = _traced()
                census0 = _type_census()
                census_bytes = _traced() - mark
            snap0 = tracemalloc.take_snapshot() if breakdown else None
            await read_again(url, names, clients)
            await _settle(broker)
            if broker.topics.loaded_count() != topics:
                raise SystemExit(f"{broker.topics.loaded_count()} of {topics} topics loaded")
            held_loaded = _traced() - before - census_bytes
            lines: list[str] = []
            if snap0 is not None and census0 is not None:
                lines = _breakdown(snap0, census0, topics, breakdown)
        finally:
            await broker.close()
            await runner.cleanup()
            tracemalloc.stop()
    return {
        "unloaded": (held_unloaded - held_empty) / topics,
        "loaded": (held_loaded - held_empty) / topics,
        "breakdown": lines,
    }


def _breakdown(
    snap0: tracemalloc.Snapshot, census0: collections.Counter[str], topics: int, top: int
) -> list[str]:
    snap1 = tracemalloc.take_snapshot()
    keep = [tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, __file__)]
    diffs = snap1.filter_traces(keep).compare_to(snap0.filter_traces(keep), "traceback")
    diffs.sort(key=lambda d: -d.size_diff)
    lines = ["by source line (bytes and blocks held per topic; innermost frame first):"]
    for d in diffs[:top]:
        where = " <- ".join(f"{_short(f.filename)}:{f.lineno}" for f in reversed(list(d.traceback)))
        lines.append(f"  {d.size_diff / topics:8.1f} B {d.count_diff / topics:6.2f}  {where}")
    census1 = _type_census()
    lines.append("by type (objects the collector tracks, per topic; shallow bytes):")
    grown = [
        (name, (census1[name] - census0[name]) / topics,
         (census1[name + " B"] - census0[name + " B"]) / topics)
        for name in census1
        if not name.endswith(" B")
    ]  # fmt: skip
    grown.sort(key=lambda g: -g[2])
    for name, count, size in grown[:top]:
        lines.append(f"  {count:6.2f} x {name}: {size:,.1f} B")
    return lines


def _short(filename: str) -> str:
    """``filename`` from the deepest directory of the path that holds it."""
    roots = [r.rstrip("/") + "/" for r in sys.path if r]
    found = [r for r in roots if filename.startswith(r)]
    return filename[len(max(found, key=len)) :] if found else filename


def run_side(checkout: Path, args: argparse.Namespace) -> dict[str, Any]:
    """One side in a fresh process of ``checkout``'s code."""
    from bench.txnpath import run_in_checkout

    side_args = ["--one-side", "--topics", str(args.topics), "--clients", str(args.clients),
                 "--breakdown", str(args.breakdown), "--frames", str(args.frames)]  # fmt: skip
    return run_in_checkout(__file__, checkout, side_args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--clients", type=int, default=4, help="connections that make and read")
    parser.add_argument("--breakdown", type=int, default=0, help="top N lines and types")
    parser.add_argument("--frames", type=int, default=1, help="call stack frames per line")
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        help="another checkout to compare with, DIR or NAME=DIR (repeatable)",
    )
    parser.add_argument("--one-side", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.topics < 1:
        parser.error(f"--topics must be positive, got {args.topics}")
    if args.one_side:
        result = asyncio.run(one_side(args.topics, args.clients, args.breakdown, args.frames))
        print(json.dumps(result))
        return
    sides: list[tuple[str, Path]] = [("this", ROOT)]
    for i, given in enumerate(args.baseline):
        name, _, where = given.rpartition("=")
        name = name or ("baseline" if i == 0 else f"baseline{i + 1}")
        sides.append((name, Path(where).resolve()))
    rows = []
    with Runs(len(sides), "topicmemory") as runs:
        for name, checkout in sides:
            runs.start(f"{name}: {args.topics:,} topics")
            rows.append((name, run_side(checkout, args)))
            runs.done()
    print()
    print(f"Python memory per topic, {args.topics:,} topics (one partition, one subscription, "
          "one message)")  # fmt: skip
    w = max(8, *(len(name) for name, _ in rows))
    print(f"{'side':>{w}} {'not loaded B':>13} {'loaded idle B':>14} {'load adds B':>12}")
    for name, r in rows:
        print(f"{name:>{w}} {r['unloaded']:>13,.0f} {r['loaded']:>14,.0f}"
              f" {r['loaded'] - r['unloaded']:>12,.0f}")  # fmt: skip
    for name, r in rows:
        if r["breakdown"]:
            print(f"\n{name}: where a loaded idle topic's bytes are")
            print("\n".join(r["breakdown"]))
    legend(
        "not loaded B: traced memory of a broker opened on the topics (none loaded), less "
        "one opened on an empty directory, per topic",
        "loaded idle B: the same once every topic was read again over the wire "
        "(subscribed, received, acknowledged, closed): what a loaded idle topic costs",
        "load adds B: loaded idle less not loaded",
    )


if __name__ == "__main__":
    if "--one-side" in sys.argv:  # (a run inside the benchmark: its caller records the figures)
        main()
    else:
        with recorded("topicmemory", " ".join(["python -m bench.topicmemory", *sys.argv[1:]])):
            main()
