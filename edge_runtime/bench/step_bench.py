"""`edge-runtime bench step`: one engine decode step vs one transformers decode forward, interleaved.

Both run in this process on the same weights, alternating step by step, so they see the same load:
the ratio is meaningful even on a busy machine. Per batch size B: B sequences of `--prompt-tokens`
random ids are prefilled, then `--steps` engine steps (each decodes B tokens) alternate with
transformers forwards of one token (batch 1, DynamicCache) — the baseline's unit of work. Reports
medians, and how an engine step splits into the decoder layers, the LM head and everything else
(bench/step_phases.py: the Python around them). `--profile` prints the top cProfile entries of
the engine steps. `--decoder-phases` (with the kernels built with EDGE_RUNTIME_CPU_PHASE_TIMES=1)
splits the one-call C decoder layers into their phases, per thread (kernels/cpu_decoder.py).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import random
import statistics
import sys
import time

from edge_runtime.bench.bandwidth import BandwidthProbe
from edge_runtime.bench.checks import check_context, check_min, parse_int_list
from edge_runtime.bench.engine_bench import set_threads
from edge_runtime.bench.engine_runs import random_prompts
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.bench.step_phases import StepPhases
from edge_runtime.engine.placement import add_arguments as add_placement_arguments
from edge_runtime.errors import InputError
from edge_runtime.bench.edge_systems import build_engine, check_pool, load
from edge_runtime.engine.api import SamplingParams
from edge_runtime.kernels import cpu_native


def _hf_stepper(hf_folder, prompt_ids):
    import torch
    from transformers import AutoModelForCausalLM, DynamicCache

    hf = AutoModelForCausalLM.from_pretrained(str(hf_folder), dtype=torch.float32).eval()
    cache = DynamicCache(config=hf.config)
    with torch.inference_mode():
        out = hf(torch.tensor([prompt_ids]), cache=cache, use_cache=True)
    state = {"tok": out.logits[:, -1:].argmax(-1)}  # [1, 1]

    def step() -> None:
        with torch.inference_mode():
            logits = hf(state["tok"], cache=cache, use_cache=True).logits
        state["tok"] = logits[:, -1:].argmax(-1)

    return step


def _phase_times(threads: int):
    # start-up time: imports numpy, torch
    from edge_runtime.kernels.cpu_decoder import read_phase_times

    return read_phase_times(cpu_native.library(), threads)


def measure(engine, loaded, hf_folder, batch, prompt_len, steps, rng, profiler=None,
            decoder_phases: bool = False) -> dict:
    """hf_folder: the float weights transformers runs as the baseline (bench/edge_systems.py)."""
    import torch

    special = set(getattr(loaded.tokenizer, "all_special_ids", []) or [])
    prompts = random_prompts(rng, loaded.config.vocab_size, special, batch, prompt_len)
    params = SamplingParams(max_tokens=steps + 8, temperature=0.0, ignore_eos=True)
    waiting_first = {engine.add_request(p, params) for p in prompts}
    while waiting_first:  # prefill: until every request has its first token
        waiting_first -= {ev.request_id for ev in engine.step() if ev.token_ids}
    hf_step = _hf_stepper(hf_folder, prompts[0])
    t_eng, t_hf, phases = [], [], StepPhases(engine.model)
    threads = torch.get_num_threads()
    if decoder_phases:
        _phase_times(threads)  # restart the timers
    try:
        for _ in range(steps):
            phases.take()
            t0 = time.perf_counter()
            if profiler:
                profiler.enable()
            engine.step()
            if profiler:
                profiler.disable()
            t1 = time.perf_counter()
            split = phases.take()
            hf_step()
            t_hf.append(time.perf_counter() - t1)
            t_eng.append((t1 - t0, split["layers"], split["lm_head"]))
    finally:
        phases.remove()
    split = _phase_times(threads) if decoder_phases else None
    while engine.has_unfinished():
        engine.step()
    e, h = statistics.median(t[0] for t in t_eng), statistics.median(t_hf)
    extra = {}
    if split is not None:  # per step, ms: the phase (slowest thread) and each thread's work
        extra["decoder_phases"] = [{"phase": p["phase"], "ms": p["all_s"] / steps * 1e3,
                                    "work_ms": [w / steps * 1e3 for w in p["work_s"]]}
                                   for p in split]
        # the phases are totals over the timed steps / steps, i.e. means: compare them with this
        extra["engine_step_mean_ms"] = statistics.mean(t[0] for t in t_eng) * 1e3
    return {**extra, "batch": batch, "prompt_tokens": prompt_len, "steps": steps,
            "engine_step_ms": e * 1e3, "hf_forward_ms": h * 1e3, "step_ratio": e / h,
            "throughput_ratio": batch * h / e,
            "layers_ms": statistics.median(t[1] for t in t_eng) * 1e3,
            "lm_head_ms": statistics.median(t[2] for t in t_eng) * 1e3,
            "other_ms": statistics.median(t[0] - t[1] - t[2] for t in t_eng) * 1e3}


COLUMNS = [Column("batch", "batch"), Column("engine_step_ms", "engine step ms", "{:.1f}"),
           Column("layers_ms", "layers ms", "{:.2f}"), Column("lm_head_ms", "LM head ms", "{:.2f}"),
           Column("other_ms", "other ms", "{:.2f}"),
           Column("hf_forward_ms", "hf forward ms (1 token)", "{:.1f}"),
           Column("step_ratio", "step / forward", "{:.2f}"),
           Column("throughput_ratio", "decode tok/s vs hf", "{:.2f}x")]


def phase_lines(row: dict) -> list[str]:
    """Batch B's decoder phases as a markdown table (ms per step)."""
    phases = row["decoder_phases"]
    threads = len(phases[0]["work_ms"])
    around = row.get("read_gbps_around")
    seen = f"; read bandwidth {around[0]:.0f} / {around[1]:.0f} GB/s before / after" if around else ""
    lines = [f"decoder layers of a batch-{row['batch']} step, by phase (ms per step; a thread's "
             f"work ends at the phase's barrier, the phase at the slowest thread's{seen}):",
             "| phase | ms | " + " | ".join(f"thread {t} work" for t in range(threads)) + " |",
             "|---|---:|" + "---:|" * threads]
    for p in phases:
        lines.append(f"| {p['phase']} | {p['ms']:.2f} | "
                     + " | ".join(f"{w:.2f}" for w in p["work_ms"]) + " |")
    lines.append(f"| all layers | {sum(p['ms'] for p in phases):.2f} |" + " |" * threads)
    return lines


