"""The hub core: streams, appends, reads, and subscriptions with demand over the durable log."""

from .hub import Hub, Start
from .subscription import MAX_DEMAND, Subscription

__all__ = ["MAX_DEMAND", "Hub", "Start", "Subscription"]
