"""The Seguro session (seed 004), sans-IO: bytes in, events out, bytes to send.

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

Authorization is the application's (the hub's ACL), but the machine enforces what it was told
at :meth:`ServerSession.welcome` (``may_read``, ``may_write``): a command the session may not
run is refused on its command line, before any of its data is read (:class:`Refused`; the
connection is dropped like for a breach, since Seguro has no error reply).

:class:`ServerSession` is the hub's side; :class:`ClientSession` a ship's. The server machine
knows the latest committed id (it says it in WELCOME, LATEST, COMMITTED), so it enforces "ids
greater than the latest stored" and the flows' consistency itself; what is durable is the
application's business (it calls ``committed``/``committed_many``/``latest`` when it is).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from ...model import MAX_ID, LocalProtocolError
from .patp import InvalidPatp, validate_patp

__all__ = [
    "Breach",
    "ClientSession",
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
    "ServerSession",
    "StreamedMany",
    "Welcome",
]

MAX_U64 = 2**64 - 1
MAX_U16 = 2**16 - 1


@dataclass(frozen=True, slots=True)
class Limits:
    max_line_bytes: int = 1024
    max_event_bytes: int = 64 * 1024 * 1024
    max_many_count: int = 2**32


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


class _ProtocolBreach(Exception):
    pass


def _number(text: bytes, bits: int, what: str) -> int:
    if not text or not text.isdigit() or not text.isascii():
        raise _ProtocolBreach(f"{what}: {text[:40]!r} is not a decimal number")
    digits = text.lstrip(b"0") or b"0"
    if len(digits) > 20:  # (no 64-bit number has more; int() refuses past 4300 digits)
        raise _ProtocolBreach(f"{what}: a number of {len(digits)} digits does not fit in "
                              f"{bits} bits")  # fmt: skip
    value = int(digits)
    if value >> bits:
        raise _ProtocolBreach(f"{what}: {value} does not fit in {bits} bits")
    return value


def _fields(line: bytes, count: int, what: str) -> list[bytes]:
    parts = line.split(b" ")
    if len(parts) != count or any(not p for p in parts):
        raise _ProtocolBreach(f"{what}: expected {count} fields separated by single spaces, "
                              f"got {line[:80]!r}")  # fmt: skip
    return parts


class _Reader:
    """Lines (ending in \\n) and data blocks (exactly N bytes then \\n\\n), incrementally."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.buf = bytearray()
        self.pos = 0

    def feed(self, data: bytes) -> None:
        if self.pos and self.pos > len(self.buf) // 2:
            del self.buf[: self.pos]
            self.pos = 0
        self.buf += data

    def line(self) -> bytes | None:
        end = self.buf.find(b"\n", self.pos, self.pos + self.limits.max_line_bytes + 1)
        if end < 0:
            if len(self.buf) - self.pos > self.limits.max_line_bytes:
                raise _ProtocolBreach(f"a line longer than {self.limits.max_line_bytes} bytes")
            return None
        line = bytes(self.buf[self.pos : end])
        self.pos = end + 1
        return line

    def block(self, size: int) -> bytes | None:
        end = self.pos + size
        if len(self.buf) < end + 2:
            return None
        if self.buf[end : end + 2] != b"\n\n":
            raise _ProtocolBreach(f"event data is not exactly {size} bytes followed by two "
                                  "newlines")  # fmt: skip
        data = bytes(self.buf[self.pos : end])
        self.pos = end + 2
        return data

    @property
    def buffered(self) -> int:
        return len(self.buf) - self.pos


class _State(enum.Enum):
    GREETING = "greeting"  # server: waiting for HELLO; client: waiting for SEGURO
    IDENTIFY = "identify"  # client: waiting for IDENTIFY
    POINT = "point"  # server: waiting for POINT
    WELCOME = "welcome"  # client: waiting for WELCOME
    IDLE = "idle"  # ready for a command
    SAVE = "save"  # a SAVE awaits its COMMITTED
    MANY = "many"  # SAVE MANY: events streaming
    MANY_DONE = "many_done"  # STREAMED MANY received, COMMITTED MANY pending
    READ = "read"  # a READ is being answered
    CLOSED = "closed"


