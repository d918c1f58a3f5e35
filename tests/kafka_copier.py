"""A transactional consume-transform-produce copier for each Kafka client
library (aiokafka, kafka-python, confluent-kafka), written as an
application would write it. `tests/test_kafka.py` runs the copiers in its
own process, and as processes of their own that it SIGKILLs:

    python -m tests.kafka_copier CLIENT BOOTSTRAP SRC DST GROUP
        [--per-txn N] [--pause-at K] [--timeout S]
        [--security-protocol P [--sasl-mechanism M --role R] [--ssl-cafile F]]

A copier reads `src` (two partitions) as a member of consumer group
`group`, read_committed, and for each batch of up to ``per_txn`` records
begins a transaction, produces the records upper-cased to `dst`, waits
until the broker has stored them, sends the batch's offsets to the
transaction (AddOffsetsToTxn, TxnOffsetCommit) and commits it; every
ABORT_EVERY-th transaction it aborts instead, and goes back to the group's
committed offsets. It stops once the group's committed offsets are at the
end of `src`. Its transactional id is ``<group>-tx``, the same for every
life of the copier: a new life's init_transactions fences the one before
and rolls back the transaction it left open.

As a process, the copier prints a line to stdout as it goes: ``committed
<n>`` after its n-th commit, ``aborted <n>`` after its n-th abort, and
``done`` when it stopped (exit status 0), or ``failed fenced: <error>``
when its producer was fenced, ``failed: <error>`` when anything else ended
it (exit status 1). With ``--pause-at K`` it stops before its K-th commit,
with that transaction open at the broker (its records stored, its offsets
sent), prints ``open``, and commits once it reads a line on stdin (a test
kills it there, or kills the broker and then lets it commit).

With ``--security-protocol`` SASL_PLAINTEXT or SASL_SSL it authenticates
with the token in the environment variable TXNBUF_TOKEN (`Credentials`):
OAUTHBEARER (the token as the bearer token) or PLAIN (the user ``--role``,
the password the token); with SSL or SASL_SSL it trusts ``--ssl-cafile``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ABORT_EVERY = 3
SESSION_TIMEOUT_MS = 2000  # (a killed member leaves its group this soon)
HEARTBEAT_MS = 400
REQUEST_TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class Credentials:
    """How a Kafka client connects: Kafka's security protocol, and for SASL
    the mechanism, the role and its token; for TLS the CA file to trust.
    Each method gives one client library's settings for them."""

    security_protocol: str = "PLAINTEXT"
    mechanism: str = "OAUTHBEARER"
    role: str = ""
    token: str = ""
    cafile: str | None = None

    @property
    def sasl(self) -> bool:
        return self.security_protocol.startswith("SASL_")

    @property
    def tls(self) -> bool:
        return self.security_protocol.endswith("SSL")

    def aiokafka(self) -> dict[str, Any]:
        from aiokafka.abc import AbstractTokenProvider
        from aiokafka.helpers import create_ssl_context

        conf: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.tls:
            conf["ssl_context"] = create_ssl_context(cafile=self.cafile)
        if self.sasl:
            conf["sasl_mechanism"] = self.mechanism
            token = self.token

            class Provider(AbstractTokenProvider):
                async def token(self) -> str:
                    return token

            if self.mechanism == "PLAIN":
                conf.update(sasl_plain_username=self.role, sasl_plain_password=token)
            else:
                conf["sasl_oauth_token_provider"] = Provider()
        return conf

    def kafka_python(self) -> dict[str, Any]:
        from kafka.net.sasl.oauth import AbstractTokenProvider

        conf: dict[str, Any] = {"security_protocol": self.security_protocol}
        if self.tls:
            conf["ssl_cafile"] = self.cafile
        if self.sasl:
            conf["sasl_mechanism"] = self.mechanism
            token = self.token

            class Provider(AbstractTokenProvider):
                def token(self) -> str:
                    return token

            if self.mechanism == "PLAIN":
                conf.update(sasl_plain_username=self.role, sasl_plain_password=token)
            else:
                conf["sasl_oauth_token_provider"] = Provider()
        return conf

    def confluent(self) -> dict[str, Any]:
        conf: dict[str, Any] = {"security.protocol": self.security_protocol}
        if self.tls:
            conf["ssl.ca.location"] = self.cafile
        if self.sasl:
            conf["sasl.mechanism"] = self.mechanism
            token = self.token
            if self.mechanism == "PLAIN":
                conf.update({"sasl.username": self.role, "sasl.password": token})
            else:
                # (the token's lifetime as librdkafka wants it: far off; the
                # broker ends the connection when the token itself expires)
                conf["oauth_cb"] = lambda _config: (token, time.time() + 3600)
        return conf

    def copier_args(self) -> list[str]:
        """The copier process's options for these (its token goes in its
        environment: TXNBUF_TOKEN)."""
        args = ["--security-protocol", self.security_protocol]
        if self.sasl:
            args += ["--sasl-mechanism", self.mechanism, "--role", self.role]
        if self.cafile is not None:
            args += ["--ssl-cafile", self.cafile]
        return args


