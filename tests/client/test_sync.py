"""``tidewire.sync``: the blocking clients for scripts and notebooks, against a real hub.

The hub (RS.io and Seguro on 127.0.0.1, free ports) runs on an event loop in a thread of its
own, so that the test's thread makes blocking calls as a script would; :meth:`HubThread.call`
reads the hub's own state there (its live subscriptions). Error parity: the same call through
the asyncio client (on a fresh loop in the test's thread, ``helpers.run``) raises an exception
of the same type with the same message.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest

import tidewire
import tidewire.sync
from helpers import HOST, child_env, hub_server, run
from hubproc import HubProcess
from tidewire.client.rsio import RsioError
from tidewire.hub import Hub
from tidewire.hub.access import Access, Tokens, mint_token
from tidewire.log import Log, LogConfig, StreamSettings
from tidewire.model import Batch, LocalProtocolError, LogClosedError, UnknownStream, now_ms
from tidewire.protocols.rsio.names import FromTime
from tidewire.server.seguro import start_seguro_server
from tidewire.sync import LoopThreadError

T = TypeVar("T")

SECONDS = 30.0  # the bound of every wait here


class HubThread:
    """A hub with its RS.io and Seguro servers, served by an event loop in a thread."""

    def __init__(self, path: Path, access: Access | None = None) -> None:
        self.path = path
        self.access = access
        self.url = self.seguro_url = ""
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True,
                                        name="test-hub")  # fmt: skip

    async def _main(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        try:
            async with hub_server(self.path, access=self.access) as (hub, _, url):
                seguro = await start_seguro_server(hub, HOST, 0, access=self.access)
                try:
                    self.hub, self.url = hub, url
                    self.seguro_url = f"seguro://{HOST}:{seguro.port}"
                    self._ready.set()
                    await self._stop.wait()
                finally:
                    await seguro.close()
        except BaseException as exc:
            self._error = exc
            raise
        finally:
            self._ready.set()

    def __enter__(self) -> HubThread:
        self._thread.start()
        assert self._ready.wait(SECONDS), "the hub did not start"
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(SECONDS)
        assert not self._thread.is_alive(), "the hub did not stop"

    def call(self, fn: Callable[[Hub], T]) -> T:
        """``fn(hub)`` on the hub's loop (its state is that loop's)."""

        async def on_loop() -> T:
            return fn(self.hub)

        return asyncio.run_coroutine_threadsafe(on_loop(), self.loop).result(SECONDS)

    def live_subscriptions(self) -> int:
        return self.call(lambda hub: len(hub.live_subscriptions()))


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Poll ``condition`` (state no event announces: the hub's, in its thread), bounded."""
    deadline = time.monotonic() + SECONDS
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[HubThread]:
    with HubThread(tmp_path / "hub") as hub:
        yield hub


def values(batches: list[Batch]) -> list[bytes]:
    return [event.value for batch in batches for event in batch]


def error_of(call: Callable[[], object]) -> Exception:
    """What ``call()`` raises (it must raise)."""
    try:
        call()
    except Exception as exc:
        return exc
    raise AssertionError("no error")


# --------------------------------------------------------------------------- RS.io


def test_publish_then_read(served: HubThread) -> None:
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
        first = hub.publish("orders", [b"one", b"two"])
        second = hub.publish("orders", [b"three"], key=b"k")
        assert (first.first_id, first.last_id, second.first_id) == (1, 2, 3)

        assert values(hub.read("orders")) == [b"one", b"two", b"three"]
        assert values(hub.read("orders", from_id=2)) == [b"two", b"three"]
        assert values(hub.read("orders", until_id=2)) == [b"one", b"two"]
        assert values(hub.read("orders", limit=2)) == [b"one", b"two"]
        keyed = hub.read("orders", key=b"k")
        assert [(e.id, e.key, e.value) for b in keyed for e in b] == [(3, b"k", b"three")]
        assert hub.read("orders", from_id="latest") == []  # nothing waits for new events
        assert hub.read("orders", from_id=4) == []
        with pytest.raises(UnknownStream):
            hub.read("nosuch")
        with pytest.raises(TypeError, match=r"publish\(stream, \[value\]\)"):
            hub.publish("orders", b"one")  # type: ignore[arg-type]  # (the mistake tested)

        again = hub.publish("orders", [b"x"], txn="t-1")
        assert hub.publish("orders", [b"x"], txn="t-1") == again  # exactly once
        [row] = hub.streams(["orders"])
        assert (row["exists"], row["latest_id"], row["events"]) == (True, 4, 4)
    assert hub.closed
    with pytest.raises(LogClosedError, match="closed"):
        hub.streams()


