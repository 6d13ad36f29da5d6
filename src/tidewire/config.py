"""Server configuration: a TOML file, overridden by ``TIDEWIRE_*`` variables, overridden by flags.

Every setting has a dotted key (``data_dir``, ``http.port``, ``log.retention_ms``, ...). In the
TOML file a key ``a.b`` is key ``b`` of table ``[a]``; its environment variable is
``TIDEWIRE_A_B`` (upper case, dots as underscores); on the command line it is
``--set a.b=VALUE`` (a few have flags of their own, e.g. ``--data-dir``). Per-stream log settings
live in TOML tables ``[log.streams."<stream name>"]`` only. Unknown keys are errors, not
silently ignored. ``docs/configuration.md`` lists every key.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from .log import LogConfig, StreamSettings
from .model import InvalidStreamName, TidewireError, validate_stream_name

__all__ = ["SETTINGS", "ConfigError", "ServerConfig", "load_config", "storage_urls"]


class ConfigError(TidewireError, ValueError):
    """A setting that is unknown or has the wrong type or value."""


# key -> (type, default, help)
SETTINGS: dict[str, tuple[type, Any, str]] = {
    "data_dir": (str, "./tidewire-data", "directory of the embedded log (unused with storage.url)"),
    "host": (str, "127.0.0.1", "address every listener binds to"),
    "log_level": (str, "info", "debug, info, warning or error"),
    "log_format": (str, "text", "text (readable lines) or json (one JSON object per line)"),
    "shutdown_seconds": (float, 10.0,
                         "SIGTERM: longest wait for in-flight writes before closing anyway"),
    "http.port": (int, 7480, "HTTP listener (admin, RS.io over HTTP; 0 = any free port)"),
    "http.poll_seconds": (float, 25.0,
                          "RS.io over HTTP: a fetch with nothing to send gets 204 after it"),
    "http.idle_seconds": (float, 300.0,
                          "RS.io over HTTP: a subscription idle this long is cancelled"),
    "http.max_subscriptions": (int, 10_000, "RS.io over HTTP: subscriptions on the hub at once"),
    "http.max_response_bytes": (int, 4 * 1024 * 1024,
                                "RS.io over HTTP: elements in one response (one may be more)"),
    "rsio.port": (int, 7400, "RS.io over TCP listener (0 = any free port)"),
    "tolliver.port": (int, 7402, "Tolliver listener, the hub's instance (0 = any free port)"),
    "seguro.port": (int, 7403, "Seguro listener (0 = any free port)"),
    "seguro.max_event_bytes": (int, 64 * 1024 * 1024, "largest Seguro event"),
    "seguro.max_many_events": (int, 2**32, "most events one SAVE MANY may declare"),
    "rsio.max_string_bytes": (int, 64 * 1024, "longest String field (publisher, reason)"),
    "rsio.max_element_bytes": (int, 16 * 1024 * 1024, "longest element (and onNextPacked body)"),
    "rsio.max_subscriptions": (int, 1024, "subscriptions at once on one connection"),
    "rsio.max_offers": (int, 256, "publishing offers at once on one connection"),
    "rsio.max_inlet_bytes": (int, 0,
                             "RS.io's own ingest.max_pending_bytes (0: that setting's)"),
    "rsio.max_txn_bytes": (int, 64 * 1024 * 1024,
                           "per connection, held for transaction offers until complete"),
    "ingest.max_pending_bytes": (int, 0,
                                 "per connection, received and not yet durable: reading pauses "
                                 "above it (0: RS.io 8 MiB, Seguro 16 MiB, Tolliver 32 MiB)"),
    "ingest.appends_in_flight": (int, 0,
                                 "per RS.io offer, Seguro session or Tolliver link (0: RS.io "
                                 "and Seguro 4, Tolliver 1024)"),
    "ingest.commit_bytes": (int, 0,
                            "about how much one append gathers (0: RS.io 1 MiB, Seguro 256 KiB)"),
    "txn.expiration_ms": (int, -1,
                          "forget a transaction id this long after its commit (-1: only once "
                          "retention removed its events)"),
    "txn.staging_ttl_ms": (int, 24 * 3600 * 1000,
                           "drop a transaction's staged parts (the Spark sink's) untouched "
                           "this long, after a retention pass"),
    "memory.budget_bytes": (int, 1024 * 1024 * 1024,
                            "every byte waiting in the hub for a peer, all connections together "
                            "(docs/security.md)"),
    "memory.principal_bytes": (int, 256 * 1024 * 1024,
                               "the share of one principal, all its connections together "
                               "(anonymous peers are one principal)"),
    "memory.connection_bytes": (int, 96 * 1024 * 1024, "the share of one connection"),
    "tls.cert_file": (str, "", "the hub's certificate chain (PEM); set: every listener is TLS"),
    "tls.key_file": (str, "", "the private key of tls.cert_file (PEM)"),
    "tls.ca_file": (str, "", "CA certificates (PEM) that client certificates must chain to"),
    "tls.client_auth": (str, "none", "client certificates: none, optional or required"),
    "tls.min_version": (str, "1.2", "oldest TLS version accepted: 1.2 or 1.3"),
    "http.tls": (bool, True, "the HTTP listener uses TLS when tls.cert_file is set"),
    "rsio.tls": (bool, True, "the RS.io listener uses TLS when tls.cert_file is set"),
    "seguro.tls": (bool, True, "the Seguro listener uses TLS when tls.cert_file is set"),
    "tolliver.tls": (bool, True, "the Tolliver listener uses TLS (with client certificates)"),
    "auth.tokens_file": (str, "", "bearer tokens the hub accepts (TOML; `tidewire token create`)"),
    "auth.acl_file": (str, "", "who may read and write which streams (TOML); unset: everyone"),
    "limits.max_connections": (int, 10_000, "connections at once, every listener together"),
    "limits.max_connections_per_peer": (int, 256, "connections at once from one peer network"),
    "limits.handshake_seconds": (float, 10.0,
                                 "TLS plus the protocol's handshake must finish within it"),
    "limits.idle_seconds": (float, 3600.0, "nothing received or sent this long: closed (0: never)"),
    "limits.write_stall_seconds": (float, 60.0,
                                   "a peer that reads none of its pending output this long: "
                                   "dropped (0: never)"),
    "limits.message_seconds": (float, 60.0,
                               "an inbound message begun and unfinished this long: the "
                               "connection is closed (0: never)"),
    "limits.max_refusals": (int, 100,
                            "requests refused in a row (no success between) that end a "
                            "connection"),
    "limits.refusal_close_seconds": (float, 0.1,
                                     "a peer refused or in breach, told why, is closed this "
                                     "much later, not read meanwhile (0: at once)"),
    "limits.fair_busy": (float, 0.5,
                         "loop share all principals' work must pass before one over its "
                         "fair share waits (over 1: never)"),
    "limits.anonymous_loop_share": (float, 0.25,
                                    "the most of a contended loop anonymous peers may take"),
    # identity (issue 20): what one peer of limits.max_connections_per_peer is
    "limits.peer_prefix_v4": (int, 32,
                              "IPv4 addresses in one prefix this long are one peer (32: each)"),
    "limits.peer_prefix_v6": (int, 64,
                              "IPv6 addresses in one prefix this long are one peer (a /64)"),
    "http.header_seconds": (float, 10.0, "a request's headers must arrive within it (slowloris)"),
    "http.body_seconds": (float, 60.0, "a request's body must arrive within it"),
    "http.max_body_bytes": (int, 16 * 1024 * 1024, "largest request body (RS.io HTTP publish)"),
    # issue 20, RS.io over HTTP: quotas per principal
    "http.max_subscriptions_per_principal": (int, 1_000,
                                             "RS.io over HTTP: subscriptions of one principal "
                                             "at once (anonymous peers are one principal)"),
    # issue 23: the names a browser may reach the hub by (DNS rebinding; docs/security.md)
    "http.allowed_hosts": (str, "",
                           "host names the HTTP listener serves to browsers besides `host`, "
                           "localhost, this machine's name and IP literals, comma-separated "
                           "(.example.com: and its subdomains; *: any)"),
    # Tube (issue 20): the message bound, the fragment floor, the Origin allow-list
    "tube.max_message_bytes": (int, 32 * 1024 * 1024, "largest Tube message, after inflation"),
    "tube.min_fragment_size": (int, 4096,
                               "smallest fragment size a Tube peer may ask for (0 aside)"),
    "tube.allowed_origins": (str, "",
                             "Origins allowed on /tube besides the hub's own and none, comma- "
                             "separated (*: any)"),
    "tolliver.max_message_bytes": (int, 16 * 1024 * 1024, "largest Tolliver message body"),
    "tolliver.max_subscriptions": (int, 1024, "subscriptions one Tolliver remote may hold"),
    # -- Tolliver, issue 20 (channels, unacked bytes, identity)
    "tolliver.max_channels": (int, 16384,
                              "channels the hub's own Tolliver subscription list holds at most"),
    "tolliver.max_unacked_bytes": (int, 32 * 1024 * 1024,
                                   "deliveries awaiting one Tolliver remote's acks, in bytes"),
    "tolliver.remote_retention_seconds": (float, 30 * 86400.0,
                                          "a Tolliver remote away this long: its offsets are "
                                          "forgotten"),
    "tolliver.allow_plaintext": (bool, False,
                                 "with an ACL, accept Tolliver remotes without TLS (as "
                                 "anonymous)"),
    # the dashboard (issue 23): its charts' history (/api/history)
    "dashboard.history_seconds": (int, 900, "seconds of once-a-second points the charts keep"),
    "dashboard.history_streams": (int, 32, "streams in each point: the busiest of that second"),
    "log.segment_bytes": (int, 128 * 1024 * 1024, "roll a segment past this size"),
    "log.index_interval_bytes": (int, 4096, "bytes of records between sparse-index entries"),
    "log.retention_bytes": (int, -1, "keep at least this many bytes per stream (-1 = no limit)"),
    "log.retention_ms": (int, -1, "drop segments whose newest event is older (-1 = never)"),
    "log.retention_check_interval_s": (float, 60.0, "how often retention runs"),
    "log.max_record_bytes": (int, 64 * 1024 * 1024, "largest batch one append may write"),
    "log.max_pending_bytes": (int, 64 * 1024 * 1024, "per stream, bytes queued for a commit"),
    "log.recent_bytes": (int, 1024 * 1024, "per stream, newest commits kept in memory"),
    "log.fsync": (bool, True, "fsync every commit (false only for throw-away data)"),
    "log.inline_commit_bytes": (int, 64 * 1024,
                                "commit groups this small are fsynced on the event loop's thread"),
    "log.journal": (bool, True, "one write-ahead journal fsync serves every stream's commits"),
    "log.journal_bytes": (int, 64 * 1024 * 1024, "size of the journal ring (bytes in flight)"),
    "log.checkpoint_interval_s": (float, 5.0, "how often segments are fsynced, journal freed"),
    # cluster (issue 21): the streams in a NATS JetStream cluster instead (docs/cluster.md)
    "storage.url": (str, "",
                    "NATS JetStream cluster to store streams in: nats:// or tls:// URLs, comma-"
                    "separated (unset: the embedded log in data_dir)"),
    "cluster.shards": (int, 16, "JetStream streams the tidewire streams are spread over"),
    "cluster.replicas": (int, 3, "replicas of each JetStream stream (at most the servers)"),
    "cluster.append_timeout_s": (float, 30.0,
                                 "longest wait for the cluster: an append's ack, the first "
                                 "connection at start"),
}

_STREAM_KEYS = {"segment_bytes", "index_interval_bytes", "retention_bytes", "retention_ms"}


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The resolved settings of ``tidewire serve``."""

    values: Mapping[str, Any]
    log: LogConfig
    stream_overrides: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def data_dir(self) -> str:
        return str(self.values["data_dir"])

    @property
    def host(self) -> str:
        return str(self.values["host"])

    @property
    def http_port(self) -> int:
        return int(self.values["http.port"])

    @property
    def rsio_port(self) -> int:
        return int(self.values["rsio.port"])

    @property
    def tolliver_port(self) -> int:
        return int(self.values["tolliver.port"])

    @property
    def seguro_port(self) -> int:
        return int(self.values["seguro.port"])

    @property
    def log_level(self) -> str:
        return str(self.values["log_level"])

    @property
    def retention_check_interval_s(self) -> float:
        return float(self.values["log.retention_check_interval_s"])

    @property
    def storage_urls(self) -> tuple[str, ...]:
        """The cluster's URLs (``storage.url``, validated); empty: the embedded log."""
        return storage_urls(str(self.values["storage.url"]))

    @property
    def clustered(self) -> bool:
        """Whether the streams are in a cluster (``storage.url`` is set), not in data_dir."""
        return bool(self.storage_urls)


