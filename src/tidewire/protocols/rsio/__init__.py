"""RS.io over a byte stream (seed 000): the sans-IO codec (this release) and, next, the
connection state machine. No asyncio here: bytes in, messages out, bytes to send."""

from .codec import Decoder, Limits, SubscriptionProtocolError, encode
from .messages import (
    PROTOCOL_VERSION,
    Cancel,
    ClientHello,
    Goodbye,
    Message,
    MessageType,
    OnComplete,
    OnError,
    OnNext,
    OnNextPacked,
    Request,
    ServerHello,
    Subscribe,
    Subscribed,
)

__all__ = [
    "PROTOCOL_VERSION",
    "Cancel",
    "ClientHello",
    "Decoder",
    "Goodbye",
    "Limits",
    "Message",
    "MessageType",
    "OnComplete",
    "OnError",
    "OnNext",
    "OnNextPacked",
    "Request",
    "ServerHello",
    "Subscribe",
    "Subscribed",
    "SubscriptionProtocolError",
    "encode",
]
