"""The `service:` and `guard:` sections of a budget, read for the service.

Kept apart from service_limits.py because the budget loader validates its `service:` section with
ServiceLimits: the schema sits below the budget and must not import it in turn.
"""

from __future__ import annotations

from edge_runtime.budget import load_budget
from edge_runtime.errors import ConfigError
from edge_runtime.guard_config import GuardConfig
from edge_runtime.service_limits import ServiceLimits


def load_sections(config: str | None) -> tuple[ServiceLimits, GuardConfig]:
    """`service:` and `guard:` of a budget (a YAML path or a name such as cpu-dev); both optional."""
    if not config:
        return ServiceLimits(), GuardConfig()
    budget = load_budget(config)
    # unset, the service runs as many sequences as the memory plan is made for
    limits = ServiceLimits.from_dict({"max_concurrent_sequences": budget.max_concurrent_sequences,
                                      **budget.service})
    if limits.max_concurrent_sequences > budget.max_concurrent_sequences:
        # the plan sizes the recent-key windows for the top-level count; the engine would
        # allocate them for the service's, past the memory the budget planned
        raise ConfigError(
            f"{budget.source}: service.max_concurrent_sequences ({limits.max_concurrent_sequences})"
            f" is more than max_concurrent_sequences ({budget.max_concurrent_sequences}), the "
            "count the memory plan is made for; raise the top-level value or lower the service's")
    return limits, GuardConfig.from_dict(dict(budget.guard))
