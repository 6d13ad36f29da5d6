"""The hub's Tolliver state with several gateways (cluster mode, docs/cluster.md "Transactions
and the hub's state with several gateways"): one code path, on one hub as on many.

Every gateway of a cluster runs the Tolliver instance over the same ``_tidewire.tolliver``
ledger (:class:`~tidewire.hub.ledger.Ledger`), folded into its memory at open. Three things must
hold across them; each is a step that, on one hub, finds nothing new:

* **One UUID for the cluster** (a remote sees one instance, whichever gateway it reaches): a
  hub whose ledger has none records its own with :meth:`~tidewire.hub.ledger.Ledger.
  record_exclusive`; refused, it catches up and takes the one recorded (the first recorded
  wins; a ledger's first ``instance`` record is the one, at load too).
* **Delivery ids never overlap** (``(hub UUID, id)`` names one delivery, and a receiver
  dedupes on it): a block of ``ID_BLOCK`` ids is reserved by recording ``{"ids": upto}``
  exclusively after catching up, so each block starts where the last one recorded, by any
  gateway, ended. A block that does not follow this gateway's own is kept aside and used when
  the current one runs out (the rest of that one is skipped: ids are names, not counts).
* **A remote's offsets follow it** from gateway to gateway: when a remote's connection is made
  (:meth:`SharedState.catch_up` with its UUID, before its deliveries are made), this gateway
  folds in what others recorded since it last looked, so a remote that moves from A to B
  resumes where A's recorded acks left it (at most ``OFFSET_INTERVAL`` of acks resent, as
  after a restart). Offsets only move forward (the highest wins, unless dropped later in the
  ledger), so folding one's own records again is harmless. Records about remotes connected to
  this gateway now are not folded (its own view of them is the live one), except until the
  catch-up at their connection is done (:attr:`SharedState.joining`): the follower below
  may read their records first.
* **Every gateway lists what any remote follows** (:meth:`SharedState.follow_ledger`): the
  hub's own subscriptions decide what instances send it, and an instance keeps a reliable
  message only for the remotes whose subscriptions cover it, so a sender connected to gateway
  B while the receiver follows the channel through gateway A (or is away, its offset recorded
  by A) must see the channel on B's list, else what it sends is kept for nobody and lost. So
  each gateway folds in the ledger's records as they land (a live tail on the state stream),
  not only when a remote connects to it.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable, Container
from typing import Any

from ..hub import Hub
from ..hub.ledger import Ledger
from ..model import IdOrderError, LogClosedError, TidewireError
from .tolliver_link import MAX_UNACKED, HubLink
from .tolliver_list import HubList
from .tolliver_offsets import RemoteOffsets
from .tolliver_origins import Origins

__all__ = ["ID_BLOCK", "SharedState"]

log = logging.getLogger("tidewire.tolliver")

ID_BLOCK = 1 << 20  # delivery ids reserved at a time in the state stream
ID_MASK = 0xFFFFFFFF
NEED = MAX_UNACKED + 1  # ids one delivery may take (its items, and UNRELIABLE skipped)
TRIES = 64  # exclusive records refused (others recorded meanwhile) before giving up
FOLLOW_RETRY = 1.0  # seconds before following the ledger again after an error


class SharedState:
    """The part of :class:`~tidewire.server.tolliver.TolliverServer` that keeps its ledger in
    step with other gateways' (module docstring)."""

    hub: Hub
    state: Ledger
    instance: uuid.UUID
    kept: RemoteOffsets
    listed: HubList
    by_peer: dict[uuid.UUID, HubLink]
    # connected remotes whose catch-up at connect is not done: their records are folded in by
    # any catch-up (the follower's too), not skipped as those of a remote connected here are
    joining: set[uuid.UUID]
    origins: Origins
    ids_ready: asyncio.Event
    wall: Callable[[], float]
    next_message_id: int  # the next delivery id to take
    _ids_left: int  # ids of the current block not yet taken
    _spare: int | None  # the start of a block reserved, not following the current one
    _upto: int  # where the last block recorded (by any gateway) ends
    _needs_instance: bool
    _dirty: dict[tuple[uuid.UUID, str], asyncio.TimerHandle]

    def _forget(self, keys: list[tuple[uuid.UUID, str]]) -> None:
        raise NotImplementedError  # (the server's: drops offsets, in the ledger too)

    def fold(self, record: dict[str, Any], peer: uuid.UUID | None = None) -> None:
        """Fold in one record caught up; ``peer``: the remote being connected (its records
        are folded although it is connected here)."""
        if "instance" in record:
            if self._needs_instance:  # (the first recorded wins)
                self.instance = uuid.UUID(record["instance"])
                self._needs_instance = False
        elif "ids" in record:
            self._upto = int(record["ids"]) & ID_MASK
        elif "remote" in record:
            remote = uuid.UUID(record["remote"])
            if remote in self.by_peer and remote != peer and remote not in self.joining:
                return
            self._fold_remote(remote, record)

    def _fold_remote(self, remote: uuid.UUID, record: dict[str, Any]) -> None:
        kept = self.kept
        at = float(record.get("at", self.wall()))
        if "channel" not in record:
            if remote in kept.by_remote:
                kept.seen[remote] = max(kept.seen.get(remote, at), at)
            return
        key = (remote, str(record["channel"]))
        if record.get("drop"):
            handle = self._dirty.pop(key, None)
            if handle is not None:
                handle.cancel()
            self.origins.forget(*key)
            if kept.forget(key):
                self.listed.remove([key[1]])
            return
        next_id = int(record["next"])
        if next_id > kept.next.get(key, 0):
            kept.add(key, next_id)
            kept.seen[remote] = max(kept.seen.get(remote, at), at)
            self.listed.add([key[1]])

    async def catch_up(self, peer: uuid.UUID | None = None,
                       follows: Container[str] | None = None) -> int:  # fmt: skip
        """Fold in what was recorded since this gateway last looked (module docstring); how
        many records. ``peer`` (a remote connecting, following ``follows``): its records are
        folded in too, and its offsets on other channels forgotten."""
        records = await self.state.catch_up()
        for record in records:
            try:
                self.fold(record, peer)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("tolliver: ignoring a malformed record %s: %s", record, exc)
        if peer is not None and follows is not None:
            self._forget(self.kept.unfollowed(peer, follows))
        return len(records)

    async def follow_ledger(self) -> None:
        """Fold in every record of the state stream as it lands, for as long as the hub runs
        (cancel it to stop; ends when the storage closes): other gateways' remotes' offsets,
        so that the channels they follow are on this gateway's list (module docstring). On
        one hub it finds only its own records (harmless to fold again). An error (the
        cluster unreachable) is logged and the wait taken up again after ``FOLLOW_RETRY``."""
        while True:
            try:
                await self.hub.wait_for(self.state.stream, self.state.last_seen)
                await self.catch_up()
            except LogClosedError:
                return
            except TidewireError as exc:
                log.warning("tolliver: the state stream not followed (retrying): %s", exc)
                await asyncio.sleep(FOLLOW_RETRY)

    async def claim_instance(self) -> None:
        """Record this hub's UUID unless one is recorded: the first recorded wins."""
        for _ in range(TRIES):
            await self.catch_up()
            if not self._needs_instance:
                return
            try:
                await self.state.record_exclusive({"instance": str(self.instance)})
            except IdOrderError:
                continue  # (someone recorded something: look again)
            self._needs_instance = False
            return
        raise TidewireError("tolliver: the instance UUID not recorded (the ledger is too busy)")

    async def reserve_block(self) -> None:
        """Keep, durably, that the next block after the last one recorded is this gateway's;
        only then use it (a restart, even after SIGKILL, starts after the last block kept)."""
        for _ in range(TRIES):
            await self.catch_up()
            start = self._upto
            upto = (start + ID_BLOCK) & ID_MASK
            try:
                await self.state.record_exclusive({"ids": upto})
            except IdOrderError:
                continue  # another gateway reserved (or recorded) meanwhile: look again
            self._upto = upto
            if start == (self.next_message_id + self._ids_left) & ID_MASK:
                self._ids_left += ID_BLOCK  # (it follows ours: always so on one hub)
            else:
                self._spare = start
            self._switch()
            self.ids_ready.set()
            return
        raise TidewireError("tolliver: delivery ids not reserved (the ledger is too busy)")

    def id_blocks(self) -> list[tuple[int, int]]:
        """The delivery ids this gateway holds and has not taken: ``(first, count)`` of the
        current block's rest, then of the spare one (the admin's view, and tests')."""
        out = [(self.next_message_id, self._ids_left)] if self._ids_left > 0 else []
        return out + ([(self._spare, ID_BLOCK)] if self._spare is not None else [])

    def _switch(self) -> bool:
        """Move to the spare block if the current one cannot serve a delivery; whether one
        can be served now."""
        if self._ids_left < NEED and self._spare is not None:
            self.next_message_id, self._ids_left, self._spare = self._spare, ID_BLOCK, None
        return self._ids_left >= NEED
