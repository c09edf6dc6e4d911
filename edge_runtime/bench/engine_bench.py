"""`edge-runtime bench engine`: prefill and decode tokens/s per batch size, and the roofline.

Method (llama-bench convention, interleaved): per prompt length P, one warm-up run per batch size B,
then `repeat` rounds of one timed run per batch size (so drifting machine speed hits every B alike);
each run adds B requests of P random token ids (fresh per run, so the prefix cache never hits) with
`max_tokens=G, ignore_eos=True`, greedy, and steps the engine until all finish.
- prefill tok/s = B*P / (time until every request has its first token)
- decode tok/s  = B*(G-1) / (time from then until the last token)
- weight GB/s   = weight_bytes * (G-1) / decode time: each batched decode step reads every weight
  once, whatever B is. `% roofline` divides each run's weight GB/s by the read bandwidth
  (bench/bandwidth.py) measured right before and right after that run, the higher of the two (on
  a shared VM the bandwidth changes within seconds; the higher reading gives the lower,
  conservative percentage), and reports mean ± stddev of those per-run percentages.
Reported as mean ± sample stddev over the repeats.
"""

from __future__ import annotations

import random
import sys

from edge_runtime.bench.checks import check_bandwidth_mib, check_context, check_min, parse_int_list
from edge_runtime.bench.engine_runs import bench_prompt
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.bench.stats import Summary
from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.errors import InputError
from edge_runtime.bench.bandwidth import BandwidthProbe
from edge_runtime.bench.edge_systems import build_engine, check_pool, load
from edge_runtime.bench.weights_compare import (bench_interleaved, format_weight_ratios,
                                                parse_weights, weight_ratios)
from edge_runtime.kernels import cpu_threads


COLUMNS = [
    Column("batch", "batch"), Column("prompt_tokens", "prompt"), Column("gen_tokens", "gen"),
    Column("prefill", "prefill tok/s"), Column("decode", "decode tok/s"),
    Column("gbps", "weight read GB/s"), Column("read_gbps", "read GB/s (roofline)"),
    Column("roofline", "% of read roofline"),
]


def table_rows(rows: list[dict]) -> list[dict]:
    def fmt(d, digits=1):
        return Summary(d["mean"], d["stddev"], d["n"]).fmt(digits)

    return [{
        "batch": r["batch"], "prompt_tokens": r["prompt_tokens"], "gen_tokens": r["gen_tokens"],
        "prefill": fmt(r["prefill_tok_s"]), "decode": fmt(r["decode_tok_s"]),
        "gbps": fmt(r["weight_read_gbps"], 2), "read_gbps": fmt(r["roofline_read_gbps"]),
        "roofline": fmt(r["roofline_pct"], 0) + "%",
    } for r in rows]


# A pair of runs whose bandwidth readings differ by more than this factor may have run on
# different machines: the AMD VM's two modes read ~30-35 and ~45-65 GB/s (docs/perf.md, "Machines")
STEADY_SPREAD = 1.3


def decode_ratios(rows: list[dict]) -> list[dict]:
    """Per prompt length and batch size B > 1: decode tok/s of batch B over batch 1's, as the ratio
    of the means and run by run (run i of every batch size ran seconds apart, interleaved), with
    batch 1's and batch B's roofline of each run: on a machine whose bandwidth changes (this VM's
    two modes) the per-run ratios show what each condition gives, and `steady` says whether the
    four readings around a pair agree within STEADY_SPREAD (else the two runs of the pair may have
    seen different machines, and their ratio mixes the two)."""
    out = []
    for prompt in sorted({r["prompt_tokens"] for r in rows}):
        at = {r["batch"]: r for r in rows if r["prompt_tokens"] == prompt}
        if 1 not in at:
            continue
        one = at[1]
        for batch in sorted(b for b in at if b > 1):
            row = at[batch]
            ratio = {"prompt_tokens": prompt, "batch": batch,
                     "of_means": row["decode_tok_s"]["mean"] / one["decode_tok_s"]["mean"],
                     "per_run": [b / a for a, b in zip(one["decode_samples"], row["decode_samples"])]}
            if "bandwidth" in one and "bandwidth" in row:
                ratio["batch1_roofline_gbps"] = _rooflines(one["bandwidth"])
                ratio["roofline_gbps"] = _rooflines(row["bandwidth"])
                ratio["steady"] = [_steady([*a, *b]) for a, b in zip(one["bandwidth"], row["bandwidth"])]
            out.append(ratio)
    return out


