"""What an acknowledgement means in cluster mode (docs/cluster.md "Acknowledged"), observed
rather than assumed: every append a gateway acknowledges was fsynced on at least two of the
three nodes (a quorum) before the acknowledgement, and survives every node being SIGKILLed at
once right after it.

The fsyncs are watched with ``strace -f -tt -e trace=fsync,fdatasync`` attached to each node
(./tw test installs Debian's strace): for the i-th acknowledged append, at least two nodes must
have completed at least i successful fsyncs before the append returned. (Without
``sync_interval: always`` nats-server syncs every two minutes: no fsync would be seen at all.)
"""

from __future__ import annotations

import datetime
import re
import subprocess
import time
from collections.abc import Callable

from helpers import run
from tidewire.cluster.jetstream import JetStreamStorage
from tidewire.cluster.local import LocalCluster
from tidewire.model import Batch

APPENDS = 40
FSYNC = re.compile(r"^(?:\[pid\s+\d+\]\s+)?(\d\d):(\d\d):(\d\d\.\d+) f(?:data)?sync\(\d+\)\s+= 0")


def fsync_times(trace: str) -> list[float]:
    """The wall-clock times (s since the epoch) of the successful fsyncs in ``trace``."""
    midnight = datetime.datetime.combine(datetime.date.today(), datetime.time()).timestamp()
    return sorted(midnight + int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
                  for line in trace.splitlines() if (m := FSYNC.search(line)))  # fmt: skip


def test_an_ack_means_fsynced_on_a_quorum_first(own_cluster: Callable[[int], LocalCluster]) -> None:
    cluster = own_cluster(3)
    acked: list[float] = []

    async def append(count: int) -> None:
        storage = await JetStreamStorage.connect(cluster.urls)
        try:
            for i in range(count):
                await storage.append(Batch.build("durable", [b"e%d" % i]), assign_ids=True)
                acked.append(time.time())
        finally:
            await storage.close()

    run(append(1), 60)  # (the group exists, its leader is elected)
    acked.clear()
    tracers = [subprocess.Popen(
        ["strace", "-f", "-tt", "-e", "trace=fsync,fdatasync", "-p", str(node.pid)],
        stderr=subprocess.PIPE, text=True) for node in cluster.nodes]  # fmt: skip
    try:
        time.sleep(1.0)  # (strace attaches to every thread of the node)
        run(append(APPENDS), 60)
    finally:
        for tracer in tracers:
            tracer.terminate()
        traces = [tracer.communicate(timeout=30)[1] for tracer in tracers]
    assert len(acked) == APPENDS
    per_node = [fsync_times(trace) for trace in traces]
    for i, at in enumerate(acked, start=1):
        done = sorted(sum(1 for t in times if t < at) for times in per_node)
        assert done[-2] >= i, f"append {i} acked with fsyncs done per node {done}"
