"""The anomaly checker on golden histories: one clean history, and one history
per anomaly class with exactly that anomaly planted. Plus the history format
(JSONL round trip, validation, the recorder) and simulated-broker histories."""

from __future__ import annotations

import io
import json
import random
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from checker import CLASSES, DEFAULT_INFORMATIONAL, History, HistoryError, Recorder, Result, check
from checker.history import Op
from checker.synthetic import synthetic_history

X, Y = "orders/0", "orders/1"


# -- building histories --------------------------------------------------------------


def o(entry: int, batch: int = 0) -> list[int]:
    """An offset: [entry_id, batch_index]."""
    return [entry, batch]


def send(key: str, value: int, offset: list[int] | None = None) -> list[Any]:
    """A completed send micro-op (offset None: unknown, as for a transactional send)."""
    return ["send", key, [offset, value]]


def reads(*pairs: tuple[str, list[int], int]) -> list[Any]:
    """A completed poll micro-op from (key, offset, value) triples, in read order."""
    got: dict[str, list[list[Any]]] = {}
    for key, offset, value in pairs:
        got.setdefault(key, []).append([offset, value])
    return ["poll", got]


def _invoke_form(mop: list[Any]) -> list[Any]:
    if mop[0] == "send":
        raw = mop[2]
        return ["send", mop[1], raw[1] if isinstance(raw, list) else raw]
    return ["poll"]


class Builder:
    """Writes a history line by line; ``time`` advances 1000 ns a line.

    `op` records a whole operation (invoke, then its completion) and returns
    its completion index -- the id the checker names operations by. `invoke`
    and `complete` split one for concurrency.
    """

    def __init__(self) -> None:
        self.lines: list[dict[str, Any]] = []
        self.open: dict[Any, tuple[str, list[Any]]] = {}

    def _line(self, process: Any, type_: str, f: str, value: Any) -> int:
        index = len(self.lines)
        self.lines.append(
            {
                "index": index,
                "time": 1000 * index,
                "process": process,
                "type": type_,
                "f": f,
                "value": value,
            }
        )
        return index

    def invoke(self, process: Any, f: str, mops: list[list[Any]], **extra: Any) -> int:
        """Invoke an op; ``extra`` fields go on the invoke line (``worker=``)."""
        self.open[process] = (f, mops)
        index = self._line(process, "invoke", f, [_invoke_form(m) for m in mops])
        self.lines[index].update(extra)
        return index

    def complete(self, process: Any, type_: str = "ok", *, carry: bool = False) -> int:
        """Complete ``process``'s open op. A fail / info completion repeats the
        invoke's value, unless ``carry``: then it reports the micro-ops' results."""
        f, mops = self.open.pop(process)
        value = mops if type_ == "ok" or carry else [_invoke_form(m) for m in mops]
        return self._line(process, type_, f, value)

    def op(
        self, process: Any, f: str, mops: list[list[Any]], type_: str = "ok", **extra: Any
    ) -> int:
        self.invoke(process, f, mops, **extra)
        return self.complete(process, type_)

    def final_reads(self, complete: bool = True, by_key: dict[str, bool] | None = None) -> None:
        """The final-read op: ``complete`` for the whole phase, and ``by_key``
        (its value) whether each key's final reads completed."""
        self._line("final", "invoke", "final-reads-complete", None)
        self._line("final", "ok" if complete else "fail", "final-reads-complete", by_key)

    def history(self) -> History:
        return History.from_dicts(json.loads(json.dumps(self.lines)))


def flagged(result: Result) -> set[str]:
    return {name for name, n in result.counts.items() if n}


def counted(result: Result) -> set[str]:
    """Classes found, apart from the informational cycle classes."""
    return flagged(result) - DEFAULT_INFORMATIONAL


def only(result: Result, name: str) -> dict[str, Any]:
    """Assert ``name`` is the only class found, once; return its example.

    The informational cycle classes are not looked at unless named: a consumer
    that lags behind a send makes a G-single with it (see checker._cycles).
    """
    assert flagged(result) - (DEFAULT_INFORMATIONAL - {name}) == {name}, result.summary_table()
    assert result.counts[name] == 1
    (example,) = result.anomalies[name]
    return example


def clean_builder() -> Builder:
    """A small correct history: plain sends, a transaction, consumers, final reads."""
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    b.op(2, "poll", [reads((X, o(1), 1))])
    b.op(0, "send", [send(X, 2, o(2))])
    b.op(1, "txn", [send(Y, 1), send(X, 3)])  # committed at markers y@5, x@7
    b.op(2, "txn", [reads((X, o(2), 2), (X, o(7), 3), (Y, o(5), 1)), send(Y, 2)])
    b.op(3, "txn", [send(X, 4)], "fail")  # aborted: never visible
    b.op(2, "poll", [reads((Y, o(8), 2))])
    b.op(9, "poll", [reads((X, o(1), 1), (X, o(2), 2), (X, o(7), 3), (Y, o(5), 1), (Y, o(8), 2))])
    b.final_reads()
    return b


# -- the clean history ---------------------------------------------------------------


def test_clean_history_is_valid_with_no_anomaly_at_all() -> None:
    result = check(clean_builder().history())
    assert result.valid, result.summary_table()
    assert flagged(result) == set()
    assert result.failures == []
    assert result.final_reads_complete
    assert result.stats["ops"] == 8
    assert (result.stats["ok"], result.stats["fail"]) == (7, 1)
    assert result.stats["sends"] == 6
    assert set(result.anomalies) == set(CLASSES)


