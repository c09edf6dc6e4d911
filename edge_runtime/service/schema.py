"""OpenAI-compatible request bodies -> validated `ApiRequest`, or `ApiError` (a 4xx JSON error).

Invariants:
- `parse_body` + `parse_completion`/`parse_chat` raise only `ApiError` for any input bytes, so a
  bad request can never crash a handler (property-tested in tests/test_service_schema.py), including
  an integer literal past Python's digit limit (`json.loads` raises a plain ValueError for it).
- A returned ApiRequest holds a valid `SamplingParams` with max_tokens <= ServiceLimits.max_tokens.
- Every string of an accepted body is valid Unicode: JSON may escape a lone UTF-16 surrogate
  ("\\ud800"), which Python keeps in the str and the tokenizer cannot take; such a body is a 400
  naming the field, like a body that is not UTF-8.
- Unknown top-level keys are ignored (as OpenAI-compatible servers do: SDKs send extras), but a
  known key with a wrong type or an unsupported value is an error naming the key (`param`).
  A known optional key whose value is null counts as absent (OpenAI's schema makes them nullable).
Prompt length and the model name need the tokenizer and the model: the app checks those.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, replace

from edge_runtime.engine.api import SEED_MAX, SEED_MIN, TOP_K_MAX, SamplingParams
from edge_runtime.errors import RequestError
from edge_runtime.service.api_error import ApiError

CHAT_ROLES = ("system", "developer", "user", "assistant")  # and "tool": service/tools_api.py
DEFAULT_MAX_TOKENS = 256
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")  # \uD800..\uDFFF


@dataclass(frozen=True)
class ApiRequest:
    kind: str  # "completion" | "chat"
    model: str | None
    params: SamplingParams
    stream: bool = False
    include_usage: bool = False
    prompt: str | tuple[int, ...] | None = None  # completion: text or token ids
    messages: tuple[dict, ...] | None = None  # chat: [{"role", "content": str}]
    max_tokens_param: str = "max_tokens"  # the key max_tokens came from, for error messages
    extras: object | None = None  # chat: tools_api.ChatExtras (tools, grammar, logprobs)


def _int_digit_limit() -> int:
    """Python's limit on integer literals (3.11, and 3.10 from 3.10.7 as a security fix)."""
    return getattr(sys, "get_int_max_str_digits", lambda: 4300)()


def parse_body(raw: bytes) -> dict:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"request body is not valid UTF-8 (byte {exc.start})",
                       "invalid_utf8") from None
    try:
        body = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ApiError(400, f"request body is not valid JSON: {exc}", "invalid_json") from None
    except ValueError:  # int('9' * 5000): Python's limit on integer literals, in any field
        raise ApiError(400, f"request body holds an integer literal of more than "
                       f"{_int_digit_limit()} digits; no field takes one that large",
                       "invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object", "invalid_json")
    if _SURROGATE_ESCAPE.search(text):  # valid pairs match too; only lone ones are refused
        _check_unicode(body)
    return body


def _check_unicode(body: dict) -> None:
    """Raise a 400 naming a string (or key) of the body that holds a lone surrogate."""
    todo: list[tuple[str, object]] = [("", body)]
    while todo:  # iterative: the body may be nested as deep as json.loads allows
        path, value = todo.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise ApiError(400, f"'{path}' is not valid Unicode: lone UTF-16 surrogate "
                               f"\\u{ord(value[exc.start]):04x} at character {exc.start}",
                               "invalid_utf8", path) from None
        elif isinstance(value, dict):
            for key, item in value.items():
                name = f"{path}.{key}" if path else key
                todo += [(name, key), (name, item)]
        elif isinstance(value, list):
            todo += [(f"{path}[{i}]", item) for i, item in enumerate(value)]


def parse_completion(body: dict, max_tokens_cap: int) -> ApiRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        if any(t < 0 for t in prompt):
            raise _bad("prompt", "token ids must be >= 0")
        prompt = tuple(prompt)
    elif not isinstance(prompt, str):
        raise _bad("prompt", "must be a string, a list of one string, or a list of token ids "
                   "(batches of prompts are not supported: send one request each)")
    for key, allowed in (("echo", (None, False)), ("logprobs", (None, 0)), ("suffix", (None, ""))):
        if body.get(key) not in allowed:
            raise _unsupported(key)
    if body.get("best_of") not in (None, _n(body)):
        raise _unsupported("best_of")
    from edge_runtime.service import tools_api  # on use: it loads engine/grammar.py (torch)

    extras = tools_api.completion_extras(body)
    params = _params(body, max_tokens_cap)
    if extras.grammar is not None:
        params = replace(params, grammar=extras.grammar)
    return ApiRequest("completion", _model(body), params, *_stream(body),
                      prompt=prompt, max_tokens_param=_max_tokens_key(body), extras=extras)


