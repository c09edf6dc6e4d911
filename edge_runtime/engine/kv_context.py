"""What both back ends' per-step KV contexts share (engine/paged_kv.py, engine/flat_kv.py).

A context is built once per engine step from the step's `SeqStep`s and passed to CausalLM.forward
as `kv` (model/kv_interface.py). `attend` rotates q/k/v into the int8 store's Hadamard basis
(kernels/hadamard.py) and the output back; the back end's `_attend` works in that basis.
"""

from __future__ import annotations

import torch

from edge_runtime.kernels import hadamard


class StepKVContext:
    def __init__(self, storage, seqs, sm_scale: float):
        self.storage = storage
        self.sm_scale = sm_scale
        self.num_tokens = sum(s.num_new for s in seqs)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, H, D]; k, v: [T, Hkv, D] -> [T, H, D] in q's dtype."""
        assert q.shape[0] == self.num_tokens, (q.shape, self.num_tokens)
        if self.storage.rotated:  # the int8 store holds Hadamard-rotated heads (kernels/hadamard.py)
            q, k, v = hadamard.rotate(q), hadamard.rotate(k), hadamard.rotate(v)
            return hadamard.rotate(self._attend(layer, q, k, v))
        return self._attend(layer, q, k, v)

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def to(self, device: torch.device) -> "StepKVContext":
        return self

    def metadata(self) -> dict[str, torch.Tensor]:
        """The step's index tensors that must reach the device (none: a host-only context)."""
        return {}

    def bind(self, parts: dict[str, torch.Tensor]) -> "StepKVContext":
        """Take `metadata()`'s tensors back, now on the device."""
        return self

    def native_decode_args(self, num_heads: int, head_dim: int):
        """Arguments for the one-call C decode step (kernels/cpu_decoder.py); None where it does
        not apply (every context but the CPU back end's steps whose tokens the C attention all
        gathers: int8 or fp16 KV)."""
        return None
