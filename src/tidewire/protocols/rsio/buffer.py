"""RS.io's receive buffer: bytes received from the peer and not yet parsed.

One growing ``bytearray`` and a read position: parsers read ``data`` from ``pos`` on and call
:meth:`ReceiveBuffer.advance` past what they have parsed, so a frame cut short is never
half-consumed (the next attempt starts again at ``pos``); :meth:`ReceiveBuffer.compact` drops
parsed bytes when the parser waits for more (not after every frame: that would copy the rest
each time). Frame-run decoders (:mod:`.runs`) read it through the same interface.

This is the shape of the project-wide receive buffer of issue 19 (the machine contract); it is
kept small and on its own so that it can be swapped for the shared one.
"""

from __future__ import annotations

__all__ = ["ReceiveBuffer"]


class ReceiveBuffer:
    """Bytes received, a read position into them, and nothing else (bounds are the parser's
    business: it knows the frame it is waiting for)."""

    __slots__ = ("_data", "_pos")

    def __init__(self) -> None:
        self._data = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Append bytes received from the peer."""
        self._data += data

    @property
    def data(self) -> bytearray:
        """Every byte kept; the unparsed ones start at :attr:`pos`. Read it, never write it
        (it is the buffer itself, handed out so that parsers index it without a copy)."""
        return self._data

    @property
    def pos(self) -> int:
        """Where the unparsed bytes start in :attr:`data`."""
        return self._pos

    @property
    def buffered(self) -> int:
        """Bytes received and not yet parsed."""
        return len(self._data) - self._pos

    def __len__(self) -> int:
        return len(self._data) - self._pos

    def advance(self, end: int) -> None:
        """Mark ``data[:end]`` parsed (``pos <= end <= len(data)``)."""
        if not self._pos <= end <= len(self._data):
            raise ValueError(f"advance to {end} outside {self._pos}..{len(self._data)}")
        self._pos = end

    def compact(self) -> int:
        """Drop the parsed bytes (``pos`` becomes 0); returns how many were dropped."""
        dropped = self._pos
        if dropped:
            del self._data[:dropped]
            self._pos = 0
        return dropped
