"""AWQ checkpoints in the runtime: ours and AutoAWQ's load through the model loader and give the
logits of the dequantized reference (a transformers Llama holding the dequantized weights)."""

from __future__ import annotations

import copy
import json
import sys
import types

import pytest
import torch

from awq_helpers import import_autoawq, tiny_llama
from edge_runtime.model.config import ModelConfig
from edge_runtime.model.contiguous_kv import ContiguousKVCache
from edge_runtime.model.loader import build_model, weight_bytes_of
from edge_runtime.model.safetensors_io import load_state_dict
from edge_runtime.model import awq_model
from edge_runtime.quant import awq_algo, awq_blocks, awq_pack
from edge_runtime.kernels.cpu_int4 import QuantLinear
from edge_runtime.model.awq_linear import AWQLinear


def _load_ours(folder, backend="auto"):
    """What load_model does minus the tokenizer; backend "reference" = exact fp32 dequant."""
    cfg = json.loads((folder / "config.json").read_text())
    state = load_state_dict(folder, torch.float32)
    if backend == "auto":
        model, quantization = build_model(ModelConfig.from_hf(cfg), state, cfg["quantization_config"])
        return model, quantization
    orig = awq_model.quantize_linears_from_checkpoint
    def patched(m, s, q):
        return orig(m, s, q, backend=backend)
    awq_model.quantize_linears_from_checkpoint = patched
    try:
        return build_model(ModelConfig.from_hf(cfg), state, cfg["quantization_config"])
    finally:
        awq_model.quantize_linears_from_checkpoint = orig


def _reference(hf_model, folder, group_size):
    """A float transformers model with the checkpoint's tensors, int4 linears dequantized."""
    from safetensors.torch import load_file

    ref = copy.deepcopy(hf_model).float()
    tensors = load_file(str(folder / "model.safetensors"))
    with torch.no_grad():
        for name, param in ref.named_parameters():
            path = name[: -len(".weight")]
            if f"{path}.qweight" in tensors:
                w = awq_pack.dequantize(tensors[f"{path}.qweight"], tensors[f"{path}.qzeros"],
                                        tensors[f"{path}.scales"], group_size)
                param.copy_(w.t())
            elif name in tensors:
                param.copy_(tensors[name].float())
        # the runtime keeps embeddings in fp16
        ref.model.embed_tokens.weight.copy_(ref.model.embed_tokens.weight.half().float())
    return ref


def _our_logits(model, ids):
    cache = ContiguousKVCache.for_model(model.config, dtype=torch.float32)
    cache.add(0, capacity=len(ids))
    return model(ids, torch.arange(len(ids)), cache.step([0], [len(ids)]), None)


def _compare(folder, hf_model, group_size, ids):
    with torch.no_grad():
        want = _reference(hf_model, folder, group_size)(ids[None]).logits[0]
    exact, _ = _load_ours(folder, backend="reference")
    got = _our_logits(exact, ids)
    assert torch.allclose(got, want, atol=2e-3, rtol=1e-3), (got - want).abs().max()
    fast, quantization = _load_ours(folder)  # the default: the blocked format, exact weights
    assert quantization == f"awq-g{group_size}"
    assert not any(isinstance(m, AWQLinear) for m in fast.modules())
    assert isinstance(fast.model.layers[0].self_attn.qkv_proj, QuantLinear)
    torch.testing.assert_close(_our_logits(fast, ids), got, rtol=1e-4, atol=1e-4)  # summation order
    int4pack, _ = _load_ours(folder, backend="cpu-int4pack")
    assert all(m.backend == "cpu-int4pack" for m in int4pack.modules() if isinstance(m, AWQLinear))
    got_int4pack = _our_logits(int4pack, ids)
    rel = (got_int4pack - want).norm() / want.norm()
    assert rel < 2e-2, float(rel)  # bf16 activations/scales in torch's int4 matmul
    return fast


def test_our_checkpoint_round_trip(tmp_path):
    hf = tiny_llama(seed=4)
    src = tmp_path / "src"
    hf.config.save_pretrained(src)
    model = copy.deepcopy(hf)
    calib = torch.randint(0, 300, (2, 32), generator=torch.Generator().manual_seed(1))
    st = awq_algo.AWQSettings(group_size=32, n_grid=4, clip_grid=4)
    tensors = awq_algo.awq_quantize(model, awq_blocks.LayerArch.from_config(hf.config), calib, st)
    out = tmp_path / "q"
    awq_model.save_awq_checkpoint(out, model, tensors, src, 32, tie_word_embeddings=True)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"] == {"quant_method": "awq", "bits": 4, "group_size": 32,
                                          "zero_point": True, "version": "gemm",
                                          "modules_to_not_convert": None}
    ids = torch.randint(0, 300, (48,), generator=torch.Generator().manual_seed(2))
    fast = _compare(out, model, 32, ids)
    fp32_bytes = sum(p.numel() * 4 for p in hf.parameters())
    assert weight_bytes_of(fast) < 0.35 * fp32_bytes


