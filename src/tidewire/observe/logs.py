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
    "setup_logging",
]

LOG_FORMATS = ("text", "json")


@dataclass(slots=True)
class ConnectionContext:
    """Who a connection is, for its log lines (mutable: the protocol and principal change)."""

    conn: int | None
    protocol: str
    peer: str
    principal: str | None = None

    def prefix(self) -> str:
        conn = "" if self.conn is None else f" #{self.conn}"
        who = "" if self.principal is None else f" {self.principal}"
        return f"[{self.protocol}{conn} {self.peer}{who}] "


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
    """``time LEVEL logger: [protocol #conn peer principal] message``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        context = getattr(record, "connection", None)
        if isinstance(context, ConnectionContext):
            record.message = context.prefix() + record.message
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time`` (UTC, ms), ``level``, ``logger``, ``message``, the
    connection's ``conn``, ``protocol``, ``peer`` and ``principal`` when the line is about
    one, ``exception`` with the traceback when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = time.gmtime(record.created)
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", seconds) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = getattr(record, "connection", None)
        if isinstance(context, ConnectionContext):
            out["conn"] = context.conn
            out["protocol"] = context.protocol
            out["peer"] = context.peer
            if context.principal is not None:
                out["principal"] = context.principal
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
