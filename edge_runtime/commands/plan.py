"""`edge-runtime plan --config C [--model M] [--json]`: the memory plan a budget gives a model.

A reference shape name (`llama-2-7b-awq`, see edge_runtime.plan.REFERENCE_MODELS) needs no
weights: its weight bytes are estimated from the shape. Any other name or path is resolved by the
model loader; only config.json and the safetensors headers are read (no weights are loaded).
It also derives the service unit's MemoryHigh=/MemoryMax= and refuses limits that disagree with
the guard's thresholds (edge_runtime/service/unit_limits.py); --memory-high/--memory-max check
hand-set values instead.
"""

from __future__ import annotations

import json
import sys

from edge_runtime.plan import (REFERENCE_MODELS, check_page_size, gguf_blocks_served, make_plan,
                               model_for_plan)
from edge_runtime.model.weights_option import add_weights_option
from edge_runtime.budget import load_budget
from edge_runtime.engine.placement import model_weights, resolve
from edge_runtime.guard_config import GuardConfig
from edge_runtime.service.unit_limits import (check_unit_limits, parse_systemd_size, planned_total,
                                              unit_memory_limits)


def register(subparsers) -> None:
    p = subparsers.add_parser("plan", help="memory plan: weights, KV bytes/token, pages, streams",
                              description=__doc__.splitlines()[0])
    p.add_argument("--config", required=True, help="budget name (cpu-dev, agx-orin-64gb...) or YAML")
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="model name/path, or a reference shape such as llama-2-7b-awq")
    p.add_argument("--kv-dtype", choices=["int8", "fp16", "fp32"], help="override kv.dtype")
    p.add_argument("--page-tokens", type=int, help="override kv.page_tokens")
    p.add_argument("--memory-high", help="check this unit MemoryHigh= (e.g. 12G) against the guard")
    p.add_argument("--memory-max", help="check this unit MemoryMax= (e.g. 13G) against the guard")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--device", default="auto",
                   help="the device the plan is for: auto (the budget's device:, else cuda when "
                        "torch sees one, else cpu), cpu, cuda or cuda:N; planning needs no GPU")
    p.add_argument("--backend", choices=("cpu", "cuda"), default=None,
                   help="the back end (default: the device's); it decides the weight dtype: the "
                        "budget's weight_dtype on CUDA, fp32 on the CPU back end")
    add_weights_option(p)
    p.set_defaults(func=run)


def unit_limits_for(budget, plan, memory_high=None, memory_max=None) -> dict:
    """The unit's MemoryHigh/MemoryMax (derived, or the given ones) after the guard check."""
    guard = GuardConfig.from_dict(dict(budget.guard))
    high, hard = unit_memory_limits(budget, plan, guard)
    if memory_high:
        high = parse_systemd_size(memory_high, budget.device_memory, "--memory-high")
    if memory_max:
        hard = parse_systemd_size(memory_max, budget.device_memory, "--memory-max")
    planned = planned_total(budget, plan)
    check_unit_limits(high, hard, planned, guard)
    return {"planned_total_bytes": planned, "memory_high_bytes": high, "memory_max_bytes": hard,
            "guard_high_band": [guard.high_used_fraction - guard.hysteresis,
                                guard.critical_used_fraction], "guard_enabled": guard.enabled}


def format_unit_limits(u: dict) -> str:
    mib, high, hard = 2**20, u["memory_high_bytes"], u["memory_max_bytes"]
    lo, crit = u["guard_high_band"]
    of_high = f" = {u['planned_total_bytes'] / high:.1%} of MemoryHigh" if high else ""
    ratio = f" ({high / hard:.1%})" if high and hard else ""
    rows = [("planned total (service unit)", f"{u['planned_total_bytes'] / mib:,.0f} MiB{of_high}"),
            ("unit MemoryHigh / MemoryMax",
             f"{'infinity' if high is None else f'{high / mib:,.0f} MiB'} / "
             f"{'infinity' if hard is None else f'{hard / mib:,.0f} MiB'}{ratio}"),
            ("guard high band (of the tightest limit)", f"[{lo:.1%}, {crit:.1%}): checked, agrees"
             if u["guard_enabled"] else "guard disabled: nothing to check")]
    return "\n".join(f"{k:<48}  {v}" for k, v in rows)


