"""How ``tidewire serve`` starts each listener of the protocol registry, and each listener's
settings from the configuration.

:mod:`tidewire.registry` says what protocols there are and which listener carries each; this
module holds the code half: :data:`STARTERS`, one function per TCP listener (``rsio``,
``tolliver``, ``seguro``) that builds its settings from the ``<listener>.*`` and ``ingest.*``
settings and starts its server behind the guard. The HTTP listener is the aiohttp app itself
(RS.io over HTTP, Tube, the admin API and the dashboard), started by :func:`serve
<tidewire.server.serve.serve>` before the others; :data:`HTTP_LISTENER` names it.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

from ..config import ServerConfig
from ..hub import INGEST_DEFAULTS, BudgetLimits, FairnessLimits, Hub, IngestLimits
from ..hub.access import Access
from ..protocols.rsio import Limits
from ..protocols.seguro import Limits as SeguroLimits
from ..registry import by_name
from .guard import Admission
from .rsio import RsioSettings, start_rsio_server
from .rsio_http import HttpSettings
from .seguro import start_seguro_server
from .tolliver import TolliverSettings, start_tolliver_server
from .tube import TubeSettings

__all__ = [
    "HTTP_LISTENER",
    "STARTERS",
    "Front",
    "ListenerServer",
    "StartListener",
    "http_settings",
    "ingest_limits",
    "rsio_settings",
    "seguro_limits",
    "tolliver_settings",
    "tube_settings",
]

HTTP_LISTENER = "http"
"""The listener that is the aiohttp app (started by ``serve`` itself, not in :data:`STARTERS`)."""


class ListenerServer(Protocol):
    """What ``serve`` needs of a started TCP listener: its bound port, and the three steps of a
    graceful shutdown (stop reading, "still acknowledging?", close)."""

    @property
    def port(self) -> int: ...

    def quiesce(self) -> None: ...

    @property
    def busy(self) -> bool: ...

    async def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Front:
    """What every listener shares: the access policy, the connection bounds, and this
    listener's TLS context (``None``: plain TCP)."""

    access: Access
    admission: Admission
    tls: ssl.SSLContext | None


StartListener = Callable[[Hub, ServerConfig, Front], Awaitable[ListenerServer]]
"""Start one listener on ``config.host`` and its ``<listener>.port`` setting."""


def _port(config: ServerConfig, listener: str) -> int:
    return int(config.values[f"{listener}.port"])


async def start_rsio(hub: Hub, config: ServerConfig, front: Front) -> ListenerServer:
    """RS.io over TCP (settings ``rsio.*``, ``ingest.*``)."""
    return await start_rsio_server(
        hub, config.host, _port(config, "rsio"), rsio_settings(config),
        access=front.access, admission=front.admission, tls=front.tls,
    )  # fmt: skip


async def start_tolliver(hub: Hub, config: ServerConfig, front: Front) -> ListenerServer:
    """The hub's Tolliver instance (settings ``tolliver.*``)."""
    return await start_tolliver_server(
        hub, config.host, _port(config, "tolliver"), tolliver_settings(config),
        access=front.access, admission=front.admission, tls=front.tls,
    )  # fmt: skip


async def start_seguro(hub: Hub, config: ServerConfig, front: Front) -> ListenerServer:
    """Seguro (settings ``seguro.*``)."""
    return await start_seguro_server(
        hub, config.host, _port(config, "seguro"), seguro_limits(config),
        access=front.access, admission=front.admission, tls=front.tls,
    )  # fmt: skip


STARTERS: dict[str, StartListener] = {
    "rsio": start_rsio,
    "tolliver": start_tolliver,
    "seguro": start_seguro,
}
"""Per TCP listener of the registry, how to start it (tests/test_registry.py checks
that every listener the registry names is here or is :data:`HTTP_LISTENER`)."""


