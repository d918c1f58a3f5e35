"""Names of topics, partitions and subscriptions, and message ids."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "MAX_PARTITIONS",
    "InvalidNameError",
    "MessageId",
    "Position",
    "check_subscription_name",
    "check_topic_name",
]

MAX_PARTITIONS = 1024

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

# A message's place in one partition: (entry id, batch index).
Position = tuple[int, int]


class InvalidNameError(ValueError):
    """A topic or subscription name breaks the naming rule."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _check(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise InvalidNameError(
            kind,
            f"invalid {kind} name {name!r}: use 1-200 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit",
        )
    return name


def check_topic_name(name: str) -> str:
    """Return ``name`` if it is a legal topic name, else raise `InvalidNameError`."""
    return _check("topic", name)


def check_subscription_name(name: str) -> str:
    """Return ``name`` if it is a legal subscription name, else raise `InvalidNameError`."""
    return _check("subscription", name)


@dataclass(frozen=True, slots=True, order=True)
class MessageId:
    """(partition, entry id, batch index): where a message sits in its topic."""

    partition: int
    entry_id: int
    batch_index: int

    @property
    def position(self) -> Position:
        return (self.entry_id, self.batch_index)

    def __str__(self) -> str:
        return f"{self.partition}:{self.entry_id}:{self.batch_index}"
