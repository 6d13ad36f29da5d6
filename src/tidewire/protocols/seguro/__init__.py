"""Seguro (seed 004): the per-identity event-log protocol, sans-IO. See docs/protocols/seguro.md.
``codec``: the wire, its limits and events; ``session``: the hub's side; ``ship``: a ship's."""

from .codec import (
    Breach,
    Committed,
    CommittedMany,
    Event,
    Hello,
    Identify,
    Latest,
    Limits,
    ManyEvent,
    ManyEvents,
    Point,
    Read,
    Refused,
    Save,
    SaveMany,
    Seguro,
    Sent,
    StreamedMany,
    Welcome,
)
from .patp import InvalidPatp, rank, validate_patp
from .session import ServerSession
from .ship import ClientSession

__all__ = [
    "Breach",
    "ClientSession",
    "Committed",
    "CommittedMany",
    "Event",
    "Hello",
    "Identify",
    "InvalidPatp",
    "Latest",
    "Limits",
    "ManyEvent",
    "ManyEvents",
    "Point",
    "Read",
    "Refused",
    "Save",
    "SaveMany",
    "Seguro",
    "Sent",
    "ServerSession",
    "StreamedMany",
    "Welcome",
    "rank",
    "validate_patp",
]
