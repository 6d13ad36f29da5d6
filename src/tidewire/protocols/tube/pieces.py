"""The pieces a Tube connection (:mod:`.connection`) puts messages together and apart with:
a deflated message inflated a slice at a time (:class:`Inflation`), a payload cut into fragments
across the chunks it was given (:class:`Cursor`), and a message of several fragments put back
together (:class:`Reassembly`). Pure: no asyncio, no socket, no clock."""

from __future__ import annotations

import zlib

from ...model import RemoteProtocolError
from ...native import kernel

__all__ = ["Cursor", "Inflation", "Reassembly", "ReassemblyPy", "TooBig", "size_of"]


class TooBig(RemoteProtocolError):
    """The peer sent more than a limit allows (WebSocket close 1009)."""


class Inflation:
    """A deflated message waiting in the event queue: inflated a slice per step."""

    __slots__ = ("inflated", "inflater", "tail")

    def __init__(self, payload: bytes) -> None:
        self.inflater = zlib.decompressobj()
        self.tail = payload  # compressed bytes not yet given to the inflater
        self.inflated = 0

    @property
    def pending(self) -> int:
        """Compressed bytes still held."""
        return len(self.tail)

    def step(self, limit: int, slice_bytes: int) -> tuple[bytes, bool]:
        """The next at most ``slice_bytes`` inflated bytes and whether they are the last;
        :class:`TooBig` past ``limit`` in all, :class:`RemoteProtocolError` when the bytes do
        not inflate or end early."""
        inflater = self.inflater
        try:  # (max_length: never more than a slice, whatever the ratio)
            part = inflater.decompress(self.tail, min(slice_bytes, limit - self.inflated + 1))
        except zlib.error as exc:
            raise RemoteProtocolError(f"a deflated message that does not inflate: {exc}") from None
        self.tail = inflater.unconsumed_tail
        self.inflated += len(part)
        if self.inflated > limit:
            raise TooBig(f"a deflated message inflating over {limit} bytes")
        if inflater.eof:
            self.tail = b""
            return part, True
        if not part and not self.tail:  # (all the input taken, no output, no end)
            raise RemoteProtocolError("a deflated message cut short")
        return part, False


def size_of(message: bytes | memoryview | tuple[bytes | memoryview, ...]) -> int:
    if isinstance(message, tuple):
        return sum(part.nbytes if isinstance(part, memoryview) else len(part) for part in message)
    return message.nbytes if isinstance(message, memoryview) else len(message)


class Cursor:
    """Reads a sequence of byte views front to back in pieces: a piece within one view is a
    view of it; a piece across views is joined (bytes)."""

    __slots__ = ("_i", "_pos", "_views", "left")

    def __init__(self, views: list[memoryview]) -> None:
        self._views = views
        self._i = 0
        self._pos = 0
        self.left = sum(v.nbytes for v in views)

    def take(self, n: int) -> bytes | memoryview:
        """The next ``n`` bytes (fewer at the end)."""
        n = min(n, self.left)
        self.left -= n
        pieces: list[memoryview] = []
        while n:
            view = self._views[self._i]
            piece = view[self._pos : self._pos + n]
            pieces.append(piece)
            n -= piece.nbytes
            self._pos += piece.nbytes
            if self._pos == view.nbytes:
                self._i += 1
                self._pos = 0
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)


class ReassemblyPy:
    """A message's fragments put back together, in order, as one new ``bytes`` (the
    specification of :data:`Reassembly`, and the fallback): each fragment is kept as it came and
    they are joined once, at :meth:`finish`. ``capacity``: the most bytes it takes in all (a
    :meth:`put` past it raises ``ValueError`` and takes nothing); :attr:`held` is the memory it
    holds, here the fragments' bytes. After :meth:`finish` it is spent (``ValueError``)."""

    __slots__ = ("_parts", "capacity", "size")

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError("a reassembly's capacity is at least 0")
        self._parts: list[bytes | memoryview] | None = []
        self.capacity = capacity
        self.size = 0  # bytes put so far

    @property
    def held(self) -> int:
        """The bytes this holds (the compiled one: its whole buffer, from the start)."""
        return self.size

    def put(self, data: bytes | memoryview) -> None:
        """Append ``data`` (kept, not copied: it must not change until :meth:`finish`)."""
        if self._parts is None:
            raise ValueError("the reassembly is finished")
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if n > self.capacity - self.size:
            raise ValueError(f"{self.size + n} bytes, past the reassembly's {self.capacity}")
        self._parts.append(data)
        self.size += n

    def finish(self) -> bytes:
        """Everything put, as one ``bytes``."""
        if self._parts is None:
            raise ValueError("the reassembly is finished")
        parts, self._parts = self._parts, None
        return b"".join(parts)


# The compiled one (``_tube.pxi``) allocates its ``bytes`` of ``capacity`` bytes at once and copies
# each fragment into it as it comes (while it is in the cache), then shrinks it in place: one
# copy as the join's, but the message's buffer is allocated before its fragments, not after all
# of them, so a receiver's peak is the buffer plus one fragment, not every fragment plus the
# join; on glibc that spared the page faults of a fresh 1 MiB per message (docs/protocols/tube.md,
# "Sending and receiving"). Its ``held`` is its capacity: a side that preallocates must trust its
# peer's declared sizes (``Limits.prealloc_bytes``).
Reassembly = kernel("Reassembly", ReassemblyPy)
"""The compiled reassembly when built (``tidewire.native``), else :class:`ReassemblyPy`."""
