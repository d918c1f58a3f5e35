"""Unit tests of one piece of the broker's connection: what END_TXN
``after_ops`` waits for (`broker._transactions`; a stub stands in for the
broker's coordinator)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker._acl import AclStore
from broker._auth import Security
from broker._connection import Connection
from broker._transactions import Transactions
from proto import refusals
from proto import txnbuf_pb2 as pb
from tc import TxnID


class _Coordinator:
    def __init__(self) -> None:
        self.open = True

    def is_open(self, txnid: TxnID) -> bool:
        return self.open


class _Broker:
    def __init__(self) -> None:
        self.tc = _Coordinator()
        self.security = Security(AclStore(Path("unused-acl.json")))  # (never written)

    def coordinator(self, txnid: TxnID) -> _Coordinator:
        return self.tc


IDS = dict(txnid_most_bits=0, txnid_least_bits=5)


def connection() -> tuple[Transactions, _Broker]:
    broker = _Broker()
    return Connection(broker, None, "test").txns, broker  # type: ignore[arg-type]


async def test_end_after_ops_waits_for_every_op_read_before_it() -> None:
    conn, _ = connection()
    send = pb.CommandSend(transactional=True, **IDS)
    ack = pb.CommandAck(transactional=True, **IDS)
    other = pb.CommandSend(transactional=True, txnid_most_bits=0, txnid_least_bits=6)
    for op in (send, ack, other):
        conn.op_read(op)
    end = pb.CommandEndTxn(txn_action=pb.COMMIT, after_ops=True, **IDS)
    waiting = asyncio.ensure_future(conn.ops_answered(end))
    await asyncio.sleep(0.01)
    conn.op_answered(send, None)
    conn.op_answered(other, None)  # (another transaction's)
    await asyncio.sleep(0.01)
    assert not waiting.done()
    conn.op_answered(ack, None)
    await asyncio.wait_for(waiting, 1.0)
    assert conn._txn_ops == {}  # nothing kept once all succeeded


async def test_end_after_ops_is_refused_while_a_failed_op_is_remembered() -> None:
    conn, broker = connection()
    send = pb.CommandSend(transactional=True, **IDS)
    conn.op_read(send)
    conn.op_read(send)
    end = pb.CommandEndTxn(txn_action=pb.COMMIT, after_ops=True, **IDS)
    waiting = asyncio.ensure_future(conn.ops_answered(end))
    conn.op_answered(send, "no such partition")
    await asyncio.sleep(0.01)
    assert not waiting.done()  # one still unanswered
    conn.op_answered(send, None)
    with pytest.raises(refusals.NotAllowed, match="no such partition") as refused:
        await asyncio.wait_for(waiting, 1.0)
    assert refused.value.code == pb.NOT_ALLOWED
    with pytest.raises(refusals.NotAllowed):  # asked again: still refused
        await conn.ops_answered(end)
    broker.tc.open = False  # ended already (an earlier END): answered as a repeat
    await conn.ops_answered(end)


def test_a_refused_transactional_send_or_ack_is_logged_at_info_not_owner_at_debug(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What tracing a checker finding needs in the broker's log: a send or
    ack refused in a transaction (e.g. one that came after its END) at
    INFO, naming the transaction; NOT_OWNER (sent again at the owner, as a
    slot moves) only at DEBUG."""
    conn, _ = connection()
    send = pb.CommandSend(transactional=True, **IDS)
    ack = pb.CommandAck(transactional=True, **IDS)
    caplog.set_level("DEBUG", logger="broker._transactions")
    conn.op_read(send)
    conn.op_answered(send, "cannot add participants to a transaction that is COMMITTED", 9)
    conn.op_read(ack)
    conn.op_answered(ack, "slot 3 is owned by b", pb.NOT_OWNER)
    conn.op_read(send)
    conn.op_answered(send, None)
    got = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert got == [
        (
            "INFO",
            f"connection test: send of transaction {TxnID(0, 5)} refused: cannot add "
            "participants to a transaction that is COMMITTED",
        ),
        (
            "DEBUG",
            f"connection test: ack of transaction {TxnID(0, 5)} refused: slot 3 is owned by b",
        ),
    ]
