"""Tolliver instances that reconnect (``Instance.connect(..., retry=Retry(...))``), over real
sockets on 127.0.0.1: an in-process hub stopped and started again on the same port and data
directory while one instance sends and another receives; a receiving instance restarted under a
sender; giving up after ``Retry.attempts``; a refused handshake; ``close()``.

No test waits for a timer: the supervisors' ``sleep`` is injected (a gate that opens when the
remote is back, or a recorder that only yields), and resends are driven by the instance's
injected ``clock`` and :meth:`Instance.handle_timer`.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from helpers import until
from loops import Run
from tidewire.client.backoff import GaveUp, Retry
from tidewire.hub import Hub
from tidewire.model import LimitExceeded
from tidewire.protocols.tolliver import Ack, Connection, Decoder, Limits, Message, Role
from tidewire.server.tolliver import TolliverServer, start_tolliver_server
from tidewire.tolliver import Delivery, HandshakeFailed, Instance, Supervisor

HOST = "127.0.0.1"
FOREVER = Retry(initial=0.01, maximum=0.05)  # attempts=None: never gives up
NEVER_RESENT = 3600.0  # a resend interval no test reaches: resends are driven by hand


class Gate:
    """A supervisor's ``sleep``: records the wait it was asked for, then returns once ``up``
    is set (the remote is back), so a reconnect never waits for a timer nor spins."""

    def __init__(self, up: asyncio.Event) -> None:
        self.up = up
        self.delays: list[float] = []

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)
        await self.up.wait()


class Recorder:
    """A supervisor's ``sleep`` that records the wait and only yields to the loop once."""

    def __init__(self) -> None:
        self.delays: list[float] = []
        self.changed = asyncio.Event()

    async def __call__(self, delay: float) -> None:
        self.delays.append(delay)
        self.changed.set()
        await asyncio.sleep(0)

    async def reach(self, n: int) -> None:
        while len(self.delays) < n:
            self.changed.clear()
            await self.changed.wait()


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Tally:
    """A list that tells waiters when it grows (no polling)."""

    def __init__(self) -> None:
        self.items: list[bytes] = []
        self._grew = asyncio.Event()

    def add(self, item: bytes) -> None:
        self.items.append(item)
        self._grew.set()

    async def reach(self, n: int, *, distinct: bool = False) -> None:
        while (len(set(self.items)) if distinct else len(self.items)) < n:
            self._grew.clear()
            await self._grew.wait()


