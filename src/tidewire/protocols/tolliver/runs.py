"""Tolliver's per-message loops, as runs (issue 22, round 3): the decoder's run of message and
ack frames, the ack frames of many ids, the message frames of a bulk send and of a run of a
batch's values (the hub's delivery).

Each ``*_py`` function is the specification and the pure-Python fallback of a compiled kernel
of the same name in ``tidewire/native/_tolliver.pxi`` (docs/native.md); the public names
(:data:`take_run`, :data:`ack_frames`, :data:`message_frames`, :data:`value_frames`) are the one
:func:`tidewire.native.kernel` chose. tests/native/test_native_tolliver.py feeds both the
same inputs and compares what they return and refuse, byte for byte.

Messages are built as :func:`message_maker` builds them, setting the four slots of a frozen
:class:`~.codec.Message` directly: the dataclass's ``__init__`` goes through
``object.__setattr__`` once a field (a frozen class's way), about 0.5 us a message against
0.27 here (and ~0.05 in the kernel). A decoded message is valid by construction (the codec's
rule), so nothing is skipped that the constructor would check.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...model import LocalProtocolError
from ...native import kernel

if TYPE_CHECKING:  # (codec imports this module: the type is passed in at run time)
    from .codec import Message

__all__ = [
    "MAX_U32",
    "NAMES_CACHED",
    "ack_frames",
    "ack_frames_py",
    "message_frames",
    "message_frames_py",
    "message_maker",
    "take_run",
    "take_run_py",
    "value_frames",
    "value_frames_py",
]

NAMES_CACHED = 256
"""Channel and key names a decoder keeps decoded, at most (the cache is cleared when full)."""

MAX_U32 = 2**32 - 1
_MSG = struct.Struct(">BIIII")  # code 3 and the message header (codec's)
_U32 = struct.Struct(">I")
_ACK = struct.Struct(">BI")

_new = object.__new__


def message_maker(message_type: type[Message]) -> Callable[[str, str, bytes, int], Message]:
    """A function ``(channel, key, body, id) -> message_type(channel, key, body, id)`` (a
    frozen :class:`~.codec.Message`) that sets the four slots directly, without the
    dataclass's ``__init__``: equal to it, field for field; nothing is checked, as there."""
    slots: Any = message_type  # (its attributes are the slots' descriptors)
    set_channel, set_key = slots.channel.__set__, slots.key.__set__
    set_body, set_id = slots.body.__set__, slots.id.__set__

    def make(channel: str, key: str, body: bytes, message_id: int) -> Message:
        message: Message = _new(message_type)
        set_channel(message, channel)
        set_key(message, key)
        set_body(message, body)
        set_id(message, message_id)
        return message

    return make


def cached_name(names: dict[bytes, str], raw: bytes) -> str | None:
    """``raw`` decoded as UTF-8 through the decoder's cache ``names`` (cleared once it holds
    :data:`NAMES_CACHED`, then ``raw`` added); ``None`` if it is not UTF-8 (nothing cached)."""
    name = names.get(raw)
    if name is None:
        try:
            name = raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
        if len(names) >= NAMES_CACHED:
            names.clear()
        names[raw] = name
    return name


