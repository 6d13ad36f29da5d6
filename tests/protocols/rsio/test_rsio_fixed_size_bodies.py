"""Fixed-size ``onNext`` and ``onNextPacked`` bodies are copied out of the receive buffer once
(codec ``_copy``, as ``pull_bytes`` does): whether the store is the ``bytes`` a read came in or
the ``bytearray`` joined from several reads, on either side of the 4 KiB threshold, the
decoded body is the sent one, byte for byte, as a ``bytes`` of its own (more input after it
leaves it as it was)."""

from __future__ import annotations

import os

import pytest

from tidewire.protocols.rsio.codec import Decoder, encode
from tidewire.protocols.rsio.messages import Message, OnNext, OnNextPacked


@pytest.mark.parametrize("size", [16, 4096, 4097, 65536])
@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("cut", [None, 3, -1])
def test_a_fixed_size_body_decodes_to_the_bytes_sent(size: int, packed: bool,
                                                     cut: int | None) -> None:
    body = os.urandom(size * (3 if packed else 1))
    message: Message = OnNextPacked(1, 3, body) if packed else OnNext(1, body)
    frame = bytes(encode(message, element_size=size))
    decoder = Decoder(element_size=lambda subscriber: size)
    if cut is None:  # one read: the store is that read's bytes
        decoder.feed(frame)
    else:  # two reads: the store is a bytearray joined from them
        at = cut % len(frame)
        decoder.feed(frame[:at])
        assert decoder.next_message() is None
        decoder.feed(bytearray(frame[at:]))
    got = decoder.next_message()
    assert got == message
    assert isinstance(got, OnNextPacked | OnNext)
    assert type(got.elements if isinstance(got, OnNextPacked) else got.element) is bytes
    decoder.feed(os.urandom(10))  # more input (the store grows or is replaced) ...
    assert got == message  # ... and the decoded body stays what it was
