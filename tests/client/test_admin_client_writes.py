"""``AdminClient``'s admin writes (create a stream, change its retention, delete it) against the
hub's app on a real socket on 127.0.0.1 (tests/browser.py's ``hub_app``), with an ACL that
grants ``admin`` on ``orders*`` to one token: the typed answers, ``None`` (no bound) against an
argument not given, and each refusal as an :class:`AdminError` with the hub's status and
text."""

from __future__ import annotations

import socket
from collections.abc import Awaitable
from pathlib import Path

import pytest

from browser import hub_app
from helpers import run
from tidewire.client.admin import NOT_GIVEN, AdminClient, AdminError
from tidewire.hub.access import Access, Acl, Tokens, mint_token
from tidewire.model import Batch

pytestmark = pytest.mark.timeout(120)

OPS, OPS_TABLE = mint_token("ops")
ALICE, ALICE_TABLE = mint_token("alice")
ACL = ('[principal."token:ops"]\nadmin = ["orders*"]\nmonitor = true\n'
       '[principal."token:alice"]\nread = ["*"]\nwrite = ["*"]\nmonitor = true\n')  # fmt: skip


def _access() -> Access:
    return Access(Acl.parse(ACL), Tokens.parse(OPS_TABLE + ALICE_TABLE))


def test_create_change_and_delete_with_the_admin_right(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "d", _access(), sampler=False) as (hub, base), \
                AdminClient(base, token=OPS) as admin:  # fmt: skip
            made = await admin.create_stream("orders1", retention_ms=60_000, retention_bytes=None)
            assert made == {"name": "orders1",
                            "retention": {"ms": 60_000, "bytes": None, "source": "runtime"}}
            assert hub.has_stream("orders1")
            # neither argument: the configuration's retention (no bound by default)
            plain = await admin.create_stream("orders2")
            assert plain["retention"] == {"ms": None, "bytes": None, "source": "default"}
            listed = {s["name"]: s for s in await admin.streams()}
            assert listed["orders1"]["retention"] == made["retention"]

            # an argument not given keeps what applies; None lifts the bound
            changed = await admin.set_retention("orders1", retention_bytes=1 << 20)
            assert changed["retention"] == {"ms": 60_000, "bytes": 1 << 20, "source": "runtime"}
            changed = await admin.set_retention("orders1", retention_ms=None,
                                                retention_bytes=NOT_GIVEN)  # fmt: skip
            assert changed["retention"] == {"ms": None, "bytes": 1 << 20, "source": "runtime"}
            assert await admin.set_retention("orders2", retention_ms=5000) == {
                "name": "orders2",
                "retention": {"ms": 5000, "bytes": None, "source": "runtime"},
            }

            await hub.append(Batch.build("orders1", [b"x", b"y"]), assign_ids=True)
            assert await admin.delete_stream("orders1") == {"deleted": "orders1"}
            assert not hub.has_stream("orders1")
            assert "orders1" not in [s["name"] for s in await admin.streams()]

            # a name with bytes that mean something in a URL reaches the hub as it is
            odd = "orders/eu#1?x=%41"
            await admin.create_stream(odd)
            assert hub.has_stream(odd)
            assert (await admin.set_retention(odd, retention_ms=1))["name"] == odd
            assert await admin.delete_stream(odd) == {"deleted": odd}
            assert not hub.has_stream(odd)

    run(main())


def test_the_hubs_refusals_are_admin_errors(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "d", _access(), sampler=False) as (hub, base), \
                AdminClient(base, token=OPS) as ops, AdminClient(base, token=ALICE) as alice, \
                AdminClient(base) as anonymous:  # fmt: skip
            await hub.append(Batch.build("other", [b"x"]), assign_ids=True)
            await ops.create_stream("orders")

            async def refused(call: Awaitable[object]) -> AdminError:
                with pytest.raises(AdminError) as caught:
                    await call
                return caught.value

            error = await refused(ops.delete_stream("other"))  # not granted on this stream
            assert (error.status, error.message) == (403, "refused: may not admin stream 'other'")
            assert str(error) == "403 Forbidden: refused: may not admin stream 'other'"
            error = await refused(alice.set_retention("orders", retention_ms=1))  # no admin
            assert (error.status, error.message) == (
                403, "refused: may not admin stream 'orders'")  # fmt: skip
            error = await refused(anonymous.create_stream("orders9"))
            assert error.status == 401
            error = await refused(ops.create_stream("orders"))
            assert error.status == 409
            assert "orders" in error.message
            error = await refused(ops.delete_stream("orders-none"))
            assert error.status == 404
            error = await refused(ops.set_retention("orders-none", retention_ms=1))
            assert error.status == 404
            error = await refused(ops.create_stream("orders x"))  # whitespace: not a name
            assert error.status == 400
            assert hub.has_stream("other")
            assert hub.has_stream("orders")
            assert not hub.has_stream("orders9")

            # mistakes caught before anything is sent
            with pytest.raises(ValueError, match="nothing to change"):
                await ops.set_retention("orders")
            with pytest.raises(ValueError, match="non-negative"):
                await ops.create_stream("orders3", retention_ms=-1)
            with pytest.raises(ValueError, match="non-negative"):
                await ops.set_retention("orders", retention_bytes=True)
            with pytest.raises(ValueError, match="not empty"):
                await ops.delete_stream("")
            assert not hub.has_stream("orders3")

    run(main())


def test_without_an_acl_file_no_one_may_admin(tmp_path: Path) -> None:
    async def main() -> None:
        async with hub_app(tmp_path / "d", sampler=False) as (hub, base), \
                AdminClient(base) as admin:  # fmt: skip
            with pytest.raises(AdminError) as caught:
                await admin.create_stream("orders")
            assert caught.value.status == 403
            assert "no ACL file grants admin" in caught.value.message
            assert not hub.has_stream("orders")

    run(main())


def test_a_hub_that_is_not_there() -> None:
    with socket.socket() as s:  # a port nothing listens on (bound, then let go)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def main() -> None:
        async with AdminClient(f"http://127.0.0.1:{port}", timeout=5) as admin:
            with pytest.raises(AdminError) as caught:
                await admin.delete_stream("orders")
            assert caught.value.status == 0
            assert "cannot reach the hub" in caught.value.message

    run(main())
