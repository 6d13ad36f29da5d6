"""A clustered :class:`~tidewire.hub.Storage` for the tests of what a gateway shows of its
cluster (``serve``'s banner, ``/metrics``, ``/api/cluster``, the dashboard) without a cluster:
:class:`MemoryStorage` (a real Storage: the hub runs on it) whose ``describe`` and ``cluster``
answer as a JetStream backend's would, with a :class:`ClusterStatus` the test chooses.
"""

from __future__ import annotations

from memory_storage import MemoryStorage
from tidewire.hub.storage import ClusterStatus, GroupStatus, ReplicaStatus

URLS = ("nats://127.0.0.1:14222", "nats://127.0.0.1:14223", "nats://127.0.0.1:14224")

N1_OFF = ReplicaStatus("n1", current=False, offline=True, lag=3, active_s=30.0)
N2_OK = ReplicaStatus("n2", current=True, offline=False, lag=0, active_s=0.2)
N3_BEHIND = ReplicaStatus("n3", current=False, offline=False, lag=7, active_s=1.5)
N3_OK = ReplicaStatus("n3", current=True, offline=False, lag=0, active_s=0.1)
TW_0 = GroupStatus("TW_0", "n1", (N2_OK, N3_BEHIND), messages=12, bytes=4096, first_seq=1,
                   last_seq=12)  # fmt: skip
TW_1 = GroupStatus("TW_1", None, (N1_OFF, N3_OK), messages=0, bytes=0, first_seq=0,
                   last_seq=0)  # fmt: skip
STATUS = ClusterStatus(name="tidewire", connected=URLS[0], servers=URLS, groups=(TW_0, TW_1),
                       at_ms=1_700_000_000_000)  # fmt: skip
"""Three servers; ``TW_0`` led by n1 with n2 current and n3 7 behind; ``TW_1`` electing a
leader, n1 offline."""


class ClusteredStorage(MemoryStorage):
    """:class:`MemoryStorage` that says it is a cluster: ``status`` (``None``: not seen yet)."""

    def __init__(self, status: ClusterStatus | None = STATUS) -> None:
        super().__init__()
        self.status = status

    def describe(self) -> str:
        return f"{','.join(URLS)} (JetStream, 2 shards, R3)"

    def cluster(self) -> ClusterStatus | None:  # type: ignore[override]
        return self.status
