"""Exactly-once stream-static join on Spark: orders enriched with customers.

Reads JSON orders from a txnbuf topic and joins each with its customer from
a static table (read once, at the start, from the topic ``customers`` with
``spark.read.format("txnbuf")``: the latest record of each customer), then
writes the joined orders as JSON to another topic, exactly once. Orders of
unknown customers go out with ``"tier": "unknown"``.

    txnbuf serve &
    .venv/bin/python examples/spark_join.py --checkpoint /tmp/txnbuf-ckpt/join \\
        --demo 1000 --available-now

``--master spark://host:7077`` runs it on a cluster. Options: ``--help``.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from pipelines import job_parser, produce, run_query, sink, source, spark_session

ORDER = "order_id string, customer string, amount double"
CUSTOMER = "customer string, name string, tier string, country string"
QUERY = "spark_join"


def customers(spark: Any, service_url: str, topic: str) -> DataFrame:
    """The static table: the latest record of each customer in ``topic``."""
    raw = (
        spark.read.format("txnbuf").option("service_url", service_url).option("topic", topic).load()
    )
    parsed = raw.select(
        F.from_json(F.col("value").cast("string"), CUSTOMER).alias("c"), "message_id"
    ).select("c.*", "message_id")
    latest = Window.partitionBy("customer").orderBy(F.col("message_id").desc())
    return (
        parsed.where(F.col("customer").isNotNull())
        .withColumn("n", F.row_number().over(latest))
        .where("n = 1")
        .drop("n", "message_id")
    )


def join(stream: DataFrame, table: DataFrame) -> DataFrame:
    """key, value (JSON) of each order with its customer's record."""
    orders = stream.select(F.from_json(F.col("value").cast("string"), ORDER).alias("o")).select(
        "o.*"
    )
    joined = orders.join(F.broadcast(table), "customer", "left").withColumn(
        "tier", F.coalesce("tier", F.lit("unknown"))
    )
    return joined.select(
        F.col("customer").alias("key"),
        F.to_json(F.struct("order_id", "customer", "amount", "name", "tier", "country")).alias(
            "value"
        ),
    )


def demo(n: int) -> tuple[list[tuple[str | None, bytes]], list[tuple[str | None, bytes]]]:
    """Six known customers (c-0 .. c-5) and ``n`` orders of seven (c-6 unknown)."""
    tiers = ["gold", "silver", "bronze"]
    table = [
        (
            f"c-{i}",
            json.dumps(
                {
                    "customer": f"c-{i}",
                    "name": f"Customer {i}",
                    "tier": tiers[i % 3],
                    "country": "DE",
                }
            ).encode(),
        )
        for i in range(6)
    ]
    orders = [
        (
            f"c-{i % 7}",
            json.dumps({"order_id": f"o-{i}", "customer": f"c-{i % 7}", "amount": i}).encode(),
        )
        for i in range(n)
    ]
    return table, orders


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0], "orders", "orders-joined")
    parser.add_argument("--customers", default="customers", help="the static table's topic")
    args = parser.parse_args(argv)
    if args.demo:
        table, orders = demo(args.demo)
        produce(args.service_url, args.customers, table)
        produce(args.service_url, args.input, orders)
    spark = spark_session(args.master, QUERY)
    static = customers(spark, args.service_url, args.customers).cache()
    query = sink(join(source(spark, args, QUERY), static), args, QUERY)
    run_query(query, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
