"""The one limit on a message's size, shared by the client and the broker."""

from __future__ import annotations

from collections.abc import Iterable

from proto import txnbuf_pb2 as pb

__all__ = ["FRAME_SLACK", "MAX_MESSAGE_SIZE", "oversized"]

# The largest message: the bytes of one encoded `SingleMessage` (payload,
# key, properties, sequence id, publish time). The broker announces it in
# CONNECTED and refuses a SEND or PRODUCE holding a bigger one; the client
# refuses one before sending it (`client.errors.MessageTooBigError`).
# Messages are never chunked.
MAX_MESSAGE_SIZE = 5 * 1024 * 1024
# What one WebSocket frame may hold beyond one message of that size (the
# command around it): the broker takes frames of up to MAX_MESSAGE_SIZE +
# FRAME_SLACK bytes.
FRAME_SLACK = 64 * 1024


def oversized(messages: Iterable[pb.SingleMessage], limit: int = MAX_MESSAGE_SIZE) -> str | None:
    """Why ``messages`` may not be sent: the first one over ``limit`` bytes,
    with its size and the limit named; None if none is."""
    for i, message in enumerate(messages):
        size = message.ByteSize()
        if size > limit:
            return (
                f"message {i} is {size:,} bytes (encoded: payload, key and properties), "
                f"over max_message_size ({limit:,} bytes); messages are not chunked"
            )
    return None