def _rooflines(bandwidth: list) -> list[float]:
    """Each run's roofline from its saved (before, after) readings: the higher of the two."""
    return [max(before["read_gbps"], after["read_gbps"]) for before, after in bandwidth]


def _steady(readings: list[dict]) -> bool:
    gbps = [r["read_gbps"] for r in readings]
    return max(gbps) <= STEADY_SPREAD * min(gbps)


def format_ratios(ratios: list[dict]) -> list[str]:
    lines, unsteady = [], False
    for q in ratios:
        runs = [f"{x:.2f}" for x in q["per_run"]]
        if q.get("batch1_roofline_gbps"):
            runs = [f"{r} ({g1:.0f}/{g:.0f} GB/s{'' if ok else ', unsteady'})" for r, g1, g, ok in
                    zip(runs, q["batch1_roofline_gbps"], q["roofline_gbps"], q["steady"])]
            unsteady = unsteady or not all(q["steady"])
        lines.append(f"batch-{q['batch']}/batch-1 decode, {q['prompt_tokens']}-token prompts: "
                     f"{q['of_means']:.2f}x (means); run by run (batch 1's/batch {q['batch']}'s "
                     f"roofline): {', '.join(runs)}")
    if unsteady:
        lines.append(f"unsteady: the read bandwidth around the pair's two runs varied by more than "
                     f"{STEADY_SPREAD}x, so they may have run in different conditions")
    return lines


def set_threads(threads: int | None) -> None:
    """Pin the CPU team to `threads` (None: the default policy, sized to the cores other programs
    leave free, kernels/cpu_threads.py), for this process's CPU back end and torch."""
    if threads is not None and threads < 1:
        raise InputError(f"--threads must be at least 1, got {threads}")

    cpu_threads.configure(pinned=threads)


def _progress(msg: str) -> None:
    print(f"[bench engine] {msg}", file=sys.stderr, flush=True)


