"""Log hygiene (issue 20): what a peer sends cannot forge a log line nor drive a terminal.

Both formatters escape every non-printable character of the message and of the connection's
context (:func:`tidewire.observe.logs.escape`), once, centrally; tracebacks keep their lines.
The end-to-end forgery (a token name with a newline and ANSI escapes, sent to a real hub) is
in tests/security/test_identity.py.
"""

from __future__ import annotations

import io
import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.observe.logs import (
    ConnectionContext,
    ConnectionLog,
    JsonFormatter,
    TextFormatter,
    escape,
)

FORGED = "x\n2026-11-25 21:00:00,000 WARNING tidewire.rsio: [rsio #1 10.0.0.9:1] \x1b[2Kadmin ok"


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("plain text, 'quoted' \\ and ü €", "plain text, 'quoted' \\ and ü €"),
        ("a\nb\rc\td", "a\\nb\\rc\\td"),
        ("\x00\x1b[31mred\x7f", "\\x00\\x1b[31mred\\x7f"),
        ("c1 \x85 \x9b", "c1 \\x85 \\x9b"),  # NEL and CSI: C1 controls
        ("sep \u2028 \u2029", "sep \\u2028 \\u2029"),
        ("bidi \u202e \u2066 \u200f zero \u200b", "bidi \\u202e \\u2066 \\u200f zero \\u200b"),
        ("lone \udc80 tag \U000e0041", "lone \\udc80 tag \\U000e0041"),
    ],
)
def test_escape(raw: str, shown: str) -> None:
    assert escape(raw) == shown


@given(st.text())
def test_an_escaped_string_is_one_printable_line(text: str) -> None:
    out = escape(text)
    assert out.isprintable()
    assert out.splitlines() == ([out] if out else [])
    if text.isprintable():
        assert out == text  # printable text is left alone


def _format(formatter: logging.Formatter, context: ConnectionContext | None, msg: str,
            *args: object, exc: bool = False) -> str:  # fmt: skip
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    logger = logging.getLogger("tidewire.test.hygiene")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        target = logger if context is None else ConnectionLog(logger, context)
        if exc:
            try:
                raise ValueError("first line\nsecond line")
            except ValueError:
                target.exception(msg, *args)
        else:
            target.warning(msg, *args)
    finally:
        logger.removeHandler(handler)
        logger.propagate = True
    return stream.getvalue()


def test_a_forged_line_stays_on_its_own_line_in_text() -> None:
    context = ConnectionContext(7, "rsio", "127.0.0.1:5000", principal="token:a\nb\x1b[0m")
    out = _format(TextFormatter(), context, "authentication failed: invalid token (claimed "
                  "token:%s)", FORGED)  # fmt: skip
    lines = out.splitlines()
    assert len(lines) == 1, lines
    assert "\x1b" not in out
    assert "[rsio #7 127.0.0.1:5000 token:a\\nb\\x1b[0m] authentication failed" in lines[0]
    assert "token:x\\n2026-11-25 21:00:00,000 WARNING" in lines[0]
    assert "\\x1b[2Kadmin ok)" in lines[0]


def test_a_forged_line_stays_in_its_field_in_json() -> None:
    context = ConnectionContext(7, "rsio\x1b", "127.0.0.1:5000", principal="token:\u202eevil")
    out = _format(JsonFormatter(), context, "refused: %s", FORGED)
    lines = out.splitlines()
    assert len(lines) == 1, lines
    record = json.loads(lines[0])
    assert record["message"] == "refused: " + escape(FORGED)
    assert "\n" not in record["message"]
    assert "\x1b" not in record["message"]
    assert (record["protocol"], record["principal"]) == ("rsio\\x1b", "token:\\u202eevil")
    assert "\u202e" not in out
    assert "\x85" not in out


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonFormatter()], ids=["text", "json"])
def test_the_same_escapes_in_both_formats(formatter: logging.Formatter) -> None:
    out = _format(formatter, None, "name %s", "a\x1bb\u2028c")
    assert "name a\\x1bb\\u2028c" in (json.loads(out)["message"] if out.startswith("{") else out)


def test_a_traceback_keeps_its_lines_in_text_and_is_one_field_in_json() -> None:
    text = _format(TextFormatter(), None, "it failed: %s", "peer\nsaid", exc=True)
    lines = text.splitlines()
    assert lines[0].endswith("it failed: peer\\nsaid")
    assert lines[1] == "Traceback (most recent call last):"
    assert "ValueError: first line" in text
    record = json.loads(_format(JsonFormatter(), None, "it failed", exc=True))
    assert "Traceback (most recent call last):\n" in record["exception"]
