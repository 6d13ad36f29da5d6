"""``tidewire serve``: open the hub, start every listener, print every endpoint, run until
SIGINT/SIGTERM, then shut down gracefully (listeners closed, queued appends flushed and fsynced).

SIGHUP reloads the access policy: ``auth.tokens_file`` and ``auth.acl_file`` are read again
(:func:`reload_access`); open connections keep their principals, and each one's next decision
uses the new tokens and ACL (a revoked token is refused there). A file that does not load
keeps the whole old policy, with an error line. Other settings need a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import resource
import signal
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from .. import __version__
from ..config import ConfigError, ServerConfig
from ..hub.access import Access, AccessFileError, Acl, Tokens
from ..hub.budget import Budget
from ..hub.fairness import LoopShares
from ..hub.history import History
from ..registry import PROTOCOLS, listeners
from . import app as http_app
from .admin import history_limits
from .app import build_app, parser_reason
from .browser import browser_policy
from .guard import Admission, ConnectionLimits, TlsSettings, server_context
from .listeners import HTTP_LISTENER, STARTERS, Front, ListenerServer
from .listeners import budget_limits as budget_limits
from .listeners import fairness_limits as fairness_limits
from .listeners import http_settings as http_settings
from .listeners import ingest_limits as ingest_limits
from .listeners import rsio_settings as rsio_settings
from .listeners import tolliver_settings as tolliver_settings
from .listeners import tube_settings as tube_settings
from .storage_open import Connector, open_hub

__all__ = ["Endpoint", "reload_access", "run_server", "serve"]

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
    connect: Connector | None = None,
) -> None:
    """Run the hub until ``stop`` is set (or SIGINT/SIGTERM arrives). With ``storage.url``
    set, the hub runs on that cluster (:mod:`.storage_open`; ``connect``: how to connect it,
    by default the JetStream backend) and ``data_dir`` is not used."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    quiet_bad_requests()
    access, admission, tls = security(config)
    hub = await open_hub(config, connect)  # (cluster mode: StorageUnavailable, one line)
    hub.ingest_limits.update(ingest_limits(config))
    hub.budget = Budget(budget_limits(config), LoopShares(fairness_limits(config)))
    hub.metrics.history = History(history_limits(config))  # (the dashboard's charts)
    runner: web.AppRunner | None = None
    servers: dict[str, ListenerServer] = {}  # the TCP listeners, in the registry's order
    for sig in (signal.SIGINT, signal.SIGTERM):  # before "ready": a signal then is a clean stop
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGHUP, reload_access, access, config)
    try:
        await hub.start()
        app = build_app(hub, http_settings(config), tube_settings(config),
                        rsio=rsio_settings(config), access=access,
                        browser=browser_policy(config.values))  # fmt: skip
        runner = web.AppRunner(app, access_log=None, handle_signals=False,
                               shutdown_timeout=float(config.values["shutdown_seconds"]))
        await runner.setup()
        port = await http_app.start_http_site(
            runner, config.host, config.http_port,
            admission=admission, tls=tls[HTTP_LISTENER], settings=http_settings(config),
        )  # fmt: skip
        for name in tcp_listeners():
            front = Front(access, admission, tls[name])
            servers[name] = await STARTERS[name](hub, config, front)
        ports = {HTTP_LISTENER: port} | {name: s.port for name, s in servers.items()}
        endpoints = banner_endpoints(config.host, ports, tls)
        warn_exposure(config, tls, access)
        # What start-up made (modules, the log's indexes) lives as long as the process: out of
        # the collector's sight, a full collection scans only what came since (else a 20-80 ms
        # pause of every connection whenever load makes one: issue 20)
        gc.collect()
        gc.freeze()
        streams = hub.stream_names()
        print(
            f"tidewire {__version__}: serving {len(streams)} stream(s) from {hub.describe()}",
            file=out,
        )
        if config.clustered:  # (where the streams are: the cluster, and nothing on this disk)
            print(f"  storage  {hub.describe()}; no data directory", file=out)
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
            await _wind_down(list(servers.values()), runner,
                             float(config.values["shutdown_seconds"]))  # fmt: skip
            await hub.close()
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                loop.remove_signal_handler(sig)
    if config.clustered:
        print("stopped: every acknowledged event is in the cluster", file=out, flush=True)
    elif config.log.fsync:
        print("stopped: every acknowledged event is on disk", file=out, flush=True)
    else:
        print("stopped (log.fsync is off: recent events may not be on disk)", file=out, flush=True)


