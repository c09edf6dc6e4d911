"""`edge-runtime bench grammar`: decode tokens/s with and without a JSON-schema constraint.

Method: per batch size B, runs of B chat requests (a distinct user line per request and run, so
the answers differ; the shared system prompt is cached alike for both variants), greedy,
`max_tokens=G`. The plain variant runs with ignore_eos; the constrained one with a schema whose
answer cannot end within G tokens (an array with more items than G), so both decode exactly G
tokens. Runs are interleaved (plain B=1, constrained B=1, plain B=5, ...) and repeated; the table
shows the median decode tok/s = B*(G-1) / (last token - every request's first token), and the
ratio constrained/plain of those medians; the same per process-CPU second (every thread of the
process, the mask thread included: on a machine shared with other jobs the steadier number). Also:
- mask us/token: time the engine's mask thread spent filling next-token masks, per mask;
- apply us/step: `apply_bitmask` on [B, vocab] logits (the part on the sampling path);
- compile ms: the schema's first compile, and a second request's (the per-schema cache).
"""

from __future__ import annotations

import statistics
import sys
import time

from edge_runtime.bench.checks import check_min, parse_int_list
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.bench.edge_systems import build_engine, check_pool, load
from edge_runtime.bench.engine_bench import set_threads
from edge_runtime.engine.api import GrammarSpec, SamplingParams
from edge_runtime.model.chat import encode_messages

SYSTEM = "You are a home assistant. Answer in JSON."


def answer_schema(gen_tokens: int) -> dict:
    """Notes about the house: more items than tokens, so the answer never ends early."""
    return {"type": "object", "properties": {"notes": {
        "type": "array", "items": {"type": "string", "maxLength": 40},
        "minItems": gen_tokens + 1}}, "required": ["notes"], "additionalProperties": False}


def _prompts(tokenizer, batch: int, run: int) -> list[list[int]]:
    return [encode_messages(tokenizer, [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"List notes about room {run * 100 + i} of the house."}])
        for i in range(batch)]


def decode_rate(engine, prompts: list[list[int]], params) -> tuple[float, float]:
    """Run the batch to completion; decode tokens per wall second and per process-CPU second
    (all threads, the mask thread included) after every request's first token."""
    rids = [engine.add_request(p, params) for p in prompts]
    produced = dict.fromkeys(rids, 0)
    t_first = cpu_first = None
    while engine.has_unfinished():
        events = engine.step()
        for ev in events:
            if ev.request_id in produced:
                produced[ev.request_id] += len(ev.token_ids)
        if t_first is None and all(produced.values()):
            t_first, cpu_first = time.perf_counter(), time.process_time()
    t_end, cpu_end = time.perf_counter(), time.process_time()
    bad = {r: n for r, n in produced.items() if n != params.max_tokens}
    assert not bad, f"requests ended early (wanted {params.max_tokens} tokens): {bad}"
    tokens = len(prompts) * (params.max_tokens - 1)
    return tokens / (t_end - t_first), tokens / (cpu_end - cpu_first)


def apply_us(batch: int, vocab: int, repeat: int = 50) -> float:
    import torch

    # start-up time: imports torch
    from edge_runtime.engine.grammar import allocate_bitmask, apply_bitmask

    bitmask = allocate_bitmask(batch, vocab)
    bitmask[:, ::3] = 0x55555555
    logits = torch.randn(batch, vocab)
    t0 = time.perf_counter()
    for _ in range(repeat):
        apply_bitmask(logits, bitmask, list(range(batch)))
    return (time.perf_counter() - t0) / repeat * 1e6


def compile_ms(engine, spec) -> tuple[float, float]:
    compiler = engine.constraints.compiler
    t0 = time.perf_counter()
    compiler.compile(spec)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    compiler.compile(spec)
    return first * 1e3, (time.perf_counter() - t0) * 1e3


