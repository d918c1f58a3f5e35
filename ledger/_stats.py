"""Counts of observed values in buckets, for the store's own figures.

Plain numbers (this package imports nothing of ours and no metrics
library): the broker reads them at scrape time and shows them as
Prometheus histograms (`broker._metrics`).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["COMMIT_SECONDS_BOUNDS", "COMMIT_SIZE_BOUNDS", "Buckets"]

# Upper bounds of the buckets of a group commit's duration (seconds) and size (appends).
COMMIT_SECONDS_BOUNDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
)
COMMIT_SIZE_BOUNDS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class Buckets:
    """How many observed values fell at or below each bound (not
    cumulative: ``counts[i]`` is the values in ``(bounds[i-1], bounds[i]]``,
    ``counts[-1]`` those above the last bound), their count and sum."""

    __slots__ = ("bounds", "count", "counts", "sum")

    def __init__(self, bounds: Sequence[float]) -> None:
        if list(bounds) != sorted(set(bounds)):
            raise ValueError(f"bucket bounds must increase: {bounds!r}")
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.count += 1
        self.sum += value

    def cumulative(self) -> list[tuple[float, int]]:
        """``(bound, values at or below it)`` for each bound, then ``(inf, count)``."""
        out: list[tuple[float, int]] = []
        total = 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts, strict=True):
            total += n
            out.append((bound, total))
        return out
