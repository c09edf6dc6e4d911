"""/v1/completions and /v1/chat/completions: admission, body, tokenization, engine, response.

Invariants:
- A request counts in `state.in_flight` only once its body has been read (body.py: within
  `service.body_timeout_s`, else 408) and validated: a client that stalls mid-body holds no slot.
  It enters `state.book` exactly once per accepted request and leaves it in `finally`, whatever
  happens (disconnect, engine error); its phase there (preparing, in_engine, answering) follows
  the engine stream (service/accounting.py).
- A request whose client disconnects (aiohttp cancels the handler: handler_cancellation=True) or
  whose stream write fails is cancelled in the engine, which releases its pages; a request is
  cancelled at most once and only if it did not finish.
- Errors before the first byte of a stream are JSON 4xx/5xx; after it, an SSE `error` event.
- A request whose n choices could not fit the whole KV pool even at full length is refused before
  it runs (400); one that still runs out of pool (the guard shrank it) ends with finish_reason
  "error" and an error: a 503 when not streaming, an SSE `error` event after the finish chunks.
- Memory pressure never leaves a request waiting without an answer: while the guard has paused
  admission for longer than `guard.max_admission_pause_s`, new requests get 503 at once, and the
  guard ends the ones still waiting for their first admission (503 with Retry-After); requests
  already admitted run to the end. A stream's headers are sent with its first token, so a stream
  refused before it started gets the same 503, not a 200 with an error event.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from contextlib import aclosing

from aiohttp import web

from edge_runtime.kv.page_math import request_pages_lenient
from edge_runtime.engine.async_engine import EngineLoopStopped
from edge_runtime.errors import EdgeError, MemoryPressure, OutOfPages, RequestError
from edge_runtime.service import responses as R
from edge_runtime.service.body import read_body
from edge_runtime.service.choice_stream import ChoiceStream
from edge_runtime.service.schema import ApiError, ApiRequest, parse_body, parse_chat, parse_completion
from edge_runtime.service.state import STATE_KEY, ServiceState
from edge_runtime.model.chat import encode_messages, encode_prompt

log = logging.getLogger(__name__)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _generate(request: web.Request, kind: str) -> web.StreamResponse:
    state: ServiceState = request.app[STATE_KEY]
    _admit(state)  # answer at once while loading, stopping or full, without reading the body
    if state.connections is not None:  # while its body arrives it holds no slot: evictable
        state.connections.idle(request.protocol)
    raw = await read_body(request, state.limits.max_body_bytes, state.limits.body_timeout_s)
    if state.connections is not None:
        state.connections.busy(request.protocol)
    parse = parse_chat if kind == "chat" else parse_completion
    req = parse(parse_body(raw), state.limits.max_tokens)
    if req.model is not None and req.model != state.model_name:
        raise ApiError(404, f"model '{req.model}' is not served here; GET /v1/models lists "
                       f"'{state.model_name}'", "model_not_found", "model")
    if req.extras is not None and req.extras.grammar_checks:  # compiles (cached): off the loop
        await asyncio.to_thread(_check_grammars, state, req)
    _admit(state)  # again: the state may have changed while the body arrived
    rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"
    state.book.enter(rid)
    try:
        try:
            prompt_ids = await asyncio.to_thread(_encode, state, req)
        except RequestError as exc:  # e.g. a control token's text inside a message
            raise ApiError(400, str(exc), "invalid_value",
                           "messages" if req.kind == "chat" else "prompt") from None
        _check_length(state, prompt_ids, req)
        _check_pool(state, len(prompt_ids), req)
        state.active[rid] = asyncio.current_task()
        try:
            if req.stream:
                return await _stream(request, state, req, rid, prompt_ids)
            return await _complete(state, req, rid, prompt_ids)
        finally:
            state.active.pop(rid, None)
    finally:
        state.book.leave(rid)


def _admit(state: ServiceState) -> None:
    retry = {"Retry-After": str(state.limits.retry_after_s)}
    if state.stopping:
        raise ApiError(503, "the service is shutting down; retry on the next start",
                       "shutting_down", type_="server_error", headers=retry)
    if state.status != "ready":
        raise ApiError(503, f"the model is still loading ({state.reason}); retry shortly",
                       "model_loading", type_="server_error", headers=retry)
    failure = state.engine_failure()
    if failure is not None:
        raise ApiError(503, failure, "engine_failed", type_="server_error")
    if state.guard is not None and state.guard.refusing_admission:
        raise ApiError(503, state.guard.refusal_message(), "memory_pressure",
                       type_="server_error", headers=retry)
    if state.in_flight >= state.limits.max_in_flight:
        state.metrics.rejected_busy += 1
        raise ApiError(429, f"server busy: {state.in_flight} requests in flight (limit "
                       f"{state.limits.max_in_flight}); retry after "
                       f"{state.limits.retry_after_s} s", "server_busy",
                       type_="rate_limit_error", headers=retry)


def _encode(state: ServiceState, req: ApiRequest) -> list[int]:
    if req.kind == "chat":
        return list(encode_messages(state.tokenizer, list(req.messages)))
    if isinstance(req.prompt, tuple):
        bad = [t for t in req.prompt if t >= state.vocab_size]
        if bad:
            raise ApiError(400, f"'prompt' token id {bad[0]} is outside the vocabulary "
                           f"(size {state.vocab_size})", "invalid_value", "prompt")
        return list(req.prompt)
    return list(encode_prompt(state.tokenizer, req.prompt, chat=False))


def _check_grammars(state: ServiceState, req: ApiRequest) -> None:
    """400 naming the field whose schema (or tool list) the grammar library cannot compile."""
    for param, spec in req.extras.grammar_checks:
        try:
            state.engine.constraints.compiler.compile(spec)
        except RequestError as exc:
            raise ApiError(400, str(exc), "invalid_value", param) from None


def _check_length(state: ServiceState, prompt_ids: list[int], req: ApiRequest) -> None:
    n, limit = len(prompt_ids), state.limits.prompt_limit(state.context_len)
    max_tokens, key = req.params.max_tokens, req.max_tokens_param
    if n == 0:
        raise ApiError(400, "the prompt is empty", "invalid_value", "prompt")
    if n > limit:
        raise ApiError(400, f"the prompt has {n} tokens, more than this server's limit of {limit}",
                       "context_length_exceeded", "prompt")
    if n + max_tokens > state.context_len:
        raise ApiError(400, f"prompt ({n} tokens) + {key} ({max_tokens}) exceeds the "
                       f"model's context of {state.context_len}; lower {key}",
                       "context_length_exceeded", key)


def _check_pool(state: ServiceState, num_prompt: int, req: ApiRequest) -> None:
    """400 if the request's n choices at full length need more KV pages than the whole pool has
    (counted leniently: the prompt's full pages shared, a tail per choice in a free inline slot;
    the engine would end such a request with finish_reason "error" after generating for nothing)."""
    p, cfg = req.params, state.engine.config
    needed, capacity = _pages_needed(num_prompt, p.max_tokens, p.n, cfg), state.engine.num_pages
    if needed <= capacity:
        return
    key = req.max_tokens_param
    one_fits = p.n > 1 and _pages_needed(num_prompt, p.max_tokens, 1, cfg) <= capacity
    raise ApiError(400, f"prompt ({num_prompt} tokens) + {key} ({p.max_tokens}) for n={p.n} "
                   f"choices needs up to {needed} KV pages of {cfg.page_tokens} tokens, more than "
                   f"this server's pool of {capacity}; lower {key}{' or n' if p.n > 1 else ''}, "
                   "or shorten the prompt", "context_length_exceeded", "n" if one_fits else key)


def _pages_needed(num_prompt: int, max_tokens: int, n: int, cfg) -> int:
    """request_pages_lenient under the engine config's page size and inline storage."""
    slots = cfg.num_inline_slots if cfg.enable_inline else 0
    return request_pages_lenient(num_prompt, max_tokens, n, cfg.page_tokens, slots,
                                 cfg.inline_tokens)


