"""A CausalLM served from a GGUF's own quantized blocks (no float32 copy of the weights).

The file is mapped (model/gguf_tensors.py: the tensor table, without gguf.GGUFReader's parse of
every metadata value); each quantized tensor's bytes become the
runtime's blocked int4/int8 format (quant/gguf_blocks.py -> quant/int4_format.py) and the map is
dropped, so what stays resident is the file's tensor bytes in another order (plus 16-row block
padding). Per layer q/k/v rows are fused into one `QuantLinear` (kernels/cpu_int4.py) when they
share a type, gate/up into another, o_proj and down_proj are their own; `model.fused_decoder` runs decode steps in one C
call (kernels/cpu_decoder.py). A tied LM head stays in the file's type (Q8_0 for SmolLM2) and the
embedding reads its rows (`QuantEmbedding`). Norms (F32 in the file) are float32 parameters.

Invariants:
- The model computes what the fp32 folder that gguf_convert.py writes from the same file computes:
  every weight dequantizes to the same float (tests/test_int4_format.py), q/k rows are put back in
  Hugging Face's rope order as transformers does for `llama` GGUFs (a row permutation, exact).
- A tensor that cannot be served quantized (a type other than Q4_0/Q4_1/Q4_K/Q6_K/Q8_0) is a
  ModelLoadError naming the tensor and type, with `--weights fp32` as the way out. Parts of
  different types (Q4_K_M: attn_v / ffn_down in Q6_K) are not fused: one QuantLinear each.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

from edge_runtime.errors import ModelLoadError
from edge_runtime.kernels.cpu_int4 import QuantEmbedding, QuantLinear
from edge_runtime.model.config import ModelConfig
from edge_runtime.model.gguf_tensors import GGUFTensors
from edge_runtime.model.meta_init import no_weight_init
from edge_runtime.model.weights_option import WEIGHTS
from edge_runtime.quant.gguf_blocks import UnsupportedType, grouped_rows
from edge_runtime.quant.int4_format import BlockedQuantWeight, GroupedRows, compatible, describe

_FLOAT_TYPES = ("F32", "F16", "BF16")
# GGUF type -> (bits, group size, parameter bytes, offsets) of its runtime form (quant/gguf_blocks.py)
_RUNTIME_FORM = {"Q4_0": (4, 32, 2, True), "Q4_1": (4, 32, 2, True), "Q4_K": (4, 32, 4, True),
                 "Q6_K": (8, 16, 4, False), "Q8_0": (8, 32, 2, False)}
_FUSED = {"attn_q": "attn_qkv", "attn_k": "attn_qkv", "attn_v": "attn_qkv", "ffn_gate": "ffn_gate_up",
          "ffn_up": "ffn_gate_up"}


def rope_order(rows: int, heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's q/k permutation (transformers' reverse_permute_weights)."""
    dim = rows // heads // 2
    return torch.arange(rows).view(heads, dim, 2).transpose(1, 2).reshape(rows)


class _Tensors:
    """The file's tensors by name (model/gguf_tensors.py), read as GroupedRows or float tensors."""

    def __init__(self, path: Path) -> None:
        self.file = GGUFTensors(path)

    def has(self, name: str) -> bool:
        return name in self.file

    def type_name(self, name: str) -> str:
        return self.file.info(name).type_name

    def rows(self, name: str, shape: tuple[int, int]) -> GroupedRows:
        try:
            rows = grouped_rows(self.file[name], self.type_name(name), name)
        except UnsupportedType as exc:
            raise ModelLoadError(str(exc)) from exc
        if rows.shape != shape:
            raise ModelLoadError(f"{name} has shape {list(rows.shape)}, the GGUF's config expects "
                                 f"{list(shape)}; re-download the file")
        return rows

    def floats(self, name: str) -> torch.Tensor:
        kind = self.type_name(name)
        if kind not in _FLOAT_TYPES:
            raise ModelLoadError(f"{name} is stored as {kind}; expected a float type")
        data = self.file[name]
        if kind == "BF16":
            data = (data.astype(np.uint32) << 16).view(np.float32)
        return torch.from_numpy(data.astype(np.float32))  # a copy: the map can go

    def quantization(self) -> str:
        """"gguf-Q4_1" etc.: the file's most common quantized type."""
        from collections import Counter

        kinds = Counter(i.type_name for i in self.file.infos.values() if i.type_name not in _FLOAT_TYPES)
        return f"gguf-{kinds.most_common(1)[0][0]}" if kinds else "none"


