"""Log lines: readable text by default, one JSON object per line when configured
(``log_format = "json"``), and on every line about a connection its id, protocol and peer.

A connection's context (:class:`ConnectionContext`) is made by the guard when it accepts the
socket (its ``serial`` is the connection id, also in the admin API and the metrics' labels);
each protocol adapter logs through a :class:`ConnectionLog` on that context, so the id, the
protocol (``http`` becomes ``tube`` on upgrade) and, once known, the principal are on each of
its lines without being repeated in every message. In text::

    2026-11-21 19:03:11,120 WARNING tidewire.rsio [rsio #17 127.0.0.1:50312] closing: ...

and in JSON (keys ``conn``, ``protocol``, ``peer``, ``principal`` only on connection lines)::

    {"time": "2026-11-21T19:03:11.120Z", "level": "WARNING", "logger": "tidewire.rsio",
     "message": "closing: ...", "conn": 17, "protocol": "rsio", "peer": "127.0.0.1:50312"}

The standard library's :mod:`logging` carries it all (an adapter and two formatters): no
logging library is needed for this.

**Hygiene.** Messages and connection contexts carry what peers sent (a claimed token name, a
stream name, a reason): both formatters pass the message and each context field through
:func:`escape`, once, here, so no peer string can end a line, forge another, or drive the
terminal (ANSI ``ESC [`` sequences, bidi overrides). Every non-printable character (C0 and
C1 controls, DEL, line and paragraph separators, format characters such as the bidi controls
and zero-width ones, lone surrogates) becomes a Python-style escape (``\n``, ``\x1b``,
``\u202e``); backslashes are left as they are (an escape in a line is thus either the
formatter's or the peer's literal text, never a real control character). Tracebacks keep their
line breaks (they are the hub's, in text lines; one JSON string in JSON lines).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any, TextIO

__all__ = [
    "ConnectionContext",
    "ConnectionLog",
    "JsonFormatter",
    "TextFormatter",
    "connection_log",
    "escape",
    "setup_logging",
]

LOG_FORMATS = ("text", "json")

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(ch: str) -> str:
    if ch.isprintable():
        return ch
    code = ord(ch)
    if ch in _SHORT:
        return _SHORT[ch]
    if code <= 0xFF:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def escape(text: str) -> str:
    """``text`` with every non-printable character (:meth:`str.isprintable`: controls, DEL,
    line/paragraph separators, format characters, surrogates; a space stays) written as a
    Python-style escape, so it fits on one log line and cannot drive a terminal."""
    if text.isprintable():  # (the common case: one pass in C)
        return text
    return "".join(_escaped(ch) for ch in text)


@dataclass(slots=True)
class ConnectionContext:
    """Who a connection is, for its log lines (mutable: the protocol and principal change)."""

    conn: int | None
    protocol: str
    peer: str
    principal: str | None = None

    def prefix(self) -> str:
        """``[protocol #conn peer principal] `` (escaped: the principal may be a peer's)."""
        conn = "" if self.conn is None else f" #{self.conn}"
        who = "" if self.principal is None else f" {escape(self.principal)}"
        return f"[{escape(self.protocol)}{conn} {escape(self.peer)}{who}] "


class ConnectionLog(logging.LoggerAdapter[logging.Logger]):
    """``logger``'s lines, each carrying ``context`` (as the record's ``connection``)."""

    def __init__(self, logger: logging.Logger, context: ConnectionContext) -> None:
        super().__init__(logger, {})
        self.context = context

    def process(
        self, msg: Any, kwargs: MutableMapping[str, Any]
    ) -> tuple[Any, MutableMapping[str, Any]]:
        extra = kwargs.get("extra")
        kwargs["extra"] = {**extra, "connection": self.context} if extra else {
            "connection": self.context}  # fmt: skip
        return msg, kwargs


def _peer(transport: Any) -> str:
    peername = transport.get_extra_info("peername") if transport is not None else None
    if isinstance(peername, tuple) and len(peername) >= 2:
        host = str(peername[0])
        return f"[{host}]:{peername[1]}" if ":" in host else f"{host}:{peername[1]}"
    return "?" if peername is None else str(peername)


def connection_log(logger: logging.Logger, transport: Any, protocol: str) -> ConnectionLog:
    """A log for the connection of ``transport``: on the guard's context when the guard
    carries it (the protocol is set to ``protocol``), else on a context of its own (a
    connection made without the guard, as some tests do)."""
    guard = transport.get_extra_info("guard") if transport is not None else None
    context = getattr(guard, "context", None)
    if isinstance(context, ConnectionContext):
        context.protocol = protocol
    else:
        context = ConnectionContext(None, protocol, _peer(transport))
    return ConnectionLog(logger, context)


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: [protocol #conn peer principal] message``, the message and the
    context escaped (:func:`escape`); a traceback follows on its own lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = escape(record.message)
        context = getattr(record, "connection", None)
        if isinstance(context, ConnectionContext):
            record.message = context.prefix() + record.message
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ms), ``level``, ``logger``, ``message``, the
    connection's ``conn``, ``protocol``, ``peer`` and ``principal`` when the line is about
    one, ``exception`` with the traceback when there is one. The message and the context's
    strings are escaped (:func:`escape`) as in text lines, so both formats show the same
    text and a JSON consumer printing a field cannot be driven by a peer either."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.gmtime(record.created)
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": escape(record.getMessage()),
        }
        context = getattr(record, "connection", None)
        if isinstance(context, ConnectionContext):
            out["conn"] = context.conn
            out["protocol"] = escape(context.protocol)
            out["peer"] = escape(context.peer)
            if context.principal is not None:
                out["principal"] = escape(context.principal)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)


def setup_logging(level: str = "info", log_format: str = "text",
                  stream: TextIO | None = None) -> None:  # fmt: skip
    """Configure the root logger: ``level``, ``text`` or ``json`` lines, to ``stream``
    (stderr). Replaces the handlers installed by an earlier call."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"log_format: {log_format!r} is not one of {', '.join(LOG_FORMATS)}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.set_name("tidewire")
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == "tidewire"]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
