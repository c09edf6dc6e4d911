"""MemoryHigh= / MemoryMax= for edge-runtime.service, derived from the budget's memory plan and
its guard thresholds, and the check that limits and thresholds agree (`edge-runtime plan`).

  planned    = weights + KV page pool + inline arena + recent-key windows + activation_reserve
               + RUNTIME_OVERHEAD (Python, torch, the tokenizer, aiohttp; docs/service.md)
  MemoryHigh = planned / (high_used_fraction - 2 * hysteresis): at its planned load the service
               reads below the guard's high band against MemoryHigh, the tightest limit the guard
               sees on cgroup v2 (guard/cgroup_memory.py)
  MemoryMax  = MemoryHigh / critical_used_fraction: a guard that sees only MemoryMax (cgroup v1
               has no memory.high) is critical before usage reaches MemoryHigh; capped at the
               device's memory (a limit above it could never act), never below MemoryHigh

The check refuses, with the numbers, (a) a MemoryHigh inside the guard's high band of MemoryMax,
[high - hysteresis, critical): the kernel's reclaim holds memory.current at MemoryHigh, which
would read as high all the time; (b) a planned total at or above the band's lower edge of
MemoryHigh: the guard would act at the planned load; (c) MemoryHigh above MemoryMax.
With the guard disabled there is nothing to agree with: no check.

Reads only config.json and safetensors headers (edge-runtime plan's path): no weights are loaded.
Used by tools/install-service.sh:
  python -P -m edge_runtime.service.unit_limits --config C [--model M] [--memory-high H] [--memory-max M]
prints "HIGH MAX" in bytes (the given ones after the check, else the derived ones). With both
given and --no-plan, only (a) and (c) are checked: the model is not read.
"""

from __future__ import annotations

import argparse
import math
import re
import sys

from edge_runtime.errors import ConfigError, EdgeError
from edge_runtime.budget import load_budget
from edge_runtime.engine.placement import resolve
from edge_runtime.guard_config import GuardConfig
from edge_runtime.model.weights_option import add_weights_option
from edge_runtime.plan import make_plan, model_for_plan

MIB = 1 << 20
GIB = 1 << 30
RUNTIME_OVERHEAD = 512 * MIB  # measured: 460 MiB RSS beyond weights + KV (docs/service.md)
_SYSTEMD_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def planned_total(budget, plan) -> int:
    return (plan.weight_bytes + plan.pool_bytes + plan.inline_arena_bytes
            + plan.recent_window_bytes + budget.activation_reserve + RUNTIME_OVERHEAD)


def planned_fraction(guard) -> float:
    """Where the planned total sits on MemoryHigh: two hystereses (at least 0.02) below high."""
    return guard.high_used_fraction - max(2 * guard.hysteresis, 0.02)


def unit_memory_limits(budget, plan, guard) -> tuple[int, int]:
    high = math.ceil(planned_total(budget, plan) / planned_fraction(guard))
    hard = min(math.floor(high / guard.critical_used_fraction), budget.device_memory)
    return high, max(high, hard)


def check_unit_limits(high: int | None, hard: int | None, planned: int, guard) -> None:
    """ConfigError naming the numbers if the unit's limits and the guard's thresholds disagree.
    None: no limit (infinity)."""
    if not guard.enabled:
        return
    band_lo, critical = guard.high_used_fraction - guard.hysteresis, guard.critical_used_fraction
    band = f"the memory guard's high band [{band_lo:.1%}, {critical:.1%})"
    if high is not None and hard is not None:
        if high > hard:
            raise ConfigError(f"MemoryHigh {_gib(high)} is above MemoryMax {_gib(hard)}; "
                              "MemoryHigh must be at most MemoryMax")
        if band_lo <= high / hard < critical:
            raise ConfigError(
                f"MemoryHigh {_gib(high)} is {high / hard:.1%} of MemoryMax {_gib(hard)}, inside "
                f"{band}: the kernel's reclaim holds memory.current near MemoryHigh, which reads "
                f"as high against MemoryMax all the time; set MemoryMax to at most "
                f"{_gib(math.floor(high / critical))} or above {_gib(math.ceil(high / band_lo))}")
    if high is not None and planned / high >= band_lo:
        raise ConfigError(
            f"the planned total {_gib(planned)} (weights + KV pool + arenas + activation_reserve "
            f"+ {RUNTIME_OVERHEAD // MIB} MiB runtime) is {planned / high:.1%} of MemoryHigh "
            f"{_gib(high)}, inside {band}: the guard would act at the planned load; raise "
            f"MemoryHigh to at least {_gib(math.ceil(planned / band_lo))} or shrink the plan")


def parse_systemd_size(text: str, device_memory: int, where: str) -> int | None:
    """A MemoryHigh=/MemoryMax= value: bytes with K/M/G/T (base 1024), a percentage of the
    device's memory, or infinity (None)."""
    value = text.strip()
    if value == "infinity":
        return None
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)%", value)
    if m:
        return int(device_memory * float(m.group(1)) / 100)
    m = re.fullmatch(r"([0-9]+)([KMGT]?)", value)
    if not m:
        raise ConfigError(f"{where} {value!r}: give bytes with an optional K/M/G/T, a percentage "
                          "or infinity")
    return int(m.group(1)) * _SYSTEMD_UNITS[m.group(2)]


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -P -m edge_runtime.service.unit_limits")
    p.add_argument("--config", required=True)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--memory-high", help="check this MemoryHigh= instead of deriving it")
    p.add_argument("--memory-max", help="check this MemoryMax= instead of deriving it")
    add_weights_option(p)
    p.add_argument("--no-plan", action="store_true",
                   help="with both limits given: check them against the guard without the model")
    args = p.parse_args(argv)
    given = [args.memory_high, args.memory_max]
    try:
        budget = load_budget(args.config)
        guard = GuardConfig.from_dict(dict(budget.guard))
        high = hard = None
        planned = 0  # --no-plan: nothing planned to compare with MemoryHigh
        if not (args.no_plan and all(given)):
            placement = resolve("auto", None, budget, need_device=False)  # the budget's device:
            config, weight_bytes, name = model_for_plan(args.model, placement.weight_dtype,
                                                        args.weights, placement.device)
            plan = make_plan(budget, config, weight_bytes, model_name=name)
            high, hard = unit_memory_limits(budget, plan, guard)
            planned = planned_total(budget, plan)
        if args.memory_high:
            high = parse_systemd_size(args.memory_high, budget.device_memory, "--memory-high")
        if args.memory_max:
            hard = parse_systemd_size(args.memory_max, budget.device_memory, "--memory-max")
        check_unit_limits(high, hard, planned, guard)
    except EdgeError as exc:
        print(f"unit_limits: error: {exc}", file=sys.stderr)
        return 2
    print(given[0] or high, given[1] or hard)
    return 0


if __name__ == "__main__":
    sys.exit(main())
