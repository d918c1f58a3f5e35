"""The queue workload: concurrent transactional clients against a real broker,
with faults, recorded as a history for `checker.check`.

After Jepsen's Kafka queue workload. Keys are single-partition topics
(``"q0/0"`` ...), so a key is a partition. ``clients`` logical workers each
hold one client connection, one producer and, per topic, a consumer on an
exclusive subscription of their own (``w<n>``). A worker loops:

* a transaction of 1-4 micro-ops, each a ``send`` of the key's next unique
  value or a ``poll`` (receive a few messages from one topic, acknowledged in
  the transaction); about 10% are aborted on purpose; sometimes with a short
  delay inside; now and then a plain send or poll outside any transaction;
  both paths of a transaction (docs/architecture.md): most are local (held
  in the client, committed by one COMMIT_TXN, one group commit), about a
  third take the full path (``Transaction.flush``: each send and ack
  written as it comes, END_TXN at the end); on the full path, in about half
  the transactions the sends are not awaited one by one (``send_nowait``),
  so the commit goes right behind them (END_TXN ``after_ops``) while they
  are unanswered; the history records each transaction's path;
* outcomes: ``ok`` after a commit, ``fail`` when the transaction certainly
  aborted (on purpose, a conflict, a timeout), ``info`` when unknown.

Crashes: after a broker fault every worker becomes a new process (Jepsen's
convention: its consumers may legitimately see unacknowledged messages
again), and every ~`CLIENT_CRASH_EVERY` seconds one worker drops its client
in the middle of a transaction (its op is ``info``; the broker times the
transaction out).

Faults (`Nemesis`): SIGKILL of the broker (restarted after a moment) and
SIGSTOP / SIGCONT, at seeded random times with quiet periods, recorded in
the history as ``nemesis`` ops. Everything random comes from ``seed``.

A cluster (``brokers`` > 1, or a ``store``): the brokers run with
``--store URL --cluster`` over one PostgreSQL database (the check's own,
``initdb`` in the work dir, or the one given), the clients are given every
broker's URL, and each fault is aimed at brokers chosen by role (`ROLES`):
the owner of the transactions' coordinator, the owner of a key's
partition, both, or one at random; the history's ``nemesis`` ops and the
fault schedule name the role and the brokers it hit. A pause may outlast
the lease (``lease_ttl``), so the paused broker's slots move and it is
fenced when it wakes. The transactions span brokers: their coordinator
starts on one broker and the keys on the others (`transaction_layout`;
the history's ``layout`` op records where each started).

The final phase stops the faults, then fresh subscriptions read every topic
from the start, all at once, each until every acknowledged send of its key
has been seen (or a time limit passes), and records per key whether that
completed (the checker judges each key's unread values by it).

With ``auth`` the broker authenticates (docs/security.md): the workers hold
a token of the role ``workload``, granted produce and consume on the
topics and nothing else, so every one of their commands goes through the
ACL; the admin calls use a superuser's token. The keys and tokens are made
with the real CLI (``txnbuf token``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client import Client, Consumer, Producer, errors
from client._brokers import slot_of
from proto import TxnID

from ._postgres import LocalPostgres
from .history import Recorder

__all__ = [
    "ROLES",
    "BrokerUnderTest",
    "Nemesis",
    "WorkloadConfig",
    "run_workload",
    "transaction_layout",
]

CLIENT_CRASH_EVERY = 30.0  # seconds between deliberate client crashes
TXN_TIMEOUT = 10.0  # seconds; a dropped client's transaction aborts after this
ABORT_P = 0.1
NOWAIT_P = 0.5  # transactions whose sends are queued, not awaited, before commit
FULL_PATH_P = 0.35  # transactions that take the full path (Transaction.flush)
OUTSIDE_TXN_P = 0.1
DELAY_P = 0.1
# The brokers a fault is aimed at, in a cluster (see the module docstring).
ROLES = ("coordinator", "partitions", "both", "random")


@dataclass
class WorkloadConfig:
    duration: float = 60.0
    clients: int = 4
    topics: int = 3
    seed: int = 0
    faults: tuple[str, ...] = ("kill", "pause")
    fault_interval: tuple[float, float] = (3.0, 8.0)  # random wait between faults
    quiet: float = 2.0  # no new fault this long after one ends
    final_read_timeout: float = 60.0
    # Told how far it got, about once a second while the workload runs and
    # after each poll of the final reads: (phase, fraction done, counts).
    progress: Callable[[str, float, dict[str, int]], None] | None = None
    auth: bool = False  # the broker authenticates; the workers hold a "workload" token
    brokers: int = 1
    # "": SQLite in the work dir (one broker); "postgresql": a PostgreSQL server
    # of the check's own; a postgresql:// URL: that database. With a store, the
    # brokers run with --cluster.
    store: str = ""
    lease_ttl: float = 2.0  # the brokers' --lease-ttl in a cluster
    # A pause's length, drawn from this range of seconds; None: 0.5 s to 2 s
    # on one broker, to twice the lease in a cluster (some pauses outlast it).
    pause: tuple[float, float] | None = None

    @property
    def cluster(self) -> bool:
        return bool(self.store)


def transaction_layout(
    count: int, slots: int, run: str, owners: Sequence[str] = ()
) -> tuple[list[str], str | None]:
    """The keys' topics, and the topic near which the transactions take their
    coordinator (``Client.new_transaction(near=...)``; None: the client's
    first broker's coordinators).

    One broker (``slots`` 0): ``q0``, ``q1``, ... and None.

    A cluster: the transactions span brokers (docs/cluster.md, "Transactions
    across brokers"), so that the faults aimed at the coordinator's owner
    and at the partitions' owner hit different brokers. ``owners`` is the
    URL of each slot's owner when the workload starts (`_slot_owners`).
    The names are ``q{run}-{i}`` as they come (``run`` keeps one run's names
    apart from another's in a database given with ``--store``): the first
    is ``near`` (coordinator k of its slot k, on k's owner; no key is in
    that slot), and the keys' topics are the next names whose slot's owner
    is another broker than the coordinator's, taking those brokers in turn,
    so that the keys are spread over them. Without ``owners`` (or with one
    broker owning everything) the keys are only kept out of near's slot.
    Slots move with the faults; this is where everything starts, and the
    workload records it in the history (a ``layout`` op).
    """
    if not slots:
        return [f"q{i}" for i in range(count)], None
    names = (f"q{run}-{i}" for i in range(1 << 30))
    near = next(names)
    home = slot_of(near, slots)
    others = sorted(set(owners) - {owners[home]}) if len(owners) == slots else []
    topics: list[str] = []
    while len(topics) < count:
        name = next(names)
        slot = slot_of(name, slots)
        if slot == home:
            continue
        if not others or owners[slot] == others[len(topics) % len(others)]:
            topics.append(name)
    return topics, near


async def _slot_owners(control: Client, brokers: int, wait: float = 30.0) -> list[str]:
    """The URL of each slot's owner, asked by lookups once every one of the
    ``brokers`` owns a slot (the slots are spread as brokers join), or
    as they are after ``wait`` seconds."""
    conns = control._brokers
    loop = asyncio.get_running_loop()
    give_up = loop.time() + wait
    while True:
        deadline = loop.time() + 10.0
        found = await asyncio.gather(
            *(conns.lookup(tc_id=k, deadline=deadline) for k in range(conns.slots))
        )
        owners = [conn.url for conn in found]
        if len(set(owners)) >= brokers or loop.time() > give_up:
            return owners
        await asyncio.sleep(0.5)


def _txnbuf(*args: str) -> str:
    """Run the ``txnbuf`` command line; its output (SystemExit if it fails)."""
    result = subprocess.run(
        [sys.executable, "-m", "broker", *args], capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise SystemExit(f"txnbuf {args[0]} {args[1]} failed: {result.stderr.strip()}")
    return result.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class BrokerUnderTest:
    """`txnbuf serve` as a subprocess that the nemesis kills and pauses.
    ``auth``: it authenticates; ``token`` is the workers' (role
    ``workload``), ``admin_token`` a superuser's."""

    def __init__(
        self,
        data_dir: Path,
        log_path: Path,
        auth: bool = False,
        store: str = "",
        lease_ttl: float = 2.0,
    ) -> None:
        """``store``: a PostgreSQL URL, served with ``--cluster`` (``data_dir``
        unused)."""
        self.data_dir = data_dir
        self.log_path = log_path
        self.store = store
        self.lease_ttl = lease_ttl
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.key_file: Path | None = None
        self.token = ""
        self.admin_token = ""
        if auth:
            self.key_file = data_dir.parent / "secret.key"
            _txnbuf("token", "create-secret-key", "--output", str(self.key_file))
            self.token = self._token("workload")
            self.admin_token = self._token("admin")

    def _token(self, role: str) -> str:
        return _txnbuf(
            "token", "create", "--subject", role, "--secret-key-file", str(self.key_file)
        ).strip()

    def admin(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        """An admin API request (POST with ``body``), with the superuser's token."""
        headers = {"Authorization": f"Bearer {self.admin_token}"} if self.admin_token else {}
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, headers=headers)
        with urllib.request.urlopen(req, timeout=10) as r:
            answer: bytes = r.read()
            return answer

    def grant_workload(self, topics: list[str]) -> None:
        """The workers' role may produce and consume on ``topics``, nothing else."""
        for topic in topics:
            for permission in ("produce", "consume"):
                self.admin(
                    "/admin/v1/acl/grant",
                    {"role": "workload", "permission": permission, "resource": f"topic:{topic}"},
                )

    def start(self, timeout: float = 30.0) -> None:
        with open(self.log_path, "ab") as log:
            # (INFO: slot moves, refused transactional sends and acks, store
            # failures: what tracing an anomaly needs, at a few lines a fault)
            cmd = [sys.executable, "-m", "broker", "serve", "--port", str(self.port),
                   "--log-level", "INFO"]  # fmt: skip
            if self.store:
                cmd += ["--store", self.store, "--cluster", "--lease-ttl", str(self.lease_ttl)]
            else:
                cmd += ["--data-dir", str(self.data_dir)]
            if self.key_file is not None:
                cmd += ["--auth-secret-key-file", str(self.key_file)]
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"broker exited with {self.proc.returncode}; see {self.log_path}"
                )
            try:
                with urllib.request.urlopen(self.url + "/admin/v1/health", timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"broker did not answer within {timeout}s; see {self.log_path}")

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


class Nemesis:
    """Injects the configured faults at seeded random times, in a cluster at
    brokers chosen by role (see the module docstring)."""

    def __init__(
        self,
        brokers: list[BrokerUnderTest],
        rec: Recorder,
        cfg: WorkloadConfig,
        control: Client | None = None,
        topics: Sequence[str] = (),
        near: str | None = None,
    ) -> None:
        """``control``: a client of the cluster, for lookups of who owns
        what (None: one broker); ``topics`` and ``near``: the workload's
        (`transaction_layout`)."""
        self.brokers = brokers
        self.broker = brokers[0]
        self.rec = rec
        self.cfg = cfg
        self.control = control
        self.topics = list(topics)
        self.near = near
        self.rng = random.Random(cfg.seed * 7919 + 1)
        self.aim = random.Random(cfg.seed * 7919 + 2)  # (which topic, which broker)
        self.kills = 0
        self.pauses = 0
        self.epoch = 0  # bumped after every kill (cluster: every fault): clients start over
        # (seconds from the start of the workload, fault, role, brokers hit): the
        # same seed gives the same faults and roles at about the same times.
        self.schedule: list[tuple[float, str, str, list[str]]] = []
        self.started = time.monotonic()

    async def run(self, until: float) -> None:
        self.started = time.monotonic()
        if not self.cfg.faults:
            return
        while True:
            wait = self.rng.uniform(*self.cfg.fault_interval)
            if time.monotonic() + wait >= until:
                return
            await asyncio.sleep(wait)
            fault = self.rng.choice(self.cfg.faults)
            role = self.rng.choice(ROLES) if self.control is not None else "the broker"
            at = round(time.monotonic() - self.started, 1)
            targets = await self._targets(role)
            urls = [b.url for b in targets]
            self.schedule.append((at, fault, role, urls))
            extra = {"role": role, "brokers": urls} if self.control is not None else {}
            op = self.rec.invoke("nemesis", fault, **extra)
            if fault == "kill":
                await asyncio.gather(*(asyncio.to_thread(b.kill) for b in targets))
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))
                await asyncio.gather(*(asyncio.to_thread(b.start) for b in targets))
                self.kills += 1
                self.epoch += 1
            elif fault == "pause":
                for b in targets:
                    b.signal(signal.SIGSTOP)
                # (In a cluster, up to twice the lease: the slots may move.)
                longest = 2.0 if self.control is None else 2 * self.cfg.lease_ttl
                await asyncio.sleep(self.rng.uniform(*(self.cfg.pause or (0.5, longest))))
                for b in targets:
                    b.signal(signal.SIGCONT)
                self.pauses += 1
                if self.control is not None:
                    self.epoch += 1  # (consumers may have moved: start over)
            self.rec.complete(op, "ok", **extra)
            await asyncio.sleep(self.cfg.quiet)

    async def _targets(self, role: str) -> list[BrokerUnderTest]:
        """The brokers that play ``role`` now (`ROLES`): asked by lookups; a
        random one if the owner cannot be found in time (being taken over)."""
        if self.control is None:
            return [self.broker]
        found: list[BrokerUnderTest] = []
        if role in ("coordinator", "both"):
            found.append(await self._owner(self.near, coordinator=True))
        if role in ("partitions", "both"):
            found.append(await self._owner(self.aim.choice(self.topics)))
        if role == "random":
            found.append(self.aim.choice(self.brokers))
        return list(dict.fromkeys(found))  # (both: one broker if they share it)

    async def _owner(self, topic: str | None, coordinator: bool = False) -> BrokerUnderTest:
        assert self.control is not None
        brokers = self.control._brokers
        deadline = asyncio.get_running_loop().time() + 5.0
        try:
            if topic is None:  # (the clients' coordinators: their first broker's)
                url = brokers.home.url
            elif coordinator:
                conn = await brokers.lookup(tc_id=slot_of(topic, brokers.slots), deadline=deadline)
                url = conn.url
            else:
                url = (await brokers.lookup(topic=topic, deadline=deadline)).url
        except errors.TxnbufError:
            return self.aim.choice(self.brokers)
        return next((b for b in self.brokers if b.url == url), self.aim.choice(self.brokers))


