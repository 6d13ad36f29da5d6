"""RS.io frames: ``encode`` and an incremental, bounded :class:`Decoder`.

A frame is the message type as a varint, then the message's fields in the order the seed lists
them, as protobuf wire primitives with no field tags and no frame length (see :mod:`.wire` and
docs/protocols/rsio.md)::

    0  clientHello   version varint | extensions List[Id]
    1  serverHello   version varint | extensions List[Id]
    2  goodbye       reason String
    3  subscribe     publisher String | subscriber Id | initialDemand Long
    4  request       subscriber Id | demand Long
    5  cancel        subscriber Id
    6  subscribed    subscriber Id | elementSize varint
    7  onNext        subscriber Id | element bytes   (fixed-size mode: exactly elementSize bytes,
                                                       no length prefix)
    8  onNextPacked  subscriber Id | count varint | count x elementSize bytes (fixed-size only)
    9  onComplete    subscriber Id
    10 onError       subscriber Id | error String
    extension 1 (publishing), decoded only once both hellos list it:
    64 offer         offer Id | publisher String
    65 committed     offer Id | count Long | firstId Long | lastId Long
    66 offerEnded    offer Id | error String
    extension 2 (authentication), decoded only once both hellos list it:
    67 authenticate  token String
    68 authenticated principal String

Frames carry no length, so the decoder must know each subscription's element size to find where
an ``onNext`` ends: it asks ``element_size(subscriber)`` (the connection knows it from the
``subscribed`` it received). A frame cut short is retried only once enough bytes have arrived
for the field that was missing, so feeding a frame byte by byte stays linear.

**Checks at the header.** An element frame (``onNext``, ``onNextPacked``) is judged as soon as
its type and subscriber id are parsed, before its body is waited for: the decoder asks
``refuse_elements(subscriber, type)`` (the connection: is there a subscription of ours that may
receive elements on this id?) and a reason is a breach at once, so a peer cannot make us buffer
the body of a frame that is refused anyway. A declared length over the limits is refused as
soon as it is parsed, too; what a frame has declared and not yet delivered is
:attr:`Decoder.awaiting`, so the adapter can charge it to its memory budget before the bytes
come.

The bytes wait in the shared :class:`~tidewire.protocols.buffer.ReceiveBuffer` (the machine
contract's one receive buffer): frames are parsed in place from its ``view()`` and consumed
with ``advance_to``, a lone chunk is parsed as it came (no copy), and the parsed prefix is
dropped by the buffer's own compaction. Its limit is :attr:`Limits.max_buffered_bytes`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...model import LocalProtocolError, RemoteProtocolError
from ..buffer import BufferFull, ReceiveBuffer
from .messages import (
    Authenticate,
    Authenticated,
    Cancel,
    ClientHello,
    Committed,
    Goodbye,
    Message,
    MessageType,
    Offer,
    OfferEnded,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
)
from .runs import RunDecoder
from .varint import NeedData, pull_varint, push_varint
from .wire import (
    InvalidUtf8,
    pull_bytes,
    pull_id_list,
    pull_long,
    pull_string,
    push_bytes,
    push_id_list,
    push_string,
)

__all__ = [
    "Decoded",
    "Decoder",
    "Limits",
    "OfferProtocolError",
    "OnNextDecoded",
    "OnNextRun",
    "RunDecoder",
    "SubscriptionProtocolError",
    "encode",
]


_MAX_VARINT_BYTES = 10
_MAX_FRAME_HEAD_BYTES = 4 * _MAX_VARINT_BYTES  # type, then at most three varints before a body


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what a peer may make us buffer; breaking one is a connection-level breach.

    ``max_read_ahead_bytes`` is the most one ``receive_data`` call hands over (the adapter's
    read size: 256 KiB over TCP, a whole Tube message over Tube, whose default limit is this
    default); with the largest frame the other bounds allow it makes
    :attr:`max_buffered_bytes`."""

    max_string_bytes: int = 64 * 1024
    max_element_bytes: int = 16 * 1024 * 1024
    max_packed_bytes: int = 16 * 1024 * 1024
    max_extensions: int = 256
    max_read_ahead_bytes: int = 128 * 1024 * 1024

    @property
    def max_buffered_bytes(self) -> int:
        """The receive buffer's limit: an adapter that decodes everything after each
        ``receive_data`` holds at most a partial frame (never longer than the largest frame
        these bounds allow, as each frame is refused once its header shows it too long) plus
        the next read. More unparsed bytes than this is the peer's breach."""
        largest = max(
            self.max_element_bytes,
            self.max_packed_bytes,
            self.max_string_bytes,
            self.max_extensions * _MAX_VARINT_BYTES,
        )
        return largest + _MAX_FRAME_HEAD_BYTES + self.max_read_ahead_bytes