def run(args) -> int:
    from edge_runtime.model.loader import fp32_folder  # start-up time: imports torch

    batches = parse_int_list(args.batch, "--batch")
    check_min(args, steps=3, prompt_tokens=1, profile=0, recent_window=0)
    check_pool(max(batches), args.prompt_tokens + args.steps + 8)
    check_context(args.model, args.prompt_tokens + args.steps + 8,
                  "--prompt-tokens + --steps + 8 spare tokens")
    if args.recent_window:
        check_context(args.model, args.recent_window, "--recent-window")
    if args.decoder_phases and _phase_times(1) is None:
        raise InputError("--decoder-phases needs the CPU kernels built with per-phase timers: run "
                         "with EDGE_RUNTIME_CPU_PHASE_TIMES=1 (they build once into their own cache "
                         "entry; without a C compiler there is no C decode step to time)")
    set_threads(args.threads)
    print(f"[bench step] loading {args.model}...", file=sys.stderr, flush=True)
    loaded = load(args.model, None if args.weights == "float" else args.weights, args.device,
                  args.backend)
    engine = build_engine(loaded, "edge", kv_dtype=args.kv_dtype, max_batch=max(batches),
                          max_tokens=args.prompt_tokens + args.steps + 8,
                          recent_window=args.recent_window)
    hf_folder = fp32_folder(args.model)
    rng = random.Random(args.seed)
    profiler = cProfile.Profile() if args.profile else None
    probe = BandwidthProbe(size_mib=256) if args.decoder_phases else None
    rows = []
    for b in batches:
        print(f"[bench step] batch {b}...", file=sys.stderr, flush=True)
        before = probe.measure(repeats=3) if probe else None
        rows.append(measure(engine, loaded, hf_folder, b, args.prompt_tokens, args.steps, rng, profiler,
                            args.decoder_phases))
        if probe:  # which bandwidth the phases saw (a VM's two modes: docs/perf.md, "Machines")
            after = probe.measure(repeats=3)
            rows[-1]["read_gbps_around"] = [before.read_gbps, after.read_gbps]
    print(markdown_table(rows, COLUMNS))
    for row in rows:
        if "decoder_phases" in row:
            print("\n" + "\n".join(phase_lines(row)))
        elif args.decoder_phases:
            print(f"\nbatch {row['batch']}: the one-call C decoder did not run (another decode path)")
    if profiler:
        buf = io.StringIO()
        pstats.Stats(profiler, stream=buf).sort_stats("tottime").print_stats(args.profile)
        print(buf.getvalue())
    if args.json:
        write_json(args.json, {"bench": "step", "model": args.model, "rows": rows,
                               "backend": engine.backend.describe()})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("step", help="engine decode step vs transformers forward, interleaved")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--batch", default="1,5")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--weights", default="float", choices=["float", "gguf", "fp32", "fp16", "bf16"],
                   help="weight form: float (the default: float weights in the back end's dtype, "
                        "the reference path), gguf (a GGUF's own 4-bit blocks), or that float dtype")
    p.add_argument("--kv-dtype", default="int8", choices=["int8", "fp16", "fp32"])
    p.add_argument("--recent-window", type=int, default=None, metavar="W",
                   help="int8 KV: positions per sequence read exact (default: the engine's; 0: off)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="print the N most expensive functions of the engine steps (cProfile)")
    p.add_argument("--decoder-phases", action="store_true",
                   help="split the C decoder layers into phases, per thread (needs "
                        "EDGE_RUNTIME_CPU_PHASE_TIMES=1)")
    p.add_argument("--json")
    add_placement_arguments(p)
    p.set_defaults(func=run)
