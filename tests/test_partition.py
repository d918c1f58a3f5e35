"""Topics and partitions on a real LedgerStore: names, counts, publish, dedup."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

import buffer._partition as partition_module
from buffer import (
    DUPLICATE_POSITION,
    MAX_PARTITIONS,
    InvalidNameError,
    MessageId,
    Partition,
    PartitionCountError,
    PublishResult,
    SendRejectedError,
    Topics,
    check_consumer_name,
    check_producer_name,
    check_subscription_name,
    check_topic_name,
    quoted,
)
from ledger import LedgerStore
from proto import txnbuf_pb2 as pb

WHOLE_ENTRY = (1 << 31) - 1


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "broker.db"


@pytest.fixture
async def store(db: Path) -> AsyncIterator[LedgerStore]:
    s = await LedgerStore.open(db)
    try:
        yield s
    finally:
        if not s._closed:  # tests that reopen the database closed it already
            await settle(s)
        await s.close()


async def settle(store: LedgerStore) -> None:
    """Wait until fire-and-forget writes (dedup snapshots, their trims) are committed.

    Each barrier append is committed after everything queued before it, and
    the callbacks of earlier commits (which may queue more) run before it
    resolves. (LedgerStore.close() hangs if called with queued writes; see
    test_ledger.py::test_close_flushes_queued_appends.)
    """
    barrier = await store.open_ledger("test/barrier")
    for _ in range(4):
        await barrier.append(b"")
    assert not store._queue


def msgs(*seqs: int) -> list[pb.SingleMessage]:
    return [pb.SingleMessage(payload=f"m{s}".encode(), sequence_id=s) for s in seqs]


async def stored_seqs(part: Partition, entry_id: int) -> tuple[str, list[int]]:
    (entry,) = await part.ledger.read(entry_id, entry_id)
    batch = pb.EntryBatch.FromString(entry.data)
    assert entry.meta == len(batch.messages)
    assert [m.payload for m in batch.messages] == [
        f"m{m.sequence_id}".encode() for m in batch.messages
    ]
    return batch.producer_name, [m.sequence_id for m in batch.messages]


async def reopen(store: LedgerStore, db: Path) -> tuple[LedgerStore, Topics]:
    await settle(store)
    await store.close()
    store = await LedgerStore.open(db)
    return store, await Topics.load(store)


async def one_partition(store: LedgerStore, topic: str = "t") -> Partition:
    topics = await Topics.load(store)
    return (await topics.create(topic, 1)).partitions[0]


# -- names ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["a", "A", "0", "topic-1", "my.topic_2", "x" * 200, "9-._", "a..b"]
)
def test_valid_names(name: str) -> None:
    assert check_topic_name(name) == name
    assert check_subscription_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "-a", ".a", "_a", "a/b", "a b", " a", "a\n", "x" * 201, "é", "a:b", "persistent://t"],
)
def test_invalid_names(name: str) -> None:
    with pytest.raises(InvalidNameError) as info:
        check_topic_name(name)
    assert info.value.kind == "topic"
    assert repr(name[:200]) in str(info.value)  # (quoted whole up to 200 characters)
    with pytest.raises(InvalidNameError) as info:
        check_subscription_name(name)
    assert info.value.kind == "subscription"


def test_an_error_quotes_at_most_200_characters_of_a_name() -> None:
    for check in (check_topic_name, check_producer_name, check_consumer_name):
        with pytest.raises(InvalidNameError) as info:
            check("y" * 10_000)
        text = str(info.value)
        assert "y" * 200 in text and "y" * 201 not in text
        assert "(10000 characters)" in text and len(text) < 400
    assert quoted("ab") == "'ab'"
    assert quoted(b"z" * 300) == repr(b"z" * 200) + "... (300 characters)"
    assert len(quoted(list(range(1000)))) < 230


def test_non_string_name_is_invalid() -> None:
    with pytest.raises(InvalidNameError):
        check_topic_name(5)  # type: ignore[arg-type]


def test_message_id_order_and_text() -> None:
    a, b, c = MessageId(0, 5, 1), MessageId(0, 5, 2), MessageId(1, 0, 0)
    assert a < b < c
    assert a.position == (5, 1)
    assert str(a) == "0:5:1"


# -- topics --------------------------------------------------------------------------


async def test_load_empty_store(store: LedgerStore) -> None:
    topics = await Topics.load(store)
    assert topics.names() == []
    assert "t" not in topics
    assert topics.get("t") is None


async def test_create_and_get_or_create(store: LedgerStore, db: Path) -> None:
    topics = await Topics.load(store)
    t = await topics.create("t", 3)
    assert [(p.topic, p.index, p.name) for p in t.partitions] == [
        ("t", i, f"t-partition-{i}") for i in range(3)
    ]
    assert await topics.create("t", 3) is t  # same count: nothing to do
    assert await topics.get_or_create("t") is t
    assert len(t.partitions) == 3
    u = await topics.get_or_create("u")
    assert len(u.partitions) == 1
    assert topics.names() == ["t", "u"]
    assert "u" in topics and topics.get("u") is u
    grown = await topics.create("t", 5)
    assert grown is t and len(t.partitions) == 5
    kept = await topics.create("t", 2, exist_ok=True)  # exist_ok: returned as it is
    assert kept is t and len(t.partitions) == 5

    store2, topics2 = await reopen(store, db)
    try:
        assert topics2.names() == ["t", "u"]
        t2, u2 = topics2.get("t"), topics2.get("u")
        assert t2 is not None and u2 is not None
        assert [p.index for p in t2.partitions] == [0, 1, 2, 3, 4]
        assert len(u2.partitions) == 1
    finally:
        await settle(store2)
        await store2.close()


async def test_a_new_topic_is_visible_only_with_its_partitions(
    store: LedgerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    topics = await Topics.load(store)
    entered, gate = asyncio.Event(), asyncio.Event()
    real_load = Partition.load

    async def slow_load(store: LedgerStore, topic: str, index: int) -> Partition:
        entered.set()
        await gate.wait()
        return await real_load(store, topic, index)

    monkeypatch.setattr(Partition, "load", staticmethod(slow_load))
    first = asyncio.create_task(topics.get_or_create("new"))
    await entered.wait()  # its record is written, its partition is loading
    assert topics.get("new") is None and "new" not in topics
    second = asyncio.create_task(topics.get_or_create("new"))
    await asyncio.sleep(0)
    gate.set()
    a, b = await first, await second
    assert a is b and len(a.partitions) == 1


async def test_partitions_are_independent_ledgers(store: LedgerStore) -> None:
    topics = await Topics.load(store)
    t = await topics.create("t", 2)
    p0, p1 = t.partitions
    assert await p0.publish("a", msgs(0)) == PublishResult(0, None)
    assert await p1.publish("a", msgs(0)) == PublishResult(0, None)
    assert p0.ledger is not p1.ledger
    assert (p0.ledger.last_entry_id, p1.ledger.last_entry_id) == (0, 0)


@pytest.mark.parametrize("name", ["", "-t", "a/b", "x" * 201])
async def test_invalid_topic_names_change_nothing(store: LedgerStore, db: Path, name: str) -> None:
    topics = await Topics.load(store)
    await topics.create("keep", 2)
    with pytest.raises(InvalidNameError):
        await topics.create(name, 1)
    with pytest.raises(InvalidNameError):
        await topics.get_or_create(name)
    assert topics.names() == ["keep"]
    assert store.ledger_names("p/") == ["p/keep/0", "p/keep/1"]

    store2, topics2 = await reopen(store, db)
    try:
        assert topics2.names() == ["keep"]
    finally:
        await store2.close()


@pytest.mark.parametrize(
    ("name", "partitions"),
    [
        ("t", 2),  # shrinking
        ("t", 0),
        ("t", -1),
        ("t", MAX_PARTITIONS + 1),
        ("new", 0),
        ("new", MAX_PARTITIONS + 1),
        ("new", 2.0),
        ("new", "2"),
        ("new", None),
    ],
)
async def test_bad_partition_counts_change_nothing(
    store: LedgerStore, db: Path, name: str, partitions: object
) -> None:
    topics = await Topics.load(store)
    await topics.create("t", 3)
    meta = store.get_ledger("__meta/topics")
    assert meta is not None
    records = meta.last_entry_id
    with pytest.raises(PartitionCountError):
        await topics.create(name, partitions)  # type: ignore[arg-type]
    assert topics.names() == ["t"]
    t = topics.get("t")
    assert t is not None and len(t.partitions) == 3
    assert meta.last_entry_id == records  # no topic record written
    assert store.ledger_names("p/") == ["p/t/0", "p/t/1", "p/t/2"]

    store2, topics2 = await reopen(store, db)
    try:
        assert topics2.names() == ["t"]
        t2 = topics2.get("t")
        assert t2 is not None and len(t2.partitions) == 3
    finally:
        await store2.close()


async def test_max_partitions_is_allowed(store: LedgerStore) -> None:
    topics = await Topics.load(store)
    with pytest.raises(PartitionCountError):
        await topics.create("big", MAX_PARTITIONS + 1)
    t = await topics.create("small", 1)
    assert len(t.partitions) == 1


# -- publish -------------------------------------------------------------------------


async def test_publish_stores_one_entry_per_call(store: LedgerStore) -> None:
    part = await one_partition(store)
    assert await part.publish("p", msgs(0, 1, 2)) == PublishResult(0, None)
    assert await part.publish("p", msgs(3)) == PublishResult(1, None)
    assert await part.publish("q", msgs(0, 5)) == PublishResult(2, None)
    assert part.ledger.last_entry_id == 2
    assert await stored_seqs(part, 0) == ("p", [0, 1, 2])
    assert await stored_seqs(part, 1) == ("p", [3])
    assert await stored_seqs(part, 2) == ("q", [0, 5])
    assert part.dedup.last_sequence_id("p") == 3
    assert part.dedup.last_sequence_id("q") == 5
    assert part.dedup.last_sequence_id("nobody") == -1
    assert part.messages_in == 6


async def test_pipelined_publishes_keep_call_order(store: LedgerStore) -> None:
    part = await one_partition(store)
    pending = [part.publish("p", msgs(i)) for i in range(20)]
    results = await asyncio.gather(*pending)
    assert results == [PublishResult(i, None) for i in range(20)]


async def test_resend_returns_original_ids_and_stores_nothing(store: LedgerStore) -> None:
    part = await one_partition(store)
    await part.publish("p", msgs(0, 1, 2))
    await part.publish("p", msgs(3, 4))
    last = part.ledger.last_entry_id
    assert await part.publish("p", msgs(0, 1, 2)) == PublishResult(-1, [(0, 0), (0, 1), (0, 2)])
    assert await part.publish("p", msgs(4)) == PublishResult(-1, [(1, 1)])
    assert await part.publish("p", msgs(1, 3)) == PublishResult(-1, [(0, 1), (1, 0)])
    assert part.ledger.last_entry_id == last
    assert part.dedup.last_sequence_id("p") == 4


async def test_resend_while_the_original_is_in_flight(store: LedgerStore) -> None:
    part = await one_partition(store)
    first = part.publish("p", msgs(0, 1))
    again = part.publish("p", msgs(0, 1))  # before the first is durable
    assert await first == PublishResult(0, None)
    assert await again == PublishResult(-1, [(0, 0), (0, 1)])
    assert part.ledger.last_entry_id == 0


async def test_mixed_send_stores_only_new_messages(store: LedgerStore) -> None:
    part = await one_partition(store)
    await part.publish("p", msgs(0, 1, 2))
    result = await part.publish("p", msgs(1, 2, 3, 4))
    assert result == PublishResult(1, [(0, 1), (0, 2), (1, 0), (1, 1)])
    assert part.ledger.last_entry_id == 1
    assert await stored_seqs(part, 1) == ("p", [3, 4])
    assert part.count(1) == 2
    assert part.dedup.last_sequence_id("p") == 4


async def test_producers_are_deduplicated_separately(store: LedgerStore) -> None:
    part = await one_partition(store)
    await part.publish("p", msgs(5))
    assert await part.publish("q", msgs(5)) == PublishResult(1, None)  # not a duplicate
    assert await part.publish("p", msgs(5)) == PublishResult(-1, [(0, 0)])


@pytest.mark.parametrize("seqs", [(3, 3), (5, 4), (0, 2, 1), (1, 2, 2)])
async def test_non_increasing_sequence_ids_are_rejected(
    store: LedgerStore, seqs: Sequence[int]
) -> None:
    part = await one_partition(store)
    await part.publish("p", msgs(0))
    with pytest.raises(SendRejectedError, match="increase"):
        part.publish("p", msgs(*seqs))
    with pytest.raises(SendRejectedError):
        part.publish("p", [])
    await settle(store)
    assert part.ledger.last_entry_id == 0
    assert part.dedup.last_sequence_id("p") == 0
    assert part.dedup.get("p").pushed == 0
    # The producer goes on as if nothing happened.
    assert await part.publish("p", msgs(1)) == PublishResult(1, None)


async def test_count_exists_messages_after(store: LedgerStore) -> None:
    part = await one_partition(store)
    for seqs in [(0, 1, 2), (3,), (4, 5)]:
        await part.publish("p", msgs(*seqs))
    assert [part.count(e) for e in range(-1, 4)] == [0, 3, 1, 2, 0]
    assert part.exists((0, 0)) and part.exists((0, 2)) and part.exists((2, 1))
    for pos in [(0, 3), (1, 1), (3, 0), (-1, 0), (0, -1)]:
        assert not part.exists(pos), pos
    assert part.messages_after((-1, WHOLE_ENTRY)) == 6
    assert part.messages_after((0, 0)) == 5
    assert part.messages_after((0, 2)) == 3
    assert part.messages_after((0, WHOLE_ENTRY)) == 3
    assert part.messages_after((1, 0)) == 2
    assert part.messages_after((2, 0)) == 1
    assert part.messages_after((2, 1)) == 0
    assert part.messages_after((7, 0)) == 0

    await part.ledger.trim(1)
    part.trimmed(1)
    assert part.count(0) == 0
    assert part.exists((0, 1))  # trimmed, but it existed
    assert part.count(1) == 1
    assert part.messages_after((-1, WHOLE_ENTRY)) == 3
    assert part.messages_after((0, 1)) == 3
    assert part.messages_after((1, 0)) == 2


async def test_counts_survive_reopen_after_trim(store: LedgerStore, db: Path) -> None:
    part = await one_partition(store)
    for seqs in [(0, 1, 2), (3,), (4, 5)]:
        await part.publish("p", msgs(*seqs))
    await part.ledger.trim(1)
    part.trimmed(1)
    store2, topics = await reopen(store, db)
    try:
        t = topics.get("t")
        assert t is not None
        part = t.partitions[0]
        assert [part.count(e) for e in range(4)] == [0, 1, 2, 0]
        assert part.exists((0, 2)) and not part.exists((2, 2))
        assert part.messages_after((0, 0)) == 3
        assert await part.publish("p", msgs(6)) == PublishResult(3, None)
        assert part.count(3) == 1
    finally:
        await settle(store2)
        await store2.close()


async def test_commit_markers_are_known_live_after_trim_and_reopen(
    store: LedgerStore, db: Path
) -> None:
    part = await one_partition(store)
    tb = await part.txn_buffer()
    for i in range(3):  # entries: data, marker, data, marker, data, marker
        await part.publish("p", msgs(i))
        await tb.publish((1, i), "q", msgs(i))
        await tb.end((1, i), commit=True)
    await tb.settled()
    assert [part.is_marker(e) for e in range(-1, 7)] == [False, *[False, True] * 3, False]
    assert [part.count(e) for e in range(6)] == [1] * 6
    await part.ledger.trim(3)
    part.trimmed(3)
    assert [part.is_marker(e) for e in range(6)] == [False] * 3 + [True, False, True]
    store2, topics = await reopen(store, db)
    try:
        t = topics.get("t")
        assert t is not None
        part = t.partitions[0]
        assert [part.is_marker(e) for e in range(7)] == [False] * 3 + [True, False, True, False]
        assert part.messages_after((2, 0)) == 3
    finally:
        await settle(store2)
        await store2.close()


# -- dedup across restarts ---------------------------------------------------------------


async def test_first_sequence_id_stands_for_the_ids_between(store: LedgerStore, db: Path) -> None:
    part = await one_partition(store)
    assert await part.publish("p", msgs(0, 1, 2), first_seq=0) == PublishResult(0, None)
    # Ends that do not fit the count or the claim: refused, nothing changes.
    for seqs, first in [((3, 4, 6), 3), ((3, 4, 5), 4), ((3,), 2)]:
        with pytest.raises(SendRejectedError, match="first_sequence_id"):
            part.publish("p", msgs(*seqs), first_seq=first)
    assert part.dedup.get("p").pushed == 2
    # The ids between are taken on trust: deduplicated as 3..5 whatever they say.
    trusted = msgs(3, 9, 5)
    assert await part.publish("p", trusted, first_seq=3) == PublishResult(1, None)
    assert await part.publish("p", msgs(4)) == PublishResult(-1, [(1, 1)])
    assert await part.publish("p", msgs(2, 3, 6)) == PublishResult(2, [(0, 2), (1, 0), (2, 0)])
    # A restart reads a stored send the same way (its ends span its count).
    store2, topics = await reopen(store, db)
    try:
        t = topics.get("t")
        assert t is not None
        part = t.partitions[0]
        assert await part.publish("p", msgs(4, 5)) == PublishResult(-1, [(1, 1), (1, 2)])
        assert part.ledger.last_entry_id == 2
    finally:
        await settle(store2)
        await store2.close()


async def test_dedup_survives_reopen(store: LedgerStore, db: Path) -> None:
    part = await one_partition(store)
    await part.publish("p", msgs(0, 1))
    await part.publish("q", msgs(10))
    await part.publish("p", msgs(2))
    store2, topics = await reopen(store, db)
    try:
        t = topics.get("t")
        assert t is not None
        part = t.partitions[0]
        assert part.dedup.last_sequence_id("p") == 2
        assert part.dedup.last_sequence_id("q") == 10
        assert await part.publish("p", msgs(1, 2)) == PublishResult(-1, [(0, 1), (2, 0)])
        assert await part.publish("q", msgs(10, 11)) == PublishResult(3, [(1, 0), (3, 0)])
        assert part.ledger.last_entry_id == 3
        assert await stored_seqs(part, 3) == ("q", [11])
    finally:
        await settle(store2)
        await store2.close()


@pytest.fixture
def small_dedup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partition_module, "DEDUP_SNAPSHOT_EVERY", 3)
    monkeypatch.setattr(partition_module, "DEDUP_REPLAY_ENTRIES", 2)


@pytest.mark.usefixtures("small_dedup")
async def test_dedup_after_snapshots_and_replay(store: LedgerStore, db: Path) -> None:
    part = await one_partition(store)
    for i in range(10):
        assert await part.publish("p", msgs(2 * i, 2 * i + 1)) == PublishResult(i, None)
    await part.publish("q", msgs(100))  # entry 10
    await settle(store)
    dedup_ledger = store.get_ledger("d/t/0")
    assert dedup_ledger is not None
    assert dedup_ledger.entry_count == 1  # older snapshots trimmed
    store2, topics = await reopen(store, db)
    try:
        t = topics.get("t")
        assert t is not None
        part = t.partitions[0]
        assert part.dedup.last_sequence_id("p") == 19
        assert part.dedup.last_sequence_id("q") == 100
        # Recent entries are replayed: re-sends get their original ids.
        assert await part.publish("p", msgs(18, 19)) == PublishResult(-1, [(9, 0), (9, 1)])
        assert await part.publish("q", msgs(100)) == PublishResult(-1, [(10, 0)])
        # Older ones are known to be stored (never stored twice), ids
        # forgotten: answered as duplicates of unknown place, not refused.
        assert await part.publish("p", msgs(0)) == PublishResult(-1, [DUPLICATE_POSITION])
        assert await part.publish("p", msgs(1, 20)) == PublishResult(11, [(-1, -1), (11, 0)])
        assert part.ledger.last_entry_id == 11
        assert await part.publish("p", msgs(21)) == PublishResult(12, None)
    finally:
        await settle(store2)
        await store2.close()


async def test_dedup_snapshot_covers_a_whole_group_commit(
    store: LedgerStore, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Appends of two producers are committed together and the first one's
    # completion triggers the dedup snapshot. The snapshot must not claim
    # entries whose sequence ids it does not hold: on restart they are neither
    # in the snapshot nor replayed, and a re-send is stored twice.
    monkeypatch.setattr(partition_module, "DEDUP_SNAPSHOT_EVERY", 3)
    monkeypatch.setattr(partition_module, "DEDUP_REPLAY_ENTRIES", 1)
    part = await one_partition(store)
    for i in range(2):
        await part.publish("a", msgs(i))  # entries 0, 1
    together = [part.publish("a", msgs(2)), part.publish("b", msgs(0))]  # entries 2, 3
    assert await asyncio.gather(*together) == [PublishResult(2, None), PublishResult(3, None)]
    await part.publish("a", msgs(3))  # entry 4 (no new snapshot before the restart)
    store2, topics = await reopen(store, db)
    try:
        t = topics.get("t")
        assert t is not None
        part = t.partitions[0]
        assert part.dedup.last_sequence_id("a") == 3
        assert part.dedup.last_sequence_id("b") == 0
        result = await part.publish("b", msgs(0))  # a re-send after the restart
        assert part.ledger.last_entry_id == 4, "b's message 0 was stored twice"
        assert result == PublishResult(-1, [(3, 0)])
    finally:
        await settle(store2)
        await store2.close()


@pytest.mark.usefixtures("small_dedup")
async def test_dedup_survives_two_restarts(store: LedgerStore, db: Path) -> None:
    part = await one_partition(store)
    for i in range(7):
        await part.publish("p", msgs(i))
    store, topics = await reopen(store, db)
    t = topics.get("t")
    assert t is not None
    for i in range(7, 12):
        await t.partitions[0].publish("p", msgs(i))
    store2, topics = await reopen(store, db)
    try:
        t = topics.get("t")
        assert t is not None
        part = t.partitions[0]
        assert part.dedup.last_sequence_id("p") == 11
        assert await part.publish("p", msgs(11)) == PublishResult(-1, [(11, 0)])
        assert part.ledger.last_entry_id == 11
    finally:
        await settle(store2)
        await store2.close()


def test_entry_batch_of_encoded_messages_is_the_same_batch() -> None:
    """A send's own encoding plus the producer's name parses as the batch
    the broker would have encoded itself."""
    from buffer._entries import entry_batch

    messages = [
        pb.SingleMessage(payload=b"a", sequence_id=1, key="k", properties={"x": "y"}),
        pb.SingleMessage(payload=b"", sequence_id=2, publish_time_ms=5),
    ]
    encoded = pb.EntryBatch(messages=messages).SerializeToString()
    ours = pb.EntryBatch.FromString(entry_batch("prod", messages, encoded))
    assert ours == pb.EntryBatch.FromString(entry_batch("prod", messages))
    assert ours.producer_name == "prod" and list(ours.messages) == messages
