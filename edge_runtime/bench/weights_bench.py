"""`edge-runtime bench weights`: weight bytes and decode tokens/s, fp32 model vs its AWQ int4 folder.

Both models run the same plain decode loop (our CausalLM forward on the ContiguousKVCache, fp32 KV,
greedy tokens), batch B = sequences decoded together in one flattened forward per step. Runs of the
two models are interleaved (fp32, awq, fp32, awq, ...) so that load from other processes hits both
alike; the median over repeats is reported. Only decode steps are timed, not prefill.
"""

from __future__ import annotations

import statistics
import sys
import time

from edge_runtime.bench.checks import check_min, parse_int_list
from edge_runtime.bench.report import Column, fmt_mib, fmt_num, fmt_pct, markdown_table, write_json
from edge_runtime.errors import ConfigError
from edge_runtime.kernels.cpu_threads import configure


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("weights", help="weight bytes and decode tokens/s: fp32 vs AWQ int4")
    p.add_argument("--model", default="smollm2-135m-instruct", help="the float model")
    p.add_argument("--awq", required=True, help="its AWQ folder (from `edge-runtime quantize`)")
    p.add_argument("--batch", default="1,5", help="comma-separated batch sizes")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--gen-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None, help="CPU threads, fixed (default: the free cores)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write all rows and the machine description here")
    p.set_defaults(func=run)


def decode_tokens_per_s(lm, batch: int, prompt_tokens: int, gen_tokens: int,
                        seed: int) -> tuple[float, float]:
    """Prefill `batch` random prompts, then time `gen_tokens` batched greedy decode steps.

    Returns (tokens per wall second, tokens per process-CPU second). On a machine shared with
    other jobs, run with --threads 1: the CPU-second rate is then what an idle core would give.
    """
    import torch

    from edge_runtime.model.contiguous_kv import ContiguousKVCache  # start-up time: imports torch

    gen = torch.Generator().manual_seed(seed)
    cache = ContiguousKVCache.for_model(lm.config, dtype=torch.float32)
    seq_ids = list(range(batch))
    for s in seq_ids:
        cache.add(s, capacity=prompt_tokens + gen_tokens)
    ids = torch.randint(0, lm.config.vocab_size, (batch * prompt_tokens,), generator=gen)
    positions = cache.positions(seq_ids, [prompt_tokens] * batch)
    last = torch.arange(1, batch + 1) * prompt_tokens - 1
    logits = lm.model(ids, positions, cache.step(seq_ids, [prompt_tokens] * batch), last)
    start, cpu_start = time.perf_counter(), time.process_time()
    for _ in range(gen_tokens):
        ids = logits.argmax(dim=-1)  # [B]
        positions = cache.positions(seq_ids, [1] * batch)
        logits = lm.model(ids, positions, cache.step(seq_ids, [1] * batch), None)
    tokens = batch * gen_tokens
    return tokens / (time.perf_counter() - start), tokens / (time.process_time() - cpu_start)


def _measure(models: dict, batches: list[int], args) -> list[dict]:
    from tqdm import tqdm

    samples = {(name, b): [] for name in models for b in batches}
    cpu_samples = {key: [] for key in samples}
    bar = tqdm(total=len(samples) * args.repeat, desc="decode runs", file=sys.stderr)
    for r in range(args.repeat):
        for b in batches:
            for name, lm in models.items():
                tps, cpu_tps = decode_tokens_per_s(lm, b, args.prompt_tokens, args.gen_tokens,
                                                   args.seed + r)
                samples[(name, b)].append(tps)
                cpu_samples[(name, b)].append(cpu_tps)
                bar.update(1)
    bar.close()
    fp32_bytes = models["fp32"].weight_bytes
    rows = []
    for (name, b), values in samples.items():
        lm = models[name]
        rows.append({"model": name, "quantization": lm.quantization, "batch": b,
                     "weight_bytes": lm.weight_bytes, "weight_ratio": lm.weight_bytes / fp32_bytes,
                     "decode_tok_s": statistics.median(values), "decode_tok_s_runs": values,
                     "decode_tok_cpu_s": statistics.median(cpu_samples[(name, b)]),
                     "decode_tok_cpu_s_runs": cpu_samples[(name, b)]})
    for row in rows:
        base = next(r for r in rows if r["model"] == "fp32" and r["batch"] == row["batch"])
        row["speedup_vs_fp32"] = row["decode_tok_s"] / base["decode_tok_s"]
        row["cpu_speedup_vs_fp32"] = row["decode_tok_cpu_s"] / base["decode_tok_cpu_s"]
    return rows


def run(args) -> int:
    import torch

    from edge_runtime.model.loader import load_model  # start-up time: imports torch

    batches = parse_int_list(args.batch, "--batch")
    check_min(args, prompt_tokens=1, gen_tokens=1, repeat=1, threads=1)
    if args.threads:
        configure(pinned=args.threads)
    models = {"fp32": load_model(args.model, weights="fp32"), "awq": load_model(args.awq)}
    if models["awq"].quantization == "none":
        raise ConfigError(f"{args.awq} is not an AWQ checkpoint; make one with `edge-runtime quantize`")
    rows = _measure(models, batches, args)
    cols = [Column("model", "model"), Column("quantization", "weights"), Column("batch", "batch"),
            Column("weight_bytes", "weight MiB", fmt_mib), Column("weight_ratio", "vs fp32", fmt_pct),
            Column("decode_tok_s", "decode tok/s", fmt_num(1)),
            Column("speedup_vs_fp32", "speed-up", lambda v: f"{v:.2f}x"),
            Column("decode_tok_cpu_s", "tok per CPU-s", fmt_num(1)),
            Column("cpu_speedup_vs_fp32", "CPU speed-up", lambda v: f"{v:.2f}x")]
    print(markdown_table(rows, cols))
    if args.json:
        write_json(args.json, {"bench": "weights", "args": vars(args) | {"func": None}, "rows": rows,
                               "threads": torch.get_num_threads()})
    return 0
