"""The data plane's framing alone: a transaction's frames over aiohttp's
WebSocket against the same frames on raw TCP (length + bytes, an
``asyncio.Protocol`` each side), with the real codec, in one run.

    python -m bench.framing [--txns 3000] [--per-txn 100] [--rounds 5]

A server process (uvloop, as `txnbuf serve`) and this process as the
client. Each transaction, one at a time, is what the README loop's client
and broker exchange on the local path: the client encodes and writes one
COMMIT_TXN (its sends, ``--per-txn`` 100-byte messages as one
`EntryBatch`; its acks, one (partition, entry, first, last) range; the ask
for the next transaction) and a FLOW; the server decodes it and answers
one TXN_RESPONSE and one MESSAGE carrying the next ``--per-txn`` inputs as
one entry (the consumer's next batch), which the client decodes. No
broker: what differs between the two rows is the transport alone
(framing, masking, the WebSocket machinery of aiohttp on both sides,
against a protocol callback and a length prefix).

Printed per transport: transactions per second and CPU µs per transaction
of the client and of the server (process time), the median of the rounds,
which alternate between the transports.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import struct
import sys
import time
from collections import deque
from typing import Any

import aiohttp
from aiohttp import web

from bench._brokers import free_port
from bench._results import recorded
from proto import txnbuf_pb2 as pb

T = pb.BaseCommand
_LEN = struct.Struct(">I")


def _loop_factory() -> Any:
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def client_frames(per_txn: int, i: int) -> bytes:
    """The client's frame of transaction ``i``, encoded (as the client does: per transaction)."""
    payload = os.urandom(100)
    cmd = T(type=T.COMMIT_TXN)
    commit = cmd.commit_txn
    commit.request_id, commit.txnid_least_bits, commit.commit_id = i + 1, i, i + 1
    commit.next_txn_ttl_ms = 30_000
    send = commit.sends.add(producer_id=1, partition=0, first_sequence_id=i * per_txn)
    send.batch = pb.EntryBatch(
        messages=[pb.SingleMessage(payload=payload) for _ in range(per_txn)]
    ).SerializeToString()
    commit.acks.add(consumer_id=1).ranges.extend([0, i, 0, per_txn - 1])
    return cmd.SerializeToString()


def flow() -> bytes:
    return T(type=T.FLOW, flow=pb.CommandFlow(consumer_id=1, permits=100)).SerializeToString()


class Answers:
    """The server's side: decode what came, answer as a broker does."""

    def __init__(self, per_txn: int) -> None:
        self.per_txn = per_txn
        self.entry = pb.EntryBatch(
            messages=[pb.SingleMessage(payload=os.urandom(100)) for _ in range(per_txn)]
        ).SerializeToString()

    def on_frame(self, data: bytes) -> list[bytes]:
        cmd = T.FromString(data)
        if cmd.type != T.COMMIT_TXN:
            return []  # (a FLOW)
        commit = cmd.commit_txn
        pb.EntryBatch.FromString(commit.sends[0].batch)  # (the broker checks each batch)
        answer = T(type=T.TXN_RESPONSE)
        txn = answer.txn_response
        txn.request_id = commit.request_id
        txn.next_txnid_most_bits, txn.next_txnid_least_bits = 0, commit.txnid_least_bits + 1
        message = T(type=T.MESSAGE)
        message.message.consumer_id = 1
        message.message.entries.add(
            partition=0,
            entry_id=commit.txnid_least_bits,
            data=self.entry,
            indexes=range(self.per_txn),
        )
        return [answer.SerializeToString(), message.SerializeToString()]


# -- the server process -------------------------------------------------------------


