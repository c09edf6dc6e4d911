"""`edge-runtime bench linear`: the model's fp32 linears alone, MKL's F.linear vs the packed backends.

Runs every linear of one decode step (per layer q, k, v, o, gate, up, down, then the LM head) back
to back on `rows` input rows, with the model's real weights: once as loaded (F.linear, the dense
weights) and once per packed backend that exists here (kernels/cpu_linear.py: oneDNN reordered,
the C blocked kernel), fused as the engine runs them (q/k/v and gate/up in one call). Reports the
best of `--repeat` passes (after a warm-up) as ms per pass and weight GB/s (weight bytes / time) next
to the machine's read bandwidth: how close the weight-bound part of decode is to its limit.
A GGUF model adds a row for its own quantized blocks (kernels/cpu_int4.py, linear_int4.c), held as
the CPU back end holds them (in a huge-page arena); its GB/s counts the bytes it reads (integers,
scales, offsets), its ms per pass compares with the fp32 rows directly.
"""
from __future__ import annotations

import sys
import time

from edge_runtime.bench.checks import check_bandwidth_mib, check_min, parse_int_list
from edge_runtime.bench.engine_bench import set_threads
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.bench.bandwidth import measure_bandwidth
from edge_runtime.kernels import cpu_native

COLUMNS = [Column("backend", "backend"), Column("rows", "rows"),
           Column("ms", "ms per pass", "{:.2f}"), Column("gbps", "weight GB/s", "{:.1f}"),
           Column("pct_read", "% of read bandwidth", "{:.0f}%")]


def _dense_chain(model):
    out = []
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        out += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
    return out + [model.lm_head]


def _packed_chain(model, kind: str):
    """The engine's fused chain with `kind` weights, built from the dense modules (a copy), stored
    as model/linear_packing.py stores them."""
    from edge_runtime.kernels.cpu_linear import PackedLinear  # start-up time: imports torch
    # start-up time: imports numpy, torch
    from edge_runtime.model.linear_packing import blocked_arena, linear_groups

    groups = linear_groups(model)
    arena = blocked_arena(groups) if kind == "c-blocked" else None
    return [PackedLinear(parts, kind=kind, arena=arena) for _, _, parts in groups]


def quantized_chain(model_name: str) -> tuple[str, list]:
    """The QuantLinears of `model_name`'s GGUF blocks, prepared as the CPU back end prepares them
    (model/linear_packing.py), layer by layer then the head, and the file's quantization; ("", [])
    for a model that is not a GGUF or without the C kernels."""
    from edge_runtime.kernels.cpu_int4 import QuantLinear  # start-up time: imports numpy, torch
    # start-up time: imports numpy, torch
    from edge_runtime.model.linear_packing import pack_linears
    from edge_runtime.model.loader import gguf_source, load_model  # start-up time: imports torch

    if cpu_native.library() is None or gguf_source(model_name) is None:
        return "", []
    loaded = load_model(model_name, progress=None, weights="gguf")
    pack_linears(loaded.model)
    return loaded.quantization, [m for m in loaded.model.modules() if isinstance(m, QuantLinear)]


def _row(backend: str, rows: int, ms: float, weight_bytes: int, read_gbps: float) -> dict:
    gbps = weight_bytes / (ms / 1e3) / 1e9
    return {"backend": backend, "rows": rows, "ms": ms, "gbps": gbps,
            "pct_read": 100 * gbps / read_gbps}


def packed_kinds() -> list[str]:
    from edge_runtime.kernels import cpu_linear, cpu_native  # start-up time: imports torch

    kinds = ["onednn"] if cpu_linear.onednn_available() else []
    return kinds + (["c-blocked"] if cpu_native.library() is not None else [])


def _best_ms(chain, rows: int, repeat: int) -> float:
    import torch

    inputs = {m.in_features: torch.randn(rows, m.in_features) for m in chain}
    best = float("inf")
    with torch.inference_mode():
        for i in range(repeat + 1):
            t0 = time.perf_counter()
            for m in chain:
                m(inputs[m.in_features])
            if i:  # the first pass is the warm-up
                best = min(best, time.perf_counter() - t0)
    return best * 1e3


def run(args) -> int:
    from edge_runtime.model.loader import load_model  # start-up time: imports torch

    rows_list = parse_int_list(args.rows, "--rows")
    check_min(args, repeat=1)
    check_bandwidth_mib(args.bandwidth_mib)
    set_threads(args.threads)
    bw = measure_bandwidth(size_mib=args.bandwidth_mib)
    print(f"[bench linear] read {bw.read_gbps:.1f} GB/s; loading {args.model}...", file=sys.stderr)
    loaded = load_model(args.model, progress=None, weights="fp32")  # dense: this bench packs its own copies
    weight_bytes = sum(m.weight.numel() * 4 for m in _dense_chain(loaded.model))
    results = []
    kinds = packed_kinds()
    if len(kinds) < 2:
        print(f"[bench linear] packed backends here: {kinds or 'none'} (oneDNN needs torch's mkldnn "
              "ops, c-blocked a C compiler)", file=sys.stderr)
    for name in ["torch F.linear (MKL)"] + kinds:
        chain = _dense_chain(loaded.model) if name.startswith("torch") else _packed_chain(loaded.model, name)
        results += [_row(name, rows, _best_ms(chain, rows, args.repeat), weight_bytes,
                         bw.read_gbps) for rows in rows_list]
    quantization, quantized = quantized_chain(args.model)
    if quantized:
        quantized_bytes = sum(m.weight.nbytes for m in quantized)
        results += [_row(f"c-quantized ({quantization})", rows,
                         _best_ms(quantized, rows, args.repeat), quantized_bytes, bw.read_gbps)
                    for rows in rows_list]
    print(f"model {args.model}: {weight_bytes / 1e6:.0f} MB of fp32 linear weights per pass "
          f"(LM head included); read bandwidth {bw.read_gbps:.2f} GB/s, {bw.threads} threads")
    print(markdown_table(results, COLUMNS))
    if args.json:
        write_json(args.json, {"bench": "linear", "model": args.model, "bandwidth": bw.to_dict(),
                               "weight_bytes": weight_bytes, "rows": results})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("linear", help="one decode step's linears: F.linear vs oneDNN vs C blocked (fp32), and a GGUF's own blocks")
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--rows", default="1,2,5,16")
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--bandwidth-mib", type=int, default=512, help="size of the bandwidth test tensor")
    p.add_argument("--json")
    p.set_defaults(func=run)
