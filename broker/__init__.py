"""The broker process: aiohttp app, connections, admin API and CLI."""

from broker._broker import Broker
from broker._server import make_app

__all__ = ["Broker", "make_app"]
