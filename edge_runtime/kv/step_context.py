"""What both back ends' per-step KV contexts share (kv/paged_context.py, kv/flat_context.py).

A context is built once per engine step, on the host, from the step's `SeqStep`s and passed to
CausalLM.forward as `kv` (model/kv_interface.py). Its index tensors reach the device through
`metadata()` / `bind()` (found by walking its attributes: any structure works). `attend` rotates q/k/v into the int8 store's Hadamard basis
(kernels/hadamard.py) and the output back; the back end's `_attend` works in that basis.
"""

from __future__ import annotations

import torch

from edge_runtime.kv import layer_windows, step_tensors
from edge_runtime.kernels import hadamard

_NOT_METADATA = frozenset({"storage", "layer_windows"})


class StepKVContext:
    def __init__(self, storage, seqs, sm_scale: float):
        self.storage = storage
        self.sm_scale = sm_scale
        self.num_tokens = sum(s.num_new for s in seqs)
        # per layer its sliding window (kv/layer_windows.py), None: every layer global
        self.layer_windows = getattr(storage, "layer_windows", None)
        self.has_local_layers = layer_windows.smallest_window(self.layer_windows) is not None

    def layer_window(self, layer: int) -> int | None:
        """The window of a local layer, None for a global one."""
        return None if self.layer_windows is None else self.layer_windows[layer]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H, D] in q's dtype."""
        assert q.shape[0] == self.num_tokens, (q.shape, self.num_tokens)
        if self.storage.rotated:  # the int8 store holds Hadamard-rotated heads (kernels/hadamard.py)
            q, k, v = hadamard.rotate(q), hadamard.rotate(k), hadamard.rotate(v)
            return hadamard.rotate(self._attend(layer, q, k, v))
        return self._attend(layer, q, k, v)

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def metadata(self) -> dict[str, torch.Tensor]:
        """Every index tensor the step reads on the device, by path (kv/step_tensors.py), for
        the step's one packed upload (engine/step_transfers.py); the storage is not included."""
        return step_tensors.collect(self, _NOT_METADATA)

    def bind(self, parts: dict[str, torch.Tensor]) -> "StepKVContext":
        """Take `metadata()`'s tensors back, now on the device, under the same paths."""
        step_tensors.replace(self, parts, _NOT_METADATA)
        return self

    def native_decode_args(self, num_heads: int, head_dim: int):
        """Arguments for the one-call C decode step (kernels/cpu_decoder.py); None where it does
        not apply (every context but the CPU back end's steps whose tokens the C attention all
        gathers: int8 or fp16 KV)."""
        return None