PLAINTEXT = Credentials()


class Copy:
    """One life of a copier: what it copies, and the hooks it calls around
    its transactions (`abort_this` as it ends one, then `committing` and
    `committed`, or `aborted`)."""

    def __init__(
        self,
        boot: str,
        src: str,
        dst: str,
        group: str,
        per_txn: int,
        timeout: float,
        creds: Credentials = PLAINTEXT,
    ) -> None:
        self.boot = boot
        self.creds = creds
        self.src, self.dst = src, dst
        self.group = group
        self.tid = f"{group}-tx"
        self.per_txn = per_txn
        self.deadline = time.monotonic() + timeout
        self.attempts = 0  # transactions begun
        self.commits = 0  # transactions whose commit the client confirmed
        self.aborts = 0

    def check_time(self) -> None:
        if time.monotonic() >= self.deadline:
            raise AssertionError(f"the copier did not finish: {self.commits} commits")

    def abort_this(self) -> bool:
        """Counts a transaction; True if the copier is to abort it."""
        self.attempts += 1
        return self.attempts % ABORT_EVERY == 0

    def committing(self) -> None:
        """The transaction's records are stored and its offsets sent; its
        commit comes next."""

    def committed(self) -> None:
        self.commits += 1

    def aborted(self) -> None:
        self.aborts += 1


# -- aiokafka -------------------------------------------------------------------------


async def aiokafka_copier(copy: Copy) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    producer = AIOKafkaProducer(
        bootstrap_servers=copy.boot,
        transactional_id=copy.tid,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        **copy.creds.aiokafka(),
    )
    consumer = AIOKafkaConsumer(
        copy.src,
        bootstrap_servers=copy.boot,
        group_id=copy.group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        isolation_level="read_committed",
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        **copy.creds.aiokafka(),
    )
    try:
        await producer.start()  # (init_transactions)
        await consumer.start()
        parts = [TopicPartition(copy.src, 0), TopicPartition(copy.src, 1)]
        while True:
            copy.check_time()
            batch = await consumer.getmany(timeout_ms=500, max_records=copy.per_txn)
            records = [r for rs in batch.values() for r in rs]
            if not records:
                ends = await consumer.end_offsets(parts)
                if [await consumer.committed(tp) for tp in parts] == [ends[tp] for tp in parts]:
                    return
                continue
            await producer.begin_transaction()
            sent = [await producer.send(copy.dst, r.value.upper(), key=r.key) for r in records]
            await asyncio.gather(*sent)
            offsets = {TopicPartition(r.topic, r.partition): r.offset + 1 for r in records}
            await producer.send_offsets_to_transaction(offsets, copy.group)
            if copy.abort_this():
                await producer.abort_transaction()
                copy.aborted()
                for tp in batch:
                    committed = await consumer.committed(tp)
                    consumer.seek(tp, 0 if committed is None else committed)
            else:
                copy.committing()
                await producer.commit_transaction()
                copy.committed()
    finally:
        for part in (producer, consumer):
            # (a consumer stopping while the broker was away can raise the
            # CancelledError of its fetch task)
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(part.stop(), 15)


