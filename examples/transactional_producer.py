"""Exactly-once copy with Kafka's transactional producer (the producer-epoch
mode): the README's "Kafka's transactional producer" section as a program.

    .venv/bin/txnbuf serve &                      # a broker on 127.0.0.1:6650
    .venv/bin/python examples/transactional_producer.py

Copies every message of `in` to `out`, upper-cased: each batch's sends and
its acknowledgements of the inputs commit together, under the stable
transactional id `copier-1`. A second copy of this program started beside
it fences the first (its next send or commit raises ProducerFencedError),
and rolls back what the first left open. It stops after IDLE seconds
without input.
"""

import argparse
import asyncio
import time

from client import Client

IDLE = 5.0  # seconds without input, then stop


async def main(url: str) -> None:
    async with Client(url) as client:
        source = await client.subscribe("in", "copier", initial_position="earliest")
        p = await client.create_transactional_producer("copier-1", transaction_timeout=60.0)
        await p.init_transactions()
        copied, last_input = 0, time.monotonic()
        while time.monotonic() - last_input < IDLE:
            batch = await source.batch_receive(max_messages=100, timeout=0.1)
            if not batch:
                continue
            last_input = time.monotonic()
            await p.begin_transaction()
            for msg in batch:
                await p.send("out", msg.value.upper(), key=msg.key)
            await p.send_offsets_to_transaction(source, batch)  # transactional acks
            await p.commit_transaction()  # or abort_transaction(); p.producer_id, p.epoch
            copied += len(batch)
        await p.close()
    print(f"copied {copied} messages")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:6650", help="the broker")
    asyncio.run(main(parser.parse_args().url))
