"""The contract between the model forward and whatever stores K/V.

The forward runs on a *flattened varlen batch*: the new tokens of every sequence in the batch are
concatenated into one `[num_tokens]` vector (prefill chunks and single decode tokens mixed), with
their absolute positions. The forward never sees sequence boundaries; the `KVContext` built for
this step knows them. Per layer the forward computes q, k, v for the new tokens (rotary already
applied) and calls `kv.attend(layer, q, k, v)`, which must

1. store k and v of the new tokens (in whatever format: contiguous fp32, int8 pages...), then
2. return causal attention of each new token over its own sequence's cached tokens plus the new
   tokens up to and including itself.

Implementations: `edge_runtime.model.contiguous_kv` (a simple per-sequence cache, the reference)
and the engine's paged int8 store (edge_runtime/engine/).
"""

from __future__ import annotations

from typing import Protocol

import torch


class KVContext(Protocol):
    """Per-forward-call view of the KV storage for one batch of sequences."""

    def attend(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Store k/v of the new tokens of `layer`, return attention output.

        q: [num_tokens, num_heads, head_dim]
        k, v: [num_tokens, num_kv_heads, head_dim]
        returns: [num_tokens, num_heads, head_dim], same dtype as q
        """
        ...
