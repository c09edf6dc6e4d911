"""Qwen3 and Gemma 3 GGUFs served from their own blocks (model/gguf_int4.py), on tiny random
checkpoints written as GGUF files the way llama.cpp's converter writes them (its tensor names,
Gemma's norms stored as 1 + w, a K type and widened parts as in a Q4_K_M mix): every served
weight is the gguf package's dequantization of the file (norms as transformers' GGUF loader reads
them), and greedy tokens through the Engine on both back ends (CUDA: the Triton kernels under the
interpreter), fp32 KV, equal transformers' on that dequantization. Gemma 3's tiny config has
24-token windows on its local layers; prompts run past them.
"""
from __future__ import annotations

import functools
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from model_helpers import random_ids, save_random_model, tiny_hf_config

from edge_runtime.engine.api import SamplingParams
from edge_runtime.engine.backend import prepare_model, select_backend
from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.errors import ModelLoadError
from edge_runtime.kernels import dispatch
from edge_runtime.kernels.cpu_int4 import QuantEmbedding, QuantLinear
from edge_runtime.model.gguf_int4 import build_gguf_model, place, planned_weight_bytes
from edge_runtime.model.loader import LoadedModel, load_tokenizer, read_model_config, weight_bytes_of

FAMILIES = ["qwen3", "gemma3"]
WINDOW = 24
_TMP = tempfile.TemporaryDirectory(prefix="edge-gguf-family-tests-")
# llama.cpp's names (gguf-py's tensor map); Gemma 3's post_attention_layernorm is the norm after
# attention, Llama's / Qwen3's the one before the MLP
_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
          "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm"}
