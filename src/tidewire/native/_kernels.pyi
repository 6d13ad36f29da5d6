"""Types of the compiled kernels (tidewire/native/_kernels.pyx); see that file."""

from tidewire.model import Batch

def envelope_frames(subscriber: int, batch: Batch) -> bytes: ...
def envelope_frames_batch(
    stream: str,
    buf: bytes | bytearray,
    pos: int,
    prefix: bytes,
    max_count: int,
    limit: int,
    offer: bool,
) -> tuple[Batch | None, int, int]: ...
def max_timestamp(stamps: memoryview) -> int: ...
def id_range(first: int, n: int) -> bytes: ...