def _retrieve(future: asyncio.Future[Any]) -> None:
    """Mark a queued send's error as seen (the commit reports it)."""
    if not future.cancelled():
        future.exception()


def _outcome_of(exc: BaseException) -> str:
    """``fail`` if the transaction certainly did not commit, else ``info``."""
    if isinstance(
        exc,
        (
            errors.TransactionConflictError,
            errors.TransactionTimeoutError,
            errors.InvalidTxnStatusError,
            errors.TransactionNotFoundError,
        ),
    ):
        return "fail"
    return "info"


@dataclass
class _Stats:
    ops: int = 0
    ok: int = 0
    fail: int = 0
    info: int = 0
    client_crashes: int = 0
    acked_sends: dict[str, set[int]] = field(default_factory=dict)
    # transactions ended, by path ("local", "full") and outcome
    paths: dict[str, int] = field(default_factory=dict)
    # key -> acknowledged values the final reads had not read by their deadline
    unread: dict[str, list[int]] = field(default_factory=dict)


class _Worker:
    def __init__(self, n: int, shared: _Shared, rng: random.Random) -> None:
        self.n = n
        self.shared = shared
        self.rng = rng
        self.process = n
        self.client: Client | None = None
        self.producers: dict[str, Producer] = {}
        self.consumers: dict[str, Consumer] = {}
        self.epoch = -1
        self.connections = 0
        # A transaction whose outcome this worker does not know, and whether
        # it was left open on purpose (a client crash: the timeout ends it).
        self.doubtful: tuple[str, bool] | None = None
        self._txnid: str | None = None
        self._path = "local"  # the path of the transaction under way
        # Per micro-op of the transaction under way done so far: whether its
        # answer was awaited before the commit (the history's "awaited").
        self._awaited: list[bool | None] = []

    async def connect(self) -> None:
        shared = self.shared
        if self.doubtful is not None:
            # Like a restarted Kafka producer fencing its predecessor: end the
            # previous instance's transaction before reading again, so that
            # its PENDING_ACK messages are not skipped over and redelivered
            # out of order. A deliberately dropped one is left to its timeout.
            # (Recorded, as process end-N: when and how it was found ended.)
            txnid, dropped = self.doubtful
            op = shared.rec.invoke(f"end-{self.n}", "end-doubtful", {"txn": txnid})
            how = await shared.end_transaction(txnid, not dropped)
            outcome = "info" if how == "gave up" else "ok"
            shared.rec.complete(op, outcome, {"txn": txnid, "abort": not dropped, "how": how})
            self.doubtful = None
        self.client = Client(shared.url, operation_timeout=8.0, token=shared.token)
        await self.client.connect()
        for topic in shared.topics:
            self.consumers[topic] = await self.client.subscribe(
                topic, f"w{self.n}", initial_position="earliest", receiver_queue_size=50
            )
        self.producers = {}
        producer = await self.client.create_producer(shared.topics[0])
        self.producers[shared.topics[0]] = producer
        for topic in shared.topics[1:]:
            self.producers[topic] = await self.client.create_producer(topic)
        self.epoch = shared.nemesis.epoch
        self.connections = self.client.connections

    async def drop(self) -> None:
        """Forget this client (a crash, or a fault that broke its session)."""
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 5)
        self.process = self.shared.new_process()

    async def run(self, until: float) -> None:
        shared = self.shared
        while time.monotonic() < until:
            if self.client is not None and self.epoch != shared.nemesis.epoch:
                await self.drop()  # the broker restarted: start over as a new process
            if self.client is None:
                try:
                    await self.connect()
                except errors.TxnbufError:
                    await self.drop()
                    await asyncio.sleep(0.5)
                    continue
            try:
                if self.rng.random() < OUTSIDE_TXN_P:
                    await self.plain_op()
                else:
                    await self.txn_op()
            except _Crash:
                await self.drop()

    def _plan(self) -> list[list[Any]]:
        mops: list[list[Any]] = []
        for _ in range(self.rng.randint(1, 4)):
            topic = self.rng.choice(self.shared.topics)
            if self.rng.random() < 0.5:
                mops.append(["send", f"{topic}/0", self.shared.next_value(topic)])
            else:
                mops.append(["poll"])
        return mops

    async def _poll(self, txn: Any) -> dict[str, list[list[Any]]]:
        topic = self.rng.choice(self.shared.topics)
        consumer = self.consumers[topic]
        got = []
        for _ in range(self.rng.randint(1, 5)):
            try:
                got.append(await consumer.receive(timeout=0.05))
            except errors.OperationTimeoutError:
                break
        if self.client is not None and self.client.connections != self.connections:
            raise _Reconnected  # some of these may be redeliveries: not a clean read
        if got:
            await consumer.acknowledge(got, txn=txn)
        return {
            f"{topic}/0": [
                [[m.message_id.entry_id, m.message_id.batch_index], int(m.value)] for m in got
            ]
        }

    async def txn_op(self) -> None:
        assert self.client is not None
        shared = self.shared
        mops = self._plan()
        op = shared.rec.invoke(self.process, "txn", mops, worker=self.n)
        done: list[list[Any]] = []
        awaited: list[bool | None] = []
        self._awaited = awaited
        self._txnid = None  # (until the transaction is opened)
        crash_now = shared.take_crash()
        txn = None
        try:
            txn = await self.client.new_transaction(timeout=TXN_TIMEOUT, near=shared.near)
            self.doubtful = (str(txn.id), False)
            self._txnid = str(txn.id)
            self._path = "full" if self.rng.random() < FULL_PATH_P else "local"
            if self._path == "full":
                txn.flush()
            nowait = self.rng.random() < NOWAIT_P
            for mop in mops:
                if mop[0] == "send" and nowait:
                    # (a transactional send's id has no offset: entry -1)
                    topic = mop[1].split("/")[0]
                    queued = self.producers[topic].send_nowait(b"%d" % mop[2], txn=txn)
                    queued.add_done_callback(_retrieve)  # (commit reports its error)
                    done.append(["send", mop[1], [None, mop[2]]])
                    awaited.append(False)
                elif mop[0] == "send":
                    topic = mop[1].split("/")[0]
                    mid = await self.producers[topic].send(b"%d" % mop[2], txn=txn)
                    offset = None if mid.entry_id < 0 else [mid.entry_id, mid.batch_index]
                    done.append(["send", mop[1], [offset, mop[2]]])
                    awaited.append(True)
                else:
                    polled = await self._poll(txn)
                    done.append(["poll", polled])
                    # (a transactional ack returns once queued: never awaited)
                    awaited.append(False if any(polled.values()) else None)
                if self.rng.random() < DELAY_P:
                    await asyncio.sleep(self.rng.uniform(0.01, 0.2))
            if crash_now:
                shared.rec.complete(
                    op,
                    "info",
                    done + mops[len(done) :],
                    crash=True,
                    txn=str(txn.id),
                    path=self._path,
                    awaited=awaited + [None] * (len(mops) - len(awaited)),
                )
                shared.stats.client_crashes += 1
                self.doubtful = (str(txn.id), True)
                raise _Crash
            if self.rng.random() < ABORT_P:
                await txn.abort()
                self._finish(op, "fail", done, mops)
                self._after_failure(mops)
                return
            await txn.commit()
            if self.client.connections != self.connections:
                # It committed, but its polls may have straddled a reconnect
                # (redelivered messages): record what happened, then start over.
                self._finish(op, "ok", done, mops)
                raise _Crash
        except _Crash:
            raise
        except _Reconnected:
            assert txn is not None
            try:
                await txn.abort()
            except errors.TxnbufError:
                self._finish(op, "info", done, mops, error="reconnected mid-transaction")
                raise _Crash from None
            self._finish(op, "fail", done, mops, error="reconnected mid-transaction; aborted")
            raise _Crash from None  # (doubtful stays set: connect() makes sure it ended)
        except errors.TxnbufError as exc:
            outcome = _outcome_of(exc)
            self._finish(op, outcome, done, mops, error=f"{type(exc).__name__}: {exc}")
            if outcome == "info":
                raise _Crash from exc
            self._after_failure(mops)
            return
        self._finish(op, "ok", done, mops)

    def _after_failure(self, mops: list[list[Any]]) -> None:
        """A transaction that polled (or tried to: an ack may be stored though
        its answer was an error) did not commit: its acks are undone, so those
        messages come again, after ones already prefetched. Resume from the
        last committed position with a fresh consumer (Jepsen: a new process),
        once the abort is applied everywhere (`connect`)."""
        if any(m[0] == "poll" for m in mops):
            raise _Crash
        self.doubtful = None

    def _finish(
        self, op: Any, outcome: str, done: list[list[Any]], mops: list[list[Any]], **extra: Any
    ) -> None:
        shared = self.shared
        if outcome == "ok" and op.f == "txn":
            self.doubtful = None
        value = done + mops[len(done) :]
        if op.f == "txn" and self._txnid is not None:
            extra["txn"] = self._txnid
            extra["path"] = self._path
            key = f"{self._path} {outcome}"
            shared.stats.paths[key] = shared.stats.paths.get(key, 0) + 1
        if op.f == "txn":
            extra["awaited"] = self._awaited + [None] * (len(mops) - len(self._awaited))
        shared.rec.complete(op, outcome, value, **extra)
        shared.stats.ops += 1
        setattr(shared.stats, outcome, getattr(shared.stats, outcome) + 1)
        if outcome == "ok":
            for mop in done:
                if mop[0] == "send":
                    shared.stats.acked_sends.setdefault(mop[1], set()).add(mop[2][1])

    async def plain_op(self) -> None:
        assert self.client is not None
        shared = self.shared
        topic = self.rng.choice(shared.topics)
        key = f"{topic}/0"
        if self.rng.random() < 0.5:
            value = shared.next_value(topic)
            op = shared.rec.invoke(self.process, "send", [["send", key, value]], worker=self.n)
            try:
                mid = await self.producers[topic].send(b"%d" % value)
            except errors.TxnbufError as exc:
                self._finish(op, "info", [], [["send", key, value]], error=str(exc))
                raise _Crash from exc
            self._finish(op, "ok", [["send", key, [[mid.entry_id, mid.batch_index], value]]], [])
        else:
            op = shared.rec.invoke(self.process, "poll", [["poll"]], worker=self.n)
            consumer = self.consumers[topic]
            got = []
            try:
                for _ in range(self.rng.randint(1, 5)):
                    try:
                        got.append(await consumer.receive(timeout=0.05))
                    except errors.OperationTimeoutError:
                        break
                if self.client.connections != self.connections:
                    self._finish(op, "info", [], [["poll"]], error="reconnected mid-poll")
                    raise _Crash
                if got:
                    await consumer.acknowledge(got)
            except errors.TxnbufError as exc:
                self._finish(op, "info", [], [["poll"]], error=str(exc))
                raise _Crash from exc
            read = [[[m.message_id.entry_id, m.message_id.batch_index], int(m.value)] for m in got]
            self._finish(op, "ok", [["poll", {key: read}]], [])
        if self.client.connections != self.connections:
            raise _Crash  # redelivery may follow a reconnect: go on as a new process