def measure(engine, loaded, batches: list[int], gen_tokens: int, repeat: int, progress) -> list:
    from edge_runtime.engine.grammar import schema_text  # start-up time: imports torch

    spec = GrammarSpec("json_schema", schema_text(answer_schema(gen_tokens)))
    first_ms, again_ms = compile_ms(engine, spec)
    variants = {"plain": SamplingParams(max_tokens=gen_tokens, ignore_eos=True),
                "json_schema": SamplingParams(max_tokens=gen_tokens, grammar=spec)}
    rates = {(b, v): [] for b in batches for v in variants}
    cpu_rates = {(b, v): [] for b in batches for v in variants}
    masks = {b: [0.0, 0] for b in batches}
    for b in batches:  # warm-up
        for params in variants.values():
            decode_rate(engine, _prompts(loaded.tokenizer, b, 0), params)
    for run in range(1, repeat + 1):
        for b in batches:
            progress(f"batch {b}: run {run}/{repeat}")
            for name, params in variants.items():
                m = engine.constraints.masks
                s0, n0 = m.fill_s, m.masks_filled
                wall, cpu = decode_rate(engine, _prompts(loaded.tokenizer, b, run), params)
                rates[(b, name)].append(wall)
                cpu_rates[(b, name)].append(cpu)
                if name != "plain":
                    masks[b][0] += m.fill_s - s0
                    masks[b][1] += m.masks_filled - n0
    rows = []
    for b in batches:
        plain, con = (statistics.median(rates[(b, v)]) for v in variants)
        plain_cpu, con_cpu = (statistics.median(cpu_rates[(b, v)]) for v in variants)
        rows.append({"batch": b, "gen_tokens": gen_tokens, "repeat": repeat,
                     "plain_tok_s": plain, "json_schema_tok_s": con, "ratio": con / plain,
                     "plain_tok_cpu_s": plain_cpu, "json_schema_tok_cpu_s": con_cpu,
                     "cpu_ratio": con_cpu / plain_cpu,
                     "plain_cpu_samples": cpu_rates[(b, "plain")],
                     "json_schema_cpu_samples": cpu_rates[(b, "json_schema")],
                     "mask_us_per_token": masks[b][0] / max(1, masks[b][1]) * 1e6,
                     "apply_us_per_step": apply_us(b, loaded.config.vocab_size),
                     "compile_ms": first_ms, "compile_cached_ms": again_ms,
                     "plain_samples": rates[(b, "plain")],
                     "json_schema_samples": rates[(b, "json_schema")]})
    return rows


COLUMNS = [
    Column("batch", "batch"), Column("gen_tokens", "gen"),
    Column("plain_tok_s", "decode tok/s plain", "{:.1f}"),
    Column("json_schema_tok_s", "decode tok/s json_schema", "{:.1f}"),
    Column("ratio", "constrained/plain", "{:.3f}"),
    Column("plain_tok_cpu_s", "plain tok/CPU-s", "{:.1f}"),
    Column("json_schema_tok_cpu_s", "json_schema tok/CPU-s", "{:.1f}"),
    Column("cpu_ratio", "constrained/plain (CPU)", "{:.3f}"),
    Column("mask_us_per_token", "mask us/token", "{:.0f}"),
    Column("apply_us_per_step", "apply us/step", "{:.0f}"),
    Column("compile_ms", "compile ms", "{:.1f}"),
    Column("compile_cached_ms", "cached compile ms", "{:.3f}"),
]


def _progress(msg: str) -> None:
    print(f"[bench grammar] {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    batches = parse_int_list(args.batch, "--batch")
    check_min(args, gen_tokens=2, repeat=1)
    check_pool(max(batches), 64 + args.gen_tokens)
    set_threads(args.threads)
    loaded = load(args.model)
    engine = build_engine(loaded, "edge", max_batch=max(batches), max_tokens=64 + args.gen_tokens)
    rows = measure(engine, loaded, batches, args.gen_tokens, args.repeat, _progress)
    print(f"model {args.model}; greedy; runs interleaved, medians of {args.repeat}")
    print(markdown_table(rows, COLUMNS))
    if args.json:
        write_json(args.json, {"bench": "grammar", "model": args.model, "rows": rows})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("grammar", help="decode tokens/s with and without a JSON-schema "
                                              "constraint; mask and compile cost")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", default="1,5", help="comma-separated batch sizes")
    p.add_argument("--gen-tokens", type=int, default=48)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="CPU threads, fixed (default: the free cores)")
    p.add_argument("--json", help="write all rows and the machine description here")
    p.set_defaults(func=run)
