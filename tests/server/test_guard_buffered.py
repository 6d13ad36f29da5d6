"""A buffered listener (``Listener(buffered=True)``, RS.io's): the loop reads into one buffer
of the listener's, shared by its connections, and the wrapped protocol gets a view of it for the
call only. Several connections sending at once, in and out of TLS, each get their own bytes,
whole and in order."""

from __future__ import annotations

import asyncio
import os
import ssl
from typing import TYPE_CHECKING, cast

import pytest

from helpers import until
from loops import Run
from tidewire.server.guard import (
    READ_BYTES,
    Admission,
    BufferedGuardedConnection,
    ConnectionLimits,
    Listener,
    established,
)

if TYPE_CHECKING:
    from certs import Pki


class Collect(asyncio.Protocol):
    """Copies what it receives (as a buffered listener's protocols must); at EOF, answers with
    the size it got and closes."""

    def __init__(self) -> None:
        self.got = bytearray()
        self.views = 0
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        established(transport)

    def data_received(self, data: bytes) -> None:
        self.views += isinstance(data, memoryview)
        self.got += data

    def eof_received(self) -> bool | None:
        assert self.transport is not None
        self.transport.write(b"%d" % len(self.got))
        self.transport.close()
        return True


async def send_all(port: int, data: bytes, tls: ssl.SSLContext | None) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=tls)
    for at in range(0, len(data), 100_000):  # many writes, read in pieces of any size
        writer.write(data[at : at + 100_000])
        await writer.drain()
    if tls is None:
        writer.write_eof()
    else:  # (no half-close over TLS: the size is checked on the protocol's side)
        writer.close()
        return b""
    answer = await reader.read()
    writer.close()
    return answer


@pytest.mark.parametrize("secure", [False, True])
def test_connections_sharing_the_read_buffer_get_their_own_bytes(
    run: Run, pki: Pki, secure: bool
) -> None:
    payloads = [os.urandom(3 * READ_BYTES + i) for i in range(4)]  # each > the buffer

    async def main() -> None:
        protocols: list[Collect] = []

        def make() -> Collect:
            protocols.append(Collect())
            return protocols[-1]

        server_tls = pki.server_context("none") if secure else None
        listener = Listener("test", make, Admission(ConnectionLimits()), tls=server_tls,
                            buffered=True)  # fmt: skip
        await listener.start("127.0.0.1", 0)
        try:
            client_tls = pki.client_context() if secure else None
            answers = await asyncio.wait_for(asyncio.gather(
                *(send_all(listener.port, p, client_tls) for p in payloads)), 30)  # fmt: skip
            if not secure:
                assert answers == [b"%d" % len(p) for p in payloads]
            else:
                total = sum(map(len, payloads))
                await until(lambda: sum(len(p.got) for p in protocols) == total)
            assert sorted(bytes(p.got) for p in protocols) == sorted(payloads)
            if not secure:  # (TLS hands over the plaintext it decrypted, as bytes)
                assert all(p.views > 0 for p in protocols)
            assert all(isinstance(c, BufferedGuardedConnection) for c in listener.connections)
        finally:
            listener.close()
            for conn in list(listener.connections):
                conn.abort()
            await listener.wait_closed()

    run(main())
