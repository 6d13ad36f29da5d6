"""A ship's side of a Seguro session (seed 004), sans-IO: it answers SEGURO with HELLO and
IDENTIFY with POINT by itself, then :meth:`~ClientSession.save`, :meth:`~ClientSession.save_many`
and :meth:`~ClientSession.read` run one flow at a time. The wire is :mod:`.codec`; the contract
(bytes in, events out, bytes to send) is :class:`~.session.Session`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from ...model import LocalProtocolError, RemoteProtocolError
from .codec import (
    MAX_U64,
    Committed,
    CommittedMany,
    Identify,
    Latest,
    Limits,
    ManyEvent,
    Read,
    Save,
    SaveMany,
    Seguro,
    Sent,
    Welcome,
    parse_number,
    split_fields,
)
from .patp import validate_patp
from .session import Session, State

__all__ = ["ClientSession"]


class ClientSession(Session):
    """A ship's side: :meth:`hello`, :meth:`identify`, then one flow at a time."""

    def __init__(self, point: str, version: int = 0, limits: Limits | None = None) -> None:
        super().__init__(limits)
        self.point = validate_patp(point)
        self.version = version
        self.welcomed: Welcome | None = None
        self._expect: object = None  # the reply the current flow waits for
        self._committed = b""  # a SAVE's COMMITTED as the hub writes it (:meth:`_step`)
        self._read_seen = 0
        self._read_first = 0
        self._read_last = 0

    def _step(self) -> bool:
        buf, pos = self._rx.view()
        if pos >= len(buf):
            return False  # (nothing buffered: no line, no block; the flow reads first)
        if self.state is State.SAVE and self._committed and buf.startswith(self._committed, pos):
            # The reply as the hub writes it (no leading zeros), taken in one comparison: the
            # line by line parse below accepts it too, and takes every other form.
            self._rx.advance_to(pos + len(self._committed))
            return self._saved()
        if self._pending_block is not None:
            data = self._block()
            if data is None:
                return False
            _, event_id, _ = self._pending_block
            self._pending_block = None
            self._events.append(ManyEvent(event_id, data))
            return True
        line = self._line()
        if line is None:
            return False
        if self.state is State.GREETING:
            if not line.startswith(b"SEGURO "):
                raise RemoteProtocolError(f"expected SEGURO, got {line[:80]!r}")
            versions = tuple(parse_number(v, 16, "version") for v in line[7:].split(b" "))
            if self.version not in versions:
                raise RemoteProtocolError(f"the server speaks {versions}, not {self.version}")
            self._says(f"HELLO {self.version}")
            self.state = State.IDENTIFY
            self._events.append(Seguro(versions))
        elif self.state is State.IDENTIFY:
            parts = split_fields(line, 2, "IDENTIFY")
            if parts[0] != b"IDENTIFY" or parse_number(parts[1], 16, "version") != self.version:
                raise RemoteProtocolError(f"expected IDENTIFY {self.version}, got {line[:80]!r}")
            self._says(f"POINT {self.point}")
            self.state = State.WELCOME
            self._events.append(Identify(self.version))
        elif self.state is State.WELCOME:
            parts = line.split(b" ")
            if (
                parts[0] != b"WELCOME"
                or len(parts) not in (2, 3)
                or parts[1] != (self.point or "").encode()
            ):
                raise RemoteProtocolError(f"expected WELCOME {self.point}, got {line[:80]!r}")
            latest = parse_number(parts[2], 64, "latest id") if len(parts) == 3 else None
            self.latest = latest or 0
            self.welcomed = Welcome(self.point or "", latest)
            self.state = State.IDLE
            self._events.append(self.welcomed)
        elif line.startswith(b"LATEST "):
            latest = parse_number(split_fields(line, 2, "LATEST")[1], 64, "LATEST id")
            self._notified(latest, "LATEST")
            self._events.append(Latest(self.latest))
        elif line.startswith(b"COMMITTED MANY ") and isinstance(self._expect, SaveMany):
            parts = split_fields(line[10:], 4, "COMMITTED MANY")
            got = (parse_number(parts[1], 64, "count"), parse_number(parts[2], 64, "start"),
                   parse_number(parts[3], 64, "end"))  # fmt: skip
            many = self._expect
            if got != (many.count, many.start, many.end):
                raise RemoteProtocolError(f"COMMITTED MANY {got} does not match SAVE MANY")
            self._notified(many.end, "COMMITTED MANY")
            self._expect = None
            self.state = State.IDLE
            self._events.append(CommittedMany(*got))
        elif line.startswith(b"COMMITTED ") and isinstance(self._expect, Save):
            parts = split_fields(line, 3, "COMMITTED")
            got2 = (parse_number(parts[1], 64, "id"), parse_number(parts[2], 64, "length"))
            if got2 != (self._expect.id, len(self._expect.data)):
                raise RemoteProtocolError(f"COMMITTED {got2} does not match SAVE")
            self._saved()
        elif self.state is State.READ and line.startswith(b"EVENT "):
            event_id, size = self._event_header(line, "EVENT")
            assert isinstance(self._expect, Read)
            if self._read_seen and event_id <= self._read_last:
                raise RemoteProtocolError("READ events do not increase")
            if event_id < self._expect.start or self._read_seen >= self._expect.limit:
                raise RemoteProtocolError("an EVENT outside the READ's start or limit")
            if not self._read_seen:
                self._read_first = event_id
            self._read_seen += 1
            self._read_last = event_id
            self._pending_block = ("read", event_id, size)
        elif self.state is State.READ and line.startswith(b"SENT "):
            parts = split_fields(line, 4, "SENT")
            got3 = Sent(parse_number(parts[1], 64, "count"), parse_number(parts[2], 64, "start"),
                        parse_number(parts[3], 64, "end"))  # fmt: skip
            seen = self._read_seen
            expected = (seen, self._read_first, self._read_last) if seen else (0, 0, 0)
            if (got3.count, got3.start, got3.end) != expected:
                raise RemoteProtocolError(f"SENT {got3.count} {got3.start} {got3.end} does not "
                                          f"match the events sent {expected}")  # fmt: skip
            self._expect = None
            self.state = State.IDLE
            self._events.append(got3)
        else:
            raise RemoteProtocolError(f"unexpected {line[:60]!r} in state {self.state.value}")
        return True

    def _saved(self) -> bool:
        """The SAVE's COMMITTED came (checked): the flow is over."""
        save = self._expect
        assert isinstance(save, Save)
        self._notified(save.id, "COMMITTED")
        self._expect = None
        self.state = State.IDLE
        self._events.append(Committed(save.id, len(save.data)))
        return True

    def _notified(self, committed: int, what: str) -> None:
        if committed < self.latest:
            raise RemoteProtocolError(f"{what} {committed} is below {self.latest}, said before")
        self.latest = committed

    def _idle(self, what: str) -> None:
        if self.state is not State.IDLE:
            raise LocalProtocolError(f"{what}: the previous flow is not finished "
                                     f"({self.state.value})")  # fmt: skip

    def save(self, event_id: int, data: bytes) -> None:
        self._idle("SAVE")
        if not self.latest < event_id <= MAX_U64:
            raise LocalProtocolError(f"SAVE id {event_id} must exceed the latest {self.latest}")
        # One join (one copy of the value), queued whole: no copy into and out of ``_out``.
        self._queue_whole(b"".join((b"SAVE %d %d\n" % (event_id, len(data)), data, b"\n\n")))
        self._committed = b"COMMITTED %d %d\n" % (event_id, len(data))
        self._expect = Save(event_id, data)
        self.state = State.SAVE

    def save_many(self, events: Sequence[tuple[int, bytes]]) -> None:
        self._idle("SAVE MANY")
        ids = [i for i, _ in events]
        if len(ids) < 2 or ids[0] <= self.latest or any(b <= a for a, b in pairwise(ids)):
            raise LocalProtocolError("SAVE MANY needs >= 2 increasing ids above the latest")
        n, start, end = len(ids), ids[0], ids[-1]
        # One join over the frames' parts, not a concatenation per event: each ``header +
        # data + b"\n\n"`` copied the value twice and the buffer grew a thousand times (a
        # flow of 1000 x 1 KiB took ~1.0 ms to build, ~0.25 ms this way; the client waits
        # for it on every flow: benchmarks/README.md, "Profile (round 2)").
        parts: list[bytes] = [b"SAVE MANY %d %d %d\n" % (n, start, end)]
        part = parts.append
        for event_id, data in events:
            part(b"EVENT %d %d\n" % (event_id, len(data)))
            part(data)
            part(b"\n\n")
        part(b"STREAMED MANY %d %d %d\n" % (n, start, end))
        self._queue_whole(b"".join(parts))
        self._expect = SaveMany(n, start, end)
        self.state = State.MANY_DONE

    def read(self, start: int, limit: int) -> None:
        self._idle("READ")
        self._out += b"READ %d %d\n" % (start, limit)
        self._expect = Read(start, limit)
        self._read_seen = self._read_first = self._read_last = 0
        self.state = State.READ
