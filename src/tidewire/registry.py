"""The one table of the protocols the hub speaks: what every other layer needs to know of each.

A protocol is registered here once, as plain data (this module imports nothing, so the hub,
``observe/`` and ``server/`` can all read it without breaking the layers):

* its **name**, which is also its ``via``: the label of its traffic in the hub's counters and
  the key of its ingest limits;
* the **listener** that carries it (``http``, ``rsio``, ``seguro``, ``tolliver``): the name of
  its guard :class:`~tidewire.server.guard.Listener`, of its ``<listener>.port`` and
  ``<listener>.tls`` settings and of its ``--<listener>-port`` flag. A protocol that rides on
  another's listener (Tube on HTTP) names that one;
* its **metrics labels**: what its connections and its subscriptions are counted as
  (``tidewire_connections``, ``tidewire_subscriptions``, ``/api/overview``);
* its **ingest defaults**, when it writes into the hub (:data:`tidewire.hub.INGEST_DEFAULTS`
  is built from them);
* the **endpoints** ``tidewire serve`` prints for it.

How a listener is started (its settings from the configuration, its ``start_*_server``) is
code, one function per listener in :mod:`tidewire.server.listeners`, keyed by the names used
here; ``tests/test_registry.py`` checks that the two, the settings and the command
line agree. docs/architecture.md ("Adding a protocol") lists what a new protocol provides.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "PROTOCOLS",
    "EndpointTemplate",
    "IngestDefaults",
    "ProtocolInfo",
    "by_name",
    "listeners",
]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class IngestDefaults:
    """A protocol's inbound bounds when the ``ingest.*`` settings leave them at 0 (the fields
    of :class:`tidewire.hub.IngestLimits`, which the hub builds from these)."""

    max_pending_bytes: int
    appends_in_flight: int
    commit_bytes: int


@dataclass(frozen=True, slots=True)
class EndpointTemplate:
    """One line of ``tidewire serve``'s banner: ``label`` (the first column), the URL's
    ``scheme`` (an ``s`` is appended when the listener uses TLS), its ``path`` after
    ``host:port`` and ``what`` it is."""

    label: str
    scheme: str
    path: str
    what: str


@dataclass(frozen=True, slots=True)
class ProtocolInfo:
    """One registered protocol (see the module's docstring for what each field drives)."""

    name: str
    title: str
    listener: str
    connection_label: str | None
    subscription_label: str | None
    ingest: IngestDefaults | None = None
    inlet_setting: str | None = None
    """A setting of its own that overrides ``ingest.max_pending_bytes`` (0: not set)."""
    client_certificates: bool = False
    """Its listener over TLS requires client certificates (Tolliver's origin check)."""
    endpoints: tuple[EndpointTemplate, ...] = ()


# The order is the order of the metrics labels (Prometheus lines, /api/overview's counts) and,
# per listener, of the banner's lines: changing it changes what users see.
PROTOCOLS: tuple[ProtocolInfo, ...] = (
    ProtocolInfo(
        "rsio", "RS.io over TCP", "rsio", "rsio", "rsio",
        ingest=IngestDefaults(8 * MiB, 4, MiB), inlet_setting="rsio.max_inlet_bytes",
        endpoints=(EndpointTemplate("rsio", "rsio", "", "RS.io over TCP"),),
    ),
    ProtocolInfo(
        # The HTTP listener: RS.io over HTTP (its subscriptions count as rsio-http; its
        # publishing is request by request, not through an ingest pipeline) and the admin API.
        "http", "RS.io over HTTP", "http", "http", "rsio-http",
        endpoints=(
            EndpointTemplate("http", "http", "/healthz", "health check"),
            EndpointTemplate("http", "http", "/streams", "stream list (JSON)"),
            EndpointTemplate("http", "http", "/rsio/pub/<stream>", "RS.io over HTTP (PUT)"),
        ),
    ),
    ProtocolInfo(
        # RS.io over Tube: the HTTP listener's connection, once upgraded to a WebSocket.
        "tube", "RS.io over Tube (WebSocket)", "http", "tube", "tube",
        ingest=IngestDefaults(8 * MiB, 4, MiB), inlet_setting="rsio.max_inlet_bytes",
        endpoints=(EndpointTemplate("ws", "ws", "/tube", "RS.io over Tube (WebSocket)"),),
    ),
    ProtocolInfo(
        # Tolliver appended each received chunk's messages at once, bounded by bytes only:
        # they are small, and one group commit takes them all, so many may be in flight.
        "tolliver", "Tolliver (the hub's instance)", "tolliver", "tolliver", "tolliver",
        ingest=IngestDefaults(32 * MiB, 1024, MiB), client_certificates=True,
        endpoints=(
            EndpointTemplate("tolliver", "tolliver", "", "Tolliver (the hub's instance)"),
        ),
    ),
    ProtocolInfo(
        "seguro", "Seguro (event log)", "seguro", "seguro", None,
        ingest=IngestDefaults(16 * MiB, 4, 256 * 1024),
        endpoints=(EndpointTemplate("seguro", "seguro", "", "Seguro (event log)"),),
    ),
)  # fmt: skip


def by_name(name: str) -> ProtocolInfo:
    """The registered protocol ``name`` (``KeyError`` if there is none)."""
    for p in PROTOCOLS:
        if p.name == name:
            return p
    raise KeyError(name)


def listeners() -> tuple[str, ...]:
    """Every listener's name, once each, in alphabetical order (the order of the TLS
    contexts and of the exposure warning's list)."""
    return tuple(sorted({p.listener for p in PROTOCOLS}))
