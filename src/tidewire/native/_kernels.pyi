"""Types of the compiled kernels (tidewire/native/_kernels.pyx); see that file."""

from tidewire.model import Batch
from tidewire.protocols.seguro.codec import SaveMany

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
def seguro_many_run(
    buf: bytes | bytearray,
    pos: int,
    max_line: int,
    max_event: int,
    seen: int,
    last: int,
    many: SaveMany,
) -> tuple[list[int], list[bytes], int, int, int]: ...
def length_prefixed_envelopes(batch: Batch) -> bytes: ...
def envelopes_to_batch(stream: str, elements: list[bytes]) -> Batch: ...
def decode_length_prefixed(body: bytes, max_elements: int = ...) -> list[bytes]: ...
def arrow_group(
    batches: list[Batch],
    ids_out: memoryview,
    stamps_out: memoryview,
    voffs_out: memoryview,
    vals_out: memoryview,
    valid_out: memoryview,
    koffs_out: memoryview,
    keys_out: memoryview,
) -> int: ...
