"""What a model file or folder is, read from its headers only (no tensor data, no conversion):
architecture, parameter count, the block types (GGUF) or dtypes (safetensors) of its tensors, and
its bytes on disk. For `edge-runtime models`.

Invariants: a GGUF's parameters are the elements of every tensor in its table; its block types
count tensors per GGUF type. A folder's parameters and dtypes come from its safetensors headers
(the loader's own checks); its bytes are its weight files'. Anything unreadable is a
ModelLoadError naming the file and what to do.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from edge_runtime.errors import ModelLoadError
from edge_runtime.model.gguf_convert import gguf_architecture
from edge_runtime.model.gguf_tensors import read_table
from edge_runtime.model.safetensors_io import tensor_specs, weight_files


@dataclass(frozen=True)
class ModelInfo:
    format: str  # "gguf" | "safetensors"
    architecture: str  # GGUF general.architecture, or config.json's architectures[0]
    parameters: int
    block_types: dict[str, int]  # GGUF type (Q4_K, F32...) or safetensors dtype -> tensor count
    file_bytes: int


def describe_model(path: Path) -> ModelInfo:
    """The info of a .gguf file or a Hugging Face folder (model_names.model_path's result)."""
    if path.is_dir():
        return _describe_folder(path)
    if path.suffix.lower() != ".gguf":
        raise ModelLoadError(f"{path} is a file but not a .gguf; give a .gguf file or a HF folder")
    return _describe_gguf(path)


def _describe_gguf(path: Path) -> ModelInfo:
    try:
        size = path.stat().st_size
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path} ({exc.strerror}); check its permissions") from exc
    arch = gguf_architecture(path)
    infos, _ = read_table(path)
    kinds = Counter(i.type_name for i in infos.values())
    return ModelInfo("gguf", arch, sum(math.prod(i.shape) for i in infos.values()),
                     dict(kinds.most_common()), size)


def _describe_folder(folder: Path) -> ModelInfo:
    config_path = folder / "config.json"
    try:
        config = json.loads(config_path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot read {config_path} ({exc}); is {folder} a Hugging Face "
                             "model folder?") from exc
    if not isinstance(config, dict):
        raise ModelLoadError(f"{config_path} must be a JSON object of fields; re-export the folder")
    names = config.get("architectures") or [config.get("model_type", "unknown")]
    files = weight_files(folder)
    params, kinds = 0, Counter()
    for file in files:
        for dtype, shape in tensor_specs(file).values():
            params += math.prod(shape)
            kinds[dtype] += 1
    return ModelInfo("safetensors", str(names[0]), params, dict(kinds.most_common()),
                     sum(f.stat().st_size for f in files))
