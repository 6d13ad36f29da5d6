"""The hub's aiohttp application: the admin endpoints, RS.io over HTTP (``/rsio/...``,
:mod:`.rsio_http`) and Tube over WebSocket carrying RS.io (``/tube``, :mod:`.tube`).

aiohttp is the library for HTTP and WebSocket, server and client, throughout tidewire.

* ``GET /healthz`` -> ``200 ok`` (text/plain)
* ``GET /streams`` -> JSON list of ``{name, events, first_id, latest_id, bytes, segments}``;
  the hub's own streams (``_tidewire.*``: transactions, Tolliver state) only with
  ``?internal=1``
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from aiohttp import web

from ..hub import Hub
from ..hub.hub import RESERVED_PREFIX
from .rsio import RsioServerProtocol, RsioSettings
from .rsio_http import HttpSettings, RsioHttp
from .tube import TubeSettings, add_tube_route

__all__ = ["HUB_KEY", "RSIO_HTTP_KEY", "TUBE_CONNECTIONS_KEY", "build_app"]

WEB_DIR = Path(__file__).resolve().parent.parent / "web"  # the browser client and pages
HUB_KEY = web.AppKey("hub", Hub)
RSIO_HTTP_KEY = web.AppKey("rsio_http", RsioHttp)
TUBE_CONNECTIONS_KEY = web.AppKey("tube_connections", set[RsioServerProtocol])


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _streams(request: web.Request) -> web.Response:
    hub = request.app[HUB_KEY]
    internal = request.query.get("internal") in ("1", "true")
    return web.json_response([asdict(s) for s in hub.streams()
                              if internal or not s.name.startswith(RESERVED_PREFIX)])  # fmt: skip


def build_app(hub: Hub, rsio_http: HttpSettings | None = None, tube: TubeSettings | None = None,
              rsio: RsioSettings | None = None) -> web.Application:  # fmt: skip
    app = web.Application(client_max_size=1024 * 1024)
    app[HUB_KEY] = hub
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/streams", _streams)
    app[RSIO_HTTP_KEY] = subscriptions = RsioHttp(hub, rsio_http)
    subscriptions.add_routes(app)
    connections: set[RsioServerProtocol] = set()
    app[TUBE_CONNECTIONS_KEY] = connections
    add_tube_route(app, hub, connections, tube, rsio)

    async def goodbye(app: web.Application) -> None:  # RS.io over Tube, as over TCP
        for protocol in list(connections):
            protocol.shutdown("server shutting down")

    app.on_shutdown.append(goodbye)
    app.router.add_static("/static/", WEB_DIR, follow_symlinks=False)
    app.router.add_get("/tail", _tail)
    return app


async def _tail(request: web.Request) -> web.StreamResponse:
    """The live-tail page (``/static/tail.html``), keeping the query (``?stream=...``)."""
    query = request.rel_url.raw_query_string
    raise web.HTTPFound("/static/tail.html" + (f"?{query}" if query else ""))
