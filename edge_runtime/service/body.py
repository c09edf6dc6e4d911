"""Reading a request body: size limit, time limit, Content-Encoding.

Invariants:
- `read_body` returns the decoded body or raises `ApiError` (or CancelledError once the client is
  gone): 408 `body_timeout` if the body has not arrived within the time limit (the connection is
  then closed), 413 `body_too_large` past the limit (after draining the body, so the client reads
  the answer), 400 `invalid_body` for a body that does not decode as its Content-Encoding says,
  415 `unsupported_encoding` for a coding other than identity, gzip (x-gzip) or deflate.
- The size limit applies to the decoded bytes, and decoding never produces more than the room
  left under it (+1 byte to tell that it is over), so a compressed bomb costs no more memory than
  a plain body. aiohttp's own decompression is off (app.py) so that these errors are ours.
"""

from __future__ import annotations

import asyncio
import logging
import zlib

from aiohttp import web
from aiohttp.web import RequestPayloadError

from edge_runtime.service.schema import ApiError

log = logging.getLogger(__name__)
_DRAIN_LIMIT = 64 << 20  # read (and drop) at most this much of an oversized body before answering


async def read_body(request: web.Request, limit: int, timeout_s: float) -> bytes:
    """The decoded body; 408 if it does not arrive within `timeout_s`, a JSON 413 once it exceeds
    `limit` bytes (after draining it, so the client reads the answer), 400/415 for its encoding."""
    decoder = body_decoder(request.headers.get("Content-Encoding", ""))
    try:
        return await asyncio.wait_for(_read_body(request, limit, decoder), timeout_s)
    except asyncio.TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout_s:g} s "
                       "(service.body_timeout_s); send the whole body with the headers",
                       "body_timeout", close_connection=True) from None
    except ConnectionResetError:
        # The client went away mid-body and aiohttp cancels this handler; wait_for can hand the
        # payload's error up instead of the cancellation: end the request as a disconnect.
        log.info("client disconnected while sending the body of %s", request.path)
        raise asyncio.CancelledError() from None
    except RequestPayloadError as exc:  # the rest of the body cannot be parsed
        raise ApiError(400, f"the request body could not be read ({exc}); check its "
                       "Content-Length or Transfer-Encoding", "invalid_body",
                       close_connection=True) from None


async def _read_body(request: web.Request, limit: int, decoder: BodyDecoder) -> bytes:
    too_big = ApiError(413, f"request body larger than this server's limit of {limit} bytes",
                       "body_too_large")
    if request.content_length is not None and request.content_length > limit:
        await _drain(request)
        raise too_big
    parts, size = [], 0
    async for part in request.content.iter_chunked(1 << 16):
        part = decoder.feed(part, limit - size)
        size += len(part)
        if size > limit:
            await _drain(request)
            raise too_big
        parts.append(part)
    decoder.finish()
    return b"".join(parts)


class BodyDecoder:
    """Content-Encoding identity, gzip (one member or several, RFC 1952) or deflate (zlib-wrapped
    or raw, as aiohttp took it), decoded incrementally, at most `room` + 1 bytes per call."""

    def __init__(self, encoding: str, header: str) -> None:
        assert encoding in ("identity", "gzip", "deflate"), encoding
        self.encoding, self.header = encoding, header
        self.inflater = None  # made from the first bytes (deflate: with or without zlib header)
        self.seen_data = False

    def _inflater(self, first: bytes):
        if self.encoding == "gzip":
            return zlib.decompressobj(16 + zlib.MAX_WBITS)
        raw = first[0] & 0x0F != 8  # not a zlib header (CM = 8): raw deflate
        return zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)

    def feed(self, data: bytes, room: int) -> bytes:
        self.seen_data = self.seen_data or bool(data)
        if self.encoding == "identity":
            return data
        out = b""
        try:
            while data and len(out) <= room:
                if self.inflater is None:
                    self.inflater = self._inflater(data)
                elif self.inflater.eof:  # a stream ended and more data follows
                    if self.encoding != "gzip":
                        raise self._bad("data follows the end of the deflate stream")
                    self.inflater = self._inflater(data)  # the next gzip member
                out += self.inflater.decompress(data, room - len(out) + 1)
                data = self.inflater.unused_data if self.inflater.eof else b""
        except zlib.error as exc:
            raise self._bad(str(exc)) from None
        return out

    def finish(self) -> None:
        """Raise if the compressed data stopped mid-stream (an empty body stays empty)."""
        if self.seen_data and self.inflater is not None and not self.inflater.eof:
            raise self._bad(f"the {self.encoding} stream is cut short")

    def _bad(self, why: str) -> ApiError:
        return ApiError(400, f"the request body does not decode as its Content-Encoding: "
                        f"{self.header} says ({why}); compress it as declared, or send it "
                        "uncompressed without Content-Encoding", "invalid_body", "Content-Encoding")


def body_decoder(header: str) -> BodyDecoder:
    """The decoder for a Content-Encoding header; 415 for a coding this server does not decode."""
    codings = [{"x-gzip": "gzip"}.get(c, c) for c in (c.strip().lower() for c in header.split(","))
               if c not in ("", "identity")]
    if not codings:
        return BodyDecoder("identity", header)
    if len(codings) == 1 and codings[0] in ("gzip", "deflate"):
        return BodyDecoder(codings[0], header)
    raise ApiError(415, f"Content-Encoding: {header} is not supported; send the body "
                   "uncompressed, or compressed with gzip or deflate", "unsupported_encoding",
                   "Content-Encoding")


async def _drain(request: web.Request) -> None:
    drained = 0
    while drained < _DRAIN_LIMIT and not request.content.at_eof():
        part = await request.content.readany()
        if not part:
            break
        drained += len(part)
