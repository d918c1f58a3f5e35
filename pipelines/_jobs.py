"""What the ``examples/spark_*.py`` jobs share: their command line, the
txnbuf source and sink with its options, running the query, seeding demo
input. A job runs the same on ``--master local[2]`` and on
``--master spark://host:7077``: the broker is ``--service-url`` (an address
every executor reaches), the checkpoint any Hadoop-compatible path the
driver reaches (``file:`` on one machine, ``hdfs://`` or a shared mount on
a cluster)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from client import Client

__all__ = ["job_parser", "produce", "run_query", "sink", "source"]

log = logging.getLogger("pipelines")


def job_parser(description: str, input_topic: str, output_topic: str) -> argparse.ArgumentParser:
    """The options every example job takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--service-url", default="http://127.0.0.1:6650", help="the broker")
    parser.add_argument("--master", default="local[2]", help="local[N] or spark://host:port")
    parser.add_argument("--input", default=input_topic, help="the topic read")
    parser.add_argument("--output", default=output_topic, help="the topic written")
    parser.add_argument(
        "--checkpoint",
        required=True,
        help="the query's checkpoint: a path or URI the driver reaches (hdfs://... on a cluster)",
    )
    parser.add_argument(
        "--subscription", help="the source's durable subscription (default: the query's name)"
    )
    parser.add_argument("--starting-offsets", choices=("earliest", "latest"), default="earliest")
    parser.add_argument("--max-messages-per-batch", type=int, help="admission control")
    parser.add_argument("--trigger-ms", type=int, default=500, help="micro-batch interval")
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="process what the input holds, then stop (Trigger.AvailableNow)",
    )
    parser.add_argument(
        "--timeout", type=float, help="stop after this many seconds (default: run until Ctrl-C)"
    )
    parser.add_argument(
        "--demo", type=int, default=0, metavar="N", help="first send N sample input messages"
    )
    return parser


def source(spark: Any, args: argparse.Namespace, query_name: str, topic: str | None = None) -> Any:
    """The txnbuf stream of ``args.input`` (or ``topic``), its
    subscription named after the query unless ``--subscription``."""
    reader = (
        spark.readStream.format("txnbuf")
        .option("service_url", args.service_url)
        .option("topic", topic or args.input)
        .option("subscription", args.subscription or query_name)
        .option("startingOffsets", args.starting_offsets)
    )
    if args.max_messages_per_batch:
        reader = reader.option("maxMessagesPerBatch", str(args.max_messages_per_batch))
    return reader.load()


def sink(df: Any, args: argparse.Namespace, query_name: str, output_mode: str = "append") -> Any:
    """Start writing ``df`` (columns ``key``, ``value``) to ``args.output``,
    exactly once."""
    writer = (
        df.writeStream.format("txnbuf")
        .queryName(query_name)
        .outputMode(output_mode)
        .option("service_url", args.service_url)
        .option("topic", args.output)
        .option("checkpointLocation", args.checkpoint)
    )
    if args.available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    return writer.start()


def run_query(query: Any, args: argparse.Namespace) -> None:
    """Wait for ``query``: until it ends (``--available-now``), ``--timeout``
    passes, or SIGTERM / Ctrl-C, then stop it. Raises what the query failed with."""

    def stop(_signum: int, _frame: object) -> None:
        query.stop()

    signal.signal(signal.SIGTERM, stop)
    try:
        query.awaitTermination(args.timeout)
    except KeyboardInterrupt:
        pass
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise RuntimeError(f"query {query.name} failed: {query.exception()}")


def produce(url: str, topic: str, messages: Sequence[tuple[str | None, bytes]]) -> None:
    """Send ``(key, value)`` messages to ``topic`` (the demo's input)."""

    async def send() -> None:
        async with Client(url) as client:
            producer = await client.create_producer(topic)
            await asyncio.gather(*(producer.send(value, key=key) for key, value in messages))

    asyncio.run(send())
    print(f"sent {len(messages)} messages to {topic!r}", file=sys.stderr)