@pytest.fixture()
def autoawq_cpu_fix(monkeypatch):
    """AutoAWQ's scale search saves `{k: v.cpu()}` to restore weights; on CPU that aliases the live
    tensors, which it then modifies in place. Make .cpu() copy for CPU tensors during the test."""
    orig_cpu = torch.Tensor.cpu

    def cpu_copy(self, *args, **kwargs):
        out = orig_cpu(self, *args, **kwargs)
        return out.detach().clone() if self.device.type == "cpu" else out

    monkeypatch.setattr(torch.Tensor, "cpu", cpu_copy)
    if "datasets" not in sys.modules:  # imported by awq.utils.calib_data; unused with token ids
        monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=None))


def test_autoawq_written_checkpoint_loads(tmp_path, autoawq_cpu_fix):
    import_autoawq()
    try:
        from awq.models._config import AwqConfig
        from awq.models.llama import LlamaAWQForCausalLM
    except ImportError as exc:
        pytest.skip(f"AutoAWQ's quantizer does not import here: {exc}")
    # AutoAWQ's clip search needs out_features % 64 == 0; equal v/o shapes exercise v->o scaling
    hf = tiny_llama(seed=5, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                    head_dim=16, num_key_value_heads=4)
    model = copy.deepcopy(hf)
    awq = LlamaAWQForCausalLM(model, "llama", False, model.config, AwqConfig(), None)
    calib = [list(range(i, i + 32)) for i in range(0, 200, 50)]  # token ids: no tokenizer needed
    awq.quantize(None, {"zero_point": True, "q_group_size": 64, "w_bit": 4, "version": "GEMM"},
                 calib_data=calib, max_calib_samples=4, max_calib_seq_len=32)
    out = tmp_path / "autoawq"
    awq.save_quantized(str(out))
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(3))
    _compare(out, hf, 64, ids)


