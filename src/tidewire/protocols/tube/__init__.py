"""Tube (seed 001) over WebSocket: the sans-IO codec and connection. No asyncio, no WebSocket
library: WebSocket message payloads in, events out, payloads to send. The aiohttp adapters are
``tidewire.server.tube`` and ``tidewire.client.tube``; the bytes are in docs/protocols/tube.md."""

from .codec import (
    CODE_DEFLATE,
    CODE_PING,
    CODE_PLAIN,
    CODE_PONG,
    encode_header,
    pull_varint,
    push_varint,
    split_header,
)
from .connection import (
    Closed,
    CompressionRefused,
    Connection,
    Established,
    Event,
    Limits,
    MessageReceived,
    Ping,
    Pong,
    Role,
)

__all__ = [
    "CODE_DEFLATE",
    "CODE_PING",
    "CODE_PLAIN",
    "CODE_PONG",
    "Closed",
    "CompressionRefused",
    "Connection",
    "Established",
    "Event",
    "Limits",
    "MessageReceived",
    "Ping",
    "Pong",
    "Role",
    "encode_header",
    "pull_varint",
    "push_varint",
    "split_header",
]
