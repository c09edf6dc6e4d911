"""Per-token mask cost of the two grammar libraries (xgrammar, llguidance) on this CPU.

Replays a valid JSON answer token by token (tokenized with the built-in model's tokenizer) through
each library's matcher, as a decode loop would: compute the next-token mask for every row of the
batch, apply it to [batch, vocab] logits, accept the token. Batch 5 runs five matchers over the same
answer, once one row after another and once through the library's own batched (threaded) call.
Also times the grammar compile (cold, and a second compile of the same schema).

    .venv/bin/python tools/grammar_mask_bench.py --out grammar_mask_bench.json

Prints a table and writes JSON. Numbers are medians over the replayed tokens. llguidance comes with
the `grammar-compare` extra (pip install -e ".[grammar-compare]"); xgrammar is a dependency.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

SCHEMAS = {
    "tool_call": {
        "type": "object",
        "properties": {
            "name": {"const": "set_light"},
            "arguments": {
                "type": "object",
                "properties": {
                    "device": {"enum": ["kitchen light", "hall light", "bedroom lamp",
                                        "garden lights", "porch light"]},
                    "on": {"type": "boolean"},
                    "brightness": {"type": "integer", "minimum": 0, "maximum": 100},
                },
                "required": ["device", "on", "brightness"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    },
    "record": {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "score": {"type": "number"},
            "owner": {"type": "object", "properties": {"name": {"type": "string"},
                                                      "age": {"type": "integer"}},
                      "required": ["name", "age"]},
        },
        "required": ["title", "tags", "score", "owner"],
    },
}
ANSWERS = {
    "tool_call": {"name": "set_light", "arguments": {"device": "kitchen light", "on": False,
                                                     "brightness": 40}},
    "record": {"title": "Kitchen inventory for the week", "tags": ["food", "weekly", "home"],
               "score": 7.25, "owner": {"name": "Alex Martin", "age": 41}},
}


def _median_us(samples: list[float]) -> float:
    return statistics.median(samples) * 1e6


class XGrammarRunner:
    name = "xgrammar"

    def __init__(self, tokenizer, vocab: int):
        import xgrammar as xgr
        self.xgr = xgr
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=2)
        self.batch = xgr.BatchGrammarMatcher(max_threads=2)

    def compile(self, schema: dict):
        return self.compiler.compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                separators=(", ", ": "))

    def matchers(self, compiled, n: int):
        return [self.xgr.GrammarMatcher(compiled) for _ in range(n)]

    def bitmask(self, n: int, vocab: int):
        return self.xgr.allocate_token_bitmask(n, vocab)

    def fill(self, matchers, bitmask, batched: bool):
        if batched:
            self.batch.batch_fill_next_token_bitmask(matchers, bitmask)
        else:
            for i, m in enumerate(matchers):
                m.fill_next_token_bitmask(bitmask, i)

    def apply(self, logits, bitmask):
        self.xgr.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matchers, token: int):
        for m in matchers:
            assert m.accept_token(token), token


class LLGuidanceRunner:
    name = "llguidance"

    def __init__(self, tokenizer, vocab: int):
        import llguidance
        import llguidance.hf
        import llguidance.torch
        self.llg = llguidance
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab)
        self.executor = llguidance.LLExecutor(num_threads=2)

    def compile(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False, "item_separator": ", ",
                             "key_separator": ": "})
        # llguidance compiles lazily inside the matcher: build one so the cost is counted
        self.llg.LLMatcher(self.tok, grammar)
        return grammar

    def matchers(self, compiled, n: int):
        return [self.llg.LLMatcher(self.tok, compiled) for _ in range(n)]

    def bitmask(self, n: int, vocab: int):
        return self.llg.torch.allocate_token_bitmask(n, vocab)

    def fill(self, matchers, bitmask, batched: bool):
        if batched:
            self.llg.torch.fill_next_token_bitmask_par(
                self.executor, [(m, i) for i, m in enumerate(matchers)], bitmask)
        else:
            for i, m in enumerate(matchers):
                self.llg.torch.fill_next_token_bitmask(m, bitmask, i)

    def apply(self, logits, bitmask):
        self.llg.torch.apply_token_bitmask_inplace(logits, bitmask)

    def accept(self, matchers, token: int):
        for m in matchers:
            assert m.consume_token(token), (token, m.get_error())


def replay(runner, compiled, token_ids: list[int], batch: int, vocab: int, batched: bool) -> dict:
    matchers = runner.matchers(compiled, batch)
    bitmask = runner.bitmask(batch, vocab)
    logits = torch.randn(batch, vocab)
    fill_s, apply_s = [], []
    for tok in token_ids:
        t0 = time.perf_counter()
        runner.fill(matchers, bitmask, batched)
        t1 = time.perf_counter()
        runner.apply(logits, bitmask)
        t2 = time.perf_counter()
        runner.accept(matchers, tok)
        fill_s.append(t1 - t0)
        apply_s.append(t2 - t1)
    return dict(fill_us=_median_us(fill_s), apply_us=_median_us(apply_s),
                fill_p90_us=sorted(fill_s)[int(0.9 * len(fill_s))] * 1e6)


def bench_library(runner, tokenizer, vocab: int) -> list[dict]:
    rows = []
    for schema_name, schema in SCHEMAS.items():
        t0 = time.perf_counter()
        compiled = runner.compile(schema)
        cold_ms = (time.perf_counter() - t0) * 1e3
        t0 = time.perf_counter()
        runner.compile(schema)
        again_ms = (time.perf_counter() - t0) * 1e3
        text = json.dumps(ANSWERS[schema_name])  # ", " and ": ": both grammars below emit these
        token_ids = tokenizer.encode(text, add_special_tokens=False)
        for batch, batched in ((1, False), (5, False), (5, True)):
            stats = replay(runner, compiled, token_ids, batch, vocab, batched)
            rows.append(dict(library=runner.name, schema=schema_name, batch=batch,
                             mode="library batch call" if batched else "row by row",
                             tokens=len(token_ids), compile_ms=cold_ms,
                             compile_again_ms=again_ms, **stats))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--out", default="grammar_mask_bench.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    from edge_runtime.model.loader import load_tokenizer, read_model_config, resolve_model_folder
    folder = resolve_model_folder(args.model)
    tokenizer = load_tokenizer(folder)
    vocab = read_model_config(folder).vocab_size
    rows = []
    for cls in (XGrammarRunner, LLGuidanceRunner):
        t0 = time.perf_counter()
        runner = cls(tokenizer, vocab)
        setup_ms = (time.perf_counter() - t0) * 1e3
        for row in bench_library(runner, tokenizer, vocab):
            rows.append(dict(row, tokenizer_setup_ms=setup_ms))
    print(f"{'library':<11} {'schema':<10} {'batch':>5} {'mode':<19} {'mask us':>8} "
          f"{'p90 us':>8} {'apply us':>8} {'compile ms':>10} {'again ms':>8} {'setup ms':>8}")
    for r in rows:
        print(f"{r['library']:<11} {r['schema']:<10} {r['batch']:>5} {r['mode']:<19} "
              f"{r['fill_us']:>8.1f} {r['fill_p90_us']:>8.1f} {r['apply_us']:>8.1f} "
              f"{r['compile_ms']:>10.1f} {r['compile_again_ms']:>8.2f} {r['tokenizer_setup_ms']:>8.0f}")
    with open(args.out, "w") as f:
        json.dump(dict(model=args.model, vocab=vocab, rows=rows), f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
