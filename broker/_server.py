"""The broker: storage, topics and subscriptions behind one aiohttp app.

Routes: ``/ws`` (the data plane, see `broker._connection`), the HTTP admin
API under ``/admin/v1`` (see `broker._admin`) and Prometheus text at
``/metrics``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from aiohttp import web

from broker._connection import MAX_MESSAGE_SIZE, Connection
from broker._errors import BrokerError
from buffer import Topics
from ledger import LedgerStore
from subscriptions import Subscriptions

__all__ = ["BROKER_KEY", "Broker", "make_app"]

log = logging.getLogger(__name__)

BROKER_KEY: web.AppKey[Broker] = web.AppKey("broker")


class Broker:
    """Create with `Broker.open`; `close` stops everything in order."""

    def __init__(
        self, data_dir: Path, store: LedgerStore, topics: Topics, subs: Subscriptions, url: str
    ) -> None:
        self.data_dir = data_dir
        self.store = store
        self.topics = topics
        self.subscriptions = subs
        self.url = url
        self.connections: set[Connection] = set()
        self._producer_owners: dict[tuple[str, str], Connection] = {}
        self.started = time.time()

    @classmethod
    async def open(cls, data_dir: str | Path, url: str = "") -> Broker:
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        store = await LedgerStore.open(data_dir / "broker.db")
        topics = await Topics.load(store)
        subs = await Subscriptions.load(topics)
        log.info(
            "recovered %d topics from %s in %.2fs",
            len(topics.names()),
            data_dir,
            time.perf_counter() - t0,
        )
        return cls(data_dir, store, topics, subs, url)

    async def close(self) -> None:
        for conn in list(self.connections):
            conn.close()
            await conn.ws.close()
        await self.subscriptions.close()
        await self.store.close()

    def producer_count(self, topic: str) -> int:
        return sum(1 for t, _ in self._producer_owners if t == topic)

    def claim_producer(self, topic: str, name: str, conn: Connection) -> None:
        """Producer names are unique per topic among connected producers."""
        owner = self._producer_owners.get((topic, name))
        if owner is not None and owner is not conn:
            raise BrokerError(
                "PRODUCER_BUSY", f"producer {name!r} is already connected to topic {topic!r}"
            )
        self._producer_owners[(topic, name)] = conn

    def release_producer(self, topic: str, name: str, conn: Connection) -> None:
        if self._producer_owners.get((topic, name)) is conn:
            del self._producer_owners[(topic, name)]


async def _websocket(request: web.Request) -> web.WebSocketResponse:
    broker = request.app[BROKER_KEY]
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE_SIZE + (64 << 10), heartbeat=30.0)
    await ws.prepare(request)
    peer = f"{request.remote}:{id(ws) % 100000}"
    conn = Connection(broker, ws, peer)
    broker.connections.add(conn)
    log.debug("connection %s opened", peer)
    try:
        await conn.run()
    finally:
        broker.connections.discard(conn)
        log.debug("connection %s closed", peer)
    return ws


def make_app(broker: Broker) -> web.Application:
    from broker._admin import add_admin_routes

    app = web.Application(client_max_size=1 << 20)
    app[BROKER_KEY] = broker
    app.router.add_get("/ws", _websocket)
    add_admin_routes(app)
    return app
