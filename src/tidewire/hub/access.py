"""Who a peer is, and which streams it may read and write.

A **principal** is the name the hub knows a peer by:

* ``token:<name>``: a bearer token from the tokens file (HTTP ``Authorization: Bearer``,
  WebSocket, RS.io over TCP's extension 2);
* ``cert:<common name>``: the subject CN of a client certificate that the TLS layer verified
  against ``tls.ca_file`` (mutual TLS);
* ``anonymous``: neither.

A **token** is ``<name>.<secret>``; the tokens file keeps only the SHA-256 of the whole token
(never the token), and an optional expiry. ``tidewire token create NAME`` makes one. Because
the token carries its name, a wrong secret is logged with the principal it claimed.

The **ACL file** grants ``read`` and ``write`` per principal, both as glob patterns
(:func:`fnmatch.fnmatchcase`: ``*``, ``?``, ``[...]``); a principal's rights are the union of
every table whose key (itself a glob) matches its name::

    [principal."token:ci"]
    read = ["*"]
    write = ["clicks.*", "orders"]

    [principal."cert:*"]          # every certificate holder
    read = ["shared.*"]

    [principal.anonymous]
    read = ["public.*"]

    [principal."token:prometheus"]
    monitor = true                # /metrics and the admin API (/api/...)

    [principal."token:ops"]
    admin = ["orders*"]           # create, delete, change the retention of matching streams

``admin`` (issue 23) is refused to everyone **without an ACL file**: unlike reads and writes,
deleting a stream or cutting its retention destroys data, so it is never part of the open
development default; an operator grants it explicitly.

A pattern matches the hub's own streams (``_tidewire.*``, :data:`~tidewire.hub.RESERVED_PREFIX`)
only when it names them: it starts with ``_tidewire``. So ``read = ["*"]`` is every stream a
client writes, and ``read = ["*", "_tidewire.*"]`` adds the hub's transaction registry and
Tolliver state.

Without an ACL file (``auth.acl_file`` unset) every principal may do everything: the
development default, for a hub bound to 127.0.0.1. With one, what it does not grant is
refused. The checks run in the protocol adapters, which turn :class:`~tidewire.model.Forbidden`
and :class:`~tidewire.model.Unauthenticated` into each protocol's own error.

A principal proved by a token remembers the token; every decision (:meth:`Access.check`,
:meth:`Access.may`, ...) re-validates it against the tokens the hub holds *now* and the clock,
so a token that expires, or that a reload (:meth:`Access.replace`, ``SIGHUP`` in ``tidewire
serve``) removed, is refused at the connection's next decision with
:class:`~tidewire.model.Unauthenticated`, not only at its next connection. Tokens are never
logged nor put in an error: only the name they claim (docs/security.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import secrets
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any, Literal

from ..model import Forbidden, TidewireError, Unauthenticated
from .hub import RESERVED_PREFIX

__all__ = [
    "ANONYMOUS",
    "Access",
    "AccessFileError",
    "Acl",
    "Action",
    "Grant",
    "Principal",
    "Token",
    "Tokens",
    "certificate_name",
    "certificate_principal",
    "mint_token",
]

Action = Literal["read", "write", "monitor", "admin"]
"""``monitor`` is not about a stream: the hub's metrics and admin API (the stream is ``""``).
``admin``: create, delete and change the retention of a stream (only with an ACL file)."""


class AccessFileError(TidewireError, ValueError):
    """An ACL or tokens file that cannot be read or is malformed (a start-up error)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a peer is: ``anonymous``, ``token:<name>`` or ``cert:<common name>``.

    ``token`` is the tokens-file entry that proved a ``token:`` principal (``None`` for any
    other): :class:`Access` re-validates it at each decision. Two principals are equal when
    their names are (the entry is not compared, hashed nor shown)."""

    name: str
    token: Token | None = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return self.name

    @property
    def anonymous(self) -> bool:
        return self.name == "anonymous"


ANONYMOUS = Principal("anonymous")


@dataclass(frozen=True, slots=True)
class Grant:
    """One ACL table: principals matching ``principal`` may read/write matching streams."""

    principal: str
    read: tuple[str, ...] = ()
    write: tuple[str, ...] = ()
    monitor: bool = False  # the hub's metrics and admin API (every stream's figures, peers)
    admin: tuple[str, ...] = ()  # streams it may create, delete, change the retention of


@dataclass(frozen=True, slots=True)
class Acl:
    """The ACL file, parsed. :meth:`allows` is the whole rule."""

    grants: tuple[Grant, ...] = ()
    _cache: dict[tuple[str, str, str], bool] = field(default_factory=dict, compare=False)

    @classmethod
    def parse(cls, text: str, source: str = "<acl>") -> Acl:
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise AccessFileError(f"{source}: {exc}") from None
        unknown = set(document) - {"principal"}
        if unknown:
            raise AccessFileError(f"{source}: unknown table(s) {sorted(unknown)}; "
                                  "rights go in [principal.\"<name>\"] tables")  # fmt: skip
        table = document.get("principal", {})
        if not isinstance(table, dict):
            raise AccessFileError(f"{source}: 'principal' must be a table of tables")
        grants = []
        for name, rights in table.items():
            if not isinstance(rights, dict) or not set(rights) <= {"read", "write", "monitor",
                                                                   "admin"}:  # fmt: skip
                raise AccessFileError(f"{source}: principal {name!r}: only 'read' and 'write' "
                                      "(and 'admin') lists and 'monitor' (true/false) are "
                                      "allowed")  # fmt: skip
            monitor = rights.get("monitor", False)
            if not isinstance(monitor, bool):
                raise AccessFileError(f"{source}: principal {name!r}: monitor must be true or "
                                      "false")  # fmt: skip
            grants.append(Grant(name, _patterns(source, name, rights, "read"),
                                _patterns(source, name, rights, "write"), monitor,
                                _patterns(source, name, rights, "admin")))  # fmt: skip
        return cls(tuple(grants))

    @classmethod
    def load(cls, path: str) -> Acl:
        return cls.parse(_read(path), path)

    def allows(self, principal: Principal, action: Action, stream: str) -> bool:
        """Whether a grant of ``principal`` has a pattern for ``action`` matching ``stream``
        (a pattern matches a ``_tidewire.*`` stream only if it starts with ``_tidewire``)."""
        key = (principal.name, action, stream)
        allowed = self._cache.get(key)
        if allowed is None and action == "monitor":
            allowed = any(grant.monitor for grant in self.grants
                          if fnmatchcase(principal.name, grant.principal))  # fmt: skip
            self._cache[key] = allowed
        elif allowed is None:
            reserved = stream.startswith(RESERVED_PREFIX)
            allowed = any(
                fnmatchcase(stream, pattern)
                for grant in self.grants
                if fnmatchcase(principal.name, grant.principal)
                for pattern in (grant.read if action == "read" else
                                grant.admin if action == "admin" else grant.write)
                if not reserved or pattern.startswith(_RESERVED_STEM)
            )
            if len(self._cache) >= 65536:  # principals x streams is unbounded: stay bounded
                self._cache.clear()
            self._cache[key] = allowed
        return allowed


_RESERVED_STEM = RESERVED_PREFIX.rstrip(".")
"""A pattern naming the hub's own streams starts with this (``_tidewire``)."""