class SubscriptionProtocolError(RemoteProtocolError):
    """A well-delimited frame that breaks the protocol for one subscription only (answered with
    ``onError`` for that subscriber; the connection carries on)."""

    def __init__(self, subscriber: int, reason: str) -> None:
        super().__init__(reason)
        self.subscriber = subscriber


@dataclass(frozen=True, slots=True)
class OnNextRun:
    """Consecutive variable-size ``onNext`` frames for one subscriber, decoded in one go (a
    decoder made with ``runs=True``): the hot path of a subscription costs one object per run,
    not one per element. Not a wire message of its own."""

    subscriber: int
    elements: list[bytes]


@dataclass(frozen=True, slots=True)
class OnNextDecoded:
    """``count`` consecutive ``onNext`` frames for one subscriber, turned into ``value`` by the
    subscription's run decoder (``Connection.set_run_decoder``). Not a wire message."""

    subscriber: int
    count: int
    value: object


Decoded = Message | OnNextRun | OnNextDecoded
"""What :meth:`Decoder.next_message` gives: a message, or a run of elements when asked for."""


class OfferProtocolError(SubscriptionProtocolError):
    """A well-delimited ``offer`` that is refused on its own (answered with ``offerEnded``)."""


# --------------------------------------------------------------------------- encoding


def encode(message: Message, element_size: int = 0, out: bytearray | None = None) -> bytearray:
    """Append the frame of ``message`` to ``out`` (a new bytearray by default) and return it.

    ``element_size`` is the subscription's fixed element size for ``OnNext`` and
    ``OnNextPacked`` (0 = variable-size elements).
    """
    out = bytearray() if out is None else out
    match message:
        case OnNext(subscriber, element):
            if element_size and len(element) != element_size:  # check before writing anything
                raise LocalProtocolError(
                    f"a {len(element)}-byte element in a {element_size}-byte fixed-size "
                    "subscription"
                )
            push_varint(out, MessageType.ON_NEXT)
            push_varint(out, subscriber)
            if element_size:
                out += element
            else:
                push_bytes(out, element)
        case OnNextPacked(subscriber, count, elements):
            if not element_size or len(elements) != count * element_size:
                raise LocalProtocolError(
                    "onNextPacked needs fixed-size mode and count x size bytes"
                )
            push_varint(out, MessageType.ON_NEXT_PACKED)
            push_varint(out, subscriber)
            push_varint(out, count)
            out += elements
        case ClientHello(version, extensions) | ServerHello(version, extensions):
            kind = MessageType.CLIENT_HELLO
            if isinstance(message, ServerHello):
                kind = MessageType.SERVER_HELLO
            push_varint(out, kind)
            push_varint(out, version)
            push_id_list(out, extensions)
        case Goodbye(reason):
            push_varint(out, MessageType.GOODBYE)
            push_string(out, reason)
        case Subscribe(publisher, subscriber, initial_demand):
            push_varint(out, MessageType.SUBSCRIBE)
            push_string(out, publisher)
            push_varint(out, subscriber)
            push_varint(out, initial_demand)
        case Request(subscriber, demand):
            push_varint(out, MessageType.REQUEST)
            push_varint(out, subscriber)
            push_varint(out, demand)
        case Cancel(subscriber):
            push_varint(out, MessageType.CANCEL)
            push_varint(out, subscriber)
        case Subscribed(subscriber, size):
            push_varint(out, MessageType.SUBSCRIBED)
            push_varint(out, subscriber)
            push_varint(out, size)
        case OnComplete(subscriber):
            push_varint(out, MessageType.ON_COMPLETE)
            push_varint(out, subscriber)
        case OnError(subscriber, error):
            push_varint(out, MessageType.ON_ERROR)
            push_varint(out, subscriber)
            push_string(out, error)
        case Offer(offer, publisher):
            push_varint(out, MessageType.OFFER)
            push_varint(out, offer)
            push_string(out, publisher)
        case Committed(offer, count, first_id, last_id):
            push_varint(out, MessageType.COMMITTED)
            push_varint(out, offer)
            push_varint(out, count)
            push_varint(out, first_id)
            push_varint(out, last_id)
        case OfferEnded(offer, error):
            push_varint(out, MessageType.OFFER_ENDED)
            push_varint(out, offer)
            push_string(out, error)
        case Authenticate(token):
            push_varint(out, MessageType.AUTHENTICATE)
            push_string(out, token)
        case Authenticated(principal):
            push_varint(out, MessageType.AUTHENTICATED)
            push_string(out, principal)
        case _:  # pragma: no cover - the union is exhaustive
            raise LocalProtocolError(f"not an RS.io message: {message!r}")
    return out


