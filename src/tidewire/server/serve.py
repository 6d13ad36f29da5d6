"""``tidewire serve``: open the hub, start every listener, print every endpoint, run until
SIGINT/SIGTERM, then shut down gracefully (listeners closed, queued appends flushed and fsynced).
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import __version__
from ..config import ServerConfig
from ..hub import Hub
from ..protocols.rsio import Limits
from ..protocols.seguro import Limits as SeguroLimits
from .app import build_app
from .rsio import RsioServer, RsioSettings, start_rsio_server
from .rsio_http import HttpSettings
from .seguro import SeguroServer, start_seguro_server
from .tolliver import TolliverServer, start_tolliver_server

__all__ = ["Endpoint", "run_server", "serve"]

log = logging.getLogger("tidewire.server")


@dataclass(frozen=True, slots=True)
class Endpoint:
    protocol: str
    url: str
    what: str


def _bound_port(runner: web.AppRunner) -> int:
    for site in runner.sites:
        server = getattr(site, "_server", None)
        if server is not None and server.sockets:
            return int(server.sockets[0].getsockname()[1])
    raise RuntimeError("the HTTP site is not listening")


async def serve(
    config: ServerConfig,
    *,
    out: TextIO = sys.stdout,
    stop: asyncio.Event | None = None,
    on_ready: Callable[[list[Endpoint]], None] | None = None,
) -> None:
    """Run the hub until ``stop`` is set (or SIGINT/SIGTERM arrives)."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    quiet_bad_requests()
    hub = Hub.open(
        config.data_dir, config.log, retention_interval_s=config.retention_check_interval_s
    )
    runner: web.AppRunner | None = None
    rsio: RsioServer | None = None
    seguro: SeguroServer | None = None
    tolliver: TolliverServer | None = None
    for sig in (signal.SIGINT, signal.SIGTERM):  # before "ready": a signal then is a clean stop
        loop.add_signal_handler(sig, stop.set)
    try:
        await hub.start()
        app = build_app(hub, http_settings(config), rsio=rsio_settings(config))
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=10)
        await runner.setup()
        site = web.TCPSite(runner, config.host, config.http_port, reuse_address=True)
        await site.start()
        port = _bound_port(runner)
        rsio = await start_rsio_server(hub, config.host, config.rsio_port, rsio_settings(config))
        tolliver = await start_tolliver_server(hub, config.host, config.tolliver_port)
        seguro = await start_seguro_server(
            hub, config.host, config.seguro_port,
            SeguroLimits(max_event_bytes=int(config.values["seguro.max_event_bytes"]),
                         max_many_count=int(config.values["seguro.max_many_events"])),
        )  # fmt: skip
        endpoints = [
            Endpoint("rsio", f"rsio://{config.host}:{rsio.port}", "RS.io over TCP"),
            Endpoint("tolliver", f"tolliver://{config.host}:{tolliver.port}",
                     "Tolliver (the hub's instance)"),
            Endpoint("seguro", f"seguro://{config.host}:{seguro.port}", "Seguro (event log)"),
            Endpoint("http", f"http://{config.host}:{port}/healthz", "health check"),
            Endpoint("http", f"http://{config.host}:{port}/streams", "stream list (JSON)"),
            Endpoint("http", f"http://{config.host}:{port}/rsio/pub/<stream>",
                     "RS.io over HTTP (PUT)"),
            Endpoint("ws", f"ws://{config.host}:{port}/tube", "RS.io over Tube (WebSocket)"),
        ]
        streams = hub.log.streams()
        print(
            f"tidewire {__version__}: serving {len(streams)} stream(s) from {hub.log.directory}",
            file=out,
        )
        for e in endpoints:
            print(f"  {e.protocol:<8} {e.url:<40} {e.what}", file=out)
        print("ready (Ctrl-C or SIGTERM to stop)", file=out, flush=True)
        if on_ready is not None:
            on_ready(endpoints)
        await stop.wait()
        log.info("shutting down: closing listeners, flushing the log")
    finally:
        # The handlers stay until the log is closed: a second signal during the flush is
        # ignored (stop is already set) instead of killing the process mid-flush.
        try:
            if rsio is not None:
                await rsio.close()
            if seguro is not None:
                await seguro.close()
            if tolliver is not None:
                await tolliver.close()
            if runner is not None:
                await runner.cleanup()
            await hub.close()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    if config.log.fsync:
        print("stopped: every acknowledged event is on disk", file=out, flush=True)
    else:
        print("stopped (log.fsync is off: recent events may not be on disk)", file=out, flush=True)


class _QuietBadRequests(logging.Filter):
    """aiohttp logs a request its parser refuses (a line too long, a malformed header) as an
    ERROR with a traceback, after answering it 400: any client could fill the log with them.
    Such a record becomes one warning line naming the peer and the reason."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            what = record.getMessage()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "%s (answered %s): %s"
            record.args = (what, exc.code, str(exc.message).strip()[:200])
            record.exc_info = None
            record.exc_text = None
        return True


def quiet_bad_requests() -> None:
    """Install :class:`_QuietBadRequests` on aiohttp's server logger (once)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, _QuietBadRequests) for f in logger.filters):
        logger.addFilter(_QuietBadRequests())


def raise_open_files_limit() -> None:
    """The log keeps one file descriptor per segment: lift the soft limit to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # pragma: no cover - some sandboxes refuse
            log.warning("could not raise the open-files limit from %d to %d", soft, hard)


def run_server(config: ServerConfig) -> None:
    """Run :func:`serve` on uvloop when it is installed, else on asyncio's default loop."""
    raise_open_files_limit()
    try:
        import uvloop

        loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on every POSIX platform
        loop_factory = None
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(serve(config))


def http_settings(config: ServerConfig) -> HttpSettings:
    """RS.io over HTTP's bounds from the ``http.*`` settings."""
    v = config.values
    return HttpSettings(
        poll_seconds=float(v["http.poll_seconds"]),
        idle_seconds=float(v["http.idle_seconds"]),
        max_subscriptions=int(v["http.max_subscriptions"]),
        max_response_bytes=int(v["http.max_response_bytes"]),
    )


def rsio_settings(config: ServerConfig) -> RsioSettings:
    """The listener's bounds from the ``rsio.*`` settings."""
    v = config.values
    element = int(v["rsio.max_element_bytes"])
    return RsioSettings(
        Limits(
            max_string_bytes=int(v["rsio.max_string_bytes"]),
            max_element_bytes=element,
            max_packed_bytes=element,
        ),
        max_subscriptions=int(v["rsio.max_subscriptions"]),
        max_offers=int(v["rsio.max_offers"]),
        max_inlet_bytes=int(v["rsio.max_inlet_bytes"]),
        max_txn_bytes=int(v["rsio.max_txn_bytes"]),
    )
