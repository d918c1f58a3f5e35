"""The one place where foreign exceptions become client errors.

aiohttp and OSError failures of the socket become ``BrokerConnectionError``
(not retriable when TLS failed: a certificate the client does not trust
stays untrusted); failures to parse what the broker sent become
``ProtocolError``; a CA file that cannot be loaded, ``InvalidInputError``. Our own
errors pass through untouched (``OperationTimeoutError`` is an ``OSError``
too, via ``TimeoutError``).

The client imports only ``proto``, the stdlib and aiohttp, so protobuf's
``DecodeError`` is not named: ``decoding()`` wraps nothing but a ``FromString``
call, and any exception from it means the bytes were not a valid message.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp

from .errors import BrokerConnectionError, InvalidInputError, ProtocolError, TxnbufError


@contextmanager
def socket_errors() -> Iterator[None]:
    """Run a socket operation; re-raise its failures as ``BrokerConnectionError``."""
    try:
        yield
    except TxnbufError:
        raise
    except aiohttp.ClientConnectorCertificateError as exc:
        error = BrokerConnectionError(
            f"the broker's TLS certificate is not trusted ({exc.certificate_error}): "
            "give the CA that signed it, Client(url, tls_ca=...)"
        )
        error.retriable = False
        raise error from exc
    except ssl.SSLCertVerificationError as exc:  # (a txnbufs:// stream)
        error = BrokerConnectionError(
            f"the broker's TLS certificate is not trusted ({exc.verify_message}): "
            "give the CA that signed it, Client(url, tls_ca=...)"
        )
        error.retriable = False
        raise error from exc
    except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
        error = BrokerConnectionError(f"TLS with the broker failed: {exc}")
        error.retriable = False
        raise error from exc
    except (aiohttp.ClientError, OSError) as exc:
        raise BrokerConnectionError(f"{type(exc).__name__}: {exc}") from exc


def tls_context(cafile: str | os.PathLike[str]) -> ssl.SSLContext:
    """An SSL context that trusts the CA certificates in ``cafile`` (PEM)."""
    try:
        return ssl.create_default_context(cafile=os.fspath(cafile))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidInputError(
            f"tls_ca: cannot load CA certificates from {cafile}: {exc}"
        ) from exc


@contextmanager
def decoding(what: str) -> Iterator[None]:
    """Run one protobuf ``FromString``; re-raise its failure as ``ProtocolError``."""
    try:
        yield
    except Exception as exc:
        raise ProtocolError(f"undecodable {what} from the broker: {exc}") from exc
