"""Transactions (PIP-31 §Public APIs): TxnID, the state table, Transaction.

A ``Transaction`` is made by ``Client.new_transaction`` (NEW_TXN to one of
the coordinators the broker serves) and used by ``Producer.send(...,
txn=txn)`` and ``Consumer.acknowledge(..., txn=txn)``. It keeps what
``commit`` must wait for (its sends and acks still unanswered); the
producers and consumers do the sending.

Decisions written down here:

* A transaction holds its sends and acks until it ends (the local path,
  docs/architecture.md): ``send(..., txn=)`` and ``acknowledge(..., txn=)``
  queue them in the transaction, which ``commit()`` sends with the commit
  and the ask for the next transaction as one COMMIT_TXN frame; the broker
  answers it once, when everything is durable. The acks travel as ranges
  (partition, entry, first index, last index), built as they are queued.
  Nothing is written before the commit, so ``abort()`` sends only END_TXN
  ABORT (and asks for the acknowledged messages again, as an abort of
  written acks redelivers them). A commit the broker refuses changed
  nothing: the client aborts and raises the refusal. A commit whose answer
  did not come (a reconnect) is sent again as it was: the broker answers a
  commit it wrote as done, and writes nothing twice.
* The full path, for what does not fit in one frame: once what a
  transaction holds would pass the broker's ``max_message_size``, or on
  ``flush()``, ``prepare()``, a cumulative ack, or the close of a producer
  or consumer it holds something of, the transaction sends what it holds
  as SEND and ACK frames and from then on sends and acks as they come (as
  below); it ends with END_TXN.
* Sends and acks of a transaction return once queued (``Producer.send``,
  ``Consumer.acknowledge`` with ``txn=``): none costs a round trip of its
  own, so a loop that awaits each send and ack frames the whole batch at
  once. The transaction counts them until the broker answers
  (``_track``); ``commit()`` waits for them and fails if one failed (Kafka's
  ``commitTransaction``). A failure reaches the application through
  ``commit()`` only.
* Registration: none by the client. The broker adds the partition of a
  transactional SEND, and the subscription of a transactional ACK, to the
  transaction itself if it is not yet (KIP-890 part 2), before it takes the
  frame; so no ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN is sent.
* ``commit()`` with sends or acks still unanswered frames what is still
  queued and writes END_TXN COMMIT with ``after_ops`` right behind them, on
  the same link, without waiting for their answers. The broker reads frames in
  order, so it has read every send and ack of the transaction before the
  END; it commits once they are all answered, and only if none failed.
  Their answers come before the END's. If one failed, the broker refuses
  the commit (NOT_ALLOWED, nothing changed), and the client sends END_TXN
  ABORT and raises that send's or ack's error (else the refusal). This
  holds only for frames written on that link: a send or ack framed while
  its producer or consumer has no current link (being re-created after a
  reconnect, or handed to another broker's connection) is kept and
  written once it is re-created, and an END written before it would
  overtake it (the broker would commit without it, then refuse it as too
  late, while ``commit()`` succeeded). Such a transaction
  (`Transaction._unwritten`) commits as one across brokers does: END_TXN
  once every send and ack is answered.
* A send or ack counts as answered by the first answer to it, from the
  broker its producer or consumer is on by then: after a reconnect or a
  move to another broker's connection it is re-sent there (its request id
  kept). The original frame, if a stalled broker reads it later, is taken
  there too (sends are deduplicated, acks are idempotent) or refused (that
  broker no longer serves the topic, or the transaction has ended): its
  answer goes to a link that is gone (or to a connection the producer or
  consumer has left), so ``commit()`` neither
  waits for it nor fails on it.
* A send or ack that fails after its transaction's commit succeeded (or
  while the END that then succeeded was on its way, unless the client
  timed it out itself: the broker may have taken it) is logged at WARNING
  (logger ``client``, naming the transaction and the error). Every path
  here ends a commit only once the broker has read or answered every send
  and ack, so such a failure is an ordering hole: the application was told
  the message is in the transaction, and it is not. ``commit()`` returned
  already, so the log is its only trace.
* When that cannot be done (no link up, or a send or ack of the
  transaction failed already) or the link dies before the END's answer,
  ``commit()`` waits until every send and ack of the transaction is
  answered (re-sent on the next link; each has its own
  ``operation_timeout``; commit itself gives up after twice that), then
  sends END_TXN COMMIT, or, if any of them failed (a TRANSACTION_CONFLICT
  on an ack, a send error, a timeout), END_TXN ABORT and raises the first
  of those errors. So, in the rare case where the first END had committed,
  a re-sent send may be refused as too late, and ``commit()`` then raises
  with the transaction ended (state ENDED: outcome unknown to the client),
  though it committed with all its sends and acks. A send or ack that
  timed out on the client while the broker took it is committed with the
  rest when the END succeeds (the broker decides).
* A cluster: a send or ack on a topic served by another broker than the
  transaction's coordinator's (``_cross``) puts the transaction on the
  full path for good (what it held is sent at once); that broker checks
  with the coordinator and answers it once durable. Its ``commit()`` then
  never writes END behind its sends (they are on other links): it frames
  what is queued, waits until every send and ack of the transaction on
  every connection was answered, then sends END_TXN; ``abort()`` waits for
  them too (bounded by twice the operation timeout) before END_TXN ABORT.
  An END_TXN whose broker answers NOT_OWNER or gives no answer within
  ``END_ATTEMPT_S`` is sent again at the coordinator's owner as a LOOKUP
  names it then (``_request_end``), until the operation timeout: at once
  when the owner named is a broker not tried yet, after a pause of 0.05 s
  doubling to 1 s when it is one tried already (the slot is between
  owners: ``client._backoff``).
* ``abort()`` frames the sends and acks still queued, then sends END_TXN
  ABORT at once, without waiting for their answers, and with ``after_ops``:
  the broker aborts once it has answered the sends and acks it read
  before the END (on this link, or re-sent before it on the next), so an
  ack the application made before ``abort()`` is in PENDING_ACK when the
  abort returns it to PENDING, and its message is redelivered; a refused
  one is not the abort's concern. A send or ack made after the END is
  refused by the broker. The broker refuses them
  once the coordinator has aborted the transaction, or they land and are
  aborted with it; each still reports its own outcome to its caller.
* END_TXN is a control request, retried across reconnects until
  ``operation_timeout`` (END_TXN is idempotent on the coordinator). If it
  fails without an answer (timeout, connection), the outcome is unknown and
  ``commit()`` / ``abort()`` may be called again: commit again, or abort
  (the coordinator answers INVALID_TXN_STATUS if it had committed).
* The states are the table ``TRANSITIONS``, applied by ``transition``. Once
  ``commit()`` or ``abort()`` has been called, a send or ack with the
  transaction raises ``InvalidTxnStatusError`` locally (nothing is sent).
  After the end, so do ``commit()`` and ``abort()``, with two exceptions:
  ``commit()`` after a successful commit and ``abort()`` after an abort
  return at once. A coordinator answer of TRANSACTION_TIMEOUT means the
  coordinator aborted the transaction (state ABORTED); TRANSACTION_NOT_FOUND
  and INVALID_TXN_STATUS end it with an outcome the client does not know
  (state ENDED). Either way the mapped error is raised.
* One ``commit()`` or ``abort()`` at a time: a second call while one runs
  raises ``InvalidTxnStatusError``.
* Closing the client does not end its open transactions: the coordinator
  aborts them when their timeout passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import secrets
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from proto import TxnID
from proto import txnbuf_pb2 as pb

from ._backoff import Backoff
from ._connection import Command, Type, command, copy_error, wait_future_until
from ._message import Entry, MessageId, encode_values, held_entries, new_message_id
from .errors import (
    ConnectionLostError,
    InvalidInputError,
    InvalidTxnStatusError,
    NotAllowedError,
    NotOwnerError,
    OperationTimeoutError,
    ProtocolError,
    TransactionNotFoundError,
    TransactionTimeoutError,
    TxnbufError,
)

if TYPE_CHECKING:
    from ._connection import Connection, Link
    from ._spares import SparePool

log = logging.getLogger("client")

END_ATTEMPT_S = 3.0  # seconds one END_TXN try at a cluster's broker may take before a lookup

# --- the state table ----------------------------------------------------------


class TxnState(enum.Enum):
    """Where a transaction is, as this client knows it."""

    OPEN = "open"  # sends and acks may use it
    PREPARED = "prepared"  # made durable for its decision (``prepare()``): no more sends or acks
    COMMITTING = "committing"  # commit decided; END_TXN COMMIT not answered yet
    ABORTING = "aborting"  # abort decided; END_TXN ABORT not answered yet
    COMMITTED = "committed"
    ABORTED = "aborted"  # also: the coordinator timed it out
    ENDED = "ended"  # the coordinator no longer knows it as open; outcome unknown


_OPEN = TxnState.OPEN  # (an Enum member lookup costs ~1 µs; check_txn runs per send)


class TxnEvent(enum.Enum):
    PREPARE = "prepare"  # prepare() was answered with success
    COMMIT = "commit"  # the application calls commit()
    ABORT = "abort"  # the application calls abort(), or commit() found a failure
    COMMITTED = "committed"  # END_TXN COMMIT answered with success
    ABORTED = "aborted"  # END_TXN ABORT answered with success, or TRANSACTION_TIMEOUT
    LOST = "lost"  # END_TXN answered TRANSACTION_NOT_FOUND or INVALID_TXN_STATUS


S, E = TxnState, TxnEvent
TRANSITIONS: dict[tuple[TxnState, TxnEvent], TxnState] = {
    (S.OPEN, E.COMMIT): S.COMMITTING,
    (S.OPEN, E.ABORT): S.ABORTING,
    (S.OPEN, E.PREPARE): S.PREPARED,
    (S.PREPARED, E.COMMIT): S.COMMITTING,
    (S.PREPARED, E.ABORT): S.ABORTING,
    (S.COMMITTING, E.COMMIT): S.COMMITTING,  # again, after an unknown outcome
    (S.COMMITTING, E.ABORT): S.ABORTING,  # a send or ack failed, or the app gives up
    (S.ABORTING, E.ABORT): S.ABORTING,  # again, after an unknown outcome
    (S.COMMITTING, E.COMMITTED): S.COMMITTED,
    (S.COMMITTING, E.ABORTED): S.ABORTED,  # TRANSACTION_TIMEOUT
    (S.ABORTING, E.ABORTED): S.ABORTED,
    (S.COMMITTING, E.LOST): S.ENDED,
    (S.ABORTING, E.LOST): S.ENDED,
}
del S, E


def transition(state: TxnState, event: TxnEvent, txn_id: TxnID) -> TxnState:
    """The state after ``event``; ``InvalidTxnStatusError`` if the table has
    no such move (the caller's state is then left as it was)."""
    try:
        return TRANSITIONS[state, event]
    except KeyError:
        raise InvalidTxnStatusError(
            f"transaction {txn_id} is {state.value}: cannot {event.value}"
        ) from None


class BatchFiller(Protocol):
    """A producer filling a batch of sends in a transaction (``client._producer``):
    framed when another producer starts one on the same partition."""

    def _frame_filling(self, partition: int, txn: Transaction) -> None: ...


class HeldSender(Protocol):
    """A producer whose sends a transaction holds (the local path:
    ``client._producer``)."""

    topic: str
    producer_id: int
    partitions: int
    _round_robin: int
    _held_in: dict[Transaction, None]

    def _frame_held(
        self, partition: int, txn: Transaction, entries: list[Entry], first_index: int
    ) -> None: ...


class HeldAcker(Protocol):
    """A consumer whose acknowledgements a transaction holds (the local
    path: ``client._consumer``)."""

    consumer_id: int
    _held_in: dict[Transaction, None]

    def _send_held_acks(self, txn: Transaction, ranges: list[list[int]]) -> None: ...

    def _redeliver_ranges(self, ranges: list[list[int]]) -> None: ...


# --- the transaction ----------------------------------------------------------


def check_txn(txn: Transaction, conn: Connection) -> None:
    """Raise unless a send or ack on ``conn`` may join ``txn`` now (nothing
    is sent otherwise)."""
    if not isinstance(txn, Transaction):
        raise InvalidInputError(f"txn must be a Transaction or None, not {type(txn).__name__}")
    if txn._state is not _OPEN:
        raise InvalidTxnStatusError(
            f"transaction {txn.id} is {txn._state.value}: no more sends or acks"
        )
    if txn._conn is not conn:
        if txn._conn.router is None or txn._conn.router is not conn.router:
            raise InvalidInputError(f"transaction {txn.id} belongs to another Client")
        txn._cross()


class Transaction:
    """One PIP-31 transaction. Made by ``Client.new_transaction`` (or
    ``Client.transaction``); pass it as ``txn=`` to ``Producer.send`` /
    ``send_nowait`` and ``Consumer.acknowledge`` / ``acknowledge_cumulative``,
    then ``await commit()`` or ``await abort()``.

    ``id`` is its ``TxnID``, ``tc_id`` the coordinator it was asked of,
    ``timeout`` the seconds after which that coordinator aborts it, ``state``
    a ``TxnState``. See the module docstring of ``client._txn`` for what
    commit and abort wait for and what may follow them.
    """

    def __init__(
        self,
        conn: Connection,
        txn_id: TxnID,
        tc_id: int,
        timeout: float,
        spares: SparePool | None = None,
    ) -> None:
        self._conn = conn
        self._spares = spares  # its first END_TXN asks for a spare (client._spares)
        self._loop = asyncio.get_running_loop()
        self.id = txn_id
        self.tc_id = tc_id
        self.timeout = timeout
        self._state = TxnState.OPEN
        self._ending = False  # a commit() or abort() is running
        # What frames its queued sends and acks now (producers' and
        # consumers' flushes), for a commit written right behind them; in
        # the order they first queued something (a dict as an ordered set).
        self._flushes: dict[Callable[[], None], None] = {}
        # Per (topic, partition): the place in the transaction of the next
        # message framed there, and the producer whose batch of the
        # transaction is filling for it (``client._producer``).
        self._places: dict[tuple[str, int], int] = {}
        self._filling: dict[tuple[str, int], BatchFiller] = {}
        self._pending_ops = 0
        # A send or ack of it went to another broker than its coordinator's
        # (a cluster): it is on the full path, and its END goes only once
        # every send and ack of it is answered (see the module docstring).
        self._crossing = False
        # What commit() waits on while sends or acks are unanswered.
        self._settled: asyncio.Future[None] | None = None
        self._error: TxnbufError | None = None
        # The local path (see the module docstring): while ``_holding``, the
        # sends held, in order, each [producer, partition, entries, its
        # first place]; the one filling per (topic, partition); the acks
        # held per consumer, as [partition, entry, first, last] ranges;
        # about how many bytes they make; and the COMMIT_TXN built from
        # them (kept for a commit sent again).
        self._holding = True
        self._held_sends: list[list[Any]] = []
        self._held_at: dict[tuple[str, int], list[Any]] = {}
        self._held_acks: dict[HeldAcker, list[list[int]]] = {}
        self._held_bytes = 0
        self._held_limit = conn.max_message_size
        self._commit_txn: Command | None = None
        # The held sends and the acks' ranges used last (the next send or
        # ack usually joins them).
        self._last_held: list[Any] | None = None
        self._last_acked: HeldAcker | None = None
        self._last_ranges: list[list[int]] = []

    def __repr__(self) -> str:
        return f"<Transaction {self.id} {self._state.value}>"

    @property
    def state(self) -> TxnState:
        return self._state

    # --- for producers and consumers --------------------------------------

    def _track(self, future: asyncio.Future[Any]) -> None:
        """Count a send or ack of the transaction until ``future`` is done;
        a failure makes ``commit()`` abort."""
        self._pending_ops += 1
        future.add_done_callback(self._op_done)

    def _op_done(self, future: asyncio.Future[Any]) -> None:
        self._pending_ops -= 1
        if future.cancelled():
            error: BaseException | None = OperationTimeoutError(
                f"an operation of transaction {self.id} was cancelled; its outcome is unknown"
            )
        else:
            error = future.exception()
        if error is not None and self._state is TxnState.COMMITTED:
            self._failed_after_commit(error)
        if error is not None and self._error is None:
            if not isinstance(error, TxnbufError):  # (a client bug: foreign errors are translated)
                wrapped = ProtocolError(f"an operation of transaction {self.id} failed: {error!r}")
                wrapped.__cause__ = error
                error = wrapped
            self._error = error
        settled = self._settled
        if not self._pending_ops and settled is not None and not settled.done():
            settled.set_result(None)

    def _failed_after_commit(self, error: BaseException) -> None:
        """A send or ack of the transaction failed though its commit
        succeeded: the commit was decided without it (what the application
        was told is in the transaction is not). Never expected: every path
        of `commit` ends only after the broker read, or answered, every
        send and ack; so this is logged loudly, as the trace of an ordering
        hole."""
        log.warning(
            "transaction %s: a send or ack failed after the transaction's commit succeeded, "
            "so it is not part of what was committed (an ordering hole in the client): %s",
            self.id,
            error,
        )

    def _command(self, kind: Type, field: str, request_id: int, **fields: object) -> Command:
        return command(
            kind,
            field,
            request_id=request_id,
            txnid_most_bits=self.id.most_bits,
            txnid_least_bits=self.id.least_bits,
            **fields,
        )

    # --- the local path: what the transaction holds ---------------------------

    def _hold_send(
        self,
        producer: HeldSender,
        partition: int,
        value: bytes,
        seq: int,
        size: int,
        extra: tuple[str | None, Mapping[str, str] | None] | None = None,
    ) -> MessageId:
        """Hold one message of ``producer`` for ``partition`` (checked by
        the producer): its value, sequence id and, if it has any, its key
        and properties (``extra``); its id, with its place in the
        transaction there. (Kept in per-batch lists of values and sequence
        ids, not a tuple per message: fewer objects for the collector.)"""
        held = self._last_held
        if held is None or held[0] is not producer or held[1] != partition:
            held = self._held_for(producer, partition)
        values = held[2]
        place = held[3] + len(values)
        if extra is not None:
            extras = held[5]
            if extras is None:
                extras = held[5] = {}
            extras[len(values)] = extra
        values.append(value)
        held[4].append(seq)
        self._held_bytes += size
        if self._held_bytes > self._held_limit:
            self._go_full()
        return new_message_id((partition, -1, place))

    def _held_for(self, producer: HeldSender, partition: int) -> list[Any]:
        """The held sends of ``producer`` for ``partition`` that the next
        one joins: the last held there, if it is this producer's, else a new
        one, placed after it (the transaction's messages on a partition are
        placed in the order they are held)."""
        spot = (producer.topic, partition)
        last = self._held_at.get(spot)
        if last is None or last[0] is not producer:
            first = self._places.get(spot, 0) if last is None else last[3] + len(last[2])
            # [producer, partition, values, first place, sequence ids, extras]
            last = self._held_at[spot] = [producer, partition, [], first, [], None]
            self._held_sends.append(last)
            producer._held_in[self] = None
        self._last_held = last
        return last

    def _hold_ack(self, consumer: HeldAcker, mid: MessageId) -> None:
        """Hold one acknowledgement of ``consumer``'s (`_hold_ack_at`)."""
        self._hold_ack_at(consumer, *mid)

    def _hold_ack_at(self, consumer: HeldAcker, partition: int, entry_id: int, index: int) -> None:
        """Hold one acknowledgement of ``consumer``'s, of the message at
        (``partition``, ``entry_id``, ``index``): it extends the last range
        held, or starts one."""
        if self._last_acked is consumer:
            ranges = self._last_ranges
        else:
            ranges = self._held_acks.get(consumer)  # type: ignore[assignment]
            if ranges is None:
                ranges = self._held_acks[consumer] = []
                consumer._held_in[self] = None
            self._last_acked, self._last_ranges = consumer, ranges
        if ranges:
            last = ranges[-1]
            if last[3] + 1 == index and last[1] == entry_id and last[0] == partition:
                last[3] = index
                return
        ranges.append([partition, entry_id, index, index])
        self._held_bytes += 48  # (four varints, at most)
        if self._held_bytes > self._held_limit:
            self._go_full()

    def _cross(self) -> None:
        """A send or ack of the transaction goes to another broker than its
        coordinator's: from now on it is on the full path (what it held is
        sent now), and ``commit()`` waits for every answer before END_TXN."""
        self._crossing = True
        if self._holding and not self._ending:
            self._go_full()

    def _unwritten(self) -> None:
        """A send or ack of the transaction was framed but not written: its
        producer or consumer has no current link (it is being re-created on
        a new link, or moved to another broker's connection, and writes it
        once re-created). An END written now on the coordinator's link could
        overtake it, and the broker would decide before reading it (it
        commits the transaction without it, and then refuses it as too
        late): from now on ``commit()`` waits for every send and ack to be
        answered before END_TXN, as for a transaction across brokers."""
        self._crossing = True

    def flush(self) -> None:
        """Send what the transaction holds to the broker now (as SEND and
        ACK frames), and from now on each send and ack as it comes: the
        full path, for a transaction that runs long or writes much (the
        client then holds nothing of it). ``commit()`` ends it with END_TXN.
        Does nothing once the transaction is on that path, or ending."""
        if self._holding and self._state is TxnState.OPEN and not self._ending:
            self._go_full()

    def _go_full(self) -> None:
        """Leave the local path: frame every held send (in the order they
        were held, with the places they were given) and ack."""
        self._holding = False
        sends, self._held_sends = self._held_sends, []
        acks, self._held_acks = self._held_acks, {}
        self._held_at.clear()
        self._held_bytes = 0
        self._last_held = self._last_acked = None
        for producer, partition, values, first, seqs, extras in sends:
            producer._held_in.pop(self, None)
            producer._frame_held(partition, self, held_entries(values, seqs, extras), first)
        for consumer, ranges in acks.items():
            consumer._held_in.pop(self, None)
            consumer._send_held_acks(self, ranges)

    def _release_held(self, redeliver: bool) -> None:
        """Forget what the transaction holds (it ended, or was written);
        ``redeliver``: ask for the messages it acknowledged again (it did
        not commit), as an abort of written acks redelivers them."""
        for held in self._held_sends:
            producer = held[0]
            producer._held_in.pop(self, None)
            # (keyless messages go round robin: one partition per transaction)
            producer._round_robin = (held[1] + 1) % producer.partitions
        acks, self._held_acks = self._held_acks, {}
        for consumer, ranges in acks.items():
            consumer._held_in.pop(self, None)
            if redeliver:
                consumer._redeliver_ranges(ranges)
        self._held_sends = []
        self._held_at.clear()
        self._held_bytes = 0
        self._last_held = self._last_acked = None

    def _commit_command(self) -> Command:
        """COMMIT_TXN of what the transaction holds (built once: a commit
        sent again is the same, but for its request id and its ask)."""
        if self._commit_txn is None:
            cmd = Command(type=Command.COMMIT_TXN)
            out = cmd.commit_txn
            out.txnid_most_bits, out.txnid_least_bits = self.id
            out.commit_id = secrets.randbits(64) | 1  # (sent again with its retries)
            now_ms = time.time_ns() // 1_000_000
            for producer, partition, values, _, seqs, extras in self._held_sends:
                send = out.sends.add()
                send.producer_id = producer.producer_id
                send.partition = partition
                send.batch = encode_values(values, seqs, extras, now_ms)
                first = seqs[0]
                if seqs[-1] - first + 1 == len(seqs):
                    send.first_sequence_id = first
            for consumer, ranges in self._held_acks.items():
                acks = out.acks.add()
                acks.consumer_id = consumer.consumer_id
                acks.ranges.extend([x for r in ranges for x in r])
            self._commit_txn = cmd
        return self._commit_txn

    async def _commit_held(self) -> None:
        """``commit()`` on the local path: one COMMIT_TXN (see the module
        docstring)."""
        cmd = self._commit_command()
        spares, self._spares = self._spares, None
        ask = None if spares is None else spares.ask(max(1, round(self.timeout * 1000)))
        unasked = ask

        def build(request_id: int) -> Command:
            nonlocal unasked
            commit = cmd.commit_txn
            commit.request_id = request_id
            if unasked is not None:
                commit.next_txn_ttl_ms = unasked.ttl_ms
                commit.next_tc_id = unasked.tc_id
                unasked = None
            else:  # (a retry asks for nothing)
                commit.ClearField("next_txn_ttl_ms")
                commit.next_tc_id = 0
            return cmd

        answer = None
        try:
            reply = await self._conn.request(
                build, Command.TXN_RESPONSE, f"commit transaction {self.id}", link_bound=False
            )
            answer = reply.txn_response
        except TransactionTimeoutError:
            self._state = transition(self._state, TxnEvent.ABORTED, self.id)
            self._release_held(redeliver=True)
            raise
        except (TransactionNotFoundError, InvalidTxnStatusError):
            self._state = transition(self._state, TxnEvent.LOST, self.id)
            self._release_held(redeliver=True)
            raise
        except TxnbufError as exc:
            if exc.retriable:
                raise  # (its outcome is unknown: commit or abort again)
            # Refused before anything was written: the transaction is open.
            self._state = transition(self._state, TxnEvent.ABORT, self.id)
            self._release_held(redeliver=True)
            try:
                await self._end(TxnEvent.ABORT)
            except TxnbufError as again:
                log.warning("aborting transaction %s after %s failed: %s", self.id, exc, again)
            raise copy_error(exc) from None
        finally:
            if ask is not None:
                assert spares is not None
                if answer is not None and answer.HasField("next_txnid_most_bits"):
                    spares.answered(
                        ask, answer.next_txnid_most_bits, answer.next_txnid_least_bits,
                        self._conn.gen,
                    )  # fmt: skip
                else:
                    spares.unanswered(ask)
        self._state = transition(self._state, TxnEvent.COMMITTED, self.id)
        self._release_held(redeliver=False)

    # --- ending -------------------------------------------------------------

    async def _request_end(self, build: Callable[[int], Command], what: str) -> Command:
        """END_TXN, retried until the operation timeout; in a cluster,
        re-sent at the coordinator's new owner when its broker answers
        NOT_OWNER or does not answer (END_TXN is idempotent: the new
        owner's recovered coordinator answers the outcome it decided, or
        has aborted a transaction that was OPEN)."""
        conn = self._conn
        router = conn.router
        if router is None or not router.cluster:
            return await conn.request(build, Command.TXN_RESPONSE, what, link_bound=False)
        loop = self._loop
        deadline = loop.time() + conn.operation_timeout
        backoff = Backoff(deadline, conn)
        while True:
            attempt = min(deadline, loop.time() + END_ATTEMPT_S)
            try:
                return await self._conn.request(
                    build, Command.TXN_RESPONSE, what, attempt, link_bound=False
                )
            except (NotOwnerError, OperationTimeoutError) as exc:
                if loop.time() >= deadline:
                    raise
                try:
                    found = await router.lookup(tc_id=self.tc_id, deadline=deadline)
                except OperationTimeoutError:
                    raise exc from None
                if found is not self._conn:
                    log.info("%s: the coordinator is at %s now: %s", what, found.url, exc)
                    self._conn = found
                # (at once at a new owner; a pause before the same one again)
                if not await backoff.wait(found):
                    raise exc from None

    async def commit(self) -> None:
        """Wait for the transaction's sends and acks, then commit it (or, if
        one of them failed, abort it and raise that error). Raises
        ``InvalidTxnStatusError`` if it was aborted or ended already, the
        coordinator's error, or ``OperationTimeoutError`` (outcome unknown:
        commit or abort again)."""
        if self._state is TxnState.COMMITTED and not self._ending:
            return
        self._begin(TxnEvent.COMMIT)
        try:
            if self._holding:
                await self._commit_held()
                return
            refused: TxnbufError | None = None
            if self._crossing:  # (frames of other links: END goes once all are answered)
                for flush in list(self._flushes):
                    flush()
            elif self._pending_ops:
                tried = await self._commit_behind_ops()
                if tried is True:
                    return
                refused = tried or None
            if self._pending_ops:
                self._settled = self._loop.create_future()
                await wait_future_until(
                    self._settled,
                    self._loop.time() + 2 * self._conn.operation_timeout,
                    f"commit of transaction {self.id} (waiting for its sends and acks)",
                )
            error = self._error or refused
            if error is None:
                await self._end(TxnEvent.COMMIT)
                return
            self._state = transition(self._state, TxnEvent.ABORT, self.id)
            try:
                await self._end(TxnEvent.ABORT)
            except TxnbufError as exc:
                log.warning("aborting transaction %s after %s failed: %s", self.id, error, exc)
            raise copy_error(error)
        finally:
            self._ending = False

    async def _commit_behind_ops(self) -> bool | NotAllowedError:
        """Write END_TXN COMMIT right behind the sends and acks still
        unanswered (``after_ops``: the broker commits only once they all
        succeeded), one attempt on the current link. True if committed; the
        broker's refusal if one of them failed (nothing changed); False if
        it was not tried (no link up, or a send or ack failed already) or
        the link died (outcome unknown). Unless True, the caller waits for
        the sends and acks, then commits or aborts."""
        link = self._conn.ready_link()
        if link is None or self._error is not None:
            return False
        for flush in self._flushes:  # (their frames go before the END, in order)
            flush()
        if self._crossing:  # (a frame was kept, not written on this link: `_unwritten`)
            return False
        try:
            await self._end(TxnEvent.COMMIT, link)
        except NotAllowedError as refusal:
            return refusal
        except ConnectionLostError:
            return False
        return True

    async def prepare(self) -> None:
        """Make the transaction PREPARED (for a group commit, see
        ``client._groups``): wait until every send and ack of it is answered
        (abort it and raise the first failure, as ``commit`` does), then
        PREPARE_TXN: once answered, all of them are durable and the
        transaction waits for its decision (END_TXN or a group commit).
        After this the broker refuses further sends and acks in it, and so
        does the client (its state is PREPARED: a send or ack raises
        ``InvalidTxnStatusError`` at once, as it would be refused only in
        the broker's answer otherwise). Preparing it again returns at once."""
        if self._state is TxnState.PREPARED:
            return
        if self._state is not TxnState.OPEN:
            raise InvalidTxnStatusError(
                f"transaction {self.id} is {self._state.value}: cannot prepare"
            )
        if self._holding:
            self._go_full()  # (prepare makes its writes durable: they go first)
        conn = self._conn
        for flush in list(self._flushes):  # (queued sends framed now)
            flush()
        if self._pending_ops:
            self._settled = self._loop.create_future()
            await wait_future_until(
                self._settled,
                self._loop.time() + 2 * conn.operation_timeout,
                f"prepare of transaction {self.id} (waiting for its sends and acks)",
            )
        if self._error is not None:
            error = self._error
            await self._abort_after_error()
            raise copy_error(error)
        txn_id = self.id
        await conn.request(
            lambda request_id: command(
                Type.PREPARE_TXN,
                "prepare_txn",
                request_id=request_id,
                txnid_most_bits=txn_id.most_bits,
                txnid_least_bits=txn_id.least_bits,
            ),
            Command.TXN_RESPONSE,
            f"prepare transaction {txn_id}",
            link_bound=False,
        )
        self._state = transition(self._state, TxnEvent.PREPARE, txn_id)

    async def abort(self) -> None:
        """Abort the transaction now (sends and acks in flight are
        abandoned). Returns at once if it was aborted already; raises
        ``InvalidTxnStatusError`` if it was committed or ended."""
        if self._state is TxnState.ABORTED and not self._ending:
            return
        self._begin(TxnEvent.ABORT)
        if self._holding:  # (nothing written: its acknowledged messages come again)
            self._release_held(redeliver=True)
        for flush in list(self._flushes):  # (what was queued goes before the END, in order)
            flush()
        try:
            if self._crossing and self._pending_ops:
                # (sends and acks on other brokers' links: the END goes once
                # they are answered, so none lands after the abort there)
                self._settled = self._loop.create_future()
                with contextlib.suppress(TxnbufError):
                    await wait_future_until(
                        self._settled,
                        self._loop.time() + 2 * self._conn.operation_timeout,
                        f"abort of transaction {self.id} (waiting for its sends and acks)",
                    )
            await self._end(TxnEvent.ABORT)
        finally:
            self._ending = False

    async def _abort_after_error(self) -> None:
        """``abort()`` for ``Client.transaction`` when its block raised: skip
        a transaction that is over, and only log a failure to abort (the
        coordinator aborts it at its timeout)."""
        if self._state in (TxnState.COMMITTED, TxnState.ABORTED, TxnState.ENDED):
            return
        try:
            await self.abort()
        except TxnbufError as exc:
            log.warning("could not abort transaction %s: %s", self.id, exc)

    def _begin(self, event: TxnEvent) -> None:
        if self._ending:
            raise InvalidTxnStatusError(
                f"transaction {self.id} is being committed or aborted already"
            )
        self._state = transition(self._state, event, self.id)
        self._ending = True

    async def _end(self, event: TxnEvent, behind_ops: Link | None = None) -> None:
        """END_TXN for ``event`` (COMMIT or ABORT); apply its answer.
        ``behind_ops``: a COMMIT with ``after_ops``, one attempt on that link
        (see `_commit_behind_ops`); else retried until the operation timeout."""
        committing = event is TxnEvent.COMMIT
        action = pb.COMMIT if committing else pb.ABORT
        spares, self._spares = self._spares, None
        # The first END asks for a spare (client._spares); a retry does not.
        ask = None if spares is None else spares.ask(max(1, round(self.timeout * 1000)))
        unasked = ask

        def build(request_id: int) -> Command:
            nonlocal unasked
            cmd = self._command(Command.END_TXN, "end_txn", request_id, txn_action=action)
            # (an ABORT always: see the module docstring)
            cmd.end_txn.after_ops = behind_ops is not None or not committing
            if unasked is not None:
                cmd.end_txn.next_txn_ttl_ms = unasked.ttl_ms
                cmd.end_txn.next_tc_id = unasked.tc_id
                unasked = None
            return cmd

        answer = None
        what = f"{event.value} transaction {self.id}"
        try:
            if behind_ops is None:
                reply = await self._request_end(build, what)
            else:
                reply = await self._conn.request_on(
                    behind_ops, build, Command.TXN_RESPONSE, what, self._conn.deadline()
                )
            answer = reply.txn_response
        except TransactionTimeoutError:
            self._state = transition(self._state, TxnEvent.ABORTED, self.id)
            raise
        except (TransactionNotFoundError, InvalidTxnStatusError):
            self._state = transition(self._state, TxnEvent.LOST, self.id)
            raise
        finally:
            if ask is not None:
                assert spares is not None
                if answer is not None and answer.HasField("next_txnid_most_bits"):
                    spares.answered(
                        ask, answer.next_txnid_most_bits, answer.next_txnid_least_bits,
                        self._conn.gen,
                    )  # fmt: skip
                else:
                    spares.unanswered(ask)
        done = TxnEvent.COMMITTED if committing else TxnEvent.ABORTED
        self._state = transition(self._state, done, self.id)
        error = self._error
        if committing and error is not None and not isinstance(error, OperationTimeoutError):
            # (one failed while the END was on its way; a send or ack the
            # client timed out may have been taken: the broker decided)
            self._failed_after_commit(error)