def test_read_and_subscribe_from_a_time(served: HubThread) -> None:
    """``FromTime(ms)`` as the asyncio client takes it: the first event stamped at ``ms`` or
    later (the time index), nothing when no event is that new."""
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
        hub.publish("timed", [b"a", b"b"])
        [batch] = hub.read("timed")
        later = int(batch.timestamps[-1]) + 1
        while int(time.time() * 1000) < later:  # (the next event is stamped after ``later``)
            time.sleep(0.001)
        hub.publish("timed", [b"c"])
        assert values(hub.read("timed", from_id=FromTime(0))) == [b"a", b"b", b"c"]
        assert values(hub.read("timed", from_id=FromTime(later))) == [b"c"]
        assert hub.read("timed", from_id=FromTime(later + 3_600_000)) == []
        with hub.subscribe("timed", from_id=FromTime(later)) as events:
            assert [e.value for e in next(events)] == [b"c"]


def test_a_publisher_keeps_many_batches_in_flight(served: HubThread) -> None:
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
        with hub.publisher("flow", max_queue_bytes=4096) as pub:
            futures = [pub.submit([b"%d" % i] * 10) for i in range(50)]  # waits for room
            receipts = [f.result(SECONDS) for f in futures]
            assert [(r.first_id, r.last_id) for r in receipts] == [
                (1 + 10 * i, 10 + 10 * i) for i in range(50)]  # fmt: skip
            assert pub.send([b"last"]).last_id == 501
        assert values(hub.read("flow", from_id=500)) == [b"49", b"last"]

        with hub.publisher("flow", txn="once") as txn:
            pending = txn.submit([b"t1", b"t2"])
        assert (pending.result(SECONDS).first_id, hub.streams(["flow"])[0]["latest_id"]) == (
            502, 503)  # fmt: skip
        with hub.publisher("flow", txn="once") as txn:  # the same transaction: stored once
            again = txn.submit([b"t1", b"t2"])  # (it commits when the offer completes)
        assert again.result(SECONDS).first_id == 502
        assert hub.streams(["flow"])[0]["latest_id"] == 503


def test_subscribe_iterates_then_a_break_cancels_it_on_the_hub(served: HubThread) -> None:
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
        for n in range(3):
            hub.publish("s", [b"%d" % n])
        got = [b for batch in hub.subscribe("s", until_id=3) for b in values([batch])]
        assert got == [b"0", b"1", b"2"]  # history, then the end at until_id

        for batch in hub.subscribe("s", from_id=2, prefetch=1):  # live: it never ends itself
            assert batch.first_id == 2
            assert served.live_subscriptions() == 1
            break
        wait_until(lambda: served.live_subscriptions() == 0, "the abandoned one to be cancelled")

        subscription = hub.subscribe("s")
        assert next(subscription).first_id == 1
        del subscription
        gc.collect()
        wait_until(lambda: served.live_subscriptions() == 0, "the dropped one to be cancelled")

        with hub.subscribe("s", from_id="latest") as live:
            hub.publish("s", [b"new"])
            assert values([next(live)]) == [b"new"]
        wait_until(lambda: served.live_subscriptions() == 0, "close() to cancel it on the hub")
        assert next(live, None) is None  # (closed: the iterator is over)

        values_only = hub.subscribe_values("s", size=1, until_id=3)
        assert [bytes(v) for batch in values_only for v in batch] == [b"0", b"1", b"2"]


def test_a_timeout_cancels_the_call_and_the_connection_goes_on(served: HubThread) -> None:
    with tidewire.sync.connect(served.url) as hub:
        hub.publish("quiet", [b"a"])
        subscription = hub.subscribe("quiet", from_id="latest", timeout=0.3)
        began = time.monotonic()
        with pytest.raises(TimeoutError):
            next(subscription)
        assert time.monotonic() - began < SECONDS
        wait_until(lambda: served.live_subscriptions() == 0, "the timeout to cancel it")
        assert next(subscription, None) is None  # ended, as a cancelled anext() ends it
        assert values(hub.read("quiet")) == [b"a"]  # the connection is as good as before


def test_ctrl_c_cancels_the_call(served: HubThread) -> None:
    """SIGINT while a call waits (a user's Ctrl-C): ``KeyboardInterrupt`` in the caller, and
    the in-loop task is cancelled (the subscription ends on the hub); the client goes on."""
    main = threading.main_thread().ident
    assert main == threading.get_ident(), "signals reach the main thread only"
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
        subscription = hub.subscribe("ctrl-c", from_id="latest")
        wait_until(lambda: served.live_subscriptions() == 1, "the subscription")
        interrupt = threading.Timer(0.2, signal.pthread_kill, (main, signal.SIGINT))
        interrupt.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                next(subscription)  # nothing comes: it waits until interrupted
        finally:
            interrupt.join(SECONDS)
        wait_until(lambda: served.live_subscriptions() == 0, "the cancel")
        assert next(subscription, None) is None
        assert hub.publish("ctrl-c", [b"after"]).last_id == 1


