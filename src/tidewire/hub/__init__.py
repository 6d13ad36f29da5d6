"""The hub core: streams, appends, reads, and subscriptions with demand over the durable log."""

from .hub import Hub, Start
from .subscription import MAX_DEMAND, Subscription
from .txn import TXN_STREAM, TxnReceipt

__all__ = ["MAX_DEMAND", "TXN_STREAM", "Hub", "Start", "Subscription", "TxnReceipt"]
