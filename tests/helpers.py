"""The helpers every test module shares (one copy each, instead of one per module):

* :func:`until`: poll a condition that no event announces, bounded in time;
* :func:`run`: run one coroutine on a fresh event loop, bounded in time, and return its result
  (for tests that are not parametrized over the loops; those take the ``run`` fixture of
  tests/conftest.py, see tests/loops.py);
* :func:`own_rss`: this process's resident memory (for tests whose hub runs in it);
* :func:`hub_server`: a hub on a temporary directory with an RS.io server on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

from loops import LOOPS
from tidewire.hub import Budget, BudgetLimits, Hub
from tidewire.hub.access import Access
from tidewire.log import LogConfig
from tidewire.server.guard import Admission, ConnectionLimits
from tidewire.server.rsio import RsioServer, RsioSettings, start_rsio_server

__all__ = ["HOST", "TESTS", "child_env", "hub_server", "own_rss", "run", "until"]

T = TypeVar("T")

TESTS = Path(__file__).resolve().parent
"""The tests' root folder: where the shared helpers (this module, loops.py, ...) live."""


def child_env() -> dict[str, str]:
    """The environment for a test module run again as a child process (``sys.executable
    __file__ ...``): the shared helpers importable from any test folder."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    return env

HOST = "127.0.0.1"

UNTIL_SECONDS = 30.0
"""How long :func:`until` waits by default: longer than a test's own bound (the ``run``
fixture's), which then fails first and says where the test hung."""


async def until(
    condition: Callable[[], object],
    what: str = "a condition",
    seconds: float = UNTIL_SECONDS,
    *,
    details: Callable[[], object] | None = None,
    poll: float = 0.002,
) -> None:
    """Wait until ``condition()`` is true, checking every ``poll`` seconds; ``AssertionError``
    naming ``what`` (and ``details()``, when given) after ``seconds``.

    For state that no event announces (a counter, a store's size, another process's files):
    anything that can be awaited is awaited instead. The bound is on the monotonic clock, not
    the loop's, so that it holds whatever the loop does.
    """
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            extra = "" if details is None else f" {details()}"
            raise AssertionError(f"timed out waiting for {what}{extra}")
        await asyncio.sleep(poll)


def run(coro: Coroutine[Any, Any, T], timeout: float = 60.0, *, loop: str = "asyncio") -> T:
    """Run ``coro`` on a fresh event loop (``asyncio`` or ``uvloop``) and return its result;
    ``TimeoutError`` after ``timeout`` seconds, so that a hang fails instead of stalling."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        return runner.run(bounded())


def own_rss() -> int:
    """This process's resident set size, in bytes (a hub started in process runs in it)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def loopback_buffer_bytes() -> int:
    """The most one TCP connection's kernel buffers can hold on this machine: the largest
    receive buffer autotuning may grow to plus the largest send buffer (``tcp_rmem`` and
    ``tcp_wmem``'s maxima; 64 MiB where they cannot be read). A test that needs a peer that
    never reads to push bytes back into the hub sends more than this."""
    total = 0
    for name in ("tcp_rmem", "tcp_wmem"):
        try:
            with open(f"/proc/sys/net/ipv4/{name}") as f:
                total += int(f.read().split()[-1])
        except (OSError, ValueError, IndexError):
            return 64 * 1024 * 1024
    return total


@asynccontextmanager
async def hub_server(
    path: Path,
    settings: RsioSettings | None = None,
    *,
    access: Access | None = None,
    limits: ConnectionLimits | None = None,
    tls: ssl.SSLContext | None = None,
    budget: BudgetLimits | None = None,
    log: LogConfig | None = None,
) -> AsyncIterator[tuple[Hub, RsioServer, str]]:
    """A hub on ``path`` (with a memory ``budget`` of its own and a ``log`` configuration,
    when given) and its RS.io server on 127.0.0.1 (any free port; with ``access``, the guard's
    ``limits`` and ``tls`` as given), with the server's URL; both closed on exit."""
    hub = Hub.open(str(path), log)
    if budget is not None:
        hub.budget = Budget(budget)
    admission = Admission(limits) if limits is not None else None
    server = await start_rsio_server(hub, HOST, 0, settings, access=access, admission=admission,
                                     tls=tls)  # fmt: skip
    try:
        yield hub, server, f"rsio://{HOST}:{server.port}"
    finally:
        await server.close()
        await hub.close()


async def stream_values(hub: Hub, stream: str = "s") -> list[bytes]:
    """Every value ``stream`` holds, in id order, read a megabyte at a time (``[]`` for a
    stream the hub does not have)."""
    out: list[bytes] = []
    next_id = 1
    while got := await hub.read(stream, next_id, 1 << 20):
        out += [b.value(i) for b in got for i in range(len(b))]
        next_id = got[-1].last_id + 1
    return out
