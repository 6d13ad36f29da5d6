"""Log lines (issue 10): the text and JSON formats, and on every line about a connection its id
(the admin API's), protocol and peer, whichever protocol it speaks.

* the formatters on their own: one JSON object per line (``time``, ``level``, ``logger``,
  ``message``; ``conn``, ``protocol``, ``peer``, ``principal`` on connection lines); text lines
  with ``[protocol #id peer principal]`` before the message;
* ``setup_logging`` to a stream, and ``tidewire serve --set log_format=json`` (a real process)
  writing JSON lines to stderr; a bad ``log_format`` is a configuration error;
* end to end, over real sockets: a warning provoked on each protocol (bad bytes, a refused
  token, a 401, a 400, a 413) carries the connection's context, whose ``conn`` is the id that
  ``/api/connections`` showed for that socket.

The hub with every listener comes from tests/stacks.py (:func:`stack`).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import re
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from click.testing import CliRunner

from loops import Run
from serveproc import read_until, server
from stacks import HOST, Stack, eventually, local_port, read_rsio, stack
from tidewire.cli import main as cli
from tidewire.config import ConfigError, load_config
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch
from tidewire.observe.logs import (
    ConnectionContext,
    ConnectionLog,
    JsonFormatter,
    TextFormatter,
    connection_log,
    setup_logging,
)
from tidewire.protocols.rsio import (
    EXT_AUTH,
    Authenticate,
    ClientHello,
    Decoder,
    ServerHello,
    encode,
)
from tidewire.server.guard import ConnectionLimits

TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
PROM, PROM_TOML = mint_token("prometheus")
TOKENS = Tokens.parse(PROM_TOML)
ACL = Acl.parse('[principal."token:prometheus"]\nmonitor = true\n')


# --------------------------------------------------------------------------- helpers


@pytest.fixture
def restore_root() -> Iterator[None]:
    """``setup_logging`` configures the root logger: put it back as it was."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for handler in list(root.handlers):
            if handler not in handlers:
                root.removeHandler(handler)
        root.setLevel(level)


class Captured:
    """A logger of its own whose lines go to a string, through ``formatter``."""

    def __init__(self, name: str, formatter: logging.Formatter) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(formatter)
        self.logger = logging.getLogger(name)
        self.logger.addHandler(self.handler)
        self.logger.propagate = False
        self.logger.setLevel(logging.DEBUG)

    def lines(self) -> list[str]:
        return self.stream.getvalue().splitlines()

    def close(self) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = True


async def record_of(caplog: pytest.LogCaptureFixture, logger: str, *parts: str,
                    limit: float = 5.0) -> logging.LogRecord:  # fmt: skip
    """The first warning (or worse) of ``logger`` whose message has every one of ``parts``."""
    deadline = time.monotonic() + limit
    while True:
        for record in caplog.records:
            if (record.name == logger and record.levelno >= logging.WARNING
                    and all(p in record.getMessage() for p in parts)):  # fmt: skip
                return record
        seen = [(r.name, r.getMessage()) for r in caplog.records]
        assert time.monotonic() < deadline, f"no {logger} warning with {parts}: {seen}"
        await asyncio.sleep(0.005)


def context_of(record: logging.LogRecord) -> ConnectionContext:
    context = getattr(record, "connection", None)
    assert isinstance(context, ConnectionContext), record.__dict__
    return context


def check_record(record: logging.LogRecord, conn: int, protocol: str, port: int,
                 principal: str | bool | None = False) -> None:  # fmt: skip
    """The record's context, and both formats' rendering of it (``principal``: ``False`` for
    not checked)."""
    context = context_of(record)
    assert context.conn == conn
    assert isinstance(context.conn, int)
    assert context.protocol == protocol
    assert context.peer == f"{HOST}:{port}"
    if principal is not False:
        assert context.principal == principal
    text = TextFormatter().format(record)
    who = f" {context.principal}" if context.principal is not None else ""
    assert f"[{protocol} #{conn} {HOST}:{port}{who}] " in text, text
    payload = json.loads(JsonFormatter().format(record))
    assert (payload["conn"], payload["protocol"], payload["peer"]) == (
        conn, protocol, f"{HOST}:{port}")
    assert payload["logger"] == record.name
    assert payload["level"] == record.levelname
    assert payload["message"] == record.getMessage()


