"""`load_model(name_or_path)`: a HF folder, a .gguf file or a built-in name -> `LoadedModel`.

What a name or path refers to is model_names.py's (`model_path`: the built-in name
`DEFAULT_MODEL`, a path, a name in the models folder); a .gguf file is converted once into the
cache (gguf_convert.py), a folder must hold config.json.
Everything a user can get wrong raises `ModelLoadError` with one actionable sentence.

Invariants:
- The model is built on the meta device and its parameters are assigned from the checkpoint, so no
  random initialisation runs and every parameter comes from the file (missing ones are an error).
- `weight_bytes` counts each parameter and buffer storage once (tied embeddings once).
- AWQ checkpoints (quantization_config.quant_method == "awq") go through
  `edge_runtime.model.awq_model.quantize_linears_from_checkpoint`, which swaps nn.Linear modules by
  path and consumes their qweight/qzeros/scales from the state dict.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from edge_runtime.errors import ModelLoadError
from edge_runtime.model.config import ModelConfig
from edge_runtime.model.family_chat import complete_chat
from edge_runtime.model.llama import FULL_ROPE_TABLE, CausalLM
from edge_runtime.model.meta_init import no_weight_init
# DEFAULT_MODEL: commands import it from here with the loader they use
from edge_runtime.model.model_names import DEFAULT_MODEL, gguf_path, model_path  # noqa: F401
from edge_runtime.model.gguf_convert import ensure_converted, gguf_architecture
from edge_runtime.model.gguf_int4 import build_gguf_model, place, serve_from_blocks
from edge_runtime.model.safetensors_io import load_state_dict

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")
_GENERIC_TOKENIZERS = ("TokenizersBackend", "PreTrainedTokenizerFast")


@dataclass
class LoadedModel:
    config: ModelConfig
    model: CausalLM
    tokenizer: Any  # a transformers tokenizer
    path: Path  # the folder actually loaded
    weight_bytes: int
    quantization: str  # "none" | "awq-g128" | "awq-g64" ...


def _stderr(msg: str) -> None:
    print(f"edge-runtime: {msg}", file=sys.stderr, flush=True)


def gguf_source(name_or_path: str) -> Path | None:
    """The .gguf file behind `name_or_path` (the built-in name, a models-folder name or a .gguf
    path; model_names.py), else None."""
    return gguf_path(name_or_path)


def resolve_model_folder(name_or_path: str, progress: Callable[[str], None] | None = _stderr) -> Path:
    """The HF folder of `name_or_path`'s config and tokenizer. For a GGUF: a cached folder with its
    config and tokenizer only (the weights are read from the GGUF, model/gguf_int4.py); for the
    float32 weights as a folder see `fp32_folder`."""
    return _resolve(name_or_path, progress, weights=False)


def fp32_folder(name_or_path: str, progress: Callable[[str], None] | None = _stderr) -> Path:
    """The HF folder with weights: a GGUF converted once into a float32 folder (the reference
    `--weights fp32` path), or the folder itself."""
    return _resolve(name_or_path, progress, weights=True)


def _resolve(name_or_path: str, progress: Callable[[str], None] | None, weights: bool) -> Path:
    path = model_path(name_or_path)
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise ModelLoadError(f"{path} is a file but not a .gguf; give a .gguf file or a HF folder")
        return ensure_converted(path, progress, weights)
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path} has no config.json: it is not a Hugging Face model folder")
    return path


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot parse {path}: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelLoadError(f"{path} must be a JSON object of fields, got a {type(value).__name__}; "
                             "re-export the model folder")
    return value


def load_tokenizer(folder: Path):
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise ModelLoadError(
            f"no tokenizer in {folder} (expected one of {', '.join(_TOKENIZER_FILES)})"
        )
    # AutoTokenizer imports transformers' whole auto-config machinery (~3 s of start-up); when the
    # folder asks for the generic tokenizers-backed class anyway, load that class directly.
    cfg_path = folder / "tokenizer_config.json"
    tok_class = _read_json(cfg_path).get("tokenizer_class") if cfg_path.is_file() else None
    if tok_class in _GENERIC_TOKENIZERS and (folder / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast as tokenizer_cls
    else:
        from transformers import AutoTokenizer as tokenizer_cls
    try:
        return tokenizer_cls.from_pretrained(str(folder))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # a tokenizer.json of the wrong shape ([] for {...}) fails inside the tokenizers library
        raise ModelLoadError(f"cannot load the tokenizer in {folder} (tokenizer.json, "
                             f"tokenizer_config.json): {_one_line(exc)}; re-export the tokenizer "
                             "files") from exc


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _apply_awq(model: CausalLM, state: dict, quant_config: dict, backend: str | None = None) -> str:
    try:
        # start-up time: its layers load the C kernels
        from edge_runtime.model.awq_model import awq_group_size, quantize_linears_from_checkpoint
    except ImportError as exc:
        raise ModelLoadError("AWQ support not installed (edge_runtime.model.awq_model is missing)") from exc
    if backend is None:  # AWQLinear's default choice (model/awq_model.py)
        quantize_linears_from_checkpoint(model, state, quant_config)
    else:
        quantize_linears_from_checkpoint(model, state, quant_config, backend=backend)
    return f"awq-g{awq_group_size(quant_config)}"


_SHAPE_KEYS = (  # tensor name part -> the config.json keys that decide its shape
    (("embed_tokens", "lm_head"), "vocab_size, hidden_size"),
    (("q_norm", "k_norm"), "head_dim"),
    (("q_proj",), "num_attention_heads, head_dim, hidden_size"),
    (("k_proj", "v_proj"), "num_key_value_heads, head_dim, hidden_size"),
    (("o_proj",), "hidden_size, num_attention_heads, head_dim"),
    (("gate_proj", "up_proj", "down_proj"), "intermediate_size, hidden_size"),
    (("norm",), "hidden_size"),
)


def _shape_keys(name: str) -> str:
    for parts, keys in _SHAPE_KEYS:
        if any(part in name for part in parts):
            return keys
    return "the model's dimensions"


def _check_shapes_and_dtypes(model_state: dict[str, torch.Tensor], state: dict[str, torch.Tensor],
                             names: set[str]) -> None:
    """One line for the first wrong tensor; torch's load_state_dict prints one per tensor."""
    for name in sorted(names):
        want, got = model_state[name], state[name]
        if want.is_floating_point() and not got.is_floating_point():
            dtype = str(got.dtype).removeprefix("torch.")
            raise ModelLoadError(f"{name} has dtype {dtype}; a float checkpoint needs "
                                 "float32/float16/bfloat16 weights")
    wrong = [n for n in sorted(names) if state[n].shape != model_state[n].shape]
    if wrong:
        name, more = wrong[0], f" (and {len(wrong) - 1} more)" if len(wrong) > 1 else ""
        raise ModelLoadError(
            f"checkpoint does not match config.json: {name} has shape {list(state[name].shape)}, "
            f"config.json ({_shape_keys(name)}) expects {list(model_state[name].shape)}{more}")