class _Crash(Exception):
    """This worker's client is gone (or its outcome unknown): start over."""


class _Reconnected(Exception):
    """The client reconnected during a poll: messages may come again."""


class _Shared:
    def __init__(
        self,
        brokers: list[BrokerUnderTest],
        rec: Recorder,
        nemesis: Nemesis,
        cfg: WorkloadConfig,
        topics: list[str],
        near: str | None = None,
    ) -> None:
        broker = brokers[0]
        self.url = ",".join(b.url for b in brokers)  # (the clients': every broker)
        self.near = near  # (`transaction_layout`)
        self.control = nemesis.control
        self.token = broker.token  # the workers' ("" without authentication)
        self._admin_headers = (
            {"Authorization": f"Bearer {broker.admin_token}"} if broker.admin_token else {}
        )
        self.rec = rec
        self.nemesis = nemesis
        self.cfg = cfg
        self.topics = topics
        self.stats = _Stats()
        self._values: dict[str, int] = {}
        self._next_process = cfg.clients
        self._crash_due = time.monotonic() + CLIENT_CRASH_EVERY

    async def end_transaction(self, txnid: str, abort: bool) -> str:
        """Make sure ``txnid`` has ended: abort it (admin API), or wait for its
        timeout. In a cluster, at its coordinator's owner (looked up), and
        "unknown" only counts once a lookup after it names the same owner
        (a broker whose coordinator is not loaded answers 503, not 404).
        Returns how it was found, for the history: ``"done at URL"``,
        ``"unknown at URL"`` or ``"gave up"``."""
        deadline = time.monotonic() + TXN_TIMEOUT + 20
        while time.monotonic() < deadline:
            url = await self._coordinator_url(txnid)
            if url is not None:
                found = await asyncio.to_thread(self._end_at, url, txnid, abort)
                if found == "done":
                    return f"done at {url}"
                if found == "unknown" and url == await self._coordinator_url(txnid):
                    return f"unknown at {url}"
            await asyncio.sleep(0.2)
        return "gave up"

    async def _coordinator_url(self, txnid: str) -> str | None:
        """The URL of the broker serving ``txnid``'s coordinator (None: not
        found now)."""
        if self.control is None:
            return self.url
        brokers = self.control._brokers
        deadline = asyncio.get_running_loop().time() + 5.0
        try:
            return (await brokers.lookup(tc_id=TxnID.parse(txnid).tcid, deadline=deadline)).url
        except errors.TxnbufError:
            return None

    def _end_at(self, base: str, txnid: str, abort: bool) -> str:
        """One try at ``base``: "done" (ended, and applied by every
        participant: COMMITTED or ABORTED), "unknown" (no such transaction
        there) or "again" (not yet, or the broker is restarting). Blocking:
        run it in a thread.

        Ended means its status is COMMITTED or ABORTED, whoever ended it:
        the answer to an abort (or to the client's END) may come while a
        participant on another broker has not applied it yet (the
        coordinator answers END at most `tc._participants.END_WAIT` after
        the decision is durable), and a subscription that has not applied
        an abort still holds its acknowledged messages, which a new process
        would then get after later ones (a poll going back)."""
        url = f"{base}/admin/v1/transactions/{txnid}"
        try:
            if abort:
                req = urllib.request.Request(
                    url + "/abort", method="POST", headers=self._admin_headers
                )
                try:
                    with urllib.request.urlopen(req, timeout=10) as r:
                        body = json.loads(r.read())
                    if body.get("status") in ("COMMITTED", "ABORTED"):
                        return "done"
                except urllib.error.HTTPError as exc:
                    if exc.code != 409:  # (409: ended, or ending, already)
                        raise
            req = urllib.request.Request(url, headers=self._admin_headers)
            with urllib.request.urlopen(req, timeout=10) as r:
                if json.loads(r.read())["status"] in ("COMMITTED", "ABORTED"):
                    return "done"
        except urllib.error.HTTPError as exc:
            if exc.code == 404:  # unknown (never opened, or forgotten)
                return "unknown"
        except OSError:
            pass  # the broker is restarting
        return "again"

    def next_value(self, topic: str) -> int:
        value = self._values.get(topic, 0)
        self._values[topic] = value + 1
        return value

    def new_process(self) -> int:
        self._next_process += 1
        return self._next_process

    def take_crash(self) -> bool:
        if time.monotonic() >= self._crash_due:
            self._crash_due = time.monotonic() + CLIENT_CRASH_EVERY
            return True
        return False