async def http_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: status and body."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return int(status_line.split()[1]), await reader.readexactly(length)


# --------------------------------------------------------------------------- the formatters


def test_json_lines_are_one_object_each() -> None:
    captured = Captured("tidewire.test.json", JsonFormatter())
    try:
        context = ConnectionContext(17, "rsio", "127.0.0.1:50312")
        ConnectionLog(captured.logger, context).warning("closing: %s", "bad\nbytes ü \"q\"")
        context.protocol, context.principal = "tube", "token:alice"
        ConnectionLog(captured.logger, context).info("authenticated", extra={"extra_key": 1})
        captured.logger.error("a line about no connection")
        try:
            raise ValueError("boom")
        except ValueError:
            captured.logger.exception("it failed")
        lines = captured.lines()
        assert len(lines) == 4, lines  # newlines in messages and tracebacks are escaped
        first, second, third, fourth = (json.loads(line) for line in lines)
        assert all(isinstance(x, dict) for x in (first, second, third, fourth))
        assert first == {"time": first["time"], "level": "WARNING",
                         "logger": "tidewire.test.json",
                         "message": "closing: bad\\nbytes ü \"q\"",  # the newline escaped
                         "conn": 17, "protocol": "rsio", "peer": "127.0.0.1:50312"}  # fmt: skip
        assert TIME.match(first["time"]), first["time"]
        assert "ü" in lines[0]  # not escaped (ensure_ascii=False)
        assert second["principal"] == "token:alice"
        assert (second["level"], second["protocol"], second["conn"]) == ("INFO", "tube", 17)
        assert set(third) == {"time", "level", "logger", "message"}  # no connection keys
        assert third["level"] == "ERROR"
        assert fourth["message"] == "it failed"
        assert "ValueError: boom" in fourth["exception"]
        assert "conn" not in fourth
    finally:
        captured.close()


def test_json_time_is_utc_with_milliseconds() -> None:
    record = logging.LogRecord("tidewire.t", logging.INFO, __file__, 1, "m", None, None)
    record.created, record.msecs = 86400.0 * 365 + 0.5, 500.0  # 1971-01-01T00:00:00.500Z
    payload = json.loads(JsonFormatter().format(record))
    assert payload["time"] == "1971-01-01T00:00:00.500Z"


def test_text_lines_carry_the_connection_prefix() -> None:
    captured = Captured("tidewire.test.text", TextFormatter())
    second = logging.StreamHandler(io.StringIO())  # the same record formatted twice
    second.setFormatter(TextFormatter())
    captured.logger.addHandler(second)
    try:
        log = ConnectionLog(captured.logger, ConnectionContext(17, "rsio", "127.0.0.1:50312",
                                                               "anonymous"))  # fmt: skip
        log.warning("closing: %s", "bad bytes")
        ConnectionLog(captured.logger, ConnectionContext(3, "http", "[::1]:8080")).info("x")
        ConnectionLog(captured.logger, ConnectionContext(None, "seguro", "?")).info("y")
        captured.logger.info("plain")
        lines = captured.lines()
        assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} WARNING tidewire\.test\.text: "
                            r"\[rsio #17 127\.0\.0\.1:50312 anonymous\] closing: bad bytes",
                            lines[0]), lines[0]  # fmt: skip
        assert lines[1].endswith("INFO tidewire.test.text: [http #3 [::1]:8080] x")
        assert lines[2].endswith("INFO tidewire.test.text: [seguro ?] y")
        assert lines[3].endswith("INFO tidewire.test.text: plain")
        stream = second.stream
        assert isinstance(stream, io.StringIO)
        assert stream.getvalue().splitlines() == lines  # no prefix twice
    finally:
        captured.logger.removeHandler(second)
        captured.close()


def test_a_connection_log_keeps_the_callers_extra_and_follows_its_context() -> None:
    captured = Captured("tidewire.test.extra", JsonFormatter())
    try:
        context = ConnectionContext(5, "http", "127.0.0.1:1")
        log = ConnectionLog(captured.logger, context)
        log.warning("before")
        context.protocol = "tube"  # an HTTP connection upgraded
        context.principal = "token:bob"
        log.warning("after", extra={"mine": "kept"})
        records = [json.loads(line) for line in captured.lines()]
        assert (records[0]["protocol"], "principal" in records[0]) == ("http", False)
        assert (records[1]["protocol"], records[1]["principal"]) == ("tube", "token:bob")
    finally:
        captured.close()


