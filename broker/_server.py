"""The broker's aiohttp application: one route per plane over one `Broker`.

Routes: ``/ws`` (the data plane: one `broker._connection.Connection` per
WebSocket), the HTTP admin API under ``/admin/v1`` and the admin page (see
`broker._admin`), Prometheus text at ``/metrics``, and the admin routes of
transaction groups (`broker._groups`). The broker itself is
`broker._broker.Broker`; this module only wires it to the routes.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from broker._admin import add_admin_routes
from broker._broker import BROKER_KEY, Broker
from broker._connection import Connection
from broker._groups import add_group_routes
from proto import FRAME_SLACK, MAX_MESSAGE_SIZE

__all__ = ["MAX_REQUEST_LINE", "make_app"]

log = logging.getLogger(__name__)

# The longest request line aiohttp reads (AppRunner's max_line_size): a URL
# longer than the admin API's limit still reaches it, and is answered 414.
MAX_REQUEST_LINE = 64 << 10


async def _websocket(request: web.Request) -> web.WebSocketResponse:
    broker = request.app[BROKER_KEY]
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_SIZE + FRAME_SLACK, heartbeat=30.0)
    try:
        await ws.prepare(request)
    except ConnectionResetError:  # (the client went away during the handshake: nothing to serve)
        log.info("a WebSocket client from %s left during its handshake", request.remote)
        return ws
    peer = f"{request.remote}:{id(ws) % 100000}"
    conn = Connection.admit(broker, ws, peer)
    if isinstance(conn, bytes):  # (refused: over --max-connections)
        await ws.send_bytes(conn)
        await ws.close()
        return ws
    log.debug("connection %s opened", peer)
    try:
        await conn.run()
    finally:
        log.debug("connection %s closed", peer)
    return ws


class _QuietParseErrors(logging.Filter):
    """aiohttp logs a request it cannot parse (a request line over
    `MAX_REQUEST_LINE`, a malformed header) at ERROR with a traceback, and
    answers it 400: one line at INFO says it instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            log.info("refused an HTTP request that could not be read: %s", exc.message)
            return False
        return True


def make_app(broker: Broker) -> web.Application:
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietParseErrors) for f in server_log.filters):
        server_log.addFilter(_QuietParseErrors())

    app = web.Application(client_max_size=1 << 20)
    app[BROKER_KEY] = broker
    app.router.add_get("/ws", _websocket)
    add_admin_routes(app)
    add_group_routes(app)
    return app
