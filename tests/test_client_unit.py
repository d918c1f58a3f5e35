"""Unit tests of the client SDK that need no real broker.

Pure pieces (errors registry, message ids, decoding, routing, frame
building) are tested directly; request/receipt matching, batching, flow
control, acks and the reconnect path run against ``FakeBroker``, a small
in-process aiohttp WebSocket server speaking the txnbuf protocol with
in-memory storage and per-partition deduplication. It also plays the
transaction coordinator (NEW_TXN, END_TXN) and the transactional side of
SEND and ACK (which add their partition / subscription to the
transaction), for ``test_client_txn_unit.py``. It records a violation,
checked at teardown, for any command or field the protocol does not allow.
"""

from __future__ import annotations

import ast
import asyncio
import socket
import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType, web

import client
import proto
from client import Client, Message, MessageId, TransactionGroups, errors
from client._connection import PROTOCOL_VERSION
from client._consumer import ack_ranges, build_ack
from client._message import decode_entry
from client._producer import build_send, partition_for_key
from proto import txnbuf_pb2 as pb
from tests.conftest import until

T = pb.BaseCommand


# --- the fake broker ----------------------------------------------------------


def frame(kind: int, field_name: str, **fields: Any) -> bytes:
    cmd = pb.BaseCommand(type=kind)  # type: ignore[arg-type]
    inner = getattr(cmd, field_name)
    inner.SetInParent()
    for name, value in fields.items():
        if name == "message_ids":
            for mid in value:
                inner.message_ids.add().CopyFrom(mid)
        elif name == "entries":
            for entry in value:
                inner.entries.add().CopyFrom(entry)
        elif name == "tc_ids":
            inner.tc_ids.extend(value)
        else:
            setattr(inner, name, value)
    return cmd.SerializeToString()


