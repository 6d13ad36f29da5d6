"""The hub's aiohttp application: the admin endpoints and RS.io over HTTP (``/rsio/...``,
:mod:`.rsio_http`); Tube mounts here in a later release.

aiohttp is the library for HTTP and WebSocket, server and client, throughout tidewire.

* ``GET /healthz`` -> ``200 ok`` (text/plain)
* ``GET /streams`` -> JSON list of ``{name, events, first_id, latest_id, bytes, segments}``;
  the hub's own streams (``_tidewire.*``: transactions, Tolliver state) only with
  ``?internal=1``
"""

from __future__ import annotations

from dataclasses import asdict

from aiohttp import web

from ..hub import Hub
from ..hub.hub import RESERVED_PREFIX
from .rsio_http import HttpSettings, RsioHttp

__all__ = ["HUB_KEY", "RSIO_HTTP_KEY", "build_app"]

HUB_KEY = web.AppKey("hub", Hub)
RSIO_HTTP_KEY = web.AppKey("rsio_http", RsioHttp)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def _streams(request: web.Request) -> web.Response:
    hub = request.app[HUB_KEY]
    internal = request.query.get("internal") in ("1", "true")
    return web.json_response([asdict(s) for s in hub.streams()
                              if internal or not s.name.startswith(RESERVED_PREFIX)])  # fmt: skip


def build_app(hub: Hub, rsio_http: HttpSettings | None = None) -> web.Application:
    app = web.Application(client_max_size=1024 * 1024)
    app[HUB_KEY] = hub
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/streams", _streams)
    app[RSIO_HTTP_KEY] = subscriptions = RsioHttp(hub, rsio_http)
    subscriptions.add_routes(app)
    return app
