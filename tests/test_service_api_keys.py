"""API keys of the TCP listener (service/api_keys.py): the keys file and who may read it, the
Bearer check over every key, and each refusal as docs/service.md documents it: wrong, missing and
short keys (one fixed 401), a key in the query string (400, never logged), the Unix socket
unchanged. Every connection is to 127.0.0.1 or a Unix socket."""

from __future__ import annotations

import json
import logging

import pytest

from service_helpers import (app_on_tcp, app_on_unix_socket, client, raw_connect, read_response,
                             stub_state, write_keys)

KEY = "a" * 8 + "0123456789abcdef0123456789abcdef"
OTHER = "other-key-" + "9" * 32
COMPLETION = {"prompt": [1, 2], "max_tokens": 2}


def _keys(*keys):
    from edge_runtime.service.api_keys import ApiKeys

    return ApiKeys(list(keys))


def test_a_keys_file_is_read_one_key_a_line_with_comments_and_blank_lines(tmp_path):
    from edge_runtime.service.api_keys import load_api_keys

    path = write_keys(tmp_path / "keys", KEY, "", "# a comment", OTHER)
    keys = load_api_keys(str(path))
    assert len(keys) == 2
    assert keys.accepts(f"Bearer {KEY}") and keys.accepts(f"Bearer {OTHER}")


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660])
def test_a_keys_file_others_may_read_or_write_is_refused_with_chmod_600(tmp_path, mode):
    from edge_runtime.errors import ConfigError
    from edge_runtime.service.api_keys import load_api_keys

    path = write_keys(tmp_path / "keys", KEY, mode=mode)
    with pytest.raises(ConfigError, match=f"mode {mode:04o}.*chmod 600 ") as err:
        load_api_keys(str(path), "service.api_keys")
    assert str(err.value).startswith("service.api_keys ") and KEY not in str(err.value)
    path.chmod(0o400)  # read-only for its owner is fine too
    assert load_api_keys(str(path)).accepts(f"Bearer {KEY}")


@pytest.mark.parametrize("lines,message", [
    ([], "holds no key"),
    (["# only a comment"], "holds no key"),
    (["short-key"], "line 2: a key of 9 characters is too short; use at least 32"),
    ([KEY, "with a space " + KEY], "line 3: a key may not hold spaces"),
])
def test_a_keys_file_without_usable_keys_is_refused(tmp_path, lines, message):
    from edge_runtime.errors import ConfigError
    from edge_runtime.service.api_keys import load_api_keys

    path = write_keys(tmp_path / "keys", *lines)
    with pytest.raises(ConfigError, match=message) as err:
        load_api_keys(str(path))
    assert KEY not in str(err.value)


def test_a_missing_or_odd_keys_file_is_refused(tmp_path):
    from edge_runtime.errors import ConfigError
    from edge_runtime.service.api_keys import load_api_keys

    with pytest.raises(ConfigError, match="--api-keys .*nope: cannot open it"):
        load_api_keys(str(tmp_path / "nope"))
    (tmp_path / "folder").mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_api_keys(str(tmp_path / "folder"))
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff" * 40)
    binary.chmod(0o600)
    with pytest.raises(ConfigError, match="not ASCII text"):
        load_api_keys(str(binary))


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", f"Bearer {KEY[:-1]}",
                                    f"Bearer {KEY[:8]}", f"Bearer {KEY}x", f"Bearer x{KEY}",
                                    f"Basic {KEY}", KEY, f"Bearer {KEY.upper()}",
                                    f"Bearer {KEY[:-1]}b", "Bearer " + "z" * 4000])
def test_wrong_missing_and_short_keys_are_not_accepted(header):
    assert not _keys(KEY, OTHER).accepts(header)


@pytest.mark.parametrize("header", [f"Bearer {KEY}", f"bearer {KEY}", f"BEARER  {KEY} ",
                                    f"Bearer {OTHER}"])
def test_every_configured_key_is_accepted(header):
    assert _keys(KEY, OTHER).accepts(header)


@pytest.mark.parametrize("header", [f"Bearer {KEY}", f"Bearer {OTHER}", "Bearer nope", None])
def test_every_key_is_compared_whichever_matches(monkeypatch, header):
    """No early exit: the first key matching, the last, or none, costs the same comparisons,
    all of equal-length digests."""
    import hmac

    from edge_runtime.service import api_keys

    calls, compare = [], hmac.compare_digest

    def counting(a, b):
        calls.append((len(a), len(b)))
        return compare(a, b)

    keys = _keys(KEY, "c" * 40, OTHER)
    monkeypatch.setattr(api_keys.hmac, "compare_digest", counting)
    keys.accepts(header)
    assert calls == [(32, 32)] * 3


