"""Synchronous clients for scripts and notebooks: ``with tidewire.sync.connect(url) as hub``.

Strategy: not a second implementation of the protocols but a blocking face on the asyncio
clients. One daemon thread, ``tidewire-sync``, started on first use, runs one event loop; every
:class:`SyncHub` and :class:`SyncSeguro` holds an asyncio client that lives on that loop, and
each blocking call hands the loop one coroutine and waits for its outcome. What users rely on
stays the asyncio clients' own: demand and backpressure, the exactly-once publisher's resends,
reconnects (``retry=``) and gateway failover; and the exception a call raises is the very
object the asyncio client raised (``RsioError``, ``ConnectionLost``, ``Unauthenticated``,
``SeguroError``, ...), re-raised in the caller's thread.

Why a thread of our own rather than ``loop.run_until_complete`` in the caller's thread (what
``spark/hubs.py`` does): a notebook cell runs inside Jupyter's event loop, where
``asyncio.run`` and another loop's ``run_until_complete`` both refuse to run; a separate thread
works under any caller, running loop or not.

The rules this module keeps (docs/research/issue23.md, section 5):

* a timeout (or Ctrl-C in the waiting thread) cancels the in-loop task and waits a bounded
  while for it to unwind, so the connection is left as the asyncio client leaves it after
  ``asyncio.timeout``; the caller gets the builtin ``TimeoutError``;
* a call made on the loop's own thread would wait for itself for ever: it raises
  :class:`LoopThreadError` instead;
* after ``fork()`` the child has no loop thread: its first call starts a new one; clients
  opened before the fork belong to the parent and refuse to be used (``LogClosedError``);
* an abandoned subscription iterator closes its async generator on the loop (a finalizer), a
  dropped client closes its connection, and at exit every open client is closed (bounded).
"""

from __future__ import annotations

from .hub import SyncHub, SyncPublisher, SyncSubscription, connect
from .runner import CLOSE_SECONDS, LoopThreadError, run
from .seguro import SyncSeguro
from .seguro import connect as seguro_connect

__all__ = [
    "CLOSE_SECONDS",
    "LoopThreadError",
    "SyncHub",
    "SyncPublisher",
    "SyncSeguro",
    "SyncSubscription",
    "connect",
    "run",
    "seguro_connect",
]
