"""The bytes of weights a model will hold, read without loading it (config.json, safetensors
headers, GGUF tensor infos), for the memory plan (edge_runtime/plan.py, `model_for_plan`).
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
    from edge_runtime.model.safetensors_io import tensor_specs  # start-up time: imports torch

    total = 0
    for path in files:
        for dtype, shape in tensor_specs(path).values():
            numel = 1
            for d in shape:
                numel *= d
            size = float_bytes if dtype in _FLOAT_DTYPES else _DTYPE_SIZE.get(dtype, 1)
            total += numel * size
    return total


def gguf_weight_bytes(source: Path, blocks: bool, float_bytes: int) -> int:
    # start-up time: imports numpy, torch
    from edge_runtime.model.gguf_int4 import planned_weight_bytes
    from edge_runtime.model.gguf_tensors import GGUFTensors  # start-up time: imports numpy

    if blocks:
        return planned_weight_bytes(source, float_bytes)
    return sum(float_bytes * math.prod(i.shape) for i in GGUFTensors(source).infos.values())