def _convert(key: str, kind: type, raw: object) -> Any:
    """Convert ``raw`` (from TOML, an env variable or a flag) to the setting's type."""
    if isinstance(raw, str) and kind is not str:
        text = raw.strip()
        try:
            if kind is bool:
                if text.lower() in ("1", "true", "yes", "on"):
                    return True
                if text.lower() in ("0", "false", "no", "off"):
                    return False
                raise ValueError(text)
            return kind(text)
        except ValueError:
            raise ConfigError(f"{key}: {raw!r} is not a valid {kind.__name__}") from None
    if kind is float and isinstance(raw, int) and not isinstance(raw, bool):
        return float(raw)
    if type(raw) is not kind:
        raise ConfigError(f"{key}: expected {kind.__name__}, got {type(raw).__name__} {raw!r}")
    return raw


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in table.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and key != "log.streams":
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def env_name(key: str) -> str:
    return "TIDEWIRE_" + key.replace(".", "_").upper()


def load_config(
    path: str | None = None,
    overrides: Mapping[str, object] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Defaults < TOML file at ``path`` < ``TIDEWIRE_*`` in ``environ`` < ``overrides``."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {k: default for k, (_, default, _) in SETTINGS.items()}
    streams: dict[str, dict[str, int]] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                document = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {path}: {exc}") from None
        for key, raw in _flatten(document).items():
            if key == "log.streams":
                streams = _stream_tables(raw)
                continue
            if key not in SETTINGS:
                raise ConfigError(f"{path}: unknown setting {key!r}")
            values[key] = _convert(key, SETTINGS[key][0], raw)
    for key, (kind, _, _) in SETTINGS.items():
        if env_name(key) in environ:
            values[key] = _convert(env_name(key), kind, environ[env_name(key)])
    for key, raw in (overrides or {}).items():
        if key not in SETTINGS:
            raise ConfigError(f"unknown setting {key!r}")
        if raw is not None:
            values[key] = _convert(key, SETTINGS[key][0], raw)
    _check(values)
    return ServerConfig(values, _log_config(values, streams), streams)


_LIMITS: dict[str, tuple[float, float]] = {  # inclusive ranges of the numeric settings
    "http.port": (0, 65535),
    "http.poll_seconds": (0.001, 3600),
    "http.idle_seconds": (0.01, 10**9),
    "http.max_subscriptions": (1, 2**24),
    "http.max_response_bytes": (1024, 2**31),
    "rsio.port": (0, 65535),
    "tolliver.port": (0, 65535),
    "seguro.port": (0, 65535),
    "seguro.max_event_bytes": (1, 2**32),
    "seguro.max_many_events": (2, 2**63),
    "rsio.max_string_bytes": (16, 2**31),
    "rsio.max_element_bytes": (16, 2**31),
    "rsio.max_subscriptions": (1, 2**20),
    "rsio.max_offers": (1, 2**20),
    "rsio.max_inlet_bytes": (0, 2**40),
    "ingest.max_pending_bytes": (0, 2**40),
    "ingest.appends_in_flight": (0, 65536),
    "ingest.commit_bytes": (0, 2**30),
    "txn.expiration_ms": (-1, 2**62),
    "txn.staging_ttl_ms": (1000, 2**62),
    "rsio.max_txn_bytes": (4096, 2**40),
    "log.max_record_bytes": (4096, 2**32 - 4096),
    "memory.budget_bytes": (1024 * 1024, 2**50),
    "memory.principal_bytes": (1024 * 1024, 2**50),
    "memory.connection_bytes": (1024 * 1024, 2**50),
    "limits.max_connections": (1, 2**24),
    "limits.max_connections_per_peer": (1, 2**24),
    "limits.handshake_seconds": (0, 10**6),
    "limits.idle_seconds": (0, 10**9),
    "limits.write_stall_seconds": (0, 10**9),
    "limits.message_seconds": (0, 10**9),
    "limits.max_refusals": (1, 2**31),
    "limits.refusal_close_seconds": (0, 60),
    "limits.fair_busy": (0, 10),
    "limits.anonymous_loop_share": (0.01, 1),
    # identity (issue 20)
    "limits.peer_prefix_v4": (0, 32),
    "limits.peer_prefix_v6": (0, 128),
    "http.header_seconds": (0.01, 10**6),
    "http.body_seconds": (0.01, 10**6),
    "http.max_body_bytes": (1024, 2**31),
    # issue 20, RS.io over HTTP: quotas per principal
    "http.max_subscriptions_per_principal": (1, 2**24),
    # Tube (issue 20)
    "tube.max_message_bytes": (1024, 2**31),
    "tube.min_fragment_size": (8, 2**31 - 1),
    "tolliver.max_message_bytes": (1024, 2**31 - 1),
    "tolliver.max_subscriptions": (1, 2**20),
    # -- Tolliver, issue 20
    "tolliver.max_channels": (1, 65536),
    "tolliver.max_unacked_bytes": (4096, 2**40),
    "tolliver.remote_retention_seconds": (1, 10**10),
    # the dashboard (issue 23): memory is about 60 bytes x seconds x streams
    "dashboard.history_seconds": (1, 86400),
    "dashboard.history_streams": (1, 1024),
    "log.max_pending_bytes": (1, 2**62),
    "log.recent_bytes": (0, 2**62),
    "log.inline_commit_bytes": (0, 2**30),
    "log.journal_bytes": (64 * 1024, 2**40),
    "log.checkpoint_interval_s": (0.001, 10**6),
    "log.retention_check_interval_s": (0.001, 10**9),
    "shutdown_seconds": (0, 3600),
    # cluster (issue 21); JetStream allows at most 5 replicas of a stream
    "cluster.shards": (1, 1024),
    "cluster.replicas": (1, 5),
    "cluster.append_timeout_s": (0.1, 3600),
}


def _check(values: Mapping[str, Any]) -> None:
    if values["log_level"] not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"log_level: {values['log_level']!r} is not debug/info/warning/error")
    if values["log_format"] not in ("text", "json"):
        raise ConfigError(f"log_format: {values['log_format']!r} is not text or json")
    for key, (low, high) in _LIMITS.items():
        if not low <= values[key] <= high:
            raise ConfigError(f"{key}: {values[key]} is outside {low:g}..{high:g}")
    for key in ("rsio.max_inlet_bytes", "ingest.max_pending_bytes", "ingest.commit_bytes"):
        if 0 < values[key] < 4096:
            raise ConfigError(f"{key}: {values[key]} is below 4096 (0: the default)")
    if not (values["memory.connection_bytes"] <= values["memory.principal_bytes"]
            <= values["memory.budget_bytes"]):
        raise ConfigError("memory: need connection_bytes <= principal_bytes <= budget_bytes")
    for key in ("log.retention_bytes", "log.retention_ms"):
        _check_retention(key, values[key])
    if values["tls.client_auth"] not in ("none", "optional", "required"):
        raise ConfigError(f"tls.client_auth: {values['tls.client_auth']!r} is not "
                          "none/optional/required")  # fmt: skip
    if values["tls.min_version"] not in ("1.2", "1.3"):
        raise ConfigError(f"tls.min_version: {values['tls.min_version']!r} is not 1.2 or 1.3")
    if bool(values["tls.cert_file"]) != bool(values["tls.key_file"]):
        raise ConfigError("tls.cert_file and tls.key_file go together")
    if values["tls.client_auth"] != "none" and not values["tls.ca_file"]:
        raise ConfigError("tls.client_auth needs tls.ca_file (the CA of client certificates)")
    if values["tls.cert_file"] and values["tolliver.tls"] and not values["tls.ca_file"]:
        raise ConfigError("Tolliver over TLS requires client certificates: set tls.ca_file "
                          "(or tolliver.tls = false)")  # fmt: skip
    storage_urls(values["storage.url"])  # (ConfigError when it lists no valid URLs)


