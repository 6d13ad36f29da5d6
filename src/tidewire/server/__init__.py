"""Thin asyncio adapters between the network and the hub, plus the aiohttp application."""

from .app import build_app
from .serve import Endpoint, run_server, serve

__all__ = ["Endpoint", "build_app", "run_server", "serve"]
