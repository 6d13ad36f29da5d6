"""tidewire's durable append-only log: the product's own core (no library does this for us).

Written like Kafka's log: per stream, segment files of length-prefixed, CRC-checked record batches
(:mod:`.record`), a sparse id index per segment (:mod:`.segment`), and a group commit that
coalesces concurrent appenders into one write + fsync (:mod:`.store`). See docs/log.md.
"""

from .admin import Retention, StreamDeleted, StreamExists
from .config import LogConfig, StreamSettings
from .store import GroupItems, GroupWriter, GroupWritten, Log
from .stream import StreamLog, StreamStats

__all__ = [
    "GroupItems",
    "GroupWriter",
    "GroupWritten",
    "Log",
    "LogConfig",
    "Retention",
    "StreamDeleted",
    "StreamExists",
    "StreamLog",
    "StreamSettings",
    "StreamStats",
]