def _linear(parts: list[GroupedRows], names: list[str], bias: torch.Tensor | None) -> QuantLinear:
    assert all(compatible(parts[0], p) for p in parts), [describe(p) for p in parts]
    rows = GroupedRows.cat(parts) if len(parts) > 1 else parts[0]
    return QuantLinear(BlockedQuantWeight.from_rows(rows), bias, tuple(p.shape[0] for p in parts))


def _set_linears(owner: nn.Module, fused_name: str, hf_names: tuple[str, ...],
                 parts: list[GroupedRows], names: list[str], biases: list) -> None:
    """One fused QuantLinear when the parts share a form, else one per part under its Hugging
    Face name (a Q4_K_M file keeps attn_v in Q6_K next to Q4_K q and k: the model runs them
    one by one, without the CPU's one-call layer stack)."""
    if all(compatible(parts[0], p) for p in parts):
        bias = None if all(b is None for b in biases) else torch.cat(
            [torch.zeros(p.shape[0]) if b is None else b for p, b in zip(parts, biases)])
        setattr(owner, fused_name, _linear(parts, names, bias))
        for name in hf_names:
            delattr(owner, name)
        return
    for name, part, bias, tensor in zip(hf_names, parts, biases, names):
        setattr(owner, name, _linear([part], [tensor], bias))


def _bias(tensors: _Tensors, name: str) -> torch.Tensor | None:
    return tensors.floats(name) if tensors.has(name) else None


def _layer(tensors: _Tensors, cfg: ModelConfig, i: int, layer: nn.Module, permute: bool) -> None:
    h, d, heads, kv_heads = cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    p = f"blk.{i}."
    q = tensors.rows(p + "attn_q.weight", (heads * d, h))
    k = tensors.rows(p + "attn_k.weight", (kv_heads * d, h))
    v = tensors.rows(p + "attn_v.weight", (kv_heads * d, h))
    if permute:
        q, k = q.permute_rows(rope_order(heads * d, heads)), k.permute_rows(rope_order(kv_heads * d, kv_heads))
    attn, mlp = layer.self_attn, layer.mlp
    _set_linears(attn, "qkv_proj", ("q_proj", "k_proj", "v_proj"), [q, k, v],
                 [p + f"attn_{n}.weight" for n in "qkv"],
                 [_bias(tensors, p + f"attn_{n}.bias") for n in "qkv"])
    attn.o_proj = _linear([tensors.rows(p + "attn_output.weight", (h, heads * d))],
                          [p + "attn_output.weight"], _bias(tensors, p + "attn_output.bias"))
    inter = cfg.intermediate_size
    gate_up = [p + "ffn_gate.weight", p + "ffn_up.weight"]
    _set_linears(mlp, "gate_up_proj", ("gate_proj", "up_proj"),
                 [tensors.rows(n, (inter, h)) for n in gate_up], gate_up, [None, None])
    mlp.down_proj = _linear([tensors.rows(p + "ffn_down.weight", (h, inter))],
                            [p + "ffn_down.weight"], None)
    layer.input_layernorm.weight = nn.Parameter(tensors.floats(p + "attn_norm.weight"), False)
    layer.post_attention_layernorm.weight = nn.Parameter(tensors.floats(p + "ffn_norm.weight"), False)


def _head_and_embedding(tensors: _Tensors, cfg: ModelConfig, model: nn.Module) -> None:
    shape = (cfg.vocab_size, cfg.hidden_size)
    tied = not tensors.has("output.weight")
    if tensors.type_name("token_embd.weight") in _FLOAT_TYPES:
        embed = tensors.floats("token_embd.weight").view(shape)
        model.model.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        head = None
    else:
        head = QuantLinear(BlockedQuantWeight.from_rows(tensors.rows("token_embd.weight", shape)))
        model.model.embed_tokens = QuantEmbedding(head, owns=not tied)
    if not tied:
        if tensors.type_name("output.weight") in _FLOAT_TYPES:
            model.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            model.lm_head.weight = nn.Parameter(tensors.floats("output.weight").view(shape), False)
        else:
            model.lm_head = QuantLinear(BlockedQuantWeight.from_rows(tensors.rows("output.weight", shape)))
    elif head is not None:
        model.lm_head = head
    else:
        model.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        model.lm_head.weight = model.model.embed_tokens.weight


