"""RS.io's send queue: the bytes a connection has for the peer, in order, some of them by
reference.

Small frames are joined into one ``bytearray`` (the tail); a big element (``BIG_ELEMENT`` bytes
or more) is queued as the buffer it was given, so that a writer with ``writelines`` (one
``writev``) sends it without a copy. ``pending`` counts every byte queued: the adapter compares
it with its high-water mark (the queue itself has no limit: what goes in is what the
application chose to send, under the peer's demand).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...model import Batch
from .varint import push_varint, varint_bytes

__all__ = ["BIG_ELEMENT", "SendQueue"]

BIG_ELEMENT = 16 * 1024
"""Elements this big are queued by reference (zero-copy), smaller ones are joined."""

_SMALL = [bytes((i,)) for i in range(0x80)]


class SendQueue:
    """Bytes for the peer: chunks queued by reference, then the tail (always last)."""

    __slots__ = ("_chunk_bytes", "_chunks", "tail")

    def __init__(self) -> None:
        self._chunks: list[bytes | memoryview] = []
        self._chunk_bytes = 0
        self.tail = bytearray()
        """Frames are encoded straight onto it (``codec.encode(message, size, queue.tail)``)."""

    @property
    def pending(self) -> int:
        """Bytes queued and not yet taken."""
        return self._chunk_bytes + len(self.tail)

    def __bool__(self) -> bool:
        return bool(self._chunks or self.tail)

    def write(self, data: bytes | bytearray) -> None:
        self.tail += data

    def data(self) -> bytes:
        """Everything queued, joined (empty when there is nothing)."""
        if self._chunks:
            return b"".join(self.chunks())
        data = bytes(self.tail)
        self.tail.clear()
        return data

    def chunks(self) -> list[bytes | memoryview]:
        """Everything queued, as buffers to write back to back; big elements uncopied."""
        chunks = self._chunks
        self._chunks = []
        self._chunk_bytes = 0
        if self.tail:
            chunks.append(bytes(self.tail))
            self.tail.clear()
        return chunks

    def _chunk(self, chunk: bytes | memoryview) -> None:
        if self.tail:  # the tail always follows every chunk
            self._chunks.append(bytes(self.tail))
            self._chunk_bytes += len(self.tail)
            self.tail.clear()
        self._chunks.append(chunk)
        self._chunk_bytes += chunk.nbytes if isinstance(chunk, memoryview) else len(chunk)

    def write_elements(
        self,
        prefix: bytes,
        elements: Sequence[bytes | memoryview],
        heads: Sequence[bytes] | None = None,
    ) -> None:
        """Queue one variable-size ``onNext`` frame per element: ``prefix`` (type and
        subscriber), the length, ``heads[i]`` if given, then the element, which is queued by
        reference when it is ``BIG_ELEMENT`` bytes or more."""
        small = _SMALL
        parts: list[bytes | memoryview] = []
        append = parts.append
        for i, element in enumerate(elements):
            extra = b"" if heads is None else heads[i]
            n = len(element) + len(extra)
            append(prefix)
            if n < 0x80:
                append(small[n])
            else:
                size = bytearray()
                push_varint(size, n)
                append(bytes(size))
            if extra:
                append(extra)
            if len(element) >= BIG_ELEMENT:
                self._chunk(b"".join(parts))
                self._chunk(element)
                parts.clear()
            else:
                append(element)
        if parts:
            self.tail += b"".join(parts)

    def write_element_parts(self, prefix: bytes, parts: Sequence[bytes | memoryview]) -> None:
        """Queue one variable-size ``onNext`` frame whose element is ``parts`` back to back
        (format ``B`` views or bytes, e.g. ``records.record_parts``): parts of ``BIG_ELEMENT``
        bytes or more by reference, smaller ones copied into the tail, never joined."""
        size = 0
        for part in parts:
            size += len(part)
        head = bytearray(prefix)
        push_varint(head, size)
        self.tail += head
        for part in parts:
            if len(part) >= BIG_ELEMENT:
                self._chunk(part)
            else:
                self.tail += part

    def write_envelopes(self, prefix: bytes, batch: Batch) -> None:
        """Queue one ``onNext`` frame per event of ``batch`` carrying its envelope (``id |
        timestamp | key | value``), the bytes :meth:`write_elements` gives for
        ``envelopes.envelope_parts(batch)``, in one pass (the hub's path for big values):
        each frame's head is built as one ``bytes`` and each value of ``BIG_ELEMENT`` bytes or
        more is queued as a view of ``batch.values`` (never copied), a smaller one joined."""
        varint = varint_bytes
        values = batch.values
        offsets = batch.value_offsets.tolist()
        base = offsets[0]
        keys = batch.has_keys
        key_of = batch.key
        chunks = self._chunks
        parts: list[bytes | memoryview] = []
        append = parts.append
        last_ts: int | None = None
        ts_key = b""
        for i, (event_id, ts) in enumerate(zip(batch.ids.tolist(), batch.timestamps.tolist(),
                                               strict=True)):  # fmt: skip
            if ts != last_ts:  # (timestamps repeat within a batch: one varint per change)
                last_ts, ts_key = ts, varint((ts << 1) ^ (ts >> 63)) + b"\x00"
            if keys and (key := key_of(i)) is not None:
                head = varint(event_id) + ts_key[:-1] + varint(len(key) + 1) + key
            else:
                head = varint(event_id) + ts_key
            start, end = offsets[i] - base, offsets[i + 1] - base
            n = end - start
            append(prefix + varint(len(head) + n) + head)
            if n >= BIG_ELEMENT:
                frame_head = b"".join(parts) if len(parts) > 1 else parts[0]
                parts.clear()
                if self.tail:  # (the tail always follows every chunk)
                    chunks.append(bytes(self.tail))
                    self._chunk_bytes += len(self.tail)
                    self.tail.clear()
                chunks.append(frame_head)
                chunks.append(values[start:end])
                self._chunk_bytes += len(frame_head) + n
            else:
                append(values[start:end])
        if parts:
            self.tail += b"".join(parts)
