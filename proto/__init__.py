"""The txnbuf wire protocol: `txnbuf.proto` and its generated module.

Every WebSocket frame is one serialized `txnbuf_pb2.BaseCommand` (a BATCH
carries several, see `batch_frame` and `next_frame`); on a raw stream each
goes behind its length (`stream_frame`, `StreamFrames`). The generated files are committed;
`scripts/gen-proto` regenerates them. `refusals` holds the server's
exception class of each wire error code; `TxnID` is the transaction id
every side (client, coordinator, partitions, subscriptions) uses, and
`txn_text` how one is printed, everywhere.

Note: `proto` is also the import name of Google's proto-plus package. txnbuf
owns this name in its environment; `tests/test_packaging.py` checks it.
"""

from proto import refusals, txnbuf_pb2
from proto._framing import BATCH_MAX_BYTES, batch_frame, next_frame
from proto._limits import FRAME_SLACK, MAX_MESSAGE_SIZE, oversized
from proto._stream import FramedStream, FrameTooLargeError, StreamFrames, stream_frame
from proto._txnid import MAX_TCID, TxnID, boot_epoch, txn_text, wire_txnid

__all__ = [
    "BATCH_MAX_BYTES",
    "FRAME_SLACK",
    "MAX_MESSAGE_SIZE",
    "MAX_TCID",
    "FrameTooLargeError",
    "FramedStream",
    "StreamFrames",
    "TxnID",
    "batch_frame",
    "boot_epoch",
    "next_frame",
    "oversized",
    "refusals",
    "stream_frame",
    "txn_text",
    "txnbuf_pb2",
    "wire_txnid",
]