def build_model(config: ModelConfig, state: dict[str, torch.Tensor], quant_config: dict | None,
                device: str | torch.device = "cpu", awq_backend: str | None = None
                ) -> tuple[CausalLM, str]:
    """A CausalLM whose parameters are exactly the tensors of `state` (consumed). awq_backend:
    AWQLinear's backend (None: the default, model/awq_model.py)."""
    with torch.device("meta"), no_weight_init():
        model = CausalLM(config)
    quantization = "none"
    if quant_config is not None and not isinstance(quant_config, dict):
        raise ModelLoadError(
            f"config.json: quantization_config must be a JSON object such as "
            f'{{"quant_method": "awq", "bits": 4, "group_size": 128}}, got {quant_config!r}'
        )
    if quant_config:
        method = quant_config.get("quant_method")
        if method != "awq":
            raise ModelLoadError(f"quantization method {method!r} is not supported (only awq)")
        quantization = _apply_awq(model, state, quant_config, awq_backend)
    elif any(k.endswith(".qweight") for k in state):
        raise ModelLoadError(
            "the checkpoint holds AWQ tensors (*.qweight) but config.json has no quantization_config;"
            ' add one such as {"quant_method": "awq", "bits": 4, "group_size": 128, "version": '
            '"gemm", "zero_point": true} (older AutoAWQ exports keep it in quant_config.json)')
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    expected = set(model.state_dict().keys())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing = sorted(expected - set(state))
    if missing:
        raise ModelLoadError(
            f"checkpoint is missing {len(missing)} weights, e.g. {', '.join(missing[:3])}"
        )
    unexpected = sorted(k for k in set(state) - expected if "rotary_emb" not in k)
    if unexpected:
        raise ModelLoadError(f"checkpoint has unexpected weights, e.g. {', '.join(unexpected[:3])}")
    _check_shapes_and_dtypes(model.state_dict(), state, expected)
    try:
        model.load_state_dict({k: state[k] for k in expected}, strict=False, assign=True)
    except RuntimeError as exc:
        raise ModelLoadError(f"checkpoint does not match config.json: {exc}") from exc
    model.tie_weights()
    model.model.build_rotary(config, device, FULL_ROPE_TABLE)  # rope tables on the target device
    model.eval()
    return model, quantization