def test_every_class_is_in_the_summary_table() -> None:
    table = check(clean_builder().history()).summary_table()
    for name in CLASSES:
        assert name in table
    assert "result: valid" in table


# -- lost-write -----------------------------------------------------------------------


def test_lost_write_a_committed_value_below_a_read_one_that_nobody_read() -> None:
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    w2 = b.op(0, "send", [send(X, 2, o(2))])
    b.op(0, "send", [send(X, 3, o(3))])
    b.op(1, "poll", [reads((X, o(1), 1))])
    r3 = b.op(2, "poll", [reads((X, o(3), 3))])  # a consumer that started at 3
    b.final_reads()
    result = check(b.history())
    example = only(result, "lost-write")
    assert (example["key"], example["value"], example["writer"]) == (X, 2, w2)
    assert example["offset"] == o(2)
    assert example["max_read"] == {"value": 3, "offset": o(3), "reader": r3}
    assert not result.valid and result.failures == ["lost-write"]
    assert result.counts["unseen"] == 0  # reported once, as lost


def test_unread_value_above_every_read_is_not_lost_only_unseen() -> None:
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    w2 = b.op(0, "send", [send(X, 2, o(2))])
    b.op(1, "poll", [reads((X, o(1), 1))])
    b.final_reads()
    example = only(check(b.history()), "unseen")
    assert (example["key"], example["value"], example["writer"]) == (X, 2, w2)


def test_lost_write_ignores_a_failed_writer() -> None:
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    b.invoke(0, "send", [send(X, 2, o(2))])
    b.complete(0, "fail", carry=True)  # did not happen, whatever offset it names
    b.op(2, "send", [send(X, 3, o(3))])
    b.op(1, "poll", [reads((X, o(1), 1), (X, o(3), 3))])
    b.final_reads()
    assert flagged(check(b.history())) == set()


# -- duplicate and inconsistent-offsets -------------------------------------------------


def test_duplicate_one_value_at_two_offsets() -> None:
    b = Builder()
    w = b.op(0, "send", [send(X, 1, o(1))])
    r = b.op(1, "poll", [reads((X, o(1), 1), (X, o(4), 1))])
    b.final_reads()
    example = only(check(b.history()), "duplicate")
    assert (example["key"], example["value"]) == (X, 1)
    assert example["offsets"] == [o(1), o(4)]
    assert example["ops"] == [w, r]


def test_inconsistent_offsets_two_values_at_one_offset() -> None:
    b = Builder()
    w1 = b.op(0, "send", [send(X, 1, o(1))])
    b.op(3, "txn", [send(X, 3)])
    b.op(0, "send", [send(X, 2, o(2))])
    r1 = b.op(1, "poll", [reads((X, o(1), 1), (X, o(2), 2))])
    r2 = b.op(2, "poll", [reads((X, o(1), 3))])
    b.final_reads()
    example = only(check(b.history()), "inconsistent-offsets")
    assert (example["key"], example["offset"], example["values"]) == (X, o(1), [1, 3])
    assert example["ops"] == [w1, r1, r2]


# -- reads that should not be possible -------------------------------------------------


def test_g1a_aborted_read() -> None:
    b = Builder()
    w = b.op(0, "txn", [send(X, 5)], "fail")
    r = b.op(1, "poll", [reads((X, o(3), 5))])
    b.final_reads()
    example = only(check(b.history()), "G1a")
    assert example == {"key": X, "value": 5, "writer": w, "readers": [r]}


def test_g1a_counts_reads_in_an_aborted_transaction_too() -> None:
    b = Builder()
    w = b.op(0, "txn", [send(X, 5)], "fail")
    b.invoke(1, "txn", [reads((X, o(3), 5))])
    r = b.complete(1, "fail", carry=True)
    b.final_reads()
    example = only(check(b.history()), "G1a")
    assert (example["writer"], example["readers"]) == (w, [r])


def test_garbage_read_of_a_value_nobody_sent() -> None:
    b = Builder()
    r = b.op(1, "poll", [reads((X, o(3), 99))])
    b.final_reads()
    example = only(check(b.history()), "garbage-read")
    assert example == {"key": X, "value": 99, "readers": [r]}


def test_precommitted_read_a_transaction_reads_its_own_send() -> None:
    b = Builder()
    t = b.op(0, "txn", [send(X, 5), reads((X, o(3), 5))])
    b.final_reads()
    example = only(check(b.history()), "precommitted-read")
    assert example == {"key": X, "value": 5, "op": t}


# -- poll order within a process ---------------------------------------------------------


def three_sends(b: Builder) -> None:
    for v in (1, 2, 3):
        b.op(0, "send", [send(X, v, o(v))])


def everything_read(b: Builder) -> None:
    b.op(9, "poll", [reads((X, o(1), 1), (X, o(2), 2), (X, o(3), 3))])
    b.final_reads()


def test_poll_skip_between_two_polls_of_one_process() -> None:
    b = Builder()
    three_sends(b)
    p1 = b.op(1, "poll", [reads((X, o(1), 1))])
    p2 = b.op(1, "poll", [reads((X, o(3), 3))])
    everything_read(b)
    example = only(check(b.history()), "poll-skip")
    assert example["key"] == X and example["process"] == 1
    assert example["ops"] == [p1, p2]
    assert example["values"] == [1, 3] and example["skipped"] == [2]
    assert example["delta"] == 2