def _parses_calls(req: ApiRequest) -> bool:
    return req.extras is not None and req.extras.parses_calls


def _failed(state: ServiceState, result, req: ApiRequest) -> ApiError | None:
    """The engine ended the request with finish_reason "error": the pool ran out mid-generation,
    or the guard refused it before it started (nothing generated: retrying is the advice)."""
    if result.error is None:
        return None
    advice = "retry later" if result.generated_tokens == 0 else \
        f"lower {req.max_tokens_param} or n, or retry later"
    return ApiError(503, f"{result.error}; {advice}", "memory_pressure", type_="server_error",
                    headers={"Retry-After": str(state.limits.retry_after_s)})


def _engine_error(exc: EdgeError) -> ApiError:
    if isinstance(exc, (OutOfPages, MemoryPressure)):
        return ApiError(503, str(exc), "memory_pressure", type_="server_error",
                        headers={"Retry-After": "1"})
    if isinstance(exc, RequestError):
        return ApiError(400, str(exc), "invalid_value")
    return ApiError(500, str(exc), "engine_error", type_="server_error")


async def _run(state: ServiceState, req: ApiRequest, rid: str, prompt_ids: list[int], on_event):
    """Drive the engine for one request; cancel it there unless it finished. Returns the result."""
    result = None
    state.book.move(rid, "in_engine")
    try:
        async with aclosing(state.aengine.stream(prompt_ids, req.params, request_id=rid)) as events:
            async for ev in events:
                await on_event(ev)
                if ev.result is not None:
                    result = ev.result
    except EdgeError as exc:
        raise _engine_error(exc) from None
    except EngineLoopStopped as exc:
        raise ApiError(500, str(exc), "engine_failed", type_="server_error") from None
    except RuntimeError as exc:  # AsyncEngine wraps errors raised on its loop thread
        if isinstance(exc.__cause__, EdgeError):
            raise _engine_error(exc.__cause__) from None
        raise
    finally:
        state.book.move(rid, "answering")
        if result is None:
            state.metrics.cancelled += 1
            await state.aengine.cancel(rid)
    t = result.timings
    state.metrics.record_result(result.prompt_tokens, result.cached_prompt_tokens,
                               result.generated_tokens, t.first_token_s, t.total_s)
    return result


