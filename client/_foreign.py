"""The one place where foreign exceptions become client errors.

aiohttp and OSError failures of the socket become ``BrokerConnectionError``;
failures to parse what the broker sent become ``ProtocolError``. Our own
errors pass through untouched (``OperationTimeoutError`` is an ``OSError``
too, via ``TimeoutError``).

The client imports only ``proto``, the stdlib and aiohttp, so protobuf's
``DecodeError`` is not named: ``decoding()`` wraps nothing but a ``FromString``
call, and any exception from it means the bytes were not a valid message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp

from .errors import BrokerConnectionError, ProtocolError, TxnbufError


@contextmanager
def socket_errors() -> Iterator[None]:
    """Run a socket operation; re-raise its failures as ``BrokerConnectionError``."""
    try:
        yield
    except TxnbufError:
        raise
    except (aiohttp.ClientError, OSError) as exc:
        raise BrokerConnectionError(f"{type(exc).__name__}: {exc}") from exc


@contextmanager
def decoding(what: str) -> Iterator[None]:
    """Run one protobuf ``FromString``; re-raise its failure as ``ProtocolError``."""
    try:
        yield
    except Exception as exc:
        raise ProtocolError(f"undecodable {what} from the broker: {exc}") from exc
