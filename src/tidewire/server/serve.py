"""``tidewire serve``: open the hub, start every listener, print every endpoint, run until
SIGINT/SIGTERM, then shut down gracefully (listeners closed, queued appends flushed and fsynced).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import resource
import signal
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TextIO

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import __version__
from ..config import ConfigError, ServerConfig
from ..hub import INGEST_DEFAULTS, Hub, IngestLimits
from ..hub.access import Access, Acl, Tokens
from ..protocols.rsio import Limits
from ..protocols.seguro import Limits as SeguroLimits
from . import app as http_app
from .app import build_app
from .guard import Admission, ConnectionLimits, TlsSettings, server_context
from .rsio import RsioServer, RsioSettings, start_rsio_server
from .rsio_http import HttpSettings
from .seguro import SeguroServer, start_seguro_server
from .tolliver import TolliverServer, TolliverSettings, start_tolliver_server
from .tube import TubeSettings

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
    access, admission, tls = security(config)
    expiration = int(config.values["txn.expiration_ms"])
    hub = Hub.open(
        config.data_dir, config.log, retention_interval_s=config.retention_check_interval_s,
        txn_expiration_ms=None if expiration < 0 else expiration,
    )  # fmt: skip
    hub.ingest_limits.update(ingest_limits(config))
    runner: web.AppRunner | None = None
    rsio: RsioServer | None = None
    seguro: SeguroServer | None = None
    tolliver: TolliverServer | None = None
    for sig in (signal.SIGINT, signal.SIGTERM):  # before "ready": a signal then is a clean stop
        loop.add_signal_handler(sig, stop.set)
    try:
        await hub.start()
        app = build_app(hub, http_settings(config), tube_settings(config),
                        rsio=rsio_settings(config), access=access)  # fmt: skip
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=float(config.values["shutdown_seconds"]))
        await runner.setup()
        port = await http_app.start_http_site(
            runner, config.host, config.http_port,
            admission=admission, tls=tls["http"], settings=http_settings(config),
        )  # fmt: skip
        rsio = await start_rsio_server(
            hub, config.host, config.rsio_port, rsio_settings(config),
            access=access, admission=admission, tls=tls["rsio"],
        )  # fmt: skip
        tolliver = await start_tolliver_server(
            hub, config.host, config.tolliver_port, tolliver_settings(config),
            access=access, admission=admission, tls=tls["tolliver"],
        )  # fmt: skip
        seguro = await start_seguro_server(
            hub, config.host, config.seguro_port,
            SeguroLimits(max_event_bytes=int(config.values["seguro.max_event_bytes"]),
                         max_many_count=int(config.values["seguro.max_many_events"])),
            access=access, admission=admission, tls=tls["seguro"],
        )  # fmt: skip
        s = {k: "s" if v is not None else "" for k, v in tls.items()}
        endpoints = [
            Endpoint("rsio", f"rsio{s['rsio']}://{config.host}:{rsio.port}", "RS.io over TCP"),
            Endpoint("tolliver", f"tolliver{s['tolliver']}://{config.host}:{tolliver.port}",
                     "Tolliver (the hub's instance)"),
            Endpoint("seguro", f"seguro{s['seguro']}://{config.host}:{seguro.port}",
                     "Seguro (event log)"),
            Endpoint("http", f"http{s['http']}://{config.host}:{port}/healthz", "health check"),
            Endpoint("http", f"http{s['http']}://{config.host}:{port}/streams",
                     "stream list (JSON)"),
            Endpoint("http", f"http{s['http']}://{config.host}:{port}/rsio/pub/<stream>",
                     "RS.io over HTTP (PUT)"),
            Endpoint("ws", f"ws{s['http']}://{config.host}:{port}/tube",
                     "RS.io over Tube (WebSocket)"),
        ]
        warn_exposure(config, tls, access)
        streams = hub.stream_names()
        print(
            f"tidewire {__version__}: serving {len(streams)} stream(s) from {hub.describe()}",
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
            await _wind_down([s for s in (rsio, seguro, tolliver) if s is not None],
                             runner, float(config.values["shutdown_seconds"]))  # fmt: skip
            await hub.close()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)
    if config.log.fsync:
        print("stopped: every acknowledged event is on disk", file=out, flush=True)
    else:
        print("stopped (log.fsync is off: recent events may not be on disk)", file=out, flush=True)


class _Draining(Protocol):
    def quiesce(self) -> None: ...

    @property
    def busy(self) -> bool: ...

    async def close(self) -> None: ...


async def _wind_down(servers: list[_Draining], runner: web.AppRunner | None,
                     seconds: float) -> None:  # fmt: skip
    """The graceful part of a shutdown, bounded by ``seconds`` (``shutdown_seconds``):

    1. stop listening, and stop reading every connection (RS.io, Tube, Tolliver, Seguro);
    2. wait while what was already read is appended and acknowledged (RS.io ``Committed``,
       Tolliver acks, Seguro ``COMMITTED``), at most ``seconds``;
    3. say goodbye (RS.io, also over Tube) and close every connection; HTTP requests under
       way get at most ``seconds`` more (aiohttp's own shutdown timeout).

    The caller then closes the hub, which stores and fsyncs whatever is still queued: an
    append cut off by the bound is stored but not acknowledged (a client re-offers it).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    for server in servers:
        server.quiesce()
    if runner is not None:
        for site in list(runner.sites):  # no new HTTP connections; open ones carry on
            with contextlib.suppress(Exception):
                await site.stop()
    tube = runner.app.get(http_app.TUBE_CONNECTIONS_KEY) if runner is not None else None
    for protocol in list(tube or ()):
        protocol.quiesce()

    def busy() -> bool:
        return any(s.busy for s in servers) or any(p.busy for p in (tube or ()))

    # Polled: the acks go out from each connection's own tasks, of three protocols, and an
    # event for "the last one is done" would thread through all of them for a 5 ms gain.
    while busy() and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    if busy():
        log.warning("shutdown: writes still in flight after %.1f s (shutdown_seconds); "
                    "closing anyway: they are stored but not acknowledged", seconds)  # fmt: skip
    for server in servers:
        await server.close()
    if runner is not None:  # (its own bound: shutdown_seconds, given to the AppRunner)
        await runner.cleanup()


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


LISTENERS = ("http", "rsio", "seguro", "tolliver")


def security(config: ServerConfig) -> tuple[Access, Admission, dict[str, ssl.SSLContext | None]]:
    """The access policy, the connection bounds shared by every listener, and each listener's
    TLS context (``None``: plain TCP) from the ``auth.*``, ``limits.*`` and ``tls.*`` settings.
    Raises ``ConfigError`` for files that cannot be read or certificates that do not load."""
    v = config.values
    try:
        access = Access(
            Acl.load(v["auth.acl_file"]) if v["auth.acl_file"] else None,
            Tokens.load(v["auth.tokens_file"]) if v["auth.tokens_file"] else None,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    admission = Admission(ConnectionLimits(
        max_connections=int(v["limits.max_connections"]),
        max_connections_per_peer=int(v["limits.max_connections_per_peer"]),
        handshake_seconds=float(v["limits.handshake_seconds"]),
        idle_seconds=float(v["limits.idle_seconds"]),
        write_stall_seconds=float(v["limits.write_stall_seconds"]),
    ))  # fmt: skip
    contexts: dict[str, ssl.SSLContext | None] = dict.fromkeys(LISTENERS)
    if v["tls.cert_file"]:
        tls = TlsSettings(v["tls.cert_file"], v["tls.key_file"], v["tls.ca_file"] or None,
                          v["tls.client_auth"], v["tls.min_version"])  # fmt: skip
        try:
            for name in LISTENERS:
                if v[f"{name}.tls"]:  # Tolliver's origin requires client certificates
                    auth = "required" if name == "tolliver" else None
                    contexts[name] = server_context(tls, client_auth=auth)
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise ConfigError(f"tls: cannot load the certificates: {exc}") from None
    return access, admission, contexts


def warn_exposure(config: ServerConfig, tls: dict[str, ssl.SSLContext | None],
                  access: Access) -> None:  # fmt: skip
    """Binding beyond the loopback without TLS (or without an ACL) is logged as a warning."""
    try:
        loopback = ipaddress.ip_address(config.host).is_loopback
    except ValueError:
        loopback = config.host == "localhost"
    if loopback:
        return
    plain = [name for name, ctx in tls.items() if ctx is None]
    if plain:
        log.warning("listening on %s without TLS for %s: anyone on the network can read and "
                    "write in clear text (set tls.cert_file)", config.host, ", ".join(plain))
    if access.open:
        log.warning("listening on %s without an ACL: every peer may read and write every "
                    "stream (set auth.acl_file)", config.host)


def tube_settings(config: ServerConfig) -> TubeSettings:
    return TubeSettings(max_message_bytes=int(config.values["tube.max_message_bytes"]))


def tolliver_settings(config: ServerConfig) -> TolliverSettings:
    v = config.values
    return TolliverSettings(max_message_bytes=int(v["tolliver.max_message_bytes"]),
                            max_subscriptions=int(v["tolliver.max_subscriptions"]))  # fmt: skip


def http_settings(config: ServerConfig) -> HttpSettings:
    """RS.io over HTTP's bounds from the ``http.*`` settings."""
    v = config.values
    return HttpSettings(
        poll_seconds=float(v["http.poll_seconds"]),
        idle_seconds=float(v["http.idle_seconds"]),
        max_subscriptions=int(v["http.max_subscriptions"]),
        max_response_bytes=int(v["http.max_response_bytes"]),
        header_seconds=float(v["http.header_seconds"]),
        body_seconds=float(v["http.body_seconds"]),
        max_body_bytes=int(v["http.max_body_bytes"]),
    )


def ingest_limits(config: ServerConfig) -> dict[str, IngestLimits]:
    """Per protocol, the inbound limits from the ``ingest.*`` settings (0: the protocol's
    default, :data:`~tidewire.hub.INGEST_DEFAULTS`)."""
    v = config.values
    out = {}
    for via, default in INGEST_DEFAULTS.items():
        pending = int(v["ingest.max_pending_bytes"]) or default.max_pending_bytes
        if via in ("rsio", "tube") and int(v["rsio.max_inlet_bytes"]):
            pending = int(v["rsio.max_inlet_bytes"])
        out[via] = IngestLimits(pending,
                                int(v["ingest.appends_in_flight"]) or default.appends_in_flight,
                                int(v["ingest.commit_bytes"]) or default.commit_bytes)  # fmt: skip
    return out


def rsio_settings(config: ServerConfig) -> RsioSettings:
    """The listener's bounds from the ``rsio.*`` settings (and ``ingest.*``)."""
    v = config.values
    ingest = ingest_limits(config)["rsio"]
    element = int(v["rsio.max_element_bytes"])
    # Over Tube a whole Tube message reaches RS.io's receive_data at once: its receive buffer
    # must take one of the largest (over TCP, reads are far smaller than the default).
    read_ahead = max(int(v["tube.max_message_bytes"]), Limits().max_read_ahead_bytes)
    return RsioSettings(
        Limits(
            max_string_bytes=int(v["rsio.max_string_bytes"]),
            max_element_bytes=element,
            max_packed_bytes=element,
            max_read_ahead_bytes=read_ahead,
        ),
        max_subscriptions=int(v["rsio.max_subscriptions"]),
        max_offers=int(v["rsio.max_offers"]),
        max_inlet_bytes=ingest.max_pending_bytes,
        max_txn_bytes=int(v["rsio.max_txn_bytes"]),
        appends_in_flight=ingest.appends_in_flight,
        commit_bytes=ingest.commit_bytes,
    )
