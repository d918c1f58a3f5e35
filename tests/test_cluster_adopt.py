"""A transaction's sends while their topic's slot moves onto the broker of the
transaction's coordinator, against three real brokers sharing one
PostgreSQL database.

The client moves a producer whose broker left (SIGTERM: it hands its slots
over) to the topic's new owner with `Connection.adopt`: the producer is put
on that broker's connection, then re-created there (PRODUCER, answered once
the topic is loaded), and only then are its frames written. When the new
owner is the coordinator's broker, a send made meanwhile is on the
coordinator's connection but kept, not written; a commit that wrote END_TXN
right behind it would reach the broker first and commit without it
(`Transaction._unwritten` makes the commit wait). Each round moves a slot of
one broker onto the coordinator's, with transactions begun every few
milliseconds throughout (their sends in flight at the leaving broker, kept
during the move, or written at the new owner) and one transaction per
producer whose send is made exactly in its re-creation window. Every
transaction whose commit succeeded must be read exactly once, every one
whose commit failed never. Tests wait for conditions, never for a length
of time."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from client import Client, Transaction, TxnState, errors
from client._producer import Producer
from cluster import placement
from tests._cluster import (
    owner_id,
    owners,
    settled,
    slots,
    start_placed,
    topic_in,
    topic_on,
    wait_for,
)
from tests.conftest import BrokerProcess, until

pytestmark = pytest.mark.integration

PRODUCERS = 3  # per round: each moved once, each one re-creation window
EVERY = 0.02  # seconds between the transactions begun during a move
OPERATION_TIMEOUT = 30.0  # the client's
TTL = 4.0  # the brokers' lease (a SIGTERM does not wait for it; a look every third of it)


class Outcomes:
    """What each transaction's commit said, by the value it sent."""

    def __init__(self) -> None:
        self.committed: set[bytes] = set()
        self.failed: set[bytes] = set()  # aborted: never to be read
        self.unknown: set[bytes] = set()  # outcome unknown to the client: at most once
        self.in_window: set[bytes] = set()  # sent while its producer was being re-created
        self.tasks: list[asyncio.Task[None]] = []

    def send(self, producer: Producer, txn: Transaction, value: bytes) -> None:
        """``value`` in ``txn`` (not awaited: the pipelined path), then commit."""
        conn = producer._conn
        if conn is txn._conn and not conn.is_current(producer._gen):
            self.in_window.add(value)  # (the coordinator's connection, not re-created yet)
        producer.send_nowait(value, txn=txn)
        self.tasks.append(asyncio.ensure_future(self._commit(txn, value)))

    async def _commit(self, txn: Transaction, value: bytes) -> None:
        for _ in range(5):
            try:
                await txn.commit()
                self.committed.add(value)
                return
            except errors.TxnbufError:
                if txn.state is TxnState.ABORTED:
                    self.failed.add(value)
                    return
                if txn.state is not TxnState.COMMITTING:  # (ENDED: not known)
                    break
        self.unknown.add(value)


def on_move_to(producer: Producer, conn: object, then: Callable[[], None]) -> None:
    """Call ``then`` right after ``producer`` is moved to ``conn``, before
    its re-creation there is answered (`Connection.adopt` awaits it)."""
    moved = producer.move_to
    fired = False

    def move_to(target: object) -> None:
        nonlocal fired
        moved(target)  # type: ignore[arg-type]
        if target is conn and not fired:
            fired = True
            asyncio.get_running_loop().call_soon(then)

    producer.move_to = move_to  # type: ignore[method-assign]


