"""The `edge-runtime generate` backend over the Engine (edge_runtime/commands/generate.py).

`EngineBackend.generate(prompt_ids, max_tokens, temperature, seed, on_token)` runs every prompt as
concurrent requests of one Engine and returns GenerationResults (they carry `token_ids`,
`prompt_tokens`, `cached_prompt_tokens`, `finish_reason` and every completion for n > 1 / beams).
The engine settings come from the command line, or from a budget's memory plan (`--config`) with
the command-line flags overriding it.
"""

from __future__ import annotations

import sys

from edge_runtime.kv.page_math import pages_for_sequence_at_most, pages_for_tokens
from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.config import DEFAULT_POOL_TOKENS, EngineConfig, budget_engine_config
from edge_runtime.engine.engine import Engine
from edge_runtime.budget import load_budget


def engine_config(args, loaded, requests: list[tuple[list[int], int]]) -> EngineConfig:
    """requests: (prompt ids, max_tokens) of every prompt, to size the pool when no budget."""
    width = max(args.n, args.beams)
    overrides = dict(enable_prefix_cache=not args.no_prefix_cache,
                     enable_inline=not args.no_inline, **args.placement.engine_settings())
    if args.kv_dtype:
        overrides["kv_dtype"] = args.kv_dtype
    if args.page_tokens:
        overrides["page_tokens"] = args.page_tokens
    if args.config:
        return budget_engine_config(load_budget(args.config), loaded, overrides,
                                    kv_dtype=args.kv_dtype, page_tokens=args.page_tokens)[0]
    page = overrides.get("page_tokens", 512)
    context = loaded.config.max_position_embeddings  # a sequence never grows past it
    per_req = [width * pages_for_sequence_at_most(min(len(p) + m, context), page)
               for p, m in requests]
    num_pages = max(max(per_req), min(sum(per_req), pages_for_tokens(DEFAULT_POOL_TOKENS, page)))
    max_seqs = max(8, width)
    return EngineConfig(num_pages=num_pages, max_num_seqs=max_seqs,
                        max_batch_tokens=max(1024, max_seqs), **overrides)


class EngineBackend:
    def __init__(self, loaded, args) -> None:
        self.loaded, self.tokenizer, self.config = loaded, loaded.tokenizer, loaded.config
        self.args = args

    def generate(self, prompt_ids, max_tokens, temperature, seed, on_token=None):
        args = self.args
        limits = [max_tokens] * len(prompt_ids) if isinstance(max_tokens, int) else list(max_tokens)
        engine = Engine(self.loaded, engine_config(args, self.loaded, list(zip(prompt_ids, limits))))
        rids = []
        for ids, m in zip(prompt_ids, limits):
            params = SamplingParams(max_tokens=m, temperature=temperature, seed=seed, n=args.n,
                                    beam_width=args.beams)
            rids.append(engine.add_request(ids, params))
        index = {rid: i for i, rid in enumerate(rids)}
        results, tokens = {}, 0
        while len(results) < len(rids):
            for ev in engine.step():
                if ev.result is not None:
                    results[ev.request_id] = ev.result
                elif on_token and ev.index == 0:
                    for tok in ev.token_ids:
                        on_token(index[ev.request_id], tok)
                tokens += len(ev.token_ids)
            if on_token is None:
                print(f"\rgenerate: {len(results)}/{len(rids)} requests done, {tokens} tokens",
                      end="", file=sys.stderr, flush=True)
        if on_token is None:
            print(file=sys.stderr)
        return [results[r] for r in rids]
