"""Half-precision storage for the token embedding and the (usually tied) LM head.

In a small model the embedding is a large share of the weights (SmolLM2-135M: 28M of 135M
parameters), so int4 linears alone leave the model at ~31% of its fp32 bytes. AutoAWQ checkpoints
store the embedding in fp16 anyway; keeping it fp16 in memory halves it again, and the fp16 LM
head matmul is faster than fp32 on CPU (oneDNN, fp32 accumulation). Inputs and outputs stay fp32.

Invariant: a tied embedding and LM head share one fp16 tensor (counted once).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class HalfEmbedding(nn.Module):
    """nn.Embedding look-up from an fp16 table; returns `out_dtype` (fp32) rows."""

    def __init__(self, weight: torch.Tensor, out_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().to(torch.float16), requires_grad=False)
        self.num_embeddings, self.embedding_dim = self.weight.shape
        self.out_dtype = out_dtype

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).to(self.out_dtype)


class HalfLinear(nn.Module):
    """y = x @ W.T (+ b) with W stored fp16; the matmul runs in fp16, output in x's dtype."""

    def __init__(self, weight: nn.Parameter | torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if not isinstance(weight, nn.Parameter):
            weight = nn.Parameter(weight.detach().to(torch.float16), requires_grad=False)
        assert weight.dtype == torch.float16, weight.dtype
        self.weight = weight  # may be shared with a HalfEmbedding (tied)
        self.out_features, self.in_features = weight.shape
        self.register_buffer("bias", None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.float16), self.weight).to(x.dtype)
        return y if self.bias is None else y + self.bias


def _get(model: nn.Module, path: str) -> nn.Module | None:
    try:
        return model.get_submodule(path)
    except AttributeError:
        return None


def set_module(model: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, module)


def halve_embeddings(model: nn.Module, embed_path: str = "model.embed_tokens",
                     head_path: str = "lm_head") -> list[str]:
    """Store the embedding and LM head (if they are plain modules) in fp16; returns paths changed.

    A head whose weight is the embedding's weight (tied) shares the fp16 tensor.
    """
    changed = []
    embed = _get(model, embed_path)
    head = _get(model, head_path)
    half_embed = None
    if isinstance(embed, nn.Embedding):
        half_embed = HalfEmbedding(embed.weight.data, out_dtype=embed.weight.dtype)
        tied = isinstance(head, nn.Linear) and head.weight is embed.weight
        set_module(model, embed_path, half_embed)
        changed.append(embed_path)
        if tied:
            set_module(model, head_path, HalfLinear(half_embed.weight, head.bias))
            changed.append(head_path)
            return changed
    if isinstance(head, nn.Linear):
        set_module(model, head_path, HalfLinear(head.weight.data, head.bias))
        changed.append(head_path)
    return changed
