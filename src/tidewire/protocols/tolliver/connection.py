"""One Tolliver connection, sans-IO (seed 003 and shared/seeds/README.md): bytes in, events out,
bytes to send; time is an argument (``now``, seconds) for resends.

* **Handshake.** The connecting side sends a request (its version, instance UUID and
  subscriptions). The accepting side registers those subscriptions, then answers with its own
  version, UUID, subscriptions and a status comparing the two versions: 0 equal; 1 it is newer
  and speaks the requester's version; 2 it is newer and cannot (it then closes); 3 it is older:
  the requester answers a final message, 1 (it speaks the older version) or 2 (failure, and
  closes). A request on an established connection is answered as usual; an unexpected response
  or final is ignored (the seed).
* **Messages.** Nothing but the handshake before it completes. A reliable message (id other than
  2**31-1) is acked on receipt, every time, and handed to the application every time
  (at-least-once). Reliable messages this side sends are resent every ``resend_interval``
  seconds (:meth:`handle_timer`) until acked; an ack for an id not awaited is ignored.
* **Subscriptions.** The peer's are those of its handshake, then changed by messages on the
  reserved channel ``tolliver`` (no key; body: one subscription entry). An application message
  on that channel is a breach; :meth:`send` refuses to send one. The peer holds at most
  ``limits.max_subscriptions`` at once (handshake entries and later subscribes together); one
  more is a breach.

A breach by the peer closes the connection (Tolliver has no error message outside the handshake):
:class:`Closed` with ``error=True`` and the reason.
"""

from __future__ import annotations

import enum
import struct
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...model import LocalProtocolError, RemoteProtocolError
from .codec import (
    ACK,
    CONTROL_CHANNEL,
    UNRELIABLE,
    Ack,
    Decoder,
    HandshakeFinal,
    HandshakeRequest,
    HandshakeResponse,
    Limits,
    Message,
    SubscriptionEntry,
    check_name,
    encode,
    encode_entry,
    encode_message,
    parse_entry,
)

__all__ = [
    "Acked",
    "Closed",
    "Connection",
    "Established",
    "Event",
    "PeerSubscriptions",
    "Received",
    "Role",
    "matches",
]


class Role(enum.Enum):
    CONNECTOR = "connector"  # opened the connection: sends the handshake request
    ACCEPTOR = "acceptor"


class _State(enum.Enum):
    HANDSHAKE = "handshake"
    AWAIT_FINAL = "await_final"  # acceptor answered 3
    OPEN = "open"
    CLOSED = "closed"


@dataclass(frozen=True, slots=True)
class Established:
    peer: uuid.UUID
    version: int  # the version spoken on this connection
    status: int


@dataclass(frozen=True, slots=True)
class Received:
    message: Message


@dataclass(frozen=True, slots=True)
class Acked:
    id: int


@dataclass(frozen=True, slots=True)
class PeerSubscriptions:
    """The peer's subscriptions changed (handshake, or a control message)."""

    subscriptions: frozenset[tuple[str, str]]


@dataclass(frozen=True, slots=True)
class Closed:
    reason: str
    error: bool


Event = Established | Received | Acked | PeerSubscriptions | Closed


def matches(subscriptions: Iterable[tuple[str, str]], channel: str, key: str) -> bool:
    """Whether ``(channel, key)`` is covered: an exact subscription, or the channel with the
    empty key (every key)."""
    subs = subscriptions if isinstance(subscriptions, set | frozenset) else set(subscriptions)
    return (channel, key) in subs or (channel, "") in subs


