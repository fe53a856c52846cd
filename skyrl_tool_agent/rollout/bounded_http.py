"""One HTTP exchange with a server that may be hostile, under hard bounds.

httpx's timeouts bound each wait, not the exchange (a server dripping a byte a second holds a
request forever), and httpx inflates a gzip body whole. Here

- one deadline covers connect, request, headers and the entire body; past it the request fails
  with `httpx.ReadTimeout`, a transport error like httpx's own;
- the body is refused (`ResponseTooLarge`) as soon as it passes `max_bytes`, on the wire and after
  decompression (gzip/deflate are inflated here a bounded slice at a time);
- any other content coding, or a body that is not the coding it claims, is `UndecodableResponse`.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from typing import Any

import httpx

#: What the bounded reader can inflate (sent as Accept-Encoding).
ACCEPT_ENCODING = "gzip, deflate"


class ResponseTooLarge(Exception):
    """The body passed the cap, on the wire or after decompression."""


class UndecodableResponse(Exception):
    """The body's content coding is unknown or broken."""


@dataclass(frozen=True)
class BoundedResponse:
    """A complete answer: status and the decoded body (at most the cap)."""

    status_code: int
    reason_phrase: str
    content: bytes

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


class _Inflater:
    """Incremental gzip/deflate decoding that never produces more than it is allowed to."""

    def __init__(self, coding: str) -> None:
        self.coding = coding
        # gzip: the gzip header; deflate: the zlib header (RFC 9110), raw deflate tried if it is absent
        self._wbits = 16 + zlib.MAX_WBITS if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
        self._decoder = zlib.decompressobj(self._wbits)
        self._started = False

    def feed(self, data: bytes, room: int) -> bytes:
        """Inflate `data`, giving at most `room` + 1 bytes: more than `room` means the body is over
        the cap (the rest stays unexpanded in the decoder's unconsumed_tail)."""
        try:
            out = self._decoder.decompress(data, room + 1)
        except zlib.error as exc:
            if self._started or self._wbits != zlib.MAX_WBITS:
                raise UndecodableResponse(f"body is not valid {self.coding}: {exc}") from exc
            self._wbits = -zlib.MAX_WBITS  # deflate without the zlib header, as some servers send it
            self._decoder = zlib.decompressobj(self._wbits)
            return self.feed(data, room)
        self._started = True
        return out


async def bounded_request(client: httpx.AsyncClient, method: str, url: str, *, deadline_s: float,
                          max_bytes: int, json: Any = None) -> BoundedResponse:
    """`method url` through `client`, whole within `deadline_s` seconds, body at most `max_bytes`
    (on the wire and decoded). Raises `httpx.TransportError` (the deadline: `httpx.ReadTimeout`),
    `ResponseTooLarge` or `UndecodableResponse`."""
    request = client.build_request(method, url, json=json, headers={"Accept-Encoding": ACCEPT_ENCODING})
    try:
        async with asyncio.timeout(deadline_s) as deadline:
            response = await client.send(request, stream=True)
            try:
                content = await _read_capped(response, max_bytes)
            finally:
                await response.aclose()
    except TimeoutError as exc:
        if not deadline.expired():
            raise
        raise httpx.ReadTimeout(f"no complete answer within {deadline_s:g} s", request=request) from exc
    return BoundedResponse(response.status_code, response.reason_phrase, content)


async def _read_capped(response: httpx.Response, max_bytes: int) -> bytes:
    declared = response.headers.get("Content-Length", "")
    if declared.strip().isdigit() and int(declared) > max_bytes:
        raise ResponseTooLarge(f"body of {int(declared)} bytes declared, over the {max_bytes}-byte cap")
    codings = [c.strip().lower() for c in response.headers.get("Content-Encoding", "").split(",")]
    codings = [c for c in codings if c and c != "identity"]
    if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
        raise UndecodableResponse(f"content coding {', '.join(codings)!r} (only {ACCEPT_ENCODING} is accepted)")
    coding = codings[0] if codings else "identity"
    inflater = _Inflater(coding) if codings else None
    wire = 0
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_raw():
        wire += len(chunk)
        if wire > max_bytes:
            raise ResponseTooLarge(f"body over the {max_bytes}-byte cap")
        part = inflater.feed(chunk, max_bytes - size) if inflater else chunk
        size += len(part)
        if size > max_bytes:
            raise ResponseTooLarge(f"body over the {max_bytes}-byte cap once {coding}-decoded "
                                   f"({wire} bytes on the wire)")
        parts.append(part)
    return b"".join(parts)
