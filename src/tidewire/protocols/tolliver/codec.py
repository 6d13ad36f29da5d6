"""Tolliver frames (seed 003 and shared/seeds/README.md): ``encode`` and an incremental, bounded
:class:`Decoder`. Every integer is big-endian; every frame starts with its code, one byte::

    0 handshake req    version u64 | instance UUID (16) | n u32 | n x subscription entry
    1 handshake res    version u64 | instance UUID (16) | status u8 | n u32 | n x entry
    2 handshake final  status u8 (1: backwards compatible, 2: failure)
    3 message          channel len u32 | key len u32 | body len u32 | id u32 |
                       channel (UTF-8) | key (UTF-8) | body
    4 ack              id u32

    subscription entry (also the body of a message on the channel "tolliver", no key):
                       op u8 (0 sub, 1 unsub) | channel len u32 | key len u32 | channel | key

A message whose id is 2**31-1 is unreliable (no ack, no resend); a reliable id is any other u32.
Frames carry no overall length: the decoder reads the fields in order, each length checked
against :class:`Limits` before its bytes are waited for.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from ...model import LocalProtocolError, RemoteProtocolError
from ..buffer import ReceiveBuffer
from .runs import NAMES_CACHED, take_run

__all__ = [
    "CONTROL_CHANNEL",
    "UNRELIABLE",
    "Ack",
    "Decoder",
    "Frame",
    "HandshakeFinal",
    "HandshakeRequest",
    "HandshakeResponse",
    "Limits",
    "Message",
    "SubscriptionEntry",
    "encode",
    "encode_control",
    "encode_entry",
    "encode_message",
    "parse_entry",
]

UNRELIABLE = 2**31 - 1
CONTROL_CHANNEL = "tolliver"
MAX_U32 = 2**32 - 1
MAX_U64 = 2**64 - 1

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_MSG = struct.Struct(">BIIII")  # code 3 and the message header
ACK = struct.Struct(">BI")
"""An ack frame: type 4, the message id (the connection packs many at once)."""
_ENTRY = struct.Struct(">BII")


@dataclass(frozen=True, slots=True)
class Limits:
    max_name_bytes: int = 4096  # a channel or key
    max_body_bytes: int = 16 * 1024 * 1024
    max_subscriptions: int = 65536  # entries in one handshake; held at once (Connection)
    # bytes received and not parsed: raised to the largest message frame plus 1 MiB if below
    # it (the adapters drain every complete frame after each read, so what waits is at most
    # one partial frame and one read); a handshake larger than this is a breach (**decision**)
    max_buffered_bytes: int = 64 * 1024 * 1024

    @property
    def buffer_limit(self) -> int:
        """The receive buffer's limit: :attr:`max_buffered_bytes`, or more if a message frame
        at the other limits would not fit."""
        frame = _MSG.size + 2 * self.max_name_bytes + self.max_body_bytes
        return max(self.max_buffered_bytes, frame + 1024 * 1024)


def check_name(what: str, name: str) -> bytes:
    """``name`` (a channel or key) as UTF-8 bytes; ``LocalProtocolError`` if it cannot be
    sent (not encodable, or longer than a u32 length allows)."""
    try:
        raw = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise LocalProtocolError(f"{what} is not UTF-8: {exc}") from None
    if len(raw) > MAX_U32:
        raise LocalProtocolError(f"{what} is too long")
    return raw


@dataclass(frozen=True, slots=True)
class SubscriptionEntry:
    """Subscribe (``op`` 0) to or unsubscribe (1) from ``channel`` and ``key`` ("" = every
    key of the channel)."""

    op: int
    channel: str
    key: str = ""

    def __post_init__(self) -> None:
        if self.op not in (0, 1):
            raise LocalProtocolError("a subscription entry's op is 0 (sub) or 1 (unsub)")
        check_name("channel", self.channel)
        check_name("key", self.key)


@dataclass(frozen=True, slots=True)
class HandshakeRequest:
    version: int
    instance: uuid.UUID
    subscriptions: tuple[SubscriptionEntry, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.version <= MAX_U64:
            raise LocalProtocolError("version is a u64")


@dataclass(frozen=True, slots=True)
class HandshakeResponse:
    version: int
    instance: uuid.UUID
    status: int
    subscriptions: tuple[SubscriptionEntry, ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.version <= MAX_U64 or not 0 <= self.status <= 255:
            raise LocalProtocolError("version is a u64, status a u8")


@dataclass(frozen=True, slots=True)
class HandshakeFinal:
    status: int

    def __post_init__(self) -> None:
        if not 0 <= self.status <= 255:
            raise LocalProtocolError("status is a u8")


@dataclass(frozen=True, slots=True)
class Message:
    """An application (or control) message. Checked when encoded (:func:`encode` raises
    :class:`LocalProtocolError`), not when built: decoded messages are valid by construction,
    and building one is on the hot path."""

    channel: str
    key: str
    body: bytes
    id: int = UNRELIABLE

    @property
    def reliable(self) -> bool:
        return self.id != UNRELIABLE


@dataclass(frozen=True, slots=True)
class Ack:
    id: int  # checked when encoded


Frame = HandshakeRequest | HandshakeResponse | HandshakeFinal | Message | Ack


def encode_entry(entry: SubscriptionEntry, out: bytearray | None = None) -> bytearray:
    out = bytearray() if out is None else out
    channel, key = entry.channel.encode(), entry.key.encode()
    out += _ENTRY.pack(entry.op, len(channel), len(key))
    out += channel
    out += key
    return out


_CONTROL = CONTROL_CHANNEL.encode()


def encode_control(op: int, channel: bytes, key: bytes) -> bytes:
    """A subscription change as its message frame (unreliable, on the reserved channel, no
    key; the body one entry) from encoded names."""
    body = b"".join((_ENTRY.pack(op, len(channel), len(key)), channel, key))
    return encode_message(_CONTROL, b"", body, UNRELIABLE)


def encode_message(channel: bytes, key: bytes, body: bytes, message_id: int) -> bytes:
    """One message frame from encoded names (the bulk senders' path: encode the names once)."""
    if not 0 <= message_id <= MAX_U32 or len(body) > MAX_U32:
        raise LocalProtocolError("a message's id and body length are u32")
    return b"".join((_MSG.pack(3, len(channel), len(key), len(body), message_id),
                     channel, key, body))  # fmt: skip


def encode(frame: Frame, out: bytearray | None = None) -> bytearray:
    """Append ``frame``'s bytes to ``out`` (a new bytearray by default) and return it."""
    out = bytearray() if out is None else out
    match frame:
        case Message(channel, key, body, message_id):
            out += encode_message(check_name("channel", channel), check_name("key", key),
                                  body, message_id)  # fmt: skip
        case Ack(message_id):
            if not 0 <= message_id <= MAX_U32:
                raise LocalProtocolError("an ack's id is a u32")
            out += ACK.pack(4, message_id)
        case HandshakeRequest(version, instance, subscriptions):
            out.append(0)
            out += _U64.pack(version)
            out += instance.bytes
            out += _U32.pack(len(subscriptions))
            for entry in subscriptions:
                encode_entry(entry, out)
        case HandshakeResponse(version, instance, status, subscriptions):
            out.append(1)
            out += _U64.pack(version)
            out += instance.bytes
            out.append(status)
            out += _U32.pack(len(subscriptions))
            for entry in subscriptions:
                encode_entry(entry, out)
        case HandshakeFinal(status):
            out.append(2)
            out.append(status)
    return out


class _NeedData(Exception):
    pass


def _name(buf: bytes | bytearray, pos: int, size: int, what: str) -> str:
    try:
        return bytes(buf[pos : pos + size]).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RemoteProtocolError(f"{what} is not UTF-8: {exc}") from None


def parse_entry(data: bytes | bytearray, limits: Limits) -> SubscriptionEntry:
    """The subscription entry that is exactly ``data`` (a control message's body)."""
    buf = bytearray(data)
    try:
        entry, end = _entry(buf, 0, limits)
    except _NeedData:
        raise RemoteProtocolError("a subscription entry cut short") from None
    if end != len(buf):
        raise RemoteProtocolError("bytes after a subscription entry")
    return entry


def _entry(buf: bytes | bytearray, pos: int, limits: Limits) -> tuple[SubscriptionEntry, int]:
    if len(buf) < pos + _ENTRY.size:
        raise _NeedData
    op, clen, klen = _ENTRY.unpack_from(buf, pos)
    if op not in (0, 1):
        raise RemoteProtocolError(f"subscription op {op} (0 sub, 1 unsub)")
    if clen > limits.max_name_bytes or klen > limits.max_name_bytes:
        raise RemoteProtocolError(f"a channel or key over {limits.max_name_bytes} bytes")
    pos += _ENTRY.size
    end = pos + clen + klen
    if len(buf) < end:
        raise _NeedData
    channel = _name(buf, pos, clen, "channel")
    key = _name(buf, pos + clen, klen, "key")
    return SubscriptionEntry(op, channel, key), end


class Decoder:
    """Bytes in (:meth:`feed`), frames out (:meth:`next_frame`, ``None`` = need more).
    :class:`RemoteProtocolError` means the peer broke the format (the decoder is then dead);
    more than ``limits.buffer_limit`` bytes unparsed is such a breach
    (:class:`~tidewire.protocols.buffer.BufferFull`)."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = limits or Limits()
        self._rx = ReceiveBuffer(self.limits.buffer_limit)
        self._dead: RemoteProtocolError | None = None
        self._names: dict[bytes, str] = {}  # channel and key bytes -> str, recently seen
        self._frames = 0
        # a handshake coming in pieces: (entries walked, offset from the frame's start) of its
        # length fields, kept between calls so that no piece makes it walk from the start again
        self._walked = (0, 0)

    def _name(self, raw: bytes, what: str) -> str:
        name = self._names.get(raw)
        if name is None:
            try:
                name = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RemoteProtocolError(f"{what} is not UTF-8: {exc}") from None
            if len(self._names) >= NAMES_CACHED:
                self._names.clear()
            self._names[raw] = name
        return name

    @property
    def buffered(self) -> int:
        """Bytes received and not parsed yet (at most ``limits.buffer_limit``)."""
        return self._rx.buffered

    @property
    def declared(self) -> int:
        """The size of the frame being received, as far as it is known: a message's whole
        frame once its 17-byte header is in (its declared lengths), else the bytes buffered
        (a handshake's size is known only entry by entry). 0: nothing unfinished. Constant
        time: the adapter checks it against its memory budget after every read, before the
        rest of a declared body is waited for."""
        buf, pos = self._rx.view()
        buffered = len(buf) - pos
        if buffered >= _MSG.size and buf[pos] == 3:
            _, clen, klen, blen, _ = _MSG.unpack_from(buf, pos)
            return max(buffered, _MSG.size + int(clen) + int(klen) + int(blen))
        return buffered

    @property
    def frames(self) -> int:
        """Frames parsed so far (an adapter tells from it that a new frame has begun)."""
        return self._frames

    @property
    def names_cached(self) -> int:
        """Channel and key names kept decoded (at most 256: the cache is bounded too)."""
        return len(self._names)

    def feed(self, data: bytes) -> None:
        if self._dead is not None:
            raise self._dead
        try:
            self._rx.append(data)
        except RemoteProtocolError as exc:
            self._dead = exc
            raise

    def next_frame(self) -> Frame | None:
        if self._dead is not None:
            raise self._dead
        rx = self._rx
        try:  # (parsed in place: a frame is consumed only once it is whole)
            frame, end = self._parse(*rx.view())
        except _NeedData:
            return None
        except RemoteProtocolError as exc:
            self._dead = exc
            self._rx.clear()
            raise
        rx.advance_to(end)
        self._frames += 1
        self._walked = (0, 0)
        return frame

    def take_run(self, messages: list[Message], acks: list[int], skip_channel: str) -> int:
        """Parse the whole message and ack frames at the head of the input in one pass
        (issue 22: no call, view or advance per frame; :func:`.runs.take_run`, compiled when
        the kernels are built): append each message (except one on ``skip_channel``) to
        ``messages`` and each ack's id to ``acks``; the frames parsed.

        It stops, consuming nothing of it, at the first frame that is not whole, is another
        kind, is on ``skip_channel``, or breaks a limit or UTF-8: :meth:`next_frame` then
        parses that frame exactly as it always has (the same frames, errors and order)."""
        if self._dead is not None:
            raise self._dead
        buf, pos = self._rx.view()
        limits = self.limits
        count, end = take_run(buf, pos, limits.max_name_bytes, limits.max_body_bytes,
                              self._names, skip_channel, messages, acks, Message)  # fmt: skip
        if count:
            self._rx.advance_to(end)
            self._frames += count
            self._walked = (0, 0)
        return count

    def _walk(self, buf: bytes | bytearray, start: int, first: int, count: int) -> None:
        """Walk a handshake's entries by their length fields (checking each as it comes),
        from where the last call stopped; :class:`_NeedData` until all ``count`` are in. So a
        handshake that comes in many pieces is walked once and decoded once, not decoded
        again from its start at every piece (a quadratic cost a peer could ask for)."""
        walked, offset = self._walked
        at = start + offset if walked else first
        limits = self.limits
        while walked < count:
            if len(buf) < at + _ENTRY.size:
                self._walked = (walked, at - start)
                raise _NeedData
            op, clen, klen = _ENTRY.unpack_from(buf, at)
            if op not in (0, 1):
                raise RemoteProtocolError(f"subscription op {op} (0 sub, 1 unsub)")
            if clen > limits.max_name_bytes or klen > limits.max_name_bytes:
                raise RemoteProtocolError(f"a channel or key over {limits.max_name_bytes} bytes")
            end = at + _ENTRY.size + clen + klen
            if len(buf) < end:
                self._walked = (walked, at - start)
                raise _NeedData
            walked, at = walked + 1, end

    def _parse(self, buf: bytes | bytearray, pos: int) -> tuple[Frame, int]:
        if pos >= len(buf):
            raise _NeedData
        code = buf[pos]
        pos += 1
        limits = self.limits
        if code == 3:
            if len(buf) < pos - 1 + _MSG.size:
                raise _NeedData
            _, clen, klen, blen, message_id = _MSG.unpack_from(buf, pos - 1)
            if clen > limits.max_name_bytes or klen > limits.max_name_bytes:
                raise RemoteProtocolError(f"a channel or key over {limits.max_name_bytes} bytes")
            if blen > limits.max_body_bytes:
                raise RemoteProtocolError(f"a body of {blen} bytes, over {limits.max_body_bytes}")
            pos += _MSG.size - 1
            end = pos + clen + klen + blen
            if len(buf) < end:
                raise _NeedData
            channel = self._name(bytes(buf[pos : pos + clen]), "channel")
            key = self._name(bytes(buf[pos + clen : pos + clen + klen]), "key") if klen else ""
            body = bytes(buf[pos + clen + klen : end])
            return Message(channel, key, body, message_id), end
        if code == 4:
            if len(buf) < pos + 4:
                raise _NeedData
            return Ack(_U32.unpack_from(buf, pos)[0]), pos + 4
        if code in (0, 1):
            head = 8 + 16 + (1 if code == 1 else 0) + 4
            if len(buf) < pos + head:
                raise _NeedData
            version = _U64.unpack_from(buf, pos)[0]
            instance = uuid.UUID(bytes=bytes(buf[pos + 8 : pos + 24]))
            status = buf[pos + 24] if code == 1 else 0
            count = _U32.unpack_from(buf, pos + head - 4)[0]
            if count > limits.max_subscriptions:
                raise RemoteProtocolError(f"{count} subscriptions in a handshake, over "
                                          f"{limits.max_subscriptions}")  # fmt: skip
            self._walk(buf, pos - 1, pos + head, count)  # (_NeedData until it is all in)
            pos += head
            entries = []
            for _ in range(count):
                entry, pos = _entry(buf, pos, limits)
                entries.append(entry)
            if code == 0:
                return HandshakeRequest(version, instance, tuple(entries)), pos
            return HandshakeResponse(version, instance, status, tuple(entries)), pos
        if code == 2:
            if len(buf) < pos + 1:
                raise _NeedData
            return HandshakeFinal(buf[pos]), pos + 1
        raise RemoteProtocolError(f"unknown message code {code}")