def serve(kind: str, port: int, per_txn: int, ready: Any, cpu: Any) -> None:
    async def main() -> None:
        answers = Answers(per_txn)
        done = asyncio.Event()
        if kind == "websocket":

            async def ws_handler(request: web.Request) -> web.WebSocketResponse:
                ws = web.WebSocketResponse(max_msg_size=0)
                await ws.prepare(request)
                cpu.value = time.process_time()
                async for msg in ws:
                    for out in answers.on_frame(msg.data):
                        await ws.send_bytes(out)
                cpu.value = time.process_time() - cpu.value
                done.set()
                return ws

            app = web.Application()
            app.router.add_get("/ws", ws_handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
        else:

            class Server(asyncio.Protocol):
                def connection_made(self, transport: Any) -> None:
                    self.transport = transport
                    self.buffer = bytearray()
                    cpu.value = time.process_time()

                def data_received(self, data: bytes) -> None:
                    buffer = self.buffer
                    buffer += data
                    pos = 0
                    while len(buffer) - pos >= 4:
                        (n,) = _LEN.unpack_from(buffer, pos)
                        if len(buffer) - pos - 4 < n:
                            break
                        frame = bytes(buffer[pos + 4 : pos + 4 + n])
                        pos += 4 + n
                        for out in answers.on_frame(frame):
                            self.transport.write(_LEN.pack(len(out)) + out)
                    del buffer[:pos]

                def connection_lost(self, exc: Exception | None) -> None:
                    cpu.value = time.process_time() - cpu.value
                    done.set()

            await asyncio.get_running_loop().create_server(Server, "127.0.0.1", port)
        ready.set()
        await done.wait()

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


# -- the client ---------------------------------------------------------------------


class StreamClient(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.frames: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        pos = 0
        while len(buffer) - pos >= 4:
            (n,) = _LEN.unpack_from(buffer, pos)
            if len(buffer) - pos - 4 < n:
                break
            self.frames.append(bytes(buffer[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        del buffer[:pos]
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    async def receive(self) -> bytes:
        while not self.frames:
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
        return self.frames.popleft()

    async def send_bytes(self, data: bytes) -> None:
        self.transport.write(_LEN.pack(len(data)) + data)


async def run_client(kind: str, port: int, txns: int, per_txn: int) -> tuple[float, float]:
    """Seconds and client CPU seconds for ``txns`` transactions."""
    session = aiohttp.ClientSession()
    try:
        if kind == "websocket":
            ws: Any = await session.ws_connect(f"http://127.0.0.1:{port}/ws", max_msg_size=0)

            async def receive() -> bytes:
                msg = await ws.receive()
                return msg.data  # type: ignore[no-any-return]

        else:
            _, ws = await asyncio.get_running_loop().create_connection(
                StreamClient, "127.0.0.1", port
            )
            receive = ws.receive
        cpu0, t0 = time.process_time(), time.perf_counter()
        for i in range(txns):
            await ws.send_bytes(client_frames(per_txn, i))
            await ws.send_bytes(flow())
            for _ in range(2):
                cmd = T.FromString(await receive())
                if cmd.type == T.MESSAGE:
                    pb.EntryBatch.FromString(cmd.message.entries[0].data)
        took, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        if kind == "websocket":
            await ws.close()
        else:
            ws.transport.close()
        return took, cpu
    finally:
        await session.close()


def one_round(kind: str, txns: int, per_txn: int) -> tuple[float, float, float]:
    """Transactions per second, client and server CPU µs per transaction."""
    ctx = multiprocessing.get_context("spawn")
    ready, cpu = ctx.Event(), ctx.Value("d", 0.0)
    port = free_port()
    server = ctx.Process(target=serve, args=(kind, port, per_txn, ready, cpu))
    server.start()
    try:
        if not ready.wait(30):
            raise RuntimeError("the server did not start")
        with asyncio.Runner(loop_factory=_loop_factory()) as runner:
            took, client_cpu = runner.run(run_client(kind, port, txns, per_txn))
        server.join(30)
    finally:
        if server.is_alive():
            server.kill()
    return txns / took, client_cpu * 1e6 / txns, cpu.value * 1e6 / txns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--txns", type=int, default=3000)
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kinds = ["websocket", "stream"]
    results: dict[str, list[tuple[float, float, float]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            results[kind].append(one_round(kind, args.txns, args.per_txn))
            print(f"round {r + 1} {kind}: {results[kind][-1]}", file=sys.stderr)
    print(
        f"a README-loop transaction's frames, {args.per_txn} messages of 100 B each way, "
        f"{args.txns} transactions one at a time, {args.rounds} rounds alternating (medians)"
    )
    print()
    print("| transport | txns/s, each round | median | client µs/txn | server µs/txn | total |")
    print("|---|---|---:|---:|---:|---:|")
    for kind in kinds:
        got = results[kind]
        each = ", ".join(f"{g[0]:,.0f}" for g in got)
        rate, client, server = (statistics.median(g[i] for g in got) for i in range(3))
        total = statistics.median(g[1] + g[2] for g in got)
        label = "aiohttp WebSocket" if kind == "websocket" else "raw TCP (length + bytes)"
        print(f"| {label} | {each} | {rate:,.0f} | {client:.1f} | {server:.1f} | {total:.1f} |")
    print()
    print(
        "CPU µs per transaction: process time of this client process and of the server "
        "process (encoding, decoding and the transport; no broker work)."
    )


if __name__ == "__main__":
    with recorded("framing", " ".join(["python -m bench.framing", *sys.argv[1:]])):
        main()
