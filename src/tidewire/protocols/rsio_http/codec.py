"""RS.io over HTTP (seed 002 and shared/seeds/README.md): the parts that are bytes and strings,
with no HTTP library: the query's ``request`` argument, demand, and the two batched bodies.

* ``X-Rsio-LengthPrefixedElements``: ``[length u32 BE][element]...``
* ``X-Rsio-FixedSizeElements``: ``[N u32 BE][element of N bytes]...``

A response without ``Content-Encoding`` is one element, its body as it is.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Sequence

from ...model import Batch, RemoteProtocolError, TidewireError
from ...native import kernel
from ..rsio.envelopes import encode_envelopes, envelopes_to_batch_py

__all__ = [
    "ERROR_HEADER",
    "FIXED_SIZE",
    "LENGTH_PREFIXED",
    "MAX_DEMAND",
    "SEQUENCE_HEADER",
    "BadRequest",
    "count_length_prefixed",
    "count_length_prefixed_py",
    "decode_body",
    "decode_fixed_size",
    "decode_length_prefixed",
    "decode_length_prefixed_py",
    "encode_fixed_size",
    "encode_length_prefixed",
    "length_prefixed_envelopes",
    "length_prefixed_envelopes_batch",
    "length_prefixed_envelopes_batch_py",
    "length_prefixed_envelopes_py",
    "length_prefixed_values",
    "parse_count",
    "split_query",
]

LENGTH_PREFIXED = "X-Rsio-LengthPrefixedElements"
FIXED_SIZE = "X-Rsio-FixedSizeElements"
ERROR_HEADER = "X-Rsio-Error"
# tidewire's own (a **decision**, docs/protocols/rsio-http.md): the sequence number (from 0) on
# this subscription of a response's first element, so that a client drops what it got twice
SEQUENCE_HEADER = "X-Tidewire-Sequence"
MAX_DEMAND = 2**63 - 1  # Reactive Streams: a Long; demand saturates here

_U32 = struct.Struct(">I")
_DIGITS = re.compile(r"[0-9]{1,19}")


class BadRequest(TidewireError, ValueError):
    """A request that does not parse (answered 400)."""


def parse_count(text: str, what: str = "request") -> int:
    """A demand count: decimal digits only, 0 to 2**63-1. The refusal never quotes ``text``
    (a URL's query is where a careless client puts a token; nothing of it is echoed)."""
    if not _DIGITS.fullmatch(text):
        raise BadRequest(f"{what}= is not a count (decimal digits, 0 to 2^63-1)")
    value = int(text)
    if value > MAX_DEMAND:
        raise BadRequest(f"{what}= is over 2^63-1")
    return value


def split_query(raw_query: str) -> tuple[str, int]:
    """``raw_query`` (still percent-encoded) without its ``request`` argument, and that
    argument's value (0 when absent). Every argument must be ``name=value`` (the seed). A
    refusal names no argument's text (see :func:`parse_count`)."""
    kept = []
    demand: int | None = None
    for number, param in enumerate(raw_query.split("&") if raw_query else (), 1):
        name, eq, value = param.partition("=")
        if not eq or not name:
            raise BadRequest(f"query argument {number} is not name=value")
        if name == "request":
            if demand is not None:
                raise BadRequest("request= given twice")
            demand = parse_count(value)
        else:
            kept.append(param)
    return "&".join(kept), demand or 0


def encode_length_prefixed(elements: Sequence[bytes | bytearray | memoryview]) -> bytes:
    parts: list[bytes | bytearray | memoryview] = []
    for element in elements:
        parts.append(_U32.pack(len(element)))
        parts.append(element)
    return b"".join(parts)


def length_prefixed_values(values: memoryview, offsets: memoryview) -> bytes:
    """The length-prefixed body of the values ``values`` cut at ``offsets`` (a batch's value
    columns: ``n + 1`` offsets, possibly starting above 0), without one object per value."""
    base = offsets[0]
    bounds = offsets.tolist()
    pack = _U32.pack
    parts: list[bytes | memoryview] = []
    append = parts.append
    start = bounds[0]
    for end in bounds[1:]:
        append(pack(end - start))
        append(values[start - base : end - base])
        start = end
    return b"".join(parts)


def length_prefixed_envelopes_py(batch: Batch) -> bytes:
    """The length-prefixed body of ``batch``'s envelopes (``encode_envelopes``' elements), the
    default format's response body, in one call per batch."""
    return encode_length_prefixed(encode_envelopes(batch))


def encode_fixed_size(size: int, packed: bytes | bytearray | memoryview) -> bytes:
    """``packed``: whole elements of ``size`` bytes each, back to back."""
    if size < 1 or len(packed) % size:
        raise ValueError(f"{len(packed)} bytes are not whole elements of {size}")
    return _U32.pack(size) + bytes(packed)


def decode_length_prefixed_py(body: bytes | bytearray, max_elements: int = 2**32) -> list[bytes]:
    """The elements of a length-prefixed body, one ``bytes`` each; ``RemoteProtocolError``
    for a body cut inside a length or an element, or with more than ``max_elements``."""
    view = memoryview(body)
    out: list[bytes] = []
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < 4:
            raise RemoteProtocolError("a length-prefixed body cut inside a length")
        (size,) = _U32.unpack_from(body, pos)
        pos += 4
        if end - pos < size:
            raise RemoteProtocolError(f"a length-prefixed element of {size} bytes cut short")
        out.append(bytes(view[pos : pos + size]))
        pos += size
        if len(out) > max_elements:
            raise RemoteProtocolError(f"more than {max_elements} elements in one body")
    return out


def count_length_prefixed_py(body: bytes | bytearray, max_elements: int = 2**32) -> int:
    """How many elements a length-prefixed body holds: ``len(decode_length_prefixed_py(body,
    max_elements))``, with its errors, without copying an element (the client counts a
    response before it asks for the next one, and decodes it after)."""
    pos, end, count = 0, len(body), 0
    while pos < end:
        if end - pos < 4:
            raise RemoteProtocolError("a length-prefixed body cut inside a length")
        (size,) = _U32.unpack_from(body, pos)
        pos += 4
        if end - pos < size:
            raise RemoteProtocolError(f"a length-prefixed element of {size} bytes cut short")
        pos += size
        count += 1
        if count > max_elements:
            raise RemoteProtocolError(f"more than {max_elements} elements in one body")
    return count


def length_prefixed_envelopes_batch_py(stream: str, body: bytes | bytearray,
                                       skip: int = 0) -> Batch:  # fmt: skip
    """The batch of the envelopes in a length-prefixed body (the default format's response),
    without its first ``skip`` elements (received before: a resend): the body split as
    :func:`decode_length_prefixed_py` splits it (its errors first), then
    ``envelopes_to_batch`` (its errors: ``ValueError`` when no envelope is left). The
    compiled twin parses the body in place and copies each value once."""
    if skip < 0:
        raise ValueError("skip is never negative")
    return envelopes_to_batch_py(stream, decode_length_prefixed_py(body)[skip:])


def decode_fixed_size(body: bytes | bytearray) -> tuple[int, memoryview]:
    """``(N, packed)``: the element size and the elements back to back."""
    if len(body) < 4:
        raise RemoteProtocolError("a fixed-size body without its size")
    (size,) = _U32.unpack_from(body, 0)
    packed = memoryview(body)[4:]
    if size == 0 or len(packed) % size:
        raise RemoteProtocolError(f"{len(packed)} bytes are not whole elements of {size}")
    return size, packed


def decode_body(content_encoding: str | None, body: bytes | bytearray) -> list[bytes]:
    """The elements of a 200 response (one, when it has no ``Content-Encoding``)."""
    if not content_encoding:
        return [bytes(body)]  # (the same object when it is bytes)
    if content_encoding.lower() == LENGTH_PREFIXED.lower():
        return decode_length_prefixed(body)
    if content_encoding.lower() == FIXED_SIZE.lower():
        size, packed = decode_fixed_size(body)
        return [bytes(packed[i : i + size]) for i in range(0, len(packed), size)]
    raise RemoteProtocolError(f"unknown Content-Encoding {content_encoding!r}")


# The compiled kernel when it is built and not switched off (tidewire.native), else the pure
# function above, its specification.
length_prefixed_envelopes = kernel("length_prefixed_envelopes", length_prefixed_envelopes_py)
decode_length_prefixed = kernel("decode_length_prefixed", decode_length_prefixed_py)
count_length_prefixed = kernel("count_length_prefixed", count_length_prefixed_py)
length_prefixed_envelopes_batch = kernel("length_prefixed_envelopes_batch",
                                         length_prefixed_envelopes_batch_py)  # fmt: skip