def _report_reads(shared: _Shared, wanted: dict[str, set[int]], seen: dict[str, set[int]]) -> None:
    report = shared.cfg.progress
    if report is None:
        return
    total = sum(len(values) for values in wanted.values())
    read = sum(len(values & seen.get(key, set())) for key, values in wanted.items())
    report("final reads", read / total if total else 1.0, {"read": read, "acknowledged": total})


async def _final_reads(shared: _Shared, deadline: float) -> dict[str, bool]:
    """Fresh subscriptions read every topic from the start, every key at
    once (one reader each, all with the same ``deadline``), each until it
    has seen every acknowledged send of its key; per key, whether it did.
    A value that never shows stops only its own key's reads: the others
    are read to their end, so the checker counts their unseen values."""
    wanted = {key: set(values) for key, values in shared.stats.acked_sends.items()}
    seen: dict[str, set[int]] = {}
    async with Client(shared.url, operation_timeout=30.0, token=shared.token) as client:
        done = await asyncio.gather(
            *(
                _read_key(shared, client, i, topic, wanted, seen, deadline)
                for i, topic in enumerate(shared.topics)
            )
        )
    return dict(zip((f"{t}/0" for t in shared.topics), done, strict=True))


async def _read_key(
    shared: _Shared,
    client: Client,
    i: int,
    topic: str,
    wanted: dict[str, set[int]],
    seen: dict[str, set[int]],
    deadline: float,
) -> bool:
    """The final reads of one key (`_final_reads`), as process ``final-i``;
    True once every acknowledged send of it is read, False at ``deadline``
    (its values not read are then named in the stats and the summary)."""
    rec = shared.rec
    key = f"{topic}/0"
    process = f"final-{i}"
    read_here = seen.setdefault(key, set())
    consumer = await client.subscribe(topic, f"final-{i}", initial_position="earliest")
    while not wanted.get(key, set()) <= read_here:
        if time.monotonic() > deadline:
            shared.stats.unread[key] = sorted(wanted.get(key, set()) - read_here)
            return False
        op = rec.invoke(process, "poll", [["poll"]])
        got = []
        try:
            got.append(await consumer.receive(timeout=2.0))
            while len(got) < 500:
                got.append(await consumer.receive(timeout=0.05))
        except errors.OperationTimeoutError:
            pass
        values = [int(m.value) for m in got]
        read = [
            [[m.message_id.entry_id, m.message_id.batch_index], v]
            for m, v in zip(got, values, strict=True)
        ]
        rec.complete(op, "ok", [["poll", {key: read}]])
        read_here.update(values)
        _report_reads(shared, wanted, seen)
        if got:
            await consumer.acknowledge(got)
    return True


