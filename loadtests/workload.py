"""The txnbuf work of the load test, as plain asyncio (no locust, no gevent).

`locustfile.py` runs these coroutines through the gevent/asyncio bridge of
`txnbuf_user.py`; `baseline.py` runs the same ones on a bare asyncio loop,
so that the two runs' latencies can be compared. `Recorder` keeps every
latency of a run and summarizes it (exact percentiles, in ms).
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import defaultdict
from collections.abc import Coroutine
from typing import Any, TypeVar

from client import Client, Consumer, Message, Producer
from client.errors import OperationTimeoutError

T = TypeVar("T")

PARTITIONS = 4
PAYLOAD = b"x" * 100
TXN_BATCH = 10  # messages per consume-transform-produce transaction
ACK_BATCH = 100  # at most this many messages acknowledged together
IDLE = 2.0  # seconds a consumer waits for input before giving the task up


class Names:
    """The topics and subscriptions of a run, all starting with ``prefix``."""

    def __init__(self, prefix: str) -> None:
        self.source = f"{prefix}-in"
        self.sink = f"{prefix}-out"
        self.ack_subscription = f"{prefix}-ack"
        self.ctp_subscription = f"{prefix}-ctp"


def create_topics(url: str, names: Names) -> None:
    """Create (or grow) the run's topics to `PARTITIONS` partitions."""
    for topic in (names.source, names.sink):
        request = urllib.request.Request(
            f"{url}/admin/v1/topics/{topic}",
            data=json.dumps({"partitions": PARTITIONS}).encode(),
            method="PUT",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            answer.read()


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop where uvloop is installed, else asyncio's own."""
    try:
        import uvloop
    except ImportError:  # (no uvloop on this platform)
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(main)


def stamped() -> dict[str, str]:
    """Properties carrying the send time, read back by `delivered_ms`."""
    return {"sent_ns": str(time.time_ns())}


async def send_one(producer: Producer) -> None:
    await producer.send(PAYLOAD, properties=stamped())


async def send_100(producer: Producer) -> None:
    props = stamped()
    await asyncio.gather(*(producer.send(PAYLOAD, properties=props) for _ in range(100)))


async def subscribe(client: Client, topic: str, subscription: str) -> Consumer:
    return await client.subscribe(topic, subscription, "shared", initial_position="earliest")


async def read_batch(consumer: Consumer, size: int, idle: float = IDLE) -> list[Message]:
    """Up to ``size`` messages: the first may take ``idle`` seconds to come
    (if none comes, an empty list), the rest only if they are already here."""
    try:
        batch = [await consumer.receive(timeout=idle)]
    except OperationTimeoutError:
        return []
    while len(batch) < size:
        try:
            batch.append(await consumer.receive(timeout=0))
        except OperationTimeoutError:
            break
    return batch


def delivered_ms(batch: list[Message]) -> list[float]:
    """Each message's time from its send to now (this machine's clock)."""
    now = time.time_ns()
    return [(now - int(m.properties["sent_ns"])) / 1e6 for m in batch]


async def consume_transform_produce(
    client: Client, consumer: Consumer, producer: Producer, batch: list[Message]
) -> float:
    """Send the batch upper-cased and acknowledge it, in one transaction;
    returns the seconds its commit took."""
    async with client.transaction(timeout=10) as txn:
        await asyncio.gather(
            *(producer.send(m.value.upper(), key=m.key, txn=txn) for m in batch),
            consumer.acknowledge(batch, txn=txn),
        )
        committing = time.perf_counter()
    return time.perf_counter() - committing


class Recorder:
    """Every latency of a run by (request type, name), and the failures."""

    def __init__(self) -> None:
        self.latencies_ms: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.failures: dict[tuple[str, str], int] = defaultdict(int)
        self.bridge_ms: list[float] = []  # what the gevent/asyncio bridge added
        self.first: float | None = None
        self.last: float | None = None

    def add(self, kind: str, name: str, ms: float, failed: bool = False) -> None:
        now = time.time()
        if self.first is None:
            self.first = now - ms / 1000
        self.last = now
        self.latencies_ms[(kind, name)].append(ms)
        if failed:
            self.failures[(kind, name)] += 1

    def summary(self) -> dict[str, Any]:
        """Requests, failures, requests/s and latency percentiles (ms) per
        request; the rate is over the span from the first request to the last."""
        span = self.last - self.first if self.first is not None and self.last is not None else 0.0
        rows = [
            {
                "type": kind,
                "name": name,
                "requests": len(values),
                "failures": self.failures[(kind, name)],
                "rps": len(values) / span if span > 0 else 0.0,
                **percentiles(values),
            }
            for (kind, name), values in sorted(self.latencies_ms.items())
        ]
        return {"seconds": span, "requests": rows, "bridge_ms": percentiles(self.bridge_ms)}


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99), "max": ordered[-1]}


def table(summary: dict[str, Any]) -> str:
    """The summary as a text table."""
    lines = [
        f"{'type':7} {'name':36} {'requests':>9} {'fails':>6} {'req/s':>9} "
        f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8}"
    ]

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    for row in summary["requests"]:
        lines.append(
            f"{row['type']:7} {row['name']:36} {row['requests']:>9} {row['failures']:>6} "
            f"{row['rps']:>9.1f} {ms(row['p50']):>8} {ms(row['p95']):>8} {ms(row['p99']):>8}"
        )
    bridge = summary.get("bridge_ms") or {}
    if bridge.get("p50") is not None:
        lines.append(
            f"gevent/asyncio bridge, added to each txnbuf request (not in the figures above): "
            f"p50 {ms(bridge['p50'])} ms, p95 {ms(bridge['p95'])} ms, p99 {ms(bridge['p99'])} ms"
        )
    return "\n".join(lines)
