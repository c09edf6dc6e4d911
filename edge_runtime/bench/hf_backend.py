"""The baseline: Hugging Face transformers `generate`, one request at a time, fresh cache each.

This is the sharemem document's baseline: the same fp32 weights (the folder `load_model` converted),
greedy, a new `DynamicCache` per request, no batching and no reuse across turns. Concurrent streams
queue on a lock, so their TTFT includes the wait, as it would behind a one-at-a-time server.

KV bytes of a request = the bytes of its DynamicCache tensors when generation ends (its largest
size); the timeline holds that value from the request's start to its end, then 0.
"""

from __future__ import annotations

import asyncio
import time

from edge_runtime.bench.monitor import Timeline
from edge_runtime.bench.replay import Outcome
from edge_runtime.model.chat import encode_messages


def cache_nbytes(cache) -> int:
    """Bytes of all K/V tensors in a transformers cache (DynamicCache of transformers 4 or 5)."""
    layers = getattr(cache, "layers", None)
    if layers is not None:  # transformers >= 4.56: cache.layers[i].keys / .values
        tensors = [t for layer in layers for t in (layer.keys, layer.values) if t is not None]
    else:  # older: cache.key_cache / cache.value_cache lists
        tensors = list(cache.key_cache) + list(cache.value_cache)
    return sum(t.numel() * t.element_size() for t in tensors)


class _FirstTokenClock:
    """A transformers streamer that stamps the first generated token (generate's 1st put is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_token_t: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_token_t is None:
            self.first_token_t = time.perf_counter()

    def end(self) -> None:
        pass


class HFBackend:
    name = "hf"

    def __init__(self, model_path, tokenizer, dtype=None, device: str = "cpu") -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.tokenizer = tokenizer
        self.model = AutoModelForCausalLM.from_pretrained(
            str(model_path), dtype=dtype or torch.float32
        ).to(device).eval()
        self.device = device
        self.kv = Timeline()
        self.weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self._lock = asyncio.Lock()
        # loaded in this thread, generates in asyncio's worker thread: the same release the
        # engine gets (kernels/openmp_pool.py), so the baseline is not slowed by it either
        from edge_runtime.kernels.openmp_pool import release_thread_pool

        release_thread_pool()

    async def complete(self, stream: str, messages: list[dict], max_tokens: int) -> Outcome:
        prompt_ids = encode_messages(self.tokenizer, messages)
        async with self._lock:
            return await asyncio.to_thread(self._generate, prompt_ids, max_tokens)

    def _generate(self, prompt_ids: list[int], max_tokens: int) -> Outcome:
        from transformers import DynamicCache

        torch = self.torch
        ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.device)  # [1, L]
        clock = _FirstTokenClock()
        cache = DynamicCache(config=self.model.config)
        self.kv.add(0)
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens,
                do_sample=False, streamer=clock, cache=cache,
                return_dict_in_generate=True, pad_token_id=self.tokenizer.eos_token_id,
            )
        end_t = time.perf_counter()
        kv_bytes = cache_nbytes(cache)
        self.kv.add(kv_bytes, end_t)
        self.kv.add(0, end_t)
        gen_ids = out.sequences[0, len(prompt_ids):].tolist()
        eos_cfg = self.model.generation_config.eos_token_id
        eos = set(eos_cfg if isinstance(eos_cfg, (list, tuple)) else [eos_cfg])
        reason = "stop" if gen_ids and gen_ids[-1] in eos else "length"
        return Outcome(
            text=self.tokenizer.decode(gen_ids, skip_special_tokens=True),
            output_tokens=len(gen_ids), first_token_t=clock.first_token_t, end_t=end_t,
            prompt_tokens=len(prompt_ids), cached_prompt_tokens=0, finish_reason=reason,
            token_ids=gen_ids,
        )