def test_nonmonotonic_poll_going_back_in_one_process() -> None:
    b = Builder()
    three_sends(b)
    p1 = b.op(1, "poll", [reads((X, o(1), 1), (X, o(2), 2))])
    p2 = b.op(1, "poll", [reads((X, o(2), 2), (X, o(3), 3))])
    everything_read(b)
    example = only(check(b.history()), "nonmonotonic-poll")
    assert (example["key"], example["process"], example["ops"]) == (X, 1, [p1, p2])
    assert example["values"] == [2, 2] and example["delta"] == 0


def test_a_crashed_process_is_replaced_so_rereading_is_fine() -> None:
    b = Builder()
    three_sends(b)
    b.op(1, "poll", [reads((X, o(1), 1), (X, o(2), 2))])
    b.op(1, "txn", [send(Y, 7)], "info")  # crashed (and its send never read)
    b.op(4, "poll", [reads((X, o(1), 1), (X, o(2), 2), (X, o(3), 3))])  # new consumer
    b.final_reads()
    assert counted(check(b.history())) == set()


def test_an_aborted_poll_does_not_move_the_position() -> None:
    b = Builder()
    three_sends(b)
    b.op(1, "poll", [reads((X, o(1), 1))])
    b.invoke(1, "txn", [reads((X, o(2), 2))])
    b.complete(1, "fail", carry=True)
    b.op(1, "txn", [reads((X, o(2), 2), (X, o(3), 3))])  # redelivered after the abort
    b.final_reads()
    assert counted(check(b.history())) == set()


def test_int_poll_skip_within_one_op() -> None:
    b = Builder()
    three_sends(b)
    r = b.op(1, "poll", [reads((X, o(1), 1), (X, o(3), 3))])
    everything_read(b)
    example = only(check(b.history()), "int-poll-skip")
    assert (example["key"], example["ops"], example["values"]) == (X, [r], [1, 3])
    assert example["skipped"] == [2]


def test_int_nonmonotonic_poll_within_one_op() -> None:
    b = Builder()
    three_sends(b)
    r = b.op(1, "poll", [reads((X, o(1), 1), (X, o(2), 2), (X, o(1), 1))])
    everything_read(b)
    example = only(check(b.history()), "int-nonmonotonic-poll")
    assert (example["key"], example["ops"], example["values"]) == (X, [r], [2, 1])
    assert example["delta"] == -1


# -- send order within a process ----------------------------------------------------------


def test_nonmonotonic_send_a_later_send_lands_lower() -> None:
    b = Builder()
    s1 = b.op(0, "send", [send(X, 1, o(5))])
    s2 = b.op(0, "send", [send(X, 2, o(3))])
    b.op(9, "poll", [reads((X, o(3), 2), (X, o(5), 1))])
    b.final_reads()
    example = only(check(b.history()), "nonmonotonic-send")
    assert (example["key"], example["process"], example["ops"]) == (X, 0, [s1, s2])
    assert example["values"] == [1, 2] and example["delta"] == -1


def test_nonmonotonic_send_places_transactional_sends_by_where_they_were_read() -> None:
    b = Builder()
    t1 = b.op(0, "txn", [send(X, 1)])
    t2 = b.op(0, "txn", [send(X, 2)])
    b.op(9, "poll", [reads((X, o(3), 2), (X, o(5), 1))])
    b.final_reads()
    example = only(check(b.history()), "nonmonotonic-send")
    assert example["ops"] == [t1, t2]


def test_int_nonmonotonic_send_within_one_op() -> None:
    b = Builder()
    s = b.op(0, "send", [send(X, 1, o(5)), send(X, 2, o(3))])
    b.op(9, "poll", [reads((X, o(3), 2), (X, o(5), 1))])
    b.final_reads()
    example = only(check(b.history()), "int-nonmonotonic-send")
    assert (example["key"], example["ops"], example["values"]) == (X, [s], [1, 2])


# -- redelivered ------------------------------------------------------------------------


def test_redelivered_a_message_a_committed_transaction_acknowledged_comes_again() -> None:
    b = Builder()
    three_sends(b)
    t = b.op(1, "txn", [reads((X, o(1), 1), (X, o(2), 2))], worker=2)  # acked, committed
    b.op(1, "txn", [send(Y, 7)], "info", worker=2)  # crashed: a new process goes on
    r = b.op(4, "poll", [reads((X, o(1), 1), (X, o(2), 2), (X, o(3), 3))], worker=2)
    everything_read(b)
    result = check(b.history())
    assert not result.valid and result.failures == ["redelivered"], result.summary_table()
    assert result.counts["redelivered"] == 2
    first = result.anomalies["redelivered"][0]
    assert first == {
        "key": X,
        "worker": 2,
        "value": 1,
        "offset": [1, 0],
        "ops": [t, r],
        "acked_by": "txn",
        "type": "ok",
    }


def test_redelivered_counts_an_ok_plain_poll_as_acknowledged_and_any_later_delivery() -> None:
    b = Builder()
    three_sends(b)
    p = b.op(1, "poll", [reads((X, o(1), 1))], worker=0)
    b.op(1, "txn", [send(Y, 7)], "info", worker=0)
    b.invoke(5, "txn", [reads((X, o(1), 1), (X, o(2), 2))], worker=0)
    r = b.complete(5, "fail", carry=True)  # (an aborted op's reads were delivered too)
    everything_read(b)
    example = only(check(b.history()), "redelivered")
    assert (example["ops"], example["acked_by"], example["type"]) == ([p, r], "poll", "fail")


