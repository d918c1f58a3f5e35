"""Exactly-once consume-transform-produce, the PIP-31 way.

Reads messages from an input topic, transforms them (upper-cases the
payload), and in ONE transaction produces the results to an output topic and
acknowledges the inputs. Commit makes both visible together; if anything
fails, the transaction aborts: no output appears and the inputs come back.

    txnbuf serve &                       # a broker on 127.0.0.1:6650
    python examples/consume_transform_produce.py --seed 1000

Options: --url, --input, --output, --seed N (first publish N inputs),
--batch (messages per transaction), --idle (seconds without input to stop).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

from client import Client


async def main(args: argparse.Namespace) -> int:
    async with Client(args.url) as client:
        if args.seed:
            seeder = await client.create_producer(args.input)
            await asyncio.gather(*(seeder.send(b"message %d" % i) for i in range(args.seed)))
            print(f"published {args.seed} inputs to {args.input!r}")
        consumer = await client.subscribe(args.input, "transformer", initial_position="earliest")
        producer = await client.create_producer(args.output)
        copied = 0
        last_input = time.monotonic()
        while True:
            # Up to --batch messages, waiting at most 0.1 s for the batch to fill.
            batch = await consumer.batch_receive(max_messages=args.batch, timeout=0.1)
            if not batch:
                if time.monotonic() - last_input > args.idle:
                    break  # no input for a while: done
                continue
            last_input = time.monotonic()
            async with client.transaction(timeout=30) as txn:
                for msg in batch:
                    await producer.send(msg.value.upper(), key=msg.key, txn=txn)
                    await consumer.acknowledge(msg, txn=txn)
            # Leaving the block committed the transaction (an exception aborts
            # it). The sends and acks above returned once queued; the commit
            # raises, aborting, if the broker refused one of them.
            copied += len(batch)
            print(f"committed {len(batch)} messages (total {copied}) in {txn.id}")
    print(f"done: {copied} messages copied exactly once to {args.output!r}")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:6650")
    parser.add_argument("--input", default="ctp-input")
    parser.add_argument("--output", default="ctp-output")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--idle", type=float, default=3.0)
    sys.exit(asyncio.run(main(parser.parse_args())))
