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

from edge_runtime.engine.api import GenerationResult


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


def chat_body(rid: str, model: str, result: GenerationResult, created: int) -> dict:
    return {
        "id": rid, "object": "chat.completion", "created": created, "model": model,
        "choices": [{"index": i, "message": {"role": "assistant", "content": c.text},
                     "logprobs": None, "finish_reason": c.finish_reason}
                    for i, c in enumerate(result.completions)],
        "usage": usage(result),
    }


def chunk(kind: str, rid: str, model: str, created: int, index: int, text: str | None = None,
          finish_reason: str | None = None, role: bool = False) -> dict:
    """One streaming chunk for choice `index`."""
    if kind == "chat":
        delta: dict = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
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
