"""The hub core: streams, appends, reads, and subscriptions with demand over the durable log."""

from .budget import Budget, BudgetLimits, Share
from .fairness import FairnessLimits, LoopShares, Throttle
from .hub import RESERVED_PREFIX, Hub, NotSupported, Start, StreamDeleted
from .ingest import INGEST_DEFAULTS, Ingest, IngestLimits, Pipeline, abandon
from .ledger import Ledger
from .staging import PartSink
from .storage import (
    ClusterStatus,
    EmbeddedStorage,
    GroupStatus,
    ReplicaStatus,
    Retention,
    Storage,
    StreamAdmin,
    StreamStats,
)
from .subscription import MAX_DEMAND, RecordSubscription, Subscription
from .txn import TXN_STREAM, TxnReceipt

__all__ = [
    "INGEST_DEFAULTS",
    "MAX_DEMAND",
    "RESERVED_PREFIX",
    "TXN_STREAM",
    "Budget",
    "BudgetLimits",
    "ClusterStatus",
    "EmbeddedStorage",
    "FairnessLimits",
    "GroupStatus",
    "Hub",
    "Ingest",
    "IngestLimits",
    "Ledger",
    "LoopShares",
    "NotSupported",
    "PartSink",
    "Pipeline",
    "RecordSubscription",
    "ReplicaStatus",
    "Retention",
    "Share",
    "Start",
    "Storage",
    "StreamAdmin",
    "StreamDeleted",
    "StreamStats",
    "Subscription",
    "Throttle",
    "TxnReceipt",
    "abandon",
]