def tube_settings(config: ServerConfig) -> TubeSettings:
    """Tube's bounds from the ``tube.*`` settings and ``limits.message_seconds``."""
    v, seconds = config.values, float(config.values["limits.message_seconds"])
    origins = tuple(o for o in str(v["tube.allowed_origins"]).replace(",", " ").split() if o)
    return TubeSettings(max_message_bytes=int(v["tube.max_message_bytes"]),
                        min_fragment_size=int(v["tube.min_fragment_size"]),
                        message_seconds=seconds or None, allowed_origins=origins)  # fmt: skip


def tolliver_settings(config: ServerConfig) -> TolliverSettings:
    """The Tolliver listener's bounds from the ``tolliver.*`` settings."""
    v = config.values
    return TolliverSettings(max_message_bytes=int(v["tolliver.max_message_bytes"]),
                            max_subscriptions=int(v["tolliver.max_subscriptions"]),
                            max_channels=int(v["tolliver.max_channels"]),
                            max_unacked_bytes=int(v["tolliver.max_unacked_bytes"]),
                            remote_retention_seconds=float(v["tolliver.remote_retention_seconds"]),
                            allow_plaintext=bool(v["tolliver.allow_plaintext"]))  # fmt: skip


def seguro_limits(config: ServerConfig) -> SeguroLimits:
    """The Seguro listener's bounds from the ``seguro.*`` settings."""
    v = config.values
    return SeguroLimits(max_event_bytes=int(v["seguro.max_event_bytes"]),
                        max_many_count=int(v["seguro.max_many_events"]))  # fmt: skip


def http_settings(config: ServerConfig) -> HttpSettings:
    """RS.io over HTTP's bounds from the ``http.*`` settings."""
    v = config.values
    return HttpSettings(
        poll_seconds=float(v["http.poll_seconds"]),
        idle_seconds=float(v["http.idle_seconds"]),
        max_subscriptions=int(v["http.max_subscriptions"]),
        max_subscriptions_per_principal=int(v["http.max_subscriptions_per_principal"]),
        max_response_bytes=int(v["http.max_response_bytes"]),
        header_seconds=float(v["http.header_seconds"]),
        body_seconds=float(v["http.body_seconds"]),
        max_body_bytes=int(v["http.max_body_bytes"]),
        max_refusals=int(v["limits.max_refusals"]),
    )


def ingest_limits(config: ServerConfig) -> dict[str, IngestLimits]:
    """Per protocol that writes, the inbound limits from the ``ingest.*`` settings (0: the
    protocol's default, :data:`~tidewire.hub.INGEST_DEFAULTS`), and its own ``inlet_setting``
    in the registry when it has one and it is set (``rsio.max_inlet_bytes``)."""
    v = config.values
    out = {}
    for via, default in INGEST_DEFAULTS.items():
        pending = int(v["ingest.max_pending_bytes"]) or default.max_pending_bytes
        inlet = by_name(via).inlet_setting
        if inlet is not None and int(v[inlet]):
            pending = int(v[inlet])
        out[via] = IngestLimits(pending,
                                int(v["ingest.appends_in_flight"]) or default.appends_in_flight,
                                int(v["ingest.commit_bytes"]) or default.commit_bytes)  # fmt: skip
    return out


def fairness_limits(config: ServerConfig) -> FairnessLimits:
    """The fair shares of the hub's loop (``limits.fair_busy``, ``limits.anonymous_loop_share``)."""
    v = config.values
    return FairnessLimits(busy=float(v["limits.fair_busy"]),
                          anonymous=float(v["limits.anonymous_loop_share"]))  # fmt: skip


def budget_limits(config: ServerConfig) -> BudgetLimits:
    """The hub's memory budget from the ``memory.*`` settings."""
    v = config.values
    return BudgetLimits(total=int(v["memory.budget_bytes"]),
                        principal=int(v["memory.principal_bytes"]),
                        connection=int(v["memory.connection_bytes"]))  # fmt: skip


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
        max_refusals=int(v["limits.max_refusals"]),
    )
