#!/usr/bin/env python3
"""Check every Triton kernel against its torch reference at real sizes on a CUDA GPU, and time it.

    python tools/gpu_check.py --json gpu_check.json            # CUDA: Llama-2-7B shapes
    python tools/gpu_check.py --tiny --json /tmp/tiny.json     # anywhere: tiny shapes; on CPU the
                                                               # kernels run under TRITON_INTERPRET=1
    python tools/gpu_check.py --engine --json engine.json      # CUDA: the engine level (below)
Engine level (tools/gpu_lab/engine_check.py): the built-in model through the engine and
through transformers on the same GPU (decode at batch 1/5/16 after 512 tokens, prefill 512/2048,
launches, host syncs and bytes per step, the voice trace on the GPU and the CPU back end).
Shapes (real): 32 heads, head_dim 128, 32 KV heads, 512-token pages; 5 sequences of 2,000 tokens
sharing a 300-token prefix (one-segment and prefix+tail+merge layouts); a 256-token prefill;
W4A16 at K x N = 4096 x 4096 and 4096 x 11008, group 128, M = 1..16 and 512.

Timing: CUDA events around a CUDA graph of `ITERS` calls (plain stream loop where a graph cannot be
captured, e.g. the references, which sync), median of `REPS`, after a warm-up. Inputs rotate over
copies totalling > 2x the L2 size, so weights and pages come from DRAM as in a real decode step.
Bandwidth: GB/s = bytes the op must read (int8 K/V + fp16 scales; int4 weights + scales + zeros)
/ time; the card's copy bandwidth counts bytes read + written by a large device-to-device copy.
Exit status 1 when any kernel disagrees with its reference; targets are reported, not enforced.
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported by the kernels
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/: source_tree, the gpu_lab package
from source_tree import import_edge_runtime  # noqa: E402

import_edge_runtime()  # the installed package, or the checkout's where it is not installed
from edge_runtime.kernels import awq_gemm as awq  # noqa: E402
from edge_runtime.kernels import kv_write as kvw  # noqa: E402
from edge_runtime.kernels import paged_attention as pa  # noqa: E402
from edge_runtime.kernels import awq_prepared as awp  # noqa: E402
from edge_runtime.bench.checks import parse_int_list  # noqa: E402
from edge_runtime.errors import InputError  # noqa: E402

from gpu_lab import engine_check as gpu_engine_check  # noqa: E402
from gpu_lab import paged_decode as pd  # noqa: E402
from gpu_lab.checks import (DECODE_KERNELS, build_pool, check_awq, check_awq_prepared,  # noqa: E402
                            check_decode, check_kv_write, check_prefill, decode_ctx)
from gpu_lab.sweep import STAGES, sweep, tuned_rows  # noqa: E402
from gpu_lab.timing import ITERS, REPS, copy_bandwidth, log  # noqa: E402

REAL = dict(heads=32, kv_heads=32, head_dim=128, page=512, seqs=5, seq_len=2000, prefix=300, prefill=256,
            awq=[(4096, 4096), (4096, 11008)], ms=[1, 2, 3, 4, 5, 8, 16, 512], group=128)
TINY = dict(heads=4, kv_heads=2, head_dim=32, page=16, seqs=3, seq_len=40, prefix=12, prefill=8,
            awq=[(128, 64), (128, 88)], ms=[1, 3, 16, 20], group=32)
TARGETS = {"decode_attention_pct_copy": 60.0, "gemv_speedup_vs_fp16_m1_5": 2.5}


def print_table(rows, copy_bw):
    cols = ["check", "shape", "ok", "kernel_us", "ref_us", "dense_us", "GBps", "pct_copy", "speedup_vs_dense"]
    fmt = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    lines += [" | ".join(fmt(r.get(col)) for col in cols) for r in rows]
    log(f"\ncopy bandwidth (read + write): {copy_bw:.0f} GB/s\n" + "\n".join(f"| {x} |" for x in lines))


def targets(rows):
    """Per kernel family: decode % of copy bandwidth; W4A16 least speed-up over fp16 at M = 1..5."""
    dec = [r for r in rows if r["check"].startswith(tuple(DECODE_KERNELS)) and r.get("pct_copy")]
    gemv = {}
    for r in rows:
        if r["check"] in ("w4a16 gemv", "w4a16 prepared gemv") and r["m"] <= 5:
            gemv.setdefault(r["check"], []).append(r["speedup_vs_dense"])
    return {"decode_attention_pct_copy": {"target": TARGETS["decode_attention_pct_copy"],
                                          "measured": {r["check"]: r["pct_copy"] for r in dec}},
            "gemv_speedup_vs_fp16_m1_5": {"target": TARGETS["gemv_speedup_vs_fp16_m1_5"],
                                          "min_measured": {k: min(v) for k, v in gemv.items()}}}


def guarded(name, fn, errors):
    """Run one section; a crash is recorded (and fails the run) instead of losing the others."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported in the table and the JSON
        import traceback
        traceback.print_exc()
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
        return None


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the results")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU interpreter or a quick GPU smoke test)")
    ap.add_argument("--sweep", choices=("auto", "on", "off"), default="auto",
                    help="time alternative launch configs (auto: on CUDA only)")
    ap.add_argument("--sweep-budget", type=float, default=300.0,
                    help="seconds the sweep may take, in shares per kernel: "
                         + ", ".join(f"{stage} {100 * part:.0f}%%" for stage, part, _ in STAGES))
    gpu_engine_check.add_arguments(ap)
    args = ap.parse_args(argv)
    if args.engine:
        try:
            parse_int_list(args.batches, "--batches"), parse_int_list(args.prefill_tokens, "--prefill-tokens")
        except InputError as exc:
            ap.error(str(exc))
        if not torch.cuda.is_available():
            ap.error("--engine measures the engine on a CUDA GPU; torch sees none here")
        return args
    if not torch.cuda.is_available() and not args.tiny:
        ap.error("no CUDA device: run with --tiny to check the kernels under TRITON_INTERPRET=1")
    return args