def _patterns(source: str, name: str, rights: Mapping[str, Any], action: str) -> tuple[str, ...]:
    value = rights.get(action, [])
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise AccessFileError(f"{source}: principal {name!r}: {action} must be a list of globs")
    return tuple(value)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise AccessFileError(f"cannot read {path}: {exc}") from None


# --------------------------------------------------------------------------- tokens


@dataclass(frozen=True, slots=True)
class Token:
    """A tokens-file entry: the name, the SHA-256 of the token, and when it expires."""

    name: str
    sha256: bytes
    expires: float | None = None  # seconds since the epoch


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


def _token_name(token: str) -> str | None:
    name, dot, secret = token.rpartition(".")
    return name if dot and name and secret else None


MAX_SHOWN_NAME = 64
"""The longest claimed token name that a refusal repeats (longer ones are not shown)."""


def _claimed(name: str | None, known: bool) -> str:
    """What a refused token claimed, fit for an error and a log line (whose formatters escape
    control characters). An unknown name with a dot is not shown: ``<name>.<secret>.<more>``
    pasted by mistake claims ``<name>.<secret>``, and a refusal must never carry a secret. A
    name of the tokens file is shown, dots and all: it is no secret."""
    if name is None:
        return "a malformed token"
    if not known and ("." in name or len(name) > MAX_SHOWN_NAME):
        return "a token whose name is not shown (unknown, with a dot or too long)"
    return f"token:{name}"


