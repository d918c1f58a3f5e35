"""The locust run's txnbuf work without locust: the same `workload` coroutines,
as many producing, consume-and-ack and consume-transform-produce users,
on one bare asyncio (uvloop) loop in a process without gevent.

    .venv/bin/python loadtests/baseline.py --host http://127.0.0.1:6650 --users 2 --seconds 30

Its latencies are what the client itself sees; set beside a locust run
against the same broker (``run.py --baseline`` runs both), they show what
locust and the gevent/asyncio bridge add to the latencies locust records.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import workload
from workload import Names, Recorder

from client import Client

T = TypeVar("T")


class User:
    """One user: its own client, recording each request like the locust users."""

    def __init__(self, url: str, names: Names, recorder: Recorder) -> None:
        self.client = Client(url)
        self.names = names
        self.recorder = recorder

    async def request(self, name: str, make: Callable[[], Awaitable[T]]) -> T:
        started = time.perf_counter()
        try:
            value = await make()
        except Exception:
            self.recorder.add("txnbuf", name, (time.perf_counter() - started) * 1000, True)
            raise
        self.recorder.add("txnbuf", name, (time.perf_counter() - started) * 1000)
        return value

    async def produce(self, until: float) -> None:
        producer = await self.request(
            "create producer", lambda: self.client.create_producer(self.names.source)
        )
        while time.monotonic() < until:  # the locust task weights: send 4, send x100 1
            if random.random() < 0.8:
                await self.request("send", lambda: workload.send_one(producer))
            else:
                await self.request("send x100", lambda: workload.send_100(producer))

    async def consume_and_ack(self, until: float) -> None:
        names = self.names
        consumer = await self.request(
            "subscribe",
            lambda: workload.subscribe(self.client, names.source, names.ack_subscription),
        )
        while time.monotonic() < until:
            batch = await workload.read_batch(consumer, workload.ACK_BATCH)
            if not batch:
                continue
            for ms in workload.delivered_ms(batch):
                self.recorder.add("txnbuf", "deliver", ms)
            await self.request("ack", lambda batch=batch: consumer.acknowledge(batch))

    async def consume_transform_produce(self, until: float) -> None:
        names = self.names
        consumer = await self.request(
            "subscribe",
            lambda: workload.subscribe(self.client, names.source, names.ctp_subscription),
        )
        producer = await self.request(
            "create producer", lambda: self.client.create_producer(names.sink)
        )
        while time.monotonic() < until:
            batch = await workload.read_batch(consumer, workload.TXN_BATCH)
            if not batch:
                continue
            commit_seconds = await self.request(
                "transaction",
                lambda batch=batch: workload.consume_transform_produce(
                    self.client, consumer, producer, batch
                ),
            )
            self.recorder.add("txnbuf", "commit", commit_seconds * 1000)


async def main(args: argparse.Namespace) -> Recorder:
    names, recorder = Names(args.prefix), Recorder()
    workload.create_topics(args.host, names)
    until = time.monotonic() + args.seconds
    users = [User(args.host, names, recorder) for _ in range(3 * args.users)]
    for user in users:
        await user.request("connect", user.client.connect)
    roles = (User.produce, User.consume_and_ack, User.consume_transform_produce)
    try:
        await asyncio.gather(*(roles[i % 3](user, until) for i, user in enumerate(users)))
    finally:
        for user in users:
            await user.client.close()
    return recorder


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="http://127.0.0.1:6650")
    parser.add_argument("--users", type=int, default=1, help="users of each of the three kinds")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--prefix", default="baseline")
    parser.add_argument("--summary-json", default="")
    args = parser.parse_args()
    recorder = workload.run_loop(main(args))
    summary = recorder.summary()
    print(workload.table(summary))
    if args.summary_json:
        Path(args.summary_json).write_text(json.dumps(summary, indent=2) + "\n")
