"""`edge-runtime bench linear-rows`: where the fp32 linear should leave the C kernel for BLAS.

One linear (default 576 x 3,072, SmolLM2's hidden size and fused gate/up), ms per call by rows:
the C blocked kernel (kernels/csrc/linear_f32.c, what `PackedLinear` runs below GEMM_MIN_ROWS)
against one batched matmul over the same blocked weights (what it runs from GEMM_MIN_ROWS on).
The weights are cold, as a model's linears are between layers: `--copies` packed copies are
called in turn. Best of `--repeat` passes; both sides run in the same pass, so drift hits both.
"""
from __future__ import annotations

import sys
import time

from edge_runtime.bench.checks import check_min, parse_int_list
from edge_runtime.bench.engine_bench import set_threads
from edge_runtime.bench.report import Column, markdown_table, write_json
from edge_runtime.errors import InputError
from edge_runtime.kernels import cpu_native

COLUMNS = [Column("rows", "rows"), Column("c_ms", "C kernel ms", "{:.3f}"),
           Column("matmul_ms", "batched matmul ms", "{:.3f}"),
           Column("ratio", "C / matmul", "{:.2f}")]


def _packed_copies(k: int, n: int, copies: int) -> list:
    import torch
    from torch import nn

    from edge_runtime.kernels.cpu_linear import PackedLinear  # start-up time: imports torch

    torch.manual_seed(0)
    return [PackedLinear([nn.Linear(k, n, bias=False)], kind="c-blocked") for _ in range(copies)]


def _best_ms(call, linears: list, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        for linear in linears:
            call(linear)
        best = min(best, (time.perf_counter() - t0) / len(linears))
    return best * 1e3


def measure(rows_list: list[int], k: int, n: int, copies: int, repeat: int) -> list[dict]:
    import torch

    linears = _packed_copies(k, n, copies)
    results = []
    with torch.inference_mode():
        for rows in rows_list:
            x = torch.randn(rows, k)
            c_ms = _best_ms(lambda p: p.c_kernel(x), linears, repeat)  # whatever the row count
            matmul_ms = _best_ms(lambda p: torch.matmul(x, p.packed), linears, repeat)
            results.append({"rows": rows, "c_ms": c_ms, "matmul_ms": matmul_ms,
                            "ratio": c_ms / matmul_ms})
    return results


def run(args) -> int:
    rows_list = parse_int_list(args.rows, "--rows")
    check_min(args, k=1, n=1, copies=1, repeat=1)

    if cpu_native.library() is None:
        raise InputError("bench linear-rows times the C kernel, which is not built here: install "
                         "a C compiler (tools/bootstrap.sh installs gcc)")
    set_threads(args.threads)
    print(f"[bench linear-rows] {args.k} x {args.n}, {args.copies} copies, rows {rows_list}",
          file=sys.stderr)
    results = measure(rows_list, args.k, args.n, args.copies, args.repeat)
    print(f"one {args.k} x {args.n} fp32 linear, weights cold ({args.copies} copies), best of "
          f"{args.repeat}")
    print(markdown_table(results, COLUMNS))
    if args.json:
        write_json(args.json, {"bench": "linear-rows", "k": args.k, "n": args.n,
                               "copies": args.copies, "repeat": args.repeat, "rows": results})
    return 0


def register_subcommand(subparsers) -> None:
    p = subparsers.add_parser("linear-rows", help="one fp32 linear by rows: C kernel vs BLAS matmul")
    p.add_argument("--rows", default="4,8,12,16,24,32,48")
    p.add_argument("--k", type=int, default=576, help="input features (SmolLM2's hidden size)")
    p.add_argument("--n", type=int, default=3072, help="output features (its fused gate/up)")
    p.add_argument("--copies", type=int, default=40, help="packed copies called in turn")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json")
    p.set_defaults(func=run)