def mint_token(name: str, days: float | None = None, now: float | None = None) -> tuple[str, str]:
    """A new token for ``name`` and the tokens-file table that accepts it."""
    if not name or any(c.isspace() or c in "\"\\" or c < " " or c == "\x7f" for c in name):
        raise ValueError(f"token name {name!r}: no spaces, quotes, backslashes or controls")
    token = f"{name}.{secrets.token_urlsafe(32)}"
    lines = [f'[token."{name}"]', f'sha256 = "{_digest(token).hex()}"']
    if days is not None:
        at = dt.datetime.fromtimestamp((time.time() if now is None else now) + days * 86400,
                                       dt.UTC).replace(microsecond=0)  # fmt: skip
        lines.append(f"expires = {at.strftime('%Y-%m-%dT%H:%M:%SZ')}")
    return token, "\n".join(lines) + "\n"


@dataclass(frozen=True, slots=True)
class Tokens:
    """The tokens file, parsed: ``[token."<name>"]`` with ``sha256`` and optional ``expires``."""

    by_name: Mapping[str, Token] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, source: str = "<tokens>") -> Tokens:
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise AccessFileError(f"{source}: {exc}") from None
        if set(document) - {"token"} or not isinstance(document.get("token", {}), dict):
            raise AccessFileError(f"{source}: tokens go in [token.\"<name>\"] tables only")
        out: dict[str, Token] = {}
        for name, entry in document.get("token", {}).items():
            if not isinstance(entry, dict) or not set(entry) <= {"sha256", "expires"}:
                raise AccessFileError(f"{source}: token {name!r}: keys are sha256 and expires")
            digest = entry.get("sha256")
            try:
                raw = bytes.fromhex(digest) if isinstance(digest, str) else b""
            except ValueError:
                raw = b""
            if len(raw) != 32:
                raise AccessFileError(f"{source}: token {name!r}: sha256 must be 64 hex digits")
            expires = entry.get("expires")
            if expires is not None and not isinstance(expires, dt.datetime):
                raise AccessFileError(f"{source}: token {name!r}: expires must be a date-time")
            if isinstance(expires, dt.datetime) and expires.tzinfo is None:
                expires = expires.replace(tzinfo=dt.UTC)
            out[name] = Token(name, raw, None if expires is None else expires.timestamp())
        return cls(out)

    @classmethod
    def load(cls, path: str) -> Tokens:
        return cls.parse(_read(path), path)

    def authenticate(self, token: str, now: float) -> Principal:
        """The principal ``token`` proves, or :class:`Unauthenticated` saying why not."""
        name = _token_name(token)
        entry = self.by_name.get(name) if name is not None else None
        # Compare even when the name is unknown, so timing tells nothing about which names exist.
        expected = entry.sha256 if entry is not None else bytes(32)
        if not hmac.compare_digest(_digest(token), expected) or entry is None:
            raise Unauthenticated(f"invalid token (claimed {_claimed(name, entry is not None)})")
        if entry.expires is not None and now >= entry.expires:
            raise Unauthenticated(f"token:{entry.name} expired")
        return Principal(f"token:{entry.name}", entry)

    def revalidate(self, principal: Principal, now: float) -> None:
        """Raise :class:`Unauthenticated` if the token that proved ``principal`` is no longer
        one of these (revoked: removed, or its hash changed) or has expired at ``now`` (by the
        expiry these tokens give it: a reload may extend or shorten it). A principal not
        proved by a token passes."""
        proof = principal.token
        if proof is None:
            return
        entry = self.by_name.get(proof.name)
        if entry is None or not hmac.compare_digest(entry.sha256, proof.sha256):
            raise Unauthenticated(f"{principal}: its token was revoked")
        if entry.expires is not None and now >= entry.expires:
            raise Unauthenticated(f"{principal}: its token expired")