def take_run_py(
    buf: bytes | bytearray,
    pos: int,
    max_name: int,
    max_body: int,
    names: dict[bytes, str],
    skip_channel: str,
    messages: list[Message],
    acks: list[int],
    message_type: type[Message],
) -> tuple[int, int]:
    """The whole message and ack frames at ``buf[pos:]``, in one pass: each message (but one on
    ``skip_channel``) appended to ``messages`` as a ``message_type`` (:class:`~.codec.Message`,
    built as :func:`message_maker` does), each ack's id to ``acks``; ``(frames parsed, where
    they end)``. Names are decoded through ``names`` (:func:`cached_name`).

    It stops at the first frame that is not whole, is of another kind, is on
    ``skip_channel``, has a channel or key over ``max_name`` bytes or a body over
    ``max_body``, or a name that is not UTF-8: the caller's frame-by-frame parse takes that
    one (and raises for what breaks the format). Nothing is appended for it."""
    size = len(buf)
    make = message_maker(message_type)
    unpack_message, unpack_id, head = _MSG.unpack_from, _U32.unpack_from, _MSG.size
    last_raw, last_name = b"", ""  # the previous channel (most runs are on one channel)
    count = 0
    while pos < size:
        code = buf[pos]
        if code == 4:
            if pos + 5 > size:
                break
            acks.append(unpack_id(buf, pos + 1)[0])
            pos += 5
            count += 1
            continue
        if code != 3 or pos + head > size:
            break
        _, clen, klen, blen, message_id = unpack_message(buf, pos)
        if clen > max_name or klen > max_name or blen > max_body:
            break
        at = pos + head
        end = at + clen + klen + blen
        if end > size:
            break
        if clen == len(last_raw) and buf.startswith(last_raw, at, at + clen):
            channel = last_name
        else:
            raw = bytes(buf[at : at + clen])
            decoded = cached_name(names, raw) if clen else ""
            if decoded is None:
                break
            channel = last_name = decoded
            last_raw = raw
        if channel == skip_channel:
            break
        key = ""
        if klen:
            decoded = cached_name(names, bytes(buf[at + clen : at + clen + klen]))
            if decoded is None:
                break
            key = decoded
        body = bytes(buf[at + clen + klen : end])
        messages.append(make(channel, key, body, message_id))
        pos = end
        count += 1
    return count, pos


def ack_frames_py(message_ids: Sequence[int]) -> bytes:
    """The ack frames of ``message_ids``, in order (5 bytes each);
    :class:`~tidewire.model.LocalProtocolError` if one is not a u32 (nothing is returned)."""
    try:
        return b"".join([_ACK.pack(4, message_id) for message_id in message_ids])
    except struct.error:
        raise LocalProtocolError("an ack's id is a u32") from None


def message_frames_py(channel: bytes, items: Sequence[tuple[bytes, bytes, int]]) -> list[bytes]:
    """One message frame per ``(key, body, id)`` of ``items`` (key and body ``bytes`` or
    ``bytearray``), on the encoded ``channel`` (codec's ``encode_message`` of each);
    :class:`~tidewire.model.LocalProtocolError` if an id is not an int that fits a u32 or a
    body is longer than a u32 (nothing is returned)."""
    pack, clen, frames = _MSG.pack, len(channel), []
    for key, body, message_id in items:
        if not (isinstance(message_id, int) and 0 <= message_id <= MAX_U32) or (
            len(body) > MAX_U32
        ):
            raise LocalProtocolError("a message's id and body length are u32")
        frames.append(b"".join((pack(3, clen, len(key), len(body), message_id),
                                channel, key, body)))  # fmt: skip
    return frames


def value_frames_py(
    channel: bytes, values: memoryview, offsets: memoryview, first_id: int
) -> list[bytes]:
    """One message frame per value of a batch's value column (``values``, bytes; ``offsets``,
    format ``I``, n + 1 items, value ``i`` at ``offsets[i] - offsets[0]`` to ``offsets[i + 1]
    - offsets[0]``): no key, ids ``first_id`` to ``first_id + n - 1`` (the hub's delivery of
    a run of events). :class:`~tidewire.model.LocalProtocolError` if an id would pass a u32
    (nothing is returned)."""
    n = len(offsets) - 1
    if n > 0 and not (first_id >= 0 and first_id + n - 1 <= MAX_U32):
        raise LocalProtocolError("a message's id and body length are u32")
    pack, clen, frames = _MSG.pack, len(channel), []
    base = offsets[0] if n > 0 else 0
    for i in range(n):
        start, end = offsets[i] - base, offsets[i + 1] - base
        frames.append(b"".join((pack(3, clen, 0, end - start, first_id + i), channel,
                                values[start:end])))  # fmt: skip
    return frames


# The compiled kernels when built and not switched off (tidewire.native), else these.
take_run = kernel("tolliver_take_run", take_run_py)
ack_frames = kernel("tolliver_ack_frames", ack_frames_py)
message_frames = kernel("tolliver_message_frames", message_frames_py)
value_frames = kernel("tolliver_value_frames", value_frames_py)
