"""Reading a partition by position (READ_ENTRIES), and a subscription's
cursor moved by position (CURSOR): what stream sources such as Spark's need.

A partition holds committed messages only, in their committed order (a
transaction's messages appear where its commit marker is, once it
commits). A ``Position`` is (entry id, index) in that order; the message
with id ``MessageId(partition, e, i)`` is at ``Position(e, i)``. Reading the
same range twice gives the same messages (until retention trims it), so a
job that records positions can replay exactly what it read.

``Reader`` (``Client.create_reader``) reads one partition from a position:
``read_next()`` waits for the next message, ``read_batch()`` takes what is
there, ``async for`` reads forever. ``SubscriptionCursor`` is a durable
subscription with no consumer: ``positions()`` says where it stands (and
creates it, at the earliest or latest position, if missing), and
``acknowledge_before(positions)`` acknowledges cumulatively up to them, so
that retention may trim what the job will never read again.

Both are control requests: retried across reconnects until the operation
timeout (reading and acknowledging by position are idempotent). In a
cluster they go to the owner of the topic and follow it (`client._brokers`'
``Route``): a read refused NOT_OWNER, or whose broker died or handed its
slots over, is made again at the new owner from the same position. The
partition is the same rows in the cluster's database whoever serves it, so
a reader goes on from where it had read to: no message skipped or read
twice.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import NamedTuple

from proto import txnbuf_pb2 as pb

from ._brokers import ClientLink, Route
from ._connection import Command, Type, command
from ._message import Message, decode_entry
from .errors import InvalidInputError, OperationTimeoutError

__all__ = ["Position", "ReadResult", "Reader", "SubscriptionCursor"]

LONG_POLL_MS = 1000  # how long one read waits at the broker for a message


class Position(NamedTuple):
    """A place in a partition's committed order: (entry id, batch index).
    The position after the last message of an entry is (entry id + 1, 0)."""

    entry_id: int
    batch_index: int = 0

    def __str__(self) -> str:
        return f"{self.entry_id}:{self.batch_index}"


class ReadResult(NamedTuple):
    """One READ_ENTRIES answer: the messages read, the position after them,
    how many messages it covers (with ``positions_only``, none are read),
    and the partition's first position not trimmed and its end now."""

    messages: list[Message]
    next: Position
    covered: int
    first: Position
    end: Position


def _position(value: object, what: str = "position") -> Position:
    if (
        isinstance(value, tuple)
        and len(value) == 2
        and all(type(v) is int and v >= 0 for v in value)
    ):
        return Position(*value)
    raise InvalidInputError(f"{what} must be a Position (entry_id, index) >= 0, not {value!r}")


async def read_entries(
    route: Route,
    topic: str,
    partition: int,
    start: Position | None,
    *,
    end: Position | None = None,
    max_messages: int = 0,
    positions_only: bool = False,
    wait_ms: int = 0,
) -> ReadResult:
    """One READ_ENTRIES (see ``proto/txnbuf.proto``); ``start`` None: from
    the first position not trimmed."""

    def build(request_id: int) -> Command:
        cmd = command(
            Type.READ_ENTRIES,
            "read_entries",
            request_id=request_id,
            topic=topic,
            partition=partition,
            max_messages=max_messages,
            positions_only=positions_only,
            wait_ms=wait_ms,
        )
        req = cmd.read_entries
        if start is not None:
            req.start_entry, req.start_index = start
        if end is not None:
            req.end_entry, req.end_index = end
        return cmd

    deadline = route.conn.deadline() + wait_ms / 1000
    reply = await route.request(
        build, Command.READ_ENTRIES_RESPONSE, f"read {topic!r} partition {partition}", deadline
    )
    answer = reply.read_entries_response
    messages = []
    for entry in answer.entries:
        messages.extend(decode_entry(topic, entry))
    return ReadResult(
        messages,
        Position(answer.next_entry, answer.next_index),
        answer.messages,
        Position(answer.first_entry, 0),
        Position(answer.end_entry, 0),
    )