def _get(address, path: str, key: str | None) -> tuple[int, dict, bytes]:
    conn = raw_connect(address, timeout=30)
    try:
        auth = f"Authorization: Bearer {key}\r\n" if key is not None else ""
        conn.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n".encode())
        return read_response(conn)
    finally:
        conn.close()


def test_over_tcp_every_refused_key_gets_the_same_401_and_a_closed_connection(caplog):
    caplog.set_level(logging.DEBUG)
    state = stub_state()
    state.api_keys = _keys(KEY)
    with app_on_tcp(state) as address:
        answers = [_get(address, path, key)
                   for path in ("/v1/models", "/health", "/metrics", "/v1/nowhere")
                   for key in (None, "", "wrong-" + KEY[6:], KEY[:16], KEY[:-1])]
        for status, headers, body in answers:
            assert status == 401 and headers["connection"] == "close", (status, headers)
            assert headers["www-authenticate"] == 'Bearer realm="edge-runtime"'
            assert json.loads(body) == {"error": {
                "message": "missing or invalid API key", "type": "invalid_request_error",
                "code": "invalid_api_key", "param": None}}
        assert len({body for _, _, body in answers}) == 1  # not a hint which part was wrong
        status, _, body = _get(address, "/v1/models", KEY)
        assert status == 200 and json.loads(body)["data"][0]["id"] == "m"
        with client(address, headers={"Authorization": f"Bearer {KEY}"}) as c:
            answer = c.post("/v1/completions", json=COMPLETION)
            assert answer.status_code == 200 and answer.json()["choices"][0]["text"] == "ab"
            metrics = c.get("/metrics").text
    assert 'edge_service_requests_total{endpoint="/v1/models",status="401"} 5' in metrics
    assert KEY[:16] not in caplog.text


@pytest.mark.parametrize("query", [f"api_key={KEY}", f"key={KEY}", f"access_token={KEY}",
                                   "x=1", "api_key=nonsense"])
def test_a_key_in_the_query_string_is_refused_and_never_logged(caplog, query):
    caplog.set_level(logging.DEBUG)
    state = stub_state()
    state.api_keys = _keys(KEY)
    with app_on_tcp(state) as address:
        for key in (None, KEY):  # refused even with the right key in the header
            status, headers, body = _get(address, f"/v1/models?{query}", key)
            error = json.loads(body)["error"]
            assert status == 400 and error["code"] == "query_string_refused", body
            assert "Authorization: Bearer" in error["message"] and KEY not in error["message"]
            assert headers["connection"] == "close"
        # a request line aiohttp's parser refuses is logged with its query string redacted
        conn = raw_connect(address, timeout=30)
        conn.sendall(f"GET /v1/models?{query}\x01 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert read_response(conn)[0] == 400
        conn.close()
    assert "query redacted" in caplog.text
    assert query not in caplog.text and KEY not in caplog.text, caplog.text


def test_the_unix_socket_needs_no_key_when_keys_are_configured(tmp_path):
    """Its file mode is its access control; a client there sends no key, as before."""
    state = stub_state()
    state.api_keys = _keys(KEY)
    with app_on_unix_socket(state, str(tmp_path / "api.sock")) as sock:
        for key in (None, "wrong"):
            status, _, body = _get(sock, "/v1/models?x=1", key)
            assert status == 200, body


def test_loopback_tcp_without_keys_needs_none():
    with app_on_tcp(stub_state()) as address, client(address) as c:
        assert c.get("/v1/models").status_code == 200
        assert c.post("/v1/completions", json=COMPLETION).json()["choices"][0]["text"] == "ab"


def test_the_openai_client_with_a_base_url_and_a_key_as_home_assistant_configures_it():
    """What an OpenAI-compatible conversation integration does: the `openai` client with
    base_url http://HOST:PORT/v1 and api_key; a wrong key is its AuthenticationError."""
    import openai

    state = stub_state()
    state.api_keys = _keys(KEY)
    with app_on_tcp(state) as (host, port):
        base_url = f"http://{host}:{port}/v1"
        good = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=30)
        assert [m.id for m in good.models.list()] == ["m"]
        assert good.completions.create(model="m", prompt=[1, 2], max_tokens=2).choices[0].text \
            == "ab"
        bad = openai.OpenAI(base_url=base_url, api_key=KEY[:-1], max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError, match="missing or invalid API key"):
            bad.models.list()
