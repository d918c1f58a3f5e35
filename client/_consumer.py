"""The consumer: receive queue, flow control, acknowledgements.

Decisions written down here:

* Flow control: after subscribing the consumer grants ``receiver_queue_size``
  permits (FLOW); each delivered message uses one. When the application has
  taken half the queue size through ``receive`` or ``batch_receive`` (or
  the dead letter policy took them), those permits are granted again in one
  FLOW.
* ``batch_receive(max_messages, timeout)`` (Pulsar's ``batchReceive``):
  returns once ``max_messages`` are queued (at most ``receiver_queue_size``
  are waited for) or ``timeout`` seconds after the call with what is
  queued, possibly nothing; ``timeout=None`` waits for a first message.
  Plain ``receive`` calls waiting are served first. ``async for`` receives
  until ``close()``.
* ``seek`` and ``unsubscribe`` (SEEK and UNSUBSCRIBE, `broker._seek`) act on
  the whole subscription, reusing the admin API's reset and deletion; after
  a seek the consumer drops its queue and asks for what the broker still
  counts as its own again, so nothing pushed around the reset is lost.
* Acks: concurrent ``acknowledge`` calls share one ACK frame, framed at the
  next event-loop turn (at most 10,000 ids a frame); each plain call
  returns when the broker has answered (the ack is durable; for
  transactional ones see below). A call has one future,
  shared by its ids (one per id would cost a callback per id). If the broker
  refuses a frame of several ids with a non-retriable error, each id is
  re-sent alone so only the guilty call fails (a call of several ids fails
  if one of them does). ``acknowledge_cumulative`` sends its own
  frame. Acks unanswered after ``operation_timeout`` fail with
  ``OperationTimeoutError``.
* ``negative_acknowledge`` sends REDELIVER_UNACKNOWLEDGED
  ``negative_ack_redelivery_delay`` seconds later (default 1 s; 0: at once;
  Pulsar's default is 60 s), those due together in one request, and does
  not wait (the broker does not answer). A disconnect drops the negative
  acks not sent yet: the broker redelivers every unacked message after a
  reconnect anyway.
* A redelivery limit (``dead_letter_policy``, see ``client._deadletter``):
  a message delivered more often than it allows is moved to the dead
  letter topic instead of being handed out.
* Reconnect: as soon as the socket drops, messages queued but not yet
  taken by ``receive`` are dropped (the broker redelivers everything
  unacked) and a failover consumer counts as inactive. On the new socket
  the consumer is re-subscribed with the same id, subscription and type,
  acks awaiting an answer are re-sent, then ``receiver_queue_size`` permits
  are granted again. Messages the application took but did not ack yet
  will come again (at-least-once).
* ``redeliver_unacknowledged`` also drops the local queue, like Pulsar, and
  grants back the permits those messages used.
* Acks go as ranges: (partition, entry, first index, last index), a run of
  messages of one entry acknowledged in order making one range.
* Transactional acks (``acknowledge(..., txn=txn)``): held by the
  transaction until it commits (``client._txn``'s local path). On the full
  path, acks of one
  transaction queued in one turn of the loop share a frame (Pulsar's ack
  grouping), never with plain acks or another transaction's; the ACK
  carries the TxnID and ``transactional=true``, and the broker adds the
  subscription to the transaction itself (see ``client._txn``). The call
  returns once the ack is queued: the broker's answer is the transaction's,
  so a refusal (e.g. TRANSACTION_CONFLICT: another transaction holds the
  message) makes ``commit()`` abort the transaction and raise it
  (``TransactionConflictError``). Transactional acks are re-sent after a
  reconnect like the others (the broker treats a repeated one as done).
* A transactional ack the broker refused (e.g. SERVICE_NOT_READY while its
  coordinator moves, INVALID_TXN_STATUS once the coordinator aborted the
  transaction) changed nothing there: its messages are still delivered to
  this consumer and unacknowledged, not PENDING_ACK, so the end of the
  transaction (an ``abort()`` or the abort of a failed ``commit()``) does
  not redeliver them. The consumer asks for those ids again
  (REDELIVER_UNACKNOWLEDGED) as soon as the refusal comes, so they are
  delivered again without the application's ``redeliver_unacknowledged``
  (a message the broker still counts as delivered would otherwise come
  only after a reconnect). A refused cumulative ack asks for nothing (its
  one id stands for a run); an ack that timed out asks for nothing (the
  broker may still take it).
* ``read_uncommitted=True`` (fixed at subscribe) asks the broker to deliver
  messages of open transactions too (PIP-31 §Isolation Levels).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import partial

from proto import TxnID
from proto import txnbuf_pb2 as pb

from ._connection import BusyClock, Command, Connection, Link, Type, command, fail_all
from ._deadletter import DeadLetters
from ._message import Message, MessageId, decode_entry, new_message_id
from ._txn import _OPEN, Transaction, check_txn
from .errors import (
    ConnectionLostError,
    ConsumerBusyError,
    ConsumerClosedError,
    ConsumerNotFoundError,
    InvalidInputError,
    OperationTimeoutError,
    TxnbufError,
    from_wire,
)

SubType = pb.CommandSubscribe.SubType
InitialPosition = pb.CommandSubscribe.InitialPosition
AckType = pb.CommandAck.AckType
INDIVIDUAL = AckType.INDIVIDUAL  # (a protobuf enum's attributes are slow to look up)

SUBSCRIPTION_TYPES = {
    "exclusive": SubType.EXCLUSIVE,
    "shared": SubType.SHARED,
    "failover": SubType.FAILOVER,
}
INITIAL_POSITIONS = {
    "latest": InitialPosition.LATEST,
    "earliest": InitialPosition.EARLIEST,
}
MAX_ACKS_PER_FRAME = 10_000


@dataclass(slots=True)
class _AckFrame:
    """An ACK frame awaiting its response."""

    ack_type: AckType
    ids: list[MessageId]
    futures: list[asyncio.Future[None]]  # one per id: its call's (the ids of a call share it)
    data: bytes
    deadline: float
    txn: Transaction | None = None
    # transactional: the transaction's view of the frame (``futures`` is empty)
    tracker: asyncio.Future[None] | None = None


def message_id_of(message: Message | MessageId) -> MessageId:
    """The id of a Message, or the MessageId itself."""
    if type(message) is Message:
        # First: an ack passes here once per id, and a failing isinstance
        # costs more than the rest.
        return message.message_id
    if isinstance(message, MessageId):
        return message
    if isinstance(message, Message):
        return message.message_id
    raise InvalidInputError(f"expected a Message or a MessageId, not {type(message).__name__}")


def ack_ranges(ids: Iterable[MessageId]) -> list[int]:
    """``ids`` as flat (partition, entry_id, first_index, last_index)
    ranges: each run of consecutive indexes of one entry, in the order
    given, is one range."""
    flat: list[int] = []
    partition = entry_id = last = -2
    for p, e, i in ids:
        if i == last + 1 and e == entry_id and p == partition:
            last = flat[-1] = i
            continue
        flat += (p, e, i, i)
        partition, entry_id, last = p, e, i
    return flat


def build_ack(
    consumer_id: int,
    request_id: int,
    ack_type: AckType,
    ids: Iterable[MessageId],
    txn_id: TxnID | None = None,
    ranges: list[int] | None = None,
) -> Command:
    """The ACK frame, naming the messages as flat (partition, entry_id,
    first_index, last_index) ranges (``ranges`` if given, else made of
    ``ids``), in transaction ``txn_id`` if given."""
    cmd = command(
        Command.ACK, "ack", consumer_id=consumer_id, request_id=request_id, ack_type=ack_type
    )
    if txn_id is not None:
        cmd.ack.txnid_most_bits, cmd.ack.txnid_least_bits = txn_id
        cmd.ack.transactional = True
    cmd.ack.ranges.extend(ack_ranges(ids) if ranges is None else ranges)
    return cmd


class Consumer:
    """Receives the messages of one subscription of one topic.

    Made by ``Client.subscribe``. ``receive()`` returns the next ``Message``;
    ``acknowledge`` / ``acknowledge_cumulative`` / ``negative_acknowledge``
    settle it. ``is_active`` tells a failover consumer whether the broker made
    it the active one. See the module docstring of ``client._consumer``.
    """

    def __init__(
        self,
        conn: Connection,
        topic: str,
        subscription: str,
        *,
        subscription_type: str = "exclusive",
        initial_position: str = "latest",
        consumer_name: str | None = None,
        receiver_queue_size: int = 1000,
        read_uncommitted: bool = False,
        negative_ack_redelivery_delay: float = 1.0,
    ) -> None:
        sub_type = SUBSCRIPTION_TYPES.get(subscription_type)
        if sub_type is None:
            raise InvalidInputError(
                f"subscription_type must be one of {sorted(SUBSCRIPTION_TYPES)}, "
                f"not {subscription_type!r}"
            )
        position = INITIAL_POSITIONS.get(initial_position)
        if position is None:
            raise InvalidInputError(
                f"initial_position must be one of {sorted(INITIAL_POSITIONS)}, "
                f"not {initial_position!r}"
            )
        if type(receiver_queue_size) is not int or receiver_queue_size < 1:
            raise InvalidInputError("receiver_queue_size must be an int of at least 1")
        if not isinstance(read_uncommitted, bool):
            raise InvalidInputError("read_uncommitted must be a bool")
        delay = negative_ack_redelivery_delay
        if isinstance(delay, bool) or not isinstance(delay, int | float) or not 0 <= delay < 1e9:
            raise InvalidInputError(
                f"negative_ack_redelivery_delay must be seconds >= 0, not {delay!r}"
            )
        self._conn = conn
        self._loop = asyncio.get_running_loop()
        self.topic = topic
        self.subscription = subscription
        self.subscription_type = subscription_type
        self.consumer_name = consumer_name or ""
        self.consumer_id = conn.next_consumer_id()
        self.receiver_queue_size = receiver_queue_size
        self.read_uncommitted = read_uncommitted
        self.negative_ack_redelivery_delay = float(delay)
        # negative acks waiting for their delay: (when, id), in time order
        self._nacks: deque[tuple[float, MessageId]] = deque()
        self._nack_timer: asyncio.TimerHandle | None = None
        self._dead_letters: DeadLetters | None = None  # set by Client.subscribe
        self.is_active = sub_type != SubType.FAILOVER
        self._sub_type = sub_type
        self._position = position
        self._flow_threshold = max(1, receiver_queue_size // 2)
        self._taken = 0
        self._queue: deque[Message] = deque()
        self._waiters: deque[asyncio.Future[Message]] = deque()
        # batch_receive calls waiting: each wakes once this many are queued
        self._batch_waiters: deque[tuple[asyncio.Future[None], int]] = deque()
        # individual acks waiting to be framed: plain ones with their calls'
        # futures (one per id), and per transaction its ids and its tracker
        self._acks: tuple[list[MessageId], list[asyncio.Future[None]]] | None = None
        self._txn_acks: dict[Transaction, tuple[list[MessageId], asyncio.Future[None]]] = {}
        self._ack_flush_scheduled = False
        self._inflight: dict[int, _AckFrame] = {}
        # The transactions holding acks of this consumer (client._txn's
        # local path): they send them before the consumer closes.
        self._held_in: dict[Transaction, None] = {}
        self._gen = 0
        self._attached = False
        self._closing = False
        self._closed = False
        self._reason: TxnbufError | None = None
        self._busy = BusyClock()

    def __repr__(self) -> str:
        return (
            f"<Consumer topic={self.topic!r} subscription={self.subscription!r} "
            f"id={self.consumer_id}>"
        )

    # --- subscribing ---------------------------------------------------------

    def _subscribe_command(self, request_id: int) -> Command:
        return command(
            Type.SUBSCRIBE,
            "subscribe",
            request_id=request_id,
            consumer_id=self.consumer_id,
            topic=self.topic,
            subscription=self.subscription,
            sub_type=self._sub_type,
            initial_position=self._position,
            consumer_name=self.consumer_name,
            read_uncommitted=self.read_uncommitted,
        )

    def _flow_command(self, permits: int) -> bytes:
        return command(
            Command.FLOW, "flow", consumer_id=self.consumer_id, permits=permits
        ).SerializeToString()

    async def _subscribe(self) -> None:
        """Subscribe (the broker creates the topic, once it has checked the
        request: a refused one creates nothing), grant the first permits."""
        # Registered first: the broker may speak to it (ACTIVE_CONSUMER_CHANGE)
        # before SUCCESS arrives. It is re-created on reconnect only once
        # attached.
        self._conn.consumers[self.consumer_id] = self
        deadline = self._conn.deadline()
        try:
            await self._conn.request(
                self._subscribe_command,
                Type.SUCCESS,
                f"subscribe to {self.topic!r} as {self.subscription!r}",
                deadline,
            )
        except BaseException:
            self._conn.consumers.pop(self.consumer_id, None)
            raise
        self._gen = self._conn.gen
        self._attached = True
        self._conn.write(self._flow_command(self.receiver_queue_size))

    async def reattach(self, link: Link) -> None:
        if not self._attached or self._closed:
            return
        try:
            await self._conn.request_on(
                link,
                self._subscribe_command,
                Type.SUCCESS,
                f"re-subscribe to {self.topic!r} as {self.subscription!r}",
                self._conn.deadline(),
            )
        except ConsumerBusyError as exc:
            # The broker may still hold the consumer of the dead socket.
            if self._busy.still_waiting(self._loop.time(), self._conn.operation_timeout):
                raise
            self._fail(exc)
            return
        except TxnbufError as exc:
            if exc.retriable:
                raise
            self._fail(exc)
            return
        self._busy.reset()
        if self._closed:  # closed while we were re-subscribing
            link.write(self._close_command(self._conn.next_request_id()).SerializeToString())
            return
        self._gen = link.gen
        self._queue.clear()
        self._taken = 0
        for frame in self._inflight.values():  # (in order: acks are idempotent)
            link.write(frame.data)
        link.write(self._flow_command(self.receiver_queue_size))

    # --- receiving -------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> Message:
        """The next message; waits for one (at most ``timeout`` seconds if
        given, then raises ``OperationTimeoutError``)."""
        if self._closing:
            self._raise_closed()
        if self._queue and not self._waiters:
            message = self._queue.popleft()
            self._took_one()
            return message
        waiter: asyncio.Future[Message] = self._loop.create_future()
        self._waiters.append(waiter)
        timer = None
        if timeout is not None:
            timer = self._loop.call_later(timeout, _time_out, waiter, timeout)
        try:
            return await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                # A message was handed over as we were cancelled: keep it.
                self._queue.appendleft(waiter.result())
                self._hand_over()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise
        finally:
            if timer is not None:
                timer.cancel()

    async def batch_receive(
        self, max_messages: int = 100, timeout: float | None = 0.1
    ) -> list[Message]:
        """Up to ``max_messages`` messages in one call (Pulsar's
        ``batchReceive``): returns as soon as that many are queued, or
        ``timeout`` seconds after the call with those queued by then
        (possibly none). ``timeout=None`` waits for the first message and
        returns it with those queued behind it. At most
        ``receiver_queue_size`` are ever queued, so a batch is never waited
        for beyond that many."""
        if type(max_messages) is not int or max_messages < 1:
            raise InvalidInputError(
                f"max_messages must be an int of at least 1, not {max_messages!r}"
            )
        if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
            raise InvalidInputError(f"timeout must be seconds >= 0 or None, not {timeout!r}")
        if self._closing:
            self._raise_closed()
        want = 1 if timeout is None else min(max_messages, self.receiver_queue_size)
        if len(self._queue) < want or self._waiters or self._batch_waiters:
            waiter: asyncio.Future[None] = self._loop.create_future()
            entry = (waiter, want)
            self._batch_waiters.append(entry)
            timer = None if timeout is None else self._loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                if entry in self._batch_waiters:
                    self._batch_waiters.remove(entry)
            if self._closing:
                self._raise_closed()
        queue = self._queue
        count = min(max_messages, len(queue))
        batch = [queue.popleft() for _ in range(count)]
        self._took(count)
        self._hand_over()  # (a batch waiter behind this one may be served now)
        return batch

    def __aiter__(self) -> Consumer:
        """``async for msg in consumer``: ``receive()`` until the consumer is
        closed by ``close()`` (closed by an error, the error is raised)."""
        return self

    async def __anext__(self) -> Message:
        try:
            return await self.receive()
        except ConsumerClosedError:
            if self._reason is None:
                raise StopAsyncIteration from None
            raise

    def on_message(self, message: pb.CommandMessage) -> None:
        if self._closing:
            return
        queue = self._queue
        dead = self._dead_letters
        for entry in message.entries:
            if dead is not None and entry.redelivery_count > dead.max_redeliver_count:
                # Delivered once too often: not for the application.
                doomed = decode_entry(self.topic, entry)
                dead.take(doomed)
                self._took(len(doomed))
                continue
            queue.extend(decode_entry(self.topic, entry))
        self._hand_over()

    def _hand_over(self) -> None:
        queue = self._queue
        waiters = self._waiters
        while queue and waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(queue.popleft())
                self._took_one()
        batch_waiters = self._batch_waiters
        if batch_waiters and not waiters:
            woken, want = batch_waiters[0]
            if len(queue) >= want or woken.done():
                batch_waiters.popleft()
                _wake(woken)  # (it takes its messages when it runs)

    def _took_one(self) -> None:
        self._took(1)

    def _took(self, count: int) -> None:
        self._taken += count
        if self._taken >= self._flow_threshold:
            if self._conn.is_current(self._gen):
                self._conn.write(self._flow_command(self._taken))
            self._taken = 0

    @property
    def closed(self) -> bool:
        return self._closed

    def move_to(self, conn: Connection) -> None:
        self._conn = conn

    def leave(self, link: Link) -> None:
        if self._attached and self._gen == link.gen:
            self._conn.request_unawaited(link, self._close_command)
            self._gen = 0  # (nothing more on that link: kept until re-created)

    def on_disconnect(self) -> None:
        # The broker redelivers every unacked message after the reconnect:
        # what is still queued here (or waits to be negatively acked) would
        # only come twice.
        self._queue.clear()
        self._taken = 0
        self._drop_nacks()
        for frame in self._inflight.values():  # (re-sent once re-created: `Transaction._unwritten`)
            if frame.txn is not None:
                frame.txn._unwritten()
        if self._sub_type == SubType.FAILOVER:
            self.is_active = False  # until the broker says so again

    def on_active_change(self, is_active: bool) -> None:
        self.is_active = is_active

    # --- acknowledging ---------------------------------------------------------

    async def acknowledge(
        self,
        message: Message | MessageId | Sequence[Message | MessageId],
        *,
        txn: Transaction | None = None,
    ) -> None:
        """Acknowledge a message (or a list of them, sent together); returns
        once the broker has stored the ack. Raises the broker's error (e.g.
        ``UnknownMessageIdError``).

        With ``txn`` the ack is part of that transaction (PENDING_ACK until
        it ends) and this returns once the ack is queued: the broker's
        answer is the transaction's, and ``txn.commit()`` raises (and
        aborts) if it refused the ack (e.g. ``TransactionConflictError``:
        another transaction holds the message). Raises
        ``InvalidTxnStatusError`` at once if ``txn`` is no longer open."""
        if (
            type(message) is Message
            and txn is not None
            and type(txn) is Transaction
            and txn._holding
            and txn._state is _OPEN
            and txn._conn is self._conn
            and not self._closing
        ):
            # (the usual case: held until the commit)
            origin = message._origin
            txn._hold_ack_at(self, origin.partition, origin.entry_id, message._index)
            return
        if (
            type(message) is Message
            and txn is not None
            and (queued := self._txn_acks.get(txn)) is not None
            and txn._state is _OPEN
            and not self._closing
        ):
            # The usual case of a loop acking a batch one by one: the
            # transaction's acks of this turn are queued already (and its
            # client checked then), so no call and no list per message.
            queued_ids = queued[0]
            queued_ids.append(message.message_id)
            if len(queued_ids) >= MAX_ACKS_PER_FRAME:
                del self._txn_acks[txn]
                self._send_ack(INDIVIDUAL, queued_ids, [], txn, queued[1])
            return
        if isinstance(message, (Message, MessageId)):  # (a MessageId is a tuple too)
            mids = [message_id_of(message)]
        else:
            mids = [message_id_of(m) for m in message]
            if not mids:
                return
        if txn is not None:
            self._queue_txn_acks(mids, txn)
            return
        self._check_ack(None)
        future: asyncio.Future[None] = self._loop.create_future()
        pending = self._acks
        if pending is None:
            pending = self._acks = ([], [])
        ids, futures = pending
        ids.extend(mids)
        futures.extend([future] * len(mids))
        if len(ids) >= MAX_ACKS_PER_FRAME:
            self._acks = None
            self._send_ack(INDIVIDUAL, ids, futures)
        elif not self._ack_flush_scheduled:
            self._ack_flush_scheduled = True
            self._loop.call_soon(self._flush_acks)
        await future

    def _queue_txn_acks(self, mids: list[MessageId], txn: Transaction) -> None:
        """Queue individual acks of ``txn``: held by it (its local path), or
        framed with the transaction's other acks of this turn of the loop,
        or by its commit."""
        self._check_ack(txn)
        if txn._holding:
            for mid in mids:
                txn._hold_ack(self, mid)
            return
        pending = self._txn_acks.get(txn)
        if pending is None:
            tracker = self._tracker(txn)
            pending = self._txn_acks[txn] = ([], tracker)
            txn._flushes[self._flush_acks] = None
        ids = pending[0]
        ids.extend(mids)
        if len(ids) >= MAX_ACKS_PER_FRAME:
            del self._txn_acks[txn]
            self._send_ack(INDIVIDUAL, ids, [], txn, pending[1])
        elif not self._ack_flush_scheduled:
            self._ack_flush_scheduled = True
            self._loop.call_soon(self._flush_acks)

    async def acknowledge_cumulative(
        self, message: Message | MessageId, *, txn: Transaction | None = None
    ) -> None:
        """Acknowledge every message up to this one on its partition (not
        allowed on shared subscriptions: ``NotAllowedError``), in ``txn`` if
        given (then it returns once queued, as ``acknowledge`` does)."""
        mid = message_id_of(message)
        self._check_ack(txn)
        if txn is not None:
            txn.flush()  # (the broker expands it: the full path)
            self._send_ack(AckType.CUMULATIVE, [mid], [], txn, self._tracker(txn))
            return
        future: asyncio.Future[None] = self._loop.create_future()
        self._send_ack(AckType.CUMULATIVE, [mid], [future])
        await future

    def _check_ack(self, txn: Transaction | None) -> None:
        """Refuse an ack on a closed consumer or an ended transaction."""
        if self._closing:
            self._raise_closed()
        if txn is not None:
            check_txn(txn, self._conn)

    def _tracker(self, txn: Transaction) -> asyncio.Future[None]:
        """A new future that ``txn`` waits on: the outcome of an ACK frame."""
        tracker: asyncio.Future[None] = self._loop.create_future()
        txn._track(tracker)
        return tracker

    async def negative_acknowledge(self, message: Message | MessageId) -> None:
        """Ask the broker to deliver this message again (to any consumer of
        the subscription), ``negative_ack_redelivery_delay`` seconds from
        now (negative acks due together go in one request)."""
        mid = message_id_of(message)
        if self._closing:
            self._raise_closed()
        delay = self.negative_ack_redelivery_delay
        if delay <= 0:
            self._redeliver([mid])
            return
        self._nacks.append((self._loop.time() + delay, mid))
        if self._nack_timer is None:
            self._nack_timer = self._loop.call_at(self._nacks[0][0], self._send_nacks)

    def _send_nacks(self) -> None:
        """Ask for the negative acks that are due (and those due within a
        tenth of the delay, to share the request)."""
        self._nack_timer = None
        nacks = self._nacks
        horizon = self._loop.time() + self.negative_ack_redelivery_delay / 10
        due = []
        while nacks and nacks[0][0] <= horizon:
            due.append(nacks.popleft()[1])
        if due:
            self._redeliver(due)
        if nacks:
            self._nack_timer = self._loop.call_at(nacks[0][0], self._send_nacks)

    def _drop_nacks(self) -> None:
        self._nacks.clear()
        if self._nack_timer is not None:
            self._nack_timer.cancel()
            self._nack_timer = None

    async def redeliver_unacknowledged(self) -> None:
        """Ask the broker to deliver again every message this consumer has not
        acknowledged. Drops the messages queued locally (they come again)."""
        if self._closing:
            self._raise_closed()
        dropped = len(self._queue)
        self._queue.clear()
        self._redeliver([])
        if dropped and self._conn.is_current(self._gen):
            self._conn.write(self._flow_command(dropped))

    async def seek(self, target: Message | MessageId | int) -> None:
        """Reset the subscription (for all its consumers) to ``target``: a
        ``MessageId`` (or ``Message``), so that the next message delivered
        on its partition is that one (the other partitions stay as they
        are), or an ``int`` of milliseconds since the epoch, so that on
        every partition delivery starts at the first message published at or
        after it (the producers' clocks). Messages queued in this consumer
        are dropped; delivery goes on from there. Raises ``NotAllowedError``
        (nothing changed) while a transaction holds acknowledgements of the
        subscription, ``InvalidInputError`` for anything else as target.
        Other consumers of the subscription are not told: what they hold
        unacknowledged is forgotten by the broker (their late acks apply to
        the new position)."""
        if self._closing:
            self._raise_closed()
        seek = pb.CommandSeek(consumer_id=self.consumer_id)
        if isinstance(target, Message | MessageId):
            mid = message_id_of(target)
            if mid.entry_id < 0 or mid.batch_index < 0:
                raise InvalidInputError(f"cannot seek to {mid}: not a stored message's id")
            seek.message_id.partition = mid.partition
            seek.message_id.entry_id = mid.entry_id
            seek.message_id.batch_index = mid.batch_index
        elif type(target) is int and target >= 0:
            seek.publish_time_ms = target
        else:
            raise InvalidInputError(
                "seek to a MessageId, a Message or an int of milliseconds since the epoch, "
                f"not {target!r}"
            )

        def build(request_id: int) -> Command:
            cmd = Command(type=Command.SEEK)
            cmd.seek.CopyFrom(seek)
            cmd.seek.request_id = request_id
            return cmd

        await self._conn.request(
            build, Type.SUCCESS, f"seek on {self.subscription!r} of {self.topic!r}"
        )
        # Whatever was queued or pushed before the answer came is from before
        # the reset: dropped, and whatever the broker still counts as this
        # consumer's is asked for again.
        await self.redeliver_unacknowledged()

    async def unsubscribe(self) -> None:
        """Delete the subscription on the broker (its position and every
        message it has not acknowledged) and close this consumer. Raises
        ``NotAllowedError`` (nothing changed, the consumer stays) while
        another consumer is connected to the subscription or a transaction
        not ended holds it. One attempt: if the connection drops meanwhile,
        ``ConnectionLostError`` (the outcome is unknown; the consumer is
        subscribed again on the next connection)."""
        if self._closing:
            self._raise_closed()
        what = f"unsubscribe from {self.subscription!r} of {self.topic!r}"
        await self._stop_dead_letters()  # (their transactions hold the subscription)
        deadline = self._conn.deadline()
        link = await self._conn.wait_ready(deadline, what)
        await self._conn.request_on(
            link,
            lambda request_id: command(
                Type.UNSUBSCRIBE,
                "unsubscribe",
                request_id=request_id,
                consumer_id=self.consumer_id,
            ),
            Type.SUCCESS,
            what,
            deadline,
        )
        self._shut()  # (the broker has dropped the consumer with its subscription)

    def _send_held_acks(self, txn: Transaction, ranges: list[list[int]]) -> None:
        """Frame the acks ``txn`` held (it leaves the local path)."""
        flat = [x for r in ranges for x in r]
        ids = [new_message_id((p, e, i)) for p, e, a, b in ranges for i in range(a, b + 1)]
        txn._flushes[self._flush_acks] = None
        self._send_ack(INDIVIDUAL, ids, [], txn, self._tracker(txn), flat)

    def _redeliver_ranges(self, ranges: list[list[int]]) -> None:
        """Ask for the messages of ``ranges`` again (a transaction that held
        their acks ended without writing them)."""
        self._redeliver(
            [MessageId(p, e, i) for p, e, first, last in ranges for i in range(first, last + 1)]
        )

    def _give_back(self, ids: list[MessageId]) -> None:
        """Messages handed to the dead letters whose move failed: delivered
        again (unless this consumer is closing)."""
        if not self._closing:
            self._redeliver(ids)

    def _redeliver(self, ids: list[MessageId]) -> None:
        if not self._conn.is_current(self._gen):
            return
        cmd = command(
            Type.REDELIVER_UNACKNOWLEDGED, "redeliver_unacknowledged", consumer_id=self.consumer_id
        )
        for mid in ids:
            cmd.redeliver_unacknowledged.message_ids.add(
                partition=mid.partition, entry_id=mid.entry_id, batch_index=mid.batch_index
            )
        self._conn.write(cmd.SerializeToString())

    def _flush_acks(self) -> None:
        self._ack_flush_scheduled = False
        if self._acks is not None:
            (ids, futures), self._acks = self._acks, None
            self._send_ack(INDIVIDUAL, ids, futures)
        if self._txn_acks:
            txn_acks, self._txn_acks = self._txn_acks, {}
            for txn, (ids, tracker) in txn_acks.items():
                self._send_ack(INDIVIDUAL, ids, [], txn, tracker)

    def _send_ack(
        self,
        ack_type: AckType,
        ids: list[MessageId],
        futures: list[asyncio.Future[None]],
        txn: Transaction | None = None,
        tracker: asyncio.Future[None] | None = None,
        ranges: list[int] | None = None,
    ) -> None:
        request_id = self._conn.next_request_id()
        txn_id = None if txn is None else txn.id
        data = build_ack(
            self.consumer_id, request_id, ack_type, ids, txn_id, ranges
        ).SerializeToString()
        deadline = self._loop.time() + self._conn.operation_timeout
        self._inflight[request_id] = _AckFrame(ack_type, ids, futures, data, deadline, txn, tracker)
        if self._conn.is_current(self._gen):
            self._conn.write(data)
        elif txn is not None:
            txn._unwritten()

    def on_ack_response(self, response: pb.CommandAckResponse) -> None:
        pending = self._inflight.get(response.request_id)
        if (
            response.error == pb.NOT_OWNER
            and pending is not None
            and pending.tracker is None
            and self._conn.router is not None
        ):
            # (A cluster: the topic moved. The ack stays in flight, re-sent at
            # its new owner: acks are idempotent. A transaction's ack fails:
            # its coordinator is not there.)
            if self._conn.consumers.get(self.consumer_id) is self:
                self._conn.hand_over(self)
            return
        frame = self._inflight.pop(response.request_id, None)
        if frame is None:
            return
        tracker = frame.tracker
        if not response.HasField("error"):
            if tracker is not None and not tracker.done():
                tracker.set_result(None)
            for future in frame.futures:
                if not future.done():
                    future.set_result(None)
            return
        exc = from_wire(response.error, response.message)
        if tracker is not None:  # (the transaction fails whichever id was refused)
            if not tracker.done():
                tracker.set_exception(exc)
            if frame.ack_type == INDIVIDUAL:
                # Refused: the broker changed nothing, so these messages are
                # still this consumer's, unacknowledged, and no end of the
                # transaction redelivers them (only a PENDING_ACK is). Asked
                # for again now, or they would come only after a reconnect.
                self._redeliver(frame.ids)
            return
        if len(frame.ids) > 1 and not exc.retriable:
            # Find the guilty ids: acks are idempotent, so ask again one by one.
            self._resend_alone(frame)
            return
        fail_all(frame.futures, exc)

    def _resend_alone(self, frame: _AckFrame) -> None:
        """Re-send each id of a refused frame in a frame of its own. A call
        of several ids gets one future per id, and fails if one of them does."""
        ids_per_call = Counter(frame.futures)
        parts: dict[asyncio.Future[None], list[asyncio.Future[None]]] = {}
        for mid, call in zip(frame.ids, frame.futures, strict=True):
            if call.done():
                continue
            if ids_per_call[call] == 1:
                self._send_ack(frame.ack_type, [mid], [call], frame.txn)
                continue
            part: asyncio.Future[None] = self._loop.create_future()
            parts.setdefault(call, []).append(part)
            self._send_ack(frame.ack_type, [mid], [part], frame.txn)
        for call, its_parts in parts.items():
            asyncio.gather(*its_parts).add_done_callback(partial(_settle_call, call))

    def fail_request(self, request_id: int, exc: TxnbufError) -> bool:
        frame = self._inflight.pop(request_id, None)
        if frame is None:
            return False
        _fail_frame(frame, exc)
        return True

    def expire(self, now: float) -> None:
        expired = [rid for rid, frame in self._inflight.items() if frame.deadline <= now]
        for request_id in expired:
            self.fail_request(
                request_id,
                OperationTimeoutError(
                    f"ack on {self.subscription!r} got no answer within "
                    f"{self._conn.operation_timeout} s"
                ),
            )

    # --- closing ---------------------------------------------------------------

    def _close_command(self, request_id: int) -> Command:
        return command(
            Type.CLOSE_CONSUMER,
            "close_consumer",
            request_id=request_id,
            consumer_id=self.consumer_id,
        )

    async def close(self) -> None:
        """Wait for the answers to pending acks (within the operation
        timeout), then close the consumer on the broker, which redelivers its
        unacked messages to other consumers. Idempotent."""
        if self._closing:
            return
        self._closing = True
        for txn in list(self._held_in):  # (their acks go now, the full way)
            txn.flush()
        try:
            await self._stop_dead_letters()
            self._flush_acks()
            pending = [f for frame in self._inflight.values() for f in frame.futures]
            pending += [f.tracker for f in self._inflight.values() if f.tracker is not None]
            if pending:
                await asyncio.wait(pending, timeout=self._conn.operation_timeout)
        finally:
            self._shut()
        link = self._conn.link
        if link is not None and self._attached and self._conn.is_current(self._gen):
            try:
                await self._conn.request_on(
                    link,
                    self._close_command,
                    Type.SUCCESS,
                    f"close consumer on {self.subscription!r}",
                    self._conn.deadline(),
                )
            except (ConnectionLostError, ConsumerNotFoundError):
                pass  # the broker dropped it already

    async def _stop_dead_letters(self) -> None:
        dead, self._dead_letters = self._dead_letters, None
        if dead is not None:
            await dead.close()

    def _shut(self) -> None:
        """Closed for good: waiting receives and acks fail with ConsumerClosedError."""
        exc = ConsumerClosedError(f"consumer {self.consumer_id} was closed")
        exc.__cause__ = self._reason
        self._closing = self._closed = True
        self._conn.consumers.pop(self.consumer_id, None)
        self._queue.clear()
        self._drop_nacks()
        waiters, self._waiters = self._waiters, deque()
        fail_all(waiters, exc)
        batch_waiters, self._batch_waiters = self._batch_waiters, deque()
        for waiter, _ in batch_waiters:
            _wake(waiter)  # (it sees the consumer closed)
        frames, self._inflight = self._inflight, {}
        for frame in frames.values():
            _fail_frame(frame, exc)
        if self._acks is not None:
            fail_all(self._acks[1], exc)
            self._acks = None
        txn_acks, self._txn_acks = self._txn_acks, {}
        for _, tracker in txn_acks.values():
            fail_all([tracker], exc)

    def _fail(self, reason: TxnbufError) -> None:
        """Close the consumer after a fatal error (e.g. re-subscribing refused)."""
        self._reason = reason
        self._shut()

    def _raise_closed(self) -> None:
        raise ConsumerClosedError(f"consumer {self.consumer_id} is closed") from self._reason


def _fail_frame(frame: _AckFrame, exc: TxnbufError) -> None:
    """Fail an ACK frame's calls, or its transaction's view of it."""
    fail_all(frame.futures, exc)
    if frame.tracker is not None:
        fail_all([frame.tracker], exc)


def _settle_call(call: asyncio.Future[None], parts: asyncio.Future[list[None]]) -> None:
    """Settle an ack call like the gathered acks of its ids (re-sent alone)."""
    if call.done():
        return
    if parts.cancelled():
        call.cancel()
        return
    exc = parts.exception()
    if exc is None:
        call.set_result(None)
    else:
        call.set_exception(exc)


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _time_out(waiter: asyncio.Future[Message], timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(OperationTimeoutError(f"receive got no message within {timeout} s"))
