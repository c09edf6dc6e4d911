"""Where the fp32 linear should leave the C kernel for BLAS: ms per call of one linear, by rows.

Compares kernels/csrc/linear_f32.c (the C kernel `PackedLinear` runs below GEMM_MIN_ROWS) with
one batched matmul over the same blocked weights (what it runs from GEMM_MIN_ROWS on), with the
weights cold: `--copies` packed copies of the linear are called in turn so that they do not stay
in the caches, as a model's linears do not between layers. Best of 3 passes.

    python tools/linear_rows_probe.py --rows 4,8,12,16,24,32,48 [--k 576 --n 3072 --copies 40]
"""
import argparse
import time

import torch
from torch import nn

from edge_runtime.kernels.cpu_linear import PackedLinear


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="4,8,12,16,24,32,48")
    ap.add_argument("--k", type=int, default=576, help="input features (SmolLM2's hidden size)")
    ap.add_argument("--n", type=int, default=3072, help="output features (its fused gate/up)")
    ap.add_argument("--copies", type=int, default=40)
    args = ap.parse_args()
    torch.manual_seed(0)
    linears = [PackedLinear([nn.Linear(args.k, args.n, bias=False)], kind="c-blocked")
               for _ in range(args.copies)]
    print("| rows | C kernel ms | batched matmul ms |\n|---:|---:|---:|")
    for m in (int(r) for r in args.rows.split(",")):
        x = torch.randn(m, args.k)
        times = []
        for call in (lambda p: p.c_kernel(x),  # the C kernel whatever the row count
                     lambda p: torch.matmul(x, p.packed)):
            best = float("inf")
            for _ in range(3):
                t = time.perf_counter()
                for p in linears:
                    call(p)
                best = min(best, (time.perf_counter() - t) / len(linears))
            times.append(best * 1e3)
        print(f"| {m} | {times[0]:.3f} | {times[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
