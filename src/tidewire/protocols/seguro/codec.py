"""The Seguro wire (seed 004): limits, the events both sessions emit, and the parsing of a
line's fields. The machines that use them are :mod:`.session` (the hub's side) and :mod:`.ship`
(a ship's side).

Wire (shared/seeds/README.md and docs/protocols/seguro.md)::

    server                                  client
    SEGURO <v> <v> ...\\n
                                            HELLO <v>\\n
    IDENTIFY <v>\\n
                                            POINT <@p>\\n
    WELCOME <@p> [<latest id>]\\n           (or the connection is dropped: point taken, or refused)
    -- flows, one at a time --
                                            SAVE <id> <len>\\n<data>\\n\\n
    [LATEST <id>\\n]  COMMITTED <id> <len>\\n
                                            SAVE MANY <n> <start> <end>\\n
                                            EVENT <id> <len>\\n<data>\\n\\n  (n times)
                                            STREAMED MANY <n> <start> <end>\\n
    [LATEST <id>\\n ...]  COMMITTED MANY <n> <start> <end>\\n
                                            READ <id> <limit>\\n
    EVENT <id> <len>\\n<data>\\n\\n ...  SENT <n> <start> <end>\\n   (SENT 0 0 0: none)

Numbers are decimal digits only (``strtoull`` would take signs, spaces and hex; the seed says
"wholly parseable" and the decisions say decimal, so anything but digits is a breach), within
their bit width. Any breach of the seed's rules, by the peer, is answered by dropping the
connection at once: the machine moves to CLOSED and emits :class:`Breach` with the reason.

Number parsing is here once for both sides; a breach is a :class:`RemoteProtocolError`, which the
sessions turn into :class:`Breach`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model import RemoteProtocolError
from ...native import kernel

__all__ = [
    "MAX_U16",
    "MAX_U64",
    "Breach",
    "Committed",
    "CommittedMany",
    "Event",
    "Hello",
    "Identify",
    "Latest",
    "Limits",
    "ManyEvent",
    "ManyEvents",
    "Point",
    "Read",
    "Refused",
    "Save",
    "SaveMany",
    "Seguro",
    "Sent",
    "StreamedMany",
    "Welcome",
    "many_run",
    "many_run_py",
    "parse_event_header",
    "parse_number",
    "split_fields",
]

MAX_U64 = 2**64 - 1
MAX_U16 = 2**16 - 1
_SLACK_BYTES = 2 * 1024 * 1024  # room for one read past a whole frame (the adapters read 1 MiB)


@dataclass(frozen=True, slots=True)
class Limits:
    max_line_bytes: int = 1024
    max_event_bytes: int = 64 * 1024 * 1024
    max_many_count: int = 2**32
    # bytes received and not parsed; raised to a whole SAVE frame plus 2 MiB if below it. The
    # hub stops reading a connection past 16 MiB unparsed and a ship reads only when it needs
    # more, so what waits is at most that, or one frame and one read.
    max_buffered_bytes: int = 32 * 1024 * 1024

    @property
    def buffer_limit(self) -> int:
        """The receive buffer's limit (more unparsed bytes is a breach)."""
        frame = 2 * self.max_line_bytes + self.max_event_bytes + 2
        return max(self.max_buffered_bytes, frame + _SLACK_BYTES)


# --------------------------------------------------------------------------- events



@dataclass(frozen=True, slots=True)
class Seguro:
    versions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Hello:
    version: int


@dataclass(frozen=True, slots=True)
class Identify:
    version: int


@dataclass(frozen=True, slots=True)
class Point:
    point: str


@dataclass(frozen=True, slots=True)
class Welcome:
    point: str
    latest: int | None


@dataclass(frozen=True, slots=True)
class Save:
    id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class SaveMany:
    count: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class ManyEvent:
    """One ``EVENT`` of a ``SAVE MANY`` (server side) or of a ``READ`` (client side)."""

    id: int
    data: bytes


@dataclass(frozen=True, slots=True)
class ManyEvents:
    """Consecutive ``EVENT`` frames of a ``SAVE MANY``, checked (``ServerSession(bulk=True)``)."""

    ids: list[int]
    datas: list[bytes]


@dataclass(frozen=True, slots=True)
class StreamedMany:
    count: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Read:
    start: int
    limit: int


@dataclass(frozen=True, slots=True)
class Committed:
    id: int
    length: int


@dataclass(frozen=True, slots=True)
class CommittedMany:
    count: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Latest:
    id: int


