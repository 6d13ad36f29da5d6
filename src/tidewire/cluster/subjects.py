"""Where a tidewire stream lives in JetStream, and the headers its records carry: pure code.

A tidewire stream ``S`` is the subject ``tw.<k>.<token(S)>`` of the JetStream stream ``TW_<k>``,
``k = CRC-32C(S) mod shards`` (docs/cluster.md "Design"). :func:`token` escapes every byte of
the UTF-8 name outside ``[A-Za-z0-9_-]`` as ``~XX`` (uppercase hex), so that ``.``, ``*``,
``>`` and spaces never reach NATS; :func:`untoken` undoes it (a round trip for every name).

Each message is one tidewire record and carries, besides the headers JetStream adds:

* ``Tw-Ids: <first>-<last>``: the record's first and last event ids;
* ``Tw-Write: <gateway uuid>:<n>``: unique per publish, so a publish whose ack was lost can be
  recognised among the stream's messages (never stored twice);
* ``Tw-Sum: <prev> <events> <bytes> <count> <size> <max_ts>``: the stream's last id before
  this record, the events and record bytes of the stream before it (since its first append,
  retention included), this record's events and bytes, and the largest event timestamp of the
  stream up to and including it. They make the stream's start id, event count, byte size and
  age answerable from two messages (its first and last) or one notification, and make
  retention a binary search (all of them only grow along the subject).

A stream's administration (issue 23: created empty, its runtime retention, deleted) is kept
beside its records, in the same shard: the subject ``tw.<k>.<token>.admin``
(:func:`admin_subject`), whose last message carries the stream's entry in the header
``Tw-Admin`` (JSON, :mod:`.admin`). Being in the same JetStream stream as the records, its
entries take sequences from the same counter and reach every gateway on the same notification
feed, in order with them.

A deleted stream's subject holds a **tombstone**: a message without a payload whose header
``Tw-Deleted: <gateway uuid>:<n>`` marks where the stream was deleted; every record before it
is gone (purged), every record after it belongs to the stream made again under the name (from
id 1). Reads skip it; a writer expects it as the subject's last message, as it would a record.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from crc32c import crc32c

__all__ = [
    "ADMIN",
    "ADMIN_OPS",
    "DELETED",
    "IDS",
    "SUM",
    "WRITE",
    "AdminEntry",
    "RecordSum",
    "admin_subject",
    "notify_subject",
    "parse_ids",
    "shard_of",
    "shard_stream",
    "stream_of_admin_subject",
    "stream_of_subject",
    "subject_of",
    "token",
    "untoken",
]

IDS = "Tw-Ids"
WRITE = "Tw-Write"
SUM = "Tw-Sum"
ADMIN = "Tw-Admin"
DELETED = "Tw-Deleted"
_ADMIN_TOKEN = "admin"

_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_HEX = "0123456789ABCDEF"


def token(stream: str) -> str:
    """The stream name as one NATS subject token: bytes outside ``[A-Za-z0-9_-]`` as ``~XX``."""
    out: list[str] = []
    for byte in stream.encode():
        if byte in _SAFE:
            out.append(chr(byte))
        else:
            out.append("~" + _HEX[byte >> 4] + _HEX[byte & 15])
    return "".join(out)


def untoken(text: str) -> str:
    """The stream name :func:`token` made ``text`` of; ``ValueError`` for a text it never makes
    (a bad escape, a byte that should have been escaped, or not UTF-8)."""
    raw = bytearray()
    i = 0
    while i < len(text):
        ch = text[i]
        if ch == "~":
            pair = text[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in _HEX for c in pair):
                raise ValueError(f"bad escape in subject token {text!r}")
            byte = int(pair, 16)
            if byte in _SAFE:
                raise ValueError(f"needless escape in subject token {text!r}")
            raw.append(byte)
            i += 3
        else:
            if ord(ch) > 127 or ord(ch) not in _SAFE:
                raise ValueError(f"unescaped {ch!r} in subject token {text!r}")
            raw.append(ord(ch))
            i += 1
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise ValueError(f"not UTF-8 in subject token {text!r}") from None


def shard_of(stream: str, shards: int) -> int:
    """The shard (JetStream stream ``TW_<k>``) holding ``stream``."""
    return crc32c(stream.encode()) % shards


def shard_stream(shard: int) -> str:
    """The JetStream stream of shard ``k``."""
    return f"TW_{shard}"


def subject_of(stream: str, shards: int) -> str:
    """The subject holding ``stream``'s records."""
    return f"tw.{shard_of(stream, shards)}.{token(stream)}"


def admin_subject(stream: str, shards: int) -> str:
    """The subject holding ``stream``'s administration entries (module docstring): four
    tokens, so never a record subject."""
    return f"{subject_of(stream, shards)}.{_ADMIN_TOKEN}"


def stream_of_admin_subject(subject: str) -> str:
    """The stream name of an admin subject ``tw.<k>.<token>.admin`` or its notification
    ``twn.<k>.<token>.admin``; ``ValueError`` for any other subject."""
    parts = subject.split(".")
    if (len(parts) != 4 or parts[0] not in ("tw", "twn") or not parts[1].isdigit()
            or parts[3] != _ADMIN_TOKEN):  # fmt: skip
        raise ValueError(f"not a tidewire admin subject: {subject!r}")
    return untoken(parts[2])