def format_plan(plan, placement, weights_form: str | None = None) -> str:
    """weights_form: what the weight bytes are (default: the placement's weight dtype)."""
    mib = 2**20
    rows = [
        ("budget / model", f"{plan.budget_name} / {plan.model_name}"),
        ("device / back end", f"{placement.device} / {placement.backend}"),
        ("device memory", f"{plan.device_memory / mib:,.0f} MiB"),
        ("reserved (os + other + activations)", f"{plan.reserved / mib:,.0f} MiB"),
        (f"weights ({weights_form or placement.weight_dtype})", f"{plan.weight_bytes / mib:,.1f} MiB ({plan.weight_bytes:,} bytes)"),
        (f"KV bytes per token ({plan.kv_dtype})", f"{plan.kv_bytes_per_token:,}"),
        (f"bytes per page ({plan.page_tokens} tokens)", f"{plan.bytes_per_page:,}"),
        (f"inline arena ({plan.inline_slots} x {plan.inline_tokens} tokens)",
         f"{plan.inline_arena_bytes / mib:,.1f} MiB"),
        (f"recent-key windows ({plan.recent_window} tokens, 2 per sequence)",
         f"{plan.recent_window_bytes / mib:,.2f} MiB"),
        ("page pool", f"{plan.pool_bytes / mib:,.1f} MiB"),
        ("pages", f"{plan.num_pages:,}"),
        ("pool tokens", f"{plan.pool_tokens:,}"),
        (f"streams of {plan.stream_context_tokens} tokens that fit (nothing shared)",
         f"{plan.streams_that_fit:,}"),
        ("max concurrent sequences (budget)", f"{plan.max_concurrent_sequences}"),
    ]
    groups = plan.layer_groups
    if groups:  # layer groups (docs/pool.md): what the pool holds, measured by `bench kv-groups`
        rows += [
            (f"KV bytes per token: {groups['global_layers']} global / {groups['local_layers']} "
             f"local layers (window {groups['window']})",
             f"{groups['global_bytes_per_token']:,} / {groups['local_bytes_per_token']:,}"),
            (f"one {groups['context_tokens']}-token stream: every layer / with layer groups "
             "(predicted)",
             f"{groups['stream_bytes_all_layers'] / mib:,.1f} / "
             f"{groups['stream_bytes_grouped'] / mib:,.1f} MiB (ratio {groups['ratio']:.2f})"),
            (f"streams of {plan.stream_context_tokens} tokens with layer groups (predicted)",
             f"{groups['streams_that_fit_grouped']:,}"),
        ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def run(args) -> int:
    budget = load_budget(args.config)
    if args.page_tokens is not None:  # 0 too: it is not "absent"
        check_page_size(budget, args.page_tokens, args.kv_dtype or budget.kv_dtype,
                        "--page-tokens")

    placement = resolve(args.device, args.backend, budget, need_device=False)
    weights = model_weights(placement, args.weights)
    print(f"reading model {args.model} ...", file=sys.stderr)
    config, weight_bytes, name = model_for_plan(args.model, placement.weight_dtype, weights,
                                                placement.device)
    plan = make_plan(budget, config, weight_bytes, args.kv_dtype, args.page_tokens, name)
    unit = unit_limits_for(budget, plan, args.memory_high, args.memory_max)
    backend = describe_backend(placement)
    form = weights_form(args.model, weights, placement)
    tensors = gguf_tensor_kernels(args.model, placement) if form else []
    if args.json:
        print(json.dumps({**plan.as_dict(), **placement.describe(), "unit_limits": unit,
                          "kernel_backends": backend, "gguf_tensors": tensors}, indent=2))
    else:
        print(format_plan(plan, placement, form))
        print(format_unit_limits(unit))
        print(f"kernels of the {backend['backend']} back end: "
              + ", ".join(f"{op}={b}" for op, b in backend["kernels"].items()))
        if tensors:
            print(format_tensor_kernels(tensors))
    return 0


def gguf_tensor_kernels(name: str, placement) -> list[dict]:
    """Per tensor of a GGUF served from its blocks: type, runtime form, kernel (model/gguf_int4.py)."""
    from edge_runtime.model.gguf_int4 import tensor_kernels  # start-up time: imports numpy, torch
    from edge_runtime.model.loader import gguf_source  # start-up time: imports numpy, torch

    return tensor_kernels(gguf_source(name), placement.backend)


def format_tensor_kernels(tensors: list[dict]) -> str:
    """One line per (type, form, kernel): how many tensors, and the first one's name."""
    from collections import Counter

    groups = Counter((t["type"], t["form"], t["kernel"]) for t in tensors)
    first = {}
    for t in tensors:
        first.setdefault((t["type"], t["form"], t["kernel"]), t["tensor"])
    lines = ["GGUF tensors (type: count, held as -> kernel; --json lists every tensor):"]
    for (kind, form, kernel), count in groups.items():
        lines.append(f"  {kind}: {count} (e.g. {first[(kind, form, kernel)]}), {form} -> {kernel}")
    return "\n".join(lines)


def weights_form(name: str, weights: str, placement) -> str | None:
    """"gguf blocks" when the plan counts a GGUF's own blocks, else None (the weight dtype)."""
    if name in REFERENCE_MODELS:
        return None
    from edge_runtime.model.loader import gguf_source  # start-up time: imports numpy, torch

    served = gguf_blocks_served(gguf_source(name), weights, placement.weight_dtype, placement.device)
    return "gguf blocks" if served else None


def describe_backend(placement) -> dict:
    """The back end the plan is for and every kernel it runs (engine/backend.py); built without
    checking that its device exists here."""
    import torch

    # start-up time: imports numpy, torch
    from edge_runtime.engine.backend import CpuBackend, CudaBackend

    cls = CpuBackend if placement.backend == "cpu" else CudaBackend
    return cls(torch.device(placement.device)).describe()
