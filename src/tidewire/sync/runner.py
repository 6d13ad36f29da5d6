"""``tidewire.sync``'s event-loop thread: one daemon thread, ``tidewire-sync``, started on
first use, runs one asyncio loop; :meth:`Runner.call` hands it a coroutine and waits for the
outcome in the caller's thread (the very exception object the coroutine raised, re-raised).
:class:`Bound` is what every blocking client shares: the loop its asyncio client lives on,
blocking calls there, and closing (explicitly, when dropped, at exit). The rules it keeps are
in the package's docstring (``tidewire/sync/__init__.py``).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import os
import threading
import weakref
from collections.abc import Awaitable, Coroutine
from typing import Any, Generic, TypeVar

from ..model import LogClosedError, TidewireError

__all__ = [
    "CLOSE_SECONDS",
    "RUNNER",
    "UNWIND_SECONDS",
    "Bound",
    "LoopThreadError",
    "Runner",
    "Running",
    "close_later",
    "opened",
    "quietly",
    "run",
    "wait",
]

T = TypeVar("T")

CLOSE_SECONDS = 10.0
"""The most closing one client (or, at exit, all of them together) waits."""

UNWIND_SECONDS = 5.0
"""The most a call that timed out (or was interrupted) waits for its cancelled task to finish
unwinding on the loop (a subscription's ``Cancel``, an offer's end) before it raises."""


class LoopThreadError(TidewireError, RuntimeError):
    """A blocking call was made on ``tidewire.sync``'s own event-loop thread (a callback or a
    coroutine run by :func:`run`), where it would wait for itself for ever: ``await`` the
    asyncio client (``hub.client``) there instead."""


# --------------------------------------------------------------------------- the loop thread


class Running(Generic[T]):
    """One coroutine run as a task on the loop for a thread that waits for it: what
    ``asyncio.run_coroutine_threadsafe`` does, plus :attr:`ended`, set once the task has
    finished (also after a cancel), so that a caller that gave up can wait for the unwinding."""

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> None:
        self.outcome: concurrent.futures.Future[T] = concurrent.futures.Future()
        self.ended = threading.Event()
        self._loop = loop
        self._task: asyncio.Task[T] | None = None
        loop.call_soon_threadsafe(self._start, coro)

    def _start(self, coro: Coroutine[Any, Any, T]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(self._finished)

    def _finished(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.outcome.cancel()
        elif (exc := task.exception()) is not None:
            self.outcome.set_exception(exc)  # the object itself: the caller re-raises it
        else:
            self.outcome.set_result(task.result())
        self.ended.set()

    def cancel(self) -> None:
        """Cancel the task (callbacks run in order: after :meth:`_start`)."""
        with contextlib.suppress(RuntimeError):  # (the loop closed: nothing runs any more)
            self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def stop(self) -> None:
        """On the loop: cancel the task (if still running) and wait for its end."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait([task])


