"""engine/config.py `budget_engine_config`: the one path budget -> memory plan -> EngineConfig
that `generate --config`, `serve` and `voice` take. Reads only the model's config.json."""
from types import SimpleNamespace

import pytest

from edge_runtime.budget import load_budget
from edge_runtime.engine.config import budget_engine_config
from edge_runtime.model.loader import read_model_config, resolve_model_folder


@pytest.fixture(scope="module")
def loaded():
    folder = resolve_model_folder("smollm2-135m-instruct", progress=None)
    return SimpleNamespace(config=read_model_config(folder), weight_bytes=540_000_000, path=folder)


@pytest.mark.parametrize("name", ["cpu-dev", "orin-nano-8gb"])
def test_the_plan_sizes_the_pool_and_overrides_win(loaded, name):
    config, plan = budget_engine_config(load_budget(name), loaded, {"max_num_seqs": 3})
    assert plan.model_name == loaded.path.name and plan.weight_bytes == loaded.weight_bytes
    assert (config.num_pages, config.page_tokens, config.kv_dtype) == \
        (plan.num_pages, plan.page_tokens, plan.kv_dtype)
    assert config.max_num_seqs == 3 != plan.max_concurrent_sequences


def test_plan_options_reach_the_plan(loaded):
    config, plan = budget_engine_config(load_budget("cpu-dev"), loaded, {}, kv_dtype="fp16",
                                        page_tokens=256)
    assert (plan.kv_dtype, plan.page_tokens) == ("fp16", 256)
    assert (config.kv_dtype, config.page_tokens, config.num_pages) == ("fp16", 256, plan.num_pages)
