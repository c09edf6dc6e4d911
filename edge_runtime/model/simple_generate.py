"""A small batch generator over `ContiguousKVCache`: the foundation's generate path and test oracle.

One varlen forward prefills every prompt, then each step decodes all unfinished sequences together.
Greedy (temperature 0) or temperature sampling from one seeded `torch.Generator`.

Invariants:
- Each result's `token_ids` are the generated tokens only, ending with the EOS token when
  `finish_reason == "stop"` (like transformers' `generate`).
- A sequence never grows past `config.model_context` (the cache masks local layers to their
  window, so a sliding-window model runs to its own limit); a prompt that leaves no room for
  one generated token raises `RequestError` before any compute.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from edge_runtime.errors import RequestError
from edge_runtime.model.contiguous_kv import ContiguousKVCache

TokenCallback = Callable[[int, int], None]  # (prompt index, token id)


@dataclass
class SimpleResult:
    token_ids: list[int]
    prompt_tokens: int
    finish_reason: str  # "stop" | "length"


def check_prompt_fits(prompt_len: int, max_context: int) -> None:
    if prompt_len == 0:
        raise RequestError("the prompt is empty")
    if prompt_len >= max_context:
        raise RequestError(
            f"the prompt has {prompt_len} tokens but the model's context is {max_context}: "
            "shorten the prompt"
        )


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator | None) -> list[int]:
    # logits: [B, vocab] float32
    if temperature <= 0:
        return logits.argmax(dim=-1).tolist()
    probs = torch.softmax(logits / temperature, dim=-1)
    return torch.multinomial(probs, 1, generator=gen).squeeze(1).tolist()


def generate(
    model,
    prompts: Sequence[Sequence[int]],
    max_tokens: int | Sequence[int],
    temperature: float = 0.0,
    seed: int | None = None,
    on_token: TokenCallback | None = None,
    eos_token_ids: Sequence[int] | None = None,
) -> list[SimpleResult]:
    """Generate for every prompt as one batch. `model` is a CausalLM."""
    config = model.config
    limits = [max_tokens] * len(prompts) if isinstance(max_tokens, int) else list(max_tokens)
    assert len(limits) == len(prompts), (len(limits), len(prompts))
    for p in prompts:
        check_prompt_fits(len(p), config.model_context)
    if any(n < 1 for n in limits):
        raise RequestError(f"max_tokens must be positive, got {limits}")
    eos = set(config.eos_token_ids if eos_token_ids is None else eos_token_ids)
    gen = torch.Generator().manual_seed(seed) if seed is not None else None
    cache = ContiguousKVCache.for_model(config, dtype=model.dtype, device=model.device)
    results = [SimpleResult([], len(p), "length") for p in prompts]
    for i, p in enumerate(prompts):
        room = config.model_context - len(p)
        limits[i] = min(limits[i], room)
        cache.add(i, capacity=len(p) + limits[i])
    active = list(range(len(prompts)))
    new_tokens = [list(map(int, p)) for p in prompts]
    while active:
        lens = [len(new_tokens[i]) for i in active]
        input_ids = torch.tensor([t for i in active for t in new_tokens[i]], device=model.device)
        positions = cache.positions(active, lens)
        last = torch.tensor(lens, device=model.device).cumsum(0) - 1  # [B]
        logits = model(input_ids, positions, cache.step(active, lens), last)  # [B, vocab]
        still = []
        for i, tok in zip(active, _pick(logits, temperature, gen)):
            res = results[i]
            res.token_ids.append(tok)
            if on_token:
                on_token(i, tok)
            if tok in eos:
                res.finish_reason = "stop"
            elif len(res.token_ids) < limits[i]:
                still.append(i)
                new_tokens[i] = [tok]
                continue
            cache.remove(i)
        active = still
    return results