def test_what_an_aborted_or_crashed_op_read_may_come_again_and_so_may_another_workers() -> None:
    b = Builder()
    three_sends(b)
    b.invoke(1, "txn", [reads((X, o(1), 1))], worker=0)
    b.complete(1, "fail", carry=True)  # aborted: its ack was undone
    b.op(1, "txn", [reads((X, o(1), 1))], "info", worker=0)  # outcome unknown
    b.op(4, "poll", [reads((X, o(1), 1), (X, o(2), 2))], worker=0)
    b.op(5, "poll", [reads((X, o(1), 1), (X, o(2), 2), (X, o(3), 3))], worker=1)  # its own
    b.op(4, "poll", [reads((X, o(3), 3))], worker=0)
    b.final_reads()
    assert counted(check(b.history())) == set()


def test_redelivered_takes_an_ops_worker_from_its_process_when_it_names_none() -> None:
    b = Builder()
    three_sends(b)
    p = b.op(1, "poll", [reads((X, o(1), 1))])  # (names no worker: process 1's is 3)
    b.op(1, "txn", [send(Y, 7)], "info", worker=3)
    r = b.op(4, "poll", [reads((X, o(1), 1))], worker=3)
    b.op(6, "poll", [reads((X, o(1), 1))])  # no worker known: not judged
    everything_read(b)
    example = only(check(b.history()), "redelivered")
    assert (example["worker"], example["ops"]) == (3, [p, r])


# -- unseen -----------------------------------------------------------------------------


def unseen_builder() -> tuple[Builder, int]:
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    t = b.op(1, "txn", [send(Y, 7)])
    b.op(2, "poll", [reads((X, o(1), 1))])
    return b, t


def test_unseen_counts_once_the_final_reads_completed() -> None:
    b, t = unseen_builder()
    b.final_reads(complete=True)
    result = check(b.history())
    example = only(result, "unseen")
    assert example == {"key": Y, "value": 7, "writer": t}
    assert not result.valid and result.failures == ["unseen"]
    assert "unseen" not in result.informational
    assert result.summary_table().endswith("result: INVALID: unseen")
    report = json.loads(json.dumps(result.to_dict()))
    assert report["failures"] == ["unseen"] and report["anomalies"] == {"unseen": [example]}


def test_unseen_is_informational_in_a_history_without_final_reads() -> None:
    b, _ = unseen_builder()
    result = check(b.history())
    assert only(result, "unseen")["value"] == 7
    assert result.valid and "unseen" in result.informational
    assert not result.final_reads_complete and result.incomplete_keys == []
    assert "(informational)" in result.summary_table()


def test_a_final_read_phase_that_stopped_short_makes_an_unread_send_an_incomplete_read() -> None:
    """A final-read op ``fail`` with no per-key value: no key was read to its
    end, so an acknowledged send never read is an incomplete-read, which
    the result counts (it cannot say valid)."""
    b, t = unseen_builder()
    b.final_reads(complete=False)
    result = check(b.history())
    assert only(result, "incomplete-read") == {"key": Y, "value": 7, "writer": t}
    assert not result.valid and result.failures == ["incomplete-read"]
    assert "unseen" not in result.informational
    assert result.incomplete_keys == [X, Y]
    table = result.summary_table()
    assert re.search(r"^  keys read short +2$", table, re.M)
    assert table.endswith("result: INVALID: incomplete-read")


def test_unseen_is_judged_per_key_by_whether_that_keys_final_reads_completed() -> None:
    """The final reads completed on X and stopped short on Y: X's unread
    acknowledged send is unseen and Y's an incomplete-read, both counted;
    a key the op does not name goes as the whole phase (fail: short)."""
    Z = "orders/2"
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    tx = b.op(1, "txn", [send(X, 2)])
    ty = b.op(1, "txn", [send(Y, 7)])
    tz = b.op(1, "send", [send(Z, 3, o(4))])
    b.op(2, "poll", [reads((X, o(1), 1))])
    b.final_reads(complete=False, by_key={X: True, Y: False})
    result = check(b.history())
    assert result.anomalies["unseen"] == [{"key": X, "value": 2, "writer": tx}]
    assert result.anomalies["incomplete-read"] == [
        {"key": Y, "value": 7, "writer": ty},
        {"key": Z, "value": 3, "writer": tz},
    ]
    assert not result.valid and result.failures == ["unseen", "incomplete-read"]
    assert result.incomplete_keys == [Y, Z] and not result.final_reads_complete
    assert result.to_dict()["incomplete_keys"] == [Y, Z]


def test_a_key_read_to_its_end_is_valid_though_another_key_stopped_short() -> None:
    """Every acknowledged send was read; Y's reads stopped short (e.g. on a
    value sent by a transaction whose outcome is unknown): valid, and the
    summary says the final reads were incomplete."""
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    b.op(1, "txn", [send(Y, 7)], "info")
    b.op(2, "poll", [reads((X, o(1), 1))])
    b.final_reads(complete=False, by_key={X: True, Y: False})
    result = check(b.history())
    assert result.valid and flagged(result) == set(), result.summary_table()
    assert result.incomplete_keys == [Y]
    assert re.search(r"^final reads complete +no$", result.summary_table(), re.M)


def test_a_null_info_completion_still_names_what_it_sent() -> None:
    b = Builder()
    b.invoke(1, "txn", [send(X, 7), send(Y, 8)])
    b.lines.append({**b.lines[-1], "index": 1, "type": "info", "value": None})
    b.open.clear()
    b.op(2, "poll", [reads((X, o(1), 7))])
    b.final_reads()
    history = b.history()
    history.validate()
    result = check(history)
    # 7 was read, so the info transaction committed: 8 is never read, but an
    # info send is not acknowledged, so it is not unseen; 7 is no garbage read.
    assert counted(result) == set()
    assert result.stats["info"] == 1 and result.stats["sends"] == 2


