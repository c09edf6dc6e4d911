"""The bytes of weights a model will hold, read without loading it (config.json, safetensors
headers, GGUF tensor infos), and `model_for_plan`: what the memory plan needs of a model.

Used by `edge-runtime plan`, `simulate` and the service unit's limit check
(service/unit_limits.py); a reference shape name (edge_runtime.plan.REFERENCE_MODELS) needs no
files at all.
"""

from __future__ import annotations

import math
from pathlib import Path

_FLOAT_DTYPES = {"F16", "BF16", "F32", "F64"}
_DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "U32": 4, "I16": 2,
               "I8": 1, "U8": 1, "BOOL": 1}


def safetensors_weight_bytes(files: list[Path], float_bytes: int) -> int:
    """Bytes of the weights in memory: float tensors at `float_bytes` per element, integer
    (packed/quantized) tensors as stored. Reads only the headers, checked as the loader does."""
    from edge_runtime.model.safetensors_io import tensor_specs

    total = 0
    for path in files:
        for dtype, shape in tensor_specs(path).values():
            numel = 1
            for d in shape:
                numel *= d
            size = float_bytes if dtype in _FLOAT_DTYPES else _DTYPE_SIZE.get(dtype, 1)
            total += numel * size
    return total


def gguf_blocks_served(source: Path | None, weights: str, weight_dtype: str, device: str) -> bool:
    """Whether loading `source` with `weights` on `device` serves its own blocks (the loader's
    rule; planning needs no GPU: a cuda device is not opened)."""
    import torch

    from edge_runtime.engine.placement import TORCH_DTYPES
    from edge_runtime.model.gguf_int4 import serve_from_blocks

    return serve_from_blocks(weights, source, getattr(torch, TORCH_DTYPES[weight_dtype]), device)


def gguf_weight_bytes(source: Path, blocks: bool, float_bytes: int) -> int:
    from edge_runtime.model.gguf_int4 import planned_weight_bytes
    from edge_runtime.model.gguf_tensors import GGUFTensors

    if blocks:
        return planned_weight_bytes(source, float_bytes)
    return sum(float_bytes * math.prod(i.shape) for i in GGUFTensors(source).infos.values())


def model_for_plan(name: str, weight_dtype: str, weights: str = "auto", device: str = "cpu"):
    """(model config or shape, weight bytes, display name). A GGUF model counts what serving it
    on `device` with `weight_dtype` activations holds (the loader's own choice,
    gguf_int4.serve_from_blocks): its blocks in the runtime's int4/int8 form with float tensors at
    `weight_dtype` (model/gguf_int4.py), or its float conversion, every tensor at `weight_dtype`;
    neither converts the file."""
    from edge_runtime.plan import DTYPE_BYTES, REFERENCE_MODELS, estimate_weight_bytes

    if name in REFERENCE_MODELS:
        shape = REFERENCE_MODELS[name]
        return shape, estimate_weight_bytes(shape, weight_dtype), f"{name} (reference shape)"
    from edge_runtime.model.loader import gguf_source, read_model_config, resolve_model_folder
    from edge_runtime.model.safetensors_io import weight_files

    folder = resolve_model_folder(name)
    config = read_model_config(folder)
    source = gguf_source(name)
    if source is not None:
        blocks = gguf_blocks_served(source, weights, weight_dtype, device)
        return config, gguf_weight_bytes(source, blocks, DTYPE_BYTES[weight_dtype]), name
    return config, safetensors_weight_bytes(weight_files(folder), DTYPE_BYTES[weight_dtype]), name
