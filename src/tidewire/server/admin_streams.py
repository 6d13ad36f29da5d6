"""The admin API's writes (issue 23): create a stream with its retention, change a stream's
retention, delete a stream; each allowed only to a principal the ACL grants ``admin`` on the
stream (none without an ACL file), and each audited (docs/observability.md, "Audit").

* ``POST /api/streams`` ``{"name": "orders", "retention_ms": 86400000, "retention_bytes":
  null}`` -> ``201`` and the stream's retention. The retention keys are optional: both
  absent, the configuration's values apply; given (``null``: no bound), they are the stream's
  runtime retention, kept over the configuration's across restarts, a key not given taking
  the configuration's value (as ``PATCH`` keeps an absent key).
* ``PATCH /api/streams/<name>`` ``{"retention_ms": ..., "retention_bytes": ...}`` (either or
  both; an absent one keeps the value that applies now) -> ``200`` and the new retention.
* ``DELETE /api/streams/<name>`` -> ``200`` ``{"deleted": "<name>"}``.

Errors are JSON ``{"error": "<reason>"}``: ``400`` (a body that is not the object above, a
bad name, the hub's own ``_tidewire.*`` streams), ``401``/``403`` (no ``admin`` right),
``404`` (no such stream), ``409`` (it exists already), ``501`` (a storage without stream
administration: none that ``tidewire serve`` runs; the embedded log and cluster mode both have
it), ``507`` (the disk, or the cluster, is full), ``500`` (the storage failed otherwise). The
cross-site rules of :mod:`.browser` (``X-Tidewire-Request: 1``, ``Content-Type:
application/json``, ``Origin``) are applied before any of this, by the app's middleware; so
is authentication (a bad token never gets here).

**Audit**: every request that reaches these routes, allowed or refused, is one ``INFO`` line
on the ``tidewire.audit`` logger (principal, peer, action, stream, old -> new, result; never a
token: a principal is a name) and one JSON record in the hub's own stream ``_tidewire.audit``
(:class:`Audit`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from ..hub import Hub, Ledger
from ..hub.access import Access, Principal
from ..hub.hub import NotSupported
from ..log import Retention, StreamExists
from ..model import (
    AccessError,
    InvalidStreamName,
    StorageFullError,
    TidewireError,
    UnknownStream,
)

__all__ = [
    "ADMIN_BODY_BYTES",
    "AUDIT_STREAM",
    "BODY_KEY",
    "Audit",
    "add_stream_admin_routes",
    "parse_retention",
    "takes_body",
]

audit_log = logging.getLogger("tidewire.audit")

ADMIN_BODY_BYTES = 64 * 1024
"""The largest body an admin write may have (its JSON is a few dozen bytes)."""
AUDIT_STREAM = "_tidewire.audit"
BODY_KEY = web.RequestKey("tidewire.body", bytes)
"""The body of an admin write, read by the app's middleware (:func:`takes_body`)."""
_PREFIX = "/api/streams"
_RETENTION_KEYS = ("retention_ms", "retention_bytes")


def takes_body(method: str, path: str) -> bool:
    """Whether a request's body is kept for its route (the app's middleware reads every body,
    within ``ADMIN_BODY_BYTES`` for these, and drops the others)."""
    return method in ("POST", "PATCH") and (path == _PREFIX or path.startswith(_PREFIX + "/"))


class BadRequest(TidewireError, ValueError):
    """An admin request's body or name is not what the route takes."""


def _value(doc: dict[str, Any], key: str) -> int | None:
    value = doc[key]
    if value is not None and (type(value) is not int or value < 0 or value >= 2**63):
        raise BadRequest(f"{key} must be a non-negative integer or null, not {value!r:.40}")
    return value


def parse_retention(doc: dict[str, Any], current: Retention | None
                    ) -> tuple[int | None, int | None] | None:  # fmt: skip
    """The retention a body asks for: its ``retention_ms`` and ``retention_bytes``, an absent
    one taken from ``current`` (``None`` when neither is given)."""
    if not any(k in doc for k in _RETENTION_KEYS):
        return None
    ms = _value(doc, "retention_ms") if "retention_ms" in doc else (
        current.ms if current is not None else None)  # fmt: skip
    nbytes = _value(doc, "retention_bytes") if "retention_bytes" in doc else (
        current.bytes if current is not None else None)  # fmt: skip
    return ms, nbytes


