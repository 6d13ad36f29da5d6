"""Settings of the durable log: segment size, sparse-index density, retention, limits."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["LogConfig", "StreamSettings"]

MiB = 1024 * 1024


@dataclass(frozen=True, slots=True)
class StreamSettings:
    """Per-stream settings; ``None`` retention means "keep forever"."""

    segment_bytes: int = 128 * MiB
    index_interval_bytes: int = 4096
    retention_bytes: int | None = None
    retention_ms: int | None = None

    def __post_init__(self) -> None:
        if self.segment_bytes < 4096:
            raise ValueError("segment_bytes must be at least 4096")
        if self.index_interval_bytes < 1:
            raise ValueError("index_interval_bytes must be positive")
        if self.retention_bytes is not None and self.retention_bytes < 0:
            raise ValueError("retention_bytes must be >= 0")
        if self.retention_ms is not None and self.retention_ms < 0:
            raise ValueError("retention_ms must be >= 0")


@dataclass(frozen=True, slots=True)
class LogConfig:
    """Settings of a whole log directory.

    ``max_record_bytes`` bounds one appended batch; ``max_pending_bytes`` bounds, per stream, the
    bytes waiting for the next group commit (appenders wait when it is full); ``recent_bytes``
    bounds, per stream, the newest committed batches kept in memory for live tails;
    ``fsync=False`` is for throw-away data only: ``append`` then returns before the data is
    durable. A commit group of at most ``inline_commit_bytes`` is written and fsynced on the
    event loop's own thread, skipping the hand-off to a worker thread (about 120 µs here, half
    an fsync): latency for small appends at the price of the loop waiting for one small fsync;
    bigger groups go to a worker thread. 0 (the library's default) sends every group to a
    thread; ``tidewire serve`` uses 64 KiB (setting ``log.inline_commit_bytes``).

    ``journal`` (with ``fsync``): commits are made durable by one write-ahead journal per log,
    whose one fdatasync serves every stream that committed meanwhile (docs/log.md,
    "Write-ahead journal"); ``journal_bytes`` is its size, which bounds the bytes written but
    not yet checkpointed; ``checkpoint_interval_s`` how often the segments are fsynced and the
    journal's bytes freed (also whenever it is half full). Off, each commit fsyncs its segment.
    """

    defaults: StreamSettings = field(default_factory=StreamSettings)
    streams: dict[str, StreamSettings] = field(default_factory=dict)
    max_record_bytes: int = 64 * MiB
    max_pending_bytes: int = 64 * MiB
    recent_bytes: int = 1 * MiB
    fsync: bool = True
    inline_commit_bytes: int = 0
    journal: bool = True
    journal_bytes: int = 64 * MiB
    checkpoint_interval_s: float = 5.0

    def __post_init__(self) -> None:
        if self.journal_bytes < 64 * 1024:
            raise ValueError("journal_bytes must be at least 65536")
        if self.checkpoint_interval_s <= 0:
            raise ValueError("checkpoint_interval_s must be positive")

    def for_stream(self, name: str) -> StreamSettings:
        return self.streams.get(name, self.defaults)