def test_info_sends_are_never_unseen() -> None:
    b = Builder()
    b.op(1, "txn", [send(Y, 7)], "info")
    b.final_reads()
    assert flagged(check(b.history())) == set()


# -- cycles ------------------------------------------------------------------------------


def test_g0_write_cycle_is_reported_but_informational() -> None:
    b = Builder()
    b.invoke(1, "txn", [send(X, 1), send(Y, 2)])
    b.invoke(2, "txn", [send(X, 2), send(Y, 1)])
    t1 = b.complete(1)
    t2 = b.complete(2)
    b.op(9, "poll", [reads((X, o(1), 1), (X, o(2), 2), (Y, o(1), 1), (Y, o(2), 2))])
    b.final_reads()
    history = b.history()
    result = check(history)
    example = only(result, "G0")
    assert result.valid and result.failures == []
    assert sorted(example["cycle"]) == sorted([t1, t2])
    assert example["variant"] == "G0"
    steps = {(s["from"], s["to"]): s for s in example["steps"]}
    assert steps[(t1, t2)] == {
        "from": t1,
        "to": t2,
        "type": "ww",
        "key": X,
        "value": 1,
        "next_value": 2,
    }
    assert steps[(t2, t1)]["key"] == Y and steps[(t2, t1)]["type"] == "ww"
    strict = check(history, informational=frozenset())
    assert not strict.valid and strict.failures == ["G0"]


def test_g1c_circular_information_flow() -> None:
    b = Builder()
    b.op(0, "send", [send(X, 0, o(1))])
    b.op(0, "send", [send(Y, 0, o(1))])
    b.invoke(1, "txn", [send(X, 1), reads((Y, o(2), 1))])
    b.invoke(2, "txn", [send(Y, 1), reads((X, o(2), 1))])
    t1 = b.complete(1)
    t2 = b.complete(2)
    b.op(9, "poll", [reads((X, o(1), 0), (X, o(2), 1), (Y, o(1), 0), (Y, o(2), 1))])
    b.final_reads()
    result = check(b.history())
    example = only(result, "G1c")
    assert not result.valid and result.failures == ["G1c"]
    assert sorted(example["cycle"]) == sorted([t1, t2])
    assert example["variant"] == "G1c"
    steps = {(s["from"], s["to"]): s for s in example["steps"]}
    assert steps[(t1, t2)] == {"from": t1, "to": t2, "type": "wr", "key": X, "value": 1}
    assert steps[(t2, t1)] == {"from": t2, "to": t1, "type": "wr", "key": Y, "value": 1}


def test_g1c_realtime_a_value_read_before_its_send_was_invoked() -> None:
    b = Builder()
    r = b.op(1, "poll", [reads((X, o(1), 1))])
    between = b.op(3, "poll", [])  # realtime edges are transitively reduced
    w = b.op(0, "send", [send(X, 1, o(1))])
    b.final_reads()
    example = only(check(b.history()), "G1c")
    assert example["variant"] == "G1c-realtime"
    assert example["cycle"] == [w, r, between]
    types = [(s["from"], s["to"], s["type"]) for s in example["steps"]]
    assert types == [(w, r, "wr"), (r, between, "realtime"), (between, w, "realtime")]


def test_g1c_process_variant() -> None:
    b = Builder()
    r = b.op(1, "poll", [reads((X, o(1), 1))])
    w = b.op(1, "send", [send(X, 1, o(1))])
    b.final_reads()
    example = only(check(b.history()), "G1c")
    assert example["variant"] == "G1c-process"
    assert {(s["from"], s["to"], s["type"]) for s in example["steps"]} == {
        (w, r, "wr"),
        (r, w, "process"),
    }


def test_interleaved_writes_with_a_read_are_not_g1c() -> None:
    # T1 sends x first, T2 sends x after it and y, T1 reads T2's y: a ww + wr
    # cycle, normal when offsets are assigned as messages land.
    b = Builder()
    b.invoke(1, "txn", [send(X, 1), reads((Y, o(1), 1))])
    b.invoke(2, "txn", [send(X, 2), send(Y, 1)])
    b.complete(2)
    b.complete(1)
    b.op(9, "poll", [reads((X, o(1), 1), (X, o(2), 2), (Y, o(1), 1))])
    b.final_reads()
    result = check(b.history())
    assert flagged(result) == set() and result.valid


def test_g_single_one_anti_dependency_is_informational() -> None:
    b = Builder()
    b.op(0, "send", [send(X, 1, o(1))])
    b.invoke(1, "txn", [reads((X, o(1), 1)), reads((Y, o(1), 1))])
    b.invoke(2, "txn", [send(X, 2), send(Y, 1)])
    t2 = b.complete(2)
    t1 = b.complete(1)
    b.op(9, "poll", [reads((X, o(1), 1), (X, o(2), 2), (Y, o(1), 1))])
    b.final_reads()
    history = b.history()
    result = check(history)
    example = only(result, "G-single")
    assert result.valid
    assert sorted(example["cycle"]) == sorted([t1, t2])
    kinds = [s["type"] for s in example["steps"]]
    assert kinds.count("rw") == 1 and kinds.count("wr") == 1
    (rw,) = [s for s in example["steps"] if s["type"] == "rw"]
    assert rw == {"from": t1, "to": t2, "type": "rw", "key": X, "value": 1, "next_value": 2}
    assert check(history, informational=frozenset()).failures == ["G-single"]


