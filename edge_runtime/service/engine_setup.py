"""Build what the server needs from the command line: model, engine, async engine, guard.

Runs in a worker thread during start-up (server.Server._load). The engine's page pool is sized
from the budget's memory plan (edge_runtime.plan.make_plan -> EngineConfig.from_plan), and
its concurrency from `service.max_concurrent_sequences`. `check_budget` refuses a budget that
cannot fit one KV page before any weights are read.
"""

from __future__ import annotations

import logging

from edge_runtime.guard.config import GuardConfig
from edge_runtime.service.limits import ServiceLimits
from edge_runtime.service.server import Loaded

log = logging.getLogger(__name__)


def engine_config(config_path: str | None, limits: ServiceLimits, loaded, device: str):
    from edge_runtime.engine.config import EngineConfig

    overrides = dict(max_num_seqs=limits.max_concurrent_sequences, device=device)
    plan = _memory_plan(config_path, loaded)
    if plan is not None:
        return EngineConfig.from_plan(plan, **overrides)
    return EngineConfig(**overrides)


def _memory_plan(config: str | None, loaded):
    """The budget's memory plan for this model (page count, inline arena), or None."""
    if not config:
        return None
    from edge_runtime.budget import load_budget
    from edge_runtime.plan import make_plan

    return make_plan(load_budget(config), loaded.config, loaded.weight_bytes,
                     model_name=loaded.path.name)


def check_budget(model_name: str, config_path: str | None) -> None:
    """Refuse a budget whose plan fails even before the weights count (a pool cap below one page,
    recent-key windows that fill the device...), reading only the model's config.json: serve
    can run this before it listens, and load_all runs it before the weights load."""
    if not config_path:
        return
    from edge_runtime.budget import load_budget
    from edge_runtime.model.loader import read_model_config, resolve_model_folder
    from edge_runtime.plan import make_plan

    budget = load_budget(config_path)
    folder = resolve_model_folder(model_name)
    config = read_model_config(folder)
    make_plan(budget, config, None, model_name=folder.name)


def load_all(model_name: str, config_path: str | None, limits: ServiceLimits,
             guard_config: GuardConfig, device: str = "cpu", weights: str = "auto") -> Loaded:
    from edge_runtime.engine.async_engine import AsyncEngine
    from edge_runtime.engine.engine import Engine
    from edge_runtime.model.loader import load_model

    check_budget(model_name, config_path)
    loaded = load_model(model_name, device=device, weights=weights)
    engine = Engine(loaded, engine_config(config_path, limits, loaded, device))
    aengine = AsyncEngine(engine)
    guard = None
    if guard_config.enabled:
        from edge_runtime.guard.engine_hooks import EngineGuardHooks
        from edge_runtime.guard.guard import MemoryGuard
        from edge_runtime.guard.telemetry import open_source

        guard = MemoryGuard(guard_config, open_source(), EngineGuardHooks(engine))
    return Loaded(loaded, engine, aengine, _backends(device), guard)


def _backends(device: str) -> dict | None:
    try:
        from edge_runtime.kernels.dispatch import describe_backends
    except ImportError:
        return None
    return describe_backends(device)