STORAGE_SCHEMES = ("nats", "tls")
"""What ``storage.url`` may list: plain NATS, or NATS over TLS."""


def storage_urls(text: str) -> tuple[str, ...]:
    """``storage.url`` as a list: empty for ``""`` (the embedded log), else every
    comma-separated URL, stripped, each ``nats://host[:port]`` or ``tls://host[:port]``;
    :class:`ConfigError` names the first that is not one. Credentials in a URL are refused:
    the URLs are printed (``serve``'s banner, the admin API), and secrets never are."""
    if not text.strip():
        return ()
    urls: list[str] = []
    for raw in text.split(","):
        url = raw.strip()
        why = _bad_url(url)
        if why:
            shown = url if "@" not in url else "...@" + url.rpartition("@")[2]  # (no secret)
            raise ConfigError(f"storage.url: {shown!r} {why} (expected nats://host:port or "
                              "tls://host:port, comma-separated)")  # fmt: skip
        if url in urls:
            raise ConfigError(f"storage.url: {url!r} is listed twice")
        urls.append(url)
    return tuple(urls)


def _bad_url(url: str) -> str:
    """Why ``url`` is no NATS server URL (``""``: it is one)."""
    if not url:
        return "is empty"
    try:
        parts = urlsplit(url)
        port = parts.port  # (ValueError when it is no number, or out of range)
    except ValueError:
        return "has no valid port"
    if not parts.scheme:
        return "has no scheme"
    if parts.scheme not in STORAGE_SCHEMES:
        return f"has the scheme {parts.scheme!r}, not nats or tls"
    if not parts.hostname:
        return "has no host"
    if parts.username is not None or parts.password is not None:
        return "holds credentials, which would be printed"
    if parts.path not in ("", "/") or parts.query or parts.fragment or port == 0:
        return "is more than a server's address"
    return ""