def test_cycles_can_be_skipped() -> None:
    b = Builder()
    b.op(1, "poll", [reads((X, o(1), 1))])
    b.op(0, "send", [send(X, 1, o(1))])
    b.final_reads()
    assert check(b.history(), cycles=False).valid
    assert not check(b.history()).valid


def test_check_rejects_unknown_informational_classes() -> None:
    with pytest.raises(ValueError, match="G9"):
        check(clean_builder().history(), informational=frozenset({"G9"}))


# -- the history format ------------------------------------------------------------------


def test_jsonl_round_trip(tmp_path: Path) -> None:
    history = clean_builder().history()
    history.ops[3].extra["error"] = "timeout"
    path = tmp_path / "h.jsonl"
    history.save(path)
    lines = path.read_text().splitlines()
    assert len(lines) == len(history)
    assert json.loads(lines[0]) == history[0].to_dict()
    again = History.load(path)
    assert [op.to_dict() for op in again] == [op.to_dict() for op in history]
    assert again[3].extra == {"error": "timeout"}
    assert History.loads(history.dumps()).dumps() == history.dumps()
    assert check(again).valid


def test_pairs_and_a_pending_invoke_counts_as_info() -> None:
    b = clean_builder()
    b.invoke(5, "txn", [send(Y, 9)])  # never completed
    history = b.history()
    history.validate()
    pairs = list(history.pairs())
    assert len(pairs) == 10
    assert pairs[-1][1] is None
    inv, comp = pairs[0]
    assert comp is not None and history.completion(inv) is comp and history.invocation(comp) is inv
    result = check(history)
    assert result.stats["info"] == 1 and result.stats["pending"] == 1
    assert result.valid  # an info send is not unseen


def broken(mutate: Callable[[list[dict[str, Any]]], None]) -> str:
    """The validation problems of the clean history after ``mutate``."""
    lines: list[dict[str, Any]] = json.loads(json.dumps(clean_builder().lines))
    mutate(lines)
    with pytest.raises(HistoryError) as info:
        History.from_dicts(lines).validate()
    return "\n".join(info.value.problems)


def test_validation_completion_without_invoke() -> None:
    def drop_invoke(lines: list[dict[str, Any]]) -> None:
        del lines[0]
        for i, line in enumerate(lines):
            line["index"] = i

    assert "completion without an open invoke" in broken(drop_invoke)


def test_validation_process_is_single_threaded() -> None:
    b = Builder()  # process 0 invokes twice before completing
    b.invoke(0, "send", [send(X, 1, o(1))])
    b.open.clear()
    b.invoke(0, "send", [send(X, 2, o(2))])
    with pytest.raises(HistoryError, match="single-threaded"):
        b.history().validate()


def test_validation_index_time_and_f() -> None:
    def bad_index(lines: list[dict[str, Any]]) -> None:
        lines[2]["index"] = 7

    def time_goes_back(lines: list[dict[str, Any]]) -> None:
        lines[4]["time"] = 0

    def other_f(lines: list[dict[str, Any]]) -> None:
        lines[1]["f"] = "txn"

    assert "index 7 at position 2" in broken(bad_index)
    assert "goes back" in broken(time_goes_back)
    assert "completes invoke 0 of f 'send' with f 'txn'" in broken(other_f)


def test_validation_process_reused_after_a_crash() -> None:
    b = Builder()
    b.op(1, "txn", [send(X, 1)], "info")
    b.op(1, "poll", [reads((X, o(1), 1))])
    with pytest.raises(HistoryError, match="new process id after a crash"):
        b.history().validate()
    with pytest.raises(HistoryError):
        check(b.history())


def test_validation_values_unique_per_key() -> None:
    b = Builder()
    b.op(1, "send", [send(X, 1, o(1))])
    b.op(2, "txn", [send(X, 1)], "fail")
    b.op(2, "txn", [send(Y, 1)])  # the same value on another key is fine
    with pytest.raises(HistoryError) as info:
        b.history().validate()
    assert len(info.value.problems) == 1
    assert "value 1 sent to 'orders/0' again (first by op 0)" in info.value.problems[0]


def test_validation_final_reads_value() -> None:
    def per_key(value: Any) -> Callable[[list[dict[str, Any]]], None]:
        def mutate(lines: list[dict[str, Any]]) -> None:
            lines[-1]["value"] = value

        return mutate

    assert "must be null or {key: true or false}" in broken(per_key({"orders/0": "yes"}))
    assert "must be null or {key: true or false}" in broken(per_key([True]))
    fine = json.loads(json.dumps(clean_builder().lines))
    fine[-1]["value"] = {X: True, Y: True}
    History.from_dicts(fine).validate()


def test_recorder_records_whether_each_keys_final_reads_completed() -> None:
    stream = io.StringIO()
    with Recorder(stream) as rec:
        rec.final_reads({Y: True, X: False})
    last = json.loads(stream.getvalue().splitlines()[-1])
    assert (last["type"], last["value"]) == ("fail", {X: False, Y: True})
    stream = io.StringIO()
    with Recorder(stream) as rec:
        rec.final_reads({X: True})
    assert json.loads(stream.getvalue().splitlines()[-1])["type"] == "ok"


