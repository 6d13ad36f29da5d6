"""The package's layers as docs/architecture.md draws them, checked on the source itself: the
floor and the protocol cores load no asyncio, client, server or hub."""

from __future__ import annotations

import subprocess
import sys

FLOOR = (
    "tidewire.model",
    "tidewire.record",
    "tidewire.protocols.rsio",
    "tidewire.protocols.tube",
    "tidewire.protocols.tolliver",
    "tidewire.protocols.seguro",
    "tidewire.protocols.rsio_http",
)
ABOVE = ("asyncio", "tidewire.client", "tidewire.server", "tidewire.hub", "tidewire.log")


def test_floor_and_protocol_cores_load_nothing_above_them() -> None:
    """A fresh interpreter imports the model, the record format and every protocol core, then
    lists what got loaded: none of asyncio, the clients, the server, the hub or the log."""
    script = (
        f"import {', '.join(FLOOR)}; import sys; "
        f"print(' '.join(m for m in sys.modules if m in {ABOVE!r} "
        f"or m.startswith(tuple(p + '.' for p in {ABOVE!r}))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == []


def test_connect_is_still_exported() -> None:
    """``from tidewire import connect`` works, lazily (the RS.io client)."""
    import tidewire
    from tidewire import Batch, connect
    from tidewire.client.rsio import connect as rsio_connect

    assert connect is rsio_connect
    assert tidewire.Batch is Batch
    assert "connect" in tidewire.__all__