def test_connection_log_without_a_guard_makes_its_own_context() -> None:
    class Transport:
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return {"peername": ("::1", 4000, 0, 0)}.get(name, default)

    log = connection_log(logging.getLogger("tidewire.t"), Transport(), "rsio")
    assert log.context == ConnectionContext(None, "rsio", "[::1]:4000")
    assert connection_log(logging.getLogger("tidewire.t"), None, "x").context.peer == "?"


def test_setup_logging_json_to_a_stream(restore_root: None) -> None:
    out = io.StringIO()
    setup_logging("debug", "json", stream=out)
    logging.getLogger("tidewire.test.setup").debug("hello %d", 5)
    context = ConnectionContext(9, "seguro", "127.0.0.1:7")
    ConnectionLog(logging.getLogger("tidewire.test.setup"), context).warning("dropped")
    lines = out.getvalue().splitlines()
    parsed = [json.loads(line) for line in lines]
    assert [(p["level"], p["message"]) for p in parsed] == [("DEBUG", "hello 5"),
                                                           ("WARNING", "dropped")]  # fmt: skip
    assert (parsed[1]["conn"], parsed[1]["protocol"], parsed[1]["peer"]) == (
        9, "seguro", "127.0.0.1:7")
    # a second call replaces the first's handler (one handler, the new level and format)
    again = io.StringIO()
    setup_logging("warning", "text", stream=again)
    ours = [h for h in logging.getLogger().handlers if h.get_name() == "tidewire"]
    assert len(ours) == 1
    logging.getLogger("tidewire.test.setup").info("not shown")
    ConnectionLog(logging.getLogger("tidewire.test.setup"), context).error("shown")
    assert out.getvalue().splitlines() == lines  # the old handler is gone
    (line,) = again.getvalue().splitlines()
    assert line.endswith("ERROR tidewire.test.setup: [seguro #9 127.0.0.1:7] shown")
    with pytest.raises(ValueError, match="log_format"):
        setup_logging("info", "xml", stream=io.StringIO())


# --------------------------------------------------------------------------- configuration


def test_a_bad_log_format_is_a_configuration_error(tmp_path: Path) -> None:
    assert load_config(None, {}, environ={}).values["log_format"] == "text"
    assert load_config(None, {"log_format": "json"}, environ={}).values["log_format"] == "json"
    with pytest.raises(ConfigError, match="log_format"):
        load_config(None, {"log_format": "xml"}, environ={})
    with pytest.raises(ConfigError, match="log_format"):
        load_config(None, {}, environ={"TIDEWIRE_LOG_FORMAT": "JSON"})
    config = tmp_path / "tidewire.toml"
    config.write_text('log_format = "yaml"\n')
    with pytest.raises(ConfigError, match="log_format"):
        load_config(str(config), {}, environ={})
    result = CliRunner().invoke(cli, ["serve", "--data-dir", str(tmp_path / "data"),
                                      "--set", "log_format=xml"])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "log_format" in result.output
    assert not (tmp_path / "data").exists()  # refused before anything started


