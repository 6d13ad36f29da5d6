"""Every socket test runs on asyncio's loop and on uvloop: the loops, and the type of the
``run`` fixture (tests/conftest.py) that runs a coroutine on each under a time bound."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from tidewire.observe.logs import ConnectionContext

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}

Run = Callable[[Coroutine[Any, Any, None]], None]
"""``run(coro)``: run ``coro`` to its end on the test's loop, within ``RUN_SECONDS``."""

RUN_SECONDS = 20.0


def runner(loop: str, seconds: float = RUN_SECONDS) -> Run:
    """A ``run(coro)`` on ``loop`` bounded by ``seconds`` (the ``run`` fixture's)."""

    def run(coro: Coroutine[Any, Any, None]) -> None:
        async def bounded() -> None:
            async with asyncio.timeout(seconds):
                await coro

        with asyncio.Runner(loop_factory=LOOPS[loop]) as r:
            r.run(bounded())

    return run


def line(record: logging.LogRecord) -> str:
    """A record's message as the text log shows it: with its connection's context, if any
    (``[protocol #id peer principal] message``)."""
    context = getattr(record, "connection", None)
    prefix = context.prefix() if isinstance(context, ConnectionContext) else ""
    return prefix + record.getMessage()


def warnings(caplog: pytest.LogCaptureFixture, logger: str) -> list[str]:
    """The lines of ``logger`` at WARNING or above (with their connection's context)."""
    return [line(r) for r in caplog.records
            if r.name == logger and r.levelno >= logging.WARNING]  # fmt: skip


async def logged(caplog: pytest.LogCaptureFixture, logger: str, *parts: str) -> str:
    """The first warning of ``logger`` containing every one of ``parts`` (polls, bounded)."""
    deadline = time.monotonic() + 5
    while True:
        for line in warnings(caplog, logger):
            if all(p in line for p in parts):
                return line
        assert time.monotonic() < deadline, (parts, warnings(caplog, logger))
        await asyncio.sleep(0.005)
