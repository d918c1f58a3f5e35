"""`Partition.retained_from` on a real store: what a topic's retention keeps
of the entries every subscription has acknowledged, by size and by time,
across a trim and a reopen; and `Retention.from_json`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from buffer import NO_RETENTION, Partition, Retention, RetentionError, Topics
from ledger import LedgerStore
from proto import txnbuf_pb2 as pb
from tests.test_partition import settle

NOW = 10_000_000


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LedgerStore]:
    s = await LedgerStore.open(tmp_path / "broker.db")
    try:
        yield s
    finally:
        await settle(s)
        await s.close()


async def filled(store: LedgerStore, sizes: list[int], times: list[int]) -> Partition:
    """A partition with one entry per (payload size, publish time)."""
    topics = await Topics.load(store)
    part = (await topics.create("r", 1)).partitions[0]
    for seq, (size, published) in enumerate(zip(sizes, times, strict=True)):
        message = pb.SingleMessage(
            payload=b"x" * size, sequence_id=seq + 1, publish_time_ms=published
        )
        await part.publish("p", [message])
    return part


async def test_nothing_kept_by_default_and_everything_below_before_with_no_limits(
    store: LedgerStore,
) -> None:
    part = await filled(store, [10] * 8, [NOW] * 8)
    assert await part.retained_from(NO_RETENTION, 6, NOW) == 6
    assert await part.retained_from(Retention(-1, -1), 6, NOW) == 0
    assert await part.retained_from(Retention(3600, 0), 6, NOW) == 6  # (0: keep nothing)


async def test_size_keeps_the_newest_acknowledged_entries_that_fit(store: LedgerStore) -> None:
    part = await filled(store, [100] * 10, [NOW] * 10)
    size = [len(e.data) for e in await part.ledger.read(0, 9)]
    assert len(set(size)) == 1
    one = size[0]
    # Entries 0..7 acknowledged: keep as many of the newest as fit.
    assert await part.retained_from(Retention(-1, 3 * one), 8, NOW) == 5
    assert await part.retained_from(Retention(-1, 3 * one - 1), 8, NOW) == 6
    assert await part.retained_from(Retention(-1, 100 * one), 8, NOW) == 0
    # After a trim, and for entries stored since, it still counts right.
    await part.ledger.trim(3)
    part.trimmed(3)
    more = pb.SingleMessage(payload=b"x" * 100, sequence_id=11, publish_time_ms=NOW)
    await part.publish("p", [more])
    assert await part.retained_from(Retention(-1, 3 * one), 11, NOW) == 8
    assert await part.retained_from(Retention(-1, 100 * one), 11, NOW) == 3


async def test_time_keeps_what_was_published_within_it(store: LedgerStore) -> None:
    times = [NOW - 100_000, NOW - 90_000, NOW - 50_000, NOW - 20_000, NOW - 5_000, NOW]
    part = await filled(store, [10] * 6, times)
    assert await part.retained_from(Retention(60, -1), 6, NOW) == 2  # 60 s: from -50 s on
    assert await part.retained_from(Retention(10, -1), 6, NOW) == 4
    assert await part.retained_from(Retention(10, -1), 3, NOW) == 3  # (nothing below 3 kept)
    assert await part.retained_from(Retention(1000, -1), 6, NOW) == 0
    # Both limits: an entry goes once either is passed.
    one = len((await part.ledger.read(0, 0))[0].data)
    assert await part.retained_from(Retention(1000, 2 * one), 6, NOW) == 4


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (None, NO_RETENTION),
        ({"time_s": 60}, Retention(60, -1)),
        ({"size_bytes": 1000}, Retention(-1, 1000)),
        ({"time_s": -1, "size_bytes": 0}, Retention(-1, 0)),
    ],
)
def test_retention_from_json(body: object, expected: Retention) -> None:
    assert Retention.from_json(body) == expected


@pytest.mark.parametrize(
    "body", [{}, {"time_s": -2}, {"time_s": True}, {"size_bytes": 1.5}, {"x": 1}, [60], "1h"]
)
def test_bad_retention_is_refused(body: object) -> None:
    with pytest.raises(RetentionError):
        Retention.from_json(body)
