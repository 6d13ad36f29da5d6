"""Receiving a big frame in place: the part of :class:`~.connection.Connection`'s machine
contract that lets an adapter read the begun frame's missing bytes straight into the receive
buffer's store (:meth:`~tidewire.protocols.buffer.ReceiveBuffer.reserve`), instead of into a
read buffer of its own that the receive buffer then copies from. Pure: the adapter does the
reading (a ``BufferedProtocol``'s ``get_buffer`` / ``buffer_updated``).

A mixin, so the connection's module stays within its size; it only forwards to the decoder.
"""

from __future__ import annotations

from .codec import Decoder

__all__ = ["ReceiveInPlace"]


class ReceiveInPlace:
    """:meth:`reserve` then :meth:`filled`, as an alternative to ``receive_data`` for one read.

    Contract: :meth:`reserve` returns ``None`` unless a begun frame of at least ``min_bytes``
    awaits bytes (its head decoded, its body declared and not all buffered: after
    ``next_event`` has returned ``None``) and the connection is not closed; otherwise a
    writable view, valid until :meth:`filled` (call it before any other method, with the
    number of bytes written at the view's start, 0 included). The bytes then count as
    received exactly as if ``receive_data`` had been given them."""

    _decoder: Decoder
    _eof: bool

    @property
    def closed(self) -> bool:  # (the connection's own)
        raise NotImplementedError

    def reserve(self, min_bytes: int, ahead: int = 0) -> memoryview | None:
        """A view to read into, or ``None`` (then read as usual and call ``receive_data``);
        it has room for up to ``ahead`` bytes past the frame (the next frame's beginning)."""
        if self._eof or self.closed:
            return None
        return self._decoder.reserve(min_bytes, ahead)

    def filled(self, nbytes: int) -> None:
        """``nbytes`` were written at the start of the view :meth:`reserve` gave."""
        self._decoder.filled(nbytes)
