"""`proto.batch_frame`: the bytes protobuf itself gives a BATCH, made by concatenation."""

from __future__ import annotations

import pytest

from proto import batch_frame
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