@pytest.mark.timeout(60)
def test_serve_writes_json_lines_to_stderr(tmp_path: Path) -> None:
    with server("--data-dir", str(tmp_path), "--http-port", "0", "--set", "log_format=json",
                "--set", "log_level=info") as proc:  # fmt: skip
        lines = read_until(proc, "ready")
        rsio = next(w for line in lines for w in line.split() if w.startswith("rsio://"))
        host, port = rsio.removeprefix("rsio://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(bytes(encode(ClientHello())) + b"\x0b\x00")  # type 11: unknown
            while sock.recv(65536):  # until the hub closes it
                pass
            local = sock.getsockname()[1]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert proc.stderr is not None
        err = proc.stderr.read()
    records = [json.loads(line) for line in err.splitlines() if line.strip()]  # every line
    assert records, err
    for r in records:
        assert isinstance(r, dict)
        assert {"time", "level", "logger", "message"} <= set(r), r
        assert TIME.match(r["time"]), r
    (closing,) = [r for r in records
                  if r["logger"] == "tidewire.rsio" and "closing" in r["message"]]  # fmt: skip
    assert closing["level"] == "WARNING"
    assert "unknown message type 11" in closing["message"]
    assert closing["protocol"] == "rsio"
    assert isinstance(closing["conn"], int)
    assert closing["peer"] == f"127.0.0.1:{local}"
    assert closing["principal"] == "anonymous"
    assert any("shutting down" in r["message"] for r in records), records


# --------------------------------------------------------------------------- end to end


def test_rsio_connection_lines(tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
                               ) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="tidewire")

    async def hello(s: Stack) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, Decoder]:
        reader, writer = await asyncio.open_connection(HOST, s.rsio.port)
        writer.write(bytes(encode(ClientHello(extensions=(EXT_AUTH,)))))
        decoder = Decoder()
        (hello,) = await read_rsio(reader, decoder, 1)
        assert isinstance(hello, ServerHello)
        return reader, writer, decoder

    async def main() -> None:
        async with stack(tmp_path, access=Access(None, TOKENS)) as s:
            # bad bytes: a protocol error
            reader, writer, _ = await hello(s)
            port = local_port(writer)
            entry = await s.connection(port)
            assert (entry["protocol"], entry["principal"]) == ("rsio", "anonymous")
            writer.write(b"\x0b\x00")  # message type 11: unknown
            record = await record_of(caplog, "tidewire.rsio", "closing",
                                     "unknown message type 11")  # fmt: skip
            check_record(record, entry["id"], "rsio", port, "anonymous")
            writer.close()
            # authenticated: the principal is on the later lines
            reader, writer, _ = await hello(s)
            writer.write(bytes(encode(Authenticate(PROM))))
            port = local_port(writer)
            entry = await eventually(lambda: s.connection(port),
                                     lambda e: e["principal"] == "token:prometheus",
                                     "the connection to be authenticated")  # fmt: skip
            writer.write(b"\x0c\x00")
            record = await record_of(caplog, "tidewire.rsio", "unknown message type 12")
            check_record(record, entry["id"], "rsio", port, "token:prometheus")
            writer.close()
            # a refused token
            reader, writer, _ = await hello(s)
            port = local_port(writer)
            entry = await s.connection(port)
            writer.write(bytes(encode(Authenticate("nobody.not-a-token"))))
            record = await record_of(caplog, "tidewire.rsio", "authentication failed")
            check_record(record, entry["id"], "rsio", port, "anonymous")
            assert await reader.read(), "a goodbye"
            writer.close()

    run(main())


def test_tube_connection_lines(tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
                               ) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="tidewire")

    async def main() -> None:
        async with stack(tmp_path) as s, aiohttp.ClientSession() as session:
            ws = await session.ws_connect(s.tube_url)
            port = local_port(ws)

            async def entry() -> dict[str, Any]:
                return await s.connection(port)

            upgraded = await eventually(entry, lambda e: e["protocol"] == "tube", "the upgrade")
            await ws.send_str("text, not Tube")
            record = await record_of(caplog, "tidewire.tube", "text WebSocket message")
            check_record(record, upgraded["id"], "tube", port)
            await ws.close()

    run(main())


def test_seguro_connection_lines(tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
                                 ) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="tidewire")

    async def main() -> None:
        async with stack(tmp_path) as s:
            reader, writer = await asyncio.open_connection(HOST, s.seguro.port)
            assert await reader.readline() == b"SEGURO 0\n"
            port = local_port(writer)
            entry = await s.connection(port)
            assert entry["protocol"] == "seguro"
            writer.write(b"hello 0\n")  # HELLO in lower case: a breach
            record = await record_of(caplog, "tidewire.seguro", "dropping the connection")
            check_record(record, entry["id"], "seguro", port, "anonymous")
            writer.close()

    run(main())


