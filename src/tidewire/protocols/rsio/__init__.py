"""RS.io over a byte stream (seed 000): the sans-IO codec and connection state machine.
No asyncio here: bytes in, events out, bytes to send."""

from .codec import Decoder, Limits, SubscriptionProtocolError, encode
from .connection import (
    Connection,
    ConnectionClosed,
    Event,
    HandshakeCompleted,
    Role,
    SubscriptionErrored,
)
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
    "Connection",
    "ConnectionClosed",
    "Decoder",
    "Event",
    "Goodbye",
    "HandshakeCompleted",
    "Limits",
    "Message",
    "MessageType",
    "OnComplete",
    "OnError",
    "OnNext",
    "OnNextPacked",
    "Request",
    "Role",
    "ServerHello",
    "Subscribe",
    "Subscribed",
    "SubscriptionErrored",
    "SubscriptionProtocolError",
    "encode",
]
