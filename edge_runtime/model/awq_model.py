"""AWQ checkpoints <-> models: the loader hook and the checkpoint writer.

Reading (`quantize_linears_from_checkpoint`, called by edge_runtime.model.loader.build_model on a
model built on the meta device, BEFORE the float weights are assigned):
- every `<path>.qweight` in the state dict turns the nn.Linear at `<path>` into a `QuantLinear` on
  the runtime's blocked int4 format (model/awq_blocked.py, exact; q/k/v and gate/up fused), or,
  with another AWQ backend, an `AWQLinear`; its qweight/qzeros/scales(/bias) are popped from the
  state dict (consumed). Both keep their tensors as non-persistent buffers, so the loader's
  "expected keys" do not list them.
- the token embedding and LM head are stored in fp16 (quant/half_embed.py): their state-dict
  tensors are converted to fp16 in place so the loader's `assign=True` keeps that dtype, and a
  tied head shares the embedding's fp16 tensor after the loader's `tie_weights()`.

Writing (`save_awq_checkpoint`): AutoAWQ's layout: one model.safetensors with fp16 float tensors
plus `<path>.qweight/.qzeros/.scales` (and `.bias`) per quantized linear, config.json with
`quantization_config = {quant_method: awq, bits: 4, group_size, zero_point: true, version: gemm}`,
and the source folder's tokenizer/generation files.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from torch import nn

from edge_runtime import env
from edge_runtime.errors import ModelLoadError
from edge_runtime.model.awq_blocked import awq_quant_linear, fuse_layers
from edge_runtime.model.awq_linear import BACKENDS, AWQLinear
from edge_runtime.quant.half_embed import HalfEmbedding, HalfLinear, set_module

LOAD_BACKENDS = (*BACKENDS, "blocked")  # "auto" loads "blocked"
_SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
               "merges.txt", "tokenizer.model", "generation_config.json", "chat_template.jinja",
               "added_tokens.json")


def awq_quant_config(group_size: int) -> dict:
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True,
            "version": "gemm", "modules_to_not_convert": None}


def _config_int(quant_config: dict, key: str, legacy: str, default: int, usual: str) -> int:
    value = quant_config.get(key, quant_config.get(legacy, default))
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ModelLoadError(f"config.json: quantization_config.{key} must be a positive integer "
                             f"({usual}), got {value!r}")
    return value


def awq_group_size(quant_config: dict) -> int:
    """group_size, or AutoAWQ's legacy q_group_size; 128 when neither is given."""
    return _config_int(quant_config, "group_size", "q_group_size", 128,
                       "the AWQ group size is usually 128 or 64")


def _check_config(quant_config: dict) -> int:
    bits = _config_int(quant_config, "bits", "w_bit", 4, "AWQ GEMM checkpoints use 4")
    group_size = awq_group_size(quant_config)
    version = str(quant_config.get("version", "gemm")).lower()
    zero_point = quant_config.get("zero_point", True)
    if not isinstance(zero_point, bool):  # the string "false" would read as true
        raise ModelLoadError(f"config.json: quantization_config.zero_point must be true or false "
                             f"(a JSON boolean), got {zero_point!r}")
    if bits != 4 or version != "gemm" or not zero_point:
        raise ModelLoadError(
            f"AWQ checkpoint with bits={bits}, version={version!r}, zero_point="
            f"{quant_config.get('zero_point')} is not supported: only 4-bit GEMM with zero points")
    return group_size


def _pop_tensor(state: dict, name: str) -> torch.Tensor:
    if name not in state:
        raise ModelLoadError(f"AWQ checkpoint has {name.rsplit('.', 1)[0]}.qweight but no {name}: "
                             "the checkpoint is incomplete; re-export or re-download it")
    return state.pop(name)


def _check_shape(name: str, tensor: torch.Tensor, expect: tuple, what: str) -> None:
    if tuple(tensor.shape) != expect:
        raise ModelLoadError(f"{name} has shape {tuple(tensor.shape)}, expected {expect} {what}")


def _check_groups(path: str, old: nn.Linear, scales: torch.Tensor, group_size: int) -> None:
    """The checkpoint's scales must have one row per group of quantization_config.group_size."""
    groups = old.in_features // group_size
    if old.in_features % group_size == 0 and tuple(scales.shape) == (groups, old.out_features):
        return
    rows = scales.shape[0] if scales.dim() == 2 else 0
    implied = (f"; its scales {tuple(scales.shape)} imply group_size {old.in_features // rows}"
               if rows and old.in_features % rows == 0 else "")
    raise ModelLoadError(
        f"{path}: quantization_config.group_size {group_size} does not fit this checkpoint "
        f"({old.in_features}->{old.out_features} linear, expected scales "
        f"({old.in_features / group_size:g}, {old.out_features}){implied}): "
        "set group_size to the one the checkpoint was quantized with")


