"""Exactly-once stateless transform on Spark: orders in, enriched orders out.

Reads JSON orders from a txnbuf topic, parses them, drops the invalid ones
(no id, an amount not above 0, an unknown currency), adds the amount in
euros and a size, and writes them as JSON (keyed by customer) to another
topic, exactly once: each valid order appears once in the output, whatever
crashes and restarts in between.

    txnbuf serve &
    .venv/bin/python examples/spark_transform.py --checkpoint /tmp/txnbuf-ckpt/transform \\
        --demo 1000 --available-now

``--master spark://host:7077`` runs it on a cluster (``--checkpoint`` then on
a path every node of the driver reaches, ``--service-url`` an address the
executors reach). Options: ``--help``.
"""

from __future__ import annotations

import json
import sys

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from pipelines import job_parser, produce, run_query, sink, source, spark_session

ORDER = "order_id string, customer string, amount double, currency string"
RATES = {"EUR": 1.0, "USD": 0.92, "GBP": 1.17, "CHF": 1.05}  # to euros
QUERY = "spark_transform"
FIELDS = ["order_id", "customer", "amount", "currency", "amount_eur", "size", "source_id"]


def rates() -> Column:
    return F.create_map(*[F.lit(x) for pair in RATES.items() for x in pair])


def transform(stream: DataFrame) -> DataFrame:
    """key, value (JSON) of each valid order, enriched."""
    orders = stream.select(
        F.from_json(F.col("value").cast("string"), ORDER).alias("o"), "message_id"
    ).select("o.*", F.col("message_id").alias("source_id"))
    valid = orders.where(
        F.col("order_id").isNotNull() & (F.col("amount") > 0) & F.col("currency").isin(list(RATES))
    )
    enriched = valid.withColumn(
        "amount_eur", F.round(F.col("amount") * rates()[F.col("currency")], 2)
    ).withColumn("size", F.when(F.col("amount_eur") >= 100, "large").otherwise("small"))
    return enriched.select(
        F.col("customer").alias("key"),
        F.to_json(
            F.struct(
                "order_id", "customer", "amount", "currency", "amount_eur", "size", "source_id"
            )
        ).alias("value"),
    )


def demo_orders(n: int) -> list[tuple[str | None, bytes]]:
    """``n`` orders, one in ten of them invalid."""
    out = []
    currencies = list(RATES)
    for i in range(n):
        order = {
            "order_id": f"o-{i}",
            "customer": f"c-{i % 7}",
            "amount": -1.0 if i % 10 == 9 else float(i % 150) + 0.5,
            "currency": currencies[i % len(currencies)],
        }
        out.append((order["customer"], json.dumps(order).encode()))
    return out


def main(argv: list[str] | None = None) -> int:
    args = job_parser(__doc__.splitlines()[0], "orders", "orders-enriched").parse_args(argv)
    if args.demo:
        produce(args.service_url, args.input, demo_orders(args.demo))
    spark = spark_session(args.master, QUERY)
    query = sink(transform(source(spark, args, QUERY)), args, QUERY)
    run_query(query, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