@dataclass(frozen=True, slots=True)
class Sent:
    count: int
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Breach:
    """The peer broke the protocol: drop the connection (nothing more is parsed or sent)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Refused:
    """The session may not run ``command`` (``SAVE``, ``SAVE MANY`` or ``READ``) on its point
    (:meth:`ServerSession.welcome`): drop the connection (nothing more is parsed or sent)."""

    command: str


Event = (
    Seguro | Hello | Identify | Point | Welcome | Save | SaveMany | ManyEvent | ManyEvents
    | StreamedMany
    | Read | Committed | CommittedMany | Latest | Sent | Breach | Refused
)  # fmt: skip



def parse_number(text: bytes, bits: int, what: str) -> int:
    """``text`` as a decimal number of at most ``bits`` bits: digits only (no sign, no space)."""
    if not text or not text.isdigit() or not text.isascii():
        raise RemoteProtocolError(f"{what}: {text[:40]!r} is not a decimal number")
    digits = text.lstrip(b"0") or b"0"
    if len(digits) > 20:  # (no 64-bit number has more; int() refuses past 4300 digits)
        raise RemoteProtocolError(f"{what}: a number of {len(digits)} digits does not fit in "
                                  f"{bits} bits")  # fmt: skip
    value = int(digits)
    if value >> bits:
        raise RemoteProtocolError(f"{what}: {value} does not fit in {bits} bits")
    return value


def split_fields(line: bytes, count: int, what: str) -> list[bytes]:
    """``line``'s ``count`` fields, separated by single spaces, none empty."""
    parts = line.split(b" ")
    if len(parts) != count or any(not p for p in parts):
        raise RemoteProtocolError(f"{what}: expected {count} fields separated by single spaces, "
                                  f"got {line[:80]!r}")  # fmt: skip
    return parts


def parse_event_header(line: bytes, limits: Limits) -> tuple[int, int]:
    """``EVENT <id> <length>``: the id and the data length (within ``limits``)."""
    parts = split_fields(line, 3, "EVENT")
    if parts[0] != b"EVENT":
        raise RemoteProtocolError(f"expected EVENT, got {line[:80]!r}")
    event_id = parse_number(parts[1], 64, "event id")
    size = parse_number(parts[2], 64, "data length")
    if size > limits.max_event_bytes:
        raise RemoteProtocolError(f"an event of {size} bytes exceeds the limit of "
                                  f"{limits.max_event_bytes}")  # fmt: skip
    return event_id, size


def many_run_py(
    buf: bytes | bytearray, pos: int, max_line: int, max_event: int, seen: int, last: int,
    many: SaveMany,
) -> tuple[list[int], list[bytes], int, int, int]:
    """The complete ``EVENT`` frames of a ``SAVE MANY`` at ``buf[pos:]`` that the frame by
    frame parse would accept (``seen`` events of ``many`` so far, the last of id ``last``), up
    to 65536 of them: ``(ids, datas, pos, seen, last)`` after them. It stops, without a word,
    at the first frame that is incomplete or that the frame by frame parse should judge
    (a breach, long leading zeros...), which then does."""
    ids: list[int] = []
    datas: list[bytes] = []
    end_buf = len(buf)
    view = memoryview(buf)
    try:
        while buf.startswith(b"EVENT ", pos) and len(ids) < 65536:
            nl = buf.find(b"\n", pos, pos + max_line + 1)
            if nl < 0:
                break
            fields = bytes(buf[pos + 6 : nl]).split(b" ")
            if len(fields) != 2 or not all(f.isdigit() and f.isascii() and len(f) <= 20
                                           for f in fields):  # fmt: skip
                break  # the frame by frame path says why (or takes long leading zeros)
            event_id, size = int(fields[0]), int(fields[1])
            if event_id > MAX_U64 or size > max_event:
                break
            end = nl + 1 + size
            if end + 2 > end_buf:
                break
            if (
                (seen == 0 and event_id != many.start)
                or (seen and event_id <= last)
                or (event_id > many.end or seen + 1 > many.count)
            ):
                break
            if buf[end : end + 2] != b"\n\n":
                break
            ids.append(event_id)
            datas.append(bytes(view[nl + 1 : end]))  # (one copy: no slice first)
            seen, last = seen + 1, event_id
            pos = end + 2
    finally:
        view.release()  # (the store may grow again)
    return ids, datas, pos, seen, last


# The compiled kernel when it is built and not switched off (tidewire.native), else the pure
# function above, its specification.
many_run = kernel("seguro_many_run", many_run_py)
