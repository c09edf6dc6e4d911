"""Build what the server needs from the command line: model, engine, async engine, guard.

Runs in a worker thread during start-up (server.Server._load). The engine's page pool is sized
from the budget's memory plan (engine/config.py `budget_engine_config`), and
its concurrency from `service.max_concurrent_sequences`. `check_budget` refuses a budget that
cannot fit one KV page before any weights are read.
"""

from __future__ import annotations

import logging

from edge_runtime.errors import ConfigError
from edge_runtime.guard_config import GuardConfig
from edge_runtime.service_limits import ServiceLimits
from edge_runtime.service.server import Loaded
from edge_runtime.budget import load_budget
from edge_runtime.engine.placement import load_for, resolve
from edge_runtime.guard.engine_hooks import EngineGuardHooks
from edge_runtime.guard.guard import MemoryGuard
from edge_runtime.guard.telemetry import open_source
from edge_runtime.plan import make_plan

log = logging.getLogger(__name__)


def engine_config(budget, limits: ServiceLimits, loaded, placement, runtime_bytes: int = 0):
    """budget: the loaded Budget, or None without --config. runtime_bytes: the CUDA context and
    workspace measured at start-up (engine/cuda_memory.py)."""
    # start-up time: imports torch
    from edge_runtime.engine.config import EngineConfig, budget_engine_config

    overrides = dict(max_num_seqs=limits.max_concurrent_sequences, **placement.engine_settings())
    if budget is None:
        return EngineConfig(**overrides)
    config, plan = budget_engine_config(budget, loaded, overrides, runtime_bytes=runtime_bytes)
    _check_free_memory(plan, str(loaded.model.device))
    return config


def check_graph_memory(engine, budget) -> None:
    """The decode graphs' memory (captured at start on a GPU, engine/cuda_graphs.py) is counted in
    the budget's activation_reserve: the activations, logits and sampler buffers a decode step
    needs are what a graph's memory pool holds. Log what capture took, and refuse to start when it
    exceeds that reserve, with the numbers and what to change. budget: the loaded Budget, or None
    without --config (nothing to count against)."""
    graphs = engine.stats().get("decode_graphs") or {}
    taken = int(graphs.get("capture_bytes") or 0)
    if not taken:
        return
    log.info("CUDA graphs: %d buckets captured in %.1f s, %.0f MiB (counted in activation_reserve)",
             len(graphs.get("captured", [])), graphs.get("capture_s", 0.0), taken / 2**20)
    if budget is None:
        return
    reserve = budget.activation_reserve
    if taken > reserve:
        raise ConfigError(
            f"{budget.source}: the decode graphs captured at start took {taken / 2**20:.0f} MiB, "
            f"more than activation_reserve ({reserve / 2**20:.0f} MiB), which counts them: raise "
            f"activation_reserve to at least {-(-taken // 2**20)} MiB")


def _check_free_memory(plan, device: str) -> None:
    """On CUDA: say so when the pool about to be allocated exceeds what is free now (MemAvailable
    on unified memory); the allocation may still succeed as the kernel reclaims caches."""
    from edge_runtime.engine.cuda_memory import free_bytes  # start-up time: imports torch

    free = free_bytes(device)
    if free is not None and plan.pool_bytes > free:
        log.warning("the budget's KV pool (%.0f MiB) exceeds the memory free now (%.0f MiB); lower "
                    "device_memory or kv.max_pool_bytes if the allocation fails",
                    plan.pool_bytes / 2**20, free / 2**20)


def check_budget(model_name: str, budget) -> None:
    """Refuse a budget (a loaded Budget, or None without --config) whose plan fails even before
    the weights count (a pool cap below one page, recent-key windows that fill the device...),
    reading only the model's config.json: serve can run this before it listens, and load_all runs
    it before the weights load."""
    if budget is None:
        return
    # start-up time: imports torch
    from edge_runtime.model.loader import read_model_config, resolve_model_folder

    folder = resolve_model_folder(model_name)
    config = read_model_config(folder)
    make_plan(budget, config, None, model_name=folder.name)


def load_all(model_name: str, config_path: str | None, limits: ServiceLimits,
             guard_config: GuardConfig, device: str = "auto", backend: str | None = None,
             weights: str = "auto") -> Loaded:
    """The budget YAML is read once here; everything after takes the loaded Budget. Device, back
    end and weight dtype (engine/placement.py): `--device auto` takes the budget's `device:`, else
    CUDA where torch sees one, else the CPU."""
    from edge_runtime.engine.async_engine import AsyncEngine  # start-up time: imports numpy, torch
    from edge_runtime.engine.engine import Engine  # start-up time: imports numpy, torch

    budget = load_budget(config_path) if config_path else None
    check_budget(model_name, budget)
    placement = resolve(device, backend, budget)
    log.info("model %s on the %s back end, device %s, %s weights", model_name, placement.backend,
             placement.device, placement.weight_dtype)
    from edge_runtime.engine.cuda_memory import runtime_overhead  # start-up time: imports torch

    runtime_bytes = runtime_overhead(placement.device)  # before the weights: context + workspace
    if runtime_bytes:
        log.info("CUDA context and workspace: %.0f MiB (counted in the budget)", runtime_bytes / 2**20)
    loaded = load_for(model_name, placement, weights=weights)
    engine = Engine(loaded, engine_config(budget, limits, loaded, placement, runtime_bytes))
    check_graph_memory(engine, budget)
    aengine = AsyncEngine(engine)
    guard = None
    if guard_config.enabled:
        guard = MemoryGuard(guard_config, open_source(), EngineGuardHooks(engine))
    return Loaded(loaded, engine, aengine, engine.backend.describe(), guard)
