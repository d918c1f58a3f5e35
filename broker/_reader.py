"""Reading a partition by position, and cursors moved by position: what a
stream source (`pipelines`) and `client.Client.create_reader` need.

A partition's ledger holds committed messages only, in their committed
order: a plain send is an entry, and a transaction's messages appear as its
commit marker, appended when it commits (an aborted or open transaction has
none). So reading the ledger in order from a position reads exactly the
committed messages after it, and reading the same range again reads the
same messages, until retention trims it. A position is (entry id, batch
index); the position after the last message of an entry is (entry id + 1,
0), and positions are always answered in that form.

- READ_ENTRIES: the messages from a position, at most ``max_messages``
  (and about `MAX_READ_BYTES`), stopping before an end position if given,
  each entry as its `EntryBatch` (a commit marker resolved into its
  transaction's messages, `buffer.Partition.materialize`) and the indexes
  read (or, when a read takes at most half of an entry, an `EntryBatch` of
  only those messages and the index of the first: a reader taking a large
  transaction 1,000 messages at a time is not sent all of it each time);
  with ``positions_only``, only where such a read stops (from the
  entries' message counts, no data read). Every answer carries the
  partition's first entry not trimmed and its end (the last durable entry
  + 1). A read that finds nothing waits up to ``wait_ms`` for a message.
- CURSOR: a durable subscription with no consumer, created where missing
  (`subscriptions.Subscriptions.ensure`), acknowledged cumulatively up to
  (not including) given positions, answering where each partition's first
  unacknowledged message is. Retention never trims what it has not
  acknowledged: a source acknowledges only what its job will never read
  again.

A position before the first entry not trimmed, or past the end, is refused
with INVALID_ARGUMENT naming the partition's range; nothing changes. Who
may (`broker._auth`): READ_ENTRIES needs consume on the topic, CURSOR
consume on the topic and the subscription.
"""

from __future__ import annotations

import asyncio
import logging

from broker._context import Context, Handlers
from broker._errors import error_code, error_text
from buffer import Partition, Position, Topic, check_subscription_name, check_topic_name
from proto import refusals
from proto import txnbuf_pb2 as pb
from subscriptions import WHOLE_ENTRY, PartitionSubscription

__all__ = ["DEFAULT_MAX_MESSAGES", "MAX_READ_BYTES", "reader_handlers"]

log = logging.getLogger(__name__)

T = pb.BaseCommand
DEFAULT_MAX_MESSAGES = 10_000
MAX_MAX_MESSAGES = 1_000_000
MAX_READ_BYTES = 4 << 20  # a read answers about this much data at most (one entry more)
MAX_WAIT_MS = 60_000


def reader_handlers(conn: Context) -> Handlers:
    """The handlers of READ_ENTRIES and CURSOR for ``conn``'s dispatch table."""
    return {
        T.READ_ENTRIES: lambda cmd: conn.spawn(_read_entries(conn, cmd.read_entries)),
        T.CURSOR: lambda cmd: conn.spawn(_cursor(conn, cmd.cursor)),
    }


def _partition(topic: Topic | None, name: str, index: int) -> Partition:
    if topic is None:
        raise refusals.TopicNotFound(f"no topic {name!r}")
    if index >= len(topic.partitions):
        raise refusals.InvalidArgument(
            f"topic {name!r} has {len(topic.partitions)} partitions: no partition {index}",
        )
    return topic.partitions[index]


def _end(part: Partition) -> int:
    """The entry id after the last durable one."""
    return part.ledger.last_entry_id + 1