# -- kafka-python -------------------------------------------------------------------------


def kafka_python_copier(copy: Copy) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    producer = KafkaProducer(
        bootstrap_servers=copy.boot,
        transactional_id=copy.tid,
        request_timeout_ms=REQUEST_TIMEOUT_MS,
        **copy.creds.kafka_python(),
    )
    consumer = None
    try:
        producer.init_transactions()
        consumer = KafkaConsumer(
            copy.src,
            bootstrap_servers=copy.boot,
            group_id=copy.group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
            isolation_level="read_committed",
            request_timeout_ms=REQUEST_TIMEOUT_MS,
            session_timeout_ms=SESSION_TIMEOUT_MS,
            heartbeat_interval_ms=HEARTBEAT_MS,
            **copy.creds.kafka_python(),
        )
        parts = [TopicPartition(copy.src, 0), TopicPartition(copy.src, 1)]
        while True:
            copy.check_time()
            batch = consumer.poll(timeout_ms=500, max_records=copy.per_txn)
            records = [r for rs in batch.values() for r in rs]
            if not records:
                ends = consumer.end_offsets(parts)
                if [consumer.committed(tp) for tp in parts] == [ends[tp] for tp in parts]:
                    return
                continue
            producer.begin_transaction()
            sent = [producer.send(copy.dst, r.value.upper(), key=r.key) for r in records]
            for future in sent:
                future.get(REQUEST_TIMEOUT_MS / 1000)
            offsets = {
                TopicPartition(r.topic, r.partition): OffsetAndMetadata(r.offset + 1, "", -1)
                for r in records
            }
            producer.send_offsets_to_transaction(offsets, consumer.group_metadata())
            if copy.abort_this():
                producer.abort_transaction()
                copy.aborted()
                for tp in batch:
                    committed = consumer.committed(tp)
                    consumer.seek(tp, 0 if committed is None else committed)
            else:
                copy.committing()
                producer.commit_transaction()
                copy.committed()
    finally:
        producer.close(timeout=5)
        if consumer is not None:
            consumer.close()


# -- confluent-kafka (librdkafka) ---------------------------------------------------------


def confluent_copier(copy: Copy) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    security = copy.creds.confluent()
    producer = Producer({"bootstrap.servers": copy.boot, "transactional.id": copy.tid, **security})
    consumer = Consumer(
        {
            **security,
            "bootstrap.servers": copy.boot,
            "group.id": copy.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "session.timeout.ms": SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": HEARTBEAT_MS,
        }
    )
    try:
        # (before the consumer joins its group: it reads the committed
        # offsets once what a killed life left is rolled back)
        producer.init_transactions(30)
        consumer.subscribe([copy.src])
        parts = [TopicPartition(copy.src, 0), TopicPartition(copy.src, 1)]
        while True:
            copy.check_time()
            records = [r for r in consumer.consume(copy.per_txn, 0.5) if r.error() is None]
            if not records:
                committed = consumer.committed(parts, 10)
                if all(tp.offset == consumer.get_watermark_offsets(tp, 10)[1] for tp in committed):
                    return
                continue
            producer.begin_transaction()
            for r in records:
                producer.produce(copy.dst, r.value().upper(), key=r.key())
            if producer.flush(REQUEST_TIMEOUT_MS / 1000):
                raise TimeoutError("the transaction's records were not delivered")
            offsets: dict[tuple[str, int], int] = {}
            for r in records:
                offsets[(r.topic(), r.partition())] = r.offset() + 1
            producer.send_offsets_to_transaction(
                [TopicPartition(t, p, o) for (t, p), o in offsets.items()],
                consumer.consumer_group_metadata(),
                30,
            )
            if copy.abort_this():
                producer.abort_transaction(30)
                copy.aborted()
                parts_read = [TopicPartition(t, p) for t, p in offsets]
                for tp in consumer.committed(parts_read, 10):
                    consumer.seek(TopicPartition(tp.topic, tp.partition, max(tp.offset, 0)))
            else:
                copy.committing()
                producer.commit_transaction(30)
                copy.committed()
    finally:
        consumer.close()