def _body(request: web.Request, allowed: set[str]) -> dict[str, Any]:
    raw = request.get(BODY_KEY, b"")
    try:
        doc = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise BadRequest(f"the body is not JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = set(doc) - allowed
    if unknown:
        raise BadRequest(f"unknown key(s) {sorted(unknown)!r:.80}; expected {sorted(allowed)}")
    return doc


def _shown(retention: Retention | tuple[int | None, int | None] | None) -> dict[str, Any] | None:
    if retention is None:
        return None
    if isinstance(retention, Retention):
        return {"ms": retention.ms, "bytes": retention.bytes, "source": retention.source}
    return {"ms": retention[0], "bytes": retention[1]}


class Audit:
    """The audit trail of the admin writes: a log line and a record in ``_tidewire.audit``
    (module docstring). A record that cannot be stored (a full disk) is logged as a warning;
    the line is written whatever happens."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.ledger: Ledger = hub.ledger(AUDIT_STREAM)

    async def __call__(self, who: Principal, peer: str, action: str, stream: str,
                       old: Any, new: Any, result: str) -> None:  # fmt: skip
        audit_log.info("%s from %s: %s stream %r: %s -> %s: %s", who.name, peer, action,
                       stream, json.dumps(old), json.dumps(new), result)  # fmt: skip
        record = {"at": self.hub.clock(), "principal": who.name, "peer": peer,
                  "action": action, "stream": stream, "old": old, "new": new,
                  "result": result}  # fmt: skip
        try:
            await self.ledger.record(record)
        except TidewireError as exc:
            audit_log.warning("the audit record of the line above was not stored: %s", exc)


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


def _answer_error(exc: TidewireError, who: Principal, open_hub: bool
                  ) -> tuple[web.Response, str]:  # fmt: skip
    """The JSON answer to a failed admin request, and its result for the audit: an ACL's
    refusal of anonymous is ``401`` (credentials would help), others ``403``."""
    if isinstance(exc, AccessError):
        reason = str(exc)
        reason = "refused: " + reason[len(who.name) + 1:] if reason.startswith(who.name) else (
            "refused: " + reason)  # fmt: skip
        if who.anonymous and not open_hub:
            return _error(401, reason, {"WWW-Authenticate": 'Bearer realm="tidewire"'}), reason
        return _error(403, reason), reason
    status = (400 if isinstance(exc, BadRequest | InvalidStreamName | ValueError) else
              404 if isinstance(exc, UnknownStream) else 409 if isinstance(exc, StreamExists)
              else 501 if isinstance(exc, NotSupported) else
              507 if isinstance(exc, StorageFullError) else 500)  # fmt: skip
    return _error(status, str(exc)), f"failed ({status}): {exc}"


def add_stream_admin_routes(app: web.Application, hub: Hub, access: Access) -> None:
    """Mount the three admin writes (module docstring) on ``app``."""
    from .rsio_http import principal  # (rsio_http imports the app's keys)

    audit = Audit(hub)

    Work = Callable[[], Awaitable[tuple[Any, web.Response]]]

    async def run(request: web.Request, action: str, stream: str, work: Work) -> web.Response:
        who = principal(request)
        peer = request.remote or "-"
        old = _shown(hub.retention(stream)) if hub.has_stream(stream) else None
        new: Any = None
        try:
            access.check(who, "admin", stream)
            new, answer = await work()
        except TidewireError as exc:
            response, result = _answer_error(exc, who, access.open)
            await audit(who, peer, action, stream, old, new, result)
            return response
        await audit(who, peer, action, stream, old, new, "ok")
        return answer

    async def create(request: web.Request) -> web.Response:
        try:
            doc = _body(request, {"name", *_RETENTION_KEYS})
            name = doc.get("name")
            if not isinstance(name, str) or not name:
                raise BadRequest("the body must name the stream: {\"name\": \"...\"}")
        except BadRequest as exc:
            who = principal(request)
            await audit(who, request.remote or "-", "create", "", None, None,
                        f"failed (400): {exc}")  # fmt: skip
            return _error(400, str(exc))

        async def work() -> tuple[Any, web.Response]:
            wanted = parse_retention(doc, hub.retention(name))  # (one key: the other's as now)
            if wanted is None:
                await hub.create_stream(name)
            else:
                await hub.create_stream(name, *wanted, runtime=True)
            now = _shown(hub.retention(name))
            return now, web.json_response({"name": name, "retention": now}, status=201)

        return await run(request, "create", name, work)

    async def patch(request: web.Request) -> web.Response:
        name = request.match_info["name"]

        async def work() -> tuple[Any, web.Response]:
            wanted = parse_retention(_body(request, set(_RETENTION_KEYS)), hub.retention(name))
            if wanted is None:
                raise BadRequest("nothing to change: give retention_ms and/or retention_bytes")
            await hub.set_retention(name, *wanted)
            now = _shown(hub.retention(name))
            return now, web.json_response({"name": name, "retention": now})

        return await run(request, "set_retention", name, work)

    async def delete(request: web.Request) -> web.Response:
        name = request.match_info["name"]

        async def work() -> tuple[Any, web.Response]:
            await hub.delete_stream(name)
            return None, web.json_response({"deleted": name})

        return await run(request, "delete", name, work)

    app.router.add_post(_PREFIX, create)
    app.router.add_patch(_PREFIX + "/{name:.+}", patch)
    app.router.add_delete(_PREFIX + "/{name:.+}", delete)
