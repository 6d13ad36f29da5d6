"""The Seguro session (seed 004), sans-IO: bytes in, events out, bytes to send (the machine
contract, docs/architecture.md). The wire and its events are :mod:`.codec`; a ship's side is
:class:`~.ship.ClientSession`.

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

from ...model import MAX_ID, LocalProtocolError, RemoteProtocolError
from ..buffer import ReceiveBuffer
from .codec import (
    Breach,
    Event,
    Hello,
    Limits,
    ManyEvent,
    ManyEvents,
    Point,
    Read,
    Refused,
    Save,
    SaveMany,
    StreamedMany,
    many_run,
    parse_event_header,
    parse_number,
    split_fields,
)
from .patp import InvalidPatp, validate_patp

__all__ = ["ServerSession", "Session", "State"]


class State(enum.Enum):
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



class Session:
    """What both sides share: the receive buffer, the output, the events, and the contract
    (:meth:`receive_data`, :meth:`next_event`, :meth:`data_to_send`, :attr:`buffered`,
    :attr:`pending`). Seguro has no timers: the adapters keep its deadlines."""

    def __init__(self, limits: Limits | None) -> None:
        self.limits = limits or Limits()
        self._rx = ReceiveBuffer(self.limits.buffer_limit, streaming=True)
        self._out = bytearray()
        # A big piece queued whole (a SAVE MANY flow: about a MiB) while nothing else was:
        # sent as it is, where ``_out`` would copy it twice (in, then out). It precedes
        # everything in ``_out``.
        self._whole: bytes | None = None
        self._events: deque[Event] = deque()
        self.state = State.GREETING
        self.point: str | None = None
        self.latest = 0  # the highest committed id said so far (WELCOME/LATEST/COMMITTED*)
        self._pending_block: tuple[str, int, int] | None = None  # (kind, id, size)

    @property
    def closed(self) -> bool:
        return self.state is State.CLOSED

    @property
    def buffered(self) -> int:
        """Bytes received and not parsed yet (at most ``limits.buffer_limit``: more is a
        :class:`Breach`). On the hub's side, before a reply (IDENTIFY, WELCOME, COMMITTED,
        COMMITTED MANY, SENT) they can only come from a ship that did not wait for it: the
        adapter, which knows when bytes arrived, calls that a breach
        (:meth:`ServerSession.breach`)."""
        return self._rx.buffered

    @property
    def pending(self) -> int:
        """Bytes queued in :meth:`data_to_send`."""
        return len(self._out) + (len(self._whole) if self._whole is not None else 0)

    @property
    def awaiting_data(self) -> int | None:
        """The length of the event data announced (SAVE, EVENT) and not yet whole: until it
        comes, :attr:`buffered` stays under it plus its two newlines. ``None``: a line is next,
        and :attr:`buffered` stays within ``limits.max_line_bytes``."""
        return None if self._pending_block is None else self._pending_block[2]

    @property
    def inbound_bytes(self) -> int:
        """Bytes this machine holds, or will hold before it can hand out the event whose
        header it has parsed: the unparsed bytes, and once a header (``SAVE``, ``EVENT``)
        declared data, at least that data and its two newlines. What an adapter charges to its
        memory budget, and checks when :attr:`awaiting_data` says a declaration was made, before
        the data is read."""
        if self._pending_block is None:
            return self._rx.buffered
        return max(self._rx.buffered, self._pending_block[2] + 2)

    @property
    def receiving(self) -> bool:
        """Whether an inbound message has begun and is not whole: a header whose data has not
        all come, or bytes of a line or frame not parsed yet. (Between messages, e.g. between
        the events of a ``SAVE MANY``, it is False: a flow has no deadline, a message does.)"""
        return self._pending_block is not None or bool(self._rx)

    def data_to_send(self) -> bytes:
        """Everything queued for the peer, in order (``b""``: nothing)."""
        whole, self._whole = self._whole, None
        if whole is not None and not self._out:
            return whole
        data = bytes(self._out) if whole is None else whole + self._out
        self._out.clear()
        return data

    def _queue_whole(self, data: bytes) -> None:
        """Queue ``data`` after everything queued, without a copy when nothing is."""
        if self._whole is None and not self._out:
            self._whole = data
        else:
            self._out += data

    def receive_data(self, data: bytes) -> None:
        """Feed bytes; ``b""`` means the peer closed (a breach unless idle). Never raises: a
        breach (one too many bytes buffered included) is a :class:`Breach` event."""
        if self.closed:
            return
        if not data:
            if self.state not in (State.IDLE, State.GREETING) or self._rx:
                self._breach(f"connection closed in state {self.state.value}")
            else:
                self.state = State.CLOSED
            return
        try:
            self._rx.append(data)
        except RemoteProtocolError as exc:
            self._breach(str(exc))

    def next_event(self) -> Event | None:
        """The next event, or ``None`` until more bytes come (or once closed)."""
        while not self._events and not self.closed:
            try:
                if not self._step():
                    break
            except RemoteProtocolError as exc:
                self._breach(str(exc))
        return self._events.popleft() if self._events else None

    def _breach(self, reason: str) -> None:
        self.state = State.CLOSED
        self._rx.clear()
        self._events.append(Breach(reason))

    def _step(self) -> bool:
        raise NotImplementedError

    def _line(self) -> bytes | None:
        """The next line (without its \\n), or ``None`` while it has not come."""
        limit = self.limits.max_line_bytes
        try:
            return self._rx.take_until(b"\n", limit)
        except RemoteProtocolError:
            raise RemoteProtocolError(f"a line longer than {limit} bytes") from None

    def _block(self) -> bytes | None:
        """The pending block's data (exactly its size, then \\n\\n), or ``None`` until whole."""
        assert self._pending_block is not None
        size = self._pending_block[2]
        rx = self._rx
        data, pos = rx.view()
        end = pos + size
        if len(data) < end + 2:
            return None
        if data[end : end + 2] != b"\n\n":
            raise RemoteProtocolError(f"event data is not exactly {size} bytes followed by two "
                                      "newlines")  # fmt: skip
        block = bytes(data[pos:end])
        rx.advance_to(end + 2)
        return block

    def _event_header(self, line: bytes, what: str) -> tuple[int, int]:
        del what  # (always EVENT)
        return parse_event_header(line, self.limits)

    def _says(self, line: str) -> None:
        self._out += line.encode() + b"\n"

    def _advance(self, committed: int, what: str) -> None:
        if committed < self.latest:
            raise LocalProtocolError(f"{what} {committed} is below the latest committed id "
                                     f"{self.latest} already said")  # fmt: skip
        self.latest = committed


