"""Exactly-once copy with an unmodified Kafka client (aiokafka) against
txnbuf's Kafka listener: the README's "Kafka clients" section as a program.

    .venv/bin/txnbuf serve --kafka-port 9092 &
    .venv/bin/python examples/aiokafka_copier.py

Copies every record of `in` to `out`, upper-cased, as the consumer group
`copier`: each transaction holds a batch's records and the group's offsets
past them, so a crash anywhere copies nothing twice and loses nothing. It
stops after a poll of IDLE_MS finds no record. (aiokafka is among the test
extras: `pip install -e '.[test]'` or `pip install aiokafka`.)
"""

import argparse
import asyncio

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

IDLE_MS = 5000  # a poll this long with no record, then stop


async def main(bootstrap: str) -> None:
    kafka = {"bootstrap_servers": bootstrap}
    producer = AIOKafkaProducer(**kafka, transactional_id="copier-1")
    consumer = AIOKafkaConsumer("in", **kafka, group_id="copier", isolation_level="read_committed",
                                enable_auto_commit=False, auto_offset_reset="earliest")  # fmt: skip
    await producer.start()
    await consumer.start()
    copied = 0
    try:
        while True:
            polled = await consumer.getmany(timeout_ms=IDLE_MS)
            records = [r for rs in polled.values() for r in rs]
            if not records:
                break
            async with producer.transaction():  # commits the records and the offsets together
                for r in records:
                    await producer.send("out", r.value.upper())
                offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
                await producer.send_offsets_to_transaction(offsets, "copier")
            copied += len(records)
    finally:
        await consumer.stop()
        await producer.stop()
    print(f"copied {copied} records")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default="127.0.0.1:9092", help="the Kafka listener")
    asyncio.run(main(parser.parse_args().bootstrap))