# -- as a process -------------------------------------------------------------------------


class ProcessCopy(Copy):
    """A copier process's life: it tells the test what it does (stdout)."""

    def __init__(
        self,
        boot: str,
        src: str,
        dst: str,
        group: str,
        per_txn: int,
        timeout: float,
        pause_at: int,
        creds: Credentials = PLAINTEXT,
    ) -> None:
        super().__init__(boot, src, dst, group, per_txn, timeout, creds)
        self.pause_at = pause_at  # 0: none

    def committing(self) -> None:
        if self.commits + 1 == self.pause_at:
            print("open", flush=True)
            sys.stdin.readline()

    def committed(self) -> None:
        super().committed()
        print(f"committed {self.commits}", flush=True)

    def aborted(self) -> None:
        super().aborted()
        print(f"aborted {self.aborts}", flush=True)


def aiokafka_fenced(exc: BaseException) -> bool:
    from aiokafka.errors import ProducerFenced

    return isinstance(exc, ProducerFenced)


def kafka_python_fenced(exc: BaseException) -> bool:
    from kafka.errors import InvalidProducerEpochError, ProducerFencedError

    # (INVALID_PRODUCER_EPOCH answering a Produce is fatal to a transactional
    # kafka-python producer: it bumps epochs only through InitProducerId v3+)
    return isinstance(exc, InvalidProducerEpochError | ProducerFencedError)


def confluent_fenced(exc: BaseException) -> bool:
    from confluent_kafka import KafkaError, KafkaException

    return isinstance(exc, KafkaException) and exc.args[0].code() == KafkaError._FENCED


FENCED: dict[str, Callable[[BaseException], bool]] = {
    "aiokafka": aiokafka_fenced,
    "kafka-python": kafka_python_fenced,
    "confluent-kafka": confluent_fenced,
}
COPIERS: dict[str, Callable[[Copy], None]] = {
    "aiokafka": lambda copy: asyncio.run(aiokafka_copier(copy)),
    "kafka-python": kafka_python_copier,
    "confluent-kafka": confluent_copier,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kafka_copier", description=__doc__)
    parser.add_argument("client", choices=sorted(COPIERS))
    parser.add_argument("bootstrap")
    parser.add_argument("src")
    parser.add_argument("dst")
    parser.add_argument("group")
    parser.add_argument("--per-txn", type=int, default=10)
    parser.add_argument("--pause-at", type=int, default=0, help="stop before this commit")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to finish in")
    parser.add_argument("--security-protocol", default="PLAINTEXT")
    parser.add_argument("--sasl-mechanism", default="OAUTHBEARER", choices=["OAUTHBEARER", "PLAIN"])
    parser.add_argument("--role", default="", help="PLAIN's user name")
    parser.add_argument("--ssl-cafile", default=None)
    args = parser.parse_args(argv)
    creds = Credentials(
        args.security_protocol,
        args.sasl_mechanism,
        args.role,
        os.environ.get("TXNBUF_TOKEN", ""),
        args.ssl_cafile,
    )
    copy = ProcessCopy(
        args.bootstrap,
        args.src,
        args.dst,
        args.group,
        args.per_txn,
        args.timeout,
        args.pause_at,
        creds,
    )
    try:
        COPIERS[args.client](copy)
    except Exception as exc:
        fenced = " fenced" if FENCED[args.client](exc) else ""
        print(f"failed{fenced}: {exc!r}", flush=True)
        return 1
    print("done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
