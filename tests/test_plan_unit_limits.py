"""`edge-runtime plan` checks the unit's MemoryHigh/MemoryMax against the guard's thresholds
(edge_runtime/service/unit_limits.py): refusals name the numbers; every shipped budget passes."""

from __future__ import annotations

import pytest

from edge_runtime.budget import available_budgets, load_budget
from edge_runtime.errors import ConfigError
from edge_runtime.guard_config import GuardConfig
from edge_runtime.plan import REFERENCE_MODELS, estimate_weight_bytes, make_plan
from edge_runtime.service.unit_limits import (check_unit_limits, parse_systemd_size,
                                              planned_total, unit_memory_limits)

GIB = 1 << 30
GUARD = GuardConfig()  # high 0.85, critical 0.93, hysteresis 0.03: band [0.82, 0.93)


def _plan(name: str, model: str = "llama-3.1-8b-awq"):
    budget = load_budget(name)
    shape = REFERENCE_MODELS[model]
    return budget, make_plan(budget, shape, estimate_weight_bytes(shape, budget.weight_dtype))


PAIRS = [(name, model) for name in available_budgets()
         for model in ("smollm2-135m-shape", "llama-2-7b-awq")
         if not (name == "cpu-dev" and model != "smollm2-135m-shape")]  # 7B: not in 4 GiB


@pytest.mark.parametrize("name,model", PAIRS)
def test_every_shipped_budget_gets_limits_that_agree_with_its_guard(name, model):
    budget, plan = _plan(name, model)
    guard = GuardConfig.from_dict(dict(budget.guard))
    high, hard = unit_memory_limits(budget, plan, guard)
    check_unit_limits(high, hard, planned_total(budget, plan), guard)
    assert planned_total(budget, plan) / high < guard.high_used_fraction - guard.hysteresis
    assert hard <= max(high, budget.device_memory)


def test_memory_high_inside_the_band_of_memory_max_is_refused_with_the_numbers():
    with pytest.raises(ConfigError) as e:
        check_unit_limits(int(10.5 * GIB), int(12.32 * GIB), 8 * GIB, GUARD)
    msg = str(e.value)
    assert "MemoryHigh 10.50 GiB is 85.2% of MemoryMax 12.32 GiB" in msg
    assert "high band [82.0%, 93.0%)" in msg and "set MemoryMax to at most 11.29 GiB" in msg
    check_unit_limits(int(10.5 * GIB), int(11.29 * GIB), 8 * GIB, GUARD)  # at critical: agrees
    check_unit_limits(int(10.5 * GIB), int(12.81 * GIB), 8 * GIB, GUARD)  # below the band


def test_a_planned_total_inside_the_band_of_memory_high_is_refused():
    with pytest.raises(ConfigError, match=r"planned total 9.00 GiB .* is 85.7% of MemoryHigh "
                                          r"10.50 GiB.*raise MemoryHigh to at least 10.98 GiB"):
        check_unit_limits(int(10.5 * GIB), int(11 * GIB), 9 * GIB, GUARD)


def test_high_above_max_and_disabled_guard():
    with pytest.raises(ConfigError, match="MemoryHigh 8.00 GiB is above MemoryMax 7.00 GiB"):
        check_unit_limits(8 * GIB, 7 * GIB, GIB, GUARD)
    check_unit_limits(int(10.5 * GIB), int(12.32 * GIB), 10 * GIB, GuardConfig(enabled=False))


def test_systemd_sizes():
    assert parse_systemd_size("7G", 8 * GIB, "x") == 7 * GIB
    assert parse_systemd_size("7680M", 8 * GIB, "x") == 7680 << 20
    assert parse_systemd_size("50%", 8 * GIB, "x") == 4 * GIB
    assert parse_systemd_size("infinity", 8 * GIB, "x") is None
    with pytest.raises(ConfigError, match="give bytes with an optional K/M/G/T"):
        parse_systemd_size("7 GB", 8 * GIB, "--memory-high")


def test_plan_command_refuses_and_shows_the_limits(capsys):
    from edge_runtime.cli import main

    assert main(["plan", "--config", "orin-nx-16gb", "--model", "llama-3.1-8b-awq"]) == 0
    out = capsys.readouterr().out
    assert "unit MemoryHigh / MemoryMax" in out and "checked, agrees" in out
    rc = main(["plan", "--config", "orin-nx-16gb", "--model", "llama-3.1-8b-awq",
               "--memory-high", "11274142336", "--memory-max", "13233699142"])
    assert rc != 0 and "85.2% of MemoryMax" in capsys.readouterr().err


def test_unit_limits_count_the_weights_the_budget_device_loads(tmp_path, capsys):
    """The unit's limits come from what serve loads on the budget's device: the GGUF's blocks
    with float32 norms on the CPU back end, fp16 norms on CUDA, the fp16 conversion with
    --weights fp32 on CUDA (plan --json says the same)."""
    import json
    from pathlib import Path

    from edge_runtime.cli import main as cli_main
    from edge_runtime.service.unit_limits import main

    base = (Path(__file__).resolve().parent.parent / "configs/orin/orin-nano-8gb.yaml").read_text()
    limits = {}
    for device, weights in (("cpu", "auto"), ("cuda", "auto"), ("cuda", "fp32")):
        config = tmp_path / f"{device}-{weights}.yaml"
        config.write_text(base + f"\ndevice: {device}\n")
        assert main(["--config", str(config), "--weights", weights]) == 0
        high, hard = map(int, capsys.readouterr().out.split())
        assert cli_main(["plan", "--config", str(config), "--weights", weights, "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan["device"] == device
        assert (high, hard) == (plan["unit_limits"]["memory_high_bytes"],
                                plan["unit_limits"]["memory_max_bytes"])
        limits[device, weights] = plan["weight_bytes"]
    blocks_cpu, blocks_cuda, fp16 = limits["cpu", "auto"], limits["cuda", "auto"], limits["cuda", "fp32"]
    assert blocks_cuda < blocks_cpu < 100 * 2**20 < 200 * 2**20 < fp16  # norms at 2 bytes, not 4
