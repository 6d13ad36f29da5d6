"""RS.io's one varint: protobuf's unsigned LEB128, at most 10 bytes, values 0..2**64-1.

Seven bits a byte, least significant group first; the high bit of a byte says another follows.
Every RS.io field that is an ``Id``, a ``varint`` or a ``Long`` (and every length) uses it, and
so do the envelope and the HTTP framings built on RS.io. Tube's zig-zag varint of a signed 32-bit
integer is a different encoding and lives in ``protocols/tube``.

``pull_varint`` reads; ``push_varint`` appends to a bytearray; ``varint_bytes`` gives the bytes
(cached for the one-byte values that most ids, lengths and types are).
"""

from __future__ import annotations

from ...model import RemoteProtocolError

__all__ = [
    "MAX_LONG",
    "MAX_VARINT",
    "NeedData",
    "pull_varint",
    "push_varint",
    "varint_bytes",
    "varint_size",
]

MAX_VARINT = 2**64 - 1
MAX_LONG = 2**63 - 1


class NeedData(Exception):
    """The buffer ends before the value does; ``needed`` is a lower bound of the bytes wanted
    from ``buf``'s start (0 when unknown). Not an error: the caller waits for more and retries."""

    def __init__(self, needed: int = 0) -> None:
        super().__init__(needed)
        self.needed = needed


def pull_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """``(value, end)`` of the varint at ``buf[pos:]``. :class:`NeedData` when ``buf`` ends
    first; :class:`RemoteProtocolError` when it is longer than 10 bytes or exceeds 64 bits."""
    if pos < len(buf) and buf[pos] < 0x80:  # one byte: most ids, lengths and types
        return buf[pos], pos + 1
    result = 0
    shift = 0
    end = len(buf)
    for i in range(10):
        if pos + i >= end:
            raise NeedData(pos + i + 1)
        byte = buf[pos + i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            if i == 9 and byte > 1:
                raise RemoteProtocolError("varint exceeds 64 bits")
            return result, pos + i + 1
        shift += 7
    raise RemoteProtocolError("varint longer than 10 bytes")


def push_varint(out: bytearray, value: int) -> None:
    """Append ``value`` (``ValueError`` outside 0..2**64-1: a bug on this side)."""
    if not 0 <= value <= MAX_VARINT:
        raise ValueError(f"varint {value} is outside 0..2**64-1")
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


_SMALL = [bytes((i,)) for i in range(0x80)]


def varint_bytes(value: int) -> bytes:
    """The varint of ``value`` (0..2**64-1, unchecked: the hot paths call it per event)."""
    if value < 0x80:
        return _SMALL[value]
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint_size(value: int) -> int:
    """How many bytes the varint of ``value`` takes."""
    return max(1, (value.bit_length() + 6) // 7)