class ServerSession(Session):
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
        if self.state is State.IDLE and self.may_write and self._whole_save():
            return True
        if self.bulk and self.state is State.MANY and self._pending_block is None:
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
        line = self._line()
        if line is None:
            return False
        if self.state is State.GREETING:
            parts = split_fields(line, 2, "HELLO")
            if parts[0] != b"HELLO":
                raise RemoteProtocolError(f"expected HELLO first, got {line[:80]!r}")
            version = parse_number(parts[1], 16, "version")
            if version not in self.versions:
                raise RemoteProtocolError(f"version {version} is not one of {self.versions}")
            self.version = version
            self._says(f"IDENTIFY {version}")
            self.state = State.POINT
            self._events.append(Hello(version))
        elif self.state is State.POINT:
            parts = split_fields(line, 2, "POINT")
            if parts[0] != b"POINT":
                raise RemoteProtocolError(f"expected POINT, got {line[:80]!r}")
            try:
                point = validate_patp(parts[1].decode("ascii"))
            except (InvalidPatp, UnicodeDecodeError) as exc:
                raise RemoteProtocolError(f"POINT: {exc}") from None
            self.point = point
            self.state = State.WELCOME  # until the application says welcome()
            self._events.append(Point(point))
        elif self.state is State.IDLE:
            self._command(line)
        elif self.state is State.MANY:
            if line.startswith(b"STREAMED MANY"):
                self._streamed(line)
            else:
                self._many_event(line)
        else:
            raise RemoteProtocolError(f"{line[:40]!r} before the reply to the previous command "
                                      f"({self.state.value})")  # fmt: skip
        return True

    def _whole_save(self) -> bool:
        """A whole ``SAVE <id> <len>\\n<data>\\n\\n`` at the read position, parsed in one pass
        (the commonest frame of a hub with many points, each saving one event at a time) and
        its :class:`Save` queued. False, nothing consumed, when the bytes there are not one
        whole and valid ``SAVE``: the line by line parse then takes them, breaches included
        (so this pass only needs to recognise what that parse accepts, never to refuse)."""
        data, pos = self._rx.view()
        if not data.startswith(b"SAVE ", pos):
            return False
        nl = data.find(b"\n", pos + 5, pos + self.limits.max_line_bytes + 1)
        sp = data.find(b" ", pos + 5, nl) if nl > 0 else -1
        if sp < 0:
            return False
        id_text, size_text = data[pos + 5 : sp], data[sp + 1 : nl]
        if not (0 < len(id_text) < 20 and 0 < len(size_text) < 20 and id_text.isdigit()
                and size_text.isdigit()):  # fmt: skip
            return False  # (isdigit: ASCII digits only, no second space; < 20 digits: 64 bits)
        event_id, size = int(id_text), int(size_text)
        end = nl + 1 + size
        if (not self.latest < event_id <= MAX_ID or size > self.limits.max_event_bytes
                or data[end : end + 2] != b"\n\n"):  # fmt: skip
            return False  # (not whole yet, or a breach: said by the line by line parse)
        self._save = Save(event_id, bytes(memoryview(data)[nl + 1 : end]))
        self._rx.advance_to(end + 2)
        self.state = State.SAVE
        self._events.append(self._save)
        return True

    def _refuse(self, command: str) -> None:
        self.state = State.CLOSED
        self._events.append(Refused(command))

    def _command(self, line: bytes) -> None:
        if line.startswith(b"SAVE ") and not self.may_write:
            self._refuse("SAVE MANY" if line.startswith(b"SAVE MANY ") else "SAVE")
        elif line.startswith(b"READ ") and not self.may_read:
            self._refuse("READ")
        elif line.startswith(b"SAVE MANY "):
            parts = split_fields(line[5:], 4, "SAVE MANY")
            n = parse_number(parts[1], 64, "count")
            start = parse_number(parts[2], 64, "start id")
            end = parse_number(parts[3], 64, "end id")
            if start <= self.latest:
                raise RemoteProtocolError(f"SAVE MANY start id {start} is not greater than the "
                                          f"latest stored id {self.latest}")  # fmt: skip
            if end <= start:
                raise RemoteProtocolError(f"SAVE MANY end id {end} is not larger than start "
                                          f"{start}")  # fmt: skip
            if end > MAX_ID:
                raise RemoteProtocolError(f"id {end} is above 2**63-1, which tidewire does not "
                                          "store")  # fmt: skip
            if n < 2 or n > end - start + 1 or n > self.limits.max_many_count:
                raise RemoteProtocolError(f"SAVE MANY of {n} events cannot span ids {start}..{end}")
            self._many = SaveMany(n, start, end)
            self._many_seen = 0
            self._many_last = 0
            self.state = State.MANY
            self._events.append(self._many)
        elif line.startswith(b"SAVE "):
            parts = split_fields(line, 3, "SAVE")
            event_id = parse_number(parts[1], 64, "event id")
            size = parse_number(parts[2], 64, "data length")
            if event_id <= self.latest:
                raise RemoteProtocolError(f"SAVE id {event_id} is not greater than the latest "
                                          f"stored id {self.latest}")  # fmt: skip
            if event_id > MAX_ID:
                raise RemoteProtocolError(f"id {event_id} is above 2**63-1, which tidewire does "
                                          "not store")  # fmt: skip
            if size > self.limits.max_event_bytes:
                raise RemoteProtocolError(f"an event of {size} bytes exceeds the limit of "
                                          f"{self.limits.max_event_bytes}")  # fmt: skip
            self.state = State.SAVE
            self._pending_block = ("save", event_id, size)
        elif line.startswith(b"READ "):
            parts = split_fields(line, 3, "READ")
            start_id = parse_number(parts[1], 64, "start id")
            self._read = Read(start_id, parse_number(parts[2], 64, "limit"))
            self._sent = self._sent_first = self._sent_last = 0
            self.state = State.READ
            self._events.append(self._read)
        else:
            raise RemoteProtocolError(f"unknown command {line[:40]!r}")

    def _many_event(self, line: bytes) -> None:
        assert self._many is not None
        event_id, size = self._event_header(line, "EVENT")
        many = self._many
        if self._many_seen == 0 and event_id != many.start:
            raise RemoteProtocolError(f"the first event is {event_id}, SAVE MANY said {many.start}")
        if self._many_seen and event_id <= self._many_last:
            raise RemoteProtocolError(f"event id {event_id} does not increase (after "
                                      f"{self._many_last})")  # fmt: skip
        if event_id > many.end:
            raise RemoteProtocolError(f"event id {event_id} is past the end id {many.end}")
        self._many_seen += 1
        if self._many_seen > many.count:
            raise RemoteProtocolError(f"more than the {many.count} events SAVE MANY declared")
        self._many_last = event_id
        self._pending_block = ("many", event_id, size)

    def _many_run(self) -> ManyEvents | None:
        """The complete ``EVENT`` frames at the read position, checked as one at a time would
        be (up to a breach, which ends the run, the events before it dropped with it)."""
        assert self._many is not None
        rx, many = self._rx, self._many
        buf, pos = rx.view()
        limits = self.limits
        ids, datas, pos, seen, last = many_run(buf, pos, limits.max_line_bytes,
                                               limits.max_event_bytes, self._many_seen,
                                               self._many_last, many)  # fmt: skip
        if not ids:
            return None
        rx.advance_to(pos)
        self._many_seen, self._many_last = seen, last
        return ManyEvents(ids, datas)

    def _streamed(self, line: bytes) -> None:
        assert self._many is not None
        parts = split_fields(line[9:], 4, "STREAMED MANY")
        if parts[0] != b"MANY":
            raise RemoteProtocolError(f"expected STREAMED MANY, got {line[:40]!r}")
        got = StreamedMany(parse_number(parts[1], 64, "count"),
                           parse_number(parts[2], 64, "start id"),
                           parse_number(parts[3], 64, "end id"))  # fmt: skip
        many = self._many
        if (got.count, got.start, got.end) != (many.count, many.start, many.end):
            said = f"{many.count} {many.start} {many.end}"
            raise RemoteProtocolError(f"STREAMED MANY {got.count} {got.start} {got.end} does not "
                                      f"match SAVE MANY {said}")  # fmt: skip
        if self._many_seen != many.count or self._many_last != many.end:
            seen, last = self._many_seen, self._many_last
            raise RemoteProtocolError(f"{seen} events streamed (last {last}), SAVE MANY declared "
                                      f"{many.count} ending at {many.end}")  # fmt: skip
        self.state = State.MANY_DONE
        self._events.append(got)

    # ---------------------------------------------------------------- output

    def breach(self, reason: str) -> None:
        """The adapter found a breach the machine cannot see (timing): close."""
        if not self.closed:
            self._breach(reason)

    def welcome(self, latest: int | None, *, may_read: bool = True, may_write: bool = True) -> None:
        """Accept the point: ``WELCOME <@p> [<latest>]``. ``may_read``/``may_write``: whether
        the session may ``READ`` / ``SAVE`` and ``SAVE MANY`` (else :class:`Refused`)."""
        if self.state is not State.WELCOME or self.point is None:
            raise LocalProtocolError("welcome() answers a POINT")
        self.may_read, self.may_write = may_read, may_write
        self._advance(latest or 0, "WELCOME")
        self._says(f"WELCOME {self.point}" + ("" if latest is None else f" {latest}"))
        self.state = State.IDLE

    def committed(self) -> None:
        """The SAVE's event is durable: ``COMMITTED <id> <len>``."""
        if self.state is not State.SAVE or self._save is None:
            raise LocalProtocolError("committed() answers a SAVE whose data arrived")
        save, self._save = self._save, None
        self._advance(save.id, "COMMITTED")
        self._out += b"COMMITTED %d %d\n" % (save.id, len(save.data))
        self.state = State.IDLE

    def latest_committed(self, event_id: int) -> None:
        """``LATEST <id>``: a notification (never decreasing)."""
        if self.closed or self.state in (State.GREETING, State.POINT, State.WELCOME):
            raise LocalProtocolError("LATEST is for an established session")
        self._advance(event_id, "LATEST")
        self._says(f"LATEST {event_id}")

    def committed_many(self) -> None:
        """Every event of the SAVE MANY is durable: ``COMMITTED MANY <n> <start> <end>``."""
        if self.state is not State.MANY_DONE or self._many is None:
            raise LocalProtocolError("committed_many() answers a STREAMED MANY")
        many, self._many = self._many, None
        self._advance(many.end, "COMMITTED MANY")
        self._says(f"COMMITTED MANY {many.count} {many.start} {many.end}")
        self.state = State.IDLE

    def send_event(self, event_id: int, data: bytes | memoryview) -> None:
        """One event of the READ being answered."""
        if self.state is not State.READ or self._read is None:
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
        if self.state is not State.READ:
            raise LocalProtocolError("sent() ends a READ")
        self._says(f"SENT {self._sent} {self._sent_first} {self._sent_last}")
        self._read = None
        self.state = State.IDLE