class _Base:
    def __init__(self, limits: Limits | None) -> None:
        self.limits = limits or Limits()
        self._reader = _Reader(self.limits)
        self._out = bytearray()
        self._events: deque[Event] = deque()
        self.state = _State.GREETING
        self.point: str | None = None
        self.latest = 0  # the highest committed id said so far (WELCOME/LATEST/COMMITTED*)
        self._pending_block: tuple[str, int, int] | None = None  # (kind, id, size)

    @property
    def closed(self) -> bool:
        return self.state is _State.CLOSED

    def data_to_send(self) -> bytes:
        data = bytes(self._out)
        self._out.clear()
        return data

    def receive_data(self, data: bytes) -> None:
        """Feed bytes; ``b""`` means the peer closed (a breach unless idle)."""
        if self.closed:
            return
        if not data:
            if self.state not in (_State.IDLE, _State.GREETING) or self._reader.buffered:
                self._breach(f"connection closed in state {self.state.value}")
            else:
                self.state = _State.CLOSED
            return
        self._reader.feed(data)

    def next_event(self) -> Event | None:
        while not self._events and not self.closed:
            try:
                if not self._step():
                    break
            except _ProtocolBreach as exc:
                self._breach(str(exc))
        return self._events.popleft() if self._events else None

    def _breach(self, reason: str) -> None:
        self.state = _State.CLOSED
        self._events.append(Breach(reason))

    def _step(self) -> bool:
        raise NotImplementedError

    def _block(self) -> bytes | None:
        assert self._pending_block is not None
        return self._reader.block(self._pending_block[2])

    def _event_header(self, line: bytes, what: str) -> tuple[int, int]:
        parts = _fields(line, 3, what)
        if parts[0] != b"EVENT":
            raise _ProtocolBreach(f"expected EVENT, got {line[:80]!r}")
        event_id = _number(parts[1], 64, "event id")
        size = _number(parts[2], 64, "data length")
        if size > self.limits.max_event_bytes:
            raise _ProtocolBreach(f"an event of {size} bytes exceeds the limit of "
                                  f"{self.limits.max_event_bytes}")  # fmt: skip
        return event_id, size

    def _says(self, line: str) -> None:
        self._out += line.encode() + b"\n"

    def _advance(self, committed: int, what: str) -> None:
        if committed < self.latest:
            raise LocalProtocolError(f"{what} {committed} is below the latest committed id "
                                     f"{self.latest} already said")  # fmt: skip
        self.latest = committed