@dataclass
class FakeTxn:
    """A transaction as the fake coordinator and partitions know it."""

    tc_id: int
    ttl_ms: int
    status: str = "OPEN"  # OPEN, COMMITTED, ABORTED
    partitions: set[tuple[str, int]] = field(default_factory=set)
    subscriptions: set[tuple[str, str]] = field(default_factory=set)
    # (topic, partition) -> [(producer name, message)]: the sidecar buffer
    buffers: dict[tuple[str, int], list[tuple[str, pb.SingleMessage]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    seen: dict[tuple[str, int, str, int], int] = field(default_factory=dict)  # -> index
    failed: bool = False  # a SEND or ACK of it was refused (END_TXN after_ops is refused)


@dataclass
class Sub:
    sub_type: int
    cursor: dict[int, int]  # partition -> next entry index to deliver
    unacked: dict[tuple[int, int, int], int] = field(default_factory=dict)  # id -> redeliveries
    redeliver: list[tuple[int, int, int]] = field(default_factory=list)
    consumer: tuple[web.WebSocketResponse, int] | None = None
    permits: int = 0


class FakeBroker:
    """Enough of the txnbuf broker for client unit tests (see module doc)."""

    def __init__(self) -> None:
        self.partitions: dict[str, int] = {}
        self.default_partitions = 1
        self.ledgers: dict[tuple[str, int], list[pb.EntryBatch]] = defaultdict(list)
        self.dedup: dict[tuple[str, int, str], dict[int, tuple[int, int, int]]] = defaultdict(dict)
        self.subs: dict[tuple[str, str], Sub] = {}
        self.sockets: set[web.WebSocketResponse] = set()
        self.received: list[pb.BaseCommand] = []
        self.connects = 0
        self.bad_frames: list[pb.BaseCommand] = []  # type and oneof field disagree
        # knobs for tests
        self.store_without_receipt = False
        self.ignore_sends = False
        self.send_error: int | None = None
        self.refuse_producer: list[int] = []  # error codes for the next PRODUCER requests
        self.ack_errors: list[int] = []  # error codes for the next plain ACKs (nothing changes)
        self.txn_ack_errors: list[int] = []  # the same for transactional ACKs
        self.send_errors: list[int] = []  # error codes for the next SENDs (nothing stored)
        self.last_sequence_id: dict[str, int] = {}
        self.max_message_size = 5 * 1024 * 1024
        self.protocol_version = PROTOCOL_VERSION  # announced in CONNECTED
        # the coordinator
        self.tc_ids: list[int] = []  # CONNECTED.tc_ids
        # a cluster's broker: CONNECTED.slots, and where LOOKUP sends a client
        # (None: CONNECT, here)
        self.slots = 0
        self.redirect: str | None = None
        self.txns: dict[tuple[int, int], FakeTxn] = {}
        self.txn_counters: dict[int, int] = defaultdict(int)
        # (topic, subscription, message id) -> the txn holding it in PENDING_ACK
        self.pending_acks: dict[tuple[str, str, tuple[int, int, int]], tuple[int, int]] = {}
        self.txn_errors: dict[int, list[int]] = defaultdict(list)  # type -> next error codes
        # END_TXN after_ops: the transactional SENDs / ACKs not answered yet
        # (request id -> txn), and the ENDs waiting for them (txn -> END).
        self.unanswered: dict[int, tuple[int, int]] = {}
        self.ends_waiting: dict[tuple[int, int], tuple[web.WebSocketResponse, Any]] = {}
        self.hold: set[int] = set()  # request types whose answers wait for release()
        self.held: list[tuple[web.WebSocketResponse, bytes]] = []
        self.close_after: set[int] = set()  # request types after whose answer the socket closes
        self.violations: list[str] = []  # protocol rules the client broke
        self.port = 0
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/ws", self._ws)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        if not self.port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()

    async def stop(self) -> None:
        for ws in list(self.sockets):
            await ws.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def restart(self) -> None:
        """Stop and start on the same port, keeping the stored data (a broker
        restart): every connection and consumer registration is lost."""
        await self.stop()
        for sub in self.subs.values():
            self._drop_consumer(sub)
        await self.start()

    async def drop_connections(self) -> None:
        for ws in list(self.sockets):
            await ws.close()

    def types(self) -> list[str]:
        return [T.Type.Name(cmd.type) for cmd in self.received]

    def sends(self) -> list[pb.CommandSend]:
        return [cmd.send for cmd in self.received if cmd.type == T.SEND]

    def acks(self) -> list[pb.CommandAck]:
        return [cmd.ack for cmd in self.received if cmd.type == T.ACK]

    def stored(self, topic: str, partition: int = 0) -> list[bytes]:
        return [m.payload for b in self.ledgers[topic, partition] for m in b.messages]

    def of_type(self, kind: int) -> list[pb.BaseCommand]:
        return [cmd for cmd in self.received if cmd.type == kind]

    async def release(self) -> None:
        """Send the answers withheld because of ``hold`` (to live sockets)."""
        held, self.held = self.held, []
        for ws, data in held:
            if not ws.closed:
                await ws.send_bytes(data)

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        self.sockets.add(ws)
        producers: dict[int, tuple[str, str]] = {}
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY:
                    continue
                outer = pb.BaseCommand.FromString(msg.data)
                # (The client joins what it queued at once.)
                batch = outer.batch.commands if outer.type == T.BATCH else [outer]
                for cmd in batch:
                    self.received.append(cmd)
                    if cmd.WhichOneof("command") != T.Type.Name(cmd.type).lower():
                        self.bad_frames.append(cmd)
                    await self._handle(ws, cmd, producers)
        finally:
            self.sockets.discard(ws)
            for sub in self.subs.values():
                if sub.consumer is not None and sub.consumer[0] is ws:
                    self._drop_consumer(sub)
        return ws

    def _drop_consumer(self, sub: Sub) -> None:
        sub.consumer = None
        sub.permits = 0
        sub.redeliver = sorted(sub.unacked)

    async def _handle(
        self, ws: web.WebSocketResponse, cmd: pb.BaseCommand, producers: dict[int, tuple[str, str]]
    ) -> None:
        kind = cmd.type
        if kind == T.CONNECT:
            self.connects += 1
            await ws.send_bytes(
                frame(
                    T.CONNECTED,
                    "connected",
                    max_message_size=self.max_message_size,
                    tc_ids=self.tc_ids,
                    protocol_version=self.protocol_version,
                    slots=self.slots,
                )
            )
        elif kind == T.LOOKUP:
            answer: dict[str, Any] = {"request_id": cmd.lookup.request_id, "authoritative": True}
            if self.redirect is not None:
                answer["broker_service_url"] = self.redirect
                answer["response"] = pb.CommandLookupTopicResponse.REDIRECT
            await ws.send_bytes(frame(T.LOOKUP_RESPONSE, "lookup_response", **answer))
        elif kind == T.PARTITIONED_METADATA:
            req = cmd.partitioned_metadata
            n = self.partitions.setdefault(req.topic, self.default_partitions)
            await ws.send_bytes(
                frame(
                    T.PARTITIONED_METADATA_RESPONSE,
                    "partitioned_metadata_response",
                    request_id=req.request_id,
                    partitions=n,
                )
            )
        elif kind == T.PRODUCER:
            req = cmd.producer
            if self.refuse_producer:
                code = self.refuse_producer.pop(0)
                await ws.send_bytes(frame(T.ERROR, "error", request_id=req.request_id, error=code))
                return
            producers[req.producer_id] = (req.topic, req.producer_name)
            await ws.send_bytes(
                frame(
                    T.PRODUCER_SUCCESS,
                    "producer_success",
                    request_id=req.request_id,
                    producer_name=req.producer_name,
                    last_sequence_id=self.last_sequence_id.get(req.producer_name, -1),
                    partitions=self.partitions[req.topic],
                )
            )
        elif kind == T.CLOSE_PRODUCER:
            producers.pop(cmd.close_producer.producer_id, None)
            await ws.send_bytes(
                frame(T.SUCCESS, "success", request_id=cmd.close_producer.request_id)
            )
        elif kind == T.SEND:
            await self._on_send(ws, cmd.send, producers)
        elif kind == T.SUBSCRIBE:
            req = cmd.subscribe
            if any(sub.consumer == (ws, req.consumer_id) for sub in self.subs.values()):
                # (as the broker: an id held on this connection is refused)
                await ws.send_bytes(
                    frame(
                        T.ERROR,
                        "error",
                        request_id=req.request_id,
                        error=pb.INVALID_ARGUMENT,
                        message=f"consumer id {req.consumer_id} is in use on this connection",
                    )
                )
                return
            key = (req.topic, req.subscription)
            sub = self.subs.get(key)
            if sub is None:  # (the topic is created, as the broker does)
                n = self.partitions.setdefault(req.topic, self.default_partitions)
                cursor = {
                    p: 0 if req.initial_position == 1 else len(self.ledgers[req.topic, p])
                    for p in range(n)
                }
                sub = self.subs[key] = Sub(req.sub_type, cursor)
            if sub.consumer is not None:
                await ws.send_bytes(
                    frame(T.ERROR, "error", request_id=req.request_id, error=pb.CONSUMER_BUSY)
                )
                return
            sub.consumer = (ws, req.consumer_id)
            await ws.send_bytes(frame(T.SUCCESS, "success", request_id=req.request_id))
        elif kind == T.FLOW:
            for (topic, _), sub in self.subs.items():
                if sub.consumer == (ws, cmd.flow.consumer_id):
                    sub.permits += cmd.flow.permits
                    await self._deliver(topic, sub)
        elif kind == T.ACK:
            await self._on_ack(ws, cmd.ack)
        elif kind == T.REDELIVER_UNACKNOWLEDGED:
            for (topic, _), sub in self.subs.items():
                if sub.consumer == (ws, cmd.redeliver_unacknowledged.consumer_id):
                    ids = cmd.redeliver_unacknowledged.message_ids
                    wanted = (
                        [(m.partition, m.entry_id, m.batch_index) for m in ids]
                        if ids
                        else sorted(sub.unacked)
                    )
                    sub.redeliver.extend(i for i in wanted if i in sub.unacked)
                    await self._deliver(topic, sub)
        elif kind == T.CLOSE_CONSUMER:
            for sub in self.subs.values():
                if sub.consumer == (ws, cmd.close_consumer.consumer_id):
                    self._drop_consumer(sub)
            await ws.send_bytes(
                frame(T.SUCCESS, "success", request_id=cmd.close_consumer.request_id)
            )
        elif kind in (T.NEW_TXN, T.END_TXN, T.COMMIT_TXN):
            await self._on_coordinator(ws, cmd, producers)
        elif kind != T.PONG:
            self.violations.append(f"the client sent {T.Type.Name(kind)}")

    # --- the coordinator ------------------------------------------------------

    def txn(self, txn_id: Any) -> FakeTxn:
        return self.txns[txn_id.most_bits, txn_id.least_bits]

    async def _on_coordinator(
        self,
        ws: web.WebSocketResponse,
        cmd: pb.BaseCommand,
        producers: dict[int, tuple[str, str]] | None = None,
    ) -> None:
        kind = cmd.type
        req: Any = getattr(cmd, cmd.WhichOneof("command") or "")
        error = self.txn_errors[kind].pop(0) if self.txn_errors[kind] else None
        txn: FakeTxn | None = None
        if kind == T.NEW_TXN:
            fields: dict[str, Any] = dict(request_id=req.request_id)
            if error is None:
                most, least = self._open_txn(req.tc_id, req.txn_ttl_ms)
                fields.update(txnid_most_bits=most, txnid_least_bits=least)
            else:
                fields["error"] = error
            answer = frame(T.NEW_TXN_RESPONSE, "new_txn_response", **fields)
        elif kind == T.COMMIT_TXN:
            key = (req.txnid_most_bits, req.txnid_least_bits)
            txn = self.txns.get(key)
            if error is None and txn is None:
                error = pb.TRANSACTION_NOT_FOUND
            if error is None and txn is not None:
                error = self._commit_txn(ws, req, txn, key, producers or {})
            fields = dict(
                request_id=req.request_id, txnid_most_bits=key[0], txnid_least_bits=key[1]
            )
            if error is not None:
                fields.update(error=error, message="fake coordinator")
            if req.HasField("next_txn_ttl_ms") and error is None:
                most, least = self._open_txn(req.next_tc_id, req.next_txn_ttl_ms)
                fields.update(next_txnid_most_bits=most, next_txnid_least_bits=least)
            answer = frame(T.TXN_RESPONSE, "txn_response", **fields)
        else:
            key = (req.txnid_most_bits, req.txnid_least_bits)
            if req.after_ops and key in self.unanswered.values():
                self.ends_waiting[key] = (ws, cmd)  # (answered once they are)
                return
            txn = self.txns.get(key)
            if error is None and txn is None:
                error = pb.TRANSACTION_NOT_FOUND
            if error is None and req.after_ops and txn is not None and txn.failed:
                refused = txn.status == "OPEN" and req.txn_action == pb.COMMIT
                error = pb.NOT_ALLOWED if refused else None
            if error is None and txn is not None:
                error = self._end_txn_command(req, txn)
            fields = dict(
                request_id=req.request_id, txnid_most_bits=key[0], txnid_least_bits=key[1]
            )
            if error is not None:
                fields.update(error=error, message="fake coordinator")
            if req.HasField("next_txn_ttl_ms") and error is None:
                # (the broker answers a spare only with a success)
                most, least = self._open_txn(req.next_tc_id, req.next_txn_ttl_ms)
                fields.update(next_txnid_most_bits=most, next_txnid_least_bits=least)
            answer = frame(T.TXN_RESPONSE, "txn_response", **fields)
        if kind in self.hold:
            self.held.append((ws, answer))
        elif not ws.closed:
            await ws.send_bytes(answer)
        if kind in self.close_after:
            self.close_after.discard(kind)
            await ws.close()
        if kind in (T.END_TXN, T.COMMIT_TXN) and txn is not None and txn.status == "COMMITTED":
            for (sub_topic, _), sub in self.subs.items():
                if any(topic == sub_topic for topic, _ in txn.buffers):
                    await self._deliver(sub_topic, sub)

    def _commit_txn(
        self,
        ws: web.WebSocketResponse,
        req: pb.CommandCommitTxn,
        txn: FakeTxn,
        key: tuple[int, int],
        producers: dict[int, tuple[str, str]],
    ) -> int | None:
        """A local transaction's COMMIT_TXN: everything checked, then stored
        and acknowledged at once (a commit again: done; nothing twice)."""
        if txn.status == "COMMITTED":
            return None
        if txn.status != "OPEN" or txn.partitions or txn.subscriptions:
            return pb.INVALID_TXN_STATUS
        acked: list[tuple[str, str, tuple[int, int, int]]] = []
        for held in req.acks:
            flat = list(held.ranges)
            if not flat or len(flat) % 4:
                self.violations.append(f"COMMIT_TXN ranges not whole quadruples: {flat}")
            found = [
                (t, n, s) for (t, n), s in self.subs.items() if s.consumer == (ws, held.consumer_id)
            ]
            if not found:
                return pb.CONSUMER_NOT_FOUND
            topic, name, sub = found[0]
            for mid in range_ids(flat):
                holder = self.pending_acks.get((topic, name, mid))
                if holder is not None and holder != key:
                    return pb.TRANSACTION_CONFLICT
                if mid not in sub.unacked:
                    return pb.UNKNOWN_MESSAGE_ID
                acked.append((topic, name, mid))
        for send in req.sends:
            if send.producer_id not in producers:
                return pb.PRODUCER_NOT_FOUND
        for send in req.sends:
            topic, name = producers[send.producer_id]
            buffer = txn.buffers[topic, send.partition]
            for single in pb.EntryBatch.FromString(send.batch).messages:
                buffer.append((name, single))
        txn.status = "COMMITTED"
        self._end_txn(key, txn)
        for topic, name, mid in acked:
            self.subs[topic, name].unacked.pop(mid, None)
        return None

    async def _reply(self, ws: web.WebSocketResponse, data: bytes) -> None:
        """Send the answer ``data`` to a SEND or ACK (see `_answered`)."""
        if not ws.closed:
            await ws.send_bytes(data)
        await self._answered(data)

    async def _answered(self, data: bytes) -> None:
        """``data`` answered a SEND or ACK: an END_TXN after_ops waiting for
        it goes on once its transaction's are all answered."""
        cmd = pb.BaseCommand.FromString(data)
        if cmd.type not in (T.SEND_RECEIPT, T.SEND_ERROR, T.ACK_RESPONSE):
            return
        body = getattr(cmd, cmd.WhichOneof("command") or "")
        key = self.unanswered.pop(body.request_id, None)
        if key is None:
            return
        if cmd.type == T.SEND_ERROR or (cmd.type == T.ACK_RESPONSE and body.HasField("error")):
            self.txns[key].failed = True
        if key in self.ends_waiting and key not in self.unanswered.values():
            await self._on_coordinator(*self.ends_waiting.pop(key))

    def _open_txn(self, tc_id: int, ttl_ms: int) -> tuple[int, int]:
        self.txn_counters[tc_id] += 1
        most, least = tc_id << 48, self.txn_counters[tc_id]
        self.txns[most, least] = FakeTxn(tc_id, ttl_ms)
        return most, least

    def _end_txn_command(self, req: pb.CommandEndTxn, txn: FakeTxn) -> int | None:
        wanted = "COMMITTED" if req.txn_action == pb.COMMIT else "ABORTED"
        if txn.status == wanted:
            return None  # idempotent
        if txn.status != "OPEN":
            return pb.INVALID_TXN_STATUS
        txn.status = wanted
        self._end_txn((req.txnid_most_bits, req.txnid_least_bits), txn)
        return None

    def _end_txn(self, key: tuple[int, int], txn: FakeTxn) -> None:
        committed = txn.status == "COMMITTED"
        for (topic, partition), buffered in txn.buffers.items():
            if committed and buffered:
                by_producer: dict[str, pb.EntryBatch] = {}
                for name, single in buffered:
                    batch = by_producer.setdefault(name, pb.EntryBatch(producer_name=name))
                    batch.messages.add().CopyFrom(single)
                self.ledgers[topic, partition].extend(by_producer.values())
        for where, holder in list(self.pending_acks.items()):
            if holder == key:
                del self.pending_acks[where]
                topic, subscription, mid = where
                if committed:
                    self.subs[topic, subscription].unacked.pop(mid, None)

    async def _on_send(
        self, ws: web.WebSocketResponse, send: pb.CommandSend, producers: dict[int, Any]
    ) -> None:
        messages = messages_of(send)
        if not messages:
            self.violations.append("a SEND without messages in its batch")
        seqs = [m.sequence_id for m in messages]
        consecutive = seqs == list(range(seqs[0], seqs[0] + len(seqs))) if seqs else False
        if send.HasField("first_sequence_id") != consecutive or (
            consecutive and send.first_sequence_id != seqs[0]
        ):
            self.violations.append(f"SEND sequence ids {seqs}, first_sequence_id wrong")
        if send.transactional and (send.txnid_most_bits, send.txnid_least_bits) in self.txns:
            self.unanswered[send.request_id] = (send.txnid_most_bits, send.txnid_least_bits)
        if self.ignore_sends:
            return
        error = self.send_errors.pop(0) if self.send_errors else self.send_error
        if error is None and send.producer_id not in producers:
            error = pb.PRODUCER_NOT_FOUND  # (as the broker: closed, or never created)
        if error is not None:
            await self._reply(
                ws,
                frame(
                    T.SEND_ERROR,
                    "send_error",
                    producer_id=send.producer_id,
                    request_id=send.request_id,
                    error=error,
                    message="injected",
                ),
            )
            return
        topic, name = producers[send.producer_id]
        if send.transactional:
            await self._on_txn_send(ws, send, messages, topic, name)
            return
        seen = self.dedup[topic, send.partition, name]
        ledger = self.ledgers[topic, send.partition]
        entry_id = len(ledger)
        batch = pb.EntryBatch(producer_name=name)
        ids = []
        for single in messages:
            if single.sequence_id in seen:
                ids.append(seen[single.sequence_id])
                continue
            mid = (send.partition, entry_id, len(batch.messages))
            batch.messages.add().CopyFrom(single)
            seen[single.sequence_id] = mid
            ids.append(mid)
        if batch.messages:
            ledger.append(batch)
        if self.store_without_receipt:
            return
        fields: dict[str, Any] = dict(
            producer_id=send.producer_id,
            request_id=send.request_id,
            partition=send.partition,
            entry_id=entry_id,
        )
        if len(batch.messages) != len(messages):
            fields["message_ids"] = [
                pb.MessageIdData(partition=p, entry_id=e, batch_index=i) for p, e, i in ids
            ]
        await self._reply(ws, frame(T.SEND_RECEIPT, "send_receipt", **fields))
        for (sub_topic, _), sub in self.subs.items():
            if sub_topic == topic:
                await self._deliver(topic, sub)

    async def _on_txn_send(
        self,
        ws: web.WebSocketResponse,
        send: pb.CommandSend,
        messages: list[pb.SingleMessage],
        topic: str,
        name: str,
    ) -> None:
        txn = self.txns.get((send.txnid_most_bits, send.txnid_least_bits))
        error = None
        if txn is None:
            error = pb.TRANSACTION_NOT_FOUND
        elif txn.status != "OPEN":
            error = pb.INVALID_TXN_STATUS
        else:
            txn.partitions.add((topic, send.partition))  # (the broker adds it)
        if txn is None or error is not None:
            await self._reply(
                ws,
                frame(
                    T.SEND_ERROR,
                    "send_error",
                    producer_id=send.producer_id,
                    request_id=send.request_id,
                    error=error,
                ),
            )
            return
        buffer = txn.buffers[topic, send.partition]
        ids = []
        for single in messages:
            where = (topic, send.partition, name, single.sequence_id)
            if where not in txn.seen:
                txn.seen[where] = len(buffer)
                buffer.append((name, single))
            ids.append(
                pb.MessageIdData(partition=send.partition, entry_id=-1, batch_index=txn.seen[where])
            )
        if self.store_without_receipt:
            return
        await self._reply(
            ws,
            frame(
                T.SEND_RECEIPT,
                "send_receipt",
                producer_id=send.producer_id,
                request_id=send.request_id,
                partition=send.partition,
                entry_id=-1,
                message_ids=ids,
            ),
        )

    async def _deliver(self, topic: str, sub: Sub) -> None:
        if sub.consumer is None:
            return
        ws, consumer_id = sub.consumer
        entries = []
        while sub.redeliver and sub.permits > 0:
            p, e, i = sub.redeliver.pop(0)
            sub.unacked[p, e, i] += 1
            data = self.ledgers[topic, p][e].SerializeToString()
            entries.append(
                pb.DeliveredEntry(
                    partition=p,
                    entry_id=e,
                    data=data,
                    indexes=[i],
                    redelivery_count=sub.unacked[p, e, i],
                )
            )
            sub.permits -= 1
        for p, next_entry in sub.cursor.items():
            ledger = self.ledgers[topic, p]
            while sub.permits > 0 and next_entry < len(ledger):
                batch = ledger[next_entry]
                for i in range(len(batch.messages)):
                    sub.unacked[p, next_entry, i] = 0
                entries.append(
                    pb.DeliveredEntry(
                        partition=p, entry_id=next_entry, data=batch.SerializeToString()
                    )
                )
                sub.permits -= len(batch.messages)
                next_entry += 1
            sub.cursor[p] = next_entry
        if entries:
            await ws.send_bytes(
                frame(T.MESSAGE, "message", consumer_id=consumer_id, entries=entries)
            )

    async def _on_ack(self, ws: web.WebSocketResponse, ack: pb.CommandAck) -> None:
        if not ack.ranges or len(ack.ranges) % 4:
            self.violations.append(f"ACK ranges not whole quadruples: {list(ack.ranges)}")
        if ack.transactional and (ack.txnid_most_bits, ack.txnid_least_bits) in self.txns:
            self.unanswered[ack.request_id] = (ack.txnid_most_bits, ack.txnid_least_bits)
        error = None
        refusals_next = self.txn_ack_errors if ack.transactional else self.ack_errors
        if refusals_next:
            error = refusals_next.pop(0)
            fields = dict(consumer_id=ack.consumer_id, request_id=ack.request_id, error=error)
            await self._reply(ws, frame(T.ACK_RESPONSE, "ack_response", **fields))
            return
        for (topic, name), sub in self.subs.items():
            if sub.consumer != (ws, ack.consumer_id):
                continue
            if ack.transactional:
                error = self._txn_ack(topic, name, sub, ack)
                continue
            ids = ack_ids(ack)
            if ack.ack_type == pb.CommandAck.CUMULATIVE:
                if sub.sub_type == pb.CommandSubscribe.SHARED:
                    error = pb.NOT_ALLOWED
                else:
                    (last,) = ids
                    for mid in [m for m in sub.unacked if m[0] == last[0] and m <= last]:
                        del sub.unacked[mid]
            elif any(mid not in sub.unacked for mid in ids):
                error = pb.UNKNOWN_MESSAGE_ID  # this fake refuses the whole frame
            else:
                for mid in ids:
                    del sub.unacked[mid]
        fields: dict[str, Any] = dict(consumer_id=ack.consumer_id, request_id=ack.request_id)
        if error is not None:
            fields["error"] = error
        await self._reply(ws, frame(T.ACK_RESPONSE, "ack_response", **fields))

    def _txn_ack(self, topic: str, name: str, sub: Sub, ack: pb.CommandAck) -> int | None:
        """PENDING -> PENDING_ACK for the txn, all ids or none."""
        key = (ack.txnid_most_bits, ack.txnid_least_bits)
        txn = self.txns.get(key)
        if txn is None:
            return pb.TRANSACTION_NOT_FOUND
        if txn.status != "OPEN":
            return pb.INVALID_TXN_STATUS
        txn.subscriptions.add((topic, name))  # (the broker adds it)
        ids = ack_ids(ack)
        if ack.ack_type == pb.CommandAck.CUMULATIVE:
            (last,) = ids
            ids = [m for m in sub.unacked if m[0] == last[0] and m <= last]
        for mid in ids:
            holder = self.pending_acks.get((topic, name, mid))
            if holder is not None and holder != key:
                return pb.TRANSACTION_CONFLICT
            if mid not in sub.unacked:
                return pb.UNKNOWN_MESSAGE_ID
        for mid in ids:
            self.pending_acks[topic, name, mid] = key
        return None

    async def push(self, data: bytes) -> None:
        """Send ``data`` on every socket (an answer to a SEND or ACK counts
        as answered, see `_reply`)."""
        for ws in list(self.sockets):
            await ws.send_bytes(data)
        await self._answered(data)


def ack_ids(ack: pb.CommandAck) -> list[tuple[int, int, int]]:
    """The messages an ACK names (its ``ranges``; a cumulative ack's range
    is its bound)."""
    ids = range_ids(list(ack.ranges))
    return ids[-1:] if ack.ack_type == pb.CommandAck.CUMULATIVE else ids


def range_ids(flat: list[int]) -> list[tuple[int, int, int]]:
    """The messages of flat (partition, entry, first, last) ranges."""
    return [
        (p, e, i)
        for p, e, first, last in zip(flat[0::4], flat[1::4], flat[2::4], flat[3::4], strict=True)
        for i in range(first, last + 1)
    ]


def messages_of(send: pb.CommandSend) -> list[pb.SingleMessage]:
    """The messages a SEND carries (its encoded ``batch``)."""
    return list(pb.EntryBatch.FromString(send.batch).messages)


@pytest.fixture
async def fake() -> Any:
    server = FakeBroker()
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
    assert not server.bad_frames
    assert not server.violations


@pytest.fixture
async def cli(fake: FakeBroker) -> Any:
    async with Client(fake.url, operation_timeout=5.0) as c:
        yield c


async def drop_sockets(fake: FakeBroker) -> None:
    """Close the broker's end of every connection (the client reconnects)."""
    for ws in list(fake.sockets):
        await ws.close()
    await until(lambda: not fake.sockets)


# --- errors -------------------------------------------------------------------


def test_every_wire_code_maps_to_its_own_class() -> None:
    classes = {}
    for name, code in pb.ServerError.items():
        cls = errors.for_code(code)
        assert cls.code == code, name
        assert issubclass(cls, errors.ServerError)
        classes[code] = cls
    assert len(set(classes.values())) == len(classes)


def test_retriable_codes_are_exactly_the_documented_ones() -> None:
    retriable = {code for _, code in pb.ServerError.items() if errors.for_code(code).retriable}
    assert retriable == {
        pb.PERSISTENCE_ERROR,
        pb.SERVICE_NOT_READY,
        pb.TOO_MANY_REQUESTS,
        pb.CONCURRENT_TRANSACTIONS,
        pb.NOT_OWNER,  # (a cluster: retriable at the slot's owner)
    }


def test_fatal_codes_are_exactly_the_documented_ones() -> None:
    fatal = {code for _, code in pb.ServerError.items() if errors.for_code(code).fatal}
    assert fatal == {pb.PRODUCER_FENCED, pb.INVALID_PRODUCER_ID_MAPPING}


@pytest.mark.parametrize(
    ("code", "cls"),
    [
        (pb.TRANSACTION_CONFLICT, errors.TransactionConflictError),
        (pb.TRANSACTION_NOT_FOUND, errors.TransactionNotFoundError),
        (pb.INVALID_TXN_STATUS, errors.InvalidTxnStatusError),
        (pb.TRANSACTION_TIMEOUT, errors.TransactionTimeoutError),
        (pb.PRODUCER_FENCED, errors.ProducerFencedError),
        (pb.UNKNOWN_MESSAGE_ID, errors.UnknownMessageIdError),
        (pb.NOT_ALLOWED, errors.NotAllowedError),
        (pb.PERSISTENCE_ERROR, errors.PersistenceError),
    ],
)
def test_for_code(code: int, cls: type[errors.ServerError]) -> None:
    assert errors.for_code(code) is cls


def test_from_wire_builds_the_exception_with_code_and_text() -> None:
    exc = errors.from_wire(pb.SERVICE_NOT_READY, "starting")
    assert isinstance(exc, errors.ServiceNotReadyError)
    assert exc.code == pb.SERVICE_NOT_READY and exc.retriable
    assert str(exc) == "SERVICE_NOT_READY: starting"


def test_unknown_code_keeps_its_number() -> None:
    exc = errors.from_wire(999, "future")
    assert type(exc) is errors.UnknownServerError
    assert exc.code == 999 and not exc.retriable
    assert errors.UnknownServerError.code == pb.UNKNOWN_ERROR


def test_error_tree() -> None:
    assert issubclass(errors.OperationTimeoutError, TimeoutError)
    assert issubclass(errors.InvalidInputError, ValueError)
    assert errors.ConnectionLostError.retriable
    for name in errors.__all__:
        obj = getattr(errors, name)
        if isinstance(obj, type):
            assert issubclass(obj, errors.TxnbufError), name
            assert name in (errors.__doc__ or ""), f"{name} missing from the tree"


def test_every_error_the_client_raises_has_a_code() -> None:
    """Client-side errors have codes of their own (1000 and above, one per
    class, named in CLIENT_CODES), apart from the wire's; only the two
    bases are without one, and the client never raises a base itself."""
    wire = set(pb.ServerError.values())
    client_side = {}
    for name in errors.__all__:
        cls = getattr(errors, name)
        if not isinstance(cls, type) or cls in (errors.TxnbufError, errors.ServerError):
            continue
        assert isinstance(cls.code, int), f"{name} has no code"
        if not issubclass(cls, errors.ServerError):
            assert "code" in cls.__dict__, f"{name} inherits its code"
            assert cls.code >= 1000 and cls.code not in wire, name
            client_side[cls.code] = name
    assert sorted(client_side) == sorted(errors.CLIENT_CODES), "one class per client-side code"
    assert errors.TxnbufError.code is None and errors.ServerError.code is None
    root = Path(client.__file__).parent
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("TxnbufError", "ServerError"), (
                    f"{path.name}:{node.lineno} raises a base class (no code)"
                )


async def test_client_side_errors_carry_their_codes(fake: FakeBroker) -> None:
    c = Client(fake.url, operation_timeout=5.0)
    producer = await c.create_producer("t")
    with pytest.raises(errors.MessageTooBigError) as big:
        await producer.send(b"x" * (proto.MAX_MESSAGE_SIZE + 1))
    assert big.value.code == errors.MESSAGE_TOO_BIG == 1001
    with pytest.raises(errors.InvalidInputError) as bad:
        await producer.send("not bytes")  # type: ignore[arg-type]
    assert bad.value.code == errors.INVALID_INPUT
    await producer.close()
    with pytest.raises(errors.ProducerClosedError) as closed:
        await producer.send(b"x")
    assert closed.value.code == errors.PRODUCER_CLOSED
    await c.close()
    with pytest.raises(errors.ClientClosedError) as gone:
        await c.create_producer("t")
    assert gone.value.code == errors.CLIENT_CLOSED


def test_public_names() -> None:
    assert set(client.__all__) == {
        "Client",
        "Consumer",
        "DeadLetterPolicy",
        "GroupResult",
        "Message",
        "MessageId",
        "Position",
        "PreparedTxnState",
        "Producer",
        "ProducerState",
        "ReadResult",
        "Reader",
        "SubscriptionCursor",
        "Transaction",
        "TransactionGroups",
        "TransactionalProducer",
        "TxnID",
        "TxnState",
        "errors",
    }
    assert client.errors is errors


# --- message ids and decoding -------------------------------------------------


def test_message_id_orders_by_partition_entry_index() -> None:
    ids = [MessageId(1, 0, 0), MessageId(0, 5, 1), MessageId(0, 5, 0), MessageId(0, 2, 9)]
    assert sorted(ids) == [MessageId(0, 2, 9), MessageId(0, 5, 0), MessageId(0, 5, 1), ids[0]]
    assert str(MessageId(3, 12, 4)) == "3:12:4"
    assert MessageId.parse("3:12:4") == MessageId(3, 12, 4)
    with pytest.raises(errors.InvalidInputError):
        MessageId.parse("3:12")
    with pytest.raises(AttributeError):
        MessageId(0, 0, 0).entry_id = 1  # type: ignore[misc]
    assert hash(MessageId(0, 1, 2)) == hash(MessageId(0, 1, 2))


def _batch() -> pb.EntryBatch:
    batch = pb.EntryBatch(producer_name="p1")
    batch.messages.add(payload=b"a", sequence_id=7, publish_time_ms=1000)
    batch.messages.add(payload=b"b", key="", sequence_id=8, properties={"x": "1"})
    batch.messages.add(payload=b"c", key="k", sequence_id=9)
    return batch


def test_decode_entry_all_messages() -> None:
    entry = pb.DeliveredEntry(
        partition=2, entry_id=40, data=_batch().SerializeToString(), redelivery_count=3
    )
    msgs = decode_entry("t", entry)
    assert [m.value for m in msgs] == [b"a", b"b", b"c"]
    assert [m.message_id for m in msgs] == [MessageId(2, 40, i) for i in range(3)]
    assert [m.key for m in msgs] == [None, "", "k"]
    assert msgs[1].properties == {"x": "1"}
    assert msgs[0].publish_time_ms == 1000 and msgs[0].sequence_id == 7
    assert {m.redelivery_count for m in msgs} == {3}
    assert {m.topic for m in msgs} == {"t"} and msgs[0].producer_name == "p1"


def test_decode_entry_selected_indexes() -> None:
    entry = pb.DeliveredEntry(partition=0, entry_id=1, data=_batch().SerializeToString())
    entry.indexes.extend([2, 0])
    msgs = decode_entry("t", entry)
    assert [(m.value, m.message_id.batch_index) for m in msgs] == [(b"c", 2), (b"a", 0)]


def test_decode_entry_bad_data() -> None:
    entry = pb.DeliveredEntry(partition=0, entry_id=1, data=_batch().SerializeToString())
    entry.indexes.append(3)
    with pytest.raises(errors.ProtocolError):
        decode_entry("t", entry)
    with pytest.raises(errors.ProtocolError):
        decode_entry("t", pb.DeliveredEntry(data=b"\xff\xff\xff"))


# --- routing and frames -------------------------------------------------------


def test_partition_for_key_is_crc32_mod_n() -> None:
    for key in ["", "a", "customer-7", "ünïcode"]:
        assert partition_for_key(key, 7) == zlib.crc32(key.encode()) % 7
    assert len({partition_for_key(f"k{i}", 4) for i in range(100)}) == 4


def test_build_send_frame() -> None:
    entries: list[Any] = [(b"x", None, None, 5), (b"y", "k", {"a": "b"}, 6)]
    cmd = build_send(3, 17, 2, entries, 1234)
    parsed = pb.BaseCommand.FromString(cmd.SerializeToString())
    assert parsed.type == T.SEND and parsed.WhichOneof("command") == "send"
    send = parsed.send
    assert (send.producer_id, send.request_id, send.partition) == (3, 17, 2)
    batch = pb.EntryBatch.FromString(send.batch)
    assert not batch.producer_name  # the broker adds it
    messages = batch.messages
    assert [m.sequence_id for m in messages] == [5, 6]
    assert not messages[0].HasField("key") and messages[1].key == "k"
    assert dict(messages[1].properties) == {"a": "b"}
    assert {m.publish_time_ms for m in messages} == {1234}
    assert send.first_sequence_id == 5  # consecutive: the broker reads only the ends
    gap = build_send(3, 18, 2, [*entries, (b"z", None, None, 8)], 1234).send
    assert not gap.HasField("first_sequence_id")
    assert [m.sequence_id for m in messages_of(gap)] == [5, 6, 8]


def test_build_ack_frame() -> None:
    cmd = build_ack(4, 9, pb.CommandAck.INDIVIDUAL, [MessageId(1, 2, 3), MessageId(0, 1, 0)])
    assert cmd.type == T.ACK and cmd.WhichOneof("command") == "ack"
    assert list(cmd.ack.ranges) == [1, 2, 3, 3, 0, 1, 0, 0]  # flat quadruples


def test_acks_as_ranges() -> None:
    """Each run of consecutive indexes of one entry, in the order given, is one range."""
    ids = [MessageId(0, 5, i) for i in (0, 1, 2, 4, 5)] + [MessageId(0, 6, 0), MessageId(1, 6, 1)]
    assert ack_ranges(ids) == [0, 5, 0, 2, 0, 5, 4, 5, 0, 6, 0, 0, 1, 6, 1, 1]
    assert ack_ranges([MessageId(0, 5, 1), MessageId(0, 5, 0)]) == [0, 5, 1, 1, 0, 5, 0, 0]
    assert ack_ranges([]) == []


# --- producer against the fake broker -----------------------------------------


async def test_send_returns_ids_and_stores(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("orders")
    first = await producer.send(b"one")
    second = await producer.send(b"two", key="k", properties={"p": "v"})
    assert first == MessageId(0, 0, 0) and second == MessageId(0, 1, 0)
    assert fake.stored("orders") == [b"one", b"two"]
    single = fake.ledgers["orders", 0][1].messages[0]
    assert single.key == "k" and dict(single.properties) == {"p": "v"}
    assert not fake.ledgers["orders", 0][0].messages[0].HasField("key")
    assert fake.types()[:3] == ["CONNECT", "PARTITIONED_METADATA", "PRODUCER"]
    await producer.close()
    assert fake.types()[-1] == "CLOSE_PRODUCER"


async def test_concurrent_sends_share_one_frame(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    ids = await asyncio.gather(*(producer.send(b"m%d" % i) for i in range(50)))
    assert len(fake.sends()) == 1
    assert ids == [MessageId(0, 0, i) for i in range(50)]
    assert [m.sequence_id for m in messages_of(fake.sends()[0])] == list(range(50))


async def test_batch_is_split_at_the_message_limit(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t", batching_max_messages=10)
    await asyncio.gather(*(producer.send(b"x") for i in range(25)))
    assert [len(messages_of(s)) for s in fake.sends()] == [10, 10, 5]


async def test_batch_is_split_at_the_byte_limit(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t", batching_max_bytes=4096)
    await asyncio.gather(*(producer.send(b"x" * 1000) for i in range(8)))
    sends = fake.sends()
    assert len(sends) > 1 and all(s.ByteSize() < 4096 for s in sends)
    # A message bigger than a batch may be goes alone, not refused.
    await asyncio.gather(producer.send(b"a"), producer.send(b"y" * 5000), producer.send(b"b"))
    assert [[m.payload[:1] for m in messages_of(s)] for s in fake.sends()[len(sends) :]] == [
        [b"a"],
        [b"y"],
        [b"b"],
    ]


async def test_frames_stay_under_the_brokers_max_message_size(fake: FakeBroker) -> None:
    fake.max_message_size = 3000
    async with Client(fake.url, operation_timeout=5.0) as c:
        producer = await c.create_producer("t")
        await asyncio.gather(*(producer.send(b"x" * 500) for i in range(10)))
        with pytest.raises(errors.MessageTooBigError, match=r"max_message_size \(3,000 bytes\)"):
            await producer.send(b"x" * 3000)
        await producer.send(b"x" * 2900)  # (encoded, under the limit: alone in its frame)
    assert all(len(cmd.SerializeToString()) < 3000 + 64 for cmd in fake.received)


async def test_keyed_messages_route_by_crc32(fake: FakeBroker, cli: Client) -> None:
    fake.partitions["multi"] = 4
    producer = await cli.create_producer("multi")
    keys = [f"key-{i}" for i in range(40)]
    ids = await asyncio.gather(*(producer.send(k.encode(), key=k) for k in keys))
    for key, mid in zip(keys, ids, strict=True):
        assert mid.partition == zlib.crc32(key.encode()) % 4
        assert key.encode() in fake.stored("multi", mid.partition)
    # one SEND per partition for the whole burst
    assert len(fake.sends()) == 4


async def test_keyless_messages_round_robin(fake: FakeBroker, cli: Client) -> None:
    fake.partitions["rr"] = 3
    producer = await cli.create_producer("rr")
    partitions = [(await producer.send(b"x")).partition for _ in range(6)]
    assert sorted(set(partitions)) == [0, 1, 2]


async def test_sequence_ids_continue_after_the_brokers_last(fake: FakeBroker, cli: Client) -> None:
    fake.last_sequence_id["named"] = 41
    producer = await cli.create_producer("t", producer_name="named")
    assert producer.name == "named" and producer.last_sequence_id == 41
    await producer.send(b"a")
    await producer.send(b"b", sequence_id=100)
    await producer.send(b"c")
    seqs = [m.sequence_id for s in fake.sends() for m in messages_of(s)]
    assert seqs == [42, 100, 101]


async def test_sequence_id_must_increase(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    await producer.send(b"a", sequence_id=10)
    before = len(fake.received)
    for bad in (10, 3):
        with pytest.raises(ValueError, match="sequence_id"):
            await producer.send(b"b", sequence_id=bad)
    with pytest.raises(errors.InvalidInputError):
        await producer.send(b"b", sequence_id=2**64)
    await asyncio.sleep(0.05)
    assert len(fake.received) == before  # nothing sent
    await producer.send(b"c")
    assert messages_of(fake.sends()[-1])[0].sequence_id == 11


async def test_bad_arguments_are_refused(cli: Client) -> None:
    producer = await cli.create_producer("t")
    with pytest.raises(errors.InvalidInputError, match="value"):
        await producer.send("text")  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInputError, match="key"):
        await producer.send(b"x", key=5)  # type: ignore[arg-type]
    with pytest.raises(errors.InvalidInputError, match="properties"):
        await producer.send(b"x", properties={"a": 1})  # type: ignore[dict-item]
    with pytest.raises(errors.InvalidInputError):
        await cli.subscribe("t", "s", subscription_type="fanout")
    with pytest.raises(errors.InvalidInputError):
        await cli.create_producer("")
    assert producer.last_sequence_id == -1


async def test_default_producer_names_are_unique(cli: Client) -> None:
    a = await cli.create_producer("t")
    b = await cli.create_producer("t")
    assert a.name != b.name and a.name.startswith("producer-")
    assert a.producer_id != b.producer_id


async def test_duplicate_receipt_uses_message_ids(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t", producer_name="dup")
    first = await producer.send(b"a", sequence_id=5)
    # a second producer with the same name re-sends seq 5 along with a new one
    await producer.close()
    again = await cli.create_producer("t", producer_name="dup")
    fake.last_sequence_id["dup"] = 4  # pretend the broker forgot, so 5 is re-sent
    again._next_sequence_id = 5
    ids = await asyncio.gather(again.send(b"a"), again.send(b"b"))
    assert ids[0] == first
    assert ids[1] == MessageId(0, 1, 0)
    assert fake.stored("t") == [b"a", b"b"]


async def test_send_error_maps_to_exception(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    fake.send_error = pb.PERSISTENCE_ERROR
    results = await asyncio.gather(producer.send(b"a"), producer.send(b"b"), return_exceptions=True)
    assert all(isinstance(r, errors.PersistenceError) and r.retriable for r in results)
    assert results[0] is not results[1]
    assert producer.pending == 0
    fake.send_error = None
    assert await producer.send(b"c") == MessageId(0, 0, 0)


async def test_producer_refused_raises_mapped_error(fake: FakeBroker, cli: Client) -> None:
    fake.refuse_producer = [pb.PRODUCER_BUSY]
    with pytest.raises(errors.ProducerBusyError) as info:
        await cli.create_producer("t", producer_name="taken")
    assert info.value.code == pb.PRODUCER_BUSY and not info.value.retriable


async def test_send_times_out(fake: FakeBroker) -> None:
    fake.ignore_sends = True
    async with Client(fake.url, operation_timeout=0.3) as c:
        producer = await c.create_producer("t")
        with pytest.raises(errors.OperationTimeoutError):
            await producer.send(b"x")
        with pytest.raises(TimeoutError):
            await producer.send(b"y")
        assert producer.pending == 0


async def test_pending_bound_makes_send_wait(fake: FakeBroker, cli: Client) -> None:
    fake.ignore_sends = True
    producer = await cli.create_producer("t", max_pending_messages=3)
    futures = [producer.send_nowait(b"x") for _ in range(3)]
    with pytest.raises(errors.ProducerQueueFullError):
        producer.send_nowait(b"y")
    waiting = asyncio.ensure_future(producer.send(b"z"))
    await asyncio.sleep(0.05)
    assert not waiting.done() and producer.pending == 3
    # answer the first frame: room for the waiting send
    fake.ignore_sends = False
    sends = fake.sends()
    assert len(sends) == 1
    await fake.push(
        frame(
            T.SEND_RECEIPT,
            "send_receipt",
            producer_id=producer.producer_id,
            request_id=sends[0].request_id,
            partition=0,
            entry_id=0,
        )
    )
    assert await asyncio.gather(*futures) == [MessageId(0, 0, i) for i in range(3)]
    assert await waiting == MessageId(0, 0, 0)


async def test_closed_producer_and_client_refuse_use(fake: FakeBroker) -> None:
    c = Client(fake.url, operation_timeout=5.0)
    producer = await c.create_producer("t")  # connects lazily
    await producer.close()
    with pytest.raises(errors.ProducerClosedError):
        await producer.send(b"x")
    await producer.close()  # idempotent
    await c.close()
    with pytest.raises(errors.ClientClosedError):
        await c.create_producer("t")
    with pytest.raises(errors.ClientClosedError):
        await c.subscribe("t", "s")


async def test_close_flushes_pending_sends(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    futures = [producer.send_nowait(b"%d" % i) for i in range(5)]
    await producer.close()
    assert all(f.done() and not f.exception() for f in futures)
    assert len(fake.stored("t")) == 5


async def test_connect_failure_raises_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(errors.BrokerConnectionError) as info:
        async with Client(f"http://127.0.0.1:{port}", operation_timeout=0.3):
            pass
    assert info.value.retriable


async def test_a_broker_of_another_protocol_version_is_refused(fake: FakeBroker) -> None:
    """A broker whose CONNECTED announces another wire protocol version is
    refused at once, with an error naming both versions; nothing else is sent."""
    fake.protocol_version = PROTOCOL_VERSION - 1
    with pytest.raises(errors.ProtocolError) as info:
        async with Client(fake.url, operation_timeout=5.0):
            pass
    assert not info.value.retriable
    assert f"speaks wire protocol version {PROTOCOL_VERSION - 1};" in str(info.value)
    assert f"speaks version {PROTOCOL_VERSION} only" in str(info.value)
    assert fake.connects == 1 and fake.types() == ["CONNECT"]


async def test_ping_is_answered(fake: FakeBroker, cli: Client) -> None:
    await fake.push(frame(T.PING, "ping"))
    await until(lambda: "PONG" in fake.types())


# --- reconnect ----------------------------------------------------------------


async def test_unanswered_sends_are_resent_after_reconnect(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t", producer_name="p")
    fake.store_without_receipt = True  # stored, but the receipt is "lost"
    pending = asyncio.gather(*(producer.send(b"m%d" % i) for i in range(10)))
    await until(lambda: len(fake.sends()) == 1)
    fake.store_without_receipt = False
    await fake.drop_connections()
    ids = await asyncio.wait_for(pending, 5)
    assert ids == [MessageId(0, 0, i) for i in range(10)]
    assert fake.stored("t") == [b"m%d" % i for i in range(10)]  # not stored twice
    assert fake.connects == 2
    producers = [c.producer for c in fake.received if c.type == T.PRODUCER]
    assert len(producers) == 2
    assert [(p.producer_id, p.producer_name) for p in producers] == [(1, "p"), (1, "p")]
    first, resent = fake.sends()
    assert first == resent


async def test_broker_restart_is_survived(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s", initial_position="earliest")
    await producer.send(b"before")
    msg = await consumer.receive(timeout=5)
    await consumer.acknowledge(msg)
    await fake.restart()
    assert await producer.send(b"after") == MessageId(0, 1, 0)
    msg = await consumer.receive(timeout=5)
    assert msg.value == b"after"
    await consumer.acknowledge(msg)


async def test_consumer_queue_is_cleared_and_refilled_on_reconnect(
    fake: FakeBroker, cli: Client
) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    for i in range(3):
        await producer.send(b"%d" % i)
    first = await consumer.receive(timeout=5)
    await until(lambda: len(consumer._queue) == 2)
    gen = cli._conn.gen
    await fake.drop_connections()
    await until(lambda: cli._conn.gen > gen or cli._conn.link is None)
    # everything unacked comes again, first included
    got = [await consumer.receive(timeout=5) for _ in range(3)]
    assert sorted(m.value for m in got) == [b"0", b"1", b"2"]
    assert all(m.redelivery_count == 1 for m in got), (
        [(m.value, m.redelivery_count) for m in got],
        fake.types(),
    )
    assert first.message_id in {m.message_id for m in got}
    flows = [c.flow.permits for c in fake.received if c.type == T.FLOW]
    assert flows == [1000, 1000]


async def test_pending_acks_are_resent_after_reconnect(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    msg = await consumer.receive(timeout=5)
    await drop_sockets(fake)  # the ack goes into a dead socket
    await asyncio.wait_for(consumer.acknowledge(msg), 5)
    sub = fake.subs["t", "s"]
    assert not sub.unacked


async def test_create_producer_waits_for_reconnect(fake: FakeBroker, cli: Client) -> None:
    await fake.stop()
    task = asyncio.ensure_future(cli.create_producer("t"))
    await asyncio.sleep(0.2)
    assert not task.done()
    await fake.start()
    producer = await asyncio.wait_for(task, 5)
    assert await producer.send(b"x") == MessageId(0, 0, 0)


# --- consumer against the fake broker -----------------------------------------


async def test_receive_and_ack(fake: FakeBroker, cli: Client) -> None:
    consumer = await cli.subscribe("t", "s", initial_position="earliest")
    producer = await cli.create_producer("t")
    await producer.send(b"hello", key="k", properties={"a": "b"})
    msg = await consumer.receive(timeout=5)
    assert isinstance(msg, Message)
    assert (msg.value, msg.key, msg.properties, msg.topic) == (b"hello", "k", {"a": "b"}, "t")
    assert msg.message_id == MessageId(0, 0, 0) and msg.redelivery_count == 0
    await consumer.acknowledge(msg)
    assert not fake.subs["t", "s"].unacked
    subscribe = next(c.subscribe for c in fake.received if c.type == T.SUBSCRIBE)
    assert subscribe.initial_position == pb.CommandSubscribe.EARLIEST
    assert subscribe.sub_type == pb.CommandSubscribe.EXCLUSIVE


async def test_concurrent_acks_share_one_frame(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s", subscription_type="shared")
    await asyncio.gather(*(producer.send(b"x") for _ in range(20)))
    msgs = [await consumer.receive(timeout=5) for _ in range(20)]
    await asyncio.gather(*(consumer.acknowledge(m) for m in msgs))
    acks = fake.acks()
    assert len(acks) == 1 and len(ack_ids(acks[0])) == 20
    assert not fake.subs["t", "s"].unacked


async def test_bad_ack_fails_only_its_own_call(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    good = await consumer.receive(timeout=5)
    bogus = MessageId(0, 99, 0)
    results = await asyncio.gather(
        consumer.acknowledge(good), consumer.acknowledge(bogus), return_exceptions=True
    )
    assert results[0] is None
    assert isinstance(results[1], errors.UnknownMessageIdError)
    assert not fake.subs["t", "s"].unacked


async def test_cumulative_ack(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s", subscription_type="failover")
    for i in range(3):
        await producer.send(b"%d" % i)
    msgs = [await consumer.receive(timeout=5) for _ in range(3)]
    await consumer.acknowledge_cumulative(msgs[1])
    assert list(fake.subs["t", "s"].unacked) == [(0, 2, 0)]
    await consumer.acknowledge_cumulative(msgs[2].message_id)
    assert not fake.subs["t", "s"].unacked
    shared = await cli.subscribe("t", "sh", subscription_type="shared")
    with pytest.raises(errors.NotAllowedError):
        await shared.acknowledge_cumulative(msgs[0])


async def test_negative_ack_redelivers(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    msg = await consumer.receive(timeout=5)
    await consumer.negative_acknowledge(msg)
    again = await consumer.receive(timeout=5)
    assert again.message_id == msg.message_id and again.redelivery_count == 1
    redeliver = next(c for c in fake.received if c.type == T.REDELIVER_UNACKNOWLEDGED)
    assert len(redeliver.redeliver_unacknowledged.message_ids) == 1


async def test_negative_acks_due_together_share_one_request(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s", negative_ack_redelivery_delay=0.2)
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(3)))
    msgs = [await consumer.receive(timeout=5) for _ in range(3)]
    for msg in msgs:
        await consumer.negative_acknowledge(msg)
    await asyncio.sleep(0.1)
    assert not fake.of_type(T.REDELIVER_UNACKNOWLEDGED)  # not yet: the delay
    again = [await consumer.receive(timeout=5) for _ in range(3)]
    assert [m.message_id for m in again] == [m.message_id for m in msgs]
    (redeliver,) = fake.of_type(T.REDELIVER_UNACKNOWLEDGED)
    assert len(redeliver.redeliver_unacknowledged.message_ids) == 3


async def test_redeliver_unacknowledged_sends_empty_list(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await producer.send(b"x")
    await consumer.receive(timeout=5)
    await consumer.redeliver_unacknowledged()
    again = await consumer.receive(timeout=5)
    assert again.value == b"x" and again.redelivery_count == 1
    redeliver = next(c for c in fake.received if c.type == T.REDELIVER_UNACKNOWLEDGED)
    assert len(redeliver.redeliver_unacknowledged.message_ids) == 0


async def test_flow_is_granted_after_half_the_queue(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s", receiver_queue_size=10)
    await asyncio.gather(*(producer.send(b"x") for _ in range(25)))
    got = [await consumer.receive(timeout=5) for _ in range(25)]
    assert len(got) == 25
    await until(lambda: fake.types().count("FLOW") == 6)
    flows = [c.flow.permits for c in fake.received if c.type == T.FLOW]
    assert flows[0] == 10 and set(flows[1:]) == {5}


async def test_receive_timeout(fake: FakeBroker, cli: Client) -> None:
    consumer = await cli.subscribe("t", "s")
    with pytest.raises(errors.OperationTimeoutError):
        await consumer.receive(timeout=0.05)
    with pytest.raises(TimeoutError):
        await consumer.receive(timeout=0.05)
    assert not consumer._waiters


async def test_cancelled_receive_loses_no_message(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    task = asyncio.ensure_future(consumer.receive())
    await asyncio.sleep(0.01)
    await producer.send(b"x")
    await until(lambda: task.done() or bool(consumer._queue))
    task.cancel()
    try:
        first = await task
    except asyncio.CancelledError:
        first = await consumer.receive(timeout=1)
    assert first.value == b"x"


async def test_active_consumer_change(fake: FakeBroker, cli: Client) -> None:
    consumer = await cli.subscribe("t", "s", subscription_type="failover")
    assert consumer.is_active is False
    await fake.push(
        frame(
            T.ACTIVE_CONSUMER_CHANGE,
            "active_consumer_change",
            consumer_id=consumer.consumer_id,
            is_active=True,
        )
    )
    await until(lambda: consumer.is_active)


async def test_consumer_busy_and_close(fake: FakeBroker, cli: Client) -> None:
    consumer = await cli.subscribe("t", "s")
    with pytest.raises(errors.ConsumerBusyError):
        await cli.subscribe("t", "s")
    waiting = asyncio.ensure_future(consumer.receive())
    await asyncio.sleep(0.01)
    await consumer.close()
    with pytest.raises(errors.ConsumerClosedError):
        await waiting
    with pytest.raises(errors.ConsumerClosedError):
        await consumer.receive()
    with pytest.raises(errors.ConsumerClosedError):
        await consumer.acknowledge(MessageId(0, 0, 0))
    assert "CLOSE_CONSUMER" in fake.types()
    other = await cli.subscribe("t", "s")  # free again
    assert other.consumer_id != consumer.consumer_id


async def test_client_close_closes_everything(fake: FakeBroker) -> None:
    c = Client(fake.url, operation_timeout=5.0)
    await c.connect()
    producer = await c.create_producer("t")
    consumer = await c.subscribe("t", "s")
    await c.close()
    await c.close()
    with pytest.raises(errors.ProducerClosedError):
        await producer.send(b"x")
    with pytest.raises(errors.ConsumerClosedError):
        await consumer.receive()
    assert {"CLOSE_PRODUCER", "CLOSE_CONSUMER"} <= set(fake.types())


async def test_flush_waits_for_answers(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    futures = [producer.send_nowait(b"x") for _ in range(10)]
    await producer.flush()
    assert all(f.done() for f in futures) and producer.pending == 0
    assert len(fake.stored("t")) == 10


async def test_retriable_refusal_is_retried(fake: FakeBroker, cli: Client) -> None:
    fake.refuse_producer = [pb.SERVICE_NOT_READY, pb.TOO_MANY_REQUESTS]
    producer = await cli.create_producer("t")
    assert not fake.refuse_producer
    assert fake.types().count("PRODUCER") == 3
    assert await producer.send(b"x") == MessageId(0, 0, 0)


async def test_busy_on_reconnect_is_retried(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    fake.refuse_producer = [pb.PRODUCER_BUSY, pb.PRODUCER_BUSY]
    await fake.drop_connections()
    assert await asyncio.wait_for(producer.send(b"x"), 5) == MessageId(0, 0, 0)
    assert fake.types().count("PRODUCER") == 4
    assert fake.connects >= 3


async def test_fatal_refusal_on_reconnect_closes_the_producer(
    fake: FakeBroker, cli: Client
) -> None:
    producer = await cli.create_producer("t")
    fake.ignore_sends = True
    pending = producer.send_nowait(b"x")
    await until(lambda: len(fake.sends()) == 1)
    fake.refuse_producer = [pb.TOPIC_NOT_FOUND]
    await fake.drop_connections()
    with pytest.raises(errors.TopicNotFoundError):
        await asyncio.wait_for(pending, 5)
    with pytest.raises(errors.ProducerClosedError) as info:
        await producer.send(b"y")
    assert isinstance(info.value.__cause__, errors.TopicNotFoundError)
    fake.ignore_sends = False
    other = await cli.create_producer("t2")  # the client itself still works
    assert await other.send(b"z") == MessageId(0, 0, 0)


async def test_connection_level_error_is_only_logged(
    fake: FakeBroker, cli: Client, caplog: pytest.LogCaptureFixture
) -> None:
    producer = await cli.create_producer("t")
    await fake.push(frame(T.ERROR, "error", request_id=0, error=pb.MALFORMED_FRAME))
    assert await producer.send(b"x") == MessageId(0, 0, 0)
    assert "MALFORMED_FRAME" in caplog.text
    assert fake.connects == 1


async def test_unanswered_ack_times_out(fake: FakeBroker) -> None:
    async with Client(fake.url, operation_timeout=0.3) as c:
        producer = await c.create_producer("t")
        consumer = await c.subscribe("t", "s")
        await producer.send(b"x")
        msg = await consumer.receive(timeout=5)
        original = fake._on_ack

        async def swallow(ws: Any, ack: Any) -> None:
            return None

        fake._on_ack = swallow  # type: ignore[method-assign]
        with pytest.raises(errors.OperationTimeoutError):
            await consumer.acknowledge(msg)
        fake._on_ack = original  # type: ignore[method-assign]
        await consumer.acknowledge(msg)


async def test_receipts_are_matched_by_request_id(fake: FakeBroker, cli: Client) -> None:
    fake.partitions["two"] = 2
    fake.ignore_sends = True
    producer = await cli.create_producer("two")
    keys = {
        p: next(f"k{i}" for i in range(100) if partition_for_key(f"k{i}", 2) == p) for p in (0, 1)
    }
    futures = {p: producer.send_nowait(b"x", key=keys[p]) for p in (0, 1)}
    await until(lambda: len(fake.sends()) == 2)
    for send in reversed(fake.sends()):  # answer the later frame first
        await fake.push(
            frame(
                T.SEND_RECEIPT,
                "send_receipt",
                producer_id=producer.producer_id,
                request_id=send.request_id,
                partition=send.partition,
                entry_id=100 + send.partition,
            )
        )
    assert await futures[0] == MessageId(0, 100, 0)
    assert await futures[1] == MessageId(1, 101, 0)
    assert producer.pending == 0


def test_messages_compare_by_value_and_hash() -> None:
    mid = MessageId(0, 1, 0)
    a = Message(b"v", None, {"p": "1"}, mid, "t")
    b = Message(b"v", None, {"p": "1"}, mid, "t")
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    assert a != Message(b"v", None, {"p": "2"}, mid, "t")


# --- acknowledging lists: one future per call ---------------------------------------


async def received(cli: Client, n: int) -> tuple[Any, list[Message]]:
    """A consumer on t/s and the ``n`` messages it received after ``n`` sends."""
    producer = await cli.create_producer("t")
    consumer = await cli.subscribe("t", "s")
    await asyncio.gather(*(producer.send(b"%d" % i) for i in range(n)))
    return consumer, [await consumer.receive(timeout=5) for _ in range(n)]


async def test_list_ack_is_one_frame(fake: FakeBroker, cli: Client) -> None:
    consumer, msgs = await received(cli, 5)
    await consumer.acknowledge(msgs)
    (ack,) = fake.acks()
    assert ack_ids(ack) == [tuple(m.message_id) for m in msgs]
    assert not fake.subs["t", "s"].unacked


async def test_bad_id_fails_only_the_list_it_is_in(fake: FakeBroker, cli: Client) -> None:
    consumer, msgs = await received(cli, 5)
    bogus = MessageId(0, 99, 0)
    results = await asyncio.gather(
        consumer.acknowledge(msgs[:2]),
        consumer.acknowledge([msgs[2], bogus, msgs[3]]),
        consumer.acknowledge(msgs[4]),
        return_exceptions=True,
    )
    assert results[0] is None
    assert isinstance(results[1], errors.UnknownMessageIdError)
    assert results[2] is None
    # One frame of all six ids, refused; then each id alone.
    assert [len(ack_ids(a)) for a in fake.acks()] == [6, 1, 1, 1, 1, 1, 1]
    assert not fake.subs["t", "s"].unacked  # the good ids of the failed call too


async def test_list_ack_split_succeeds_when_all_ids_are_good(fake: FakeBroker, cli: Client) -> None:
    consumer, msgs = await received(cli, 4)
    bogus = MessageId(0, 99, 0)
    good, bad = await asyncio.gather(
        consumer.acknowledge(msgs), consumer.acknowledge(bogus), return_exceptions=True
    )
    assert good is None
    assert isinstance(bad, errors.UnknownMessageIdError)
    assert not fake.subs["t", "s"].unacked


async def test_cancelled_list_ack_still_goes_out(fake: FakeBroker, cli: Client) -> None:
    consumer, msgs = await received(cli, 3)
    task = asyncio.create_task(consumer.acknowledge(msgs))
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(lambda: not fake.subs["t", "s"].unacked)


async def test_a_batch_from_the_broker_is_handled_command_by_command() -> None:
    """Each command of a BATCH is dispatched, in order,
    and one that fails to be handled does not stop the others."""
    from client._connection import Connection, Link
    from proto import batch_frame

    class Socket:
        def __init__(self, frames: list[bytes]) -> None:
            self.frames = frames

        async def receive(self) -> Any:
            if self.frames:
                return type("Msg", (), {"type": WSMsgType.BINARY, "data": self.frames.pop(0)})
            return type("Msg", (), {"type": WSMsgType.CLOSED, "data": b""})

    ping = pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing())
    pong = pb.BaseCommand(type=pb.BaseCommand.PONG, pong=pb.CommandPong())
    conn = Connection("http://127.0.0.1:1", operation_timeout=1.0)
    seen: list[int] = []

    def dispatch(cmd: pb.BaseCommand) -> None:
        seen.append(cmd.type)
        if len(seen) == 1:
            raise RuntimeError("a handler failed")

    conn._dispatch = dispatch  # type: ignore[method-assign]
    frames = [batch_frame([ping.SerializeToString(), pong.SerializeToString()]),
              ping.SerializeToString()]  # fmt: skip
    await conn._read(Link(Socket(frames), 1))  # type: ignore[arg-type]
    assert seen == [pb.BaseCommand.PING, pb.BaseCommand.PONG, pb.BaseCommand.PING]


async def test_the_reader_lets_waiters_run_after_every_few_answers() -> None:
    """A batch of many answers (the ENDs of one group commit) is handed out
    ANSWERS_IN_A_ROW at a time, with a turn of the loop between: their
    waiters start (and write) their next transactions while the reader goes
    on, rather than after the whole batch. Other frames do not count."""
    from client._connection import ANSWERS_IN_A_ROW, Connection, Link
    from proto import batch_frame

    class Socket:
        def __init__(self, frames: list[bytes]) -> None:
            self.frames = frames

        async def receive(self) -> Any:  # (never yields, as with data already read)
            if self.frames:
                return type("Msg", (), {"type": WSMsgType.BINARY, "data": self.frames.pop(0)})
            return type("Msg", (), {"type": WSMsgType.CLOSED, "data": b""})

    def answer(request_id: int) -> bytes:
        return frame(T.TXN_RESPONSE, "txn_response", request_id=request_id)

    pong = pb.BaseCommand(type=T.PONG, pong=pb.CommandPong()).SerializeToString()
    conn = Connection("http://127.0.0.1:1", operation_timeout=1.0)
    seen: list[int] = []
    conn._dispatch = lambda cmd: seen.append(cmd.type)  # type: ignore[method-assign]
    marks: list[int] = []

    async def observe() -> None:
        while True:
            marks.append(len(seen))
            await asyncio.sleep(0)

    observer = asyncio.get_running_loop().create_task(observe())
    await asyncio.sleep(0)
    frames = [
        batch_frame([pong, *(answer(i) for i in range(20))]),
        batch_frame([answer(i) for i in range(20, 24)]),
    ]
    await conn._read(Link(Socket(frames), 1))  # type: ignore[arg-type]
    observer.cancel()
    assert seen == [T.PONG] + [T.TXN_RESPONSE] * 24
    assert ANSWERS_IN_A_ROW == 8
    # (Yielded after 8, 16 and 24 answers: the pong is not one.)
    assert {9, 17, 25} <= set(marks) and not set(marks) - {0, 9, 17, 25}


async def test_frames_queued_together_go_to_a_broker_as_one_batch() -> None:
    """What the client queues in one turn of the loop (a transaction's send
    and ack) is one WebSocket message, a BATCH of the commands in order."""
    from client._connection import Link

    class Socket:
        def __init__(self) -> None:
            self.sent: list[bytes] = []

        async def send_bytes(self, data: bytes) -> None:
            self.sent.append(data)

    commands = [
        pb.BaseCommand(type=pb.BaseCommand.PING, ping=pb.CommandPing()).SerializeToString(),
        pb.BaseCommand(type=pb.BaseCommand.PONG, pong=pb.CommandPong()).SerializeToString(),
    ]
    ws = Socket()
    link = Link(ws, 1)  # type: ignore[arg-type]
    writer = asyncio.create_task(link.run_writer())
    for data in commands:
        link.write(data)
    await asyncio.sleep(0)
    writer.cancel()
    (sent,) = ws.sent
    batch = pb.BaseCommand.FromString(sent)
    assert batch.type == pb.BaseCommand.BATCH
    assert [c.SerializeToString() for c in batch.batch.commands] == commands


# --- a cluster (client._brokers) -----------------------------------------------


async def test_a_single_broker_is_asked_no_lookup(fake: FakeBroker, cli: Client) -> None:
    producer = await cli.create_producer("t")
    await producer.send(b"x")
    await cli.subscribe("t", "s")
    assert "LOOKUP" not in fake.types()


async def test_service_urls_are_tried_in_turn(fake: FakeBroker) -> None:
    with socket.socket() as s:  # (a port nobody listens on)
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    async with Client(f"{dead}, {fake.url}", operation_timeout=5.0) as client:
        await (await client.create_producer("t")).send(b"x")
        assert client._conn.url == fake.url
    async with Client([dead, fake.url], operation_timeout=5.0) as client:
        await (await client.create_producer("t")).send(b"y")
    assert fake.stored("t") == [b"x", b"y"]


@pytest.mark.parametrize(
    "url",
    [[], "", "http://a:1,", ["http://a:1", 7], "http://a:1,https://b:2", ["ftp://a:1"], 7],
)
def test_bad_service_urls_are_refused(url: Any) -> None:
    with pytest.raises(errors.InvalidInputError):
        Client(url)


async def test_a_producer_refused_not_owner_moves_to_the_owner_and_resends(
    fake: FakeBroker,
) -> None:
    owner = FakeBroker()
    await owner.start()
    try:
        fake.slots = owner.slots = 64
        owner.partitions["t"] = 1  # (one store: the topic exists there too)
        async with Client(fake.url, operation_timeout=5.0) as client:
            producer = await client.create_producer("t")
            assert "LOOKUP" in fake.types() and producer._conn.url == fake.url
            await producer.send(b"before")
            # The topic moves: the old broker refuses the send, names the owner.
            fake.send_error = pb.NOT_OWNER
            fake.redirect = owner.url
            message_id = await producer.send(b"moved")  # (no error reaches the caller)
            assert producer._conn.url == owner.url
            assert owner.stored("t") == [b"moved"] and fake.stored("t") == [b"before"]
            assert message_id is not None
            await producer.send(b"after")
            assert owner.stored("t") == [b"moved", b"after"]
            assert sorted(c.url for c in client._brokers.connections()) == sorted(
                [fake.url, owner.url]
            )
    finally:
        await owner.stop()


async def test_a_consumer_whose_ack_is_refused_not_owner_by_the_broker_it_is_on_keeps_going(
    fake: FakeBroker,
) -> None:
    """An ack refused NOT_OWNER on a link that is up (a broker dropping
    everything after its store failed refuses it, then serves the topic
    again) hands the consumer over; the lookup names the same broker,
    whose connection still holds the consumer: the consumer is closed there
    first, so its re-subscription under the same id is not refused as a
    consumer id in use (which closed it for good), and it goes on."""
    fake.slots = 64
    async with Client(fake.url, operation_timeout=5.0) as client:
        producer = await client.create_producer("t")
        consumer = await client.subscribe("t", "s", initial_position="earliest")
        await producer.send(b"a")
        first = await consumer.receive(timeout=5.0)
        fake.ack_errors = [pb.NOT_OWNER]
        await consumer.acknowledge(first)  # (answered at the owner: here again)
        assert len(fake.of_type(T.SUBSCRIBE)) == 2 and fake.of_type(T.CLOSE_CONSUMER)
        assert not consumer.closed and client._brokers.moves == 1
        await producer.send(b"b")
        values: set[bytes] = set()
        while b"b" not in values:
            values.add((await consumer.receive(timeout=5.0)).value)


async def test_a_producer_whose_send_is_refused_not_owner_by_the_broker_it_is_on_keeps_going(
    fake: FakeBroker,
) -> None:
    """As for a consumer: a send refused NOT_OWNER on a link that is up
    hands the producer over; it is closed on that link, and a send made
    while it moves waits for its re-creation (written behind the CLOSE, it
    would be refused as of an unknown producer); the lookup names the same
    broker; every send is stored once, in order."""
    fake.slots = 64
    async with Client(fake.url, operation_timeout=5.0) as client:
        producer = await client.create_producer("t")
        await producer.send(b"before")
        leave = producer.leave
        meanwhile: list[asyncio.Future[MessageId]] = []

        def leave_then_send(link: Any) -> None:
            leave(link)
            meanwhile.append(producer.send_nowait(b"meanwhile"))

        producer.leave = leave_then_send  # type: ignore[method-assign]
        fake.send_errors = [pb.NOT_OWNER]
        await producer.send(b"refused")  # (answered at the owner: here again)
        await asyncio.gather(*meanwhile)
        assert not producer.closed and client._brokers.moves == 1
        assert fake.stored("t") == [b"before", b"refused", b"meanwhile"]
        kinds = [T.Type.Name(c.type) for c in fake.received if c.type != T.LOOKUP]
        closed = kinds.index("CLOSE_PRODUCER")
        assert kinds[closed + 1] == "PRODUCER", kinds  # (nothing written behind the CLOSE)


async def test_a_coordinator_that_moved_is_looked_up_and_its_transaction_ends_there(
    fake: FakeBroker,
) -> None:
    owner = FakeBroker()
    await owner.start()
    try:
        fake.slots = owner.slots = 64
        fake.tc_ids = [0]  # (as CONNECTED said; coordinator 0 has moved since)
        fake.txn_errors[T.NEW_TXN] = [pb.NOT_OWNER]
        fake.redirect = owner.url
        async with Client(fake.url, operation_timeout=5.0) as client:
            txn = await client.new_transaction()
            assert txn._conn.url == owner.url
            lookups = fake.of_type(T.LOOKUP)
            assert [(c.lookup.HasField("tc_id"), c.lookup.tc_id) for c in lookups] == [(True, 0)]
            await txn.commit()  # (the local path: one COMMIT_TXN)
            ends = (T.END_TXN, T.COMMIT_TXN)
            assert [c.type for c in owner.received if c.type in ends] == [T.COMMIT_TXN]
            assert not [c for c in fake.received if c.type in ends]
    finally:
        await owner.stop()


async def test_a_routed_request_refused_not_owner_is_looked_up_and_made_again(
    fake: FakeBroker,
) -> None:
    """`client._brokers.Route` (transaction groups, readers, cursors, epoch
    producers): the first request looks its coordinator up; refused
    NOT_OWNER there, it is looked up again (after a backoff: the look named
    the same broker) and made again, and nothing goes to the first broker."""
    owner = FakeBroker()
    await owner.start()
    try:
        fake.slots = owner.slots = 64
        fake.redirect = owner.url
        owner.txn_errors[T.NEW_TXN] = [pb.NOT_OWNER]
        async with Client(fake.url, operation_timeout=5.0) as client:
            groups = TransactionGroups(client)
            assert await groups.coordinator_near("t") == zlib.crc32(b"t") % 64
            txn = await groups.new_transaction("tag", tc_id=7)
            assert txn._conn.url == owner.url
            lookups = fake.of_type(T.LOOKUP)
            assert [(c.lookup.HasField("tc_id"), c.lookup.tc_id) for c in lookups] == [
                (True, 7)
            ] * 2
            assert len(owner.of_type(T.NEW_TXN)) == 2 and not fake.of_type(T.NEW_TXN)
    finally:
        await owner.stop()


async def test_a_transaction_near_a_topic_takes_the_coordinator_of_its_slot(
    fake: FakeBroker,
) -> None:
    """In a cluster ``near=topic`` takes coordinator ``crc32(topic) % slots``
    at the topic's broker, not one its CONNECTED named (a broker that just
    joined names none: its slots arrive after it connects clients)."""
    owner = FakeBroker()
    await owner.start()
    try:
        fake.slots = owner.slots = 64
        fake.tc_ids = [0]
        fake.redirect = owner.url  # (owner.tc_ids: none, as a joining broker's)
        async with Client(fake.url, operation_timeout=5.0) as client:
            txn = await client.new_transaction(near="t")
            assert txn._conn.url == owner.url
            assert [c.new_txn.tc_id for c in owner.of_type(T.NEW_TXN)] == [zlib.crc32(b"t") % 64]
            assert txn.id.tcid == zlib.crc32(b"t") % 64
    finally:
        await owner.stop()


# --- brokers down longer than the operation timeout ----------------------------


async def retried(attempt: Any) -> Any:
    """``attempt()``'s result, or None if it failed with a retriable error
    (never ``ClientClosedError``: only ``close()`` closes a client)."""
    try:
        return await attempt()
    except errors.TxnbufError as exc:
        assert exc.retriable and not isinstance(exc, errors.ClientClosedError), repr(exc)
        return None


async def test_a_first_connect_that_failed_is_tried_again_by_the_next_operation() -> None:
    server = FakeBroker()
    with socket.socket() as s:  # (a port nobody listens on yet)
        s.bind(("127.0.0.1", 0))
        server.port = s.getsockname()[1]
    client = Client(server.url, operation_timeout=0.3)
    try:
        with pytest.raises(errors.BrokerConnectionError) as info:
            await client.connect()
        assert info.value.retriable
        assert not client._conn._tasks  # (nothing left trying in the background)
        await server.start()
        assert await client.partitions("t") == 1
    finally:
        await client.close()
        await server.stop()
    with pytest.raises(errors.ClientClosedError):
        await client.partitions("t")


async def test_a_broker_down_longer_than_the_operation_timeout_does_not_close_the_client(
    fake: FakeBroker,
) -> None:
    async with Client(fake.url, operation_timeout=0.3) as client:
        assert await client.partitions("t") == 1
        await fake.stop()
        for _ in range(2):  # (each waits for the broker, then fails: retriable)
            assert await retried(lambda: client.partitions("t")) is None
        await fake.start()
        await until(lambda: retried(lambda: client.partitions("t")), "the broker back")
        producer = await client.create_producer("t")
        await producer.send(b"x")
        assert fake.stored("t") == [b"x"]


async def test_a_cluster_client_whose_home_broker_is_gone_moves_its_home_to_another(
    fake: FakeBroker,
) -> None:
    """The home broker down for good and, for longer than the operation
    timeout, every other broker too: transactions fail with retriable
    errors meanwhile (the client is not closed), and once another broker
    is up again the home connection moves there and they go on."""
    owner = FakeBroker()
    await owner.start()
    try:
        fake.slots = owner.slots = 64
        fake.redirect = owner.url
        async with Client(fake.url, operation_timeout=0.3) as client:
            txn = await client.new_transaction(near="t")
            assert txn._conn.url == owner.url and client._conn.url == fake.url
            await txn.commit()
            await fake.stop()
            await owner.stop()
            for _ in range(2):
                assert await retried(lambda: client.new_transaction(near="t")) is None
            await owner.start()
            await until(lambda: retried(lambda: client.new_transaction(near="t")), "a txn")
            assert client._conn.url == owner.url  # (the home moved)
            txn = await client.new_transaction(near="t")
            assert txn._conn.url == owner.url
            await txn.commit()
    finally:
        await owner.stop()


async def test_a_broker_that_refused_a_first_connection_is_tried_again_later(
    fake: FakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker a lookup names whose first connection is refused for good
    (here: another protocol version; a token or a certificate alike) is not
    kept refused: once it answers as it should (restarted on the same URL),
    a lookup naming it `REFUSED_RETRY_S` later connects, and the client
    goes on there."""
    from client import _brokers

    monkeypatch.setattr(_brokers, "REFUSED_RETRY_S", 0.2)
    owner = FakeBroker()
    owner.protocol_version = PROTOCOL_VERSION + 1
    await owner.start()
    try:
        fake.slots = owner.slots = 64
        fake.redirect = owner.url
        async with Client(fake.url, operation_timeout=1.0) as client:
            with pytest.raises(errors.OperationTimeoutError, match="refused"):
                await client.new_transaction(near="t")
            assert owner.connects >= 1
            assert client._brokers._others[owner.url].refused is not None
            owner.protocol_version = PROTOCOL_VERSION  # (restarted, as this client speaks)
            txn = await client.new_transaction(near="t")
            assert txn._conn.url == owner.url
            await txn.commit()
            assert client._brokers._others[owner.url].refused is None
    finally:
        await owner.stop()
