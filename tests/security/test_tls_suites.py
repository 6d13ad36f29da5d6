"""TLS 1.2 offers AEAD suites only (issue 23: testssl flagged the CBC suites of OpenSSL's default
list as potentially open to LUCKY13): the contexts every listener and client is built with
(``server_context``, ``client_context``), and a real handshake by ``openssl s_client`` against
the hub's guarded HTTP listener on 127.0.0.1, with an RSA and an ECDSA certificate: a CBC suite
is refused, the GCM suite of the same key type is accepted (so the refusal is the suite's)."""

from __future__ import annotations

import asyncio
import shutil
import ssl
from pathlib import Path
from typing import Any

import pytest
import trustme

from helpers import run
from http_hub import HOST, secure_hub
from tidewire.server.tls import TlsSettings, client_context, server_context

OPENSSL = shutil.which("openssl")


def tls12_suites(ctx: ssl.SSLContext) -> list[Any]:
    return [c for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]


def hub_tls(tmp_path: Path, key_type: trustme.KeyType) -> TlsSettings:
    ca = trustme.CA(key_type=key_type)
    leaf = ca.issue_cert("localhost", HOST, key_type=key_type)
    cert, key = tmp_path / "hub.pem", tmp_path / "hub.key"
    leaf.private_key_pem.write_to_path(str(key))
    cert.write_bytes(b"".join(blob.bytes() for blob in leaf.cert_chain_pems))
    return TlsSettings(str(cert), str(key))


@pytest.mark.parametrize("side", ["server", "client"])
def test_tls12_offers_only_aead_suites(tmp_path: Path, side: str) -> None:
    tls = hub_tls(tmp_path, trustme.KeyType.ECDSA)
    ctx = server_context(tls) if side == "server" else client_context()
    suites = tls12_suites(ctx)
    assert suites, "no TLS 1.2 suite at all"
    assert [c["name"] for c in suites if not c["aead"]] == []
    assert all(str(c["kea"]) == "kx-ecdhe" for c in suites), suites  # no DHE, no plain RSA
    names = {str(c["name"]) for c in suites}
    assert {"ECDHE-RSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES128-GCM-SHA256"} <= names
    assert all("CBC" not in str(c["description"]) for c in suites)


async def s_client(port: int, suite: str) -> tuple[int, str]:
    """``openssl s_client -tls1_2 -cipher <suite>`` to the hub: its exit code and output."""
    assert OPENSSL is not None
    proc = await asyncio.create_subprocess_exec(
        OPENSSL, "s_client", "-connect", f"{HOST}:{port}", "-servername", "localhost",
        "-tls1_2", "-cipher", suite,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return proc.returncode or 0, out.decode("utf-8", "replace")


@pytest.mark.skipif(OPENSSL is None, reason="no openssl command on this machine")
@pytest.mark.parametrize(
    ("key_type", "auth"), [(trustme.KeyType.RSA, "RSA"), (trustme.KeyType.ECDSA, "ECDSA")]
)
def test_a_cbc_suite_is_refused_at_the_handshake(tmp_path: Path, key_type: trustme.KeyType,
                                                 auth: str) -> None:  # fmt: skip
    tls = server_context(hub_tls(tmp_path, key_type))

    async def main() -> None:
        async with secure_hub(tmp_path, tls=tls) as served:
            code, out = await s_client(served.port, f"ECDHE-{auth}-AES128-SHA256")
            assert code != 0, out
            assert "handshake failure" in out or "no shared cipher" in out, out
            code, out = await s_client(served.port, f"ECDHE-{auth}-AES128-GCM-SHA256")
            assert code == 0, out
            assert f"ECDHE-{auth}-AES128-GCM-SHA256" in out, out

    run(main(), 60)