async def _complete(state, req, rid, prompt_ids) -> web.Response:
    async def ignore(ev):
        return None

    result = await _run(state, req, rid, prompt_ids, ignore)
    failed = _failed(state, result, req)
    if failed is not None:
        raise failed
    if req.kind == "chat":
        body = R.chat_body(rid, state.model_name, result, R.now(), _parses_calls(req),
                           state.tokenizer)
    else:
        body = R.completion_body(rid, state.model_name, result, R.now())
    return web.json_response(body)


async def _stream(request, state, req, rid, prompt_ids) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache", "X-Request-Id": rid})
    created, model = R.now(), state.model_name

    async def start():  # headers and role chunks go out with the first token
        if resp.prepared:
            return
        await resp.prepare(request)
        if req.kind == "chat":
            for i in range(req.params.n):
                await resp.write(R.sse(R.chunk("chat", rid, model, created, i, "", role=True)))

    choices = [ChoiceStream(req.kind, rid, model, created, i, _parses_calls(req),
                            state.tokenizer) for i in range(req.params.n)]

    async def send(ev):
        if ev.text or (ev.result is not None and ev.result.error is None):
            await start()
        for c in choices[ev.index].on_event(ev):
            await resp.write(R.sse(c))

    try:
        result = await _run(state, req, rid, prompt_ids, send)
    except ApiError as exc:
        if not resp.prepared:
            raise
        return await _end_stream(request, resp, rid, [exc.body(), "[DONE]"], "an error")
    except ConnectionResetError:  # the client went away; _run already cancelled the request
        log.info("client disconnected from stream %s", rid)
        return resp
    failed = _failed(state, result, req)
    if failed is not None and not resp.prepared:  # nothing sent yet: a plain 503
        raise failed
    await start()
    events = [out for i, c in enumerate(result.completions)
              for out in choices[i].finish(c.finish_reason)]
    if failed is not None:
        events.append(failed.body())
    if req.include_usage:
        events.append(R.usage_chunk(req.kind, rid, model, created, result))
    return await _end_stream(request, resp, rid, events + ["[DONE]"], "the last token")


async def _end_stream(request, resp, rid: str, events: list, after: str) -> web.StreamResponse:
    """Write the stream's closing events. The engine is done with the request: a client that
    leaves now (the writes fail, or aiohttp cancels this handler as the connection drops) got
    every token there was; one INFO line, and the request counts with the stream's status."""
    try:
        for event in events:
            await resp.write(R.sse(event))
        await resp.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        transport = request.transport
        if transport is not None and not transport.is_closing():
            raise  # not the client leaving (e.g. the shutdown deadline cancelled it)
        task = asyncio.current_task()
        if task.cancelling():
            task.uncancel()  # the cancellation only said the connection dropped
        log.info("client disconnected from stream %s after %s", rid, after)
    return resp
