"""The error tree: one base, :class:`TidewireError`, for every error tidewire raises on purpose.

Subclasses may also derive from the built-in they refine (``ValueError``, ``KeyError``,
``ConnectionError``), so callers that catch those keep working. Errors that map to a wire code
or an HTTP status carry it (``AccessError.status``). The protocol errors follow h11:
:class:`LocalProtocolError` (this side misused the API) vs :class:`RemoteProtocolError` (the
peer broke the rules). Adapters translate them once, at their boundary.

This module imports nothing of tidewire; :mod:`tidewire.model` re-exports every name.
"""

from __future__ import annotations

import errno as _errno
import os

__all__ = [
    "AccessError",
    "CorruptLogError",
    "DataLossError",
    "Forbidden",
    "IdOrderError",
    "InvalidBatch",
    "InvalidStreamName",
    "LimitExceeded",
    "LocalProtocolError",
    "LogClosedError",
    "LogError",
    "ProtocolError",
    "RemoteProtocolError",
    "StorageFullError",
    "TidewireError",
    "Unauthenticated",
    "UnknownStream",
]


class TidewireError(Exception):
    """Base of every error tidewire raises on purpose."""


class InvalidStreamName(TidewireError, ValueError):
    """A stream name that is empty, too long, not UTF-8, or holds whitespace or controls."""


class InvalidBatch(TidewireError, ValueError):
    """A batch whose buffers disagree, or whose ids are not strictly increasing."""


class UnknownStream(TidewireError, KeyError):
    """The stream does not exist (reads never create streams)."""

    def __str__(self) -> str:
        return f"unknown stream {self.args[0]!r}" if self.args else "unknown stream"


class LimitExceeded(TidewireError):
    """A bounded buffer, queue or size limit would be exceeded."""

    def __init__(self, what: str, limit: int, got: int) -> None:
        super().__init__(f"{what}: {got} exceeds the limit of {limit}")
        self.what = what
        self.limit = limit
        self.got = got


class LogError(TidewireError):
    """Base of the durable log's errors."""


class LogClosedError(LogError):
    """The log (or the stream) was closed, or failed and must be reopened."""


class IdOrderError(LogError, ValueError):
    """Caller-chosen ids that are not greater than the stream's latest id."""

    def __init__(self, stream: str, first_id: int, latest: int) -> None:
        super().__init__(
            f"stream {stream!r}: id {first_id} is not greater than the latest id {latest}"
        )
        self.stream = stream
        self.first_id = first_id
        self.latest = latest


class DataLossError(LogError):
    """The requested id was removed by retention (it is below the stream's first id)."""

    def __init__(self, stream: str, requested: int, first_id: int) -> None:
        super().__init__(
            f"stream {stream!r}: id {requested} was removed by retention; "
            f"the first retained id is {first_id}"
        )
        self.stream = stream
        self.requested = requested
        self.first_id = first_id


class StorageFullError(LogError):
    """A write refused because the file system is full (``ENOSPC``) or its quota is spent
    (``EDQUOT``). Nothing of it was stored: the file was cut back to its last commit, freeing
    what the write took. The stream stays open; a later append tries again, and succeeds once
    there is space. ``during`` says which file operation ran out of space."""

    def __init__(self, stream: str, errno: int, during: str) -> None:
        code = _errno.errorcode.get(errno, str(errno))
        super().__init__(
            f"stream {stream!r}: disk full ({code}: {os.strerror(errno)}) {during}: the write "
            "was refused and nothing of it stored; appends resume once there is space"
        )
        self.stream = stream
        self.errno = errno
        self.during = during


class CorruptLogError(LogError):
    """A log file is damaged before its tail: never skipped, always reported with its place."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"corrupt log file {path} at byte offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class AccessError(TidewireError):
    """A peer that may not do what it asked. ``status`` is the HTTP status it maps to."""

    status = 403


class Unauthenticated(AccessError):
    """Credentials that are wrong, expired, or do not name who the peer claims to be."""

    status = 401


class Forbidden(AccessError):
    """A known principal asking for a stream the ACL does not grant it."""

    status = 403


class ProtocolError(TidewireError):
    """A breach of a wire protocol. Subclasses say which side broke it."""


class LocalProtocolError(ProtocolError):
    """We were asked to do something the protocol forbids (a bug or misuse on this side)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something the protocol forbids."""
