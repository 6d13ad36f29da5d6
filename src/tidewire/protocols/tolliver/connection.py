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
  (at-least-once). Reliable messages this side sends are resent (:meth:`handle_timer`) until
  acked, first ``resend_interval`` seconds after they were sent, then each wait
  ``resend_backoff`` times the last, at most ``resend_max_interval`` (a backoff of 1, the
  default: every ``resend_interval``); an ack for an id not awaited is ignored. What awaits
  acks is counted in bytes (:attr:`Connection.unacked_bytes`), for the adapter's budget.
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
import uuid
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import repeat
from operator import itemgetter
from typing import cast

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
    encode_control,
    encode_entry,
    parse_entry,
)
from .runs import ack_frames, message_frames, value_frames

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
    resend_backoff: float = 1.0  # each resend waits this times longer than the last
    resend_max_interval: float = 60.0  # ... but never longer than this
    auto_ack: bool = True  # False: the application acks (:meth:`ack`), e.g. once it is durable
    state: _State = _State.HANDSHAKE
    peer: uuid.UUID | None = None
    spoken: int | None = None
    peer_subscriptions: set[tuple[str, str]] = field(default_factory=set)
    resends: int = 0  # reliable messages resent (no ack within resend_interval)
    _decoder: Decoder = field(init=False)
    _out: bytearray = field(default_factory=bytearray)
    _events: deque[Event] = field(default_factory=deque)
    # What awaits acks, by how long it waits between resends: level k waits _waits[k]
    # (resend_interval, times resend_backoff each level, at most resend_max_interval). In one
    # level every entry waits the same, so id -> (frame, due) is in due order (a resend moves
    # an entry to the end of the next level): each level's first entry is its next due.
    _levels: list[OrderedDict[int, tuple[bytes, float]]] = field(init=False)
    _waits: list[float] = field(init=False)
    _unacked_bytes: int = 0

    def __post_init__(self) -> None:
        self._decoder = Decoder(self.limits)
        waits = [self.resend_interval]
        while self.resend_backoff > 1 and waits[-1] < self.resend_max_interval:
            waits.append(min(waits[-1] * self.resend_backoff, self.resend_max_interval))
        self._waits = waits
        self._levels = [OrderedDict() for _ in waits]
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
            self._forget(message.id)
            self._levels[0][message.id] = (frame, now + self.resend_interval)
            self._unacked_bytes += len(frame)

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
        items = messages if isinstance(messages, list) else list(messages)
        # every frame first: one refused leaves nothing written and nothing awaiting an ack
        frames = message_frames(raw, items)
        self._sent(frames, [message_id for _, _, message_id in items], now)

    def send_values(
        self, channel: str, values: memoryview, offsets: memoryview, first_id: int, now: float
    ) -> None:
        """Send a run of values as reliable messages with no key on ``channel`` (``values`` and
        ``offsets`` as a :class:`~tidewire.model.Batch`'s value column), ids ``first_id`` on,
        one each: :meth:`send_many` of ``(b"", value i, first_id + i)`` without a tuple or a
        body copy per message (the hub's delivery of a run of events)."""
        if channel == CONTROL_CHANNEL:
            raise LocalProtocolError(f"the channel {CONTROL_CHANNEL!r} is reserved")
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no message before the handshake completes")
        frames = value_frames(check_name("channel", channel), values, offsets, first_id)
        self._sent(frames, list(range(first_id, first_id + len(frames))), now)

    def _sent(self, frames: list[bytes], ids: list[int], now: float) -> None:
        """Queue ``frames`` (message frames of ``ids``, in order) and await the reliable ones'
        acks (resent from ``now`` + ``resend_interval``)."""
        due = now + self.resend_interval
        first = self._levels[0]
        distinct = set(ids)
        if (
            UNRELIABLE in distinct
            or len(distinct) < len(ids)
            or any(not level.keys().isdisjoint(distinct) for level in self._levels)
        ):
            added = 0  # (the slow way: an unreliable one, an id twice or awaited already)
            for message_id, frame in zip(ids, frames, strict=True):
                if message_id != UNRELIABLE:
                    self._forget(message_id)
                    first[message_id] = (frame, due)
                    added += len(frame)
        else:  # (the common case, in C loops: new distinct ids, all reliable)
            first.update(zip(ids, zip(frames, repeat(due), strict=False), strict=True))
            added = sum(map(len, frames))
        self._unacked_bytes += added
        self._out += b"".join(frames)

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

    def subscribe_many(self, subscriptions: Iterable[tuple[str, str]], *, op: int = 0) -> None:
        """:meth:`subscribe` (``op`` 0) or unsubscribe (1) each ``(channel, key)``, in one go
        (the hub telling every remote about many channels: no object per entry)."""
        if op not in (0, 1):
            raise LocalProtocolError("a subscription entry's op is 0 (sub) or 1 (unsub)")
        frames = []
        for channel, key in subscriptions:
            if channel == CONTROL_CHANNEL:
                raise LocalProtocolError(f"the channel {CONTROL_CHANNEL!r} is reserved")
            raw_channel, raw_key = check_name("channel", channel), check_name("key", key)
            if op == 0:
                self.subscriptions.add((channel, key))
            else:
                self.subscriptions.discard((channel, key))
            if self.established:
                frames.append(encode_control(op, raw_channel, raw_key))
        self._out += b"".join(frames)

    def unsubscribe(self, channel: str, key: str = "") -> None:
        self.subscribe(channel, key, op=1)

    def ack(self, message_id: int) -> None:
        """Ack a reliable message received (with ``auto_ack=False``: once it is safe)."""
        self.ack_many((message_id,))

    def ack_many(self, message_ids: Iterable[int]) -> None:
        """:meth:`ack` of each of ``message_ids``, in order."""
        if self.state is not _State.OPEN:
            raise LocalProtocolError("no ack before the handshake completes")
        self._out += ack_frames(message_ids if isinstance(message_ids, list) else list(message_ids))

    def unacked(self) -> list[int]:
        return sorted(i for level in self._levels for i in level)

    @property
    def unacked_count(self) -> int:
        """Reliable messages sent and not acked yet."""
        return sum(len(level) for level in self._levels)

    @property
    def unacked_bytes(self) -> int:
        """The frames of reliable messages sent and not acked yet, in bytes (kept for
        resending: the adapter charges them to its memory budget)."""
        return self._unacked_bytes

    @property
    def receiving(self) -> int:
        """The size of the frame being received, as declared by its header (a message's
        lengths) or as far as it has come (a handshake); 0 when none is unfinished. The
        adapter checks it against its budget after each read, before waiting for the rest."""
        return self._decoder.declared

    @property
    def frames_received(self) -> int:
        """Frames parsed so far (one more: a new frame has begun since)."""
        return self._decoder.frames

    def _forget(self, message_id: int) -> bool:
        """Stop awaiting ``message_id``'s ack; whether it was awaited."""
        for level in self._levels:  # (most acks come before the first resend: level 0)
            entry = level.pop(message_id, None)
            if entry is not None:
                self._unacked_bytes -= len(entry[0])
                return True
        return False

    # ------------------------------------------------------------------ time

    def next_deadline(self) -> float | None:
        """When :meth:`handle_timer` has something to resend (``None``: nothing)."""
        if not self.established:
            return None
        dues = [next(iter(level.values()))[1] for level in self._levels if level]
        return min(dues) if dues else None

    def handle_timer(self, now: float) -> None:
        """Resend every reliable message still unacked whose time has come; each waits
        ``resend_backoff`` times longer for its next resend (at most ``resend_max_interval``)."""
        if not self.established:
            return
        levels, last = self._levels, len(self._levels) - 1
        # the last level first: what moves into it from the one below must not be resent again
        for k in range(last, -1, -1):
            level = levels[k]
            due = []
            for message_id, (frame, when) in level.items():
                if when > now:
                    break
                due.append((message_id, frame))
            if not due:
                continue
            self.resends += len(due)
            into = levels[min(k + 1, last)]
            later = now + self._waits[min(k + 1, last)]
            for message_id, frame in due:
                self._out += frame
                del level[message_id]
                into[message_id] = (frame, later)

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

    def receive_run(self, received: list[Message], acked: list[int]) -> int:
        """The bulk way in (issue 22): parse the application messages and acks at the head of
        the input in one pass, appending to ``received`` each message :meth:`next_event` would
        give as :class:`Received` (a reliable one acked here too, with ``auto_ack``) and to
        ``acked`` each id it would give as :class:`Acked`, in order; the frames parsed. No
        object per frame but the :class:`Message`.

        It stops at anything else (a handshake, a control message, a frame not whole yet, a
        breach), and does nothing before the handshake completes or while events wait: call
        :meth:`next_event` after it, until ``None``, and again this, so the events and the
        runs come in the order of their frames."""
        if self.state is not _State.OPEN or self._events:
            return 0
        start = len(received)
        acks: list[int] = []
        try:
            count = self._decoder.take_run(received, acks, CONTROL_CHANNEL)
        except RemoteProtocolError:
            return 0  # (a dead decoder: next_event closes)
        if self.auto_ack and len(received) > start:
            self._out += ack_frames([message.id for message in received[start:]
                                     if message.id != UNRELIABLE])  # fmt: skip
        if acks:
            self._forget_run(acks, acked)
        return count

    def _forget_run(self, acks: list[int], acked: list[int]) -> None:
        """:meth:`_forget` of each of ``acks``, appending to ``acked`` those that were awaited,
        in order. Most acks come before the first resend: those are popped from the first
        level in C loops (``map``), the others looked for one by one."""
        popped = list(map(self._levels[0].pop, acks, repeat(None)))
        if None not in popped:
            entries = cast(list[tuple[bytes, float]], popped)
            self._unacked_bytes -= sum(map(len, map(itemgetter(0), entries)))
            acked += acks
            return
        forget = self._forget
        for message_id, entry in zip(acks, popped, strict=True):
            if entry is not None:
                self._unacked_bytes -= len(entry[0])
                acked.append(message_id)
            elif forget(message_id):
                acked.append(message_id)

    def next_event(self) -> Event | None:
        """The next event, or ``None`` until more bytes come (or once closed)."""
        events, decoder = self._events, self._decoder
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
                        if self._forget(frame.id):
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
                if self._forget(message_id):
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