class ServerSession(_Base):
    """The hub's side. Call :meth:`initiate` first (it says SEGURO)."""

    def __init__(
        self,
        versions: Sequence[int] = (0,),
        limits: Limits | None = None,
        *,
        bulk: bool = False,
    ) -> None:
        """``bulk=True``: a SAVE MANY's events come out as :class:`ManyEvents` runs (the
        hub's hot path: no object per event) instead of one :class:`ManyEvent` each."""
        super().__init__(limits)
        self.bulk = bulk
        self.versions = tuple(versions)
        self.version: int | None = None
        self._many: SaveMany | None = None
        self._many_seen = 0
        self._many_last = 0
        self._save: Save | None = None
        self._read: Read | None = None
        self._sent = 0
        self._sent_first = 0
        self._sent_last = 0
        self.may_read = True  # what welcome() allowed
        self.may_write = True

    def initiate(self) -> None:
        self._says("SEGURO " + " ".join(str(v) for v in self.versions))

    # ---------------------------------------------------------------- input

    def _step(self) -> bool:
        if self.bulk and self.state is _State.MANY and self._pending_block is None:
            run = self._many_run()
            if run is not None:
                self._events.append(run)
                return True
        if self._pending_block is not None:
            data = self._block()
            if data is None:
                return False
            kind, event_id, _ = self._pending_block
            self._pending_block = None
            if kind == "save":
                self._save = Save(event_id, data)
                self._events.append(self._save)
            else:
                self._events.append(ManyEvent(event_id, data))
            return True
        line = self._reader.line()
        if line is None:
            return False
        if self.state is _State.GREETING:
            parts = _fields(line, 2, "HELLO")
            if parts[0] != b"HELLO":
                raise _ProtocolBreach(f"expected HELLO first, got {line[:80]!r}")
            version = _number(parts[1], 16, "version")
            if version not in self.versions:
                raise _ProtocolBreach(f"version {version} is not one of {self.versions}")
            self.version = version
            self._says(f"IDENTIFY {version}")
            self.state = _State.POINT
            self._events.append(Hello(version))
        elif self.state is _State.POINT:
            parts = _fields(line, 2, "POINT")
            if parts[0] != b"POINT":
                raise _ProtocolBreach(f"expected POINT, got {line[:80]!r}")
            try:
                point = validate_patp(parts[1].decode("ascii"))
            except (InvalidPatp, UnicodeDecodeError) as exc:
                raise _ProtocolBreach(f"POINT: {exc}") from None
            self.point = point
            self.state = _State.WELCOME  # until the application says welcome()
            self._events.append(Point(point))
        elif self.state is _State.IDLE:
            self._command(line)
        elif self.state is _State.MANY:
            if line.startswith(b"STREAMED MANY"):
                self._streamed(line)
            else:
                self._many_event(line)
        else:
            raise _ProtocolBreach(f"{line[:40]!r} before the reply to the previous command "
                                  f"({self.state.value})")  # fmt: skip
        return True

    def _refuse(self, command: str) -> None:
        self.state = _State.CLOSED
        self._events.append(Refused(command))

    def _command(self, line: bytes) -> None:
        if line.startswith(b"SAVE ") and not self.may_write:
            self._refuse("SAVE MANY" if line.startswith(b"SAVE MANY ") else "SAVE")
        elif line.startswith(b"READ ") and not self.may_read:
            self._refuse("READ")
        elif line.startswith(b"SAVE MANY "):
            parts = _fields(line[5:], 4, "SAVE MANY")
            n = _number(parts[1], 64, "count")
            start = _number(parts[2], 64, "start id")
            end = _number(parts[3], 64, "end id")
            if start <= self.latest:
                raise _ProtocolBreach(f"SAVE MANY start id {start} is not greater than the "
                                      f"latest stored id {self.latest}")  # fmt: skip
            if end <= start:
                raise _ProtocolBreach(f"SAVE MANY end id {end} is not larger than start {start}")
            if end > MAX_ID:
                raise _ProtocolBreach(f"id {end} is above 2**63-1, which tidewire does not store")
            if n < 2 or n > end - start + 1 or n > self.limits.max_many_count:
                raise _ProtocolBreach(f"SAVE MANY of {n} events cannot span ids {start}..{end}")
            self._many = SaveMany(n, start, end)
            self._many_seen = 0
            self._many_last = 0
            self.state = _State.MANY
            self._events.append(self._many)
        elif line.startswith(b"SAVE "):
            parts = _fields(line, 3, "SAVE")
            event_id = _number(parts[1], 64, "event id")
            size = _number(parts[2], 64, "data length")
            if event_id <= self.latest:
                raise _ProtocolBreach(f"SAVE id {event_id} is not greater than the latest "
                                      f"stored id {self.latest}")  # fmt: skip
            if event_id > MAX_ID:
                raise _ProtocolBreach(f"id {event_id} is above 2**63-1, which tidewire does "
                                      "not store")  # fmt: skip
            if size > self.limits.max_event_bytes:
                raise _ProtocolBreach(f"an event of {size} bytes exceeds the limit of "
                                      f"{self.limits.max_event_bytes}")  # fmt: skip
            self.state = _State.SAVE
            self._pending_block = ("save", event_id, size)
        elif line.startswith(b"READ "):
            parts = _fields(line, 3, "READ")
            self._read = Read(_number(parts[1], 64, "start id"), _number(parts[2], 64, "limit"))
            self._sent = self._sent_first = self._sent_last = 0
            self.state = _State.READ
            self._events.append(self._read)
        else:
            raise _ProtocolBreach(f"unknown command {line[:40]!r}")

    def _many_event(self, line: bytes) -> None:
        assert self._many is not None
        event_id, size = self._event_header(line, "EVENT")
        many = self._many
        if self._many_seen == 0 and event_id != many.start:
            raise _ProtocolBreach(f"the first event is {event_id}, SAVE MANY said {many.start}")
        if self._many_seen and event_id <= self._many_last:
            raise _ProtocolBreach(f"event id {event_id} does not increase (after "
                                  f"{self._many_last})")  # fmt: skip
        if event_id > many.end:
            raise _ProtocolBreach(f"event id {event_id} is past the end id {many.end}")
        self._many_seen += 1
        if self._many_seen > many.count:
            raise _ProtocolBreach(f"more than the {many.count} events SAVE MANY declared")
        self._many_last = event_id
        self._pending_block = ("many", event_id, size)

    def _many_run(self) -> ManyEvents | None:
        """The complete ``EVENT`` frames at the read position, checked as one at a time would
        be (up to a breach, which ends the run, the events before it dropped with it)."""
        assert self._many is not None
        reader, many = self._reader, self._many
        buf, pos, end_buf = reader.buf, reader.pos, len(reader.buf)
        max_line, max_event = self.limits.max_line_bytes, self.limits.max_event_bytes
        ids: list[int] = []
        datas: list[bytes] = []
        seen, last = self._many_seen, self._many_last
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
            datas.append(bytes(buf[nl + 1 : end]))
            seen, last = seen + 1, event_id
            pos = end + 2
        if not ids:
            return None
        reader.pos = pos
        self._many_seen, self._many_last = seen, last
        return ManyEvents(ids, datas)

    def _streamed(self, line: bytes) -> None:
        assert self._many is not None
        parts = _fields(line[9:], 4, "STREAMED MANY")
        if parts[0] != b"MANY":
            raise _ProtocolBreach(f"expected STREAMED MANY, got {line[:40]!r}")
        got = StreamedMany(_number(parts[1], 64, "count"), _number(parts[2], 64, "start id"),
                           _number(parts[3], 64, "end id"))  # fmt: skip
        many = self._many
        if (got.count, got.start, got.end) != (many.count, many.start, many.end):
            said = f"{many.count} {many.start} {many.end}"
            raise _ProtocolBreach(f"STREAMED MANY {got.count} {got.start} {got.end} does not "
                                  f"match SAVE MANY {said}")  # fmt: skip
        if self._many_seen != many.count or self._many_last != many.end:
            seen, last = self._many_seen, self._many_last
            raise _ProtocolBreach(f"{seen} events streamed (last {last}), SAVE MANY declared "
                                  f"{many.count} ending at {many.end}")  # fmt: skip
        self.state = _State.MANY_DONE
        self._events.append(got)

    # ---------------------------------------------------------------- output

    @property
    def unread(self) -> int:
        """Bytes received and not parsed yet. Before a reply (IDENTIFY, WELCOME, COMMITTED,
        COMMITTED MANY, SENT) they can only come from a ship that did not wait for it: the
        adapter, which knows when bytes arrived, calls that a breach (:meth:`breach`)."""
        return self._reader.buffered

    def breach(self, reason: str) -> None:
        """The adapter found a breach the machine cannot see (timing): close."""
        if not self.closed:
            self._breach(reason)

    def welcome(self, latest: int | None, *, may_read: bool = True, may_write: bool = True) -> None:
        """Accept the point: ``WELCOME <@p> [<latest>]``. ``may_read``/``may_write``: whether
        the session may ``READ`` / ``SAVE`` and ``SAVE MANY`` (else :class:`Refused`)."""
        if self.state is not _State.WELCOME or self.point is None:
            raise LocalProtocolError("welcome() answers a POINT")
        self.may_read, self.may_write = may_read, may_write
        self._advance(latest or 0, "WELCOME")
        self._says(f"WELCOME {self.point}" + ("" if latest is None else f" {latest}"))
        self.state = _State.IDLE

    def committed(self) -> None:
        """The SAVE's event is durable: ``COMMITTED <id> <len>``."""
        if self.state is not _State.SAVE or self._save is None:
            raise LocalProtocolError("committed() answers a SAVE whose data arrived")
        save, self._save = self._save, None
        self._advance(save.id, "COMMITTED")
        self._says(f"COMMITTED {save.id} {len(save.data)}")
        self.state = _State.IDLE

    def latest_committed(self, event_id: int) -> None:
        """``LATEST <id>``: a notification (never decreasing)."""
        if self.closed or self.state in (_State.GREETING, _State.POINT, _State.WELCOME):
            raise LocalProtocolError("LATEST is for an established session")
        self._advance(event_id, "LATEST")
        self._says(f"LATEST {event_id}")

    def committed_many(self) -> None:
        """Every event of the SAVE MANY is durable: ``COMMITTED MANY <n> <start> <end>``."""
        if self.state is not _State.MANY_DONE or self._many is None:
            raise LocalProtocolError("committed_many() answers a STREAMED MANY")
        many, self._many = self._many, None
        self._advance(many.end, "COMMITTED MANY")
        self._says(f"COMMITTED MANY {many.count} {many.start} {many.end}")
        self.state = _State.IDLE

    def send_event(self, event_id: int, data: bytes | memoryview) -> None:
        """One event of the READ being answered."""
        if self.state is not _State.READ or self._read is None:
            raise LocalProtocolError("send_event() answers a READ")
        if self._sent and event_id <= self._sent_last:
            raise LocalProtocolError("READ events must increase")
        if self._sent >= self._read.limit:
            raise LocalProtocolError("more events than the READ's limit")
        if not self._sent:
            self._sent_first = event_id
        self._sent += 1
        self._sent_last = event_id
        self._out += b"EVENT %d %d\n" % (event_id, len(data))
        self._out += data
        self._out += b"\n\n"

    def sent(self) -> None:
        """The READ is answered: ``SENT <n> <start> <end>`` (``SENT 0 0 0`` for none)."""
        if self.state is not _State.READ:
            raise LocalProtocolError("sent() ends a READ")
        self._says(f"SENT {self._sent} {self._sent_first} {self._sent_last}")
        self._read = None
        self.state = _State.IDLE


