"""Bad budgets and overrides: one ConfigError naming the file, the key and the fix; never a
traceback, never a silent fallback (budget.py, plan.py, commands/plan.py, service_limits.py,
service/engine_setup.py, EngineConfig.from_plan)."""

from __future__ import annotations

import json

import pytest
import yaml

from edge_runtime.budget import budget_from_dict, load_budget
from edge_runtime.config_checks import MAX_CONCURRENT_SEQUENCES
from edge_runtime.cli import main
from edge_runtime.errors import ConfigError
from edge_runtime.plan import REFERENCE_MODELS, make_plan

BASE = {"device_memory": "8GiB", "reserve": {"os": "1GiB", "other": "1GiB"},
        "activation_reserve": "512MiB"}
SMOL = REFERENCE_MODELS["smollm2-135m-shape"]  # 11,880 int8 KV bytes per token
PAGE = 512 * 11880  # one 512-token page: 5.80 MiB
SMOL_CONFIG_JSON = {"architectures": ["LlamaForCausalLM"], "hidden_size": 576,
                    "num_attention_heads": 9, "num_key_value_heads": 3, "num_hidden_layers": 30,
                    "intermediate_size": 1536, "vocab_size": 49152}


def _write(tmp_path, data: dict, name: str = "b.yaml"):
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_pool_cap_below_one_page_is_named_with_the_fix():
    b = budget_from_dict({**BASE, "kv": {"max_pool_bytes": 1000}}, "t.yaml")
    with pytest.raises(ConfigError) as err:
        make_plan(b, SMOL, 300 * 2**20)
    assert str(err.value) == (
        "t.yaml: kv.max_pool_bytes (1000 bytes) leaves no room for one KV page: one page of 512 "
        "tokens needs 5.80 MiB; raise kv.max_pool_bytes to at least 5.80 MiB or lower "
        "kv.page_tokens")
    assert make_plan(budget_from_dict({**BASE, "kv": {"max_pool_bytes": PAGE}}, "t.yaml"),
                     SMOL, 300 * 2**20).num_pages == 1  # exactly one page is enough


def test_no_room_adds_up_and_names_the_largest_part():
    # 2 windows x 1024 sequences x 512 fp16 positions x 30 layers x 2 x 3 heads x 64 x 2 bytes
    b = budget_from_dict({**BASE, "max_concurrent_sequences": 1024, "inline": {"slots": 0},
                          "kv": {"recent_window": 512}}, "t.yaml")
    windows = 2 * 1024 * 512 * 30 * 2 * 3 * 64 * 2
    with pytest.raises(ConfigError) as err:
        make_plan(b, SMOL, 300 * 2**20)
    free = 8 * 2**30 - 2 * 2**30 - 2**29 - 300 * 2**20 - windows
    message = str(err.value)
    assert f"- recent-key windows 22.50 GiB = {free / 2**30:.2f} GiB, but one page" in message
    assert message.endswith("the largest part is recent-key windows (22.50 GiB): lower "
                            "kv.recent_window (512) or max_concurrent_sequences (1024), or lower "
                            "kv.page_tokens")


def test_serve_refuses_a_capped_budget_before_loading_the_weights(tmp_path, monkeypatch):
    from edge_runtime.guard_config import GuardConfig
    from edge_runtime.model import loader
    from edge_runtime.service.engine_setup import check_budget, load_all
    from edge_runtime.service_limits import ServiceLimits

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(SMOL_CONFIG_JSON))  # no weights at all

    def no_load(*args, **kwargs):
        raise AssertionError("the weights were loaded before the budget was checked")

    monkeypatch.setattr(loader, "load_model", no_load)
    capped = _write(tmp_path, {**BASE, "kv": {"max_pool_bytes": "1MiB"}})
    with pytest.raises(ConfigError, match=r"kv\.max_pool_bytes \(1\.00 MiB\) leaves no room"):
        load_all(str(model), str(capped), ServiceLimits(), GuardConfig())
    small = _write(tmp_path, {"device_memory": "1GiB", "activation_reserve": "1GiB"}, "s.yaml")
    with pytest.raises(ConfigError, match="no room for one KV page even before the model "
                                          "weights: .*lower activation_reserve"):
        check_budget(str(model), load_budget(small))
    check_budget(str(model), load_budget(_write(tmp_path, BASE, "ok.yaml")))  # a budget that fits passes


