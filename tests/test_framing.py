"""`proto.batch_frame`: the bytes protobuf itself gives a BATCH, made by
concatenation; `proto.next_frame`: what of a queue goes in one message."""

from __future__ import annotations

from collections import deque

import pytest

from proto import BATCH_MAX_BYTES, batch_frame, next_frame
from proto import txnbuf_pb2 as pb


def message_of(size: int) -> pb.BaseCommand:
    entry = pb.DeliveredEntry(entry_id=size, data=b"x" * size)
    return pb.BaseCommand(
        type=pb.BaseCommand.MESSAGE, message=pb.CommandMessage(consumer_id=1, entries=[entry])
    )


@pytest.mark.parametrize("sizes", [[0], [1, 2], [100, 200, 20_000], [300_000, 5]])
def test_batch_frame_is_what_protobuf_would_encode(sizes: list[int]) -> None:
    commands = [message_of(n) for n in sizes]
    expected = pb.BaseCommand(type=pb.BaseCommand.BATCH)
    expected.batch.commands.extend(commands)
    data = batch_frame([c.SerializeToString() for c in commands])
    assert data == expected.SerializeToString()
    assert list(pb.BaseCommand.FromString(data).batch.commands) == commands


def test_next_frame_joins_what_fits_and_sends_a_big_one_alone() -> None:
    small = [message_of(n).SerializeToString() for n in (100, 200, 300)]
    big = message_of(BATCH_MAX_BYTES).SerializeToString()
    out = deque([*small, big, small[0]])
    first = pb.BaseCommand.FromString(next_frame(out))
    assert [c.SerializeToString() for c in first.batch.commands] == small
    assert next_frame(out) == big  # over the limit: alone, not in a BATCH
    assert next_frame(out) == small[0]  # the last one: alone too
    assert not out