def planned_weight_bytes(gguf_path: Path, float_bytes: int = 4) -> int:
    """The bytes `build_gguf_model` + `place` will hold for this file, from its tensor table alone
    (plan and the budgets): blocked integers and parameters per fused linear, float tensors (norms)
    at `float_bytes` (the activation dtype's: 4 on the CPU back end, 2 for fp16 on CUDA). A type
    the loader refuses counts as floats too (it is refused at load, with its name)."""
    from edge_runtime.quant.int4_format import blocked_nbytes

    groups: dict[str, list] = {}
    total = 0
    for info in GGUFTensors(gguf_path).infos.values():
        if info.type_name not in _RUNTIME_FORM or len(info.shape) != 2:
            total += float_bytes * int(np.prod(info.shape))
            continue
        parts = info.name.split(".")
        key = ".".join(_FUSED.get(p, p) for p in parts)
        groups.setdefault(key, []).append(info)
    for infos in groups.values():
        if len({i.type_name for i in infos}) > 1:  # not fused: one blocked weight each
            parts = [[i] for i in infos]
        else:
            parts = [infos]
        for part in parts:
            form = _RUNTIME_FORM[part[0].type_name]
            total += blocked_nbytes(form[0], sum(i.shape[0] for i in part), part[0].shape[1],
                                    *form[1:])
    return total


def _stderr_bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="loading 4-bit weights", unit="layer", file=sys.stderr,
                leave=False)


def build_gguf_model(gguf_path: Path, config: ModelConfig, arch: str,
                     progress: Callable[[str], None] | None = None):
    """A CausalLM on the CPU with the GGUF's quantized blocks; returns (model, quantization)."""
    from edge_runtime.kernels.cpu_decoder import FusedDecoder
    from edge_runtime.model.llama import FULL_ROPE_TABLE, CausalLM, Rotary

    tensors = _Tensors(gguf_path)
    with torch.device("meta"), no_weight_init():
        model = CausalLM(config)
    bar = _stderr_bar(config.num_layers) if progress is not None else None
    for i, layer in enumerate(model.model.layers):
        _layer(tensors, config, i, layer, permute=arch == "llama")
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    _head_and_embedding(tensors, config, model)
    model.model.norm.weight = nn.Parameter(tensors.floats("output_norm.weight"), False)
    quantization = tensors.quantization()
    del tensors  # the memory map: every byte kept is in the modules now
    model.model.rotary_emb = Rotary(config)
    model.model.rotary_emb.build(FULL_ROPE_TABLE)
    model.eval()
    model.linears_packed = sum(isinstance(m, QuantLinear) for m in model.modules())
    model.fused_decoder = FusedDecoder.for_model(model)
    return model, quantization


def serve_from_blocks(weights: str, source: Path | None, dtype: torch.dtype, device: str) -> bool:
    """Whether to serve a GGUF from its own quantized blocks (model/gguf_int4.py) rather than
    its float conversion. gguf: yes, in any activation dtype on any device (the CPU back end
    runs float32 through the C kernels, the CUDA back end any dtype through the Triton kernel).
    auto: yes on a CUDA device; on the CPU with float32 activations when the C kernels build
    (without them the blocks would be dequantized per call)."""
    if weights not in WEIGHTS:
        raise ModelLoadError(f"unknown --weights {weights!r}; use one of {', '.join(WEIGHTS)}")
    if weights == "fp32":
        return False
    if source is None:
        if weights == "gguf":
            raise ModelLoadError("--weights gguf needs a .gguf model (or the built-in name)")
        return False
    from edge_runtime.model.gguf_convert import BLOCK_ARCHITECTURES, gguf_architecture

    arch = gguf_architecture(source)
    if arch not in BLOCK_ARCHITECTURES:  # its layer has tensors the blocks path does not build
        if weights == "gguf":
            raise ModelLoadError(f"serving a {arch!r} GGUF from its blocks is not implemented "
                                 "(q/k head norms, Gemma's extra norms); use --weights fp32")
        return False
    if weights == "gguf" or str(device) != "cpu":
        return True
    from edge_runtime.kernels import cpu_native

    return dtype == torch.float32 and cpu_native.library() is not None


def place(model: nn.Module, dtype: torch.dtype, device: str) -> None:
    """Put a model built on the CPU in float32 onto `device` with `dtype` activations: the
    quantized bytes move as they are, norms (and float embeddings / heads) take `dtype`, the
    quantized embedding returns `dtype` rows, and the C layer stack (CPU float32 only) goes."""
    if dtype == torch.float32 and str(device) == "cpu":
        return
    placed: dict[int, nn.Parameter] = {}  # a tied head keeps sharing its embedding's parameter
    for module in model.modules():
        if isinstance(module, QuantEmbedding):
            module.dtype = dtype
        for name, param in list(module.named_parameters(recurse=False)):
            if id(param) not in placed:
                placed[id(param)] = nn.Parameter(param.data.to(device, dtype), False)
            setattr(module, name, placed[id(param)])
    model.to(device)  # buffers: quantized bytes and parameters keep their dtypes, rope tables too
    model.fused_decoder = None
