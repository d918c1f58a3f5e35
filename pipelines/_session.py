"""A Spark session ready for ``format("txnbuf")``, local or on a cluster."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["register", "spark_session"]


def register(spark: Any) -> None:
    """Register ``format("txnbuf")`` with ``spark`` (a SparkSession)."""
    from pipelines._datasource import TxnbufDataSource

    spark.dataSource.register(TxnbufDataSource)


def spark_session(
    master: str = "local[2]", app_name: str = "txnbuf", conf: dict[str, str] | None = None
) -> Any:
    """A SparkSession on ``master`` (``local[N]``, ``spark://host:port``, ...)
    with ``format("txnbuf")`` registered.

    Spark's Python workers run ``PYSPARK_PYTHON``; unless it is set, this
    sets it to the running interpreter, which must have txnbuf and pyspark
    installed (on a cluster: the same path on every worker, or set
    ``PYSPARK_PYTHON`` / ``spark.pyspark.python`` to the workers' Python).
    The driver's JIT stops at C1 (``-XX:TieredStopAtLevel=1``): a session
    starts in about half the time, and these jobs spend their time in
    Python."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.driver.extraJavaOptions", "-XX:TieredStopAtLevel=1")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
