"""The options of ``format("txnbuf")``, checked once, with errors that name
the option. Spark hands options over as a case-insensitive map of strings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["OptionError", "SinkOptions", "SourceOptions"]


class OptionError(ValueError):
    """An option of ``format("txnbuf")`` is missing or wrong; nothing was done."""


def _get(options: Mapping[str, str], name: str) -> str | None:
    for key, value in options.items():
        if key.lower() == name.lower():
            return value
    return None


def _required(options: Mapping[str, str], name: str) -> str:
    value = _get(options, name)
    if not value:
        raise OptionError(f'format("txnbuf") needs the option {name!r}')
    return value


def _url(options: Mapping[str, str]) -> str:
    url = _required(options, "service_url")
    if not url.startswith(("http://", "https://")):
        raise OptionError(f"option 'service_url' must look like http://host:port, not {url!r}")
    return url.rstrip("/")


def _int(options: Mapping[str, str], name: str, default: int, low: int = 1) -> int:
    value = _get(options, name)
    if value is None or value == "":
        return default
    try:
        number = int(value)
    except ValueError:
        raise OptionError(f"option {name!r} must be an integer, not {value!r}") from None
    if number < low:
        raise OptionError(f"option {name!r} must be at least {low}, not {number}")
    return number


def _choice(options: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = (_get(options, name) or default).lower()
    if value not in choices:
        raise OptionError(f"option {name!r} must be one of {', '.join(choices)}, not {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """``spark.readStream.format("txnbuf")`` / ``spark.read.format("txnbuf")``."""

    service_url: str
    token: str | None  # a JWT for an authenticating broker (None: TXNBUF_TOKEN)
    topic: str
    subscription: str  # the query's durable subscription (default: spark-<topic>)
    starting: str  # "earliest" / "latest" (a new subscription's position)
    ending: str  # batch reads: "latest" (the end when planned)
    max_messages_per_batch: int | None
    read_batch: int  # messages per READ_ENTRIES in a task

    @classmethod
    def parse(cls, options: Mapping[str, str], streaming: bool) -> SourceOptions:
        max_batch = _get(options, "maxMessagesPerBatch")
        topic = _required(options, "topic")
        return cls(
            service_url=_url(options),
            token=_get(options, "token") or None,
            topic=topic,
            subscription=_get(options, "subscription") or f"spark-{topic}",
            starting=_choice(
                options,
                "startingOffsets",
                ("earliest", "latest"),
                "latest" if streaming else "earliest",
            ),
            ending=_choice(options, "endingOffsets", ("latest",), "latest"),
            max_messages_per_batch=None
            if max_batch is None
            else _int(options, "maxMessagesPerBatch", 0),
            read_batch=_int(options, "readBatchMessages", 10_000),
        )


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """``df.writeStream.format("txnbuf")`` / ``df.write.format("txnbuf")``."""

    service_url: str
    token: str | None  # a JWT for an authenticating broker (None: TXNBUF_TOKEN)
    topic: str | None  # None: each row's ``topic`` column
    checkpoint: str | None  # checkpointLocation (finds the query id when no task reported it)
    transaction_timeout_ms: int  # a task's transaction is aborted if not prepared by then
    prepared_timeout_ms: int  # ... and, prepared, if its batch is not committed by then

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        return cls(
            service_url=_url(options),
            token=_get(options, "token") or None,
            topic=_get(options, "topic") or None,
            checkpoint=_get(options, "checkpointLocation") or None,
            transaction_timeout_ms=_int(options, "transactionTimeoutMs", 600_000),
            prepared_timeout_ms=_int(options, "preparedTimeoutMs", 3_600_000),
        )
