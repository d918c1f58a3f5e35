"""The broker process: aiohttp app, connections, admin API and CLI."""

from broker._server import Broker, make_app

__all__ = ["Broker", "make_app"]