def test_from_plan_sizes_the_batch_for_the_service_sequences():
    from edge_runtime.engine.config import EngineConfig

    plan = make_plan(budget_from_dict(BASE, "t.yaml"), SMOL, 300 * 2**20)
    assert plan.max_concurrent_sequences == 8
    config = EngineConfig.from_plan(plan, max_num_seqs=MAX_CONCURRENT_SEQUENCES + 1)
    assert config.max_batch_tokens == config.max_num_seqs == MAX_CONCURRENT_SEQUENCES + 1
    assert MAX_CONCURRENT_SEQUENCES == EngineConfig.max_batch_tokens  # the limit's reason


def test_section_errors_name_the_section_once(tmp_path):
    path = _write(tmp_path, {**BASE, "service": {"max_tokens": 0}})
    with pytest.raises(ConfigError) as err:
        load_budget(path)
    assert str(err.value) == f"{path}: service.max_tokens must be >= 1, got 0"
    path = _write(tmp_path, {**BASE, "guard": {"high_used_fraction": 2}})
    with pytest.raises(ConfigError) as err:
        load_budget(path)
    assert str(err.value).startswith(f"{path}: guard: need 0 < high_used_fraction")


def test_service_sizes_take_units_like_the_rest_of_the_budget(tmp_path):
    from edge_runtime.service_limits import ServiceLimits
    from edge_runtime.service.sections import load_sections

    path = _write(tmp_path, {**BASE, "service": {"max_body_bytes": "1MiB"}})
    assert load_sections(str(path))[0].max_body_bytes == 2**20
    assert ServiceLimits.from_dict({"max_body_bytes": 4096}).max_body_bytes == 4096


def test_service_sequences_cannot_exceed_the_planned_count(tmp_path):
    """The plan sizes the recent-key windows for the top-level count; more service sequences
    would allocate past the memory the budget planned."""
    from edge_runtime.service.sections import load_sections

    path = _write(tmp_path, {**BASE, "max_concurrent_sequences": 4,
                             "service": {"max_concurrent_sequences": 5}})
    with pytest.raises(ConfigError, match=r"service.max_concurrent_sequences \(5\) is more than "
                                          r"max_concurrent_sequences \(4\)"):
        load_sections(str(path))
    path = _write(tmp_path, {**BASE, "max_concurrent_sequences": 4,
                             "service": {"max_concurrent_sequences": 3}})
    assert load_sections(str(path))[0].max_concurrent_sequences == 3
    path = _write(tmp_path, {**BASE, "max_concurrent_sequences": 4})  # unset: the planned count
    assert load_sections(str(path))[0].max_concurrent_sequences == 4


def test_plan_cli_refuses_an_absurd_size_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "huge.yaml"
    path.write_text("device_memory: 1" + "0" * 400 + "\n")
    assert main(["plan", "--config", str(path), "--model", "smollm2-135m-shape"]) == 2
    assert f"{path}: device_memory: " in capsys.readouterr().err


@pytest.mark.parametrize("page_tokens, message", [
    ("0", "--page-tokens must be a power of two (16, 64, 256, 512...), got 0"),
    ("-16", "--page-tokens must be a power of two (16, 64, 256, 512...), got -16"),
    ("16", "--page-tokens (16) is smaller than inline.tokens (128) in "),
])
def test_plan_cli_page_tokens_obey_the_budget_rules(capsys, page_tokens, message):
    args = ["plan", "--config", "cpu-dev", "--model", "smollm2-135m-shape", "--json"]
    assert main([*args, "--page-tokens", page_tokens]) == 2
    assert message in capsys.readouterr().err
    assert main([*args, "--page-tokens", "128"]) == 0  # as long as an inline slot: fine
    assert json.loads(capsys.readouterr().out)["page_tokens"] == 128


def test_make_plan_page_size_overrides_obey_the_budget_rules():
    b = budget_from_dict(BASE, "t.yaml")
    with pytest.raises(ConfigError, match="power of two"):
        make_plan(b, SMOL, 0, page_tokens=0)  # not "absent"
    with pytest.raises(ConfigError, match=r"the page size \(64\) is smaller than inline\.tokens"):
        make_plan(b, SMOL, 0, page_tokens=64)
    # a float-KV budget may keep a long window; planning it as int8 on short pages may not
    fp16 = budget_from_dict({**BASE, "inline": {"slots": 0},
                             "kv": {"dtype": "fp16", "recent_window": 64}}, "t.yaml")
    assert make_plan(fp16, SMOL, 0, page_tokens=32).recent_window_bytes == 0
    with pytest.raises(ConfigError, match=r"\(32\) is smaller than kv\.recent_window \(64\)"):
        make_plan(fp16, SMOL, 0, kv_dtype="int8", page_tokens=32)