class ClientSession(_Base):
    """A ship's side: :meth:`hello`, :meth:`identify`, then one flow at a time."""

    def __init__(self, point: str, version: int = 0, limits: Limits | None = None) -> None:
        super().__init__(limits)
        self.point = validate_patp(point)
        self.version = version
        self.welcomed: Welcome | None = None
        self._expect: object = None  # the reply the current flow waits for
        self._read_seen = 0
        self._read_first = 0
        self._read_last = 0

    def _step(self) -> bool:
        if self._pending_block is not None:
            data = self._block()
            if data is None:
                return False
            _, event_id, _ = self._pending_block
            self._pending_block = None
            self._events.append(ManyEvent(event_id, data))
            return True
        line = self._reader.line()
        if line is None:
            return False
        if self.state is _State.GREETING:
            if not line.startswith(b"SEGURO "):
                raise _ProtocolBreach(f"expected SEGURO, got {line[:80]!r}")
            versions = tuple(_number(v, 16, "version") for v in line[7:].split(b" "))
            if self.version not in versions:
                raise _ProtocolBreach(f"the server speaks {versions}, not {self.version}")
            self._says(f"HELLO {self.version}")
            self.state = _State.IDENTIFY
            self._events.append(Seguro(versions))
        elif self.state is _State.IDENTIFY:
            parts = _fields(line, 2, "IDENTIFY")
            if parts[0] != b"IDENTIFY" or _number(parts[1], 16, "version") != self.version:
                raise _ProtocolBreach(f"expected IDENTIFY {self.version}, got {line[:80]!r}")
            self._says(f"POINT {self.point}")
            self.state = _State.WELCOME
            self._events.append(Identify(self.version))
        elif self.state is _State.WELCOME:
            parts = line.split(b" ")
            if (
                parts[0] != b"WELCOME"
                or len(parts) not in (2, 3)
                or parts[1] != (self.point or "").encode()
            ):
                raise _ProtocolBreach(f"expected WELCOME {self.point}, got {line[:80]!r}")
            latest = _number(parts[2], 64, "latest id") if len(parts) == 3 else None
            self.latest = latest or 0
            self.welcomed = Welcome(self.point or "", latest)
            self.state = _State.IDLE
            self._events.append(self.welcomed)
        elif line.startswith(b"LATEST "):
            self._notified(_number(_fields(line, 2, "LATEST")[1], 64, "LATEST id"), "LATEST")
            self._events.append(Latest(self.latest))
        elif line.startswith(b"COMMITTED MANY ") and isinstance(self._expect, SaveMany):
            parts = _fields(line[10:], 4, "COMMITTED MANY")
            got = (_number(parts[1], 64, "count"), _number(parts[2], 64, "start"),
                   _number(parts[3], 64, "end"))  # fmt: skip
            many = self._expect
            if got != (many.count, many.start, many.end):
                raise _ProtocolBreach(f"COMMITTED MANY {got} does not match SAVE MANY")
            self._notified(many.end, "COMMITTED MANY")
            self._expect = None
            self.state = _State.IDLE
            self._events.append(CommittedMany(*got))
        elif line.startswith(b"COMMITTED ") and isinstance(self._expect, Save):
            parts = _fields(line, 3, "COMMITTED")
            got2 = (_number(parts[1], 64, "id"), _number(parts[2], 64, "length"))
            save = self._expect
            if got2 != (save.id, len(save.data)):
                raise _ProtocolBreach(f"COMMITTED {got2} does not match SAVE")
            self._notified(save.id, "COMMITTED")
            self._expect = None
            self.state = _State.IDLE
            self._events.append(Committed(*got2))
        elif self.state is _State.READ and line.startswith(b"EVENT "):
            event_id, size = self._event_header(line, "EVENT")
            assert isinstance(self._expect, Read)
            if self._read_seen and event_id <= self._read_last:
                raise _ProtocolBreach("READ events do not increase")
            if event_id < self._expect.start or self._read_seen >= self._expect.limit:
                raise _ProtocolBreach("an EVENT outside the READ's start or limit")
            if not self._read_seen:
                self._read_first = event_id
            self._read_seen += 1
            self._read_last = event_id
            self._pending_block = ("read", event_id, size)
        elif self.state is _State.READ and line.startswith(b"SENT "):
            parts = _fields(line, 4, "SENT")
            got3 = Sent(_number(parts[1], 64, "count"), _number(parts[2], 64, "start"),
                        _number(parts[3], 64, "end"))  # fmt: skip
            seen = self._read_seen
            expected = (seen, self._read_first, self._read_last) if seen else (0, 0, 0)
            if (got3.count, got3.start, got3.end) != expected:
                raise _ProtocolBreach(f"SENT {got3.count} {got3.start} {got3.end} does not match "
                                      f"the events sent {expected}")  # fmt: skip
            self._expect = None
            self.state = _State.IDLE
            self._events.append(got3)
        else:
            raise _ProtocolBreach(f"unexpected {line[:60]!r} in state {self.state.value}")
        return True

    def _notified(self, committed: int, what: str) -> None:
        if committed < self.latest:
            raise _ProtocolBreach(f"{what} {committed} is below {self.latest}, said before")
        self.latest = committed

    def _idle(self, what: str) -> None:
        if self.state is not _State.IDLE:
            raise LocalProtocolError(f"{what}: the previous flow is not finished "
                                     f"({self.state.value})")  # fmt: skip

    def save(self, event_id: int, data: bytes) -> None:
        self._idle("SAVE")
        if not self.latest < event_id <= MAX_U64:
            raise LocalProtocolError(f"SAVE id {event_id} must exceed the latest {self.latest}")
        self._out += b"SAVE %d %d\n" % (event_id, len(data)) + data + b"\n\n"
        self._expect = Save(event_id, data)
        self.state = _State.SAVE

    def save_many(self, events: Sequence[tuple[int, bytes]]) -> None:
        self._idle("SAVE MANY")
        ids = [i for i, _ in events]
        if len(ids) < 2 or ids[0] <= self.latest or any(b <= a for a, b in pairwise(ids)):
            raise LocalProtocolError("SAVE MANY needs >= 2 increasing ids above the latest")
        n, start, end = len(ids), ids[0], ids[-1]
        self._out += b"SAVE MANY %d %d %d\n" % (n, start, end)
        for event_id, data in events:
            self._out += b"EVENT %d %d\n" % (event_id, len(data)) + data + b"\n\n"
        self._out += b"STREAMED MANY %d %d %d\n" % (n, start, end)
        self._expect = SaveMany(n, start, end)
        self.state = _State.MANY_DONE

    def read(self, start: int, limit: int) -> None:
        self._idle("READ")
        self._out += b"READ %d %d\n" % (start, limit)
        self._expect = Read(start, limit)
        self._read_seen = self._read_first = self._read_last = 0
        self.state = _State.READ
