"""tidewire: a Python event-streaming hub.

Durable, append-only streams of events, served over five wire protocols (RS.io over TCP and
HTTP, Tube, Tolliver, Seguro) and read and written by Apache Spark through a PySpark data source.
"""

from .client.rsio import connect
from .model import Batch, Event

__version__ = "0.1.0"

__all__ = ["Batch", "Event", "__version__", "connect"]
