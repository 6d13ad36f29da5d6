"""The asyncio RS.io-over-HTTP client (seed 002), over aiohttp's client:
``async with HttpHub("http://127.0.0.1:7480") as hub: async for batch in hub.subscribe("s")``.

It follows the seed's client rules (docs/protocols/rsio-http.md):

* subscribes with ``PUT <publisher url>?request=<demand>``, then long-polls the subscription
  URL, asking for more (``request=``) as the application consumes, so that at most ``demand``
  elements are asked for and not yet handed over;
* ``204`` polls again (after ``Retry-After`` when the server gives one), ``410`` ends the
  iteration (onComplete);
* a 4xx/5xx with ``X-Rsio-Error`` ends it with :class:`HttpRsioError` (the server has cancelled);
  a 5xx without the header, or a failed connection, is retried with exponential backoff and
  jitter (``retries`` times); a 4xx without it (and 501, 502, 505) is final. Giving up sends
  the extra ``cancel`` the seed asks for;
* every fetch tells the hub the sequence number of the next element it expects
  (``X-Tidewire-Sequence``), and elements received twice after a resend are dropped.

Credentials: ``token=`` is sent on every request as ``Authorization: Bearer <token>`` (a
refusal is a 401/403 onError: :class:`HttpRsioError`); ``ssl=`` is the TLS context for
``https://`` (e.g. with a client certificate, ``tidewire.server.guard.client_context``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import ssl as _ssl
from collections.abc import AsyncGenerator
from typing import Any

import aiohttp
import yarl

from ..model import Batch, TidewireError, validate_stream_name
from ..protocols.rsio.publisher import PublisherName, envelopes_to_batch
from ..protocols.rsio_http import (
    ERROR_HEADER,
    SEQUENCE_HEADER,
    ClientSubscription,
    decode_body,
)
from ..protocols.rsio_http.codec import MAX_DEMAND
from .rsio import _start

__all__ = ["HttpHub", "HttpRsioError"]

FINAL_5XX = (501, 502, 505)  # the seed: final even without X-Rsio-Error


class HttpRsioError(TidewireError):
    """The subscription ended with an error: ``status`` (0: no HTTP answer) and the message;
    ``rsio`` when the hub said so itself (``X-Rsio-Error``)."""

    def __init__(self, status: int, message: str, *, rsio: bool) -> None:
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.rsio = rsio


class HttpHub:
    """A hub's RS.io-over-HTTP endpoint (``base_url``: ``http://host:port``)."""

    def __init__(self, base_url: str, *, session: aiohttp.ClientSession | None = None,
                 retries: int = 6, backoff: float = 0.05, max_backoff: float = 2.0,
                 poll_timeout: float = 90.0, token: str | None = None,
                 ssl: _ssl.SSLContext | None = None) -> None:  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {token}"} if token is not None else {}
        self._ssl: _ssl.SSLContext | bool = ssl if ssl is not None else True  # True: verify
        self._own_session = session is None
        self._session = session
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.poll_timeout = poll_timeout  # longer than the hub's poll window (25 s by default)

    async def __aenter__(self) -> HttpHub:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                auto_decompress=False,  # X-Rsio-* "encodings" are the bodies' own layout
                timeout=aiohttp.ClientTimeout(total=None, sock_read=self.poll_timeout),
            )
        return self._session

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ typed subscriptions

    async def subscribe(
        self, stream: str, *, from_id: int | str = "earliest", until_id: int | None = None,
        key: bytes | None = None, demand: int = 1000,
    ) -> AsyncGenerator[Batch, None]:  # fmt: skip
        """Batches of ``stream`` (the envelope format: ids, keys, timestamps), from
        ``from_id`` ("earliest", "latest" or an id), live or up to ``until_id``."""
        validate_stream_name(stream)
        name = PublisherName(stream, _start(from_id), until_id, key)
        async for elements in self.elements(str(name), demand=demand):
            try:
                yield envelopes_to_batch(stream, elements)
            except (ValueError, TidewireError) as exc:
                raise HttpRsioError(0, f"a malformed envelope on {stream!r}: {exc}",
                                    rsio=False) from None  # fmt: skip

    async def subscribe_values(
        self, stream: str, *, size: int = 0, from_id: int | str = "earliest",
        until_id: int | None = None, key: bytes | None = None, demand: int = 1000,
    ) -> AsyncGenerator[list[bytes], None]:  # fmt: skip
        """Values only (``format=value``; ``size=N``: fixed-size elements)."""
        name = PublisherName(stream, _start(from_id), until_id, key, "value", size)
        async for elements in self.elements(str(name), demand=demand):
            yield elements

    # ------------------------------------------------------------------ the protocol

    async def elements(self, publisher: str, *, demand: int = 1000
                       ) -> AsyncGenerator[list[bytes], None]:  # fmt: skip
        """The elements of ``publisher`` (RS.io's publisher name: a percent-encoded stream and
        its arguments), a list per response, each element once."""
        if not 1 <= demand <= MAX_DEMAND:
            raise ValueError("demand is 1 to 2^63-1")
        path, _, query = publisher.partition("?")
        path = {".": "%2E", "..": "%2E%2E"}.get(path, path)  # (not dot segments of the URL)
        url = f"{self.base_url}/rsio/pub/{path}?{query + '&' if query else ''}request={demand}"
        response = await self._put(url)
        if response.status != 201 or "Location" not in response.headers:
            raise HttpRsioError(response.status, "no subscription (201 with a Location) in "
                                "answer to the subscribe", rsio=False)  # fmt: skip
        sub_url = response.headers["Location"]
        state = ClientSubscription()
        state.asked(demand)
        done = False
        try:
            while True:
                more = demand - state.outstanding if state.outstanding <= demand // 2 else 0
                fetch = f"{sub_url}?request={more}" if more else sub_url
                seen = {SEQUENCE_HEADER: str(state.next_seq)}
                response = await self._put(fetch, headers=seen)
                state.asked(more)  # (the hub answered: it has counted them)
                if response.status == 200:
                    first = response.headers.get(SEQUENCE_HEADER)
                    elements = decode_body(response.headers.get("Content-Encoding"),
                                           response.body)  # fmt: skip
                    fresh = state.received(int(first) if first is not None else None, elements)
                    if fresh:
                        yield fresh
                elif response.status == 204:
                    delay = _retry_after(response.headers.get("Retry-After"))
                    if delay:
                        await asyncio.sleep(delay)
                elif response.status == 410:
                    done = True
                    return
                else:
                    raise HttpRsioError(response.status, "unexpected answer to a fetch",
                                        rsio=False)  # fmt: skip
        except HttpRsioError as exc:
            done = exc.rsio  # the hub cancelled it itself
            raise
        finally:
            if not done:  # the application stopped, or the client gives up: the extra cancel
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._cancel(sub_url))

    async def _cancel(self, sub_url: str) -> None:
        async with asyncio.timeout(5):
            async with self.session.put(sub_url + "/cancel", headers=self._auth,
                                        ssl=self._ssl) as response:  # fmt: skip
                await response.read()

    async def _put(self, url: str, *, headers: dict[str, str] | None = None) -> _Answer:
        """One request, retried on 5xx without ``X-Rsio-Error`` and on connection failures;
        an onError or a final error raises :class:`HttpRsioError`."""
        attempt = 0
        while True:
            try:
                target = yarl.URL(url, encoded=True)  # as written: no dot-segment removal
                async with self.session.put(target, headers={**self._auth, **(headers or {})},
                                            ssl=self._ssl) as response:  # fmt: skip
                    body = await response.read()
                    answer = _Answer(response.status, response.headers, body)
            except aiohttp.ClientConnectorCertificateError as exc:  # trying again won't help
                raise HttpRsioError(0, f"the hub's certificate: {exc}", rsio=False) from None
            except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
                answer = _Answer(0, {}, str(exc).encode())
            if 0 < answer.status < 400 or answer.status == 410:  # (410: onComplete)
                return answer
            message = answer.body.decode("utf-8", "replace").strip()[:500]
            if answer.headers.get(ERROR_HEADER, "").lower() == "true":
                raise HttpRsioError(answer.status, message, rsio=True)
            retriable = answer.status == 0 or (answer.status >= 500
                                               and answer.status not in FINAL_5XX)  # fmt: skip
            if not retriable or attempt >= self.retries:
                raise HttpRsioError(answer.status, message or "no answer", rsio=False)
            delay = min(self.max_backoff, self.backoff * 2**attempt) * (0.5 + random.random() / 2)
            attempt += 1
            await asyncio.sleep(delay)


class _Answer:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body


def _retry_after(value: str | None) -> float:
    if value is None or not value.strip().isdigit():
        return 0.0
    return min(30.0, float(value.strip()))