def test_errors_are_the_asyncio_clients(tmp_path: Path) -> None:
    """A refused token, ids removed by retention and a timeout: what the asyncio client raises,
    the blocking one raises (same type, same message)."""
    config = LogConfig(streams={"r": StreamSettings(segment_bytes=4096, retention_bytes=6000)})

    async def fill() -> int:
        log = Log.open(str(tmp_path / "hub"), config)
        try:
            for _ in range(20):
                await log.append(Batch.build("r", [b"x" * 200] * 10), assign_ids=True)
            assert log.enforce_retention(now_ms()) > 0
            return log.start_id("r")
        finally:
            await log.close()

    first = run(fill())
    assert first > 1
    token, table = mint_token("ci")
    with HubThread(tmp_path / "hub", Access(tokens=Tokens.parse(table))) as served:

        async def refused() -> None:
            await tidewire.connect(served.url, token="ci.wrong")

        expected = error_of(lambda: run(refused()))
        got = error_of(lambda: tidewire.sync.connect(served.url, token="ci.wrong"))
        assert (type(got), str(got)) == (type(expected), str(expected))
        assert "authentication failed" in str(got)

        async def lost() -> None:
            async with tidewire.connect(served.url, token=token) as hub:
                async for _ in hub.subscribe("r", from_id=1):
                    pass

        async def quiet() -> None:
            async with tidewire.connect(served.url, token=token) as hub:
                async with asyncio.timeout(0.3):
                    await anext(hub.subscribe("r", from_id="latest"))

        with tidewire.sync.connect(served.url, token=token, timeout=SECONDS) as hub:
            assert hub.principal == "token:ci"
            expected = error_of(lambda: run(lost()))
            got = error_of(lambda: hub.read("r", from_id=1))
            assert type(got) is type(expected) is RsioError
            assert str(got) == str(expected)
            assert "removed by retention" in str(got)
            assert values(hub.read("r", limit=1)) == [b"x" * 200]  # earliest: the first kept

            expected = error_of(lambda: run(quiet()))
            got = error_of(lambda: next(hub.subscribe("r", from_id="latest", timeout=0.3)))
            assert type(got) is type(expected) is TimeoutError


def test_over_tube_and_across_a_restart_with_retry(tmp_path: Path) -> None:
    """``tidewire serve`` as a child process: RS.io over Tube (``ws://``), and a client with
    ``retry=`` whose hub is killed and started again (on the same ports) between two calls."""
    from tidewire.client.backoff import Retry

    served = HubProcess(tmp_path / "data", tmp_path / "hub.log")
    urls = served.start()
    try:
        with tidewire.sync.connect(urls["ws"], timeout=SECONDS) as tube:
            assert tube.publish("t", [b"over tube"]).last_id == 1
            assert values(tube.read("t")) == [b"over tube"]
        with tidewire.sync.connect(urls["rsio"], retry=Retry(give_up_after=SECONDS),
                                   timeout=SECONDS) as hub:  # fmt: skip
            assert hub.publish("t", [b"before"]).last_id == 2
            served.kill()
            served.start()
            assert hub.publish("t", [b"after"]).last_id == 3  # reconnected, exactly once
            assert values(hub.read("t")) == [b"over tube", b"before", b"after"]
    finally:
        served.stop()


# --------------------------------------------------------------------------- threads and loops


def test_calls_from_inside_a_running_event_loop(served: HubThread) -> None:
    """A notebook cell runs in Jupyter's event loop: blocking calls still work there."""

    async def cell() -> list[bytes]:
        with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
            hub.publish("nb", [b"from a cell"])
            return values(hub.read("nb"))

    assert asyncio.run(cell()) == [b"from a cell"]


def test_a_call_from_the_loop_thread_is_refused(served: HubThread) -> None:
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:

        async def on_the_loop() -> BaseException:
            with pytest.raises(LoopThreadError) as caught:
                hub.streams()  # would wait for its own thread for ever
            return caught.value

        error = tidewire.sync.run(on_the_loop(), timeout=SECONDS)
        assert "deadlock" in str(error)
        assert isinstance(error, tidewire.model.TidewireError)
        rows = tidewire.sync.run(hub.client.streams(), timeout=SECONDS)  # awaiting works there
        assert rows == hub.streams()


