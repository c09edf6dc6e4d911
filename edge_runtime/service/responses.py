"""OpenAI-compatible response bodies and server-sent-event framing (pure functions, no I/O).

Invariants:
- Every response carries `usage.prompt_tokens_details.cached_tokens` (prompt tokens whose K/V
  came from the prefix cache).
- An SSE stream is `data: <json>\\n\\n` events: role chunk (chat), content deltas, one chunk per
  choice with its finish_reason, an optional usage chunk (stream_options.include_usage), then
  `data: [DONE]`. Errors after the stream started are sent as a `data: {"error": ...}` event.
"""

from __future__ import annotations

import json
import time
import uuid

from edge_runtime.engine.api import GenerationResult
from edge_runtime.service import tool_format


def usage(result: GenerationResult) -> dict:
    completion = result.generated_tokens
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": result.cached_prompt_tokens},
    }



def completion_body(rid: str, model: str, result: GenerationResult, created: int) -> dict:
    return {
        "id": rid, "object": "text_completion", "created": created, "model": model,
        "choices": [{"index": i, "text": c.text, "logprobs": None,
                     "finish_reason": c.finish_reason}
                    for i, c in enumerate(result.completions)],
        "usage": usage(result),
    }


def chat_body(rid: str, model: str, result: GenerationResult, created: int,
              parse_calls: bool = False, tokenizer=None) -> dict:
    """parse_calls: the request offered tools, so <tool_call> blocks become `tool_calls`;
    tokenizer: to name the tokens of the completions' log-probs (when the request asked)."""
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [_chat_choice(i, c, parse_calls, tokenizer)
                    for i, c in enumerate(result.completions)],
        "usage": usage(result),
    }


def _chat_choice(i: int, c, parse_calls: bool, tokenizer) -> dict:
    message: dict = {"role": "assistant", "content": c.text}
    finish = c.finish_reason
    if parse_calls:
        content, calls = tool_format.parse_calls(c.text)
        if calls:
            message = {"role": "assistant", "content": content or None,
                       "tool_calls": [tool_call(k, call) for k, call in enumerate(calls)]}
            finish = "tool_calls" if finish == "stop" else finish
    lps = None if c.logprobs is None else {"content": logprobs_content(tokenizer, c.logprobs)}
    return {"index": i, "message": message, "logprobs": lps, "finish_reason": finish}


def tool_call(index: int, call, with_index: bool = False) -> dict:
    """One entry of `tool_calls` (a streamed delta carries its `index` too)."""
    out = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
           "function": {"name": call.name, "arguments": call.arguments}}
    return dict(out, index=index) if with_index else out


def logprobs_content(tokenizer, logprobs) -> list[dict]:
    """OpenAI's logprobs.content: token text, log-prob, UTF-8 bytes, and the top alternatives."""
    def entry(token_id: int, logprob: float) -> dict:
        text = tokenizer.decode([token_id])
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    return [dict(entry(lp.token_id, lp.logprob), top_logprobs=[entry(t, v) for t, v in lp.top])
            for lp in logprobs]


def chunk(kind: str, rid: str, model: str, created: int, index: int, text: str | None = None,
          finish_reason: str | None = None, role: bool = False, tool_calls: list | None = None,
          logprobs: list | None = None) -> dict:
    """One streaming chunk for choice `index` (tool_calls: deltas from `tool_call(with_index)`;
    logprobs: `logprobs_content` of the tokens this chunk carries)."""
    if kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice = {"index": index, "delta": delta,
                  "logprobs": None if logprobs is None else {"content": logprobs},
                  "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": None,
                  "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice]}


def usage_chunk(kind: str, rid: str, model: str, created: int, result: GenerationResult) -> dict:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": usage(result)}


def sse(obj) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


def now() -> int:
    return int(time.time())