def weight_bytes_of(model: torch.nn.Module) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        key = (t.untyped_storage().data_ptr(), t.device.type)
        if key in seen:
            continue
        seen.add(key)
        total += t.untyped_storage().nbytes()
    return total


def check_device(device: str | torch.device) -> None:
    """Refuse a device this machine lacks before any work (safetensors would report it as a
    corrupt file: "pin_memory=True requires a CUDA...")."""
    name = str(device)
    kind, _, index = name.partition(":")
    if kind == "cpu" and not index:
        return
    if kind != "cuda" or (index and not index.isdigit()):
        raise ModelLoadError(f"unknown device {name!r}; use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise ModelLoadError(f"device {name} is not available here (no CUDA device); use --device cpu")
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        raise ModelLoadError(f"device {name} is not available here (this machine has {count} CUDA "
                             f"device{'s' if count != 1 else ''}: cuda:0..cuda:{count - 1})")


def read_model_config(folder: Path) -> ModelConfig:
    """The model's config from its folder's config.json (+ generation_config.json), no weights:
    what plan, the service's budget check and the bench's context checks need."""
    return _model_config(folder, _read_json(folder / "config.json"))


def _model_config(folder: Path, cfg_dict: dict) -> ModelConfig:
    gen_path = folder / "generation_config.json"
    return ModelConfig.from_hf(cfg_dict, _read_json(gen_path) if gen_path.is_file() else None)


def _load_from_blocks(source: Path, progress: Callable[[str], None] | None,
                      dtype: torch.dtype = torch.float32, device: str = "cpu"):
    """The LoadedModel of a GGUF served from its blocks (config and tokenizer from the cache),
    on `device` with `dtype` activations (gguf_int4.place)."""
    folder = resolve_model_folder(str(source), progress)
    config = read_model_config(folder)
    tokenizer = load_tokenizer(folder)
    config = complete_chat(config, tokenizer)
    model, quantization = build_gguf_model(source, config, gguf_architecture(source), progress)
    place(model, dtype, device)
    return LoadedModel(config=config, model=model, tokenizer=tokenizer, path=folder,
                       weight_bytes=weight_bytes_of(model), quantization=quantization)


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32, device: str = "cpu",
               progress: Callable[[str], None] | None = _stderr,
               awq_backend: str | None = None, weights: str = "auto") -> LoadedModel:
    """weights (GGUF models): "gguf" serves the file's quantized blocks, "fp32" its float
    conversion (the reference; in `dtype`), "auto" the blocks where the CPU kernels can
    (model/gguf_int4.py, `serve_from_blocks`). The back end's choice is placement.load_for's."""
    check_device(device)
    source = gguf_source(name_or_path)
    if serve_from_blocks(weights, source, dtype, device):
        return _load_from_blocks(source, progress, dtype, device)
    folder = fp32_folder(name_or_path, progress)
    cfg_dict = _read_json(folder / "config.json")
    config = _model_config(folder, cfg_dict)
    tokenizer = load_tokenizer(folder)
    config = complete_chat(config, tokenizer)
    state = load_state_dict(folder, dtype, device)
    model, quantization = build_model(config, state, cfg_dict.get("quantization_config"), device,
                                      awq_backend)
    return LoadedModel(config=config, model=model, tokenizer=tokenizer, path=folder,
                       weight_bytes=weight_bytes_of(model), quantization=quantization)