async def _wind_down(servers: list[ListenerServer], runner: web.AppRunner | None,
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
    Such a record becomes one warning line naming the peer and the reason, without the bytes
    the parser quotes after it (the refused line: it may hold a token, in a URL or in an
    ``Authorization`` header, and tokens are never logged)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError):
            what = record.getMessage()
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.msg = "%s (answered %s): %s: %s"
            record.args = (what, exc.code, type(exc).__name__, parser_reason(str(exc.message)))
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


LISTENERS = listeners()
"""Every listener of the protocol registry (:mod:`tidewire.registry`), alphabetically."""


def tcp_listeners() -> list[str]:
    """The listeners ``serve`` starts after the HTTP one, in the registry's order (rsio,
    tolliver, seguro)."""
    out: list[str] = []
    for p in PROTOCOLS:
        if p.listener != HTTP_LISTENER and p.listener not in out:
            out.append(p.listener)
    return out


def banner_endpoints(host: str, ports: dict[str, int],
                     tls: dict[str, ssl.SSLContext | None]) -> list[Endpoint]:  # fmt: skip
    """The endpoints ``serve`` prints, from the registry: the TCP listeners' first, then the
    HTTP listener's (each in the registry's order); a scheme gains an ``s`` under TLS."""
    out: list[Endpoint] = []
    for listener in [*tcp_listeners(), HTTP_LISTENER]:
        s = "s" if tls.get(listener) is not None else ""
        for p in PROTOCOLS:
            if p.listener == listener:
                out.extend(Endpoint(e.label, f"{e.scheme}{s}://{host}:{ports[listener]}{e.path}",
                                    e.what) for e in p.endpoints)  # fmt: skip
    return out


def security(config: ServerConfig) -> tuple[Access, Admission, dict[str, ssl.SSLContext | None]]:
    """The access policy, the connection bounds shared by every listener, and each listener's
    TLS context (``None``: plain TCP) from the ``auth.*``, ``limits.*`` and ``tls.*`` settings.
    Raises ``ConfigError`` for files that cannot be read or certificates that do not load."""
    v = config.values
    try:
        access = Access(*load_policy(config))
    except AccessFileError as exc:
        raise ConfigError(str(exc)) from None
    admission = Admission(ConnectionLimits(
        max_connections=int(v["limits.max_connections"]),
        max_connections_per_peer=int(v["limits.max_connections_per_peer"]),
        handshake_seconds=float(v["limits.handshake_seconds"]),
        idle_seconds=float(v["limits.idle_seconds"]),
        write_stall_seconds=float(v["limits.write_stall_seconds"]),
        message_seconds=float(v["limits.message_seconds"]),
        refusal_close_seconds=float(v["limits.refusal_close_seconds"]),
        peer_prefix_v4=int(v["limits.peer_prefix_v4"]),
        peer_prefix_v6=int(v["limits.peer_prefix_v6"]),
    ))  # fmt: skip
    contexts: dict[str, ssl.SSLContext | None] = dict.fromkeys(LISTENERS)
    if v["tls.cert_file"]:
        tls = TlsSettings(v["tls.cert_file"], v["tls.key_file"], v["tls.ca_file"] or None,
                          v["tls.client_auth"], v["tls.min_version"])  # fmt: skip
        try:
            for name in LISTENERS:
                if v[f"{name}.tls"]:  # Tolliver's origin requires client certificates
                    needs = any(p.client_certificates for p in PROTOCOLS if p.listener == name)
                    auth = "required" if needs else None
                    contexts[name] = server_context(tls, client_auth=auth)
        except (OSError, ValueError, ssl.SSLError) as exc:
            raise ConfigError(f"tls: cannot load the certificates: {exc}") from None
    return access, admission, contexts


def load_policy(config: ServerConfig) -> tuple[Acl | None, Tokens]:
    """The ACL (``None``: no ``auth.acl_file``, open) and the tokens of the ``auth.*``
    settings, read now; :class:`AccessFileError` names a file that does not load."""
    v = config.values
    acl = Acl.load(v["auth.acl_file"]) if v["auth.acl_file"] else None
    return acl, Tokens.load(v["auth.tokens_file"]) if v["auth.tokens_file"] else Tokens()


def reload_access(access: Access, config: ServerConfig) -> bool:
    """Read the tokens and ACL files again into ``access`` (SIGHUP); ``False``, with an error
    line and the old policy kept whole (tokens and ACL), if either does not load."""
    try:
        acl, tokens = load_policy(config)
    except AccessFileError as exc:
        log.error("SIGHUP: not reloaded, the policy in force stays: %s", exc)
        return False
    access.replace(acl, tokens)
    rules = "no ACL (open)" if acl is None else f"{len(acl.grants)} ACL table(s)"
    log.info("SIGHUP: reloaded the access policy: %d token(s), %s", len(tokens.by_name), rules)
    return True


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