class Runner:
    """The one background loop: started on first use, started again in a forked child,
    stopped at exit after closing every open client."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._shut = False
        self.clients: weakref.WeakSet[Bound] = weakref.WeakSet()  # the open ones
        self.tasks: set[asyncio.Task[None]] = set()  # abandoned iterators' acloses

    def on_loop_thread(self) -> bool:
        thread = self._thread
        return (thread is not None and self._pid == os.getpid()
                and thread.ident == threading.get_ident())  # fmt: skip

    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (started if there is none in this process)."""
        if self.on_loop_thread():
            raise LoopThreadError("a blocking tidewire.sync call on its own event-loop thread "
                                  "would deadlock: await the asyncio client there")  # fmt: skip
        with self._lock:
            if self._shut:
                raise LogClosedError("tidewire.sync is shut down (the interpreter is exiting)")
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                started = threading.Event()
                thread = threading.Thread(target=_serve, args=(loop, started),
                                          name="tidewire-sync", daemon=True)  # fmt: skip
                self._thread, self._pid = thread, os.getpid()
                thread.start()
                started.wait()
                self._loop = loop
            return self._loop

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None,
             loop: asyncio.AbstractEventLoop | None = None) -> T:  # fmt: skip
        """Run ``coro`` on the loop and return its result (or raise its exception); after
        ``timeout`` seconds (``None``: no bound) cancel it and raise ``TimeoutError``.
        ``loop``: the loop the coroutine's client lives on (it must still be the one)."""
        return wait(self.start(coro, loop), timeout)

    def start(self, coro: Coroutine[Any, Any, T],
              loop: asyncio.AbstractEventLoop | None = None) -> Running[T]:  # fmt: skip
        """Start ``coro`` on the loop (:func:`wait` then waits for it)."""
        try:
            current = self.loop()
            if loop is not None and loop is not current:
                raise LogClosedError("this client's event loop is gone (it was opened before "
                                     "a fork, or before an exit began): connect again")  # fmt: skip
        except BaseException:
            coro.close()  # (never awaited: say nothing about it)
            raise
        return Running(current, coro)

    def forked(self) -> None:
        """In a forked child: the loop thread did not come along; start afresh on first use
        (the parent's clients are not this process's to use or close)."""
        self._lock = threading.Lock()
        self._loop, self._thread, self._pid = None, None, 0
        self.clients = weakref.WeakSet()
        self.tasks = set()

    def shutdown(self) -> None:
        """At exit: close every open client (together, within :data:`CLOSE_SECONDS`), then
        stop the loop and its thread."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._shut = True
            if loop is None or thread is None or self._pid != os.getpid():
                return
        closing = [c for c in (client.detach() for client in list(self.clients)) if c]
        if closing:
            with contextlib.suppress(Exception):
                gather = _close_all(closing)
                Running(loop, gather).outcome.result(CLOSE_SECONDS)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(loop.stop)
        thread.join(CLOSE_SECONDS)


def wait(running: Running[T], timeout: float | None) -> T:
    """The outcome of ``running`` (its result, or its very exception raised again); after
    ``timeout`` seconds (``None``: no bound), or if the wait is interrupted (Ctrl-C), cancel
    it, give it up to :data:`UNWIND_SECONDS` to unwind, and raise ``TimeoutError`` (or what
    interrupted the wait)."""
    try:
        return running.outcome.result(timeout)
    except BaseException as exc:
        if running.outcome.done():
            raise  # the coroutine's own outcome (a TimeoutError of its own included)
        running.cancel()
        running.ended.wait(UNWIND_SECONDS)
        if isinstance(exc, TimeoutError):
            raise TimeoutError(f"no answer within {timeout} s (the call was cancelled)"
                               ) from None  # fmt: skip
        raise


def _serve(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    """The loop thread: run until stopped, then end what is left and close the loop."""
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    try:
        loop.run_forever()
    finally:
        try:
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            loop.close()


async def _close_all(clients: list[Any]) -> None:
    await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


RUNNER = Runner()
atexit.register(RUNNER.shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=RUNNER.forked)


def run(coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
    """Run any coroutine on ``tidewire.sync``'s loop and return its result (what the blocking
    calls do): for an asyncio API this module does not wrap, e.g. ``run(hub.client.
    publisher("orders"))``, whose objects then live on that loop. ``timeout`` cancels it."""
    return RUNNER.call(coro, timeout)


async def opened(opening: Awaitable[T]) -> T:
    return await opening


def close_later(loop: asyncio.AbstractEventLoop, pid: int, client: Any) -> None:
    """A client dropped unclosed: close it on the loop (without waiting: the garbage collector
    may run this on any thread, the loop's included)."""
    if pid == os.getpid() and not loop.is_closed():
        with contextlib.suppress(RuntimeError):  # (the loop closed meanwhile)
            loop.call_soon_threadsafe(_spawn, client.close)


def _spawn(close: Any) -> None:
    """On the loop: run ``close()`` as a task, kept until it is done."""
    task = asyncio.get_running_loop().create_task(quietly(close()))
    RUNNER.tasks.add(task)
    task.add_done_callback(RUNNER.tasks.discard)


async def quietly(awaitable: Awaitable[Any]) -> None:
    with contextlib.suppress(Exception):  # (a connection that already failed: nothing to do)
        await awaitable


# --------------------------------------------------------------------------- clients


class Bound:
    """What :class:`SyncHub` and :class:`SyncSeguro` share: the loop their asyncio client lives
    on, blocking calls on it, and closing (by :meth:`close`, when dropped, or at exit)."""

    def __init__(self, client: Any, loop: asyncio.AbstractEventLoop,
                 timeout: float | None) -> None:  # fmt: skip
        self._client = client
        self.loop = loop
        self.pid = os.getpid()
        self._closed = False
        self.timeout = timeout
        self._finalizer = weakref.finalize(self, close_later, loop, self.pid, client)
        self._finalizer.atexit = False  # (at exit the runner closes the live ones, waiting)
        RUNNER.clients.add(self)

    @property
    def closed(self) -> bool:
        """Closed by :meth:`close` (or at exit)."""
        return self._closed

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None, *,
             default: bool = True) -> T:  # fmt: skip
        """Run ``coro`` (e.g. one of :attr:`client`'s) on the loop this client lives on and
        return its outcome; ``timeout`` ``None``: this client's default bound (with
        ``default=False``: no bound). :class:`~tidewire.model.LogClosedError` once closed."""
        running = self.start(coro)
        return wait(running, self.timeout if timeout is None and default else timeout)

    def start(self, coro: Coroutine[Any, Any, T]) -> Running[T]:
        """Start ``coro`` on this client's loop without waiting (:func:`wait` waits)."""
        if self._closed or self.pid != os.getpid():
            coro.close()
            raise LogClosedError("this client is closed" if self._closed else
                                 "this client belongs to the process that opened it "
                                 "(before a fork): connect again in this one")  # fmt: skip
        return RUNNER.start(coro, self.loop)

    def detach(self) -> Any:
        """Mark closed and return the asyncio client to close (``None`` if closed already,
        or opened in another process: not ours to close)."""
        if self._finalizer.detach() is None:
            return None
        self._closed = True
        RUNNER.clients.discard(self)
        return self._client if self.pid == os.getpid() else None

    def close(self) -> None:
        """Close the connection (waits up to :data:`CLOSE_SECONDS`); idempotent."""
        client = self.detach()
        if client is not None:
            with contextlib.suppress(LogClosedError):  # (the loop is gone: so is the socket)
                RUNNER.call(client.close(), CLOSE_SECONDS, self.loop)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