def notify_subject(subject: str) -> str:
    """Where JetStream republishes (headers only) what was stored on ``subject``."""
    return "twn." + subject.removeprefix("tw.")


def stream_of_subject(subject: str) -> str:
    """The stream name of a record subject ``tw.<k>.<token>`` or its notification
    ``twn.<k>.<token>``; ``ValueError`` for any other subject."""
    parts = subject.split(".")
    if len(parts) != 3 or parts[0] not in ("tw", "twn") or not parts[1].isdigit():
        raise ValueError(f"not a tidewire subject: {subject!r}")
    return untoken(parts[2])


def parse_ids(text: str) -> tuple[int, int]:
    """``Tw-Ids``'s ``<first>-<last>``; ``ValueError`` unless ``1 <= first <= last``."""
    first, sep, last = text.partition("-")
    a, b = int(first), int(last)
    if not sep or a < 1 or b < a:
        raise ValueError(f"bad {IDS} header {text!r}")
    return a, b


@dataclass(frozen=True, slots=True)
class RecordSum:
    """A record's ``Tw-Sum`` header (see the module): where it stands in its stream."""

    prev: int  # the stream's last id before this record (0: none ever)
    events_before: int
    bytes_before: int
    count: int
    size: int
    max_ts: int  # the largest event timestamp up to and including this record

    def __post_init__(self) -> None:
        if min(self.prev, self.events_before, self.bytes_before) < 0 or self.count < 1:
            raise ValueError(f"bad {SUM} header {self}")
        if self.size < 1:
            raise ValueError(f"bad {SUM} header {self}")

    @property
    def events_through(self) -> int:
        return self.events_before + self.count

    @property
    def bytes_through(self) -> int:
        return self.bytes_before + self.size

    def header(self) -> str:
        return (f"{self.prev} {self.events_before} {self.bytes_before} {self.count} {self.size} "
                f"{self.max_ts}")  # fmt: skip

    @classmethod
    def parse(cls, text: str) -> RecordSum:
        """The header's value; ``ValueError`` when it is not six integers as written."""
        fields = text.split(" ")
        if len(fields) != 6:
            raise ValueError(f"bad {SUM} header {text!r}")
        prev, events, size_before, count, size, max_ts = (int(f) for f in fields)
        return cls(prev, events, size_before, count, size, max_ts)

    def following(self, last_id: int, count: int, size: int, max_ts: int) -> RecordSum:
        """The sum of the next record of the stream, this record's last id being ``last_id``
        and the next one holding ``count`` events in ``size`` bytes, newest at ``max_ts``."""
        return RecordSum(last_id, self.events_through, self.bytes_through, count, size,
                         max(self.max_ts, max_ts))  # fmt: skip


ADMIN_OPS = ("create", "retention", "delete")


@dataclass(frozen=True, slots=True)
class AdminEntry:
    """A stream's administration entry, the ``Tw-Admin`` header of the last message of its
    admin subject (module docstring). Each entry states the whole administration of the stream,
    not a change, so the last one alone is the truth:

    * ``{"op":"create"}``: created empty, the configuration's retention applies;
    * ``{"op":"create","retention_ms":M,"retention_bytes":B}``: created with that runtime
      retention (``null``: no bound), over the configuration's;
    * ``{"op":"retention","retention_ms":M,"retention_bytes":B}``: its runtime retention
      changed (the stream exists, with records or created empty);
    * ``{"op":"delete"}``: deleted; the records before it are gone (a later record starts the
      stream again, from id 1).
    """

    op: str
    runtime: tuple[int | None, int | None] | None = None  # (ms, bytes) over the config's

    def __post_init__(self) -> None:
        if self.op not in ADMIN_OPS:
            raise ValueError(f"bad {ADMIN} op {self.op!r}")
        if (self.op == "retention" and self.runtime is None) or (
                self.op == "delete" and self.runtime is not None):  # fmt: skip
            raise ValueError(f"bad {ADMIN} entry {self}")
        for value in self.runtime or ():
            if value is not None and (type(value) is not int or not 0 <= value < 2**63):
                raise ValueError(f"bad {ADMIN} retention {value!r}")

    @property
    def live(self) -> bool:
        """Whether the stream exists by this entry (not deleted)."""
        return self.op != "delete"

    def header(self) -> str:
        doc: dict[str, object] = {"op": self.op}
        if self.runtime is not None:
            doc["retention_ms"], doc["retention_bytes"] = self.runtime
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str) -> AdminEntry:
        """The header's value; ``ValueError`` when it is not an entry as written."""
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict) or set(doc) - {"op", "retention_ms", "retention_bytes"}:
                raise ValueError("unknown keys")
            runtime = None
            if "retention_ms" in doc or "retention_bytes" in doc:
                runtime = (doc["retention_ms"], doc["retention_bytes"])
            return cls(doc["op"], runtime)
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad {ADMIN} header {text[:200]!r}: {exc}") from None
