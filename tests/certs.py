"""Certificates for the TLS tests, made by trustme at test time (no key is ever committed).

:class:`Pki` holds one trusted CA, the hub's certificate (``localhost``, ``127.0.0.1``), and
writes PEM files for client certificates on demand: by common name, expired, or from a second,
untrusted CA. Server-side and client-side :class:`ssl.SSLContext` come from tidewire's own
builders, so the tests exercise the contexts the hub really uses.
"""

from __future__ import annotations

import datetime as dt
import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme

from tidewire.server.guard import TlsSettings, client_context, server_context


@dataclass(frozen=True)
class ClientCert:
    cert_file: str
    key_file: str


class Pki:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ca = trustme.CA()
        self.untrusted_ca = trustme.CA()
        self.ca_file = str(directory / "ca.pem")
        self.ca.cert_pem.write_to_path(self.ca_file)
        server = self.ca.issue_cert("localhost", "127.0.0.1", common_name="tidewire-hub")
        self.server_cert = str(directory / "hub.pem")
        self.server_key = str(directory / "hub.key")
        server.private_key_pem.write_to_path(self.server_key)
        with open(self.server_cert, "wb") as f:
            for blob in server.cert_chain_pems:
                f.write(blob.bytes())
        self._n = 0

    def tls(self, client_auth: str = "required") -> TlsSettings:
        """The hub's ``tls.*`` settings."""
        return TlsSettings(self.server_cert, self.server_key, self.ca_file, client_auth)

    def server_context(self, client_auth: str = "required") -> ssl.SSLContext:
        return server_context(self.tls(client_auth))

    def client(
        self, common_name: str, *, expired: bool = False, untrusted: bool = False
    ) -> ClientCert:
        """A client certificate with subject CN ``common_name``."""
        ca = self.untrusted_ca if untrusted else self.ca
        now = dt.datetime.now(dt.UTC)
        leaf = ca.issue_cert(
            f"client{self._n}.example",
            common_name=common_name,
            not_before=now - dt.timedelta(days=30 if expired else 1),
            not_after=now - dt.timedelta(days=1) if expired else now + dt.timedelta(days=30),
        )
        self._n += 1
        cert = self.dir / f"client{self._n}.pem"
        key = self.dir / f"client{self._n}.key"
        leaf.private_key_pem.write_to_path(str(key))
        with open(cert, "wb") as f:
            for blob in leaf.cert_chain_pems:
                f.write(blob.bytes())
        return ClientCert(str(cert), str(key))

    def client_context(self, cert: ClientCert | None = None) -> ssl.SSLContext:
        """A context that trusts the hub's CA and presents ``cert`` (if any)."""
        return client_context(
            self.ca_file,
            cert.cert_file if cert is not None else None,
            cert.key_file if cert is not None else None,
        )