def test_tolliver_connection_lines(tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
                                   ) -> None:  # fmt: skip
    caplog.set_level(logging.WARNING, logger="tidewire")

    async def main() -> None:
        async with stack(tmp_path) as s:
            reader, writer = await asyncio.open_connection(HOST, s.tolliver.port)
            port = local_port(writer)
            entry = await s.connection(port)
            assert entry["protocol"] == "tolliver"
            writer.write(b"\x09")  # an unknown message code
            record = await record_of(caplog, "tidewire.tolliver", "closing",
                                     "unknown message code 9")  # fmt: skip
            check_record(record, entry["id"], "tolliver", port, "anonymous")
            assert await reader.read() == b""  # closed
            writer.close()

    run(main())


def test_http_connection_lines(tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
                               ) -> None:  # fmt: skip
    """One kept-alive connection: it asks the API for its own id, then is refused four ways
    (401, a bad RS.io-over-HTTP publisher: 400, the ACL: 403, a body too large: 413)."""
    caplog.set_level(logging.WARNING, logger="tidewire")

    async def main() -> None:
        async with stack(tmp_path, access=Access(ACL, TOKENS), token=PROM) as s:
            await s.hub.append(Batch.build("orders", [b"x"]), assign_ids=True)
            reader, writer = await asyncio.open_connection(HOST, s.http.port)
            port = local_port(writer)
            writer.write(b"GET /api/connections HTTP/1.1\r\nHost: hub\r\n"
                         b"Authorization: Bearer " + PROM.encode() + b"\r\n\r\n")  # fmt: skip
            status, body = await http_response(reader)
            assert status == 200
            (entry,) = [c for c in json.loads(body) if c["peer"] == f"{HOST}:{port}"]
            assert (entry["protocol"], entry["principal"]) == ("http", None)
            conn = entry["id"]

            writer.write(b"GET /metrics HTTP/1.1\r\nHost: hub\r\n\r\n")
            status, _ = await http_response(reader)
            assert status == 401
            record = await record_of(caplog, "tidewire.http", "401", "/metrics")
            check_record(record, conn, "http", port)

            writer.write(b"PUT /rsio/pub/orders?nope=1&request=1 HTTP/1.1\r\nHost: hub\r\n"
                         b"Authorization: Bearer " + PROM.encode() + b"\r\n\r\n")  # fmt: skip
            status, _ = await http_response(reader)
            assert status == 400
            record = await record_of(caplog, "tidewire.rsio_http", "400", "nope")
            check_record(record, conn, "http", port)

            writer.write(b"PUT /rsio/pub/orders?request=1 HTTP/1.1\r\nHost: hub\r\n"
                         b"Authorization: Bearer " + PROM.encode() + b"\r\n\r\n")  # fmt: skip
            status, _ = await http_response(reader)
            assert status == 403  # monitor is no read
            record = await record_of(caplog, "tidewire.http", "403", "token:prometheus")
            check_record(record, conn, "http", port)

            writer.write(b"PUT /healthz HTTP/1.1\r\nHost: hub\r\n"
                         b"Content-Length: 999999999\r\n\r\n")  # fmt: skip
            status, _ = await http_response(reader)
            assert status == 413
            record = await record_of(caplog, "tidewire.http", "413")
            check_record(record, conn, "http", port)
            writer.close()

    run(main())


def test_a_refused_connection_is_logged_with_its_id(
    tmp_path: Path, run: Run, caplog: pytest.LogCaptureFixture
) -> None:
    """The guard's own lines (here: a connection over the limit) carry the context too."""
    caplog.set_level(logging.WARNING, logger="tidewire")

    async def main() -> None:
        # the admin session's connection is the one the HTTP listener allows
        async with stack(tmp_path, limits=ConnectionLimits(max_connections=2)) as s:
            assert (await s.api("/api/overview"))["connections"]["http"] == 1
            _, kept = await asyncio.open_connection(HOST, s.rsio.port)
            await eventually(s.connections, lambda cs: len(cs) == 2, "two connections")
            reader, writer = await asyncio.open_connection(HOST, s.seguro.port)
            port = local_port(writer)
            await reader.read()  # refused: closed
            record = await record_of(caplog, "tidewire.guard", "refused")
            context = context_of(record)
            assert (context.protocol, context.peer) == ("seguro", f"{HOST}:{port}")
            assert isinstance(context.conn, int)
            ids = {c["id"] for c in await s.connections()}
            assert context.conn not in ids  # never admitted: not listed
            writer.close()
            kept.close()

    run(main())
