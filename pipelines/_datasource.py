"""``format("txnbuf")``: the Python data source that Spark looks up by name."""

from __future__ import annotations

from pipelines._options import SinkOptions, SourceOptions
from pipelines._sink import TxnbufBatchWriter, TxnbufStreamWriter
from pipelines._source import SCHEMA, TxnbufBatchReader, TxnbufStreamReader, source_schema

try:
    from pyspark.sql.datasource import DataSource
    from pyspark.sql.types import StructType
except ImportError as exc:  # pragma: no cover
    raise ImportError("pipelines needs pyspark and pyarrow: pip install 'txnbuf[spark]'") from exc

__all__ = ["TxnbufDataSource"]


class TxnbufDataSource(DataSource):
    """Register with ``spark.dataSource.register(TxnbufDataSource)`` (or
    `pipelines.register`); then ``spark.readStream.format("txnbuf")``,
    ``df.writeStream.format("txnbuf")``, ``spark.read`` and ``df.write``.
    Options are checked when the reader or writer is made: a missing or
    bad one raises `pipelines.OptionError` naming it."""

    @classmethod
    def name(cls) -> str:
        return "txnbuf"

    def schema(self) -> str:
        return SCHEMA

    def _source_schema(self, schema: StructType) -> StructType:
        expected = source_schema()
        if [(f.name, f.dataType) for f in schema.fields] != [
            (f.name, f.dataType) for f in expected.fields
        ]:
            raise ValueError(
                f'format("txnbuf") reads the columns {SCHEMA}; a schema of its own is not '
                f"supported (got {schema.simpleString()})"
            )
        return schema

    def streamReader(self, schema: StructType) -> TxnbufStreamReader:
        return TxnbufStreamReader(
            SourceOptions.parse(self.options, streaming=True), self._source_schema(schema)
        )

    def reader(self, schema: StructType) -> TxnbufBatchReader:
        return TxnbufBatchReader(
            SourceOptions.parse(self.options, streaming=False), self._source_schema(schema)
        )

    def streamWriter(self, schema: StructType, overwrite: bool) -> TxnbufStreamWriter:
        return TxnbufStreamWriter(SinkOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> TxnbufBatchWriter:
        return TxnbufBatchWriter(SinkOptions.parse(self.options), schema)
