"""Exactly-once windowed aggregation on Spark, with a watermark.

Reads JSON sensor readings (sensor, temperature, event time in ms) from a
txnbuf topic, counts and averages them per sensor in 5-second event-time
windows, and writes each window once it is complete (the watermark, 10
seconds behind the latest event seen, has passed its end; readings later
than that are dropped) as JSON to another topic, exactly once.

    txnbuf serve &
    .venv/bin/python examples/spark_windowed.py --checkpoint /tmp/txnbuf-ckpt/windowed \\
        --demo 600 --available-now

``--master spark://host:7077`` runs it on a cluster. Options: ``--help``.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines import job_parser, produce, run_query, sink, source, spark_session

READING = "sensor string, temp double, ts long"
QUERY = "spark_windowed"
WINDOW = "5 seconds"
WATERMARK = "10 seconds"
DEMO_START_MS = 1_800_000_000_000


def aggregate(stream: DataFrame) -> DataFrame:
    """key (sensor), value (JSON) of each complete window."""
    readings = (
        stream.select(F.from_json(F.col("value").cast("string"), READING).alias("r"))
        .select("r.*")
        .where(F.col("sensor").isNotNull() & F.col("ts").isNotNull())
        .withColumn("event_time", F.timestamp_millis("ts"))
        .withWatermark("event_time", WATERMARK)
    )
    windows = readings.groupBy(F.window("event_time", WINDOW), "sensor").agg(
        F.count("*").alias("readings"),
        F.round(F.avg("temp"), 2).alias("avg_temp"),
        F.max("temp").alias("max_temp"),
    )
    return windows.select(
        F.col("sensor").alias("key"),
        F.to_json(
            F.struct(
                F.date_format("window.start", "yyyy-MM-dd'T'HH:mm:ss").alias("window_start"),
                "sensor",
                "readings",
                "avg_temp",
                "max_temp",
            )
        ).alias("value"),
    )


def demo_readings(n: int) -> list[tuple[str | None, bytes]]:
    """``n`` readings of 4 sensors, 10 per second of event time, and one
    reading a minute later that moves the watermark past all of them."""
    out = []
    for i in range(n):
        reading = {"sensor": f"s-{i % 4}", "temp": 20 + (i % 13) / 2, "ts": DEMO_START_MS + i * 100}
        out.append((reading["sensor"], json.dumps(reading).encode()))
    late = {"sensor": "s-0", "temp": 20.0, "ts": DEMO_START_MS + n * 100 + 60_000}
    out.append(("s-0", json.dumps(late).encode()))
    return out


def main(argv: list[str] | None = None) -> int:
    args = job_parser(__doc__.splitlines()[0], "readings", "readings-windows").parse_args(argv)
    if args.demo:
        produce(args.service_url, args.input, demo_readings(args.demo))
    spark = spark_session(args.master, QUERY)
    query = sink(aggregate(source(spark, args, QUERY)), args, QUERY, output_mode="append")
    run_query(query, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
