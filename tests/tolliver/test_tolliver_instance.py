"""Stand-alone Tolliver instances over real sockets on 127.0.0.1: reliable delivery with acks,
resends until acked, a sender restarted with unacked messages, reconnects, de-duplication."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from helpers import run, until
from tidewire.tolliver import Delivery, Instance
from tidewire.tolliver.inbox import Inbox


async def take(instance: Instance, n: int) -> list[Delivery]:
    got: list[Delivery] = []
    async for delivery in instance.messages():
        got.append(delivery)
        if len(got) >= n:
            break
    return got


def test_reliable_messages_reach_subscribers_and_are_forgotten_once_acked(tmp_path: Path) -> None:
    async def main() -> None:
        a = Instance(str(tmp_path / "a.db"), resend_interval=0.05)
        b = Instance(str(tmp_path / "b.db"), resend_interval=0.05)
        b.subscribe("orders")  # every key
        b.subscribe("prices", "eur")  # one key
        try:
            peer = await a.connect("127.0.0.1", await b.listen())
            assert peer == b.instance_id
            await a.send("orders", "k1", b"one")
            await a.send("prices", "usd", b"not for b")  # b has only prices/eur
            await a.send("prices", "eur", b"two")
            await a.send("orders", "", b"three", reliable=False)
            got = await take(b, 3)
            assert [(d.channel, d.key, d.body) for d in got] == [
                ("orders", "k1", b"one"), ("prices", "eur", b"two"), ("orders", "", b"three"),
            ]  # fmt: skip
            assert {d.sender for d in got} == {a.instance_id}
            await until(lambda: a.store.unacked() == 0)
        finally:
            await a.close()
            await b.close()

    run(main())


def test_a_sender_restarted_with_unacked_messages_delivers_them_when_back(
    tmp_path: Path,
) -> None:
    """b's inbox holds one message: the rest are not acked, and neither is the one it holds
    until b's application has handled it, so a keeps all four (on disk). a restarts (a new
    Instance on the same file, same UUID), reconnects, and resends them."""

    async def main() -> None:
        b = Instance(str(tmp_path / "b.db"), inbox_limit=1, resend_interval=60)
        b.subscribe("jobs")
        port = await b.listen()
        a = Instance(str(tmp_path / "a.db"), resend_interval=60)
        a_id = a.instance_id
        await a.connect("127.0.0.1", port)
        for i in range(4):
            await a.send("jobs", "", b"job%d" % i)
        await until(lambda: b.inbox.full())
        await a.close()
        a = Instance(str(tmp_path / "a.db"), resend_interval=0.05)
        got: list[bytes] = []

        async def read() -> None:
            async for delivery in b.messages():
                got.append(delivery.body)

        reader = asyncio.create_task(read())
        try:
            assert a.instance_id == a_id
            assert a.store.unacked() == 4
            b.inbox.limit = 100  # room for everything now
            await a.connect("127.0.0.1", port)  # the pending ones are resent at once
            # Every one arrives (some twice: an ack that went out on the old connection, or
            # none), and a forgets each once b's application has taken it.
            await until(lambda: a.store.unacked() == 0 and len(set(got)) == 4)
            assert set(got) == {b"job0", b"job1", b"job2", b"job3"}
        finally:
            reader.cancel()
            await a.close()
            await b.close()

    run(main())


def test_unacked_messages_are_resent_at_the_interval_and_deduplicated_on_request(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        b = Instance(str(tmp_path / "b.db"), inbox_limit=1, dedupe=True)
        b.subscribe("t")
        port = await b.listen()
        a = Instance(str(tmp_path / "a.db"), resend_interval=0.05)
        try:
            await a.connect("127.0.0.1", port)
            await a.send("t", "", b"x")
            await a.send("t", "", b"y")  # not acked while b's inbox is full: resent
            (x,) = await take(b, 1)
            (y,) = await take(b, 1)  # arrives by a resend
            assert (x.body, y.body) == (b"x", b"y")
            await until(lambda: a.store.unacked() == 0)
            assert b.inbox.empty()  # with dedupe, no copy of x or y came out again
        finally:
            await a.close()
            await b.close()

    run(main())


def test_a_reconnect_replaces_the_stale_connection(tmp_path: Path) -> None:
    async def main() -> None:
        b = Instance(str(tmp_path / "b.db"))
        b.subscribe("t")
        port = await b.listen()
        a = Instance(str(tmp_path / "a.db"))
        try:
            await a.connect("127.0.0.1", port)
            await until(lambda: a.instance_id in b.links)
            first = b.links[a.instance_id]
            await a.connect("127.0.0.1", port)  # the same instance again
            await until(lambda: b.links.get(a.instance_id) not in (None, first))
            await a.send("t", "", b"after")
            (got,) = await take(b, 1)
            assert got.body == b"after"
        finally:
            await a.close()
            await b.close()

    run(main())


def test_an_instance_may_back_off_its_resends(tmp_path: Path) -> None:
    """``resend_backoff`` (issue 20): what a remote leaves unacked is resent after 1 s, then
    after 2 s, 4 s ... (the hub's way), instead of every second; by the instance's clock."""

    async def main() -> None:
        now = [0.0]
        a = Instance(str(tmp_path / "a.db"), resend_backoff=2.0, resend_max_interval=4.0,
                     clock=lambda: now[0])  # fmt: skip
        b = Instance(str(tmp_path / "b.db"))
        b.subscribe("x")
        try:
            port = await b.listen()
            await a.connect("127.0.0.1", port)
            await until(lambda: bool(a.links) and next(iter(a.links.values())).conn.established)
            await a.send("x", "", b"held")  # b's application never takes it: never acked
            link = next(iter(a.links.values()))
            resent = []
            for second in range(1, 12):
                now[0] = float(second)
                before = link.conn.resends
                a.handle_timer()
                if link.conn.resends > before:
                    resent.append(second)
            assert resent == [1, 3, 7, 11]  # waits of 1, 2, 4, then 4 (the most)
        finally:
            await a.close()
            await b.close()

    run(main())


def test_a_sender_waits_for_room_in_its_window_without_polling(tmp_path: Path) -> None:
    """``unacked_at_most(n)`` returns once acks are committed down to ``n`` (woken by the
    commit, no timer), at once if they already are, and raises if the instance closes."""

    async def main() -> None:
        a = Instance(str(tmp_path / "a.db"), resend_interval=60.0)
        b = Instance(str(tmp_path / "b.db"), resend_interval=60.0)
        b.subscribe("orders")
        a_open = True
        try:
            await a.connect("127.0.0.1", await b.listen())
            await a.unacked_at_most(0)  # nothing sent: at once
            await a.send_many("orders", "", [b"%d" % i for i in range(5)])
            assert a.store.unacked() == 5
            room = asyncio.create_task(a.unacked_at_most(2))
            never = asyncio.create_task(a.unacked_at_most(-1))
            reader = b.batches()
            got: list[Delivery] = []
            while len(got) < 5:
                got += await anext(reader)  # (b acks none of them before it asks again)
            await asyncio.sleep(0)
            assert not room.done()
            assert a.store.unacked() == 5
            acking = asyncio.create_task(anext(reader))  # asks for more: acks the five
            await asyncio.wait_for(room, 10)
            assert a.store.unacked() <= 2
            await until(lambda: a.store.unacked() == 0)
            assert not never.done()
            acking.cancel()
            closing = asyncio.create_task(a.close())
            with pytest.raises(RuntimeError, match="closed"):
                await never
            await closing
            a_open = False
        finally:
            if a_open:  # (an assert failed before it was closed)
                await a.close()
            await b.close()

    run(main())


def test_an_inbox_takes_a_run_at_once_only_when_all_of_it_fits() -> None:
    """``fits`` says yes exactly when ``put_nowait`` of each, in turn, would take them all."""

    async def main() -> None:
        sender = uuid.UUID(int=1)
        inbox = Inbox(limit=4, limit_bytes=10)
        one = [Delivery(sender, "c", "", b"abc", i) for i in range(3)]
        assert inbox.fits(one)  # 3 items, 9 bytes
        inbox.put_many([(d, None) for d in one])  # type: ignore[misc]
        assert (len(inbox), inbox.nbytes) == (3, 9)
        assert inbox.fits([Delivery(sender, "c", "", b"x", 3)])  # 4 items, 10 bytes
        assert not inbox.fits([Delivery(sender, "c", "", b"xy", 3)])  # 11 bytes
        assert not inbox.fits([Delivery(sender, "c", "", b"", i) for i in range(2)])  # 5 items
        taken = await inbox.take(10)
        assert [d for d, _ in taken] == one
        assert (len(inbox), inbox.nbytes) == (0, 0)
        assert not inbox.fits([Delivery(sender, "c", "", b"y" * 11, 0)])  # (put_nowait's way)

    run(main())
