"""The hub's Tube carrier writes every WebSocket message queued when its writer wakes with one
``writelines`` (one ``writev``): a Tube message of several fragments is one write, not one per
fragment (issue 22; docs/protocols/tube.md, "Sending"). A real aiohttp server and client on
127.0.0.1; the carrier's HTTP transport is the real one behind a wrapper that counts the
writes, and its RS.io session a stand-in that sends one big message once the fragment sizes are
exchanged."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, cast

from aiohttp import ClientSession, WSMsgType, web

from tidewire.hub import Budget, Share
from tidewire.protocols.tube import Connection, MessageReceived, Role
from tidewire.server.tube import TubeCarrier

Runner = Callable[[Coroutine[Any, Any, None]], None]
FRAGMENT = 16 * 1024


class Counting:
    """A transport that counts ``writelines`` and ``write`` calls, passing them on."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.WriteTransport, transport)
        self.writelines_calls = 0
        self.write_calls = 0

    def writelines(self, lines: list[bytes | memoryview]) -> None:
        self.writelines_calls += 1
        self.transport.writelines(lines)

    def write(self, data: bytes) -> None:
        self.write_calls += 1
        self.transport.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


class OneMessage:
    """An RS.io session stand-in: on ``start``, one write of ``payload`` (two chunks)."""

    principal = "anonymous"

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.carrier: TubeCarrier | None = None

    def start(self, carrier: TubeCarrier) -> None:
        self.carrier = carrier
        half = len(self.payload) // 2
        view = memoryview(self.payload)
        carrier.write_chunks([view[:half], view[half:]])

    def receive_data(self, data: bytes) -> None:
        pass

    def connection_lost(self) -> None:
        pass

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass


def test_a_message_of_many_fragments_is_one_writelines(run: Runner) -> None:
    payload = os.urandom(10 * FRAGMENT + 123)  # 11 fragments, so 11 WebSocket messages

    async def main() -> None:
        counted: list[Counting] = []

        async def handler(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse(compress=False)
            frames = await ws.prepare(request)
            assert request.transport is not None
            http = Counting(request.transport)
            counted.append(http)
            loop = asyncio.get_running_loop()
            tube = Connection(Role.SERVER, fragment_size=FRAGMENT, compression="never",
                              now=loop.time())  # fmt: skip
            share = Share(Budget(), "anonymous", "test")
            carrier = TubeCarrier(ws, tube, cast(Any, OneMessage(payload)), "peer",
                                  cast(asyncio.BaseTransport, http), share=share,
                                  frames=frames)  # fmt: skip
            await carrier.run()
            return ws

        app = web.Application()
        app.router.add_get("/tube", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        try:
            async with ClientSession() as session:
                url = f"http://127.0.0.1:{port}/tube"
                async with session.ws_connect(url, max_msg_size=0) as ws:
                    client = Connection(Role.CLIENT, fragment_size=FRAGMENT, now=0.0)
                    for out in client.data_to_send():
                        await ws.send_bytes(out)
                    got: bytes | None = None
                    messages = 0
                    while got is None:
                        message = await asyncio.wait_for(ws.receive(), 10)
                        assert message.type == WSMsgType.BINARY
                        messages += 1
                        client.receive_data(message.data, 0.0)
                        while (event := client.next_event()) is not None:
                            if isinstance(event, MessageReceived):
                                got = event.data
                    assert got == payload
                    assert messages == 1 + 11  # the hub's fragment size, then the fragments
                    # the fragment-size answer and the message: a writelines each at most
                    (http,) = counted
                    assert http.writelines_calls <= 2
                    assert http.write_calls == 0
        finally:
            await runner.cleanup()

    run(main())
