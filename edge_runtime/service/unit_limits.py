"""MemoryHigh= / MemoryMax= for edge-runtime.service, derived from the budget's memory plan.

  planned    = weights + KV page pool + inline arena + the budget's activation_reserve
  MemoryHigh = planned + RUNTIME_OVERHEAD (an allowance for Python, torch, the tokenizer and
               aiohttp; see docs/service.md for the measured RSS)
  MemoryMax  = MemoryHigh * 1.15 + 256 MiB (allocator slack; beyond it the kernel OOM-kills us)

Reads only config.json and safetensors headers (edge-runtime plan's path): no weights are loaded.
Used by tools/install-service.sh:  python -m edge_runtime.service.unit_limits --config C [--model M]
"""

from __future__ import annotations

import argparse
import sys

MIB = 1 << 20
RUNTIME_OVERHEAD = 512 * MIB  # measured: 460 MiB RSS beyond weights + KV (docs/service.md)


def unit_memory_limits(budget, plan) -> tuple[int, int]:
    planned = plan.weight_bytes + plan.pool_bytes + plan.inline_arena_bytes \
        + plan.recent_window_bytes + budget.activation_reserve
    high = planned + RUNTIME_OVERHEAD
    return high, int(high * 1.15) + 256 * MIB


def main(argv: list[str] | None = None) -> int:
    from edge_runtime.budget import load_budget
    from edge_runtime.commands.plan import model_for_plan
    from edge_runtime.errors import EdgeError
    from edge_runtime.plan import make_plan

    p = argparse.ArgumentParser(prog="python -m edge_runtime.service.unit_limits")
    p.add_argument("--config", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct")
    args = p.parse_args(argv)
    try:
        budget = load_budget(args.config)
        config, weight_bytes, name = model_for_plan(args.model, budget.weight_dtype)
        plan = make_plan(budget, config, weight_bytes, model_name=name)
    except EdgeError as exc:
        print(f"unit_limits: error: {exc}", file=sys.stderr)
        return 2
    high, hard = unit_memory_limits(budget, plan)
    print(high, hard)
    return 0


if __name__ == "__main__":
    sys.exit(main())
