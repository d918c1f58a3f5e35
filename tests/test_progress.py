"""What `txnbuf check` and the benchmarks say besides their tables: the
legend under the checker's summary, and the benchmarks' progress."""

from __future__ import annotations

import pytest

from bench._progress import Runs, legend
from checker import CLASSES, DEFAULT_INFORMATIONAL, Result, check
from checker._check import LEGEND
from checker._check import legend as check_legend
from checker.synthetic import synthetic_history


def test_the_checker_legend_explains_the_words_and_names_what_it_found() -> None:
    for word in ("ok / fail / info", "(informational)", "G-single", "ANOMALY", "unseen"):
        assert word in LEGEND
    clean = check(synthetic_history(200, seed=1))
    named = [name for name in CLASSES if f"\n  {name}: " in check_legend(clean)]
    assert clean.valid and named == [name for name in CLASSES if clean.counts[name]]
    counts = dict.fromkeys(CLASSES, 0) | {"G-single": 2, "lost-write": 1}
    found = Result(False, {}, counts, DEFAULT_INFORMATIONAL, True)
    text = check_legend(found)
    assert text.startswith(LEGEND)
    assert text.endswith(
        f"found:\n  lost-write: {CLASSES['lost-write']}\n  G-single: {CLASSES['G-single']}"
    )


def test_benchmark_runs_report_each_result_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    with Runs(2, "demo") as runs:
        runs.start("first")
        runs.done("12 msgs/s")
        runs.start("second")
        runs.done()
    legend("a: what a means")
    out, err = capsys.readouterr()
    assert "first: 12 msgs/s" in err and "demo 2/2" in err
    assert out == "\na: what a means\n"
