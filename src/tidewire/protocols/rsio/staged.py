"""The wire side of staged transactions (docs/protocols/rsio.md "Staged transactions").

A part (``offer`` of ``stream?format=records&txn=T&stage=P``) is described by its event
count and its fingerprint, the CRC-32C of the records sent, in order, byte for byte (writer
and hub compute it alike). A ``commit`` offer (``stream?txn=T&commit``) carries one element,
UTF-8 JSON::

    {"parts":[{"part":"3.17","count":1000,"fp":2746152935}, ...]}

naming the parts to append, in that order; each part once, counts >= 0, fp 0..2**32-1.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from crc32c import crc32c

__all__ = ["StagedPart", "encode_parts", "parse_parts", "part_fingerprint"]


@dataclass(frozen=True, slots=True)
class StagedPart:
    """A part as staged or as named by a commit: ``count`` events in ``records`` log records
    (0: not known), ``nbytes`` bytes (0: not known), fingerprint ``fp``."""

    part: str
    count: int
    nbytes: int
    fp: int
    records: int = 0


def part_fingerprint(elements: Sequence[bytes | bytearray | memoryview], fp: int = 0) -> int:
    """The fingerprint of a part made of ``elements`` (log records), continued from ``fp``."""
    for element in elements:
        fp = crc32c(element, fp)
    return fp


def encode_parts(parts: Sequence[StagedPart]) -> bytes:
    """A commit element naming ``parts``."""
    doc = {"parts": [{"part": p.part, "count": p.count, "fp": p.fp} for p in parts]}
    return json.dumps(doc, separators=(",", ":")).encode()


def parse_parts(element: bytes) -> list[StagedPart]:
    """The parts a commit element names (:class:`ValueError` for anything else)."""
    try:
        doc = json.loads(element)
        items = doc["parts"]
        if not isinstance(items, list):
            raise TypeError("parts is not a list")
        parts = [StagedPart(str(p["part"]), int(p["count"]), 0, int(p["fp"])) for p in items]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError('a commit element must be {"parts": [{"part", "count", "fp"}, ...]}: '
                         f"{exc}") from None  # fmt: skip
    if len({p.part for p in parts}) != len(parts):
        raise ValueError("a commit names each part once")
    if any(p.count < 0 or not 0 <= p.fp < 2**32 for p in parts):
        raise ValueError("a part's count is >= 0 and its fp 0..2**32-1")
    return parts