async def _start_brokers(cfg: WorkloadConfig, workdir: Path) -> list[BrokerUnderTest]:
    """The brokers under test, started: one on SQLite, or ``cfg.brokers``
    with ``--cluster`` over the store."""
    if not cfg.cluster:
        broker = await asyncio.to_thread(
            BrokerUnderTest, workdir / "data", workdir / "broker.log", cfg.auth
        )
        await asyncio.to_thread(broker.start)
        return [broker]
    brokers = [
        BrokerUnderTest(
            workdir / f"b{i}",
            workdir / f"broker{i}.log",
            store=cfg.store,
            lease_ttl=cfg.lease_ttl,
        )
        for i in range(cfg.brokers)
    ]
    await asyncio.gather(*(asyncio.to_thread(b.start, 60.0) for b in brokers))
    return brokers


async def run_workload(cfg: WorkloadConfig, workdir: Path, rec: Recorder) -> dict[str, Any]:
    """Run the workload against fresh brokers in ``workdir``; returns stats."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    if cfg.brokers > 1 and not cfg.store:
        raise SystemExit("txnbuf check: --brokers above 1 needs --store postgresql (or a URL)")
    if cfg.cluster and cfg.auth:
        raise SystemExit("txnbuf check: --auth is for one broker without --store (for now)")
    postgres: LocalPostgres | None = None
    if cfg.store == "postgresql":
        postgres = await asyncio.to_thread(LocalPostgres, workdir / "postgres")
        cfg = dataclasses.replace(cfg, store=postgres.url)
    brokers: list[BrokerUnderTest] = []
    control: Client | None = None
    try:
        brokers = await _start_brokers(cfg, workdir)
        if cfg.cluster:
            control = Client([b.url for b in brokers], operation_timeout=10.0)
            await control.connect()
        return await _run(cfg, brokers, control, rec)
    finally:
        if control is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(control.close(), 5)
        await asyncio.gather(*(asyncio.to_thread(b.stop) for b in brokers))
        if postgres is not None:
            await asyncio.to_thread(postgres.stop)


async def _run(
    cfg: WorkloadConfig, brokers: list[BrokerUnderTest], control: Client | None, rec: Recorder
) -> dict[str, Any]:
    broker = brokers[0]
    slots = control._brokers.slots if control is not None else 0
    owners = await _slot_owners(control, len(brokers)) if control is not None else []
    topics, near = transaction_layout(cfg.topics, slots, os.urandom(3).hex(), owners)
    placement: dict[str, list[Any]] = {}
    if control is not None and near is not None:
        # Where the transactions' coordinator and each key start (slot, owner).
        home = slot_of(near, slots)
        placement["coordinator"] = [home, owners[home]]
        for topic in topics:
            placement[f"{topic}/0"] = [slot_of(topic, slots), owners[slot_of(topic, slots)]]
        op = rec.invoke("layout", "placement")
        rec.complete(op, "ok", placement)
    if cfg.auth:
        await asyncio.to_thread(broker.grant_workload, topics)
    urls = ",".join(b.url for b in brokers)
    # The final readers' subscriptions exist from the start: they hold back
    # retention, so the final phase can read every message ever committed.
    async with Client(urls, token=broker.token) as client:
        for i, topic in enumerate(topics):
            consumer = await client.subscribe(topic, f"final-{i}", initial_position="earliest")
            await consumer.close()
    nemesis = Nemesis(brokers, rec, cfg, control, topics, near)
    shared = _Shared(brokers, rec, nemesis, cfg, topics, near)
    rng = random.Random(cfg.seed)
    start = time.monotonic()
    until = start + cfg.duration
    try:
        workers = [_Worker(n, shared, random.Random(rng.random())) for n in range(cfg.clients)]
        tasks = [asyncio.create_task(w.run(until)) for w in workers]
        faults = asyncio.create_task(nemesis.run(until - 3.0))
        progress = asyncio.create_task(_progress(shared, start, until))
        await asyncio.gather(*tasks, faults)
        progress.cancel()
        for w in workers:
            if w.client is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(w.client.close(), 5)
        for b in brokers:
            b.signal(signal.SIGCONT)
        by_key = await _final_reads(shared, time.monotonic() + cfg.final_read_timeout)
        rec.final_reads(by_key)
        complete = all(by_key.values())
    finally:
        for b in brokers:
            b.signal(signal.SIGCONT)
    s = shared.stats
    return {
        "ops": s.ops,
        "ok": s.ok,
        "fail": s.fail,
        "info": s.info,
        "client_crashes": s.client_crashes,
        "paths": dict(sorted(s.paths.items())),
        "kills": nemesis.kills,
        "pauses": nemesis.pauses,
        "final_reads_complete": complete,
        "unread": s.unread,
        "fault_schedule": nemesis.schedule,
        "seed": cfg.seed,
        "brokers": [b.url for b in brokers],
        "topics": topics,
        "placement": placement,
    }


async def _progress(shared: _Shared, start: float, until: float) -> None:
    report = shared.cfg.progress
    if report is None:
        return
    total = until - start
    while True:
        done = min(1.0, (time.monotonic() - start) / total)
        s = shared.stats
        nemesis = shared.nemesis
        counts = {"ops": s.ops, "ok": s.ok, "fail": s.fail, "info": s.info}
        report("workload", done, {**counts, "kills": nemesis.kills, "pauses": nemesis.pauses})
        await asyncio.sleep(1.0)