def _check_dtypes(path: str, qweight, qzeros, scales, bias) -> None:
    """AutoAWQ GEMM layout: int32 qweight/qzeros (8 nibbles each), floating scales and bias."""
    for name, tensor, ok, expect in (("qweight", qweight, qweight.dtype == torch.int32, "int32"),
                                     ("qzeros", qzeros, qzeros.dtype == torch.int32, "int32"),
                                     ("scales", scales, scales.is_floating_point(), "floating point"),
                                     ("bias", bias, bias is None or bias.is_floating_point(),
                                      "floating point")):
        if not ok:
            raise ModelLoadError(f"{path}.{name} must be {expect}, got {str(tensor.dtype)[6:]}: "
                                 "the checkpoint is not an AutoAWQ GEMM checkpoint; re-export it")


def _make_awq_linear(model: nn.Module, path: str, state: dict, group_size: int,
                     backend: str) -> None:
    """backend "blocked": a QuantLinear (model/awq_blocked.py); else an AWQLinear with it."""
    try:
        old = model.get_submodule(path)
    except AttributeError as exc:
        raise ModelLoadError(f"AWQ checkpoint quantizes {path}, which this model does not have") from exc
    if not isinstance(old, nn.Linear):
        raise ModelLoadError(f"AWQ checkpoint quantizes {path}, which is not a linear layer")
    qweight = state.pop(f"{path}.qweight")
    qzeros, scales = _pop_tensor(state, f"{path}.qzeros"), _pop_tensor(state, f"{path}.scales")
    bias = state.pop(f"{path}.bias", None)
    what = f"for a {old.in_features}->{old.out_features} linear"
    if old.out_features % 8:
        raise ModelLoadError(f"{path}: out_features {old.out_features} (config.json) is not a multiple "
                             "of 8, which an AWQ linear packs 8 to an int32: the checkpoint does not "
                             "match config.json")
    if bias is not None and old.bias is None:
        raise ModelLoadError(f"checkpoint has unexpected weights, e.g. {path}.bias (config.json "
                             "gives this layer no bias, e.g. attention_bias false)")
    _check_dtypes(path, qweight, qzeros, scales, bias)
    _check_shape(f"{path}.qweight", qweight, (old.in_features, old.out_features // 8), what)
    _check_groups(path, old, scales, group_size)
    groups = old.in_features // group_size
    _check_shape(f"{path}.qzeros", qzeros, (groups, old.out_features // 8),
                 f"{what} with group_size {group_size}; the checkpoint is corrupt: re-export it")
    if bias is not None:
        _check_shape(f"{path}.bias", bias, (old.out_features,), what)
    if backend == "blocked":
        new = awq_quant_linear(qweight, qzeros, scales.to(torch.float16), group_size, bias)
    else:
        new = AWQLinear.from_tensors(qweight, qzeros, scales.to(torch.float16), group_size, bias,
                                     backend)
    set_module(model, path, new)


def _halve_embeddings(model: nn.Module, state: dict) -> None:
    key = "model.embed_tokens.weight"
    embed = model.get_submodule("model.embed_tokens")
    for name in (key, "lm_head.weight"):
        if name in state and not state[name].is_floating_point():
            raise ModelLoadError(f"{name} must be floating point, got {str(state[name].dtype)[6:]}: "
                                 "AWQ checkpoints keep the embeddings in float16; re-export it")
    if key in state and isinstance(embed, nn.Embedding):
        # the loader's shape check never sees this tensor again: check it here
        _check_shape(key, state[key], tuple(embed.weight.shape),
                     "(vocab_size, hidden_size) from config.json: the checkpoint does not match it")
        out_dtype = state[key].dtype
        state[key] = state[key].to(torch.float16)
        set_module(model, "model.embed_tokens", HalfEmbedding(state[key], out_dtype))
    head = getattr(model, "lm_head", None)
    if isinstance(head, nn.Linear):
        if "lm_head.weight" in state:
            _check_shape("lm_head.weight", state["lm_head.weight"], tuple(head.weight.shape),
                         "(vocab_size, hidden_size) from config.json: the checkpoint does not match it")
            state["lm_head.weight"] = state["lm_head.weight"].to(torch.float16)
            weight = state["lm_head.weight"]
        else:  # tied: the loader assigns the embedding's fp16 weight in tie_weights()
            weight = torch.empty(head.weight.shape, dtype=torch.float16, device="meta")
        set_module(model, "lm_head", HalfLinear(weight, None if head.bias is None else head.bias))


def quantize_linears_from_checkpoint(model: nn.Module, state: dict, quant_config: dict,
                                     backend: str | None = None, half_embeddings: bool = True
                                     ) -> list[str]:
    """Swap nn.Linear -> a quantized linear for every `<path>.qweight` in `state` (consumed);
    returns paths.

    backend: default from $EDGE_RUNTIME_AWQ_BACKEND (edge_runtime/env.py), else "auto", which is
    "blocked": QuantLinear on the runtime's blocked format (model/awq_blocked.py; both back ends,
    q/k/v and gate/up fused). The others keep AWQLinear's own paths (model/awq_linear.py), for
    comparison: `reference` (exact, slow), `cpu-int4pack` (torch's bf16 op), `awq-gemm` (the
    tuned prepared-layout Triton kernel, docs/perf-gpu.md).
    """
    backend = backend or env.awq_backend(LOAD_BACKENDS)
    if backend not in LOAD_BACKENDS:
        raise ModelLoadError(f"AWQ backend {backend!r} is not one of {', '.join(LOAD_BACKENDS)}")
    backend = "blocked" if backend == "auto" else backend
    group_size = _check_config(quant_config)
    paths = sorted(k[: -len(".qweight")] for k in state if k.endswith(".qweight"))
    if not paths:
        raise ModelLoadError("config.json says AWQ but the checkpoint has no *.qweight tensors")
    for path in paths:
        _make_awq_linear(model, path, state, group_size, backend)
    if backend == "blocked":
        fuse_layers(model)
    if half_embeddings:
        _halve_embeddings(model, state)
    return paths


def save_awq_checkpoint(out_dir: Path, model: nn.Module, awq_tensors: dict, source_folder: Path,
                        group_size: int, tie_word_embeddings: bool) -> Path:
    """Write an AutoAWQ GEMM checkpoint folder; returns the safetensors path.

    Atomic: the files are written into a hidden sibling folder that is renamed to `out_dir` only
    once complete (replacing `out_dir` if it is an empty folder), so an interrupted or failed write
    never leaves a half-written folder at `out_dir` that would later load as a checkpoint.
    """
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        _write_checkpoint(staging, model, awq_tensors, source_folder, group_size,
                          tie_word_embeddings)
        _apply_umask(staging)
        os.rename(staging, out_dir)
    except BaseException:  # KeyboardInterrupt too: never leave the partial folder behind
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "model.safetensors"


def _apply_umask(folder: Path) -> None:
    """Modes as mkdir/open would give them: mkdtemp makes the folder 0700 and safetensors (0.8)
    writes model.safetensors 0600, which a service running as another user cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def _write_checkpoint(out_dir: Path, model: nn.Module, awq_tensors: dict, source_folder: Path,
                      group_size: int, tie_word_embeddings: bool) -> None:
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    skip = {f"{p}.weight" for p in awq_tensors} | {f"{p}.bias" for p in awq_tensors}
    if tie_word_embeddings:
        skip.add("lm_head.weight")
    for name, t in model.state_dict().items():
        if name not in skip and "rotary_emb" not in name:
            tensors[name] = t.detach().to(torch.float16).contiguous()
    for path, (qweight, qzeros, scales, bias) in awq_tensors.items():
        tensors[f"{path}.qweight"] = qweight.contiguous()
        tensors[f"{path}.qzeros"] = qzeros.contiguous()
        tensors[f"{path}.scales"] = scales.to(torch.float16).contiguous()
        if bias is not None:
            tensors[f"{path}.bias"] = bias.to(torch.float16).contiguous()
    weights = out_dir / "model.safetensors"
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((source_folder / "config.json").read_text())
    config["quantization_config"] = awq_quant_config(group_size)
    config["torch_dtype"] = "float16"
    if "dtype" in config:  # transformers >= 5 spelling
        config["dtype"] = "float16"
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in _SIDE_FILES:
        if (source_folder / name).is_file():
            shutil.copyfile(source_folder / name, out_dir / name)
