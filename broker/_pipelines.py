"""The commands pipelines (`pipelines`, Spark's source and sink) use, for a
connection's dispatch table: reading partitions by position
(`broker._reader`) and transaction groups (`broker._groups`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from broker._groups import group_handlers
from broker._reader import reader_handlers
from proto import txnbuf_pb2 as pb

if TYPE_CHECKING:
    from broker._connection import Connection

__all__ = ["pipeline_handlers"]


def pipeline_handlers(conn: Connection) -> dict[int, Callable[[pb.BaseCommand], None]]:
    """READ_ENTRIES, CURSOR, PREPARE_TXN, COMMIT_GROUP, ABORT_TAGGED and
    NEW_TXN with a tag (after ``conn``'s own handlers: a plain NEW_TXN goes
    on to its handler)."""
    return {**reader_handlers(conn), **group_handlers(conn)}
