"""RS.io over HTTP (seed 002): the sans-IO parts, no HTTP library and no asyncio: the query's
``request`` argument, the batched bodies, and each side's subscription state (demand, resend,
de-duplication). The aiohttp adapters are ``tidewire.server.rsio_http`` and
``tidewire.client.http``; every request and response is in docs/protocols/rsio-http.md."""

from .codec import (
    ERROR_HEADER,
    FIXED_SIZE,
    LENGTH_PREFIXED,
    MAX_DEMAND,
    SEQUENCE_HEADER,
    BadRequest,
    decode_body,
    decode_fixed_size,
    decode_length_prefixed,
    encode_fixed_size,
    encode_length_prefixed,
    length_prefixed_envelopes,
    length_prefixed_envelopes_py,
    length_prefixed_values,
    parse_count,
    split_query,
)
from .state import ClientSubscription, Delivery, ServerSubscription, State

__all__ = [
    "ERROR_HEADER",
    "FIXED_SIZE",
    "LENGTH_PREFIXED",
    "MAX_DEMAND",
    "SEQUENCE_HEADER",
    "BadRequest",
    "ClientSubscription",
    "Delivery",
    "ServerSubscription",
    "State",
    "decode_body",
    "decode_fixed_size",
    "decode_length_prefixed",
    "encode_fixed_size",
    "encode_length_prefixed",
    "length_prefixed_envelopes",
    "length_prefixed_envelopes_py",
    "length_prefixed_values",
    "parse_count",
    "split_query",
]
