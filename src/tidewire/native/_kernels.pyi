"""Types of the compiled kernels (tidewire/native/_kernels.pyx); see that file."""

import uuid
from collections.abc import Sequence
from typing import TypeVar

from tidewire.model import Batch
from tidewire.protocols.seguro.codec import SaveMany
from tidewire.protocols.tolliver.codec import Message
from tidewire.tolliver.inbox import Delivery

_L = TypeVar("_L")

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

class Reassembly:
    capacity: int
    size: int
    def __init__(self, capacity: int) -> None: ...
    @property
    def held(self) -> int: ...
    def put(self, data: bytes | memoryview) -> None: ...
    def finish(self) -> bytes: ...
def tolliver_take_run(
    buf: bytes | bytearray,
    pos: int,
    max_name: int,
    max_body: int,
    names: dict[bytes, str],
    skip_channel: str,
    messages: list[Message],
    acks: list[int],
    message_type: type[Message],
) -> tuple[int, int]: ...
def tolliver_ack_frames(message_ids: Sequence[int]) -> bytes: ...
def tolliver_message_frames(
    channel: bytes, items: Sequence[tuple[bytes, bytes, int]]
) -> list[bytes]: ...
def tolliver_value_frames(
    channel: bytes, values: memoryview, offsets: memoryview, first_id: int
) -> list[bytes]: ...
def tolliver_deliveries(
    delivery_type: type[Delivery], sender: uuid.UUID, messages: list[Message], link: _L
) -> list[tuple[Delivery, _L]]: ...
def encode_run(
    items: list[tuple[Batch, int | None]],
) -> tuple[bytearray, Batch, list[Batch], int, int, int, int]: ...
def encode_group_runs(
    items: list[tuple[Batch, int | None]], limit: int, max_events: int
) -> tuple[list[tuple[bytearray, Batch, int, int, int, int]], list[Batch]]: ...
def owned_valid(batch: Batch) -> Batch: ...
def count_length_prefixed(body: bytes | bytearray, max_elements: int = ...) -> int: ...
def length_prefixed_envelopes_batch(
    stream: str, body: bytes | bytearray, skip: int = ...
) -> Batch: ...
def body_buffer(size: int) -> bytearray: ...
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