class Reader:
    """Reads one partition of a topic from a position, in committed order
    (made by ``Client.create_reader``). ``position`` is where the next
    message is read from."""

    def __init__(
        self, route: Route, topic: str, partition: int, start: Position, batch: int
    ) -> None:
        self._route = route
        self.topic = topic
        self.partition = partition
        self._batch = batch
        self._ready: deque[Message] = deque()  # read, not handed out yet
        self._fetched = start  # the position after what ``_ready`` holds

    def __repr__(self) -> str:
        return f"<Reader {self.topic!r} partition {self.partition} at {self.position}>"

    @property
    def position(self) -> Position:
        """Where the next message handed out is."""
        if self._ready:
            _, entry_id, index = self._ready[0].message_id
            return Position(entry_id, index)
        return self._fetched

    async def read_batch(
        self, max_messages: int | None = None, end: Position | None = None
    ) -> list[Message]:
        """The messages there are now from ``position`` on (at most
        ``max_messages``, none at or after ``end``), perhaps none; moves
        ``position`` past them."""
        limit = self._batch if max_messages is None else max_messages
        if type(limit) is not int or limit <= 0:
            raise InvalidInputError(f"max_messages must be a positive int, not {limit!r}")
        if end is not None:
            end = _position(end, "end")
        out: list[Message] = []
        while self._ready and len(out) < limit:
            if end is not None and self.position >= end:
                return out
            out.append(self._ready.popleft())
        if len(out) == limit or self._ready or (end is not None and self._fetched >= end):
            return out
        got = await read_entries(
            self._route,
            self.topic,
            self.partition,
            self._fetched,
            end=end,
            max_messages=limit - len(out),
        )
        out.extend(got.messages)
        self._fetched = got.next
        return out

    async def read_next(self, timeout: float | None = None) -> Message:
        """The next message, waiting for one to be committed (up to
        ``timeout`` seconds, then ``OperationTimeoutError``; None: for ever)."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while not self._ready:
            wait = LONG_POLL_MS
            if deadline is not None:
                left = deadline - loop.time()
                if left <= 0:
                    raise OperationTimeoutError(
                        f"no message on {self.topic!r} partition {self.partition} "
                        f"after {self.position} within {timeout} s"
                    )
                wait = max(1, min(wait, round(left * 1000)))
            got = await read_entries(
                self._route,
                self.topic,
                self.partition,
                self._fetched,
                max_messages=self._batch,
                wait_ms=wait,
            )
            self._ready.extend(got.messages)
            self._fetched = got.next
        return self._ready.popleft()

    async def look_ahead(self, max_messages: int, end: Position | None = None) -> ReadResult:
        """Where a read of at most ``max_messages`` from ``position`` (none at
        or after ``end``) would stop, and how many messages it covers
        (``covered``, ``next``), without reading them; ``position`` stays."""
        if type(max_messages) is not int or max_messages <= 0:
            raise InvalidInputError(f"max_messages must be a positive int, not {max_messages!r}")
        return await read_entries(
            self._route,
            self.topic,
            self.partition,
            self.position,
            end=None if end is None else _position(end, "end"),
            max_messages=max_messages,
            positions_only=True,
        )

    async def end(self) -> Position:
        """The partition's end now: the position after its last committed message."""
        got = await read_entries(
            self._route, self.topic, self.partition, None, max_messages=1, positions_only=True
        )
        return got.end

    async def first(self) -> Position:
        """The partition's first position not trimmed."""
        got = await read_entries(
            self._route, self.topic, self.partition, None, max_messages=1, positions_only=True
        )
        return got.first

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        return await self.read_next()


class SubscriptionCursor:
    """A durable subscription with no consumer, moved by position (a stream
    source's progress): ``SubscriptionCursor(client, topic, subscription,
    "earliest")``; nothing is sent until a call."""

    def __init__(
        self, client: ClientLink, topic: str, subscription: str, initial_position: str = "latest"
    ) -> None:
        for what, name in (("topic", topic), ("subscription", subscription)):
            if not isinstance(name, str) or not name:
                raise InvalidInputError(f"{what} must be a non-empty str, not {name!r}")
        if initial_position not in ("earliest", "latest"):
            raise InvalidInputError(
                f"initial_position must be 'earliest' or 'latest', not {initial_position!r}"
            )
        self._client = client
        self._route = Route(client._brokers, topic=topic)
        self.topic = topic
        self.subscription = subscription
        self._initial = (
            pb.CommandSubscribe.EARLIEST
            if initial_position == "earliest"
            else pb.CommandSubscribe.LATEST
        )

    async def positions(self) -> dict[int, Position]:
        """Each partition's first message not acknowledged (the
        subscription is created, at its initial position, if missing)."""
        return await self.acknowledge_before({})

    async def acknowledge_before(self, positions: Mapping[int, Position]) -> dict[int, Position]:
        """Acknowledge, cumulatively, every message before ``positions``
        (partition -> position); then as ``positions()``. Acknowledging a
        position acknowledged already changes nothing."""
        checked = {p: _position(pos, f"position of partition {p}") for p, pos in positions.items()}

        def build(request_id: int) -> Command:
            cmd = command(
                Type.CURSOR,
                "cursor",
                request_id=request_id,
                topic=self.topic,
                subscription=self.subscription,
                initial_position=self._initial,
            )
            for partition, (entry_id, index) in sorted(checked.items()):
                cmd.cursor.acknowledge_before.add(
                    partition=partition, entry_id=entry_id, index=index
                )
            return cmd

        await self._client.connect()
        reply = await self._route.request(
            build, Command.CURSOR_RESPONSE, f"cursor of {self.subscription!r} on {self.topic!r}"
        )
        return {p.partition: Position(p.entry_id, p.index) for p in reply.cursor_response.positions}
