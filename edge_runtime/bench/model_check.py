"""`edge-runtime bench startup` and `edge-runtime bench logits`: the model's own numbers.

- startup: spawns fresh Python processes that import the runtime, `load_model(M)` and run one
  forward, and reports seconds from process spawn to model ready (the first-ever conversion of a
  GGUF happens in a warm-up run and is reported separately). The child's CPU seconds (user + sys)
  up to "ready" are reported too: on a busy shared machine they show what a quiet one would take.
- logits: max |ours - transformers| / max |logit| on random token ids of several lengths (fp32,
  same weights, transformers loaded from the folder we load).
Both print a markdown table and optionally write JSON.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

from edge_runtime.bench.checks import check_context, check_min, parse_int_list
from edge_runtime.bench.report import Column, fmt_num, machine_info, markdown_table, write_json
from edge_runtime.import_path import code_argv

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch
from edge_runtime.model.loader import load_model
from edge_runtime.model.contiguous_kv import ContiguousKVCache
t1 = time.perf_counter()
lm = load_model(sys.argv[1], progress=None)
t2 = time.perf_counter()
cache = ContiguousKVCache.for_model(lm.config); cache.add(0)
ids = lm.tokenizer("Hello").input_ids
lm.model(torch.tensor(ids), cache.positions([0], [len(ids)]), cache.step([0], [len(ids)]))
t3 = time.perf_counter()
import resource
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"ready_at": time.time(), "cpu_s": ru.ru_utime + ru.ru_stime,
                  "import_s": t1 - t0, "load_s": t2 - t1,
                  "first_forward_s": t3 - t2,
                  "weight_mib": lm.weight_bytes / 2**20, "path": str(lm.path)}))
"""


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("startup", help="seconds from process start to model ready")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--json", help="write the rows and the machine description here")
    p.set_defaults(func=run_startup)
    q = subparsers.add_parser("logits", help="our logits vs transformers' (fp32) on random ids")
    q.add_argument("--model", default="smollm2-135m-instruct")
    q.add_argument("--lengths", default="1,7,200,1000", help="comma-separated prompt lengths")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--json", help="write the rows and the machine description here")
    q.set_defaults(func=run_logits)


def _spawn(model: str) -> dict:
    """One fresh process; total_s = spawn -> model ready (the child's exit is not counted)."""
    start = time.time()
    proc = subprocess.run(code_argv(_CHILD, model), capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        raise SystemExit(proc.returncode)
    row = json.loads(proc.stdout.strip().splitlines()[-1])
    return {**row, "total_s": row.pop("ready_at") - start}


def run_startup(args) -> int:
    from edge_runtime.model.loader import resolve_model_folder  # start-up time: imports torch

    check_min(args, repeat=1)
    print(f"warm-up: resolving {args.model} (converts a GGUF on the first run) ...", file=sys.stderr)
    t = time.perf_counter()
    resolve_model_folder(args.model)
    warmup_s = time.perf_counter() - t
    load_before = os.getloadavg()[0]
    rows = []
    for i in range(args.repeat):
        print(f"start {i + 1}/{args.repeat} ...", file=sys.stderr, flush=True)
        rows.append({"run": i + 1, **_spawn(args.model)})
    cols = [Column("run", "run"), Column("total_s", "spawn->ready s", fmt_num(2)),
            Column("import_s", "imports s", fmt_num(2)), Column("load_s", "load_model s", fmt_num(2)),
            Column("first_forward_s", "1st forward s", fmt_num(2)),
            Column("cpu_s", "CPU s to ready", fmt_num(2)),
            Column("weight_mib", "weights MiB", fmt_num(0))]
    print(markdown_table(rows, cols))
    median = statistics.median(r["total_s"] for r in rows)
    load_after = os.getloadavg()[0]
    print(f"\nmedian start-up {median:.2f} s (resolve/convert warm-up: {warmup_s:.1f} s); "
          f"1-min load average {load_before:.1f} before, {load_after:.1f} after, on {os.cpu_count()} CPUs")
    if args.json:
        write_json(args.json, {"bench": "startup", "model": args.model, "rows": rows,
                               "median_total_s": median, "warmup_s": warmup_s,
                               "loadavg_before": load_before, "loadavg_after": load_after,
                               "machine": machine_info()})
    return 0


def run_logits(args) -> int:
    import torch
    from transformers import AutoModelForCausalLM

    from edge_runtime.model.contiguous_kv import ContiguousKVCache  # start-up time: imports torch
    from edge_runtime.model.loader import load_model  # start-up time: imports torch

    lengths = parse_int_list(args.lengths, "--lengths")
    check_context(args.model, max(lengths), "--lengths")
    lm = load_model(args.model)
    print("loading the transformers reference ...", file=sys.stderr, flush=True)
    ref = AutoModelForCausalLM.from_pretrained(str(lm.path), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for n in lengths:
        print(f"length {n} ...", file=sys.stderr, flush=True)
        ids = torch.randint(3, lm.config.vocab_size, (n,), generator=gen)
        cache = ContiguousKVCache.for_model(lm.config)
        cache.add(0)
        ours = lm.model(ids, cache.positions([0], [n]), cache.step([0], [n]))
        with torch.inference_mode():
            theirs = ref(ids[None]).logits[0].float()
        diff, scale = (ours - theirs).abs().max().item(), theirs.abs().max().item()
        rows.append({"tokens": n, "max_abs_diff": diff, "max_abs_logit": scale,
                     "rel": diff / scale, "argmax_agree": float(
                         (ours.argmax(-1) == theirs.argmax(-1)).float().mean())})
    cols = [Column("tokens", "prompt tokens"), Column("max_abs_diff", "max |diff|", "{:.2e}"),
            Column("max_abs_logit", "max |logit|", "{:.2f}"), Column("rel", "diff / max", "{:.2e}"),
            Column("argmax_agree", "argmax agree", "{:.4f}")]
    print(markdown_table(rows, cols))
    if args.json:
        write_json(args.json, {"bench": "logits", "model": args.model, "rows": rows,
                               "machine": machine_info()})
    return 0
