"""Publisher and offer names: the two grammars of the ``publisher`` String tidewire understands.

The seed leaves the ``publisher`` String to the recipient. A subscription names what it reads::

    publisher = stream [ "?" param *( "&" param ) ]
    stream    = percent-encoded stream name (a literal "?", "&", "%" must be written %3F, %26, %25)
    param     = "from=" ( id | "earliest" | "latest" )   ; default: earliest
              | "from-time=" ms                           ; first event with timestamp >= ms
              | "until=" id                               ; bounded: onComplete after this id
              | "key=" percent-encoded bytes              ; only events with this key
              | "format=" ( "envelope" | "value" | "records" )  ; default: envelope
              | "size=" N                                 ; fixed-size values: N bytes each

``from=`` and ``from-time=`` exclude each other; ``ms`` is 0..2**63-1 (ASCII digits), resolved
to an id once, when the subscription is made (docs/protocols/rsio.md). An ``offer`` (publishing
extension) names where it writes (:class:`OfferName`), and :class:`HubPublisher` the hub's own
publishers (``?streams``, ``?times=``). The element formats themselves are in
:mod:`.envelopes` (envelopes) and :mod:`.runs` (frame runs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import quote, unquote, unquote_to_bytes

from ...model import MAX_ID, InvalidStreamName, TidewireError, validate_stream_name

__all__ = [
    "Format",
    "FromTime",
    "HubPublisher",
    "OfferName",
    "PublisherName",
    "PublisherNameError",
    "start_position",
]

Format = Literal["envelope", "value", "records"]


@dataclass(frozen=True, slots=True)
class FromTime:
    """A start by time (``from-time=ms``): the first event whose timestamp is at least ``ms``
    (milliseconds since the epoch, 0..2**63-1)."""

    ms: int

    def __post_init__(self) -> None:
        if not 0 <= self.ms <= MAX_ID:
            raise ValueError(f"from-time must be 0..2**63-1 ms, not {self.ms}")


class PublisherNameError(TidewireError, ValueError):
    """A publisher name that does not follow the grammar (answered with ``onError``)."""


@dataclass(frozen=True, slots=True)
class PublisherName:
    stream: str
    start: int | Literal["earliest", "latest"] | FromTime = "earliest"
    until: int | None = None
    key: bytes | None = None
    format: Format = "envelope"
    size: int = 0  # > 0: fixed-size mode

    @classmethod
    def parse(cls, text: str) -> PublisherName:
        raw_stream, _, query = text.partition("?")
        try:
            stream = validate_stream_name(_unquote_strict(raw_stream))
        except (InvalidStreamName, UnicodeDecodeError) as exc:
            raise PublisherNameError(f"bad stream in publisher {text!r}: {exc}") from None
        fields: dict[str, str] = {}
        for param in query.split("&") if query else ():
            name, eq, value = param.partition("=")
            if not eq or name in fields:
                raise PublisherNameError(f"bad or repeated parameter {param!r} in {text!r}")
            fields[name] = value
        start: int | Literal["earliest", "latest"] | FromTime = "earliest"
        until = None
        key = None
        fmt: Format = "envelope"
        size = 0
        for name, value in fields.items():
            if name == "from":
                start = value if value in ("earliest", "latest") else _id(value, text)  # type: ignore[assignment]
            elif name == "from-time":
                start = FromTime(_id(value, text))
            elif name == "until":
                until = _id(value, text)
            elif name == "key":
                if _BAD_PERCENT.search(value):
                    raise PublisherNameError(f"a '%' not followed by two hex digits in the key "
                                             f"of {text!r} (write %25)")  # fmt: skip
                key = unquote_to_bytes(value)
            elif name == "format":
                if value not in ("envelope", "value", "records"):
                    raise PublisherNameError(
                        f"format must be envelope, value or records in {text!r}"
                    )
                fmt = value  # type: ignore[assignment]
            elif name == "size":
                size = _id(value, text)
                if size < 1:
                    raise PublisherNameError(f"size must be >= 1 in {text!r}")
            else:
                raise PublisherNameError(f"unknown parameter {name!r} in {text!r}")
        if "from" in fields and "from-time" in fields:
            raise PublisherNameError(f"from= and from-time= exclude each other in {text!r}")
        if size and "format" in fields and fmt != "value":
            raise PublisherNameError(f"size=N needs format=value in {text!r}")
        if size:
            fmt = "value"
        return cls(stream, start, until, key, fmt, size)

    def __str__(self) -> str:
        params = []
        if isinstance(self.start, FromTime):
            params.append(f"from-time={self.start.ms}")
        elif self.start != "earliest":
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


@dataclass(frozen=True, slots=True)
class OfferName:
    """The publisher a client offers with ``offer`` (publishing extension)::

        offer-name = stream [ "?" param *( "&" param ) ]
        param      = "format=" ( "envelope" | "value" | "records" )  ; default envelope
                   | "key=" percent-encoded bytes          ; format=value only: every event's key
                   | "txn=" percent-encoded UTF-8          ; exactly once: see below
                   | "stage=" part                         ; txn= and format=records: a part
                   | "commit"                              ; txn=: commit the named parts
                   | "abort"                               ; txn=: drop the staged parts
        part       = 1*64 ( ALPHA | DIGIT | "." | "_" | "-" )

    With ``envelope`` each element is ``id | timestamp | key | value`` as in subscriptions,
    where id 0 lets the hub assign the next id and timestamp 0 means "the hub's clock"; every
    element of one offer either carries its id or lets the hub assign it. With ``value`` each
    element is a value; ids are assigned, the hub stamps the time.

    Staged transactions (docs/protocols/rsio.md "Staged transactions"): ``stage=`` (only with
    ``txn=`` and ``format=records``, whose elements are log records whose ids are placeholders)
    stores the offer's records as part ``part`` of ``txn``, read by nobody; ``commit`` (with
    ``txn=`` only) takes one element, ``{"parts": [{"part", "count", "fp"}, ...]}``, and
    appends the named parts exactly once; ``abort`` (``txn=`` only, no element) drops them.
    """

    stream: str
    format: Format = "envelope"
    key: bytes | None = None
    txn: str | None = None  # a transaction id: the offer is stored exactly once, atomically
    stage: str | None = None  # a staged part of ``txn`` (format=records)
    action: Literal["commit", "abort"] | None = None  # commit or abort ``txn``'s staged parts

    def __post_init__(self) -> None:
        if (self.stage is not None or self.action is not None) and self.txn is None:
            raise PublisherNameError("stage=, commit and abort need txn=")
        if self.stage is not None and (self.format != "records" or self.action is not None):
            raise PublisherNameError("stage= needs format=records (and no commit or abort)")
        if self.stage is not None and not _PART.fullmatch(self.stage):
            raise PublisherNameError(f"a part is 1..64 of A-Z a-z 0-9 . _ -, not {self.stage!r}")
        if self.format == "records" and self.stage is None:
            raise PublisherNameError("an offer of format=records needs stage=")
        if self.action is not None and (self.format != "envelope" or self.key is not None):
            raise PublisherNameError(f"{self.action} takes no format= or key=")

    @classmethod
    def parse(cls, text: str) -> OfferName:
        raw_stream, _, query = text.partition("?")
        try:
            stream = validate_stream_name(_unquote_strict(raw_stream))
        except (InvalidStreamName, UnicodeDecodeError) as exc:
            raise PublisherNameError(f"bad stream in offer {text!r}: {exc}") from None
        fmt: Format = "envelope"
        key = None
        txn = stage = None
        action: Literal["commit", "abort"] | None = None
        seen: set[str] = set()
        for param in query.split("&") if query else ():
            name, eq, value = param.partition("=")
            if param in ("commit", "abort") and action is None:
                action = param  # type: ignore[assignment]
                continue
            if not eq or name in seen:
                raise PublisherNameError(f"bad or repeated parameter {param!r} in {text!r}")
            seen.add(name)
            if name == "format" and value in ("envelope", "value", "records"):
                fmt = value  # type: ignore[assignment]
            elif name == "key":
                if _BAD_PERCENT.search(value):
                    raise PublisherNameError(f"a '%' not followed by two hex digits in the key "
                                             f"of {text!r} (write %25)")  # fmt: skip
                key = unquote_to_bytes(value)
            elif name == "txn" and value:
                try:
                    txn = unquote(value, errors="strict")
                except UnicodeDecodeError:
                    raise PublisherNameError(f"txn is not UTF-8 in offer {text!r}") from None
            elif name == "stage":
                stage = value
            else:
                raise PublisherNameError(f"bad parameter {param!r} in offer {text!r}")
        if key is not None and fmt != "value":
            raise PublisherNameError(f"key= needs format=value in offer {text!r}")
        try:
            return cls(stream, fmt, key, txn, stage, action)
        except PublisherNameError as exc:
            raise PublisherNameError(f"{exc} in offer {text!r}") from None

    def __str__(self) -> str:
        params = []
        if self.format != "envelope":
            params.append(f"format={self.format}")
        if self.key is not None:
            params.append("key=" + quote(self.key, safe=""))
        if self.txn is not None:
            params.append("txn=" + quote(self.txn, safe=""))
        if self.stage is not None:
            params.append(f"stage={self.stage}")
        if self.action is not None:
            params.append(self.action)
        name = quote(self.stream, safe="")
        return name + ("?" + "&".join(params) if params else "")


@dataclass(frozen=True, slots=True)
class HubPublisher:
    """The hub's own publishers (a publisher String that starts with ``?``)::

        hub-publisher = "?streams" [ "=" name *( "," name ) ]   ; the stream listing
                      | "?times=" pair *( "," pair )             ; ids at times
        name          = percent-encoded stream name (a "," written %2C)
        pair          = percent-encoded ( stream "=" ms )        ; "=" may be written %3D

    ``streams``: the names of ``?streams`` (``None``: every stream); ``times``: the
    ``(stream, ms)`` pairs of ``?times`` (``None`` for ``?streams``).
    """

    streams: tuple[str, ...] | None = None
    times: tuple[tuple[str, int], ...] | None = None

    @classmethod
    def parse(cls, text: str) -> HubPublisher:
        field_name, eq, value = text.removeprefix("?").partition("=")
        try:
            items = [unquote(n, errors="strict") for n in value.split(",")] if eq and value else (
                None)  # fmt: skip
        except UnicodeDecodeError as exc:
            raise PublisherNameError(f"bad name in hub publisher {text!r}: {exc}") from None
        if field_name == "streams":
            return cls(streams=None if items is None else tuple(items))
        if field_name != "times":
            raise PublisherNameError(f"unknown hub publisher {text!r} (try '?streams')")
        if items is None:
            raise PublisherNameError(f"?times needs stream=ms pairs in {text!r}")
        pairs = []
        for item in items:
            stream, eq, ms = item.rpartition("=")
            try:
                pairs.append((validate_stream_name(stream), _id(ms, text)))
            except InvalidStreamName as exc:
                raise PublisherNameError(f"bad stream in {text!r}: {exc}") from None
        return cls(times=tuple(pairs))

    def __str__(self) -> str:
        if self.times is not None:
            return "?times=" + ",".join(quote(f"{s}={ms}", safe="") for s, ms in self.times)
        if self.streams is None:
            return "?streams"
        return "?streams=" + ",".join(quote(n, safe="") for n in self.streams)


def start_position(from_id: int | str | FromTime) -> Any:
    """``from_id`` as :class:`PublisherName`'s ``start`` (an id, "earliest", "latest" or a
    :class:`FromTime`); :class:`ValueError` for anything else."""
    if not isinstance(from_id, int | FromTime) and from_id not in ("earliest", "latest"):
        raise ValueError(f"from_id must be an id, 'earliest', 'latest' or a FromTime, "
                         f"not {from_id!r}")  # fmt: skip
    return from_id


_BAD_PERCENT = re.compile(r"%(?![0-9A-Fa-f]{2})")
_PART = re.compile(r"[A-Za-z0-9._-]{1,64}")


def _unquote_strict(raw: str) -> str:
    """Percent-decoding that refuses a ``%`` not followed by two hex digits (urllib keeps
    those as text) and bytes that are not UTF-8."""
    if _BAD_PERCENT.search(raw):
        raise InvalidStreamName(f"a '%' not followed by two hex digits in {raw!r} (write %25)")
    return unquote(raw, errors="strict")


def _id(value: str, text: str) -> int:
    # ASCII digits only (str.isdigit also takes "²", which int() refuses), and no more of
    # them than an id has: int() refuses more than 4300 digits, leading zeros included
    digits = value.lstrip("0") or "0"
    if not (value.isascii() and value.isdigit()) or len(digits) > 19 or int(digits) > MAX_ID:
        raise PublisherNameError(f"{value!r} is not an id (0..2**63-1) in {text!r}")
    return int(digits)