async def _move_onto(
    client: Client,
    pg_url: str,
    to: BrokerProcess,
    victim: BrokerProcess,
    staying: list[BrokerProcess],
    anchor: str,
    n: int,
    out: Outcomes,
) -> str:
    """Round ``n``: producers on a topic of ``victim``'s that moves onto
    ``to`` (the coordinator's broker) when ``victim`` is SIGTERMed,
    transactions sending to it all along; its topic."""
    home = client._conn
    # A slot of the victim's that the placement gives to ``to`` once the
    # victim has left (the others keep theirs: sticky).
    held = [owner for _, owner, _ in await slots(pg_url)]
    gone = owner_id(victim)
    after = placement([owner_id(p) for p in staying], [None if o == gone else o for o in held])
    slot = next(k for k, o in enumerate(held) if o == gone and after[k] == owner_id(to))
    topic = topic_in(slot, f"moving{n}-")
    # (kept from the start: a message acknowledged by every subscription may be trimmed)
    await (await client.subscribe(topic, "check", initial_position="earliest")).close()
    producers = [await client.create_producer(topic) for _ in range(PRODUCERS)]
    assert {p._conn.url for p in producers} == {victim.url}
    for i, producer in enumerate(producers):
        txn = await client.new_transaction(near=anchor)
        txn.flush()  # (the full path: its END may be written behind its sends)
        value = b"r%d-window%d" % (n, i)
        on_move_to(producer, home, lambda p=producer, t=txn, v=value: out.send(p, t, v))

    def all_placed() -> bool:
        return all(p._conn is home and home.is_current(p._gen) for p in producers)

    async def stream() -> None:
        i = 0
        while not all_placed():
            try:
                txn = await client.new_transaction(near=anchor)
            except errors.TxnbufError:
                await asyncio.sleep(EVERY)
                continue
            txn.flush()
            out.send(producers[i % PRODUCERS], txn, b"r%d-%04d" % (n, i))
            i += 1
            await asyncio.sleep(EVERY)

    moves = client._brokers.moves
    streaming = asyncio.ensure_future(stream())
    await until(lambda: len(out.tasks) >= 5, "transactions under way")
    assert victim.proc is not None
    leaving = producers[0]._conn
    links = leaving.gen
    signalled = time.monotonic()
    victim.proc.send_signal(signal.SIGTERM)
    await until(all_placed, "the producers re-created at the coordinator's broker")
    took = time.monotonic() - signalled
    await streaming
    # A broker stopping accepts no connection: one accepted while it hands
    # its slots over, or after, was answered nothing (not CONNECT, not
    # PRODUCER), and the producers waited out their operation timeout.
    assert leaving.gen == links, "the stopping broker accepted a connection"
    assert took < OPERATION_TIMEOUT, f"the producers stalled {took:.1f}s (an unanswered request)"
    assert client._brokers.moves >= moves + PRODUCERS  # (each moved: `Connection.adopt`)
    assert slot in (await owners(pg_url))[owner_id(to)]  # (the placement foreseen)
    await asyncio.gather(*out.tasks)
    await until(lambda: victim.proc is not None and victim.proc.poll() is not None, "it stopped")
    assert victim.proc.returncode == 0
    await wait_for("the slots settled", lambda: settled(pg_url, staying))
    print(
        f"round {n}: the producers re-created at the coordinator's broker {took:.2f}s after SIGTERM"
    )
    return topic


async def test_sends_of_a_transaction_survive_their_slot_moving_onto_its_coordinators_broker(
    tmp_path: Path,
    pg_url: str,
    logs: list[BrokerProcess],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two rounds: b leaves (its slot goes to a), then c (every slot to a)."""
    t0 = time.monotonic()
    found = await start_placed(tmp_path, pg_url, logs, ttl=TTL)
    a, b, c = logs
    anchor = topic_on(found, a, "anchor")
    out = Outcomes()
    caplog.set_level(logging.WARNING, logger="client")
    async with Client(a.url, operation_timeout=OPERATION_TIMEOUT) as client:
        probe = await client.new_transaction(near=anchor)
        assert probe._conn is client._conn  # (the coordinator is a's, the client's home)
        await probe.abort()
        topics = [
            await _move_onto(client, pg_url, a, b, [a, c], anchor, 0, out),
            await _move_onto(client, pg_url, a, c, [a], anchor, 1, out),
        ]
        # What is stored: read committed, every topic from its start.
        read: dict[bytes, int] = {}
        for n, topic in enumerate(topics):
            reader = await client.subscribe(topic, "final", initial_position="earliest")
            ours = b"r%d-" % n
            wanted = {v for v in out.committed if v.startswith(ours)}
            with pytest.raises(errors.OperationTimeoutError):
                while True:
                    seen = {v for v in read if v.startswith(ours)}
                    message = await reader.receive(timeout=1.0 if wanted <= seen else 20)
                    read[message.value] = read.get(message.value, 0) + 1
                    await reader.acknowledge(message)
    windows = sorted(out.in_window)
    print(
        f"{len(out.committed)} committed, {len(out.failed)} failed, {len(out.unknown)} unknown; "
        f"sent in a re-creation window: {windows}; {time.monotonic() - t0:.1f}s"
    )
    # The race was run: every producer's window send was made while it was
    # on the coordinator's connection, not re-created yet.
    assert {b"r%d-window%d" % (n, i) for n in range(2) for i in range(PRODUCERS)} <= out.in_window
    twice = sorted(v for v, k in read.items() if k > 1)
    lost = sorted(out.committed - set(read))
    aborted_read = sorted(out.failed & set(read))
    assert not twice and not lost and not aborted_read, (
        f"read twice: {twice}; committed, not read: {lost}; aborted, read: {aborted_read}"
    )
    assert set(read) <= out.committed | out.unknown
    assert out.in_window <= out.committed  # (nothing refused them: they went in)
    holes = [r.getMessage() for r in caplog.records if "commit succeeded" in r.getMessage()]
    assert not holes