def run_checks(env, errors):
    """Every kernel once with the default configs -> (rows, state the sweep reuses)."""
    c, dev, cuda, copy_bw, l2, gen = (env[k] for k in ("c", "dev", "cuda", "copy_bw", "l2", "gen"))
    rows, state = [], {}
    layout, writes, _ = build_pool(c, dev, gen)
    kv_res = guarded("kv_write", lambda: check_kv_write(c, dev, cuda, layout, writes, copy_bw), errors)
    if kv_res:
        rows += kv_res[0]
        state.update(layout=layout, pool=kv_res[1])
        ctx = guarded("decode inputs", lambda: decode_ctx(c, dev, cuda, layout, kv_res[1], l2, gen), errors)
        if ctx:
            state["decode"] = ctx
            for kernel in DECODE_KERNELS:
                rows += guarded(kernel, lambda: check_decode(c, cuda, ctx, copy_bw, kernel), errors) or []
        pre = guarded("prefill", lambda: check_prefill(c, dev, cuda, layout, kv_res[1], gen), errors)
        if pre:
            rows += pre[0]
            state["prefill"] = pre[1]
    rows += guarded("awq", lambda: check_awq(c, dev, cuda, copy_bw, l2, gen), errors) or []
    rows += guarded("awq_prepared", lambda: check_awq_prepared(c, dev, cuda, copy_bw, l2, gen), errors) or []
    return rows, state


def run_sweep(env, state, budget_s, result, errors):
    """Sweep the launch configs, then re-run the checks with the best configs found."""
    result["sweep"] = guarded("sweep", lambda: sweep(env, state, budget_s), errors) or []
    if result["sweep"]:
        tuned = guarded("tuned", lambda: tuned_rows(env, state, result["sweep"]["best"]), errors) or []
        print_table(tuned, env["copy_bw"])
        result.update(tuned_rows=tuned, tuned_targets=targets(tuned))


def main(argv=None):
    args = parse_args(argv)
    if args.engine:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = gpu_engine_check.run(args, log, args.json)
        log(f"errors: {result['errors']}; skipped: {result['skipped']}; wrote {args.json}")
        return 1 if result["errors"] else 0
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    props = torch.cuda.get_device_properties(dev) if cuda else None
    name = props.name if cuda else "cpu (TRITON_INTERPRET=1)"
    log(f"device: {name}; torch {torch.__version__}; triton {getattr(kvw.triton, '__version__', None)}")
    t0 = time.perf_counter()
    env = dict(c=TINY if args.tiny else REAL, dev=dev, cuda=cuda, copy_bw=copy_bandwidth(cuda, dev),
               l2=getattr(props, "L2_cache_size", 64 << 20) if cuda else 0, gen=torch.Generator().manual_seed(0))
    log(f"copy bandwidth: {env['copy_bw']:.0f} GB/s")
    errors = []
    rows, state = run_checks(env, errors)
    print_table(rows, env["copy_bw"])
    result = dict(device=name, torch=torch.__version__, triton=getattr(kvw.triton, "__version__", None),
                  shapes="tiny" if args.tiny else "llama-2-7b", copy_GBps=env["copy_bw"], l2_bytes=env["l2"],
                  iters=ITERS, reps=REPS, tune_attention=pa.TUNE, tune_awq=awq.TUNE, tune_paged_decode=pd.TUNE,
                  tune_awq_prepared=awp.TUNE, rows=rows,
                  targets=targets(rows), sweep=[], errors=errors)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))  # written early: a later crash keeps this
    if args.sweep == "on" or (args.sweep == "auto" and cuda):
        run_sweep(env, state, args.sweep_budget, result, errors)
    result["all_ok"] = (bool(rows) and not errors and all(
        r["ok"] for r in rows + result.get("tuned_rows", [])))
    args.json.write_text(json.dumps(result, indent=1))
    log(f"targets: {json.dumps(result['targets'])}\ntuned targets: {json.dumps(result.get('tuned_targets'))}\n"
        f"errors: {errors}\nall_ok={result['all_ok']}; wrote {args.json} ({time.perf_counter() - t0:.0f} s)")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