# --------------------------------------------------------------------------- the whole policy


class Access:
    """The hub's policy: the tokens it accepts and the ACL it enforces (``None``: open).

    One object is shared by every listener; :meth:`replace` swaps the policy in place (a
    reload), so every connection's next decision uses the new one. Each decision method
    re-validates a token principal first (:meth:`Tokens.revalidate`) and raises
    :class:`~tidewire.model.Unauthenticated` for a token expired or revoked since the
    connection authenticated; :meth:`may` and :meth:`streams` raise it too, rather than
    answer ``False`` (which would read as "forbidden")."""

    def __init__(
        self,
        acl: Acl | None = None,
        tokens: Tokens | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.acl = acl
        self.tokens = tokens if tokens is not None else Tokens()
        self.clock = clock

    @property
    def open(self) -> bool:
        """No ACL: every principal may read and write every stream."""
        return self.acl is None

    def replace(self, acl: Acl | None, tokens: Tokens) -> None:
        """Use ``acl`` and ``tokens`` from now on (a reload: ``SIGHUP``). Connections keep
        their principals; each one's next decision re-validates its token against
        ``tokens`` and asks ``acl``."""
        self.acl = acl
        self.tokens = tokens

    def revalidate(self, principal: Principal) -> None:
        """:class:`Unauthenticated` if ``principal``'s token expired or was revoked."""
        self.tokens.revalidate(principal, self.clock())

    def authenticate(self, token: str | None) -> Principal:
        """``None`` is anonymous; anything else must be a valid, unexpired token."""
        if token is None:
            return ANONYMOUS
        return self.tokens.authenticate(token, self.clock())

    def bearer(self, header: str | None, fallback: Principal = ANONYMOUS) -> Principal:
        """The principal of an ``Authorization`` header (``Bearer <token>``), else ``fallback``."""
        if header is None:
            return fallback
        scheme, _, value = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            raise Unauthenticated("the Authorization header must be 'Bearer <token>'")
        return self.authenticate(value.strip())

    def check(self, principal: Principal, action: Action, stream: str) -> None:
        """Raise :class:`Forbidden` unless ``principal`` may ``action`` ``stream``, and
        :class:`Unauthenticated` if its token expired or was revoked. ``admin`` is refused
        to all without an ACL (module docstring)."""
        self.revalidate(principal)
        if self.acl is None and action == "admin":
            raise Forbidden(f"{principal} may not admin stream {stream!r}: no ACL file grants "
                            "admin (auth.acl_file)")  # fmt: skip
        if self.acl is not None and not self.acl.allows(principal, action, stream):
            raise Forbidden(f"{principal} may not {action} stream {stream!r}")

    def may(self, principal: Principal, action: Action, stream: str) -> bool:
        """Whether ``principal`` may ``action`` ``stream``; :class:`Unauthenticated` if its
        token expired or was revoked. ``admin`` needs an ACL."""
        self.revalidate(principal)
        if self.acl is None:
            return action != "admin"
        return self.acl.allows(principal, action, stream)

    def check_monitor(self, principal: Principal) -> None:
        """Raise :class:`Forbidden` unless ``principal`` may see the metrics and admin API
        (:class:`Unauthenticated` if its token expired or was revoked)."""
        self.revalidate(principal)
        if self.acl is not None and not self.acl.allows(principal, "monitor", ""):
            raise Forbidden(f"{principal} may not monitor the hub (ACL: monitor = true)")

    def streams(self, principal: Principal, names: Iterable[str]) -> list[str]:
        """The ``names`` that ``principal`` may read (for listings); :class:`Unauthenticated`
        if its token expired or was revoked."""
        self.revalidate(principal)
        acl = self.acl
        return list(names) if acl is None else [
            n for n in names if acl.allows(principal, "read", n)]  # fmt: skip


def certificate_name(peercert: Mapping[str, Any] | None) -> str | None:
    """The subject common name of a verified peer certificate (``getpeercert()``), if any."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


def certificate_principal(peercert: Mapping[str, Any] | None) -> Principal | None:
    name = certificate_name(peercert)
    return None if name is None else Principal(f"cert:{name}")
