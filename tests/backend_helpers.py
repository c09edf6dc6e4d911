"""A tiny random Llama (2 layers, GQA 4/2 heads, head_dim 16) saved as a folder, its RTN int4 AWQ
checkpoint (both from tools/lab/tiny_checkpoints.py, which tools/backend_agreement.py uses too),
and Engines over it on either back end (engine/backend.py). The CUDA back end runs on CPU tensors
through the Triton interpreter (TRITON_INTERPRET=1, set by conftest.py)."""

from __future__ import annotations

import functools
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the lab package
from lab.tiny_checkpoints import tiny_awq_folder, tiny_folder  # noqa: E402,F401

from edge_runtime.engine.config import EngineConfig
from edge_runtime.engine.engine import Engine
from edge_runtime.engine.placement import load_for, resolve

PAGE = 64
_TMP = tempfile.TemporaryDirectory(prefix="edge-backend-tests-")


@functools.lru_cache(maxsize=4)
def loaded_for(folder: Path, backend: str):
    """The model at `folder` loaded and prepared for `backend` on the CPU."""
    return load_for(str(folder), resolve("cpu", backend), progress=lambda msg: None)


def engine_on(backend: str, folder: Path | None = None, **cfg) -> Engine:
    cfg = {"page_tokens": PAGE, "num_pages": 12, "inline_tokens": 32, "num_inline_slots": 4,
           "check_invariants_every_step": True, **cfg}
    loaded = loaded_for(folder or tiny_folder(), backend)
    return Engine(loaded, EngineConfig(device="cpu", backend=backend, **cfg))


# A tiny GGUF of the tiny model: layers Q4_1, token embedding and output head Q8_0 (as the
# built-in SmolLM2 file), norms F32, q/k rows in llama.cpp's order (the loader undoes it). Its
# vocabulary is the first GGUF_VOCAB tokens: the interpreter runs a 49,152-row head in ~17 s.
GGUF_VOCAB = 512
GGUF_LAYER_TYPE, GGUF_HEAD_TYPE = "Q4_1", "Q8_0"
_GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
               "post_attention_layernorm": "ffn_norm"}


def _llama_cpp_order(w: torch.Tensor, heads: int) -> torch.Tensor:
    rows = w.shape[0]
    return w[torch.arange(rows).view(heads, 2, rows // heads // 2).transpose(1, 2).reshape(-1)]


@functools.lru_cache(maxsize=2)
def tiny_gguf_file(layer_type: str = GGUF_LAYER_TYPE, v_down_type: str | None = None) -> Path:
    """v_down_type: attn_v and ffn_down in another type (as a Q4_K_M file keeps some in Q6_K)."""
    import gguf
    from safetensors.torch import load_file

    cfg = gguf_config()
    state = load_file(str(tiny_folder() / "model.safetensors"))
    path = Path(_TMP.name) / f"tiny-{layer_type}-{v_down_type}.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")

    def add(name: str, w: torch.Tensor, kind: str) -> None:
        qtype = gguf.GGMLQuantizationType[kind]
        data = w.numpy() if kind == "F32" else gguf.quants.quantize(w.numpy(), qtype)
        writer.add_tensor(name, data, raw_dtype=qtype)

    add("token_embd.weight", state["model.embed_tokens.weight"][:GGUF_VOCAB], GGUF_HEAD_TYPE)
    add("output.weight", state["lm_head.weight"][:GGUF_VOCAB], GGUF_HEAD_TYPE)
    add("output_norm.weight", state["model.norm.weight"], "F32")
    for i in range(cfg.num_layers):
        for hf, name in _GGUF_NAMES.items():
            w = state[f"model.layers.{i}.{hf}.weight"]
            if hf in ("self_attn.q_proj", "self_attn.k_proj"):
                w = _llama_cpp_order(w, cfg.num_heads if "q_proj" in hf else cfg.num_kv_heads)
            kind = v_down_type if v_down_type and name in ("attn_v", "ffn_down") else layer_type
            add(f"blk.{i}.{name}.weight", w, "F32" if "norm" in hf else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def gguf_config():
    import dataclasses

    from edge_runtime.model.loader import read_model_config

    return dataclasses.replace(read_model_config(tiny_folder()), vocab_size=GGUF_VOCAB)


def loaded_gguf_for(backend: str, layer_type: str = GGUF_LAYER_TYPE, dtype=torch.float32):
    """The tiny GGUF served from its blocks (model/gguf_int4.py), prepared for `backend` on the
    CPU with `dtype` activations (as the loader places it for a GPU): a LoadedModel with the tiny
    folder's config and tokenizer."""
    from edge_runtime.engine.backend import prepare_model, select_backend
    from edge_runtime.model.gguf_int4 import build_gguf_model, place
    from edge_runtime.model.loader import LoadedModel, load_tokenizer, weight_bytes_of

    cfg = gguf_config()
    model, quantization = build_gguf_model(tiny_gguf_file(layer_type), cfg, "llama")
    place(model, dtype, "cpu")
    prepare_model(model, select_backend(backend, "cpu"))
    return LoadedModel(config=cfg, model=model, tokenizer=load_tokenizer(tiny_folder()),
                       path=tiny_folder(), weight_bytes=weight_bytes_of(model),
                       quantization=quantization)
