"""How ``tidewire streams create/retention`` read a retention (tidewire/cli_retention.py, pure):
durations, sizes in both unit families, ``none``, and what is refused rather than guessed; and
how the hub's answer is shown."""

from __future__ import annotations

import pytest

from tidewire.cli_retention import (
    MAX_VALUE,
    describe_retention,
    format_bytes,
    format_ms,
    parse_bytes,
    parse_duration,
    parse_ms,
)

DAY = 86_400_000


def test_durations() -> None:
    assert parse_duration("7d") == 7 * DAY
    assert parse_duration("1h30m") == 5_400_000
    assert parse_duration("2w") == 14 * DAY
    assert parse_duration("1d12h") == DAY + DAY // 2
    assert parse_duration("250ms") == 250
    assert parse_duration(" 90s ") == 90_000
    assert parse_duration("0s") == 0
    for none in ("none", "NONE", "unbounded", "-1"):
        assert parse_duration(none) is None
    with pytest.raises(ValueError, match="has no unit"):
        parse_duration("604800000")
    for wrong in ("", "7", "7 d", "7D", "1y", "1mo", "d", "-7d", "1.5h", "7dx"):
        with pytest.raises(ValueError, match=r"is not a duration|no unit"):
            parse_duration(wrong)
    with pytest.raises(ValueError, match="too large"):
        parse_duration(f"{MAX_VALUE}ms1ms")


def test_milliseconds() -> None:
    assert parse_ms("604800000") == 7 * DAY
    assert parse_ms("0") == 0
    assert parse_ms("none") is None
    assert parse_ms("-1") is None  # (the configuration file's "no bound")
    assert parse_ms(str(MAX_VALUE)) == MAX_VALUE
    for wrong in ("7d", "1e3", "-2", "", "٣"):  # (an Arabic-Indic digit is not ASCII)
        with pytest.raises(ValueError, match="is not a number of milliseconds"):
            parse_ms(wrong)
    with pytest.raises(ValueError, match="too large"):
        parse_ms(str(MAX_VALUE + 1))


def test_sizes() -> None:
    assert parse_bytes("1GiB") == 2**30
    assert parse_bytes("1 gib") == 2**30
    assert parse_bytes("10GB") == 10 * 10**9
    assert parse_bytes("500MiB") == 500 * 2**20
    assert parse_bytes("1.5KiB") == 1536
    assert parse_bytes("2TB") == 2 * 10**12
    assert parse_bytes("1PiB") == 2**50
    assert parse_bytes("4096") == 4096
    assert parse_bytes("12B") == 12
    assert parse_bytes("none") is None
    with pytest.raises(ValueError, match="say GiB for 2"):
        parse_bytes("1G")
    with pytest.raises(ValueError, match="say GiB for 2"):
        parse_bytes("5ki")
    with pytest.raises(ValueError, match="whole number of bytes"):
        parse_bytes("1.1B")
    for wrong in ("", "GiB", "1 2", "-1GiB", "1EiB", "1,5GiB", "0x10"):
        with pytest.raises(ValueError, match="is not bytes, or with a unit"):
            parse_bytes(wrong)
    with pytest.raises(ValueError, match="too large"):
        parse_bytes("10000PB")  # 10**19 > 2**63 - 1


def test_how_the_hubs_answer_is_shown() -> None:
    assert format_ms(7 * DAY) == "7d"
    assert format_ms(5_400_000) == "1h30m"
    assert format_ms(1500) == "1s500ms"
    assert format_ms(0) == "0ms"
    assert format_bytes(2**30) == "1 GiB"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(1000) == "1000 B"
    assert format_bytes(10 * 10**9) == "9.313 GiB"
    assert format_bytes(0) == "0 B"
    assert describe_retention({"ms": 7 * DAY, "bytes": 2**30, "source": "runtime"}) == (
        "7d (604800000 ms), 1 GiB (1073741824 bytes), set at runtime")  # fmt: skip
    assert describe_retention({"ms": None, "bytes": None, "source": "default"}) == (
        "no time bound, no size bound, the configuration's default")  # fmt: skip
    assert describe_retention(None).startswith("not known here")