# --------------------------------------------------------------------------- decoding

Buffer = bytes | bytearray  # the receive buffer's store, read in place

_VIEW_BYTES = 4096  # (wire.pull_bytes's threshold: below it a second copy costs less than a view)


def _copy(buf: Buffer, pos: int, end: int) -> bytes:
    """``bytes(buf[pos:end])`` in one copy: a bytearray's slice is a copy of its own, so a big
    body is copied once through a view (as ``pull_bytes`` does), not twice."""
    if end - pos > _VIEW_BYTES and isinstance(buf, bytearray):
        return bytes(memoryview(buf)[pos:end])
    return bytes(buf[pos:end])


class Decoder:
    """Bytes in (:meth:`feed`), messages out (:meth:`next_message`), bounded by :class:`Limits`.

    :meth:`next_message` returns ``None`` when it needs more bytes; it raises
    :class:`SubscriptionProtocolError` (frame consumed, connection fine) or
    :class:`RemoteProtocolError` (connection-level breach: the decoder is then dead).
    :meth:`feed` raises :class:`~tidewire.protocols.buffer.BufferFull` (a breach too) when more
    than ``limits.max_buffered_bytes`` would wait undecoded.
    """

    def __init__(
        self,
        limits: Limits | None = None,
        element_size: Callable[[int], int] | None = None,
        *,
        publishing: bool = False,
        auth: bool = False,
        runs: bool = False,
        run_decoder: Callable[[int], tuple[RunDecoder, int] | None] | None = None,
        refuse_elements: Callable[[int, str], str | None] | None = None,
    ) -> None:
        """``refuse_elements(subscriber, type_name)``: called at the header of each element
        frame; a reason (not ``None``) makes the frame a connection-level breach there."""
        self.limits = limits or Limits()
        self.element_size = element_size or (lambda subscriber: 0)
        self._buf = ReceiveBuffer(self.limits.max_buffered_bytes)
        self._need = 0  # do not retry the current frame before this many bytes are buffered
        self._dead: RemoteProtocolError | None = None
        self.publishing = publishing  # extension 1 negotiated: decode types 64-66
        self.auth = auth  # extension 2 negotiated: decode types 67-68
        self.runs = runs  # coalesce consecutive variable-size onNext frames into an OnNextRun
        # subscriber -> (its run decoder, how many elements it may take), or None
        self.run_decoder = run_decoder
        self.refuse_elements = refuse_elements
        self.decoded = 0
        """Frames decoded (or consumed as refused) so far: grows whenever the peer makes
        progress, which an adapter's unfinished-message deadline watches."""

    @property
    def buffered(self) -> int:
        """Bytes received and not yet decoded."""
        return self._buf.buffered

    @property
    def awaiting(self) -> int:
        """Bytes the frame begun in the buffer needs and that have not arrived: its declared
        body (or the next field) beyond what is buffered; 0 when nothing is awaited."""
        return max(0, self._need - self._buf.buffered)

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._dead is not None:
            raise self._dead
        try:
            self._buf.append(data)
        except BufferFull as exc:
            self._dead = exc
            raise

    def next_message(self) -> Decoded | None:
        if self._dead is not None:
            raise self._dead
        buf = self._buf
        buffered = buf.buffered
        if not buffered or buffered < self._need:  # (chunks waiting are not even joined)
            return None
        data, pos = buf.view()
        try:
            message, end = self._parse(data, pos)
        except NeedData as need:
            self._need = need.needed - pos  # (from the frame's start, which stays put)
            return None
        except _Consumed as consumed:
            buf.advance_to(consumed.end)
            self._need = 0
            self.decoded += 1
            raise consumed.error from None
        except RemoteProtocolError as exc:
            self._dead = exc
            raise
        buf.advance_to(end)
        self._need = 0
        self.decoded += 1
        return message

    def _parse(self, buf: Buffer, pos: int) -> tuple[Decoded, int]:
        limits = self.limits
        start = pos
        kind, pos = pull_varint(buf, pos)
        if kind == MessageType.ON_NEXT:
            subscriber, pos = pull_varint(buf, pos)
            self._check_elements(subscriber, "onNext")
            head_end = pos
            size = self.element_size(subscriber)
            if size:
                if size > limits.max_element_bytes:
                    raise RemoteProtocolError(f"element size {size} exceeds the limit")
                end = pos + size
                if end > len(buf):
                    raise NeedData(end)
                return OnNext(subscriber, _copy(buf, pos, end)), end
            if self.run_decoder is not None and (found := self.run_decoder(subscriber)):
                decode, max_count = found
                prefix = bytes(buf[start:head_end])
                value, count = decode(self._buf, prefix, max_count, limits.max_element_bytes)
                if count:  # (the run decoder advanced the buffer past its frames)
                    return OnNextDecoded(subscriber, count, value), self._buf.pos
            element, pos = pull_bytes(buf, pos, limits.max_element_bytes)
            if self.runs:
                return self._run(buf, pos, subscriber, bytes(buf[start:head_end]), element)
            return OnNext(subscriber, element), pos
        if kind == MessageType.ON_NEXT_PACKED:
            subscriber, pos = pull_varint(buf, pos)
            self._check_elements(subscriber, "onNextPacked")
            count, pos = pull_varint(buf, pos)
            size = self.element_size(subscriber)
            if not size:
                raise RemoteProtocolError(
                    f"onNextPacked for subscriber {subscriber}, which is not in fixed-size mode"
                )
            if count < 1:
                raise RemoteProtocolError("onNextPacked with a count of 0")
            total = count * size
            if total > limits.max_packed_bytes:
                raise RemoteProtocolError(f"onNextPacked of {total} bytes exceeds the limit")
            end = pos + total
            if end > len(buf):
                raise NeedData(end)
            return OnNextPacked(subscriber, count, _copy(buf, pos, end)), end
        if kind == MessageType.REQUEST:
            subscriber, pos = pull_varint(buf, pos)
            demand, pos = pull_long(buf, pos)
            return Request(subscriber, demand), pos
        if kind in (MessageType.CLIENT_HELLO, MessageType.SERVER_HELLO):
            version, pos = pull_varint(buf, pos)
            extensions, pos = pull_id_list(buf, pos, limits.max_extensions)
            cls = ClientHello if kind == MessageType.CLIENT_HELLO else ServerHello
            return cls(version, extensions), pos
        if kind == MessageType.GOODBYE:
            reason, pos = pull_string(buf, pos, limits.max_string_bytes)
            return Goodbye(reason), pos
        if kind == MessageType.SUBSCRIBE:
            try:
                publisher, pos = pull_string(buf, pos, limits.max_string_bytes)
                bad = None
            except InvalidUtf8 as exc:
                publisher, pos, bad = "", exc.end, str(exc)
            subscriber, pos = pull_varint(buf, pos)
            demand, pos = pull_long(buf, pos)
            if bad is not None:
                raise _Consumed(SubscriptionProtocolError(subscriber, bad), pos)
            return Subscribe(publisher, subscriber, demand), pos
        if kind == MessageType.CANCEL:
            subscriber, pos = pull_varint(buf, pos)
            return Cancel(subscriber), pos
        if kind == MessageType.SUBSCRIBED:
            subscriber, pos = pull_varint(buf, pos)
            size, pos = pull_varint(buf, pos)
            return Subscribed(subscriber, size), pos
        if kind == MessageType.ON_COMPLETE:
            subscriber, pos = pull_varint(buf, pos)
            return OnComplete(subscriber), pos
        if kind == MessageType.ON_ERROR:
            subscriber, pos = pull_varint(buf, pos)
            error, pos = pull_string(buf, pos, limits.max_string_bytes)
            return OnError(subscriber, error), pos
        if self.publishing and MessageType.OFFER <= kind <= MessageType.OFFER_ENDED:
            return self._parse_publishing(kind, buf, pos)
        if self.auth and kind in (MessageType.AUTHENTICATE, MessageType.AUTHENTICATED):
            text, pos = pull_string(buf, pos, limits.max_string_bytes)
            if kind == MessageType.AUTHENTICATE:
                return Authenticate(text), pos
            return Authenticated(text), pos
        raise RemoteProtocolError(f"unknown message type {kind}")

    def _check_elements(self, subscriber: int, name: str) -> None:
        """The header check of an element frame (before its body is waited for)."""
        if self.refuse_elements is not None:
            reason = self.refuse_elements(subscriber, name)
            if reason is not None:
                raise RemoteProtocolError(reason)

    def _run(
        self, buf: Buffer, pos: int, subscriber: int, prefix: bytes, first: bytes
    ) -> tuple[OnNextRun, int]:
        """``first`` and the complete onNext frames after it that start with the same bytes
        (type and subscriber) as its own frame, ``prefix``."""
        elements = [first]
        append = elements.append
        hlen = len(prefix)
        limit = self.limits.max_element_bytes
        end_buf = len(buf)
        while buf[pos : pos + hlen] == prefix:
            p = pos + hlen
            if p >= end_buf:
                break
            size = buf[p]
            if size < 0x80:
                p += 1
            else:
                try:
                    size, p = pull_varint(buf, p)
                except NeedData:
                    break
                if size > limit:
                    break  # let the next call report it as one frame
            end = p + size
            if end > end_buf:
                break
            append(_copy(buf, p, end))
            pos = end
        return OnNextRun(subscriber, elements), pos

    def _parse_publishing(self, kind: int, buf: Buffer, pos: int) -> tuple[Message, int]:
        offer, pos = pull_varint(buf, pos)
        if kind == MessageType.COMMITTED:
            count, pos = pull_long(buf, pos)
            first_id, pos = pull_long(buf, pos)
            last_id, pos = pull_long(buf, pos)
            try:
                return Committed(offer, count, first_id, last_id), pos
            except LocalProtocolError as exc:
                raise RemoteProtocolError(str(exc)) from None
        try:
            text, pos = pull_string(buf, pos, self.limits.max_string_bytes)
        except InvalidUtf8 as exc:
            if kind != MessageType.OFFER:
                raise
            raise _Consumed(OfferProtocolError(offer, str(exc)), exc.end) from None
        if kind == MessageType.OFFER:
            return Offer(offer, text), pos
        return OfferEnded(offer, text), pos


class _Consumed(Exception):
    def __init__(self, error: SubscriptionProtocolError, end: int) -> None:
        super().__init__(error)
        self.error = error
        self.end = end