def test_validation_micro_ops() -> None:
    def bad_read(lines: list[dict[str, Any]]) -> None:
        lines[7]["value"] = [["poll", {X: [[None, 1]]}]]

    def bad_mop(lines: list[dict[str, Any]]) -> None:
        lines[0]["value"] = [["append", X, 1]]

    def send_differs(lines: list[dict[str, Any]]) -> None:
        lines[1]["value"] = [send(X, 5, o(1))]

    def string_value(lines: list[dict[str, Any]]) -> None:
        lines[0]["value"] = [["send", X, "1"]]

    assert "with a known offset" in broken(bad_read)
    assert "must be ['send', key, value] or ['poll', ...]" in broken(bad_mop)
    assert "differ from invoke 0" in broken(send_differs)
    assert "must be an int" in broken(string_value)


def test_malformed_lines_fail_to_load() -> None:
    with pytest.raises(HistoryError, match="not JSON"):
        History.loads('{"index": 0,\n')
    with pytest.raises(HistoryError, match="'type' must be one of"):
        History.loads('{"index": 0, "time": 0, "process": 1, "type": "done", "f": "txn"}\n')
    with pytest.raises(HistoryError, match="'process' must be"):
        History.loads('{"index": 0, "time": 0, "process": [1], "type": "ok", "f": "txn"}\n')


def test_entry_id_minus_one_is_an_unknown_offset() -> None:
    b = Builder()
    b.op(0, "txn", [["send", X, [[-1, 0], 5]]])
    b.op(1, "poll", [reads((X, o(9), 5))])
    b.final_reads()
    # read as a known offset, [-1, 0] would put 5 at two offsets: a duplicate
    assert flagged(check(b.history())) == set()


# -- the recorder -------------------------------------------------------------------------


