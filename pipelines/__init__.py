"""Exactly-once consume-transform-produce on Spark: ``format("txnbuf")``.

::

    from pipelines import spark_session

    spark = spark_session("local[2]")            # or "spark://host:7077"
    src = (spark.readStream.format("txnbuf")
           .option("service_url", "http://127.0.0.1:6650").option("topic", "in").load())
    (src.selectExpr("key", "upper(cast(value as string)) as value")
        .writeStream.format("txnbuf")
        .option("service_url", "http://127.0.0.1:6650").option("topic", "out")
        .option("checkpointLocation", "/tmp/ckpt").start())

The source reads committed messages by position (`pipelines._source`), the
sink writes each batch as one group of prepared transactions committed
once (`pipelines._sink`); docs/spark.md says how and why. Needs the spark
extra (pyspark, pyarrow); ``pipelines`` uses ``client`` only.
"""

from pipelines._datasource import TxnbufDataSource
from pipelines._jobs import job_parser, produce, run_query, sink, source
from pipelines._options import OptionError
from pipelines._session import register, spark_session
from pipelines._sink import SinkCommit, batch_tag
from pipelines._source import SCHEMA

__all__ = [
    "SCHEMA",
    "OptionError",
    "SinkCommit",
    "TxnbufDataSource",
    "batch_tag",
    "job_parser",
    "produce",
    "register",
    "run_query",
    "sink",
    "source",
    "spark_session",
]
