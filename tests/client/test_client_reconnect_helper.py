"""The one reconnect helper (``tidewire.client.reconnect.Reconnector``) on a fake clock and
sleep: tries until a connection, final errors at once, GaveUp per outage, close cuts a wait
short, the on-reconnect hook, and what counts as a stable connection."""

from __future__ import annotations

import asyncio

import pytest

from helpers import run
from tidewire.client.backoff import Backoff, GaveUp, Retry
from tidewire.client.reconnect import Closed, Reconnector


class FakeTime:
    """A clock that the fake sleep advances (no real waiting)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.delays: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        self.now += delay


def pacing(time: FakeTime, attempts: int | None = None) -> Backoff:
    retry = Retry(initial=0.1, maximum=1.0, jitter=0.0, attempts=attempts)
    return Backoff(retry, clock=time.clock, sleep=time.sleep)


def test_dial_tries_until_a_connection_paced_by_the_backoff() -> None:
    async def main() -> None:
        time = FakeTime()
        errors = [ConnectionRefusedError("no"), ConnectionResetError("reset")]

        async def attempt() -> str:
            if errors:
                raise errors.pop(0)
            return "connection"

        reconnector: Reconnector[str] = Reconnector(pacing(time), "the hub")
        assert await reconnector.dial(attempt) == "connection"
        assert time.delays == [0.1, 0.2]
        assert (reconnector.attempts, reconnector.failures, reconnector.connects) == (3, 2, 1)
        assert isinstance(reconnector.last_error, ConnectionResetError)

    run(main())


def test_a_final_error_is_raised_at_once_and_may_be_replaced() -> None:
    async def main() -> None:
        time = FakeTime()

        async def refused() -> str:
            raise PermissionError("a refused token")

        def final(exc: BaseException) -> BaseException | None:
            return RuntimeError("final") if isinstance(exc, PermissionError) else None

        reconnector: Reconnector[str] = Reconnector(pacing(time), "the hub", final=final)
        with pytest.raises(RuntimeError, match="final"):
            await reconnector.dial(refused)
        assert time.delays == []

    run(main())


def test_an_outage_ends_in_gave_up_and_reset_starts_a_new_one() -> None:
    async def main() -> None:
        time = FakeTime()

        async def down() -> str:
            raise ConnectionRefusedError("down")

        reconnector: Reconnector[str] = Reconnector(pacing(time, attempts=3), "the hub")
        with pytest.raises(GaveUp):
            await reconnector.dial(down)
        assert reconnector.attempts == 3
        reconnector.reset()
        await reconnector.pause(ConnectionResetError("lost"))  # a new outage: from initial
        assert time.delays[-1] == 0.1

    run(main())


def test_close_cuts_a_wait_short() -> None:
    async def main() -> None:
        never = asyncio.Event()

        async def sleep(delay: float) -> None:
            await never.wait()

        backoff = Backoff(Retry(initial=5.0, maximum=5.0), sleep=sleep)
        reconnector: Reconnector[str] = Reconnector(backoff, "the hub")
        waiting = asyncio.ensure_future(reconnector.pause(ConnectionResetError("lost")))
        await asyncio.sleep(0)
        reconnector.close()
        with pytest.raises(Closed):
            await waiting

        async def attempt() -> str:
            return "never tried"

        with pytest.raises(Closed):
            await reconnector.dial(attempt, try_seconds=1)
        assert reconnector.attempts == 0

    run(main())


def test_on_reconnect_and_what_counts_as_stable() -> None:
    async def main() -> None:
        time = FakeTime()
        again: list[str] = []
        reconnector: Reconnector[str] = Reconnector(pacing(time), "the hub", stable_after=1.0,
                                                    on_reconnect=again.append)  # fmt: skip

        async def attempt() -> str:
            return f"connection {reconnector.attempts}"

        await reconnector.dial(attempt)
        assert not reconnector.lasted()
        reconnector.progressed()  # it delivered something: stable at once
        assert reconnector.lasted()
        await reconnector.dial(attempt)
        assert again == ["connection 2"]
        assert not reconnector.lasted()
        time.now += 1.0  # lived stable_after seconds
        assert reconnector.lasted()
        assert reconnector.reconnects == 1

    run(main())
