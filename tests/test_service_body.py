"""service/body.py: Content-Encoding decoding and its errors, through the app on a Unix socket and
on the decoder alone."""

from __future__ import annotations

import gzip
import json
import logging
import zlib

import pytest

from service_helpers import app_on_unix_socket, post_bytes, raw_connect, read_response, stub_state

from edge_runtime.service.body import body_decoder
from edge_runtime.service.schema import ApiError

BODY = b'{"prompt": [1, 2, 3], "max_tokens": 4}'


def _exchange(sock: str, requests: list[bytes]) -> list[tuple[int, dict, bytes]]:
    """Send the requests one after the other on one keep-alive connection."""
    conn = raw_connect(sock)
    answers = []
    for request in requests:
        conn.sendall(request)
        answers.append(read_response(conn))
    conn.close()
    return answers


def test_content_encoding_gzip_deflate_decoded_others_are_json_errors(tmp_path, caplog):
    """gzip on a body that is not gzip was a 500 with tracebacks and a reset connection; `br`
    got aiohttp's text/plain "Please install Brotli"."""
    def post(body: bytes, encoding: str) -> bytes:
        return post_bytes("/v1/completions", body, f"Content-Encoding: {encoding}\r\n")

    state = stub_state(max_body_bytes=4096)
    with app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock:
        answers = _exchange(sock, [
            post(gzip.compress(BODY), "gzip"),
            post(zlib.compress(BODY), "deflate"),
            post(zlib.compress(BODY)[2:-4], "deflate"),  # raw deflate, as aiohttp accepted it
            post(BODY, "identity"),
            post(BODY, "gzip"),  # the keep-alive connection survives this one
            post(gzip.compress(BODY)[:-8], "gzip"),  # cut short
            post(gzip.compress(b" " * (1 << 20) + BODY), "gzip"),  # 1 KiB that inflates to 1 MiB
            post(BODY, "gzip"),
        ])
        unsupported = _exchange(sock, [post(BODY, "br")])[0]
    statuses = [status for status, _, _ in answers]
    assert statuses == [200, 200, 200, 200, 400, 400, 413, 400], statuses
    for _, _, body in answers[4:6]:
        error = json.loads(body)["error"]
        assert (error["code"], error["param"]) == ("invalid_body", "Content-Encoding"), error
        assert "Content-Encoding: gzip" in error["message"]
    assert json.loads(answers[6][2])["error"]["code"] == "body_too_large"
    status, headers, body = unsupported
    assert status == 415 and headers["content-type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert (error["code"], error["param"]) == ("unsupported_encoding", "Content-Encoding")
    assert error["message"].startswith("Content-Encoding: br is not supported")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [key for key in state.metrics.requests if key[1] >= 500]


def _decode(encoding: str, data: bytes, step: int, limit: int = 1 << 20) -> bytes:
    """As body.read_body feeds it: stops once over `limit` (the caller then answers 413)."""
    decoder, out = body_decoder(encoding), b""
    for i in range(0, len(data), step):
        out += decoder.feed(data[i:i + step], limit - len(out))
        if len(out) > limit:
            return out
    decoder.finish()
    return out


@pytest.mark.parametrize("step", [1, 7, 1 << 16])
def test_decoder_matches_the_codecs_whatever_the_chunking(step):
    text = json.dumps({"prompt": "a fairly long prompt " * 50}).encode()
    assert _decode("gzip", gzip.compress(text), step) == text
    assert _decode("x-gzip", gzip.compress(text) + gzip.compress(text), step) == text * 2  # members
    assert _decode("deflate", zlib.compress(text), step) == text
    assert _decode("deflate", zlib.compress(text)[2:-4], step) == text  # raw deflate
    assert _decode("identity", text, step) == _decode("", text, step) == text
    # a bomb is decoded no further than one byte past the limit
    assert len(_decode("gzip", gzip.compress(b"x" * 100_000), step, limit=1000)) == 1001


def test_decoder_errors():
    with pytest.raises(ApiError) as e:
        _decode("deflate", zlib.compress(BODY) + b"junk", 1 << 16)
    assert (e.value.status, e.value.code) == (400, "invalid_body")
    assert "data follows the end of the deflate stream" in e.value.message
    for header in ("br", "zstd", "compress", "gzip, deflate"):
        with pytest.raises(ApiError) as e:
            body_decoder(header)
        assert (e.value.status, e.value.code, e.value.param) == \
            (415, "unsupported_encoding", "Content-Encoding")


def test_body_timeout_must_be_a_finite_positive_number():
    from edge_runtime.errors import ConfigError
    from edge_runtime.service_limits import ServiceLimits

    assert ServiceLimits.from_dict({"body_timeout_s": 2.5}).body_timeout_s == 2.5
    for value in (0, -1, float("nan"), float("inf")):
        with pytest.raises(ConfigError, match="service.body_timeout_s:? must be a finite number"):
            ServiceLimits.from_dict({"body_timeout_s": value})
