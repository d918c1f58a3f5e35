"""Load on a txnbuf broker: produce, consume-and-ack, transactional
consume-transform-produce, and the admin API over HTTP.

    .venv/bin/python loadtests/run.py --run-time 60s     # starts a broker, prints figures
    .venv/bin/locust -f loadtests/locustfile.py --headless -H http://127.0.0.1:6650 -u 8 -t 30s

Four user classes, spawned in equal numbers: `ProduceUser`,
`ConsumeAckUser` and `TransactionUser` (each a `txnbuf_user.TxnbufUser`
running one task set, as fast as its requests are answered) and
`AdminUser`, which polls the admin API a few times a second. Requests
(locust type ``txnbuf``, by name):

- ``send``: one message, until the broker has stored it;
  ``send x100``: 100 messages in flight at once, until all are stored.
- ``deliver``: one per message received on the ``<prefix>-ack``
  subscription, its time from the producer's send to the consumer's
  receive (both on this machine's clock); ``ack``: acknowledging what one
  receive brought (up to 100 messages), until stored.
- ``transaction``: consume-transform-produce on ``<prefix>-ctp``: up to 10
  received messages, sent upper-cased to ``<prefix>-out`` and acknowledged
  in one transaction, committed; ``commit``: that commit alone.
- ``connect``, ``create producer``, ``subscribe``: each user's setup.

Waiting for input to arrive is not timed as a request. The admin user's
requests are locust type ``GET``.
"""

from __future__ import annotations

from typing import Any

import workload
from locust import FastHttpUser, TaskSet, between, constant, events, task
from txnbuf_user import TxnbufUser
from workload import Names

from client import Consumer, Producer


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument(
        "--txnbuf-prefix", default="load", help="topic and subscription names start with this"
    )


def names_of(environment: Any) -> Names:
    return Names(environment.parsed_options.txnbuf_prefix)


@events.test_start.add_listener
def _create_topics(environment: Any, **_: Any) -> None:
    workload.create_topics(environment.host, names_of(environment))


class ProduceTasks(TaskSet):
    """Sends to ``<prefix>-in``, one at a time or 100 in flight."""

    user: TxnbufUser
    producer: Producer

    def on_start(self) -> None:
        client, topic = self.user.txnbuf, names_of(self.user.environment).source
        self.producer = self.user.request("create producer", lambda: client.create_producer(topic))

    @task(4)
    def send(self) -> None:
        self.user.request("send", lambda: workload.send_one(self.producer))

    @task(1)
    def send_100(self) -> None:
        self.user.request("send x100", lambda: workload.send_100(self.producer))


class ConsumeAckTasks(TaskSet):
    """Receives from ``<prefix>-in`` on the shared subscription
    ``<prefix>-ack`` and acknowledges what each receive brought."""

    user: TxnbufUser
    consumer: Consumer

    def on_start(self) -> None:
        client, names = self.user.txnbuf, names_of(self.user.environment)
        self.consumer = self.user.request(
            "subscribe", lambda: workload.subscribe(client, names.source, names.ack_subscription)
        )

    @task
    def consume_and_ack(self) -> None:
        batch = self.user.call(lambda: workload.read_batch(self.consumer, workload.ACK_BATCH))
        if not batch:
            return
        for ms in workload.delivered_ms(batch):
            self.user.record("deliver", ms)
        self.user.request("ack", lambda: self.consumer.acknowledge(batch))


class TransactionTasks(TaskSet):
    """Consume-transform-produce, exactly once: receives from ``<prefix>-in``
    on the shared subscription ``<prefix>-ctp``, and in one transaction
    sends the upper-cased payloads to ``<prefix>-out`` and acknowledges the
    inputs."""

    user: TxnbufUser
    consumer: Consumer
    producer: Producer

    def on_start(self) -> None:
        client, names = self.user.txnbuf, names_of(self.user.environment)
        self.consumer = self.user.request(
            "subscribe", lambda: workload.subscribe(client, names.source, names.ctp_subscription)
        )
        self.producer = self.user.request(
            "create producer", lambda: client.create_producer(names.sink)
        )

    @task
    def consume_transform_produce(self) -> None:
        batch = self.user.call(lambda: workload.read_batch(self.consumer, workload.TXN_BATCH))
        if not batch:
            return
        client = self.user.txnbuf
        commit_seconds = self.user.request(
            "transaction",
            lambda: workload.consume_transform_produce(client, self.consumer, self.producer, batch),
        )
        self.user.record("commit", commit_seconds * 1000)


class ProduceUser(TxnbufUser):
    tasks = [ProduceTasks]
    wait_time = constant(0)


class ConsumeAckUser(TxnbufUser):
    tasks = [ConsumeAckTasks]
    wait_time = constant(0)


class TransactionUser(TxnbufUser):
    tasks = [TransactionTasks]
    wait_time = constant(0)


class AdminUser(FastHttpUser):
    """An operator's dashboard polling the admin API over HTTP."""

    wait_time = between(0.05, 0.2)

    @task(2)
    def topics(self) -> None:
        self.client.get("/admin/v1/topics")

    @task(4)
    def topic_stats(self) -> None:
        names = names_of(self.environment)
        for topic in (names.source, names.sink):
            self.client.get(f"/admin/v1/topics/{topic}/stats", name="/admin/v1/topics/[t]/stats")

    @task(2)
    def open_transactions(self) -> None:
        self.client.get("/admin/v1/transactions?state=OPEN")

    @task(1)
    def coordinators(self) -> None:
        self.client.get("/admin/v1/coordinators")

    @task(1)
    def metrics(self) -> None:
        self.client.get("/metrics")

    @task(1)
    def page(self) -> None:
        self.client.get("/", name="/ (admin page)")