def _check_retention(key: str, value: int) -> None:
    if value < -1:
        raise ConfigError(f"{key}: {value} is neither -1 (no limit) nor >= 0")


def _stream_tables(raw: object) -> dict[str, dict[str, int]]:
    if not isinstance(raw, dict):
        raise ConfigError("log.streams must be a table of per-stream tables")
    out: dict[str, dict[str, int]] = {}
    for name, table in raw.items():
        try:
            validate_stream_name(name)
        except InvalidStreamName as exc:
            raise ConfigError(f"log.streams: {exc}") from None
        if not isinstance(table, dict) or not set(table) <= _STREAM_KEYS:
            raise ConfigError(
                f"log.streams.{name!r}: allowed keys are {', '.join(sorted(_STREAM_KEYS))}"
            )
        out[name] = {k: _convert(f"log.streams.{name}.{k}", int, v) for k, v in table.items()}
        for key in ("retention_bytes", "retention_ms"):
            if key in out[name]:
                _check_retention(f"log.streams.{name}.{key}", out[name][key])
    return out


def _settings(values: Mapping[str, Any]) -> StreamSettings:
    def limit(v: int) -> int | None:
        return None if v < 0 else v

    try:
        return StreamSettings(
            segment_bytes=values["segment_bytes"],
            index_interval_bytes=values["index_interval_bytes"],
            retention_bytes=limit(values["retention_bytes"]),
            retention_ms=limit(values["retention_ms"]),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _log_config(values: Mapping[str, Any], streams: Mapping[str, Mapping[str, int]]) -> LogConfig:
    base = {k: values[f"log.{k}"] for k in _STREAM_KEYS}
    return LogConfig(
        defaults=_settings(base),
        streams={name: _settings({**base, **over}) for name, over in streams.items()},
        max_record_bytes=values["log.max_record_bytes"],
        max_pending_bytes=values["log.max_pending_bytes"],
        recent_bytes=values["log.recent_bytes"],
        fsync=values["log.fsync"],
        inline_commit_bytes=values["log.inline_commit_bytes"],
        journal=values["log.journal"],
        journal_bytes=values["log.journal_bytes"],
        checkpoint_interval_s=values["log.checkpoint_interval_s"],
    )
