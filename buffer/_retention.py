"""Retention: how much of a partition's acknowledged data is kept for replay.

A partition is trimmed only below the first entry that some subscription has
not fully acknowledged (`subscriptions.Subscriptions`); a topic's
`Retention` keeps some of what lies below that too, so that a new
``earliest`` subscription, or one reset to an earlier position, reads it
again. As in Pulsar and Kafka, acknowledged entries go once either limit is
passed: older than ``time_s`` seconds, or beyond the newest ``size_bytes``
bytes of acknowledged entries. -1 means no limit; 0 keeps nothing (the
default: acknowledged data is trimmed at once).

An entry's age is its first message's ``publish_time_ms`` (the producer's
clock, as Pulsar's reset by time uses it; a commit marker's is its
transaction's first message's). Sizes are those of the partition ledger's
entries: a committed transaction counts as its commit marker, its messages
staying in its transaction log as long as the marker does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["NO_RETENTION", "Retention", "RetentionError"]


class RetentionError(ValueError):
    """A retention setting that is not one; nothing changed."""


def _limit(body: dict[str, Any], field: str) -> float:
    value = body.get(field, -1)
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or (value < 0 and value != -1)
    ):
        raise RetentionError(
            f"retention {field} must be a number >= 0, or -1 for no limit, not {value!r}"
        )
    return value


@dataclass(frozen=True, slots=True)
class Retention:
    time_s: float = 0
    size_bytes: int = 0

    @property
    def keeps_nothing(self) -> bool:
        return self.time_s == 0 or self.size_bytes == 0

    def to_json(self) -> dict[str, Any]:
        return {"time_s": self.time_s, "size_bytes": self.size_bytes}

    @classmethod
    def from_json(cls, body: object) -> Retention:
        """``{"time_s": T, "size_bytes": S}``: a field left out has no limit
        (at least one must be given); None is the default, no retention."""
        if body is None:
            return NO_RETENTION
        if not isinstance(body, dict):
            raise RetentionError(
                'retention must be an object such as {"time_s": 3600, "size_bytes": 1000000} '
                "or null"
            )
        unknown = set(body) - {"time_s", "size_bytes"}
        if unknown:
            raise RetentionError(f"unknown retention field(s): {', '.join(sorted(unknown))}")
        if not body:
            raise RetentionError("retention needs time_s, size_bytes or both")
        size = _limit(body, "size_bytes")
        if size != int(size):
            raise RetentionError(f"retention size_bytes must be a whole number, not {size!r}")
        return cls(time_s=_limit(body, "time_s"), size_bytes=int(size))


NO_RETENTION = Retention()
