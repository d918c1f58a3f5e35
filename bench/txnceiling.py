"""How fast transactional produce could be on this machine: the same client
work against the real broker and against a broker without its transaction
machinery.

    python -m bench.txnceiling [--messages 1000000] [--rounds 3]
                               [--inflight 64] [--per-txn 100] [--size 100]

Three ways of producing ``--messages`` messages, ``--rounds`` runs of each in
rotation, each run against a broker process of its own (fresh data
directory):

1. ``plain``: no transactions, ``--inflight`` x ``--per-txn`` messages in
   flight (a sliding window): bench.txn's like-for-like baseline.
2. ``txn``: ``--inflight`` workers, each committing transactions of
   ``--per-txn`` back to back (bench.txn's transactional side).
3. ``txn, no machinery``: the same client work, against a broker started
   by `serve_free`: a transactional SEND is stored as a plain one and END
   is answered once the transaction's last send is durable, with the next
   TxnID from a counter. It replaces the full path (SEND and END_TXN), so
   this way's transactions take it (`Transaction.flush` before commit);
   ``txn`` takes the local path (one COMMIT_TXN), as a client does. No
   coordinator, no records, no sidecar, no marker: the client's work per
   transaction, and the frames of 100 messages and
   the END and its answer, are all that is left. (Each worker's first
   transaction is opened by the real coordinator, NEW_TXN being left as it
   is, and stays open to the end: 64 OPEN records in a run of 10,000
   transactions.) It is a measuring instrument, not a broker (nothing is
   atomic; never serve data with it).

Prints the median msgs/s of each way, the CPU each process spent per
message (the client: this process; the broker; its ledger writer), and the
ratio of each transactional way to plain. The third bounds what any
speed-up of the transaction machinery itself can give on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench._brokers import BrokerProcess
from bench._progress import Runs, legend
from bench._results import recorded
from bench.txn import send_in_transactions, send_pipelined
from client import Client

WAYS = ("plain", "txn", "txn, no machinery")
FREE_IDS_FROM = 1 << 40  # the stand-in's TxnIDs: far above any its coordinator gives in a run


def broker_process(data_dir: str, free: bool) -> BrokerProcess:
    """A broker process on a fresh port (``free``: started by `serve_free`)."""
    entry = ("-m", "bench.txnceiling", "--serve-free") if free else ("-m", "broker")
    return BrokerProcess(data_dir, entry)


async def produce(url: str, way: str, total: int, per_txn: int, size: int, inflight: int) -> float:
    """One run: ``total`` messages produced ``way``; msgs/s."""
    payload = os.urandom(size)
    async with Client(url) as client:
        producer = await client.create_producer(f"ceiling-{os.getpid()}")
        start = time.perf_counter()
        if way == "plain":
            await send_pipelined(producer, payload, total, inflight * per_txn)
        else:
            # (the stand-in replaces the full path's machinery: that way takes it)
            full = way == "txn, no machinery"
            await send_in_transactions(client, producer, payload, total, per_txn, inflight, full)
        return total / (time.perf_counter() - start)


def one_run(
    way: str, args: argparse.Namespace, runner: asyncio.Runner
) -> tuple[float, float, float, float]:
    """msgs/s and CPU µs per message of the client, broker and writer."""
    with tempfile.TemporaryDirectory() as tmp:
        broker = broker_process(os.path.join(tmp, "data"), free=way == "txn, no machinery")
        try:
            broker0, writer0 = broker.cpu()
            client0 = time.process_time()
            rate = runner.run(
                produce(broker.url, way, args.messages, args.per_txn, args.size, args.inflight)
            )
            client1 = time.process_time()
            broker1, writer1 = broker.cpu()
        finally:
            broker.stop()
    per = 1e6 / args.messages
    return rate, (client1 - client0) * per, (broker1 - broker0) * per, (writer1 - writer0) * per


def serve_free(argv: Sequence[str]) -> None:
    """Run `txnbuf serve` with the transaction machinery taken out of its
    connections (see the module docstring). Measurement only."""
    from broker import _connection, _transactions
    from proto import txnbuf_pb2 as pb
    from tc import TxnID

    conn_class = _connection.Connection
    on_send = conn_class._on_send
    last_send: dict[tuple[int, int], asyncio.Future[Any]] = {}
    ids = itertools.count(FREE_IDS_FROM)

    def free_on_send(self: _connection.Connection, cmd: pb.BaseCommand) -> None:
        req = cmd.send
        if not req.transactional:
            on_send(self, cmd)
            return
        producer = self.producers[req.producer_id]
        partition = producer.topic.partitions[req.partition]
        messages = pb.EntryBatch.FromString(req.batch).messages
        first = req.first_sequence_id if req.HasField("first_sequence_id") else None
        stored = asyncio.ensure_future(partition.publish(producer.name, messages, req.batch, first))
        last_send[req.txnid_most_bits, req.txnid_least_bits] = stored

        def receipt(_stored: asyncio.Future[Any]) -> None:
            out = pb.BaseCommand(type=pb.BaseCommand.SEND_RECEIPT)
            out.send_receipt.producer_id = req.producer_id
            out.send_receipt.request_id = req.request_id
            out.send_receipt.partition = req.partition
            out.send_receipt.first_batch_index = 0
            self.send(out)

        stored.add_done_callback(receipt)

    def free_end_txn(self: _transactions.Transactions, cmd: pb.BaseCommand) -> None:
        req = cmd.end_txn
        following = TxnID(0, next(ids)) if req.HasField("next_txn_ttl_ms") else None
        stored = last_send.pop((req.txnid_most_bits, req.txnid_least_bits), None)

        def answer(_stored: object = None) -> None:
            self._txn_respond(req, "end transaction", None, following)

        if stored is None or stored.done():
            answer()
        else:
            stored.add_done_callback(answer)

    conn_class._on_send = free_on_send  # type: ignore[method-assign]
    _transactions.Transactions.on_end_txn = free_end_txn  # type: ignore[method-assign]
    from broker.cli import main as broker_main

    broker_main(list(argv))


def main() -> None:
    if sys.argv[1:2] == ["--serve-free"]:
        serve_free(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each way, in rotation")
    parser.add_argument("--inflight", type=int, default=64, help="transactions open at once")
    parser.add_argument("--per-txn", type=int, default=100)
    parser.add_argument("--size", type=int, default=100)
    args = parser.parse_args()
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:
        loop_factory = None
    runs: dict[str, list[tuple[float, float, float, float]]] = {way: [] for way in WAYS}
    with (
        asyncio.Runner(loop_factory=loop_factory) as runner,
        Runs(args.rounds * len(WAYS), "txnceiling") as progress,
    ):
        for r in range(args.rounds):
            for way in WAYS[r % 3 :] + WAYS[: r % 3]:
                progress.start(f"round {r + 1}: {way}")
                runs[way].append(one_run(way, args, runner))
                progress.done(f"{runs[way][-1][0]:,.0f} msgs/s")

    def median(way: str, column: int) -> float:
        return statistics.median(run[column] for run in runs[way])

    plain = median("plain", 0)
    print(f"\nproduce {args.messages:,} x {args.size} B; {args.inflight} transactions of "
          f"{args.per_txn} open, or as many messages in flight; medians of {args.rounds} "
          f"runs of each (in rotation)")  # fmt: skip
    print(f"{'way':<18} {'msgs/s':>9} {'ratio':>6} {'client':>7} {'broker':>7} {'writer':>7}"
          f"   (CPU µs per message)")  # fmt: skip
    for way in WAYS:
        rate = median(way, 0)
        pairs = zip(runs[way], runs["plain"], strict=True)
        each = ", ".join(f"{run[0] / base[0]:.2f}" for run, base in pairs)
        cpu = "".join(f" {median(way, column):>7.2f}" for column in (1, 2, 3))
        print(f"{way:<18} {rate:>9,.0f} {rate / plain:>6.2f}{cpu}   (ratio each round: {each})")
    legend(
        "ratio: msgs/s over plain's; client / broker / writer: CPU microseconds per message of "
        "this process / the broker's event loop / its ledger writer",
        "'txn, no machinery' is the ceiling: the same client work against a broker that "
        "skips the transaction machinery (not a broker to serve data with)",
    )


if __name__ == "__main__":
    if "--serve-free" in sys.argv:  # (a run inside the benchmark: its caller records the figures)
        main()
    else:
        with recorded("txnceiling", " ".join(["python -m bench.txnceiling", *sys.argv[1:]])):
            main()
