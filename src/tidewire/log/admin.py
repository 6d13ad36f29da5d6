"""A stream's administration in the embedded log: its runtime retention, kept in its own
directory, and its deletion (docs/log.md, "Deleting a stream", "Runtime retention").

**Runtime retention** is a small JSON file in the stream's directory, ``retention.json``
(``{"retention_ms": <int|null>, "retention_bytes": <int|null>}``, ``null``: keep forever),
written atomically (a temporary file, fsynced, renamed over the old one, the directory
fsynced). When it is there it overrides the configuration file's values for that stream
(``[log.streams."<name>"]`` and ``[log]``'s defaults), at run time and after every restart.
It lives with the stream rather than in a ledger stream (``_tidewire.*``): a ledger stream is
subject to retention like any other, so an old setting could age out of it; this file cannot,
and it goes with the stream's directory when the stream is deleted.

**Deletion** mirrors creation (:meth:`~.stream.StreamLog.create`'s ``.creating-`` staging
directory): the stream's files are closed, its directory is renamed to ``.deleting-<dir>``
(one atomic step: from then on no open ever finds the stream), the data directory is fsynced,
the journal checkpointed (so that none of its entries for the old directory is ever replayed
into a stream created later under the same name), and the renamed directory removed. A crash
at any point leaves either the whole stream or none of it: :meth:`~.store.Log.open` removes a
``.deleting-`` directory it finds.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, replace

from ..model import CorruptLogError, LogError
from .config import StreamSettings
from .journal import Journal
from .stream import RETENTION_FILE, StreamLog, fsync_dir

__all__ = [
    "DELETING_PREFIX",
    "RETENTION_FILE",
    "Retention",
    "StreamDeleted",
    "StreamExists",
    "apply_override",
    "encode_override",
    "read_override",
    "remove_stream_files",
    "write_override",
]

log = logging.getLogger("tidewire.log")

DELETING_PREFIX = ".deleting-"
_TEMP = RETENTION_FILE + ".tmp"


class StreamExists(LogError):
    """A stream of that name exists already (creating it again)."""


class StreamDeleted(LogError):
    """The stream was deleted while one waited for it or read it: what its live subscriptions
    end with (RS.io's ``onError "stream deleted"``, docs/protocols/rsio.md)."""

    def __str__(self) -> str:
        return "stream deleted"


@dataclass(frozen=True, slots=True)
class Retention:
    """A stream's retention as it applies: ``ms`` and ``bytes`` (``None``: no bound) and where
    they come from: ``"runtime"`` (set through the admin API), ``"config"`` (the stream's own
    ``[log.streams."<name>"]`` table) or ``"default"`` (the ``[log]`` defaults)."""

    ms: int | None
    bytes: int | None
    source: str


def encode_override(retention_ms: int | None, retention_bytes: int | None) -> bytes:
    """The contents of ``retention.json``."""
    for name, value in (("retention_ms", retention_ms), ("retention_bytes", retention_bytes)):
        if value is not None and (isinstance(value, bool) or value < 0):
            raise ValueError(f"{name} must be a non-negative integer or null")
    return json.dumps({"retention_ms": retention_ms, "retention_bytes": retention_bytes},
                      separators=(",", ":")).encode()  # fmt: skip


def read_override(directory: str) -> tuple[int | None, int | None] | None:
    """The runtime retention kept in the stream ``directory`` (ms, bytes), or ``None`` when it
    has none. A damaged file is :class:`CorruptLogError` (the stream's settings are not
    guessed)."""
    path = os.path.join(directory, RETENTION_FILE)
    try:
        with open(path, "rb") as f:
            raw = f.read(4096)
    except FileNotFoundError:
        return None
    try:
        doc = json.loads(raw)
        ms, nbytes = doc["retention_ms"], doc["retention_bytes"]
        for value in (ms, nbytes):
            if value is not None and (type(value) is not int or value < 0):
                raise ValueError(f"{value!r} is not a non-negative integer or null")
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptLogError(path, 0, f"not a retention setting: {exc}") from None
    return ms, nbytes


def write_override(directory: str, data: bytes) -> None:
    """Replace ``retention.json`` in ``directory`` atomically and durably (module docstring)."""
    temp = os.path.join(directory, _TEMP)
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, os.path.join(directory, RETENTION_FILE))
    fsync_dir(directory)


def apply_override(settings: StreamSettings, override: tuple[int | None, int | None] | None
                   ) -> StreamSettings:  # fmt: skip
    """``settings`` with the runtime retention ``override`` (if any) in place of its own."""
    if override is None:
        return settings
    return replace(settings, retention_ms=override[0], retention_bytes=override[1])


def remove_stream_files(root: str, stream: StreamLog, journal: Journal | None) -> None:
    """Delete a closed stream's directory (module docstring; the caller has settled its
    appends and taken it out of the log). Synchronous: run it in a worker thread."""
    stream.close()
    doomed = os.path.join(root, DELETING_PREFIX + os.path.basename(stream.directory))
    shutil.rmtree(doomed, ignore_errors=True)  # (a leftover of the same name: never a stream)
    os.rename(stream.directory, doomed)
    fsync_dir(root)
    if journal is not None:  # every entry of the stream is durable (settled): cover them
        journal.checkpoint()
    shutil.rmtree(doomed, ignore_errors=True)
    fsync_dir(root)
    log.info("deleted stream %r (%s)", stream.name, stream.directory)