def test_recorder_writes_a_valid_history_as_it_goes(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with Recorder(path) as rec:
        op = rec.invoke(0, "send", [["send", X, 1]])
        assert len(path.read_text().splitlines()) == 1  # flushed at once
        done = rec.complete(op, "ok", [send(X, 1, o(1))], error=None)
        t = rec.invoke(1, "txn", [["send", X, 2], ["poll"]])
        rec.complete(t, "fail")  # value defaults to the invoke's
        r = rec.invoke(2, "poll", [["poll"]])
        rec.complete(r, "ok", [reads((X, o(1), 1))])
        rec.final_reads(complete=True)
    history = History.load(path)
    assert [op.index for op in history] == list(range(8))
    assert [op.time for op in history] == sorted(op.time for op in history)
    assert history[1].extra == {"error": None}
    assert history[3].value == [["send", X, 2], ["poll"]]
    assert done.index == 1 and done.type == "ok"
    assert [op.to_dict() for op in rec.history()] == [op.to_dict() for op in history]
    result = check(history)
    assert result.valid and flagged(result) == set() and result.final_reads_complete


def test_recorder_refuses_what_validation_would() -> None:
    rec = Recorder(io.StringIO())
    op = rec.invoke(0, "poll", [["poll"]])
    with pytest.raises(RuntimeError, match="already has op 0 open"):
        rec.invoke(0, "poll", [["poll"]])
    rec.complete(op, "ok", [["poll", {}]])
    with pytest.raises(RuntimeError, match="not open"):
        rec.complete(op, "ok")
    other = rec.invoke(1, "poll", [["poll"]])
    with pytest.raises(ValueError, match="completion type"):
        rec.complete(other, "done")
    keepless = Recorder(io.StringIO(), keep=False)
    with pytest.raises(RuntimeError, match="keep"):
        keepless.history()


def test_recorder_is_thread_safe() -> None:
    stream = io.StringIO()
    rec = Recorder(stream)

    def worker(process: int) -> None:
        for i in range(200):
            op = rec.invoke(process, "send", [["send", f"t/{process}", i]])
            rec.complete(op, "ok", [send(f"t/{process}", i, o(i))])

    threads = [threading.Thread(target=worker, args=(p,)) for p in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    history = History.loads(stream.getvalue())
    history.validate()
    assert len(history) == 8 * 200 * 2
    assert check(history).counts["unseen"] == 8 * 200  # never read, reported


# -- simulated brokers --------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_simulated_correct_broker_has_no_anomaly(seed: int) -> None:
    history = synthetic_history(1500, seed=seed, p_crash=0.03)
    result = check(History.loads(history.dumps()))
    assert result.valid, result.summary_table()
    assert result.failures == []
    assert result.final_reads_complete
    assert result.stats["fail"] > 0 and result.stats["info"] > 0


def test_simulated_async_markers_break_only_send_order() -> None:
    # txnbuf's coordinator answers a commit before it writes the markers: the
    # checker must not mistake that for G1c, lost writes or skipped polls.
    # A process's next send can then overtake its previous transaction's
    # messages: that is a nonmonotonic send, and must be reported.
    write_cycles = send_reorders = 0
    for seed in range(3):
        result = check(synthetic_history(1500, seed=seed, async_markers=True))
        assert set(result.failures) <= {"nonmonotonic-send"}, result.summary_table()
        write_cycles += result.counts["G0"]
        send_reorders += result.counts["nonmonotonic-send"]
    assert write_cycles > 0  # concurrent commits interleave
    assert send_reorders > 0


def _without(history: History, key: str, value: int) -> History:
    """``history`` with ``value`` of ``key`` taken out of every poll result."""

    def strip(mop: list[Any]) -> list[Any]:
        if mop[0] != "poll" or len(mop) == 1:
            return mop
        kept = {k: [p for p in ps if (k, p[1]) != (key, value)] for k, ps in mop[1].items()}
        return ["poll", kept]

    lines = []
    for op in history:
        d = op.to_dict()
        if op.type != "invoke" and op.f in ("txn", "poll"):
            d["value"] = [strip(m) for m in op.value]
        lines.append(d)
    return History.from_dicts(lines)


def test_a_value_dropped_from_every_read_is_caught() -> None:
    history = synthetic_history(1000, seed=5)
    assert check(history).valid
    sent = [
        (mop[1], mop[2][1])
        for op in history
        if op.type == "ok" and op.f in ("txn", "send")
        for mop in op.value
        if mop[0] == "send"
    ]
    rng = random.Random(5)
    for key, value in rng.sample(sent, 8):
        result = check(_without(history, key, value))
        assert not result.valid
        # consumers skipped it; nobody read it
        assert {"poll-skip", "int-poll-skip", "lost-write", "unseen"} & set(result.failures)


def test_op_dict_round_trip_keeps_extras() -> None:
    op = Op(3, 7, "p", "info", "txn", [["poll"]], {"error": "timeout"})
    assert Op.from_dict(op.to_dict()) == op


def test_a_write_cycle_through_a_duplicate_is_explained() -> None:
    b = Builder()
    b.invoke(1, "txn", [send(X, 1), send(Y, 2)])
    b.invoke(2, "txn", [send(X, 2), send(Y, 1)])
    t1 = b.complete(1)
    t2 = b.complete(2)
    # x: 1 @1, 0 @2 (nobody sent it), 1 again @3, 2 @4 -- so t1 -ww-> t2 only
    # through the duplicate's second place; y: 1 @1, 2 @2, so t2 -ww-> t1.
    x = [(X, o(1), 1), (X, o(2), 0), (X, o(3), 1), (X, o(4), 2)]
    b.op(9, "poll", [reads(*x, (Y, o(1), 1), (Y, o(2), 2))])
    b.final_reads()
    result = check(b.history())
    assert counted(result) == {"duplicate", "garbage-read"}
    (cycle,) = result.anomalies["G0"]
    steps = {(s["from"], s["to"]): s for s in cycle["steps"]}
    assert steps[(t1, t2)] == {
        "from": t1,
        "to": t2,
        "type": "ww",
        "key": X,
        "value": 1,
        "next_value": 2,
    }
    assert steps[(t2, t1)]["key"] == Y


def test_cluster_layout_spreads_the_keys_over_the_brokers_other_than_the_coordinators() -> None:
    """`transaction_layout` in a cluster: the coordinator's slot holds no
    key, no key starts on the coordinator's broker, and the keys take the
    other brokers in turn; one broker keeps ``q0``, ``q1``, ..."""
    from checker._workload import transaction_layout
    from client._brokers import slot_of

    slots = 16
    owners = [("a", "b", "c")[k % 3] for k in range(slots)]
    topics, near = transaction_layout(4, slots, "x1", owners)
    assert near is not None and near not in topics and len(set(topics)) == 4
    home = owners[slot_of(near, slots)]
    where = [owners[slot_of(t, slots)] for t in topics]
    assert home not in where
    assert len(set(where)) == 2 and where[0] != where[1] and where[0] == where[2]
    assert slot_of(near, slots) not in {slot_of(t, slots) for t in topics}
    assert transaction_layout(2, 0, "x1") == (["q0", "q1"], None)


def test_a_doubtful_transaction_counts_as_ended_once_every_participant_applied_it() -> None:
    """`_Shared._end_at` (the workload making sure a previous process's
    transaction ended before a new process reads): an abort answered 409
    (ended, or ending, already) or 200 while the transaction is ABORTING (a
    participant on another broker has not applied it yet) is not done; it
    is once the status is ABORTED; 404 is unknown. (A fake admin API: a
    unit test of the workload's side.)"""
    import http.server

    from checker._workload import _Shared

    statuses = ["ABORTING", "ABORTING", "ABORTED"]
    asked: list[str] = []

    class Admin(http.server.BaseHTTPRequestHandler):
        def answer(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            asked.append(f"POST {self.path}")
            if "/gone/" in self.path:
                self.answer(404, {"error": "no transaction"})
            elif len(asked) == 1:
                self.answer(200, {"status": statuses[0]})
            else:
                self.answer(409, {"error": "ended already"})

        def do_GET(self) -> None:
            asked.append(f"GET {self.path}")
            self.answer(200, {"status": statuses.pop(0)})

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Admin)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        shared = _Shared.__new__(_Shared)
        shared._admin_headers = {}
        base = f"http://127.0.0.1:{server.server_address[1]}"
        txnid = "(1,2)"
        assert shared._end_at(base, txnid, abort=True) == "again"  # 200, ABORTING
        assert shared._end_at(base, txnid, abort=True) == "again"  # 409, then ABORTING
        assert shared._end_at(base, txnid, abort=True) == "done"  # 409, then ABORTED
        assert shared._end_at(base, "gone/x", abort=True) == "unknown"
        assert [a.split()[0] for a in asked] == ["POST", "GET"] * 3 + ["POST"]
    finally:
        server.shutdown()
        server.server_close()


def test_check_pause_range_is_parsed_or_refused_naming_what_was_wrong(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``txnbuf check --pause MIN,MAX``: every pause's length drawn from
    that range (e.g. past the lease); bad input refused by name."""
    import argparse

    from checker._cli import add_check_parser

    parser = argparse.ArgumentParser(prog="txnbuf")
    add_check_parser(parser.add_subparsers(dest="command"))
    assert parser.parse_args(["check", "--pause", "2.5,5"]).pause == (2.5, 5.0)
    assert parser.parse_args(["check"]).pause is None
    for bad in ("5", "5,2", "a,b", "-1,2"):
        with pytest.raises(SystemExit):
            parser.parse_args(["check", "--pause", bad])
        assert "--pause" in capsys.readouterr().err
