"""The TLS contexts of every listener and client: TLS 1.2+ and certificates always verified.

The standard library's :mod:`ssl` (OpenSSL) does the cryptography; the guard
(:mod:`tidewire.server.guard`) runs the handshakes over memory BIOs with these contexts.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

__all__ = [
    "TLS12_CIPHERS",
    "TlsSettings",
    "client_context",
    "peer_certificate",
    "server_context",
    "tls_reason",
]

# The TLS 1.2 suites offered and accepted: ECDHE key exchange with an AEAD cipher only
# (AES-GCM, ChaCha20-Poly1305). OpenSSL's default list also has the CBC suites
# (ECDHE-*-AES*-SHA256/384, DHE-RSA-AES*-SHA256), which scanners (testssl) flag as open to
# LUCKY13; DHE goes too (ECDHE suffices and needs no DH parameters). TLS 1.3's suites are set
# apart by OpenSSL (``set_ciphersuites``) and are all AEAD already.
TLS12_CIPHERS = "ECDHE+AESGCM:ECDHE+CHACHA20:!aNULL:!eNULL:!aDSS"


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """Settings ``tls.*``: the hub's certificate, and the CA that client certificates need."""

    cert_file: str
    key_file: str
    ca_file: str | None = None
    client_auth: str = "none"  # "none", "optional" or "required"
    min_version: str = "1.2"


def server_context(tls: TlsSettings, *, client_auth: str | None = None) -> ssl.SSLContext:
    """A server context: TLS 1.2+ (or 1.3), AEAD suites only (:data:`TLS12_CIPHERS`), the
    hub's chain, and client verification as asked. Every listener's context is made here.

    ``client_auth`` overrides ``tls.client_auth`` (Tolliver always requires certificates).
    With "optional" a client certificate that is sent must verify; one not sent leaves the
    peer anonymous. Verification uses ``tls.ca_file`` only, not the system's store.
    """
    mode = client_auth or tls.client_auth
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = {"1.2": ssl.TLSVersion.TLSv1_2, "1.3": ssl.TLSVersion.TLSv1_3}[
        tls.min_version
    ]
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    if mode != "none":
        if tls.ca_file is None:
            raise ValueError(f"client_auth = {mode!r} needs tls.ca_file (the clients' CA)")
        ctx.load_verify_locations(cafile=tls.ca_file)
        ctx.verify_mode = ssl.CERT_REQUIRED if mode == "required" else ssl.CERT_OPTIONAL
    ctx.set_ciphers(TLS12_CIPHERS)
    ctx.options |= ssl.OP_NO_COMPRESSION
    return ctx


def client_context(
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
) -> ssl.SSLContext:
    """A client context that verifies the hub (against ``ca_file``, else the system's CAs) and
    its host name, offers only AEAD suites in TLS 1.2 (:data:`TLS12_CIPHERS`), and presents
    ``cert_file`` for mutual TLS."""
    ctx = ssl.create_default_context(cafile=ca_file)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.set_ciphers(TLS12_CIPHERS)
    if cert_file is not None:
        ctx.load_cert_chain(cert_file, key_file)
    return ctx


def peer_certificate(transport: object) -> dict[str, Any] | None:
    """The peer's verified certificate (``SSLSocket.getpeercert()``), or ``None``."""
    get = getattr(transport, "get_extra_info", None)
    cert = get("peercert") if get is not None else None
    return cert if isinstance(cert, dict) and cert else None


def tls_reason(exc: BaseException) -> str:
    """What a TLS failure says, in a few words, for one log line."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"{exc.reason}: {exc.verify_message}"
    if isinstance(exc, TimeoutError):
        return "timed out"
    return str(exc) or type(exc).__name__
