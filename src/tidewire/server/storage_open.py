"""Where ``tidewire serve`` keeps the streams: the embedded log in ``data_dir`` (the default),
or, with ``storage.url`` set (``--storage``), a NATS JetStream cluster (docs/cluster.md).

This is where ``serve`` chooses the storage backend from its configuration (the one place
above both the hub and the cluster package); everything else reaches the streams through the
:class:`~tidewire.hub.Hub` built here (:meth:`Hub.open <tidewire.hub.Hub.open>` on the embedded
log, :meth:`Hub.connect <tidewire.hub.Hub.connect>` on a connected cluster).

In cluster mode the gateway keeps nothing on its own disk: ``data_dir`` is not opened (nor
created), the hub's own state (transactions, Tolliver offsets, Seguro points) is in the cluster
with the streams, and the TLS and access files are named by their own settings.

A cluster that cannot be reached within ``cluster.append_timeout_s`` is
:class:`StorageUnavailable`, one line naming the URLs and the reason, never a traceback;
``tidewire serve`` exits with :data:`EXIT_UNAVAILABLE` then.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from ..config import ServerConfig
from ..errors import TidewireError
from ..hub import Hub, Storage

__all__ = ["EXIT_UNAVAILABLE", "Connector", "StorageUnavailable", "connect_jetstream", "open_hub"]

log = logging.getLogger("tidewire.server")

EXIT_UNAVAILABLE = 69
"""``tidewire serve``'s exit status when the cluster cannot be reached (sysexits'
EX_UNAVAILABLE): a supervisor can tell "try again later" from a configuration error (1)."""

Connector = Callable[[ServerConfig], Awaitable[Storage]]
"""Connects the storage a configuration with ``storage.url`` names (tests give their own)."""

class StorageUnavailable(TidewireError):
    """The configured cluster did not answer."""


def gateway_name() -> str:
    """How this gateway names itself to the cluster (NATS ``/connz`` shows it)."""
    return f"tidewire gateway {socket.gethostname()} pid {os.getpid()}"


async def connect_jetstream(config: ServerConfig) -> Storage:
    """:class:`~tidewire.cluster.jetstream.JetStreamStorage` on ``config``'s cluster, with
    ``cluster.shards``, ``cluster.replicas`` and ``cluster.append_timeout_s``, and the log's
    retention settings (``log.retention_*``, ``[log.streams]``, their check interval)."""
    # (imported when used: an embedded hub loads neither nats-py nor the backend)
    from ..cluster.jetstream import JetStreamStorage

    v = config.values
    storage: Storage = await JetStreamStorage.connect(
        list(config.storage_urls),
        shards=int(v["cluster.shards"]),
        replicas=int(v["cluster.replicas"]),
        name=gateway_name(),
        config=config.log,  # per-stream retention: log.retention_*, [log.streams]
        retention_interval_s=config.retention_check_interval_s,
        append_timeout_s=float(v["cluster.append_timeout_s"]),
    )
    return storage


async def open_storage(config: ServerConfig, connect: Connector | None = None) -> Storage:
    """Connect the cluster ``config`` names, within ``cluster.append_timeout_s``; any failure
    is :class:`StorageUnavailable` (the cause is logged at debug level, with its traceback)."""
    urls = ",".join(config.storage_urls)
    seconds = float(config.values["cluster.append_timeout_s"])
    log.info("connecting to the cluster at %s (at most %g s)", urls, seconds)
    try:
        async with asyncio.timeout(seconds):
            return await (connect or connect_jetstream)(config)
    except (StorageUnavailable, TypeError, AttributeError, NameError, AssertionError):
        raise  # (ours, or a bug: a traceback, not "cannot reach the cluster")
    except TimeoutError:
        raise StorageUnavailable(f"the cluster at {urls} did not answer within {seconds:g} s "
                                 "(cluster.append_timeout_s)") from None  # fmt: skip
    except Exception as exc:  # nats-py's, the backend's, the OS's: one line for the operator
        log.debug("connecting to %s failed", urls, exc_info=True)
        why = str(exc) or type(exc).__name__
        raise StorageUnavailable(f"cannot reach the cluster at {urls}: {why}") from None


async def open_hub(config: ServerConfig, connect: Connector | None = None) -> Hub:
    """The hub ``serve`` runs: on the embedded log in ``data_dir``, or (``storage.url`` set)
    on the cluster, connected first (see the module)."""
    expiration = int(config.values["txn.expiration_ms"])
    options: dict[str, Any] = {
        "retention_interval_s": config.retention_check_interval_s,
        "txn_expiration_ms": None if expiration < 0 else expiration,
        "staging_ttl_ms": int(config.values["txn.staging_ttl_ms"]),
    }
    if not config.clustered:
        return Hub.open(config.data_dir, config.log, **options)
    return await Hub.connect(lambda: open_storage(config, connect), **options)
