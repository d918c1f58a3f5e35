"""The txnbuf wire protocol: `txnbuf.proto` and its generated module.

Every WebSocket frame is one serialized `txnbuf_pb2.BaseCommand` (a BATCH
carries several, see `batch_frame` and `next_frame`). The generated files are committed;
`scripts/gen-proto` regenerates them. `refusals` holds the server's
exception class of each wire error code.

Note: `proto` is also the import name of Google's proto-plus package. txnbuf
owns this name in its environment; `tests/test_packaging.py` checks it.
"""

from proto import refusals, txnbuf_pb2
from proto._framing import BATCH_MAX_BYTES, batch_frame, next_frame
from proto._limits import FRAME_SLACK, MAX_MESSAGE_SIZE, oversized

__all__ = [
    "BATCH_MAX_BYTES",
    "FRAME_SLACK",
    "MAX_MESSAGE_SIZE",
    "batch_frame",
    "next_frame",
    "oversized",
    "refusals",
    "txnbuf_pb2",
]