def _checked(part: Partition, entry_id: int, index: int, what: str) -> Position:
    """``(entry_id, index)`` as a position of ``part`` in the normal form
    (the end of an entry is the start of the next); refused if it is
    trimmed or past the end."""
    first, end = part.ledger.first_entry_id, _end(part)
    if index < 0 or entry_id < 0:
        raise refusals.InvalidArgument(f"{what} ({entry_id}, {index}) is negative")
    if entry_id < first:
        raise refusals.InvalidArgument(
            f"{what} ({entry_id}, {index}) of {part.name} was trimmed: its entries now run "
            f"from {first} to {end - 1}",
        )
    if entry_id > end or (entry_id == end and index > 0):
        raise refusals.InvalidArgument(
            f"{what} ({entry_id}, {index}) of {part.name} is past its end ({end}, 0)",
        )
    if entry_id < end and index >= part.count(entry_id):
        if index > part.count(entry_id):
            raise refusals.InvalidArgument(
                f"{what} ({entry_id}, {index}) of {part.name}: entry {entry_id} holds "
                f"{part.count(entry_id)} messages",
            )
        return (entry_id + 1, 0)
    return (entry_id, index)


def plan_read(
    part: Partition, start: Position, stop: Position | None, max_messages: int
) -> tuple[list[tuple[int, int, int]], Position]:
    """The entries a read from ``start`` covers, as (entry id, first index,
    last index + 1), at most ``max_messages`` messages and none at or after
    ``stop``; and the position after them (normal form)."""
    last_entry = part.ledger.last_entry_id
    runs = []
    left = max_messages
    entry_id, index = start
    while left > 0 and entry_id <= last_entry:
        if stop is not None and (entry_id, index) >= stop:
            break
        count = part.count(entry_id)
        upto = count if stop is None or entry_id < stop[0] else min(count, stop[1])
        take = min(upto - index, left)
        if take > 0:
            runs.append((entry_id, index, index + take))
            left -= take
            index += take
        if index < count:
            break  # (stopped inside the entry: at max_messages or at ``stop``)
        entry_id, index = entry_id + 1, 0
    return runs, (entry_id, index)


async def _read_entries(conn: Context, req: pb.CommandReadEntries) -> None:
    out = pb.BaseCommand(type=T.READ_ENTRIES_RESPONSE)
    resp = out.read_entries_response
    resp.request_id = req.request_id
    try:
        await _fill_read(conn, req, resp)
    except Exception as exc:
        del resp.entries[:]
        resp.error = error_code(exc, f"connection {conn.peer}: read of {req.topic[:200]!r}")
        resp.message = error_text(exc)
    conn.send(out)


async def _fill_read(
    conn: Context, req: pb.CommandReadEntries, resp: pb.CommandReadEntriesResponse
) -> None:
    conn.broker.security.allow_read(conn.who, check_topic_name(req.topic))
    part = _partition(await conn.broker.topics.load_topic(req.topic), req.topic, req.partition)
    if req.max_messages > MAX_MAX_MESSAGES:
        raise refusals.InvalidArgument(
            f"max_messages is at most {MAX_MAX_MESSAGES}, got {req.max_messages}",
        )
    if req.wait_ms > MAX_WAIT_MS:
        raise refusals.InvalidArgument(f"wait_ms is at most {MAX_WAIT_MS}")
    if req.HasField("start_entry"):
        start = _checked(part, req.start_entry, req.start_index, "start")
    else:
        start = _checked(part, part.ledger.first_entry_id, 0, "start")
    stop = None
    if req.HasField("end_entry"):
        stop = _checked(part, req.end_entry, req.end_index, "end")
        if stop < start:
            raise refusals.InvalidArgument(f"end {stop} is before start {start}")
    if req.wait_ms and start[0] >= _end(part) and (stop is None or stop > start):
        try:
            async with asyncio.timeout(req.wait_ms / 1000):
                await part.ledger.wait_for(start[0])
        except TimeoutError:
            pass
        start = _checked(part, *start, "start")  # (trimmed meanwhile?)
    runs, after = plan_read(part, start, stop, req.max_messages or DEFAULT_MAX_MESSAGES)
    if not req.positions_only and runs:
        entries = await part.ledger.read(runs[0][0], runs[-1][0])
        by_id = {e.entry_id: e for e in entries}
        size = 0
        for n, (entry_id, first, last) in enumerate(runs):
            entry = by_id.get(entry_id)
            if entry is None:  # trimmed while we read
                raise refusals.InvalidArgument(f"entry {entry_id} of {part.name} was trimmed")
            data = await part.materialize(entry)
            count = part.count(entry_id)
            delivered = resp.entries.add(partition=req.partition, entry_id=entry_id)
            if (last - first) * 2 <= count:  # (a small part: only it goes)
                data = _part_of(data, first, last)
                delivered.first_index = first
            elif first > 0 or last < count:
                delivered.indexes.extend(range(first, last))
            delivered.data = data
            size += len(data)
            if size >= MAX_READ_BYTES and n + 1 < len(runs):
                runs = runs[: n + 1]
                after = (entry_id, last) if last < part.count(entry_id) else (entry_id + 1, 0)
                break
    resp.messages = sum(last - first for _, first, last in runs)
    resp.next_entry, resp.next_index = after
    resp.first_entry = part.ledger.first_entry_id
    resp.end_entry = _end(part)


