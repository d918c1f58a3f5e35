"""Names of topics, partitions, subscriptions, producers and consumers,
message ids, and `quoted`, how an error message shows bad input.

Every name a client chooses follows one rule (`_NAME`): 1-200 characters
from A-Z a-z 0-9 . _ -, starting with a letter or digit. An error quotes at
most `QUOTE_LIMIT` characters of what was given (`quoted`), so a client
cannot make the broker echo a megabyte back or fill its log.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "MAX_PARTITIONS",
    "QUOTE_LIMIT",
    "InvalidNameError",
    "InvalidTopicNameError",
    "MessageId",
    "Position",
    "check_consumer_name",
    "check_producer_name",
    "check_subscription_name",
    "check_topic_name",
    "quoted",
]

MAX_PARTITIONS = 1024
QUOTE_LIMIT = 200  # characters of bad input an error message shows at most

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

# A message's place in one partition: (entry id, batch index).
Position = tuple[int, int]


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, of at most ``limit`` characters
    of a string or bytes value, and then how long it was."""
    if isinstance(value, str | bytes) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    if len(text) > limit + 2:
        return f"{text[:limit]}... ({len(text)} characters)"
    return text


class InvalidNameError(ValueError):
    """A subscription, producer or consumer name breaks the naming rule
    (INVALID_ARGUMENT); a topic name, `InvalidTopicNameError`."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class InvalidTopicNameError(InvalidNameError):
    """A topic name breaks the naming rule (INVALID_TOPIC_NAME)."""


def _check(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        error = InvalidTopicNameError if kind == "topic" else InvalidNameError
        raise error(
            kind,
            f"invalid {kind} name {quoted(name)}: use 1-200 characters from A-Z a-z 0-9 . _ -, "
            "starting with a letter or digit",
        )
    return name


def check_topic_name(name: str) -> str:
    """Return ``name`` if it is a legal topic name, else raise `InvalidTopicNameError`."""
    return _check("topic", name)


def check_subscription_name(name: str) -> str:
    """Return ``name`` if it is a legal subscription name, else raise `InvalidNameError`."""
    return _check("subscription", name)


def check_producer_name(name: str) -> str:
    """Return ``name`` if it is a legal producer name, else raise `InvalidNameError`."""
    return _check("producer", name)


def check_consumer_name(name: str) -> str:
    """Return ``name`` if it is a legal consumer name, else raise `InvalidNameError`."""
    return _check("consumer", name)


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
