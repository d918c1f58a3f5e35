"""Progress of a benchmark while it runs (tqdm bars on stderr), and the
legend printed under its table: what each column means.

`Runs` counts a benchmark's runs (cases, rounds, sides) and names the one
under way; `counter` is a bar for a count within a run (messages). The
figures themselves go to stdout as before.
"""

from __future__ import annotations

import sys
from types import TracebackType
from typing import Never

from tqdm import tqdm

__all__ = ["Runs", "counter", "legend"]


class Runs:
    """``with Runs(total, "what") as runs:`` then ``runs.start(label)``
    before each run and ``runs.done(result)`` after it."""

    def __init__(self, total: int, what: str) -> None:
        self._bar: tqdm[Never] = tqdm(
            total=total,
            desc=what,
            unit="run",
            file=sys.stderr,
            bar_format="{desc} {n_fmt}/{total_fmt} |{bar:20}| {elapsed}<{remaining}{postfix}",
        )

    def start(self, label: str) -> None:
        self._bar.set_postfix_str(label)

    def done(self, result: str = "") -> None:
        if result:
            self._bar.write(f"  {self._bar.postfix}: {result}", file=sys.stderr)
        self._bar.update()

    def __enter__(self) -> Runs:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.close()


def counter(total: int, what: str, unit: str = "msg") -> tqdm[Never]:
    """A bar of ``total`` ``unit``s (``update(n)`` as they go; close it)."""
    return tqdm(
        total=total,
        desc=what,
        unit=unit,
        unit_scale=True,
        leave=False,
        file=sys.stderr,
        mininterval=0.5,
    )


def legend(*lines: str) -> None:
    """Print what the table's columns mean, under it."""
    print()
    for line in lines:
        print(line)
