"""Publisher names the hub understands, and the element formats it publishes.

The seed leaves the ``publisher`` String to the recipient. tidewire's grammar::

    publisher = stream [ "?" param *( "&" param ) ]
    stream    = percent-encoded stream name (a literal "?", "&", "%" must be written %3F, %26, %25)
    param     = "from=" ( id | "earliest" | "latest" )   ; default: earliest
              | "until=" id                               ; bounded: onComplete after this id
              | "key=" percent-encoded bytes              ; only events with this key
              | "format=" ( "envelope" | "value" )        ; default: envelope
              | "size=" N                                 ; fixed-size values: N bytes each

Element formats:

* ``envelope`` (default): ``id varint | timestamp zigzag-varint (ms) | key | value`` where
  ``key`` is a varint 0 for "no key", else 1 + its length followed by its bytes, and ``value``
  is the rest of the element. A subscriber can resume from the last id it saw.
* ``value``: the value's bytes only.
* ``size=N`` (implies ``format=value``): fixed-size mode: the hub answers
  ``subscribed(elementSize=N)`` and may pack elements with ``onNextPacked``; an event whose value
  is not N bytes ends the subscription with ``onError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, unquote, unquote_to_bytes

from ...model import MAX_ID, Batch, InvalidStreamName, RemoteProtocolError, validate_stream_name
from .wire import NeedData, pull_varint, push_varint

__all__ = ["PublisherName", "decode_envelope", "encode_envelopes"]

Format = Literal["envelope", "value"]


class PublisherNameError(ValueError):
    """A publisher name that does not follow the grammar (answered with ``onError``)."""


@dataclass(frozen=True, slots=True)
class PublisherName:
    stream: str
    start: int | Literal["earliest", "latest"] = "earliest"
    until: int | None = None
    key: bytes | None = None
    format: Format = "envelope"
    size: int = 0  # > 0: fixed-size mode

    @classmethod
    def parse(cls, text: str) -> PublisherName:
        raw_stream, _, query = text.partition("?")
        try:
            stream = validate_stream_name(unquote(raw_stream, errors="strict"))
        except (InvalidStreamName, UnicodeDecodeError) as exc:
            raise PublisherNameError(f"bad stream in publisher {text!r}: {exc}") from None
        fields: dict[str, str] = {}
        for param in query.split("&") if query else ():
            name, eq, value = param.partition("=")
            if not eq or name in fields:
                raise PublisherNameError(f"bad or repeated parameter {param!r} in {text!r}")
            fields[name] = value
        start: int | Literal["earliest", "latest"] = "earliest"
        until = None
        key = None
        fmt: Format = "envelope"
        size = 0
        for name, value in fields.items():
            if name == "from":
                start = value if value in ("earliest", "latest") else _id(value, text)  # type: ignore[assignment]
            elif name == "until":
                until = _id(value, text)
            elif name == "key":
                key = unquote_to_bytes(value)
            elif name == "format":
                if value not in ("envelope", "value"):
                    raise PublisherNameError(f"format must be envelope or value in {text!r}")
                fmt = value  # type: ignore[assignment]
            elif name == "size":
                size = _id(value, text)
                if size < 1:
                    raise PublisherNameError(f"size must be >= 1 in {text!r}")
            else:
                raise PublisherNameError(f"unknown parameter {name!r} in {text!r}")
        if size and "format" in fields and fmt != "value":
            raise PublisherNameError(f"size=N needs format=value in {text!r}")
        if size:
            fmt = "value"
        return cls(stream, start, until, key, fmt, size)

    def __str__(self) -> str:
        params = []
        if self.start != "earliest":
            params.append(f"from={self.start}")
        if self.until is not None:
            params.append(f"until={self.until}")
        if self.key is not None:
            params.append("key=" + quote(self.key, safe=""))
        if self.size:
            params.append(f"size={self.size}")
        elif self.format != "envelope":
            params.append(f"format={self.format}")
        name = quote(self.stream, safe="")
        return name + ("?" + "&".join(params) if params else "")


def _id(value: str, text: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= MAX_ID:
        raise PublisherNameError(f"{value!r} is not an id (0..2**63-1) in {text!r}")
    return int(value)


# --------------------------------------------------------------------------- envelopes


def _zigzag(n: int) -> int:
    return (n << 1) ^ (n >> 63)


def _unzigzag(n: int) -> int:
    return (n >> 1) ^ -(n & 1)


def encode_envelopes(batch: Batch) -> list[bytes]:
    """One envelope element per event of ``batch`` (see the module docstring)."""
    out = []
    for i in range(len(batch)):
        element = bytearray()
        push_varint(element, batch.ids[i])
        push_varint(element, _zigzag(batch.timestamps[i]))
        key = batch.key(i)
        if key is None:
            element.append(0)
        else:
            push_varint(element, len(key) + 1)
            element += key
        element += batch.value(i)
        out.append(bytes(element))
    return out


def decode_envelope(element: bytes) -> tuple[int, int, bytes | None, bytes]:
    """``(id, timestamp, key, value)`` of one envelope element; ``ValueError`` if malformed."""
    try:
        event_id, pos = pull_varint(element, 0)
        ts, pos = pull_varint(element, pos)
        key_len, pos = pull_varint(element, pos)
    except NeedData:
        raise ValueError("envelope cut short") from None
    except RemoteProtocolError as exc:
        raise ValueError(f"bad envelope: {exc}") from None
    key = None
    if key_len:
        end = pos + key_len - 1
        if end > len(element):
            raise ValueError("envelope key runs past the element")
        key, pos = element[pos:end], end
    return event_id, _unzigzag(ts), key, element[pos:]