class InProcessHub:
    """tidewire's hub (``Hub`` + its Tolliver listener) on one data directory, stopped and
    started again on the same port. ``up`` is set while it listens."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.port = 0
        self.up = asyncio.Event()
        self.hub: Hub | None = None
        self.server: TolliverServer | None = None

    async def start(self) -> None:
        self.hub = Hub.open(self.path)
        self.server = await start_tolliver_server(self.hub, HOST, self.port)
        self.port = self.server.port
        self.up.set()

    async def stop(self) -> None:
        self.up.clear()
        if self.server is not None:
            await self.server.close()
        if self.hub is not None:
            await self.hub.close()
        self.server = self.hub = None


async def stored(path: Path, stream: str) -> list[bytes]:
    """Every value of ``stream``, read through a Hub opened on ``path`` (the hub is stopped)."""
    hub = Hub.open(str(path))
    try:
        values: list[bytes] = []
        next_id = 1
        for _ in range(10_000):  # (bounded: a batch per turn)
            batches = await hub.read(stream, next_id)
            if not batches:
                return values
            for batch in batches:
                values += [bytes(e.value) for e in batch]
                next_id = batch.last_id + 1
        raise AssertionError("the stream never ended")
    finally:
        await hub.close()


def offset_is(server: TolliverServer, remote: uuid.UUID, next_id: int) -> bool:
    return server.offsets.get((remote, "ticks")) == next_id


def connected(instance: Instance, to: Instance) -> bool:
    return to.instance_id in instance.links


def refusing_port() -> socket.socket:
    """A socket bound to a free port and not listening: connecting to it is refused at once
    (keep it open for as long as the port must stay refused)."""
    sock = socket.socket()
    sock.bind((HOST, 0))
    return sock


# ---------------------------------------------------------------------------- through the hub


def test_a_hub_restarted_on_its_port_loses_nothing_sent(tmp_path: Path, run: Run) -> None:
    """One instance sends reliable messages while the hub is stopped and started again three
    times (same port, same data directory); another, subscribed, receives them with
    ``dedupe=True``. Every message whose ``send`` returned is in the hub's stream (at least
    once), the receiver gets every one, and both supervisors reconnected after each restart.
    Sends made while the hub is down return once on disk, kept for the hub."""
    restarts, n = 3, 160

    async def main() -> None:
        hub = InProcessHub(tmp_path / "hub")
        await hub.start()
        gate = Gate(hub.up)
        receiver = Instance(str(tmp_path / "r.db"), dedupe=True, sleep=gate,
                            resend_interval=NEVER_RESENT)  # fmt: skip
        receiver.subscribe("orders")
        sender = Instance(str(tmp_path / "s.db"), sleep=gate, resend_interval=NEVER_RESENT)
        sent, received = Tally(), Tally()
        deliveries: list[Delivery] = []

        async def produce() -> None:
            for i in range(n):
                body = b"m%04d" % i
                await sender.send("orders", "", body)
                sent.add(body)

        async def consume() -> None:
            async for delivery in receiver.messages():
                deliveries.append(delivery)
                received.add(delivery.body)

        consumer = asyncio.create_task(consume())
        producer: asyncio.Task[None] | None = None
        try:
            await receiver.connect(HOST, hub.port, retry=FOREVER)
            hub_id = await sender.connect(HOST, hub.port, retry=FOREVER)
            (supervisor,) = sender.supervisors
            assert ("orders", "") in supervisor.subscriptions  # the hub wants what b wants
            producer = asyncio.create_task(produce())
            # the receiver acks one first: the hub keeps its offset, and so wants "orders"
            # again as soon as it restarts, before the receiver is back
            await received.reach(1)
            for round_ in range(restarts):
                await sent.reach((round_ + 1) * n // (restarts + 2))
                await hub.stop()
                mark = len(sent.items)
                await sent.reach(mark + 5)  # while the hub is down
                assert not supervisor.connected
                assert supervisor.running
                pending = {body for *_, body in sender.store.pending_for(hub_id)}
                assert set(sent.items[mark : mark + 5]) <= pending  # on disk, for the hub
                await hub.start()
            await producer
            await received.reach(n, distinct=True)
            await until(lambda: sender.store.unacked() == 0)  # the hub acked every one
            assert set(received.items) == set(sent.items)
            for each in (supervisor, *receiver.supervisors):
                assert each.reconnects == restarts
                assert each.attempts == 1 + restarts  # the gate: one try per restart
                assert isinstance(each.last_error, ConnectionError)
            assert sender.reconnects == receiver.reconnects == restarts
            seen = [(d.sender, d.id) for d in deliveries]
            assert len(seen) == len(set(seen))  # dedupe: no (sender, id) handed over twice
        finally:
            for task in (producer, consumer):
                if task is not None:
                    task.cancel()
            await sender.close()
            await receiver.close()
            await hub.stop()
        counts = Counter(await stored(tmp_path / "hub", "orders"))
        assert all(counts[body] >= 1 for body in sent.items)  # at least once
        # At-least-once by the seed: one resent before its ack came is stored again, as another
        # event, so the hub hands it over again too. Deduplicated by the application's own key
        # (here: the body), each is there exactly once, and nothing else is.
        assert sorted(counts) == sorted(set(sent.items))

    run(main())


def test_hub_message_ids_never_repeat_across_connections(tmp_path: Path, run: Run) -> None:
    """A receiver with ``dedupe=True`` keys repeats on (sender, id): the hub must not give a
    new delivery an id it used on an earlier connection or before a restart, or the receiver
    would drop (and ack) a message it never had."""

    async def main() -> None:
        hub = InProcessHub(tmp_path / "hub")
        await hub.start()
        receiver = Instance(str(tmp_path / "r.db"), dedupe=True, sleep=Gate(hub.up))
        receiver.subscribe("ticks")
        got: list[Delivery] = []

        async def take(k: int) -> None:
            async for delivery in receiver.messages():
                got.append(delivery)
                if len(got) >= k:
                    break

        try:
            await receiver.connect(HOST, hub.port, retry=FOREVER)
            sender = Instance(str(tmp_path / "s.db"))
            try:
                await sender.connect(HOST, hub.port)
                for round_ in range(3):
                    await sender.send("ticks", "", b"t%d" % round_)
                    await take(round_ + 1)
                    assert hub.server is not None
                    # (its ack reached the hub: what comes next is new, not a redelivery)
                    await until(partial(offset_is, hub.server, receiver.instance_id, round_ + 2))
                    if round_ == 0:  # a new connection
                        transport = receiver.links[got[0].sender].transport
                        assert transport is not None
                        transport.abort()
                    elif round_ == 1:  # a restart
                        await sender.close()
                        await hub.stop()
                        await hub.start()
                        sender = Instance(str(tmp_path / "s.db"))
                        await sender.connect(HOST, hub.port)
            finally:
                await sender.close()
            assert [d.body for d in got] == [b"t0", b"t1", b"t2"]
            assert len({d.id for d in got}) == 3
            assert receiver.duplicates == 0
        finally:
            await receiver.close()
            await hub.stop()

    run(main())


def test_the_outbox_is_bounded_in_bytes_while_the_hub_is_away(tmp_path: Path, run: Run) -> None:
    """What is kept for a remote that is away counts against ``outbox_bytes``: just at the
    limit is fine, one byte over is refused (nothing kept); once the hub is back and has
    acked, there is room again. The count survives a restart of the sender."""

    async def main() -> None:
        hub = InProcessHub(tmp_path / "hub")
        await hub.start()
        receiver = Instance(str(tmp_path / "r.db"), sleep=Gate(hub.up))
        receiver.subscribe("orders")
        sender = Instance(str(tmp_path / "s.db"), outbox_bytes=1000, sleep=Gate(hub.up))
        try:
            await receiver.connect(HOST, hub.port, retry=FOREVER)  # the hub now wants "orders"
            await sender.connect(HOST, hub.port, retry=FOREVER)
            await hub.stop()
            for i in range(10):
                await sender.send("orders", "", bytes([i]) * 100)
            assert sender.store.unacked_bytes() == 1000  # exactly the limit
            with pytest.raises(LimitExceeded):
                await sender.send("orders", "", b"!")
            assert sender.store.unacked() == 10
            await sender.send("elsewhere", "", b"x" * 5000)  # wanted by nobody: not kept
            await sender.close()
            sender = Instance(str(tmp_path / "s.db"), outbox_bytes=1000, sleep=Gate(hub.up))
            assert sender.store.unacked_bytes() == 1000  # counted again from the file
            await hub.start()
            await sender.connect(HOST, hub.port, retry=FOREVER)  # the outbox is re-offered
            await until(lambda: sender.store.unacked_bytes() == 0)
            # (the restarted hub wants "orders" again once the receiver is back)
            await until(lambda: ("orders", "") in sender.supervisors[0].subscriptions)
            await sender.send("orders", "", b"y" * 1000)  # kept, just at the limit again
            await until(lambda: sender.store.unacked_bytes() == 0)
        finally:
            await sender.close()
            await receiver.close()
            await hub.stop()
        values = set(await stored(tmp_path / "hub", "orders"))
        assert values == {bytes([i]) * 100 for i in range(10)} | {b"y" * 1000}

    run(main())


# ---------------------------------------------------------------------------- instance to instance


def test_dedupe_survives_reconnects_and_the_receivers_restart(tmp_path: Path, run: Run) -> None:
    """A sender keeps a stand-alone receiver (``dedupe=True``) connected while its connection
    is cut twice and the receiver is restarted twice (a new Instance on its file, the same
    port). The sender re-offers every unacked message on each new connection, so repeats
    arrive; the receiver's application still gets every message exactly once: the (sender,
    id) of what it finished with is kept in its store. The last resends (of messages whose
    first copy was acked on a connection already gone) are driven by the sender's clock."""
    n = 120
    r_path = str(tmp_path / "r.db")

    async def main() -> None:
        up = asyncio.Event()
        clock = FakeClock()
        sender = Instance(str(tmp_path / "s.db"), clock=clock, sleep=Gate(up),
                          resend_interval=NEVER_RESENT)  # fmt: skip
        sent, handled = Tally(), Tally()

        def open_receiver() -> Instance:
            instance = Instance(r_path, dedupe=True, resend_interval=NEVER_RESENT)
            instance.subscribe("jobs")
            return instance

        async def consume(instance: Instance) -> None:
            async for delivery in instance.messages():
                handled.add(delivery.body)

        async def produce() -> None:
            for i in range(n):
                body = b"job%04d" % i
                await sender.send("jobs", "", body)
                sent.add(body)

        receiver = open_receiver()
        port = await receiver.listen(HOST, 0)
        up.set()
        consumer = asyncio.create_task(consume(receiver))
        producer: asyncio.Task[None] | None = None
        duplicates = 0
        try:
            await sender.connect(HOST, port, retry=FOREVER)
            (link,) = sender.supervisors
            producer = asyncio.create_task(produce())
            for round_ in range(4):
                await handled.reach((round_ + 1) * n // 5)
                if round_ % 2 == 0:  # cut the connection: the receiver stays up
                    await until(partial(connected, receiver, sender))
                    transport = receiver.links[sender.instance_id].transport
                    assert transport is not None
                    transport.abort()
                else:  # restart the receiver on its file and port
                    up.clear()
                    consumer.cancel()
                    await asyncio.wait([consumer])
                    duplicates += receiver.duplicates
                    await receiver.close()
                    receiver = open_receiver()
                    await receiver.listen(HOST, port)
                    consumer = asyncio.create_task(consume(receiver))
                    up.set()
            await producer
            await handled.reach(n, distinct=True)
            # Whatever is still unacked had its ack sent on a connection already gone (it was
            # with the application when a repeat came): the next resend is acked.
            await until(partial(connected, sender, receiver))
            clock.now += NEVER_RESENT
            sender.handle_timer()
            await until(lambda: sender.store.unacked() == 0)
            duplicates += receiver.duplicates
            assert link.reconnects == 4
            counts = Counter(handled.items)
            assert set(counts) == set(sent.items)
            assert max(counts.values()) == 1, (f"handed over twice: {counts.most_common(3)} "
                                               f"({duplicates} repeats dropped)")  # fmt: skip
        finally:
            for task in (producer, consumer):
                if task is not None:
                    task.cancel()
            await sender.close()
            await receiver.close()

    run(main())


class RawPeer:
    """A sender driven by hand: the sans-IO machine over a socket, one UUID across its
    connections (so its message ids mean the same message on each, as the seed says)."""

    def __init__(self) -> None:
        self.id = uuid.uuid4()
        self.acks: list[int] = []  # every ack frame received (the machine ignores repeats)
        self._conn = Connection(Role.CONNECTOR, self.id, 1, frozenset({1}))
        self._frames = Decoder(Limits())
        self._writer: asyncio.StreamWriter | None = None
        self._reader: asyncio.StreamReader | None = None

    async def connect(self, port: int) -> None:
        self._conn = Connection(Role.CONNECTOR, self.id, 1, frozenset({1}))
        self._frames = Decoder(Limits())
        self._reader, self._writer = await asyncio.open_connection(HOST, port)
        self._conn.initiate()
        self._writer.write(self._conn.data_to_send())
        while not self._conn.established:
            await self._read()

    def send(self, message_id: int, body: bytes) -> None:
        assert self._writer is not None
        self._conn.send(Message("jobs", "", body, message_id), 0.0)
        self._writer.write(self._conn.data_to_send())

    async def acked(self, n: int) -> list[int]:
        """The acks received once there are ``n`` (over every connection, in order)."""
        while len(self.acks) < n:
            await self._read()
        return self.acks

    async def _read(self) -> None:
        assert self._reader is not None
        data = await self._reader.read(65536)
        assert data, "the instance closed the connection"
        self._conn.receive_data(data)
        while self._conn.next_event() is not None:
            pass
        self._frames.feed(data)
        while (frame := self._frames.next_frame()) is not None:
            if isinstance(frame, Ack):
                self.acks.append(frame.id)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            await self._writer.wait_closed()


def test_dedupe_drops_what_the_application_finished_also_after_a_restart(
    tmp_path: Path, run: Run
) -> None:
    """Byte-exact, with a hand-driven sender: a repeat of a message the application holds is
    dropped and not acked (the first copy is acked once the application is done with it); a
    repeat of one it finished with is acked and dropped, also by the receiver restarted on
    its file (the store keeps what was finished)."""
    path = str(tmp_path / "r.db")

    async def main() -> None:
        peer = RawPeer()
        receiver = Instance(path, dedupe=True)
        receiver.subscribe("jobs")
        try:
            port = await receiver.listen()
            await peer.connect(port)
            peer.send(7, b"seven")
            peer.send(7, b"seven")  # a repeat, while the first copy waits in the inbox
            await until(lambda: receiver.duplicates == 1)
            deliveries = receiver.messages()
            assert (await anext(deliveries)).body == b"seven"
            peer.send(8, b"eight")
            assert (await anext(deliveries)).body == b"eight"  # done with 7: 7 is acked
            assert await peer.acked(1) == [7]
            await deliveries.aclose()  # done with 8 too
            assert await peer.acked(2) == [7, 8]  # the held repeat of 7 got no ack of its own
            await receiver.close()
            await peer.close()

            receiver = Instance(path, dedupe=True)  # restarted, on the same port
            receiver.subscribe("jobs")
            await receiver.listen(HOST, port)
            await peer.connect(port)
            peer.send(8, b"eight")  # its ack was lost, say: resent; finished: acked, dropped
            assert await peer.acked(3) == [7, 8, 8]
            assert receiver.duplicates == 1
            assert receiver.inbox.empty()
            peer.send(9, b"nine")
            deliveries = receiver.messages()
            assert (await anext(deliveries)).body == b"nine"  # the first the restart hands over
            await deliveries.aclose()
            assert await peer.acked(4) == [7, 8, 8, 9]
        finally:
            await peer.close()
            await receiver.close()

    run(main())


def test_resends_follow_the_injected_clock(tmp_path: Path, run: Run) -> None:
    """A message the receiver does not ack (its inbox is full) is resent only when the
    sender's clock says ``resend_interval`` has passed and ``handle_timer`` runs."""

    async def main() -> None:
        clock = FakeClock()
        receiver = Instance(str(tmp_path / "r.db"), inbox_limit=1)
        receiver.subscribe("t")
        sender = Instance(str(tmp_path / "s.db"), clock=clock, resend_interval=5.0)
        try:
            await sender.connect(HOST, await receiver.listen())
            await sender.send("t", "", b"held")
            await sender.send("t", "", b"refused")  # the inbox is full: not acked
            conn = sender.links[receiver.instance_id].conn
            await until(lambda: receiver.inbox.full())
            resends = conn.resends
            clock.now += 4.9
            sender.handle_timer()
            assert conn.resends == resends  # not due yet
            clock.now += 0.2
            sender.handle_timer()
            assert conn.resends == resends + 2  # both unacked, both due
        finally:
            await sender.close()
            await receiver.close()

    run(main())


# ---------------------------------------------------------------------------- giving up, closing


def test_gave_up_after_attempts_when_the_hub_never_comes_back(tmp_path: Path, run: Run) -> None:
    """The loss counts as the outage's first failure, each failed try as one more: with
    ``attempts=4``, three waits (exponential, no jitter) and three tries, then GaveUp. A send
    after that keeps nothing for the remote (it is no longer supervised)."""

    async def main() -> None:
        hub = InProcessHub(tmp_path / "hub")
        await hub.start()
        recorder = Recorder()
        sender = Instance(str(tmp_path / "s.db"), sleep=recorder)
        retry = Retry(initial=0.1, maximum=1.0, jitter=0.0, attempts=4)
        try:
            await sender.connect(HOST, hub.port, retry=retry)
            (supervisor,) = sender.supervisors
            await hub.stop()  # never back
            with pytest.raises(GaveUp) as gave_up:
                await supervisor.wait()
            assert gave_up.value.attempts == 4
            assert isinstance(gave_up.value.last, ConnectionRefusedError)
            assert recorder.delays == pytest.approx([0.1, 0.2, 0.4])
            assert supervisor.attempts == 1 + 3
            assert supervisor.gave_up is gave_up.value
            assert not supervisor.running
            await sender.send("orders", "", b"late")
            assert sender.store.unacked() == 0
        finally:
            await sender.close()

    run(main())


def test_the_first_connect_gives_up_after_attempts(tmp_path: Path, run: Run) -> None:
    async def main() -> None:
        refused = refusing_port()
        recorder = Recorder()
        sender = Instance(str(tmp_path / "s.db"), sleep=recorder)
        try:
            port = refused.getsockname()[1]
            with pytest.raises(GaveUp) as gave_up:
                await sender.connect(HOST, port, retry=Retry(initial=0.5, jitter=0.0, attempts=3))
            assert gave_up.value.attempts == 3
            assert recorder.delays == pytest.approx([0.5, 1.0])
            assert sender.supervisors[0].attempts == 3
            assert isinstance(sender.last_error, ConnectionRefusedError)
        finally:
            refused.close()
            await sender.close()

    run(main())


def test_close_stops_the_supervisor(tmp_path: Path, run: Run) -> None:
    """While a first connect is retrying (no remote), and while connected: close() ends the
    supervisor, and nothing dials again."""

    async def main() -> None:
        refused = refusing_port()
        recorder = Recorder()
        sender = Instance(str(tmp_path / "s.db"), sleep=recorder)
        connecting = asyncio.create_task(
            sender.connect(HOST, refused.getsockname()[1], retry=FOREVER)
        )
        try:
            await recorder.reach(3)
            (supervisor,) = sender.supervisors
            await sender.close()
            with pytest.raises(ConnectionError, match="closed"):
                await connecting
            assert not supervisor.running
            assert supervisor.gave_up is None
            await supervisor.wait()  # returns: stopped, not given up
            tries = supervisor.attempts
            for _ in range(20):
                await asyncio.sleep(0)
            assert supervisor.attempts == tries
        finally:
            refused.close()

        hub = InProcessHub(tmp_path / "hub")
        await hub.start()
        other = Instance(str(tmp_path / "o.db"), sleep=Recorder())
        try:
            await other.connect(HOST, hub.port, retry=FOREVER)
            (supervisor,) = other.supervisors
            await other.close()
            assert not supervisor.running
            assert not supervisor.connected
            assert supervisor.attempts == 1
            assert supervisor.reconnects == 0
            with pytest.raises(ConnectionError):
                await other.connect(HOST, hub.port, retry=FOREVER)
        finally:
            await hub.stop()

    run(main())


class _Remote:
    """A listener on 127.0.0.1 that answers each connection with ``answer`` (the handshake
    request's bytes in, bytes to send back out; then it closes). It counts connections."""

    def __init__(self, answer: Callable[[bytes], bytes]) -> None:
        self.answer = answer
        self.connections = 0
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        request = await reader.read(65536)
        writer.write(self.answer(request))
        writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def newer_and_incompatible(request: bytes) -> bytes:
    """A remote that speaks only version 2: its response has status 2 (failure)."""
    conn = Connection(Role.ACCEPTOR, uuid.uuid4(), 2, frozenset({2}))
    conn.receive_data(request)
    while conn.next_event() is not None:
        pass
    return conn.data_to_send()


class HangingUp:
    """A Tolliver remote that completes each handshake (status 0), then keeps the connection
    until :meth:`hang_up`."""

    def __init__(self) -> None:
        self.connections = 0
        self.server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._handle, HOST, 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn = Connection(Role.ACCEPTOR, uuid.uuid4(), 1, frozenset({1}))
        while not conn.established:
            data = await reader.read(65536)
            if not data:
                return
            conn.receive_data(data)
            while conn.next_event() is not None:
                pass
            writer.write(conn.data_to_send())
        self._writers.append(writer)

    def hang_up(self) -> None:
        for writer in self._writers:
            writer.close()
        self._writers.clear()

    async def close(self) -> None:
        self.hang_up()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_a_connection_that_lasted_stable_after_ends_the_outage(tmp_path: Path, run: Run) -> None:
    """Two connections last ``stable_after`` (by the instance's clock) before the remote hangs
    up: each loss starts a new outage (the wait is ``initial`` again). The next two are hung up
    at once, as a hub does when its ACL refuses what is resent: the outage goes on, the wait
    doubles, and ``attempts=3`` ends in GaveUp instead of reconnecting forever."""

    async def main() -> None:
        clock, recorder, remote = FakeClock(), Recorder(), HangingUp()
        sender = Instance(str(tmp_path / "s.db"), clock=clock, sleep=recorder)
        try:
            port = await remote.start()
            retry = Retry(initial=0.1, maximum=10.0, jitter=0.0, attempts=3)
            await sender.connect(HOST, port, retry=retry, stable_after=1.0)
            (supervisor,) = sender.supervisors
            for i, lasted in enumerate((5.0, 5.0, 0.0, 0.0)):
                await until(partial(up, supervisor, remote, i + 1))
                clock.now += lasted
                remote.hang_up()
            with pytest.raises(GaveUp) as gave_up:
                await supervisor.wait()
            assert gave_up.value.attempts == 3
            assert recorder.delays == pytest.approx([0.1, 0.1, 0.2])
            assert supervisor.reconnects == 3
            assert remote.connections == 4
        finally:
            await sender.close()
            await remote.close()

    run(main())


def up(supervisor: Supervisor, remote: HangingUp, connections: int) -> bool:
    return supervisor.connected and remote.connections == connections


def test_a_refused_handshake_is_final_a_silent_close_is_retried(tmp_path: Path, run: Run) -> None:
    """A version failure (status 2) is final at once, with or without retry. A remote that
    closes before answering (what the hub does for a certificate or subscription its ACL
    refuses, and what a crash looks like) is retried: GaveUp after ``attempts``."""

    async def main() -> None:
        sender = Instance(str(tmp_path / "s.db"), sleep=Recorder())
        incompatible, silent = _Remote(newer_and_incompatible), _Remote(lambda _: b"")
        try:
            port = await incompatible.start()
            with pytest.raises(GaveUp) as gave_up:
                await sender.connect(HOST, port, retry=FOREVER)
            assert isinstance(gave_up.value.last, HandshakeFailed)
            assert incompatible.connections == 1
            with pytest.raises(HandshakeFailed):  # (a ConnectionError, as it always was)
                await sender.connect(HOST, port)

            port = await silent.start()
            with pytest.raises(GaveUp) as gave_up:
                await sender.connect(HOST, port, retry=Retry(initial=0.01, attempts=3))
            assert not isinstance(gave_up.value.last, HandshakeFailed)
            assert isinstance(gave_up.value.last, ConnectionError)
            assert silent.connections == 3
        finally:
            await sender.close()
            await incompatible.close()
            await silent.close()

    run(main())
