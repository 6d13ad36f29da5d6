"""The one reconnect helper (``tidewire.client.reconnect.Reconnector``) on a fake clock and
sleep: tries until a connection, final errors at once, GaveUp per outage, close cuts a wait
short, the on-reconnect hook, and what counts as a stable connection."""

from __future__ import annotations

import asyncio

import pytest

from helpers import run
from tidewire.client.backoff import Backoff, GaveUp, Retry
from tidewire.client.reconnect import Closed, Reconnector, first_reachable, gateway_urls


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


# --------------------------------------------------------------------------- several gateways


def test_failed_tries_and_lost_connections_move_round_robin_to_the_next_url() -> None:
    """Three gateways, a fake clock: every failed try goes on at the next URL, each wait still
    the backoff's; a later dial (the connection was lost) starts at the next URL too, and the
    rotation wraps around."""

    async def main() -> None:
        time = FakeTime()
        tried: list[str] = []
        down = {"rsio://a:1", "rsio://b:2"}
        reconnector: Reconnector[str] = Reconnector(
            pacing(time), "gateways", urls=["rsio://a:1", "rsio://b:2", "rsio://c:3"]
        )

        async def attempt() -> str:
            url = reconnector.url
            assert url is not None
            tried.append(url)
            if url in down:
                raise ConnectionRefusedError(url)
            return url

        assert reconnector.url == "rsio://a:1"
        assert await reconnector.dial(attempt) == "rsio://c:3"
        assert tried == ["rsio://a:1", "rsio://b:2", "rsio://c:3"]
        assert time.delays == [0.1, 0.2]  # paced as with one URL
        assert reconnector.url == "rsio://c:3"  # the connection's gateway
        reconnector.reset()
        down.clear()
        assert await reconnector.dial(attempt) == "rsio://a:1"  # lost: next one, wrapping
        assert await reconnector.dial(attempt) == "rsio://b:2"
        assert time.delays == [0.1, 0.2]  # a lost connection itself waits only if paused
        assert reconnector.failovers == 4
        assert (reconnector.attempts, reconnector.connects, reconnector.reconnects) == (5, 3, 2)

    run(main())


def test_a_final_error_does_not_fail_over_and_one_url_never_moves() -> None:
    async def main() -> None:
        time = FakeTime()
        reconnector: Reconnector[str] = Reconnector(pacing(time), "gateways",
                                                    urls=["rsio://a:1", "rsio://b:2"])

        async def refused() -> str:
            raise RuntimeError("a refused token")

        with pytest.raises(RuntimeError):
            await reconnector.dial(refused)
        assert (reconnector.url, reconnector.failovers, time.delays) == ("rsio://a:1", 0, [])

        single: Reconnector[str] = Reconnector(pacing(time, attempts=3), "one", urls=["rsio://a:1"])
        errors = [ConnectionRefusedError("no")]

        async def flaky() -> str:
            if errors:
                raise errors.pop()
            return "up"

        assert await single.dial(flaky) == "up"
        assert await single.dial(flaky) == "up"
        assert (single.url, single.failovers) == ("rsio://a:1", 0)
        assert Reconnector(pacing(time), "no urls").url is None

    run(main())


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("rsio://h1:7701,rsio://h2:7701", ("rsio://h1:7701", "rsio://h2:7701")),
        ("rsio://h1:7701, h2:7701 ,", ("rsio://h1:7701", "rsio://h2:7701")),
        (["rsio://h1:1", "rsio://h2:2,h3:3"], ("rsio://h1:1", "rsio://h2:2", "rsio://h3:3")),
        ("ws://h1:7480/tube,h2:7480", ("ws://h1:7480/tube", "ws://h2:7480/tube")),
        ("http://h1:7480,h2:7480", ("http://h1:7480", "http://h2:7480")),
        ("seguro://h1:7403", ("seguro://h1:7403",)),
    ],
)
def test_gateway_urls_forms(given: str | list[str], expected: tuple[str, ...]) -> None:
    assert gateway_urls(given) == expected


@pytest.mark.parametrize("given", ["", " , ", "h1:7701,rsio://h2:1", "rsio://a:1,a:1"])
def test_gateway_urls_refuses(given: str) -> None:
    with pytest.raises(ValueError, match="URL"):
        gateway_urls(given)


def test_first_reachable_tries_each_once_in_order() -> None:
    async def main() -> None:
        tried: list[str] = []

        async def attempt(url: str) -> str:
            tried.append(url)
            if url != "c":
                raise ConnectionRefusedError(url)
            return url

        assert await first_reachable(["a", "b", "c"], attempt) == "c"
        assert tried == ["a", "b", "c"]
        with pytest.raises(ConnectionRefusedError, match="b"):
            await first_reachable(["a", "b"], attempt)

        async def refused(url: str) -> str:
            tried.append(url)
            raise RuntimeError(url)

        tried.clear()
        with pytest.raises(RuntimeError):
            await first_reachable(["a", "b"], refused)
        assert tried == ["a"]

    run(main())
