"""The ledger with several gateways (tidewire.hub.ledger): ``catch_up`` returns what others
recorded since, ``record_exclusive`` is a compare-and-swap on the whole ledger; on one hub both
find nothing new."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from helpers import run
from memory_storage import Gateway, MemoryStorage
from tidewire.hub import EmbeddedStorage, Ledger
from tidewire.model import IdOrderError

STREAM = "_tidewire.test"


def test_catch_up_returns_what_others_recorded_since_once() -> None:
    async def main() -> None:
        shared = MemoryStorage()
        a, b = Ledger(Gateway(shared), STREAM), Ledger(Gateway(shared), STREAM)
        assert await b.catch_up() == []
        await a.record({"n": 1})
        await a.record_many([{"n": 2}, {"n": 3}])
        assert await b.catch_up() == [{"n": 1}, {"n": 2}, {"n": 3}]
        assert await b.catch_up() == []
        assert await a.catch_up() == []  # (its own, recorded in order: seen already)
        assert b.last_seen == a.last_seen == 3

    run(main())


def test_record_exclusive_succeeds_only_on_the_ledger_as_last_seen() -> None:
    async def main() -> None:
        shared = MemoryStorage()
        a, b = Ledger(Gateway(shared), STREAM), Ledger(Gateway(shared), STREAM)
        assert await a.record_exclusive({"claim": "a"}) == 1
        with pytest.raises(IdOrderError):  # b has not seen a's record
            await b.record_exclusive({"claim": "b"})
        assert await b.catch_up() == [{"claim": "a"}]
        assert await b.record_exclusive({"claim": "b"}) == 2
        results = await asyncio.gather(a.record_exclusive({"x": "a"}),
                                       b.record_exclusive({"x": "b"}),
                                       return_exceptions=True)  # fmt: skip
        assert isinstance(results[0], IdOrderError)  # (a missed b's claim)
        assert results[1] == 3
        assert await a.catch_up() == [{"claim": "b"}, {"x": "b"}]
        results = await asyncio.gather(a.record_exclusive({"x": "a"}),
                                       b.record_exclusive({"x": "b"}),
                                       return_exceptions=True)  # fmt: skip
        assert sorted(type(r).__name__ for r in results) == ["IdOrderError", "int"]
        assert len(list(Ledger(shared, STREAM).load())) == 4

    run(main())


def test_a_record_landing_after_anothers_is_caught_up_again_harmlessly() -> None:
    async def main() -> None:
        shared = MemoryStorage()
        a, b = Ledger(Gateway(shared), STREAM), Ledger(Gateway(shared), STREAM)
        await asyncio.gather(a.record({"n": "a"}), b.record({"n": "b"}))
        # a's landed first, next to what a had seen; b's after a's: b reads its own again
        assert [await a.catch_up(), await b.catch_up()] == [[{"n": "b"}], [{"n": "a"}, {"n": "b"}]]

    run(main())


def test_records_lost_to_retention_are_skipped_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        shared = MemoryStorage()
        a, b = Ledger(Gateway(shared), STREAM), Ledger(Gateway(shared), STREAM)
        for n in range(4):
            await a.record({"n": n})
        shared.trim(STREAM, 3)
        with caplog.at_level(logging.WARNING, "tidewire.hub"):
            assert await b.catch_up() == [{"n": 2}, {"n": 3}]
        assert "lost to retention" in caplog.text

    run(main())


def test_on_the_embedded_log_a_catch_up_finds_nothing_new(tmp_path: Path) -> None:
    async def main() -> None:
        storage = EmbeddedStorage.open(str(tmp_path))
        try:
            ledger = Ledger(storage, STREAM)
            await ledger.record({"n": 1})
            assert await ledger.record_exclusive({"n": 2}) == 2
            assert await ledger.catch_up() == []
        finally:
            await storage.close()
        storage = EmbeddedStorage.open(str(tmp_path))
        try:
            ledger = Ledger(storage, STREAM)
            assert list(ledger.load()) == [{"n": 1}, {"n": 2}]
            assert await ledger.catch_up() == []
            assert await ledger.record_exclusive({"n": 3}) == 3
        finally:
            await storage.close()

    run(main())