@dataclass(slots=True)
class Connection:
    role: Role
    instance: uuid.UUID
    version: int
    supported: frozenset[int]  # versions this side can speak (``version`` included)
    subscriptions: set[tuple[str, str]] = field(default_factory=set)  # this side's
    limits: Limits = field(default_factory=Limits)
    resend_interval: float = 1.0
    auto_ack: bool = True  # False: the application acks (:meth:`ack`), e.g. once it is durable
    state: _State = _State.HANDSHAKE
    peer: uuid.UUID | None = None
    spoken: int | None = None
    peer_subscriptions: set[tuple[str, str]] = field(default_factory=set)
    resends: int = 0  # reliable messages resent (no ack within resend_interval)
    _decoder: Decoder = field(init=False)
    _out: bytearray = field(default_factory=bytearray)
    _events: deque[Event] = field(default_factory=deque)
    # id -> (frame, due), in order of due time (a resend moves an entry to the end): the first
    # is the next due
    _unacked: OrderedDict[int, tuple[bytes, float]] = field(default_factory=OrderedDict)

    def __post_init__(self) -> None:
        self._decoder = Decoder(self.limits)
        self.supported = frozenset(self.supported) | {self.version}

    # ------------------------------------------------------------------ output

    def initiate(self) -> None:
        """The connecting side's handshake request (call once, first)."""
        if self.role is not Role.CONNECTOR:
            raise LocalProtocolError("only the connecting side sends the handshake request")
        encode(HandshakeRequest(self.version, self.instance, self._entries()), self._out)

    def _entries(self) -> tuple[SubscriptionEntry, ...]:
        return tuple(SubscriptionEntry(0, c, k) for c, k in sorted(self.subscriptions))

    def data_to_send(self) -> bytes:
        """Everything queued for the peer, in order (``b""``: nothing)."""
        data = bytes(self._out)
        self._out.clear()
        return data

    @property
    def pending(self) -> int:
        """Bytes queued in :meth:`data_to_send`."""
        return len(self._out)

    @property
    def buffered(self) -> int:
        """Bytes received and not parsed yet: at most ``limits.buffer_limit`` (more is a
        breach)."""
        return self._decoder.buffered

    @property
    def established(self) -> bool:
        return self.state is _State.OPEN

    @property
    def closed(self) -> bool:
        return self.state is _State.CLOSED

    def send(self, message: Message, now: float) -> None:
        """Send an application message; a reliable one is resent until acked."""
        if message.channel == CONTROL_CHANNEL:
            raise LocalProtocolError(f"the channel {CONTROL_CHANNEL!r} is reserved")
        self._send(message, now)

    def _send(self, message: Message, now: float) -> None:
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no message before the handshake completes")
        frame = bytes(encode(message))
        self._out += frame
        if message.id != UNRELIABLE:
            self._unacked.pop(message.id, None)
            self._unacked[message.id] = (frame, now + self.resend_interval)

    def send_many(
        self, channel: str, messages: Iterable[tuple[bytes, bytes, int]], now: float
    ) -> None:
        """Send many application messages on ``channel``, each ``(key, body, id)`` with the key
        already UTF-8 (the bulk path: no :class:`Message` objects; an invalid key is the
        caller's error and breaks the peer's decoder)."""
        if channel == CONTROL_CHANNEL:
            raise LocalProtocolError(f"the channel {CONTROL_CHANNEL!r} is reserved")
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no message before the handshake completes")
        raw = check_name("channel", channel)
        # every frame first: one refused leaves nothing written and nothing awaiting an ack
        encoded = [(message_id, encode_message(raw, key, body, message_id))
                   for key, body, message_id in messages]  # fmt: skip
        due = now + self.resend_interval
        unacked = self._unacked
        for message_id, frame in encoded:
            if message_id != UNRELIABLE:
                unacked.pop(message_id, None)
                unacked[message_id] = (frame, due)
        self._out += b"".join([frame for _, frame in encoded])

    def subscribe(self, channel: str, key: str = "", *, op: int = 0) -> None:
        """Change this side's subscriptions; told to the peer now if established (else in the
        handshake)."""
        if channel == CONTROL_CHANNEL:
            raise LocalProtocolError(f"the channel {CONTROL_CHANNEL!r} is reserved")
        entry = SubscriptionEntry(op, channel, key)
        if op == 0:
            self.subscriptions.add((channel, key))
        else:
            self.subscriptions.discard((channel, key))
        if self.established:
            body = bytes(encode_entry(entry))
            self._out += encode(Message(CONTROL_CHANNEL, "", body, UNRELIABLE))

    def unsubscribe(self, channel: str, key: str = "") -> None:
        self.subscribe(channel, key, op=1)

    def ack(self, message_id: int) -> None:
        """Ack a reliable message received (with ``auto_ack=False``: once it is safe)."""
        self.ack_many((message_id,))

    def ack_many(self, message_ids: Iterable[int]) -> None:
        """:meth:`ack` of each of ``message_ids``, in order."""
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no ack before the handshake completes")
        try:
            self._out += b"".join([ACK.pack(4, message_id) for message_id in message_ids])
        except struct.error:
            raise LocalProtocolError("an ack's id is a u32") from None

    def unacked(self) -> list[int]:
        return sorted(self._unacked)

    @property
    def unacked_count(self) -> int:
        """Reliable messages sent and not acked yet."""
        return len(self._unacked)

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` has something to resend (``None``: nothing)."""
        if not self._unacked or not self.established:
            return None
        return next(iter(self._unacked.values()))[1]

    def handle_timer(self, now: float) -> None:
        """Resend every reliable message still unacked whose time has come."""
        if not self.established:
            return
        due = []
        for message_id, (frame, when) in self._unacked.items():
            if when > now:
                break
            due.append((message_id, frame))
        later = now + self.resend_interval
        self.resends += len(due)
        for message_id, frame in due:
            self._out += frame
            self._unacked[message_id] = (frame, later)
            self._unacked.move_to_end(message_id)

    # ------------------------------------------------------------------ input

    def receive_data(self, data: bytes) -> None:
        """Bytes from the peer; ``b""``: it closed. A breach closes (:class:`Closed`)."""
        if self.closed:
            return
        if not data:
            self._close("the peer closed the connection", error=False)
            return
        try:
            self._decoder.feed(data)
        except RemoteProtocolError as exc:
            self._close(str(exc), error=True)

    def next_event(self) -> Event | None:
        """The next event, or ``None`` until more bytes come (or once closed)."""
        events, decoder, unacked = self._events, self._decoder, self._unacked
        while not events and self.state is not _State.CLOSED:
            try:
                frame = decoder.next_frame()
                if frame is None:
                    break
                # the hot paths first: messages and acks on an open connection
                if self.state is _State.OPEN:
                    if isinstance(frame, Message) and frame.channel != CONTROL_CHANNEL:
                        if self.auto_ack and frame.id != UNRELIABLE:
                            self._out += ACK.pack(4, frame.id)
                        return Received(frame)
                    if isinstance(frame, Ack):
                        if unacked.pop(frame.id, None) is not None:
                            return Acked(frame.id)
                        continue  # an ack for an id not awaited: ignored
                self._receive(frame)
            except RemoteProtocolError as exc:
                self._close(f"protocol error: {exc}", error=True)
        return events.popleft() if events else None

    def _close(self, reason: str, *, error: bool) -> None:
        if self.state is not _State.CLOSED:
            self.state = _State.CLOSED
            self._events.append(Closed(reason, error))

    def _receive(self, frame: object) -> None:
        match frame:
            case HandshakeRequest(version, instance, entries):
                self._request(version, instance, entries)
            case HandshakeResponse(version, instance, status, entries):
                self._response(version, instance, status, entries)
            case HandshakeFinal(status):
                if self.state is not _State.AWAIT_FINAL:
                    return  # unexpected: ignored (the seed)
                if status == 1:
                    self._open(self.version, 3)
                else:
                    self._close(f"the peer cannot speak version {self.version} "
                                f"(handshake final {status})", error=False)  # fmt: skip
            case Message() if not self.established:
                raise RemoteProtocolError("a message before the handshake completed")
            case Ack() if not self.established:
                raise RemoteProtocolError("an ack before the handshake completed")
            case Message(channel, key, body, message_id):
                if message_id != UNRELIABLE and (self.auto_ack or channel == CONTROL_CHANNEL):
                    encode(Ack(message_id), self._out)
                if channel == CONTROL_CHANNEL:
                    if key:
                        raise RemoteProtocolError("a message on the reserved channel with a key")
                    entry = parse_entry(body, self.limits)
                    self._apply(entry)
                    self._events.append(PeerSubscriptions(frozenset(self.peer_subscriptions)))
                    return
                self._events.append(Received(frame))
            case Ack(message_id):
                if self._unacked.pop(message_id, None) is not None:
                    self._events.append(Acked(message_id))
                # an ack for an id not awaited (acked already, or never sent): ignored

    def _apply(self, entry: SubscriptionEntry) -> None:
        if entry.channel == CONTROL_CHANNEL:
            raise RemoteProtocolError(f"a subscription to the reserved channel {CONTROL_CHANNEL!r}")
        if entry.op == 0:
            subscription = (entry.channel, entry.key)
            limit = self.limits.max_subscriptions
            if (
                len(self.peer_subscriptions) >= limit
                and subscription not in self.peer_subscriptions
            ):
                raise RemoteProtocolError(f"more than {limit} subscriptions")
            self.peer_subscriptions.add(subscription)
        else:
            self.peer_subscriptions.discard((entry.channel, entry.key))

    def _request(
        self, version: int, instance: uuid.UUID, entries: tuple[SubscriptionEntry, ...]
    ) -> None:
        if self.role is not Role.ACCEPTOR and self.state is not _State.OPEN:
            raise RemoteProtocolError("a handshake request to the side that opened, before "
                                      "its own handshake completed")  # fmt: skip
        self.peer = instance
        self.peer_subscriptions = set()
        for entry in entries:  # registered before the response (the seed)
            self._apply(entry)
        if version == self.version:
            status = 0
        elif version < self.version:
            status = 1 if version in self.supported else 2
        else:
            status = 3
        encode(HandshakeResponse(self.version, self.instance, status, self._entries()), self._out)
        if status == 2:
            self._close(f"the peer speaks version {version}, which this side cannot",
                        error=False)  # fmt: skip
        elif status == 3:
            self.state = _State.AWAIT_FINAL
        elif self.state is not _State.OPEN:
            self._open(version, status)
        else:
            self.spoken = version
            self._events.append(PeerSubscriptions(frozenset(self.peer_subscriptions)))

    def _response(
        self, version: int, instance: uuid.UUID, status: int,
        entries: tuple[SubscriptionEntry, ...],
    ) -> None:  # fmt: skip
        if self.role is not Role.CONNECTOR or self.state is not _State.HANDSHAKE:
            return  # unexpected: ignored (the seed)
        self.peer = instance
        self.peer_subscriptions = set()
        for entry in entries:
            self._apply(entry)
        if status in (0, 1):
            self._open(self.version, status)
        elif status == 2:
            self._close(f"the peer (version {version}) cannot speak version {self.version}",
                        error=False)  # fmt: skip
        elif status == 3:
            if version in self.supported:
                encode(HandshakeFinal(1), self._out)
                self._open(version, 3)
            else:
                encode(HandshakeFinal(2), self._out)
                self._close(f"this side cannot speak the peer's older version {version}",
                            error=False)  # fmt: skip
        else:
            raise RemoteProtocolError(f"handshake status {status} (0-3)")

    def _open(self, version: int, status: int) -> None:
        self.state = _State.OPEN
        self.spoken = version
        assert self.peer is not None
        self._events.append(Established(self.peer, version, status))
        self._events.append(PeerSubscriptions(frozenset(self.peer_subscriptions)))