def test_several_threads_share_one_connection(served: HubThread) -> None:
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
        errors: list[BaseException] = []

        def publish(n: int) -> None:
            try:
                for i in range(20):
                    hub.publish("threads", [b"%d-%d" % (n, i)])
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(SECONDS)
        assert errors == []
        assert sorted(values(hub.read("threads"))) == sorted(
            b"%d-%d" % (n, i) for n in range(4) for i in range(20))  # fmt: skip


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_after_fork_the_child_has_a_loop_of_its_own(served: HubThread) -> None:
    with tidewire.sync.connect(served.url, timeout=SECONDS) as hub:
        hub.publish("forked", [b"parent"])
        pid = os.fork()
        if pid == 0:  # the child: report by exit code only, never return into pytest
            code = 1
            try:
                try:
                    hub.streams()
                except LogClosedError as exc:
                    code = 2 if "fork" in str(exc) else 3
                if code == 2:
                    with tidewire.sync.connect(served.url, timeout=SECONDS) as own:
                        own.publish("forked", [b"child"])
                        code = 0 if values(own.read("forked")) == [b"parent", b"child"] else 4
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert values(hub.read("forked")) == [b"parent", b"child"]  # the parent's still works


def test_at_exit_open_clients_are_closed(served: HubThread, tmp_path: Path) -> None:
    """A script that never closes its client nor its subscription exits cleanly: at exit its
    connection is closed (the client said goodbye: its asyncio client has a reason) and the
    loop thread stopped, before an exit handler registered earlier runs (handlers run last
    registered first) and looks."""
    script = tmp_path / "script.py"
    script.write_text(
        "import atexit, sys, threading\n"
        "atexit.register(lambda: print(hub.closed, hub.client.closed,\n"
        "    [t.name for t in threading.enumerate() if t.name == 'tidewire-sync']))\n"
        "import tidewire.sync\n"
        "hub = tidewire.sync.connect(sys.argv[1], timeout=30)\n"
        "hub.publish('exit', [b'one'])\n"
        "it = hub.subscribe('exit')\n"
        "print(next(it).last_id, flush=True)\n"
    )
    done = subprocess.run([sys.executable, str(script), served.url], capture_output=True,
                          text=True, timeout=SECONDS, env=child_env())  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == ["1", "True goodbye acknowledged []"]
    wait_until(lambda: served.live_subscriptions() == 0, "the script's subscription to end")


# --------------------------------------------------------------------------- Seguro


def test_seguro_save_and_read(served: HubThread) -> None:
    point = "~sampel-palnet"
    with tidewire.sync.seguro_connect(served.seguro_url, point, timeout=SECONDS) as ship:
        assert (ship.point, ship.latest) == (point, 0)
        ship.save(1, b"one")
        ship.save_many([(2, b"two"), (5, b"five")])
        assert ship.latest == 5
        events, sent = ship.read(1, 10)
        assert events == [(1, b"one"), (2, b"two"), (5, b"five")]
        assert (sent.count, sent.start, sent.end) == (3, 1, 5)

        async def too_low() -> None:
            async with tidewire.client.seguro.connect(served.seguro_url, "~zod") as other:
                await other.save(1, b"a")
                await other.save(1, b"again")

        expected = error_of(lambda: run(too_low()))
        with tidewire.sync.seguro_connect(served.seguro_url, "~nec") as other:
            other.save(1, b"a")
            got = error_of(lambda: other.save(1, b"again"))
        assert type(got) is type(expected) is LocalProtocolError
        assert str(got) == str(expected)

    with pytest.raises(LogClosedError):
        ship.save(6, b"six")


def test_seguro_events_page_by_page_then_follow(served: HubThread) -> None:
    with tidewire.sync.seguro_connect(served.seguro_url, "~ravmel-ropdyl", timeout=SECONDS) as ship:
        ship.save_many([(i, b"e%d" % i) for i in range(1, 8)])
        with ship.pages(2, page=3) as pages:
            assert [[i for i, _ in got] for got in pages] == [[2, 3, 4], [5, 6, 7]]
        assert list(ship.events(page=2)) == [(i, b"e%d" % i) for i in range(1, 8)]
        with pytest.raises(ValueError, match="page is at least 1"):
            ship.pages(page=0)
        # following: caught up, it READs again; a save of this very session runs between two
        # READs (one flow at a time), and the next page brings it
        followed = ship.events(6, page=4, follow=True, poll=0.01)
        assert [next(followed), next(followed)] == [(6, b"e6"), (7, b"e7")]
        ship.save(9, b"e9")
        assert next(followed) == (9, b"e9")
        followed.close()  # (ends the READs)
        ship.save(10, b"e10")  # the session goes on
        assert ship.latest == 10


def test_seguro_with_retry_reads_what_was_saved(served: HubThread) -> None:
    from tidewire.client.backoff import Retry

    with tidewire.sync.seguro_connect(served.seguro_url, "~bus", retry=Retry(attempts=3),
                                      timeout=SECONDS) as ship:  # fmt: skip
        ship.save_many([(1, b"a"), (2, b"b")])
        assert ship.read(1, 10)[0] == [(1, b"a"), (2, b"b")]
        assert ship.latest == 2
