"""Logits of the CUDA back end vs the CPU back end on one model, position by position.

    TRITON_INTERPRET=1 python tools/backend_agreement.py --tiny-awq [--json OUT]   # CI's CPU
    python tools/backend_agreement.py --model DIR --device cuda [--json OUT]      # a GPU

Scores `--tokens` random ids through each back end's engine (`Engine.scorer().logits`,
engine/scoring.py, chunks of `--chunk` tokens, prefix cache and inline slots off) and prints max
and mean |difference|, the max |logit| and how often the argmax agrees. `--tiny-awq` uses the tiny random Llama and its RTN
int4 checkpoint (tools/lab/tiny_checkpoints.py, what tests/test_engine_backends.py checks). The CUDA
back end on --device cpu runs the Triton kernels in the interpreter (TRITON_INTERPRET=1).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (no effect on a GPU run)
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/, when loaded by path: lab/

import torch  # noqa: E402

from edge_runtime.engine.config import EngineConfig  # noqa: E402
from edge_runtime.engine.engine import Engine  # noqa: E402
from edge_runtime.engine.placement import load_for, resolve  # noqa: E402
from lab.random_models import random_ids  # noqa: E402
from lab.tiny_checkpoints import tiny_awq_folder  # noqa: E402


def logits_on(model: str, device: str, backend: str, ids: list[int], chunk: int) -> torch.Tensor:
    placement = resolve(device, backend, weight_dtype="fp32")
    loaded = load_for(model, placement, progress=lambda msg: None)
    engine = Engine(loaded, EngineConfig(page_tokens=64, num_pages=8, enable_prefix_cache=False,
                                         enable_inline=False, max_batch_tokens=chunk,
                                         **placement.engine_settings()))
    return torch.cat([part for _, part in engine.scorer().logits(ids)])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="model folder (or name)")
    ap.add_argument("--tiny-awq", action="store_true", help="the tests' tiny RTN int4 Llama")
    ap.add_argument("--device", default="cpu", help="device of the CUDA back end (cpu: interpreter)")
    ap.add_argument("--tokens", type=int, default=80)
    ap.add_argument("--chunk", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.tiny_awq:
        model, ids = str(tiny_awq_folder()), random_ids(args.tokens, 500, seed=50)
    elif args.model:
        model, ids = args.model, random_ids(args.tokens, 500, seed=50)
    else:
        ap.error("give --model DIR or --tiny-awq")
    cpu = logits_on(model, "cpu", "cpu", ids, args.chunk)
    cuda = logits_on(model, args.device, "cuda", ids, args.chunk).cpu()
    diff = (cuda - cpu).abs()
    row = {"model": model, "positions": cpu.shape[0], "max_abs_diff": float(diff.max()),
           "mean_abs_diff": float(diff.mean()), "max_abs_logit": float(cpu.abs().max()),
           "relative_max_diff": float(diff.max() / cpu.abs().max()),
           "argmax_agreement": float((cuda.argmax(-1) == cpu.argmax(-1)).float().mean()),
           "cuda_device": args.device}
    print("| positions | max abs diff | mean abs diff | max abs logit | relative | argmax agree |")
    print("|---:|---:|---:|---:|---:|---:|")
    print(f"| {row['positions']} | {row['max_abs_diff']:.4f} | {row['mean_abs_diff']:.4f} | "
          f"{row['max_abs_logit']:.3f} | {100 * row['relative_max_diff']:.2f}% | "
          f"{100 * row['argmax_agreement']:.2f}% |")
    if args.json:
        Path(args.json).write_text(json.dumps(row, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