def parse_chat(body: dict, max_tokens_cap: int) -> ApiRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of {role, content} objects")
    from edge_runtime.service import tools_api  # on use: it loads engine/grammar.py (torch)

    parsed = tuple(_tool_or_plain_message(i, m) for i, m in enumerate(messages))
    extras = tools_api.parse_extras(body)
    params = _params(body, max_tokens_cap)
    try:
        params = replace(params, grammar=extras.grammar, logprobs=extras.logprobs)
    except RequestError as exc:
        raise ApiError(400, str(exc), "invalid_value") from None
    return ApiRequest("chat", _model(body), params, *_stream(body),
                      messages=tools_api.with_tools_prompt(parsed, extras.tools),
                      max_tokens_param=_max_tokens_key(body), extras=extras)


def _tool_or_plain_message(i: int, m) -> dict:
    from edge_runtime.service import tools_api  # start-up time: imports torch

    return (tools_api.tool_message(i, m) if isinstance(m, dict) else None) or _message(i, m)


def _message(i: int, m) -> dict:
    param = f"messages[{i}]"
    if not isinstance(m, dict):
        raise _bad(param, "must be an object with role and content")
    role, content = m.get("role"), m.get("content")
    if role not in CHAT_ROLES:
        raise _bad(f"{param}.role", f"must be one of {list(CHAT_ROLES)}")
    if isinstance(content, list):  # [{"type": "text", "text": ...}]
        if not all(isinstance(p, dict) and p.get("type") == "text"
                   and isinstance(p.get("text"), str) for p in content):
            raise _bad(f"{param}.content", "only text parts ({type: text, text}) are supported")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise _bad(f"{param}.content", "must be a string or a list of text parts")
    return {"role": "system" if role == "developer" else role, "content": content}


def _max_tokens_key(body: dict) -> str:
    """max_completion_tokens (OpenAI's newer name) wins over max_tokens; null counts as absent."""
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"


def _params(body: dict, cap: int) -> SamplingParams:
    key = _max_tokens_key(body)
    max_tokens = body.get(key)
    max_tokens = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens
    if not _is_int(max_tokens) or max_tokens < 1:
        raise _bad(key, f"must be a positive integer, got {max_tokens!r}")
    if max_tokens > cap:
        raise _bad(key, f"is {max_tokens}, above this server's limit of {cap}")
    presence_penalty = _num(body, "presence_penalty", 0.0, -2.0, 2.0)
    frequency_penalty = _num(body, "frequency_penalty", 0.0, -2.0, 2.0)
    if body.get("logit_bias") not in (None, {}):
        raise _unsupported("logit_bias")
    seed = body.get("seed")
    if seed is not None and not (_is_int(seed) and SEED_MIN <= seed <= SEED_MAX):
        raise _bad("seed", f"must be an integer in [-2**63, 2**64 - 1] (a 64-bit seed), "
                   f"got {seed!r}")
    top_k = _get(body, "top_k", 0)
    if not _is_int(top_k) or not -1 <= top_k <= TOP_K_MAX:
        raise _bad("top_k", f"must be an integer in [-1, {TOP_K_MAX}] (-1 or 0: off; a k past "
                   f"the vocabulary keeps every token), got {top_k!r}")
    n = _n(body)
    ignore_eos = _get(body, "ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise _bad("ignore_eos", "must be a boolean")
    temperature = _num(body, "temperature", 1.0, 0.0, 2.0)
    top_p = _num(body, "top_p", 1.0, 1e-9, 1.0)
    repetition_penalty = _num(body, "repetition_penalty", 1.0, 1e-9, 10.0)
    stop = _stop(body.get("stop"))
    try:
        return SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=max(top_k, 0),
            repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty, seed=seed, stop=stop, n=n, ignore_eos=ignore_eos)
    except RequestError as exc:
        raise ApiError(400, str(exc), "invalid_value") from None


def _get(body: dict, key: str, default):
    """body[key], or `default` when the key is absent or null (OpenAI's fields are nullable)."""
    value = body.get(key)
    return default if value is None else value


def _n(body: dict) -> int:
    n = _get(body, "n", 1)
    if not _is_int(n) or not 1 <= n <= 16:
        raise _bad("n", f"must be an integer between 1 and 16, got {n!r}")
    return n


def _stop(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if (not isinstance(stop, list) or len(stop) > 4
            or not all(isinstance(s, str) and s for s in stop)):
        raise _bad("stop", "must be a non-empty string or a list of up to 4 of them")
    return tuple(stop)


def _stream(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", "must be a boolean")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise _bad("stream_options", "must be {\"include_usage\": true|false}")
    return stream, bool(options.get("include_usage", False))


def _model(body: dict) -> str | None:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", "must be a string")
    return model


def _num(body: dict, key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise _bad(key, f"must be a number in [{lo:g}, {hi:g}], got {value!r}")
    return float(value)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _bad(param: str, message: str) -> ApiError:
    return ApiError(400, f"'{param}' {message}", "invalid_value", param)


def _unsupported(param: str, why: str = "is not supported by this server") -> ApiError:
    return ApiError(400, f"'{param}' {why}", "unsupported_parameter", param)
