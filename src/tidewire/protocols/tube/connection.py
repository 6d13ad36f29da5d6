"""One Tube connection, sans-IO (seed 001 and shared/seeds/README.md): WebSocket message
payloads in (:meth:`Connection.receive_data`, one message a call), events out
(:meth:`Connection.next_event`), payloads to send out (:meth:`Connection.data_to_send`, one
WebSocket message each); time is an argument (``now``). The machine contract
(docs/architecture.md) with WebSocket's framing: ``b""`` is an empty WebSocket message, not the
end of the stream.

* **Fragment sizes.** The client sends its fragment size first; the server answers with its own
  once it has read the client's. Each side splits what it sends so that every WebSocket message
  is at most the size the *peer* asked for (0: do not split); the header shares the first
  message with the first fragment, and counts against its size.
* **Two readings of a header.** A header carries its first fragment in its WebSocket message
  (the README's reading). A header alone is an empty message when it has one fragment (the
  README: its first fragment, glued to it, is empty); with several, its first fragment is the
  *next* WebSocket message (the seed's literal reading, which no README sender can mean: an
  empty fragment in a message of several is a breach). This side sends an empty message as the
  header byte alone, ``01`` (**decision**, docs/protocols/tube.md); an empty WebSocket message
  right after one is ignored (what tidewire sent before: ``01`` then an empty fragment).
* **Limits.** A message over ``max_message_bytes`` is refused as soon as that is known: at its
  header when ``count`` fragments of this side's fragment size cannot fit, else when the bytes
  received pass it. A breach closes the connection (Tube has no error message): :class:`Closed`
  with a WebSocket close code. A peer may not ask for fragments smaller than
  ``min_fragment_size`` (1008), and a message of several fragments begun and unfinished for
  ``message_seconds`` closes the connection (1008, :meth:`next_deadline`).
* **Inflating in slices.** A deflated message is not inflated when its last fragment comes but
  by :meth:`next_event`, one slice of at most ``inflate_slice_bytes`` a call: a deflated
  message comes as one or more :class:`MessageReceived` parts, the last with ``final`` set.
  So no call does work proportional to what a message inflates to (a deflate bomb), and the
  adapter can check the running size (:attr:`inflated`) against its memory budget between
  parts; past ``max_message_bytes`` it is a breach (1009) at the slice that passes it.
* **Parts.** With ``parts`` (a reader of a byte stream), a plain message of several fragments
  comes as its fragments as they arrive, in parts like a deflated one's: nothing held, no join.
* **Compression.** ``"never"``, ``"always"`` or ``"smart"`` (deflate only when the message is at
  least 256 bytes and shrinks by an eighth). A compressed message with an id this side does not
  support is answered with control code ``8 + id`` and dropped; when the peer says it does not
  support deflate, this side stops compressing.
* **Keepalive.** With ``keepalive=N``, a ping goes out after N seconds without sending anything,
  and a peer silent for 3N seconds is closed (:meth:`next_deadline`, :meth:`handle_timer`).
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ...model import LocalProtocolError, RemoteProtocolError
from .codec import (
    CODE_DEFLATE,
    CODE_PING,
    CODE_PLAIN,
    CODE_PONG,
    MAX_FRAGMENTS,
    encode_header,
    pull_varint,
    push_varint,
    split_header,
)
from .pieces import Cursor, Inflation, Reassembly, ReassemblyPy, TooBig, size_of
from .smart import deflate, deflated_if_it_pays

__all__ = [
    "Closed",
    "CompressionRefused",
    "Connection",
    "Established",
    "Event",
    "Limits",
    "MessageReceived",
    "Ping",
    "Pong",
    "Role",
]

CLOSE_PROTOCOL_ERROR = 1002  # WebSocket close codes (RFC 6455 7.4.1)
CLOSE_TOO_BIG = 1009
CLOSE_GOING_AWAY = 1001
CLOSE_POLICY = 1008


class Role(enum.Enum):
    CLIENT = "client"
    SERVER = "server"


class _State(enum.Enum):
    AWAIT_SIZE = "await_size"  # the peer's fragment size has not come yet
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Limits:
    """What this side accepts. ``max_message_bytes``: a message's payload, after inflation.
    ``min_fragment_size``: the smallest fragment size (other than 0) a peer may ask this side
    to split at (8 by default, the least that holds a header; the hub asks 4096).
    ``message_seconds``: how long a message of several fragments may stay unfinished (None:
    no deadline). ``inflate_slice_bytes``: the most one :meth:`Connection.next_event` inflates.
    ``prealloc_bytes``: a message of several fragments that may be this big at most (its count
    times this side's fragment size) is put together in one buffer allocated when its header
    comes, each fragment copied in as it arrives, instead of kept and joined at its last
    (pieces.py, ``Reassembly``): the same one copy, half the peak memory, and on glibc no page
    faults of a fresh buffer per message. From the header on, that whole buffer is held
    (:attr:`Connection.buffered`), so a peer could make this side hold it for one fragment
    sent: 0 (the default, and the hub's) for peers not trusted with that; the Python client,
    which reads its hub, preallocates up to 4 MiB."""

    max_message_bytes: int = 32 * 1024 * 1024
    max_fragments: int = MAX_FRAGMENTS
    min_fragment_size: int = 8
    message_seconds: float | None = None
    inflate_slice_bytes: int = 64 * 1024
    prealloc_bytes: int = 0

    def __post_init__(self) -> None:
        if self.min_fragment_size < 8:
            raise LocalProtocolError("a fragment-size floor below 8 bytes cannot hold a header")
        if self.inflate_slice_bytes < 1:
            raise LocalProtocolError("inflate_slice_bytes is at least 1")


@dataclass(frozen=True, slots=True)
class Established:
    peer_fragment_size: int


@dataclass(frozen=True, slots=True)
class MessageReceived:
    """A message's payload, or a part of it: of a deflated one, or with ``Connection.parts`` a
    plain one's fragment (``final``: the last part; parts come in order, nothing else between
    them). Tube payloads carrying a byte stream (RS.io) can be fed part by part as they come."""

    data: bytes
    compressed: bool
    final: bool = True


@dataclass(frozen=True, slots=True)
class Ping:
    pass


@dataclass(frozen=True, slots=True)
class Pong:
    pass


@dataclass(frozen=True, slots=True)
class CompressionRefused:
    """The peer does not support ``compression_id`` (and dropped a message that used it)."""

    compression_id: int


@dataclass(frozen=True, slots=True)
class Closed:
    reason: str
    code: int  # the WebSocket close code to send (1000 normal, 1002 breach, 1009 too big)
    error: bool


Event = Established | MessageReceived | Ping | Pong | CompressionRefused | Closed


@dataclass(slots=True)
class _Incoming:
    code: int
    count: int
    since: float  # when its header came
    joined: ReassemblyPy  # its fragments so far (pieces.py; with Limits.prealloc_bytes, the
    # compiled one: one buffer allocated at the header, each fragment copied in as it comes)
    received: int = 0  # fragments
    size: int = 0  # bytes


@dataclass(slots=True)
class Connection:
    role: Role
    fragment_size: int = 0  # what this side asks the peer to split at (0: no splitting)
    limits: Limits = field(default_factory=Limits)
    compression: Literal["never", "always", "smart"] = "smart"
    keepalive: float | None = None  # seconds
    now: float = 0.0  # when the connection started
    state: _State = _State.AWAIT_SIZE
    peer_fragment_size: int | None = None
    # A plain message of several fragments handed out as they come (MessageReceived parts,
    # ``final`` on the last), not joined: for a peer whose messages carry a byte stream
    parts: bool = False
    # a WebSocket message: one buffer, or its parts (the Tube header, then views of the chunks)
    _out: list[bytes | memoryview | tuple[bytes | memoryview, ...]] = field(default_factory=list)
    _events: deque[Event | Inflation] = field(default_factory=deque)
    _incoming: _Incoming | None = None  # the message being reassembled
    _after_empty: bool = False  # the last WebSocket message was an empty Tube message
    _last_sent: float = 0.0
    _last_received: float = 0.0
    _deflate_ok: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.fragment_size < 2**31:
            raise LocalProtocolError("a fragment size is 0 to 2**31-1")
        if self.fragment_size and self.fragment_size < 8:
            raise LocalProtocolError("a fragment size below 8 bytes cannot hold a header")
        self._last_sent = self._last_received = self.now
        if self.role is Role.CLIENT:  # the client speaks first (the seed)
            self._queue(push_varint(self.fragment_size), self.now)

    # ------------------------------------------------------------------ output

    @property
    def pending(self) -> int:
        """Bytes waiting in :meth:`data_to_send`."""
        return sum(size_of(m) for m in self._out)

    @property
    def buffered(self) -> int:
        """Bytes received and held: of the message being reassembled (at most
        ``limits.max_message_bytes``: more closes with 1009), and the compressed bytes of
        deflated messages not yet inflated by :meth:`next_event`."""
        held = 0 if self._incoming is None else self._incoming.joined.held
        return held + sum(e.pending for e in self._events if isinstance(e, Inflation))

    @property
    def inflated(self) -> int:
        """Bytes the deflated message being inflated has given so far (0: none is): its
        running size, at most ``limits.max_message_bytes``."""
        head = self._events[0] if self._events else None
        return head.inflated if isinstance(head, Inflation) else 0

    @property
    def receiving(self) -> bool:
        """Whether a message is being reassembled (its header came, not all its fragments)."""
        return self._incoming is not None

    @property
    def receiving_since(self) -> float | None:
        """When the header of the message being reassembled came (None: none is)."""
        return None if self._incoming is None else self._incoming.since

    def data_to_send(self) -> list[bytes]:
        """Every WebSocket message queued for the peer, in order (``[]``: none)."""
        out, self._out = self._out, []
        return [m if isinstance(m, bytes) else bytes(m) if isinstance(m, memoryview)
                else b"".join(m) for m in out]  # fmt: skip

    def chunks_to_send(self) -> list[bytes | memoryview]:
        """The same as :meth:`data_to_send`, but a message that lies within one chunk given
        to :meth:`send_chunks` comes as a view of it, uncopied (what RS.io's
        ``chunks_to_send`` is to its ``data_to_send``)."""
        out, self._out = self._out, []
        return [b"".join(m) if isinstance(m, tuple) else m for m in out]

    def messages_to_send(self) -> list[tuple[bytes | memoryview, ...]]:
        """The same messages, each as its parts, never joined: a message of
        :meth:`send_chunks` is its Tube header then views of the chunks (a fragment across
        chunks joined), for an adapter that frames each with one ``writelines`` (one
        ``writev``): no copy of the payload before the kernel's."""
        out, self._out = self._out, []
        return [m if isinstance(m, tuple) else (m,) for m in out]

    def _queue(self, payload: bytes | memoryview | tuple[bytes | memoryview, ...],
               now: float) -> None:  # fmt: skip
        self._out.append(payload)
        self._last_sent = now

    @property
    def established(self) -> bool:
        return self.state is _State.OPEN

    def send(self, data: bytes | bytearray | memoryview, now: float, *,
             compress: bool | None = None) -> None:  # fmt: skip
        """Send one message (compressed per :attr:`compression` unless ``compress`` says)."""
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no message before both fragment sizes are exchanged")
        payload = data if isinstance(data, bytes) else bytes(data)
        packed = self._deflated([memoryview(payload)], len(payload), compress)
        if packed is not None:
            self._send_fragments(CODE_DEFLATE, packed, now)
        else:
            self._send_fragments(CODE_PLAIN, payload, now)

    def _deflated(self, views: list[memoryview], total: int, compress: bool | None) -> bytes | None:
        """The deflated payload to send, or None: plain (smart.py: "smart" probes first)."""
        if not self._deflate_ok or compress is False:
            return None
        if compress or self.compression == "always":
            return deflate(views)
        return deflated_if_it_pays(views, total) if self.compression == "smart" else None

    def send_chunks(self, chunks: Sequence[bytes | memoryview], now: float, *,
                    compress: bool | None = None) -> None:  # fmt: skip
        """Send one message whose payload is ``chunks`` back to back, as :meth:`send` would
        send their join, without the join: a WebSocket message that lies within one chunk is
        a view of it (:meth:`data_to_send` hands it out uncopied), only the header's message
        and a fragment that spans chunks are joined. The chunks must not change until sent.
        Deflate reads them one by one but its output is one new buffer (a join of sorts:
        compressing cannot be done in place)."""
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no message before both fragment sizes are exchanged")
        views = [memoryview(c).cast("B") for c in chunks]
        total = sum(v.nbytes for v in views)
        packed = self._deflated(views, total, compress)
        if packed is not None:
            self._send_fragments(CODE_DEFLATE, packed, now)
            return
        size = self.peer_fragment_size or 0
        if not size or total + 1 <= size:  # one WebSocket message: header and payload
            self._queue((encode_header(CODE_PLAIN, 1), *views), now)
            return
        count, first = self._layout(CODE_PLAIN, total, size)
        cursor = Cursor(views)
        self._queue((encode_header(CODE_PLAIN, count), cursor.take(first)), now)
        while cursor.left:
            self._queue(cursor.take(size), now)

    def _layout(self, code: int, total: int, size: int) -> tuple[int, int]:
        """``(count, first)``: the fragments of a ``total``-byte payload split at ``size``,
        and the length of the first (which shares its WebSocket message with the header)."""
        count = 1
        while True:
            head = len(encode_header(code, count))
            first = size - head
            rest = total - first
            needed = 1 + -(-rest // size) if rest > 0 else 1
            if needed == count:
                return count, first
            count = needed
            if count > MAX_FRAGMENTS:
                raise LocalProtocolError("a message needs more than 2**31-1 fragments")

    def _send_fragments(self, code: int, payload: bytes, now: float) -> None:
        size = self.peer_fragment_size or 0
        if not size or len(payload) + 1 <= size:  # (an empty message: the header alone, 01)
            self._queue((encode_header(code, 1), payload), now)
            return
        # The first fragment shares its WebSocket message with the header. Fragments are views
        # of the payload (data_to_send copies each once, as slicing did; the others do not).
        count, first = self._layout(code, len(payload), size)
        view = memoryview(payload)
        self._queue((encode_header(code, count), view[:first]), now)
        for start in range(first, len(payload), size):
            self._queue(view[start : start + size], now)

    def ping(self, now: float) -> None:
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no ping before both fragment sizes are exchanged")
        self._queue(encode_header(CODE_PING, 0), now)

    def close(self, reason: str = "closed", code: int = 1000) -> None:
        """This side ends the connection (the adapter closes the WebSocket with ``code``)."""
        self._close(reason, code, error=False)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` has something to do: a keepalive ping or silence, an
        unfinished message's deadline (None: nothing to time)."""
        if self.state is _State.CLOSED:
            return None
        deadlines = [] if self._message_deadline is None else [self._message_deadline]
        if self.keepalive is not None:
            deadlines.append(self._last_received + 3 * self.keepalive)
            if self.state is _State.OPEN:  # no ping before the exchange: only the silence
                deadlines.append(self._last_sent + self.keepalive)
        return min(deadlines, default=None)

    @property
    def _message_deadline(self) -> float | None:
        seconds = self.limits.message_seconds
        if seconds is None or self._incoming is None:
            return None
        return self._incoming.since + seconds

    def handle_timer(self, now: float) -> None:
        """Act on the deadlines passed at ``now`` (callable any time: a sweep)."""
        if self.state is _State.CLOSED:
            return
        deadline = self._message_deadline
        if deadline is not None and now >= deadline:
            self._close(f"a message unfinished after {self.limits.message_seconds:g} s",
                        CLOSE_POLICY, error=True)  # fmt: skip
            return
        if self.keepalive is None:
            return
        if now >= self._last_received + 3 * self.keepalive:
            self._close(f"the peer was silent for {now - self._last_received:.1f} s",
                        CLOSE_GOING_AWAY, error=True)  # fmt: skip
        elif now >= self._last_sent + self.keepalive and self.state is _State.OPEN:
            self.ping(now)

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes | bytearray | memoryview, now: float) -> None:
        """One WebSocket message's payload from the peer (``b""``: an empty one; the end of the
        WebSocket is the adapter's, see :meth:`close`). Never raises: a breach is
        :class:`Closed`."""
        if self.state is _State.CLOSED:
            return
        self._last_received = now
        try:
            self._receive(data if isinstance(data, bytes) else bytes(data), now)
        except RemoteProtocolError as exc:
            code = CLOSE_TOO_BIG if isinstance(exc, TooBig) else CLOSE_PROTOCOL_ERROR
            self._close(f"protocol error: {exc}", code, error=True)

    def next_event(self) -> Event | None:
        """The next event, or ``None`` until another WebSocket message comes. A deflated
        message is inflated here, a slice (``limits.inflate_slice_bytes``) a call."""
        if not self._events:
            return None
        head = self._events[0]
        if not isinstance(head, Inflation):
            self._events.popleft()
            return head
        limits = self.limits
        try:
            part, final = head.step(limits.max_message_bytes, limits.inflate_slice_bytes)
        except RemoteProtocolError as exc:  # what came after it is void: the breach ends it
            self._events.clear()  # (a close queued behind it is replaced by this one)
            self.state = _State.CLOSED
            self._incoming = None
            code = CLOSE_TOO_BIG if isinstance(exc, TooBig) else CLOSE_PROTOCOL_ERROR
            return Closed(f"protocol error: {exc}", code, True)
        if final:
            self._events.popleft()
        return MessageReceived(part, True, final)

    def _close(self, reason: str, code: int, *, error: bool) -> None:
        if self.state is not _State.CLOSED:
            self.state = _State.CLOSED
            self._incoming = None
            if error:  # (a breach: the deflated messages not yet inflated are dropped)
                self._events = deque(e for e in self._events if not isinstance(e, Inflation))
            self._events.append(Closed(reason, code, error))

    def _receive(self, data: bytes, now: float) -> None:
        if self.fragment_size and len(data) > self.fragment_size and self.state is _State.OPEN:
            raise TooBig(f"a WebSocket message of {len(data)} bytes, over the fragment size "
                         f"{self.fragment_size} this side asked for")  # fmt: skip
        if self.state is _State.AWAIT_SIZE:
            size, end = pull_varint(data, 0)
            if end != len(data):
                raise RemoteProtocolError("bytes after the fragment-size request")
            if size < 0:
                raise RemoteProtocolError(f"a negative fragment size ({size})")
            if 0 < size < 8:  # (**decision**: no room for a header with a varint count)
                raise RemoteProtocolError(f"a fragment size of {size} (0, or at least 8)")
            if 0 < size < self.limits.min_fragment_size:  # (**decision**: a floor, 1008)
                self._close(f"a fragment size of {size}, below {self.limits.min_fragment_size}",
                            CLOSE_POLICY, error=True)  # fmt: skip
                return
            self.peer_fragment_size = size
            if self.role is Role.SERVER:  # answered once the client's has been read
                self._queue(push_varint(self.fragment_size), now)
            self.state = _State.OPEN
            self._events.append(Established(size))
            return
        incoming = self._incoming
        if incoming is not None:  # a further fragment (or, after a lone header, the first)
            self._fragment(incoming, data)
            return
        if self._after_empty:
            self._after_empty = False
            if not data:  # (**decision**: an older tidewire's trailing empty fragment)
                return
        code, count, offset = split_header(data)
        if code >= 8:
            self._control(code, now)
            return
        limits, size = self.limits, self.fragment_size
        if count == 1:  # (the hot path: one fragment is the whole message, nothing to join)
            if offset == len(data):
                self._after_empty = True  # the header alone: an empty message (README)
            elif len(data) - offset > limits.max_message_bytes:
                raise TooBig(f"a message over {limits.max_message_bytes} bytes")
            self._message(code, data[offset:])
            return
        if count > limits.max_fragments:
            raise RemoteProtocolError(f"{count} fragments, over {limits.max_fragments}")
        # The smallest message a peer splitting at our size sends in `count` fragments: the
        # first fills its WebSocket message after the header, the middle ones are whole, the
        # last holds at least a byte. Past the limit, it is refused before any is buffered.
        least = (size - offset) + (count - 2) * size + 1
        if size and least > limits.max_message_bytes:
            raise TooBig(f"a message of {count} fragments of {size} bytes: over "
                         f"{limits.max_message_bytes} bytes")  # fmt: skip
        whole = min(count * size, limits.max_message_bytes) if size else 0  # (its most bytes)
        if self.parts and code == CODE_PLAIN:
            joined = ReassemblyPy(0)  # (parts: nothing is held, nothing joined)
        elif whole and whole <= limits.prealloc_bytes:
            joined = Reassembly(whole)  # (preallocated: the peer is trusted with it)
        else:
            joined = ReassemblyPy(limits.max_message_bytes)  # (kept, joined at the last)
        incoming = _Incoming(code, count, now, joined)
        self._incoming = incoming
        if offset == len(data):  # the header alone: the first fragment is the next message
            return  # (the seed's literal reading; with one fragment, above, an empty message)
        self._fragment(incoming, memoryview(data)[offset:])  # (a view: joined or copied once)

    def _fragment(self, incoming: _Incoming, data: bytes | memoryview) -> None:
        """One fragment of a message of several: put in its reassembly (kept, or copied into
        the preallocated buffer), the message handed out whole at the last (with :attr:`parts`,
        a plain message's fragment is handed out at once instead)."""
        if not data:  # (**decision**: it would let a peer grow a message's bookkeeping
            # without sending bytes; no sender needs one)
            raise RemoteProtocolError("an empty fragment in a message of several")
        incoming.received += 1
        incoming.size += len(data)
        if incoming.size > self.limits.max_message_bytes:
            raise TooBig(f"a message over {self.limits.max_message_bytes} bytes")
        last = incoming.received == incoming.count
        if last:
            self._incoming = None
        if self.parts and incoming.code == CODE_PLAIN:  # (nothing held: no join, no copy)
            self._events.append(MessageReceived(bytes(data), False, last))
        else:
            incoming.joined.put(data)  # (within its capacity: the size was checked above)
            if last:
                self._message(incoming.code, incoming.joined.finish())

    def _message(self, code: int, payload: bytes) -> None:
        if code == CODE_PLAIN:
            self._events.append(MessageReceived(payload, False))
        elif code == CODE_DEFLATE:  # (inflated by next_event, a slice at a time)
            self._events.append(Inflation(payload))
        else:  # a compression this side does not know: say so, drop the message (README)
            self._queue(encode_header(8 + code, 0), self._last_received)

    def _control(self, code: int, now: float) -> None:
        if code == CODE_PING:
            self._queue(encode_header(CODE_PONG, 0), now)  # at once (README)
            self._events.append(Ping())
        elif code == CODE_PONG:
            self._events.append(Pong())
        elif 9 <= code <= 15:
            if code == 8 + CODE_DEFLATE:
                self._deflate_ok = False
            self._events.append(CompressionRefused(code - 8))
        # 8 (unused) and 18-31 (reserved): ignored (**decision**)
