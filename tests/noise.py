"""What the shared machine itself stalls, measured beside a timing test.

A test that promises "no stall over 100 ms" measures more than the hub on a shared 2-core
machine: a neighbour's burst or the hypervisor can hold every process at once. :class:`MachineNoise`
runs a control process that does nothing but sleep 5 ms at a time and records its longest
oversleep over the same window as the measurement. A promise is then judged as "no stall over
the promise plus what a process doing nothing saw": a hub that holds its loop still fails
(the control keeps running on the other core), and a machine that held everyone does not.

    async with MachineNoise() as noise:
        ...measure...
    assert stall < PROMISE + noise.max_lag_s

The child is stopped by its pid if the measurement is cancelled.
"""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType

__all__ = ["MachineNoise"]

_CONTROL = r"""
import sys, threading, time
done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
worst = 0.0
print("ready", flush=True)
while not done.is_set():
    before = time.monotonic()
    time.sleep(0.005)
    worst = max(worst, time.monotonic() - before - 0.005)
print(worst, flush=True)
"""


class MachineNoise:
    """The longest a do-nothing process overslept a 5 ms sleep while this was entered."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self.max_lag_s = 0.0

    async def __aenter__(self) -> MachineNoise:
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _CONTROL, stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE)  # fmt: skip
        assert self._proc.stdout is not None
        await asyncio.wait_for(self._proc.stdout.readline(), 30)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:  # fmt: skip
        proc = self._proc
        assert proc is not None
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            proc.stdin.close()
            line = await asyncio.wait_for(proc.stdout.readline(), 10)
            self.max_lag_s = float(line.decode().strip() or 0.0)
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()
