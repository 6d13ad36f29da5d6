"""A stream created under the looser name rule of older releases (a zero-width or bidi
character, a name not in NFC) still opens: the log recovers it, lists it and reads it, though
no peer can name it any more (:func:`tidewire.model.validate_stream_name`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tidewire.hub import Hub
from tidewire.log import Log, LogConfig
from tidewire.log.stream import NAME_FILE, directory_name
from tidewire.model import Batch, InvalidStreamName, validate_stream_name

LEGACY = ["pay\u200broll", "evil\u202etxt.exe", "cafe\u0301"]  # ZWSP, RLO, not NFC


@pytest.mark.parametrize("legacy", LEGACY)
def test_a_stream_with_a_name_refused_today_still_opens(tmp_path: Path, legacy: str) -> None:
    with pytest.raises(InvalidStreamName):
        validate_stream_name(legacy)

    async def write() -> None:
        log = Log.open(str(tmp_path), LogConfig())
        try:
            await log.append(Batch.build("plain", [b"a", b"b", b"c"]), assign_ids=True)
        finally:
            await log.close()

    asyncio.run(write())
    # What an older release left on disk: the directory and stream.name of the legacy name.
    old, new = tmp_path / directory_name("plain"), tmp_path / directory_name(legacy)
    os.rename(old, new)
    (new / NAME_FILE).write_bytes(legacy.encode())

    async def reopen() -> list[bytes]:
        log = Log.open(str(tmp_path), LogConfig())
        try:
            assert legacy in log.streams()
            return [e.value for b in log.read(legacy, 1, 1 << 20) for e in b]
        finally:
            await log.close()

    assert asyncio.run(reopen()) == [b"a", b"b", b"c"]

    async def serve() -> list[str]:
        hub = Hub.open(str(tmp_path), LogConfig(fsync=False))
        await hub.start()
        try:
            return [s.name for s in hub.streams()]
        finally:
            await hub.close()

    assert asyncio.run(serve()) == [legacy]  # the hub starts and lists it too