def _part_of(data: bytes, first: int, last: int) -> bytes:
    """The `EntryBatch` ``data`` with only its messages ``first`` to ``last`` - 1."""
    batch = pb.EntryBatch.FromString(data)
    part = pb.EntryBatch(producer_name=batch.producer_name)
    part.messages.extend(batch.messages[first:last])
    return part.SerializeToString()


def first_unacknowledged(sub: PartitionSubscription) -> Position:
    """Where ``sub``'s first message not acknowledged is (cumulatively)."""
    entry_id, index = sub.cursor.mark_delete
    if index == WHOLE_ENTRY or index + 1 >= sub.partition.count(entry_id):
        return (entry_id + 1, 0)
    return (entry_id, index + 1)


def _before(pos: Position) -> Position:
    """The last position before ``pos`` (normal form), as a cursor bound."""
    entry_id, index = pos
    return (entry_id, index - 1) if index > 0 else (entry_id - 1, WHOLE_ENTRY)


async def _cursor(conn: Context, req: pb.CommandCursor) -> None:
    out = pb.BaseCommand(type=T.CURSOR_RESPONSE)
    resp = out.cursor_response
    resp.request_id = req.request_id
    try:
        broker = conn.broker
        name = check_subscription_name(req.subscription)
        broker.security.allow_consume(conn.who, check_topic_name(req.topic), name)
        topic = await broker.topics.get_or_create(req.topic)
        by_index = {p.partition: p for p in req.acknowledge_before}
        if len(by_index) != len(req.acknowledge_before):
            raise refusals.InvalidArgument("acknowledge_before names a partition twice")
        for index in by_index:
            _partition(topic, req.topic, index)  # (checked before anything is created)
        subs = await broker.subscriptions.ensure(
            topic, name, req.initial_position == pb.CommandSubscribe.EARLIEST
        )
        bounds = []
        for sub in subs:
            pos = by_index.get(sub.partition.index)
            if pos is None:
                continue
            if pos.entry_id >= sub.partition.ledger.first_entry_id:
                checked = _checked(sub.partition, pos.entry_id, pos.index, "acknowledge_before")
            else:  # (trimmed: acknowledged before, by this or another subscription)
                checked = (pos.entry_id, pos.index)
            bound = _before(checked)
            if bound > sub.cursor.mark_delete:
                bounds.append((sub, bound))
        await asyncio.gather(*(sub.ack([bound], cumulative=True) for sub, bound in bounds))
        for sub in subs:
            entry_id, index = first_unacknowledged(sub)
            resp.positions.add(partition=sub.partition.index, entry_id=entry_id, index=index)
    except Exception as exc:
        del resp.positions[:]
        resp.error = error_code(exc, f"connection {conn.peer}: cursor on {req.topic[:200]!r}")
        resp.message = error_text(exc)
    conn.send(out)