def run(args) -> int:
    forms = parse_weights(args.weights)
    batches = parse_int_list(args.batch, "--batch")
    prompts = parse_int_list(args.prompt_tokens, "--prompt-tokens")
    check_min(args, gen_tokens=2, repeat=1, recent_window=0)
    check_bandwidth_mib(args.bandwidth_mib)
    check_pool(max(batches), max(prompts) + args.gen_tokens)
    check_context(args.model, max(prompts) + args.gen_tokens, "--prompt-tokens + --gen-tokens")
    if args.recent_window:
        check_context(args.model, args.recent_window, "--recent-window")
    set_threads(args.threads)
    _progress("measuring memory read bandwidth (the roofline)...")
    probe = BandwidthProbe(size_mib=args.bandwidth_mib)
    bw = probe.measure()
    _progress(f"read {bw.read_gbps:.1f} GB/s, copy {bw.copy_gbps:.1f} GB/s; loading {args.model}...")
    systems = {}
    for form in forms:
        loaded = load(args.model, form, args.device, args.backend)
        systems[form] = (build_engine(loaded, "edge", kv_dtype=args.kv_dtype,
                                      max_batch=max(batches), max_tokens=max(prompts) + args.gen_tokens,
                                      recent_window=args.recent_window), loaded)
    engine, loaded = systems[forms[0]]
    rng = random.Random(args.seed)
    rows = []
    measure = lambda: probe.measure(repeats=3)  # noqa: E731
    for p in prompts:
        if len(forms) > 1:
            rows += bench_interleaved(systems, batches, p, args.gen_tokens, args.repeat, rng,
                                      _progress, measure)
        else:
            rows += bench_prompt(engine, loaded, batches, p, args.gen_tokens, args.repeat, rng,
                                 _progress, measure=measure)
    if len(forms) > 1:
        return _report_forms(args, systems, rows, bw)
    readings = [x["read_gbps"] for r in rows for pair in r["bandwidth"] for x in pair]
    print(f"model {args.model} ({loaded.weight_bytes / 1e6:.0f} MB weights, "
          f"quantization {loaded.quantization}), KV {args.kv_dtype}"
          f"{f' (recent window {engine.kv.windows.window_tokens})' if engine.kv.windows.window_tokens else ''}"
          f"; runs of the batch sizes "
          f"interleaved; roofline: read bandwidth measured around each run, "
          f"{min(readings):.1f}-{max(readings):.1f} GB/s "
          f"(copy {bw.copy_gbps:.2f} GB/s read+written at the start), {bw.threads} threads")
    print(markdown_table(table_rows(rows), COLUMNS))
    ratios = decode_ratios(rows)
    print("\n".join(format_ratios(ratios)))
    if args.json:
        write_json(args.json, {"bench": "engine", "model": args.model,
                               "weight_bytes": loaded.weight_bytes, "kv_dtype": args.kv_dtype,
                               "recent_window": engine.kv.windows.window_tokens,
                               "quantization": loaded.quantization, "bandwidth": bw.to_dict(),
                               "backend": engine.backend.describe(),
                               "rows": rows, "decode_ratios": ratios})
    return 0


def _report_forms(args, systems: dict, rows: list[dict], bw) -> int:
    """Several weight forms: one table with a weights column, and their ratios."""
    for form, (_, loaded) in systems.items():
        print(f"{form}: {loaded.weight_bytes / 1e6:.1f} MB weights, quantization {loaded.quantization}")
    table = [{"weights": r["weights"], **t} for r, t in zip(rows, table_rows(rows))]
    print(markdown_table(table, [Column("weights", "weights")] + COLUMNS))
    ratios = weight_ratios(rows)
    print("\n".join(format_weight_ratios(ratios)))
    if args.json:
        write_json(args.json, {"bench": "engine", "model": args.model, "kv_dtype": args.kv_dtype,
                               "weights": {f: {"weight_bytes": lm.weight_bytes,
                                               "quantization": lm.quantization}
                                           for f, (_, lm) in systems.items()},
                               "backend": next(iter(systems.values()))[0].backend.describe(),
                               "bandwidth": bw.to_dict(), "rows": rows, "weight_ratios": ratios})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("engine", help="prefill/decode tokens/s per batch size vs the roofline")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--weights", default="auto",
                   help="comma-separated weight forms, run interleaved and compared: gguf (a GGUF's "
                        "own 4-bit blocks, CPU back end), fp32 / fp16 / bf16 (float weights), auto "
                        "(the default: gguf on the CPU back end, the back end's float dtype on "
                        "the CUDA one)")
    add_placement_arguments(p)
    p.add_argument("--batch", default="1,2,5", help="comma-separated batch sizes")
    p.add_argument("--prompt-tokens", default="128,512", help="comma-separated prompt lengths")
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--kv-dtype", default="int8", choices=["int8", "fp16", "fp32"])
    p.add_argument("--recent-window", type=int, default=None, metavar="W",
                   help="int8 KV: positions per sequence read exact (default: the engine's; 0: off)")
    p.add_argument("--bandwidth-mib", type=int, default=512,
                   help="tensor size for the read-bandwidth roofline (>> last-level cache)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads, fixed (default: the cores other programs leave free, "
                        "re-checked every second)")
    p.add_argument("--json", help="write all rows and the machine description here")
    p.set_defaults(func=run)
