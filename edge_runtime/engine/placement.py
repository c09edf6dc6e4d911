"""Where a command runs the model: device, back end and weight dtype, resolved once.

Every command that runs the model takes `--device auto|cpu|cuda[:N]` and `--backend cpu|cuda`
(`add_arguments`). `resolve` turns them, with the budget's `device:` and `weight_dtype`, into a
`Placement`:
- device auto: the budget's `device:` when it pins one, else CUDA when torch sees a CUDA device,
  else the CPU; `--device cuda` without one is refused in one line;
- back end: the device's unless `--backend` names one (engine/backend.py says which pairs run);
- weight dtype: the CUDA back end on a GPU loads the budget's `weight_dtype` (fp16 on the Orin
  budgets; fp16 without a budget); the CPU back end, and the CUDA back end on CPU tensors (the
  Triton interpreter, for tests), load fp32. AWQ layers stay int4 either way (the blocked format
  both back ends read, model/awq_blocked.py).
`load_for` loads a model for a placement and prepares it for its back end. `--weights` (a GGUF's
own int4 blocks or its float conversion) is separate: auto means the blocks on both back ends (in
the weight dtype's activations on CUDA), fp32 the float conversion in the weight dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

from edge_runtime.budget import DEVICE_PATTERN, TORCH_DTYPES
from edge_runtime.errors import ConfigError
from edge_runtime.model.weights_option import WEIGHTS

DEVICE_HELP = ("auto (default: the budget's device:, else cuda when torch sees a CUDA device, "
               "else cpu), cpu, cuda or cuda:N")
BACKEND_HELP = ("cpu (flat store, C kernels) or cuda (paged store, Triton kernels); default: the "
                "device's. --device cpu --backend cuda runs the Triton kernels in the interpreter "
                "(TRITON_INTERPRET=1; slow, for tests)")


@dataclass(frozen=True)
class Placement:
    device: str  # "cpu" | "cuda" | "cuda:N"
    backend: str  # "cpu" | "cuda"
    weight_dtype: str  # "fp32" | "fp16" | "bf16"

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, TORCH_DTYPES[self.weight_dtype])

    def engine_settings(self) -> dict:
        """EngineConfig fields for this placement."""
        return {"device": self.device, "backend": self.backend}

    def describe(self) -> dict:
        return {"device": self.device, "backend": self.backend, "weight_dtype": self.weight_dtype}


def add_arguments(parser, device_default: str = "auto") -> None:
    parser.add_argument("--device", default=device_default, help=DEVICE_HELP)
    parser.add_argument("--backend", choices=("cpu", "cuda"), default=None, help=BACKEND_HELP)


def resolve(device: str = "auto", backend: str | None = None, budget=None,
            weight_dtype: str | None = None, need_device: bool = True) -> Placement:
    """need_device False (planning): a CUDA device or Triton need not exist on this machine."""
    device = pick_device(device or "auto", budget, need_device)
    backend = backend or ("cpu" if device == "cpu" else "cuda")
    if need_device:
        from edge_runtime.engine.backend import select_backend  # start-up time: imports torch

        select_backend(backend, device)  # ConfigError when this pair cannot run here
    elif backend == "cpu" and device != "cpu":
        raise ConfigError(f"the CPU back end runs on --device cpu, not {device}")
    if weight_dtype is None:
        on_gpu = backend == "cuda" and device != "cpu"
        weight_dtype = (budget.weight_dtype if budget is not None else "fp16") if on_gpu else "fp32"
    if weight_dtype not in TORCH_DTYPES:
        raise ConfigError(f"weight dtype must be one of {', '.join(TORCH_DTYPES)}, got {weight_dtype!r}")
    return Placement(device, backend, weight_dtype)


def pick_device(device: str, budget=None, need_device: bool = True) -> str:
    """auto | cpu | cuda | cuda:N -> the device to use (auto resolved as the module doc says)."""
    if not DEVICE_PATTERN.fullmatch(device):
        raise ConfigError(f"--device {device!r}: use auto, cpu, cuda or cuda:N")
    if device == "auto" and budget is not None:
        device = budget.device
    if device == "auto":
        return "cuda" if _cuda_count() > 0 else "cpu"
    if device != "cpu" and need_device:
        count = _cuda_count()
        index = int(device.partition(":")[2] or 0)
        if count == 0:
            raise ConfigError(f"--device {device}: torch sees no CUDA device on this machine; "
                              f"use --device auto or --device cpu")
        if index >= count:
            raise ConfigError(f"--device {device}: this machine has {count} CUDA device(s), "
                              f"cuda:0..cuda:{count - 1}")
    return device


def _cuda_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def model_weights(placement: Placement, weights: str = "auto") -> str:
    """`--weights` for this placement (model/weights_option.py): the same on both back ends now
    that both run a GGUF's own blocks (the C kernels on the CPU back end, the blocked W4A16
    Triton kernel on the CUDA back end); auto on the CPU back end needs the C kernels built
    (model/gguf_int4.serve_from_blocks). Kept as the one place a back end could narrow it."""
    if weights not in WEIGHTS:
        raise ConfigError(f"--weights {weights!r}: use one of {', '.join(WEIGHTS)}")
    return weights


def load_for(model: str, placement: Placement, progress=None, weights: str = "auto"):
    """The model loaded for `placement` and prepared for its back end (engine/backend.py);
    weights: `--weights` (model_weights says what it means on each back end)."""
    # start-up time: imports torch
    from edge_runtime.engine.backend import prepare_model, select_backend
    from edge_runtime.model.loader import load_model  # start-up time: imports torch

    kwargs = {} if progress is None else {"progress": progress}
    # AWQ layers: the blocked format (QuantLinear) on both back ends unless the environment picks
    # one of AWQLinear's backends (model/awq_model.py)
    loaded = load_model(model, dtype=placement.torch_dtype, device=placement.device,
                        weights=model_weights(placement, weights), **kwargs)
    prepare_model(loaded.model, select_backend(placement.backend, placement.device))
    return loaded
