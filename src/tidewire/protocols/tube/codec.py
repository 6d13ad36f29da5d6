"""Tube's bytes (seed 001 and shared/seeds/README.md). Tube runs over WebSocket: each item below
is the payload of one binary WebSocket message::

    fragment-size request   zigzag varint (Avro "long"), 1-5 bytes; 0 = "do not split"
    first message           header byte | [count varint] | first fragment
    further fragment        the fragment's bytes
    control message         the byte ``code << 3`` alone (codes 8-31)

    header byte             code (5 bits, high) << 3 | count (3 bits, low); count 0 means the
                            count follows as a zigzag varint (so 1 to 2**31-1 fragments)
    data codes              0 plain, 1 deflate (zlib format), 2-7 reserved compressions
    control codes           9-15 "compression id code-8 is not supported", 16 ping, 17 pong

Varints are the zig-zag varint of Avro: ``(n << 1) ^ (n >> 63)`` as 7-bit groups, least
significant first, high bit set on every byte but the last.
"""

from __future__ import annotations

from ...model import RemoteProtocolError

__all__ = [
    "CODE_DEFLATE",
    "CODE_PING",
    "CODE_PLAIN",
    "CODE_PONG",
    "MAX_FRAGMENTS",
    "encode_header",
    "pull_varint",
    "push_varint",
    "split_header",
]

CODE_PLAIN = 0
CODE_DEFLATE = 1
CODE_PING = 16
CODE_PONG = 17
MAX_FRAGMENTS = 2**31 - 1
_MAX_VARINT_BYTES = 5  # the seed: "1-5 bytes" (a signed 32-bit value)


def push_varint(n: int) -> bytes:
    """``n`` (a signed 32-bit integer) as an Avro zig-zag varint."""
    if not -(2**31) <= n < 2**31:
        raise ValueError(f"{n} is not a 32-bit signed integer")
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def pull_varint(data: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it; :class:`RemoteProtocolError` if it is
    cut short or longer than 5 bytes."""
    z = shift = 0
    for i in range(_MAX_VARINT_BYTES):
        if pos + i >= len(data):
            raise RemoteProtocolError("a varint cut short")
        byte = data[pos + i]
        z |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            n = (z >> 1) ^ -(z & 1)
            if not -(2**31) <= n < 2**31:
                raise RemoteProtocolError(f"a varint beyond 32 bits ({n})")
            return n, pos + i + 1
    raise RemoteProtocolError("a varint longer than 5 bytes")


def encode_header(code: int, count: int) -> bytes:
    """The header of a message with ``count`` fragments (or a control message: count 0 and
    nothing after the byte)."""
    if not 0 <= code <= 31:
        raise ValueError(f"code {code} is not 5 bits")
    if code >= 8:  # control: the byte alone (README)
        return bytes([code << 3])
    if not 1 <= count <= MAX_FRAGMENTS:
        raise ValueError(f"{count} fragments (1 to 2**31-1)")
    if count <= 7:
        return bytes([code << 3 | count])
    return bytes([code << 3]) + push_varint(count)


def split_header(data: bytes | bytearray | memoryview) -> tuple[int, int, int]:
    """``(code, count, offset of the first fragment)`` of a WebSocket message that starts a
    Tube message (count 0 for a control message)."""
    if not data:
        raise RemoteProtocolError("an empty WebSocket message where a Tube header was due")
    code, count = data[0] >> 3, data[0] & 7
    if code >= 8:
        if count:
            raise RemoteProtocolError(f"control code {code} with a count of {count}")
        return code, 0, 1
    if count:
        return code, count, 1
    count, pos = pull_varint(data, 1)
    if count < 1:  # (a small count in the varint is accepted: the seed does not forbid it)
        raise RemoteProtocolError(f"a fragment count of {count}")
    return code, count, pos
