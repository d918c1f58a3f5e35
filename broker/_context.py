"""What a command handler may use of the connection that read its command.

The connection (`broker._connection.Connection`) reads frames and hands each
command to the handler of its type. The handlers live in modules by
subject (`broker._transactions`, `broker._epoch`, `broker._groups`,
`broker._reader`, `broker._seek`, `broker._group_cursors`), each
exporting a table ``type -> handler`` that the connection pulls in; none
of them imports the connection. What
they get is a `Context`: the broker, who the client is, its consumers, and
the four things a handler does on the connection (send an answer, run a
task, answer a request from a task, require a role). Imports go one way:
the connection imports the handler tables, the handler tables import this.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from broker._auth import Principal
from broker._broker import Broker
from proto import txnbuf_pb2 as pb
from subscriptions import Consumer

__all__ = ["Context", "Handlers", "command", "merge_handlers", "success"]

T = pb.BaseCommand

# A module's handlers: command type -> what handles a command of it.
Handlers = dict[int, Callable[[pb.BaseCommand], None]]


class Context(Protocol):
    """A connection, as its command handlers see it."""

    @property
    def broker(self) -> Broker: ...

    @property
    def peer(self) -> str:
        """The client's address, for the log."""

    @property
    def who(self) -> Principal:
        """Who the client is (`broker._auth`; it changes on CONNECT)."""

    @property
    def consumers(self) -> dict[int, Consumer]:
        """The consumers the client attached on this connection, by id."""

    def send(self, cmd: pb.BaseCommand) -> None:
        """Queue ``cmd`` to the client (answers go out in order)."""

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` in a task of the connection."""

    def answer(self, request_id: int, work: Awaitable[pb.BaseCommand | None], what: str) -> None:
        """Run ``work`` in a task; send its answer, or an ERROR for
        ``request_id`` if it raises (``what`` names the request in the log)."""

    def require_role(self, role: str, what: str) -> None:
        """Refuse ``what`` (AUTHORIZATION_ERROR, nothing changes) unless the
        connection holds ``role``."""


def command(kind: pb.BaseCommand.Type, field: str, body: Any) -> pb.BaseCommand:
    """A `BaseCommand` of type ``kind`` carrying ``body`` in ``field``."""
    cmd = pb.BaseCommand(type=kind)
    getattr(cmd, field).CopyFrom(body)
    return cmd


def success(request_id: int) -> pb.BaseCommand:
    return command(T.SUCCESS, "success", pb.CommandSuccess(request_id=request_id))


def merge_handlers(*tables: Handlers) -> Handlers:
    """One table of several; a command type claimed twice is a bug here
    (each type has one handler, whatever order the tables come in)."""
    merged: Handlers = {}
    for table in tables:
        for kind, handler in table.items():
            if kind in merged:
                raise RuntimeError(f"two handlers for {T.Type.Name(kind)}")
            merged[kind] = handler
    return merged
