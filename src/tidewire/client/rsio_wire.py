"""The RS.io client's TCP carrier: an ``asyncio.BufferedProtocol`` that reads straight into one
reused buffer and hands each read to the client in the same callback.

Why not ``asyncio.open_connection``: a ``StreamReader`` receives every read as a new ``bytes``
(a fresh allocation: glibc maps a 256 KiB block anew and page-faults it on every read), copies
it into its own ``bytearray``, and ``read()`` copies it out again and shifts the rest down, all
before the sans-IO connection copies what it keeps. Here the loop's ``recv_into`` fills
:attr:`WireProtocol.buffer` (allocated once per connection), the connection's receive buffer
copies from it what it keeps (``receive_data`` takes a bytes-like; it never holds the view past
the call), and no task hop separates a read from its decoding (the reader task and its
``await`` per read go too).

Contract for :meth:`WireProtocol.attach`'s ``sink``: it is called with a ``memoryview`` into
the reused buffer (valid only during the call: copy what you keep) and ``b""`` at the peer's
EOF; ``lost(exc)`` once, when the connection is gone. Reading is paused until a sink is
attached, so the hub's first bytes wait in the kernel, not in memory (but for one read that
was already under way, kept and handed over at ``attach``). Writing is the
``ByteWriter`` of :mod:`.rsio_common`: ``write``, ``drain`` (waits while the transport's buffer
is over its high-water mark), ``close``, ``wait_closed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, cast

__all__ = ["READ_BYTES", "Sink", "WireProtocol"]

READ_BYTES = 1024 * 1024
"""The reused receive buffer's size: the most one read hands over. Allocated once per
connection. 1 MiB, not uvloop's 256 KiB: a ``format=records`` element is a whole log record
(1.3 MB for 10,000 events of 100 B), and in four times fewer reads a Spark executor's read
took about a quarter less CPU per row (134-157 -> 100-119 ns, three alternated scratch
rounds, docs/spark.md); a read of a few bytes still hands over only those."""

Sink = Callable[[memoryview | bytes], None]


class WireProtocol(asyncio.BufferedProtocol):
    """One TCP (or TLS) connection of the client: reads pushed to a sink, writes with drain."""

    def __init__(self, read_bytes: int = READ_BYTES) -> None:
        if read_bytes < 1:
            raise ValueError("read_bytes must be at least 1")
        self.buffer = bytearray(read_bytes)
        self._view = memoryview(self.buffer)
        self.transport: asyncio.Transport | None = None
        self._sink: Sink | None = None
        self._lost: Callable[[Exception | None], None] | None = None
        self._gone: Exception | None = None
        self._closed = False
        self._early = bytearray()  # read before attach() (see buffer_updated)
        self._eof = False  # EOF before attach()
        self._paused = False
        self._drained: asyncio.Future[None] | None = None
        self._done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # ------------------------------------------------------------------ the client's side

    def attach(self, sink: Sink, lost: Callable[[Exception | None], None]) -> None:
        """Start reading: each read goes to ``sink``; ``lost`` is called once at the end (at
        once if the connection is already gone)."""
        self._sink, self._lost = sink, lost
        if self._early:
            early, self._early = self._early, bytearray()
            sink(memoryview(early))
        if self._eof:
            sink(b"")
        if self._closed:
            lost(self._gone)
        elif self.transport is not None:
            self.transport.resume_reading()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def writelines(self, chunks: Sequence[bytes | bytearray | memoryview]) -> None:
        """All of ``chunks`` in one ``writev`` (uvloop), none of them joined first."""
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(chunks)

    async def drain(self) -> None:
        """Wait while the transport holds more than its high-water mark; raise
        ``ConnectionResetError`` once the connection is lost."""
        if self._closed:
            raise ConnectionResetError("connection lost")
        if not self._paused:
            return
        if self._drained is None or self._drained.done():
            self._drained = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._drained)
        if self._closed:
            raise ConnectionResetError("connection lost")

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._done)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default if self.transport is None else self.transport.get_extra_info(name, default)

    # ------------------------------------------------------------------ asyncio.BufferedProtocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        if self._sink is None:
            self.transport.pause_reading()  # until attach()

    def get_buffer(self, sizehint: int) -> memoryview:
        # (the same buffer every time: the sink copies what it keeps before the next read)
        return self._view

    def buffer_updated(self, nbytes: int) -> None:
        sink = self._sink
        if sink is None:
            # A read already under way when connection_made paused reading (uvloop): kept
            # (one read at most, as reading is paused) until attach() hands it over.
            self._early += self._view[:nbytes]
            return
        sink(self._view[:nbytes])

    def eof_received(self) -> bool | None:
        if self._sink is not None:
            self._sink(b"")
        else:
            self._eof = True
        return None  # the transport closes itself

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed = True
        self._gone = exc
        self._wake()
        if not self._done.done():
            self._done.set_result(None)
        if self._lost is not None:
            lost, self._lost = self._lost, None
            lost(exc)

    def _wake(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)
