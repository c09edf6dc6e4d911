"""Request schema: examples of each error, and a property-based fuzz (never anything but ApiError)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from edge_runtime.service.schema import ApiError, ApiRequest, parse_body, parse_chat, parse_completion

CAP = 512


def test_valid_chat_and_completion():
    chat = parse_chat({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "you"}]}],
        "max_tokens": 7, "temperature": 0, "stop": "\n", "stream": True,
        "stream_options": {"include_usage": True}, "seed": 3, "unknown_extra": 1}, CAP)
    assert chat.messages == ({"role": "system", "content": "be brief"},
                             {"role": "user", "content": "hi you"})
    assert chat.params.max_tokens == 7 and chat.params.temperature == 0.0
    assert chat.params.stop == ("\n",) and chat.stream and chat.include_usage
    comp = parse_completion({"prompt": [5, 6, 7], "max_completion_tokens": 3, "top_k": -1}, CAP)
    assert comp.prompt == (5, 6, 7) and comp.params.max_tokens == 3 and comp.params.top_k == 0
    assert parse_completion({"prompt": ["one"]}, CAP).prompt == "one"


def test_null_max_completion_tokens_counts_as_absent():
    """SDKs send "max_completion_tokens": null; max_tokens must still apply (it was ignored)."""
    req = parse_chat({"messages": [{"role": "user", "content": "hi"}],
                      "max_completion_tokens": None, "max_tokens": 3}, CAP)
    assert req.params.max_tokens == 3 and req.max_tokens_param == "max_tokens"
    req = parse_completion({"prompt": "x", "max_completion_tokens": 5, "max_tokens": 9}, CAP)
    assert req.params.max_tokens == 5 and req.max_tokens_param == "max_completion_tokens"
    assert parse_completion({"prompt": "x", "max_tokens": None}, CAP).params.max_tokens == 256
    for bad in (0, CAP + 1, "5"):
        with pytest.raises(ApiError) as e:
            parse_completion({"prompt": "x", "max_completion_tokens": bad, "max_tokens": 3}, CAP)
        assert e.value.param == "max_completion_tokens"
        assert e.value.message.startswith("'max_completion_tokens'")


@pytest.mark.parametrize("parse,base", [
    (parse_completion, {"prompt": "x"}),
    (parse_chat, {"messages": [{"role": "user", "content": "hi"}]}),
])
def test_null_counts_as_absent_for_every_optional_field(parse, base):
    """n, top_k and ignore_eos were 400 on null while every other nullable field took it as absent
    (OpenAI's schema has n nullable; SDKs send nulls)."""
    keys = ("n", "top_k", "ignore_eos", "temperature", "top_p", "seed", "stop", "stream",
            "stream_options", "max_tokens", "max_completion_tokens", "repetition_penalty",
            "presence_penalty", "frequency_penalty", "logit_bias", "model")
    req = parse(dict(base, **{key: None for key in keys}), CAP)
    assert req.params == parse(base, CAP).params and not req.stream
    assert parse(dict(base, n=None, best_of=None), CAP).params.n == 1
    with_top_k = parse(dict(base, top_k=(1 << 31) - 1), CAP)  # the largest k: keeps every token
    assert with_top_k.params.top_k == (1 << 31) - 1


@pytest.mark.parametrize("raw,code", [
    (b"{not json", "invalid_json"),
    (b"[1, 2]", "invalid_json"),
    (b'{"prompt": "\xff\xfe"}', "invalid_utf8"),
    (b"[" * 100000, "invalid_json"),
    (b'{"prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", "invalid_json"),
    (b'{"messages": [{"role": "user", "content": [' + b"1" * 4301 + b"]}]}", "invalid_json"),
    (b'{"x": -' + b"7" * 10000 + b"}", "invalid_json"),
])
def test_bad_bodies(raw, code):
    with pytest.raises(ApiError) as e:
        parse_body(raw)
    assert e.value.status == 400 and e.value.code == code
    if b"9" * 4301 in raw or b"1" * 4301 in raw or b"7" * 4301 in raw:  # was a 500 (ValueError)
        assert "digits" in e.value.message


@pytest.mark.parametrize("raw,param", [
    (rb'{"messages": [{"role": "user", "content": "\ud800 hi"}]}', "messages[0].content"),
    (rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": "a\udfff"}]}]}',
     "messages[0].content[0].text"),
    (rb'{"prompt": "\udc80"}', "prompt"),
    (rb'{"prompt": ["\udc80"]}', "prompt[0]"),
    (rb'{"prompt": "x", "stop": ["ok", "\ud83d"]}', "stop[1]"),
    (rb'{"prompt": "x", "model": "m\ud800"}', "model"),
])
def test_lone_surrogates_are_400_naming_the_field(raw, param):
    """JSON can escape a lone UTF-16 surrogate; the tokenizer cannot take one (it was a 500)."""
    with pytest.raises(ApiError) as e:
        parse_body(raw)
    assert (e.value.status, e.value.code, e.value.param) == (400, "invalid_utf8", param)
    assert "surrogate" in e.value.message
    body = parse_body(rb'{"prompt": "\ud83d\ude00 \\ud800"}')  # a valid pair, an escaped "\"
    assert body["prompt"] == "\U0001f600 \\ud800"


@pytest.mark.parametrize("body,param", [
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": CAP + 1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ({"prompt": "x", "max_tokens": True}, "max_tokens"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "temperature": float("nan")}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "n": 17}, "n"),
    ({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "model": 3}, "model"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": "x", "echo": True}, "echo"),
    ({"prompt": "x", "presence_penalty": 2.5}, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, "frequency_penalty"),
    ({"prompt": "x", "seed": 1 << 64}, "seed"),  # past torch's 64 bits: was a 500
    ({"prompt": "x", "seed": 10 ** 23}, "seed"),
    ({"prompt": "x", "seed": -(1 << 63) - 1}, "seed"),
    ({"prompt": "x", "seed": 1.5}, "seed"),
    ({"prompt": "x", "top_k": 1 << 63}, "top_k"),  # overflowed the sampler's int64: engine dead
    ({"prompt": "x", "top_k": (1 << 31)}, "top_k"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
])
def test_bad_completion_fields_name_the_param(body, param):
    with pytest.raises(ApiError) as e:
        parse_completion(body, CAP)
    assert e.value.status == 400 and e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "code", "param"}


def test_presence_and_frequency_penalties_reach_the_sampler():
    params = parse_completion({"prompt": "x", "presence_penalty": 0.5,
                               "frequency_penalty": -1.25}, CAP).params
    assert (params.presence_penalty, params.frequency_penalty) == (0.5, -1.25)


@pytest.mark.parametrize("messages", [None, [], "hi", [{"role": "robot", "content": "x"}],
                                      [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [{"type": "image_url"}]}], [3]])
def test_bad_chat_messages(messages):
    with pytest.raises(ApiError):
        parse_chat({"messages": messages}, CAP)


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12)
_keys = st.sampled_from(["model", "prompt", "messages", "max_tokens", "max_completion_tokens",
                         "temperature", "top_p", "top_k", "n", "seed", "stop", "stream",
                         "stream_options", "presence_penalty", "frequency_penalty", "logprobs",
                         "echo", "best_of", "ignore_eos", "repetition_penalty", "logit_bias",
                         "tools", "response_format", "suffix", "role", "content"])
_messages = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "x"]),
                                            "content": _json_values}), max_size=3)


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(_keys, _json_values | _messages, max_size=8), st.booleans())
def test_fuzz_schema_only_raises_api_error(body, chat):
    raw = json.dumps(body).encode()
    try:
        req = (parse_chat if chat else parse_completion)(parse_body(raw), CAP)
    except ApiError as exc:
        assert 400 <= exc.status < 500 and exc.message
        json.dumps(exc.body())
        return
    assert isinstance(req, ApiRequest)
    assert 1 <= req.params.max_tokens <= CAP
    assert 0 <= req.params.temperature <= 2 and 0 < req.params.top_p <= 1
    if chat:
        assert req.messages and all(isinstance(m["content"], str) for m in req.messages)
    else:
        assert isinstance(req.prompt, (str, tuple))


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=64))
def test_fuzz_raw_bytes(raw):
    try:
        parse_completion(parse_body(raw), CAP)
    except ApiError as exc:
        assert exc.status == 400
