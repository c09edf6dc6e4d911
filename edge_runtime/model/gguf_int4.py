"""A CausalLM served from a GGUF's own quantized blocks (no float32 copy of the weights).

The file is mapped (model/gguf_tensors.py: the tensor table, without gguf.GGUFReader's parse of
every metadata value); each quantized tensor's bytes become the
runtime's blocked int4/int8 format (quant/gguf_blocks.py -> quant/int4_format.py) and the map is
dropped, so what stays resident is the file's tensor bytes in another order (plus 16-row block
padding). Per layer q/k/v rows are fused into one `QuantLinear` (kernels/cpu_int4.py) when they
share a type, gate/up into another, o_proj and down_proj are their own; `model.fused_decoder` runs decode steps in one C
call (kernels/cpu_decoder.py). A tied LM head stays in the file's type (Q8_0 for SmolLM2 and
Gemma 3's 262k rows) and the embedding reads its rows (`QuantEmbedding`). Norms (F32 in the file)
are float32 parameters: Qwen3's and Gemma 3's per-head q/k norms (`attn_q_norm` / `attn_k_norm`),
Gemma 3's norm after attention (`post_attention_norm`) and around the MLP (`ffn_norm` before it,
`post_ffw_norm` after it). Gemma's RMSNorm scales by (1 + w) (transformers' convention, the
model's `norm_unit_offset`); llama.cpp's converter stores 1 + w in the file, so every Gemma norm
is read back as (stored - 1) in float32, as transformers' GGUF loader does (Gemma2TensorProcessor):
the same parameter, bit for bit, as the float32 folder's.

Invariants:
- The model computes what the fp32 folder that gguf_convert.py writes from the same file computes:
  every weight dequantizes to the same float (tests/test_int4_format.py), q/k rows are put back in
  Hugging Face's rope order as transformers does for `llama` GGUFs (a row permutation, exact;
  qwen2 / qwen3 / gemma3 files keep Hugging Face's order), norms are the folder's parameters.
- Every architecture of gguf_convert.GGUF_ARCHITECTURES is built here: the layer's parts follow
  the config (model/config.py: qk_norm, sandwich_norms), and a tensor the config needs but the
  file lacks is a ModelLoadError naming it.
- Every block type of quant/gguf_blocks.SUPPORTED is served from its blocks, F16 / BF16 matrices
  in their 16 bits (kernels/float16_linear.py), F32 ones as float32. A file holding any other
  type is refused before anything is loaded (`check_served`): a ModelLoadError naming the first
  such tensor, its type and the served list. Parts of different forms (Q4_K_M: attn_v in Q8_0
  next to Q5_0 q and k) are not fused: one linear each.
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
from edge_runtime.kernels.float16_linear import Float16Linear
from edge_runtime.model.config import ModelConfig
from edge_runtime.model.gguf_convert import check_supported
from edge_runtime.model.gguf_tensors import GGUFTensors
from edge_runtime.model.meta_init import no_weight_init
from edge_runtime.model.weights_option import WEIGHTS
from edge_runtime.quant.gguf_blocks import (FLOAT_TYPES, RUNTIME_FORM, SUPPORTED, UnsupportedType,
                                            grouped_rows, served_types)
from edge_runtime.quant.int4_format import (BlockedQuantWeight, GroupedRows, blocked_nbytes,
                                            compatible, describe, widened)
from edge_runtime.kernels import cpu_native
from edge_runtime.kernels.cpu_decoder import FusedDecoder
from edge_runtime.model.llama import FULL_ROPE_TABLE, CausalLM

_FLOAT_TYPES = FLOAT_TYPES
_HALF_TYPES = ("F16", "BF16")  # matrices kept in their 16 bits
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

    def rows(self, name: str, shape: tuple[int, int]) -> "GroupedRows | torch.Tensor":
        """A matrix as GroupedRows (a block type) or a float tensor in the file's own width
        (float16 / bfloat16 / float32)."""
        kind = self.type_name(name)
        if kind in _FLOAT_TYPES:
            rows = self._float_matrix(name, kind)
        else:
            try:
                rows = grouped_rows(self.file[name], kind, name)
            except UnsupportedType as exc:
                raise ModelLoadError(str(exc)) from exc
        if tuple(rows.shape) != shape:
            raise ModelLoadError(f"{name} has shape {list(rows.shape)}, the GGUF's config expects "
                                 f"{list(shape)}; re-download the file")
        return rows

    def _float_matrix(self, name: str, kind: str) -> torch.Tensor:
        data = np.array(self.file[name])  # a copy: the map can go
        if kind == "BF16":
            return torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
        return torch.from_numpy(data)

    def norm(self, name: str, size: int, unit_offset: bool) -> nn.Parameter:
        """An RMSNorm's weight [size]; unit_offset (Gemma): the file's 1 + w read back as w."""
        weight = self.floats(name)
        if tuple(weight.shape) != (size,):
            raise ModelLoadError(f"{name} has shape {list(weight.shape)}, the GGUF's config expects "
                                 f"[{size}]; re-download the file")
        return nn.Parameter(weight - 1.0 if unit_offset else weight, False)

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


def check_served(file: GGUFTensors) -> None:
    """Refuse a file holding a type the runtime cannot serve, before any tensor is converted."""
    for info in file.infos.values():
        if info.type_name not in SUPPORTED and info.type_name not in _FLOAT_TYPES:
            raise ModelLoadError(
                f"{info.name} is stored as GGUF type {info.type_name}, which the runtime cannot "
                f"serve (served: {served_types()}); use a file quantized to one of those "
                "(llama.cpp's Q4_0, Q4_K_M, Q5_K_M, Q6_K, Q8_0, IQ4_XS, ... mixes are)")


def _same_form(parts: list) -> bool:
    first = parts[0]
    if isinstance(first, GroupedRows):
        return all(isinstance(p, GroupedRows) and compatible(first, p) for p in parts)
    return all(isinstance(p, torch.Tensor) and p.dtype == first.dtype for p in parts)


def _permuted(rows, order: torch.Tensor):
    return rows.permute_rows(order) if isinstance(rows, GroupedRows) else rows[order]


def _linear(parts: list, names: list[str], bias: torch.Tensor | None) -> nn.Module:
    """One linear over `parts` (same form): a QuantLinear for blocks, a Float16Linear for 16-bit
    floats, an nn.Linear for float32."""
    assert _same_form(parts), [describe(p) if isinstance(p, GroupedRows) else p.dtype for p in parts]
    splits = tuple(p.shape[0] for p in parts)
    if isinstance(parts[0], GroupedRows):
        rows = GroupedRows.cat(parts) if len(parts) > 1 else parts[0]
        return QuantLinear(BlockedQuantWeight.from_rows(rows), bias, splits)
    weight = torch.cat(parts) if len(parts) > 1 else parts[0]
    if weight.dtype != torch.float32:
        return Float16Linear(weight, bias, splits)
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    linear.weight = nn.Parameter(weight, False)
    if bias is not None:
        linear.bias = nn.Parameter(bias.float(), False)
    linear.out_splits = splits
    return linear


def _set_linears(owner: nn.Module, fused_name: str, hf_names: tuple[str, ...],
                 parts: list, names: list[str], biases: list) -> None:
    """One fused linear when the parts share a form, else one per part under its Hugging
    Face name (a Q4_K_M file keeps attn_v in Q8_0 next to Q5_0 q and k: the model runs them
    one by one, without the CPU's one-call layer stack). Block parts that differ only in their
    integers' width are widened to 8 bits first (int4_format.widened: the same values), so a Q5_0
    q / k and a Q8_0 v still make one fused linear and the model keeps the one-call stack (Q2_K
    next to Q3_K: signed 3-bit with offsets)."""
    if not _same_form(parts) and all(isinstance(p, GroupedRows) for p in parts):
        parts = widened(parts) or parts
    if _same_form(parts):
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
        q, k = _permuted(q, rope_order(heads * d, heads)), _permuted(k, rope_order(kv_heads * d, kv_heads))
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
    _norms(tensors, cfg, p, layer)


# the file's norm of each of the layer's RMSNorms: Llama's pre-MLP norm is Hugging Face's
# post_attention_layernorm; with Gemma 3's sandwich norms that name is the norm after attention
_LLAMA_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_SANDWICH_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                   "pre_feedforward_layernorm": "ffn_norm",
                   "post_feedforward_layernorm": "post_ffw_norm"}


def _norms(tensors: _Tensors, cfg: ModelConfig, p: str, layer: nn.Module) -> None:
    offset, h = cfg.norm_unit_offset, cfg.hidden_size
    for hf, name in (_SANDWICH_NORMS if cfg.sandwich_norms else _LLAMA_NORMS).items():
        getattr(layer, hf).weight = tensors.norm(p + name + ".weight", h, offset)
    attn = layer.self_attn
    if attn.q_norm is not None:  # Qwen3, Gemma 3: over each head's head_dim
        attn.q_norm.weight = tensors.norm(p + "attn_q_norm.weight", cfg.head_dim, offset)
        attn.k_norm.weight = tensors.norm(p + "attn_k_norm.weight", cfg.head_dim, offset)


def _head_and_embedding(tensors: _Tensors, cfg: ModelConfig, model: nn.Module) -> None:
    shape = (cfg.vocab_size, cfg.hidden_size)
    tied = not tensors.has("output.weight")
    if tensors.type_name("token_embd.weight") == "F32":
        embed = tensors.floats("token_embd.weight").view(shape)
        model.model.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        head = None
    else:  # blocks or 16-bit floats: the embedding reads the head's rows
        head = _linear([tensors.rows("token_embd.weight", shape)], ["token_embd.weight"], None)
        model.model.embed_tokens = QuantEmbedding(head, owns=not tied)
    if not tied:
        if tensors.type_name("output.weight") == "F32":
            model.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            model.lm_head.weight = nn.Parameter(tensors.floats("output.weight").view(shape), False)
        else:
            model.lm_head = _linear([tensors.rows("output.weight", shape)], ["output.weight"], None)
    elif head is not None:
        model.lm_head = head
    else:
        model.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        model.lm_head.weight = model.model.embed_tokens.weight


def planned_weight_bytes(gguf_path: Path, float_bytes: int = 4) -> int:
    """The bytes `build_gguf_model` + `place` will hold for this file, from its tensor table alone
    (plan and the budgets): blocked integers and parameters per fused linear, 16-bit matrices in
    16 bits, biases in float32 (the linears keep them so), other float tensors (norms, float32
    matrices) at `float_bytes` (the activation dtype's: 4 on the CPU back end, 2 for fp16 on
    CUDA). A type the loader refuses counts as floats too (it is refused at load, with its name)."""
    groups: dict[str, list] = {}
    total = 0
    for info in GGUFTensors(gguf_path).infos.values():
        if len(info.shape) == 2 and info.type_name in _HALF_TYPES:
            total += 2 * int(np.prod(info.shape))
            continue
        if info.type_name not in RUNTIME_FORM or len(info.shape) != 2:
            per = 4 if info.name.endswith(".bias") else float_bytes
            total += per * int(np.prod(info.shape))
            continue
        parts = info.name.split(".")
        key = ".".join(_FUSED.get(p, p) for p in parts)
        groups.setdefault(key, []).append(info)
    for infos in groups.values():
        forms = [RUNTIME_FORM[i.type_name] for i in infos]
        if len(set(forms)) == 1:
            parts = [(infos, forms[0])]
        elif len({f[1:4] for f in forms}) == 1:  # widened to 8 bits and fused (_set_linears)
            parts = [(infos, (8, *forms[0][1:5], False))]
        elif {f[0] for f in forms} <= {2, 3} and len({f[1] for f in forms}) == 1:
            parts = [(infos, (3, forms[0][1], 1, True, True, False))]  # int4_format.as_signed3
        else:  # not fused: one weight each
            parts = [([i], f) for i, f in zip(infos, forms)]
        for part, (bits, group, param_bytes, offsets, _, codebook) in parts:
            total += blocked_nbytes(bits, sum(i.shape[0] for i in part), part[0].shape[1],
                                    group, param_bytes, offsets, codebook)
    return total


def _form_name(type_name: str) -> str:
    if type_name in _HALF_TYPES:
        return f"{type_name.lower()} (16-bit)"
    if type_name not in RUNTIME_FORM:
        return "float32"
    bits, group, param_bytes, offsets, signed, codebook = RUNTIME_FORM[type_name]
    params = {0.5: "uint4 x fp16/256", 1: "int8 x fp16/256", 2: "fp16", 4: "fp32"}[param_bytes]
    book = " codebook" if codebook else ""
    return f"{'s' if signed else ''}int{bits}{book} g{group} {params}{' +offset' if offsets else ''}"


def _kernel_form(type_name: str) -> str:
    """int2 ... int8, with "codebook" and "two-level" where the kernel reads them."""
    bits, _, param_bytes, _, _, codebook = RUNTIME_FORM[type_name]
    return (f"int{bits}{' codebook' if codebook else ''}"
            f"{' two-level parameters' if param_bytes < 2 else ''}")


def _kernel_name(type_name: str, name: str, backend: str) -> str:
    """What computes with a tensor of `type_name` on `backend` (the loader's modules' choice)."""
    if name.endswith(("norm.weight", ".bias")):
        return "float32 parameter" if backend == "cpu" else "parameter in the activation dtype"
    if type_name in _HALF_TYPES:
        kernel = ("Float16Linear: float32 BLAS tiles widened per call (no fast kernel yet)"
                  if backend == "cpu" else "Float16Linear: torch matmul in the activation dtype")
    elif type_name not in RUNTIME_FORM:
        kernel = "torch linear"
    elif backend == "cpu":
        kernel = (f"linear_int4.c {_kernel_form(type_name)} (prefill from 32 rows: "
                  "dequantized tiles + BLAS)")
    else:
        kernel = f"blocked_w4a16 Triton W{RUNTIME_FORM[type_name][0]}A16 {_kernel_form(type_name)}"
    return kernel + ("; the embedding looks its rows up" if name == "token_embd.weight" else "")


def tensor_kernels(gguf_path: Path, backend: str) -> list[dict]:
    """Per tensor of the file: its GGUF type, the runtime form it is held in and the kernel that
    computes with it on `backend` ("cpu" or "cuda"), for `plan`. A type the loader refuses says so."""
    rows = []
    for info in GGUFTensors(gguf_path).infos.values():
        served = info.type_name in SUPPORTED or info.type_name in _FLOAT_TYPES
        rows.append({"tensor": info.name, "type": info.type_name,
                     "form": _form_name(info.type_name) if served else "not served",
                     "kernel": _kernel_name(info.type_name, info.name, backend) if served
                     else "refused at load"})
    return rows


def _stderr_bar(total: int):
    from tqdm import tqdm

    return tqdm(total=total, desc="loading 4-bit weights", unit="layer", file=sys.stderr,
                leave=False)


def build_gguf_model(gguf_path: Path, config: ModelConfig, arch: str,
                     progress: Callable[[str], None] | None = None):
    """A CausalLM on the CPU with the GGUF's quantized blocks; returns (model, quantization)."""
    tensors = _Tensors(gguf_path)
    check_served(tensors.file)
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
    model.model.norm.weight = tensors.norm("output_norm.weight", config.hidden_size,
                                           config.norm_unit_offset)
    quantization = tensors.quantization()
    del tensors  # the memory map: every byte kept is in the modules now
    model.model.build_rotary(config, "cpu", FULL_ROPE_TABLE)  # Gemma 3's local layers' too
    model.eval()
    model.linears_packed = sum(isinstance(m, (QuantLinear, Float16Linear)) for m in model.modules())
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
    check_supported(source)  # every supported architecture is built from its blocks here
    if weights == "gguf" or str(device) != "cpu":
        return True

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
