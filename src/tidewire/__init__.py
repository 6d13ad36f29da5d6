"""tidewire: a Python event-streaming hub.

Durable, append-only streams of events, served over five wire protocols (RS.io over TCP and
HTTP, Tube, Tolliver, Seguro) and read and written by Apache Spark through a PySpark data source.

Importing the package loads only the model: ``connect`` (the RS.io client, which needs asyncio)
is imported on first use, so the floor modules and the sans-IO protocol cores stay free of
asyncio, the clients, the server and the hub (docs/architecture.md, "Layers").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .model import Batch, Event

if TYPE_CHECKING:
    from .client.rsio import connect

__version__ = "0.1.0"

__all__ = ["Batch", "Event", "__version__", "connect"]


def __getattr__(name: str) -> Any:
    """Import ``connect`` lazily (PEP 562): the RS.io client loads asyncio."""
    if name == "connect":
        from .client.rsio import connect

        globals()["connect"] = connect
        return connect
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
