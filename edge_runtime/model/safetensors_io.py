"""Read the weights of a Hugging Face folder: one or several (sharded) .safetensors files.

Every failure a user can cause (no weights, a truncated or corrupt file, an index that names a missing
shard) becomes a `ModelLoadError` naming the file. Tensors are converted to the requested dtype as
they are read, except integer tensors (AWQ qweight/qzeros) which keep theirs.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from edge_runtime.errors import ModelLoadError
from edge_runtime.model.gguf_convert import cache_root


def weight_files(folder: Path) -> list[Path]:
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            content = json.loads(index.read_text())
        except ValueError as exc:
            raise ModelLoadError(f"{index} is not a valid safetensors index: {exc}") from exc
        if not isinstance(content, dict) or "weight_map" not in content:
            raise ModelLoadError(f"{index} is not a valid safetensors index: it must be a JSON object "
                                 "with a weight_map; re-export the model folder")
        weight_map = content["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ModelLoadError(f"{index} is not a valid safetensors index: weight_map must map "
                                 "tensor names to shard file names; re-export the model folder")
        files = [folder / name for name in sorted(set(weight_map.values()))]
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"{index} names shard {f.name}, which is missing from {folder}")
        return files
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        other = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found {', '.join(other)}: convert to safetensors first)" if other else ""
        raise ModelLoadError(f"no *.safetensors weights in {folder}{hint}")
    return files


def _corrupt(path: Path, exc: Exception) -> ModelLoadError:
    fix = ""
    if cache_root() in path.resolve().parents:  # a GGUF conversion of ours: it is redone if gone
        fix = f"; delete {path.parent} and the GGUF is converted again"
    return ModelLoadError(f"cannot read {path} (truncated or corrupt safetensors file?): {exc}{fix}")


def tensor_specs(path: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (safetensors dtype such as "F16", shape), from the header only (no tensor is read);
    the same checks and errors as `load_state_dict`."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return {name: (f.get_slice(name).get_dtype(), list(f.get_slice(name).get_shape()))
                    for name in f.keys()}
    except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
        raise _corrupt(path, exc) from exc


def load_state_dict(folder: Path, dtype: torch.dtype, device: str | torch.device = "cpu"
                    ) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        try:
            with safe_open(str(path), framework="pt", device=str(device)) as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    if tensor.is_floating_point():
                        tensor = tensor.to(dtype)
                    state[name] = tensor
        except (SafetensorError, OSError, RuntimeError, ValueError) as exc:
            raise _corrupt(path, exc) from exc
    return state