_QWEN3_NAMES = {"post_attention_layernorm": "ffn_norm"}
_GEMMA3_NAMES = {"post_attention_layernorm": "post_attention_norm",
                 "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}
# a Q4_K_M-like mix at these shapes: q / k / gate / up Q5_0 next to a Q8_0 v (widened to 8 bits
# and fused), o_proj (128 inputs: no K type fits) Q4_0, ffn_down Q6_K (256 inputs), heads Q8_0
_TYPES = {"attn_q": "Q5_0", "attn_k": "Q5_0", "attn_v": "Q8_0", "attn_output": "Q4_0",
          "ffn_gate": "Q5_0", "ffn_up": "Q5_0", "ffn_down": "Q6_K", "token_embd": "Q8_0",
          "output": "Q8_0"}


@functools.lru_cache(maxsize=2)
def family_folder(name: str) -> Path:
    overrides = {"intermediate_size": 256}  # ffn_down's rows take a K type (256 per block)
    if name == "gemma3":
        overrides["sliding_window"] = WINDOW
    return save_random_model(tiny_hf_config(name, **overrides), Path(_TMP.name) / name, seed=31)


def _gguf_names(name: str) -> dict[str, str]:
    """Hugging Face parameter name -> GGUF tensor name, for every parameter of the checkpoint."""
    cfg = read_model_config(family_folder(name))
    layer_names = {**_NAMES, **(_GEMMA3_NAMES if name == "gemma3" else _QWEN3_NAMES)}
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if not cfg.tie_word_embeddings:
        names["lm_head.weight"] = "output.weight"
    for i in range(cfg.num_layers):
        for hf, gguf_name in layer_names.items():
            names[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gguf_name}.weight"
    return names


def random_q6_k(rows: int, cols: int, seed: int) -> np.ndarray:
    """Random Q6_K blocks (the gguf package has no K-type quantizer): per 256 values 128 bytes of
    low bits, 64 of high bits, 16 int8 sub-block scales (small here) and an fp16 scale, so
    weights are about +-0.1 like the checkpoint's."""
    gen = np.random.default_rng(seed)
    blocks = gen.integers(0, 256, (rows, cols // 256, 210), dtype=np.uint8)
    blocks[..., 192:208] = gen.integers(-8, 9, (rows, cols // 256, 16)).astype(np.int8).view(np.uint8)
    blocks[..., 208:] = np.full((rows, cols // 256), 4e-4, np.float16).view(np.uint8).reshape(
        rows, cols // 256, 2)
    return blocks.reshape(rows, -1)


@functools.lru_cache(maxsize=4)
def family_gguf(name: str, drop: str | None = None) -> Path:
    """The tiny checkpoint as llama.cpp's converter writes it (tensors only: the config is the
    folder's). Gemma's norms hold 1 + w (its converter's norm_shift); no q/k row permutation
    (that is for `llama` files only). drop: a tensor left out."""
    import gguf
    from safetensors.torch import load_file

    state = load_file(str(family_folder(name) / "model.safetensors"))
    path = Path(_TMP.name) / f"{name}-{drop}.gguf"
    writer = gguf.GGUFWriter(str(path), name)
    for hf, gguf_name in _gguf_names(name).items():
        if gguf_name == drop:
            continue
        w = state[hf].float()
        if gguf_name.endswith("norm.weight"):
            writer.add_tensor(gguf_name, (w + 1 if name == "gemma3" else w).numpy())
            continue
        kind = _TYPES[gguf_name.split(".")[-2]]
        qtype = gguf.GGMLQuantizationType[kind]
        data = (random_q6_k(*w.shape, seed=len(gguf_name)) if kind == "Q6_K"
                else gguf.quants.quantize(w.numpy(), qtype))
        writer.add_tensor(gguf_name, data, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@functools.lru_cache(maxsize=2)
def dequantized_state(name: str) -> dict[str, torch.Tensor]:
    """What transformers' GGUF loader makes of the file: the gguf package's dequantization of
    every tensor, then its architecture's tensor processor (Gemma: norms minus 1)."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    reader = gguf.GGUFReader(family_gguf(name))
    processor = TENSOR_PROCESSORS.get(name, TensorProcessor)()
    by_gguf = {t.name: t for t in reader.tensors}
    state = {}
    for hf, gguf_name in _gguf_names(name).items():
        t = by_gguf[gguf_name]
        weights = gguf.quants.dequantize(t.data, t.tensor_type)
        weights = processor.process(weights=weights, name=gguf_name).weights
        state[hf] = torch.from_numpy(np.array(weights, dtype=np.float32))  # a copy: writable
    return state


@functools.lru_cache(maxsize=1)  # one family at a time
def hf_reference(name: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(str(family_folder(name)))
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = dict(dequantized_state(name))
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    model.load_state_dict(state, strict=True)
    return model.eval()


def hf_greedy(name: str, prompt: list[int], max_new: int) -> list[int]:
    with torch.inference_mode():
        out = hf_reference(name).generate(torch.tensor([prompt]), max_new_tokens=max_new,
                                          do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def served(name: str, backend: str = "cpu") -> LoadedModel:
    """The tiny GGUF built from its blocks with the folder's config, prepared for `backend`."""
    folder = family_folder(name)
    config = read_model_config(folder)
    model, quantization = build_gguf_model(family_gguf(name), config, name)
    place(model, torch.float32, "cpu")
    prepare_model(model, select_backend(backend, "cpu"))
    return LoadedModel(config=config, model=model, tokenizer=load_tokenizer(folder), path=folder,
                       weight_bytes=weight_bytes_of(model), quantization=quantization)


def _rope_bytes(model) -> int:
    rotaries = [model.model.rotary_emb, model.model.rotary_local]
    return sum(weight_bytes_of(r) for r in rotaries if r is not None)


def _dense(module) -> torch.Tensor:
    return module.weight.dequantize() if isinstance(module, QuantLinear) else module.weight


@pytest.mark.parametrize("name", FAMILIES)
def test_served_weights_are_the_files_dequantization(name):
    """Every linear (fused parts split back), the tied or own head, the embedding's rows and
    every norm equal the dequantized state bit for bit; plan's bytes are the model's."""
    model, _ = build_gguf_model(family_gguf(name), read_model_config(family_folder(name)), name)
    want = dequantized_state(name)
    got = {}
    for i, layer in enumerate(model.model.layers):
        p = f"model.layers.{i}."
        for owner, fused, parts in ((layer.self_attn, "qkv_proj", ("q_proj", "k_proj", "v_proj")),
                                    (layer.mlp, "gate_up_proj", ("gate_proj", "up_proj"))):
            module = getattr(owner, fused)
            assert module is not None, (name, fused)  # q / k widened next to v: one linear
            prefix = p + ("self_attn." if owner is layer.self_attn else "mlp.")
            for part, rows in zip(parts, _dense(module).split(module.out_splits)):
                got[prefix + part + ".weight"] = rows
        got[p + "self_attn.o_proj.weight"] = _dense(layer.self_attn.o_proj)
        got[p + "mlp.down_proj.weight"] = _dense(layer.mlp.down_proj)
        for norm in _GEMMA3_NAMES if name == "gemma3" else _QWEN3_NAMES:
            got[p + norm + ".weight"] = getattr(layer, norm).weight
        got[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        got[p + "self_attn.q_norm.weight"] = layer.self_attn.q_norm.weight
        got[p + "self_attn.k_norm.weight"] = layer.self_attn.k_norm.weight
    got["model.norm.weight"] = model.model.norm.weight
    embed = model.model.embed_tokens
    assert isinstance(embed, QuantEmbedding)
    got["model.embed_tokens.weight"] = embed(torch.arange(want["model.embed_tokens.weight"].shape[0]))
    if "lm_head.weight" in want:
        got["lm_head.weight"] = _dense(model.lm_head)
    else:
        assert torch.equal(_dense(model.lm_head), want["model.embed_tokens.weight"])
    assert set(got) == set(want)
    for key, value in want.items():
        assert torch.equal(got[key].detach(), value), key
    assert planned_weight_bytes(family_gguf(name)) == weight_bytes_of(model) - _rope_bytes(model)


BACKENDS = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not dispatch.triton_importable(), reason="needs triton (interpreter)"))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", FAMILIES)
def test_engine_greedy_matches_transformers_on_the_dequantization(name, backend):
    """Qwen3 on the CPU back end runs the one-call C layer stack over the blocks (q/k norms in C),
    Gemma 3 the torch layer loop; prompts past Gemma's 24-token window (30 and 40 tokens, batched;
    the 40-token one's first page leaves its window while it decodes) and one from the cache (34
    tokens of the 40-token one: two 16-token pages and part of a third)."""
    loaded = served(name, backend)
    if backend == "cpu":
        assert (loaded.model.fused_decoder is not None) == (name == "qwen3")
    engine = Engine(loaded, EngineConfig(device="cpu", backend=backend, kv_dtype="fp32",
                                         page_tokens=16, num_pages=24, inline_tokens=16,
                                         num_inline_slots=4, check_invariants_every_step=True))
    prompts = [random_ids(n, 512, seed=n) for n in (5, 30, 40)]
    shared = prompts[2][:34] + random_ids(6, 512, seed=99)  # a cached prefix of the 40-token one
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    results = engine.generate(prompts, params) + engine.generate([shared], params)
    assert results[3].cached_prompt_tokens >= 32, results[3].cached_prompt_tokens
    for prompt, res in zip(prompts + [shared], results):
        assert res.completions[0].token_ids == hf_greedy(name, prompt, 10), (name, backend, len(prompt))
    engine.kv.check_leaks()


def test_a_missing_gemma_norm_is_named():
    path = family_gguf("gemma3", drop="blk.1.post_ffw_norm.weight")
    with pytest.raises(ModelLoadError, match="has no tensor blk.1.post_ffw_norm.weight"):
        build_gguf_model(path, read_model_config(family_folder("gemma3")), "gemma3")
