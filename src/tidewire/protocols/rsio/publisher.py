"""The names and element formats of RS.io publishers, as one import (kept for callers of the
former ``publisher`` module): the grammars are in :mod:`.names`, the envelope codecs in
:mod:`.envelopes`, the frame runs in :mod:`.runs`. New code imports from those."""

from __future__ import annotations

from .envelopes import (
    decode_envelope,
    decode_envelopes,
    encode_envelopes,
    envelope_parts,
    envelopes_to_batch,
    fixed_size_values,
)
from .names import Format, OfferName, PublisherName, PublisherNameError
from .runs import envelope_frames, envelope_run_decoder

__all__ = [
    "Format",
    "OfferName",
    "PublisherName",
    "PublisherNameError",
    "decode_envelope",
    "decode_envelopes",
    "encode_envelopes",
    "envelope_frames",
    "envelope_parts",
    "envelope_run_decoder",
    "envelopes_to_batch",
    "fixed_size_values",
]