def _rtn_checkpoint(group_size=32):
    """(config, state, quantization_config) of a tiny round-to-nearest AWQ checkpoint, in memory."""
    hf = tiny_llama(seed=5)
    state = {k: v.clone() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    for name in [k for k in state if k.endswith("_proj.weight")]:
        path = name[: -len(".weight")]
        q = awq_pack.pack_linear_weight(state.pop(name), group_size)
        state.update(zip((f"{path}.qweight", f"{path}.qzeros", f"{path}.scales"), q))
    return ModelConfig.from_hf(hf.config.to_dict()), state, awq_model.awq_quant_config(group_size)


_Q = "model.layers.0.self_attn.q_proj"


@pytest.mark.parametrize("case, match", [
    ("group_size 64", r"down_proj: quantization_config.group_size 64 does not fit .*scales "
                      r"\(8, 128\) imply group_size 32\): set group_size"),
    ("group_size 0", r"quantization_config.group_size must be a positive integer.*got 0"),
    ("group_size 'sixty-four'", r"group_size must be a positive integer.*'sixty-four'"),
    ("group_size True", "group_size must be a positive integer"),
    ("no qzeros", rf"has {_Q}.qweight but no {_Q}.qzeros"),
    ("bad qzeros", rf"{_Q}.qzeros has shape \(4, 15\), expected \(4, 16\)"),
    ("bad embed", r"model.embed_tokens.weight has shape \(300, 126\), expected \(300, 128\)"),
    ("config string", "quantization_config must be a JSON object"),
    ("float qweight", rf"{_Q}.qweight must be int32, got float32"),
    ("int8 qweight", rf"{_Q}.qweight must be int32, got int8"),
    ("float qzeros", rf"{_Q}.qzeros must be int32, got float32"),
    ("int scales", rf"{_Q}.scales must be floating point, got int32"),
    ("int8 embed", r"model.embed_tokens.weight must be floating point, got int8"),
    ("bias without attention_bias", rf"unexpected weights, e.g. {_Q}.bias \(config.json gives"),
    ("bits '4'", r"quantization_config.bits must be a positive integer \(AWQ GEMM checkpoints "
                 r"use 4\), got '4'"),
    ("zero_point 'false'", r"zero_point must be true or false \(a JSON boolean\), got 'false'"),
    ("no quantization_config", r"holds AWQ tensors \(\*.qweight\) but config.json has no "
                               r"quantization_config"),
])
def test_broken_awq_checkpoint_is_a_model_load_error(case, match):
    from edge_runtime.errors import ModelLoadError

    config, state, qc = _rtn_checkpoint()
    if case.startswith("group_size"):
        qc["group_size"] = eval(case.split(" ", 1)[1])
    elif case == "no qzeros":
        del state[f"{_Q}.qzeros"]
    elif case == "bad qzeros":
        state[f"{_Q}.qzeros"] = state[f"{_Q}.qzeros"][:, :-1]
    elif case == "bad embed":  # used to load, then crash at the first forward
        state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"][:, :-2]
    elif case == "config string":
        qc = "awq"
    elif case.endswith(("qweight", "qzeros", "scales")):  # garbage output with exit 0, before
        dtype, name = case.split()
        key = f"{_Q}.{name}"
        state[key] = state[key].to({"float": torch.float32, "int8": torch.int8, "int": torch.int32}[dtype])
    elif case == "int8 embed":
        state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"].to(torch.int8)
    elif case == "bias without attention_bias":  # the float path refuses it; AWQ loaded it
        state[f"{_Q}.bias"] = torch.randn(128)
    elif case == "bits '4'":  # the message used to speak of the group size
        qc["bits"] = "4"
    elif case == "zero_point 'false'":  # a truthy string, read as true
        qc["zero_point"] = "false"
    elif case == "no quantization_config":  # an old AutoAWQ export: "missing 14 weights" before
        qc = None
    with pytest.raises(ModelLoadError, match=match):
        build_model(config, state, qc)


def test_awq_linear_with_out_features_not_a_multiple_of_8_is_a_load_error():
    """The shape check floors out_features // 8, so this was an AssertionError in from_tensors."""
    from edge_runtime.errors import ModelLoadError

    model = torch.nn.ModuleDict({"proj": torch.nn.Linear(128, 100, bias=False)})
    state = {"proj.qweight": torch.zeros(128, 12, dtype=torch.int32),
             "proj.qzeros": torch.zeros(4, 12, dtype=torch.int32),
             "proj.scales": torch.ones(4, 100, dtype=torch.float16)}
    with pytest.raises(ModelLoadError, match=r"^proj: out_features 100 \(config.json\) is not a "
                                             r"multiple of 8"):
        awq_model._make_awq_linear(model, "proj", state, 32, "reference")


def test_legacy_group_size_key_names_the_quantization():
    """AutoAWQ's q_group_size loaded as g64 but the model was labelled awq-g128."""
    config, state, qc = _rtn_checkpoint()
    legacy = {k: v for k, v in qc.items() if k != "group_size"}
    legacy["q_group_size"] = qc["group_size"]
    _, quantization = build_model(config, state, legacy)
    assert quantization == f"awq-g{qc['group_size']}" != "awq-g128"


def test_rtn_checkpoint_helper_builds():
    config, state, qc = _rtn_checkpoint()
    model, quantization = build_model(config, state, qc, awq_backend="reference")
    assert quantization == "awq-g32" and isinstance(model.get_submodule(_Q), AWQLinear)


@pytest.mark.parametrize("group_size", [32, 64])
def test_blocked_awq_weights_are_the_awq_dequantization_bit_for_bit(group_size):
    """The default AWQ load: every linear a QuantLinear on the blocked format (q/k/v and gate/up
    fused), dequantizing to exactly AutoAWQ's (q - z) s."""
    config, state, qc = _rtn_checkpoint(group_size)
    tensors = {k: v.clone() for k, v in state.items()}
    model, _ = build_model(config, state, qc)

    def awq(path):
        return awq_pack.dequantize(tensors[f"{path}.qweight"], tensors[f"{path}.qzeros"],
                                   tensors[f"{path}.scales"], group_size).t()

    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        for module, parts in ((layer.self_attn.qkv_proj, ["self_attn.q_proj", "self_attn.k_proj",
                                                          "self_attn.v_proj"]),
                              (layer.self_attn.o_proj, ["self_attn.o_proj"]),
                              (layer.mlp.gate_up_proj, ["mlp.gate_proj", "mlp.up_proj"]),
                              (layer.mlp.down_proj, ["mlp.down_proj"])):
            assert isinstance(module, QuantLinear), type(module)
            want = torch.cat([awq(p + part) for part in parts])
            assert torch.equal(module.weight.dequantize(), want), (i, parts)


@pytest.mark.parametrize("fail_in", ["save_file", "copyfile"])
def test_interrupted_checkpoint_write_leaves_no_folder(tmp_path, monkeypatch, fail_in):
    """Ctrl-C (or a full disk) during the write must not leave a folder at out_dir holding a
    model.safetensors and config.json that later loads as a (truncated) checkpoint."""
    import safetensors.torch

    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "tokenizer.json").write_text("{}")

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(safetensors.torch if fail_in == "save_file" else awq_model.shutil,
                        fail_in, interrupt)
    out = tmp_path / "q"
    with pytest.raises(KeyboardInterrupt):
        awq_model.save_awq_checkpoint(out, torch.nn.Linear(8, 8), {}, src, 32, False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_checkpoint_write_replaces_an_empty_folder(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    out = tmp_path / "q"
    out.mkdir()
    weights = awq_model.save_awq_checkpoint(out, torch.nn.Linear(8, 8), {}, src, 32, False)
    assert weights == out / "model.safetensors" and weights.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q", "src"]
    assert (out.stat().st_mode & 0o777) == 0o777 & ~_umask()
    assert (weights.stat().st_mode & 0o777) == 0o666 & ~_umask()  # safetensors wrote 0600


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask
