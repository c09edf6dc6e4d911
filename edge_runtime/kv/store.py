"""One store's tensors (the pool, the inline arena or the windows) and one layer's view of them,
as the kernels see it: [num_blocks, num_layers, block_tokens, num_kv_heads, head_dim] K and V, plus
fp16 scales for int8 (layout: kv/storage.py). KVStorage holds the stores; a chunked pool
(kv/chunked_pool.py) is a list of them, one per chunk."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edge_runtime.kernels.huge_pages import HugePageArena
from edge_runtime.kernels.page_chunks import PageChunks


@dataclass(frozen=True)
class StoreView:
    """One layer of one store, as the kernels see it."""

    k_cache: torch.Tensor  # [N, P, Hkv, D]
    v_cache: torch.Tensor  # [N, P, Hkv, D]
    k_scale: torch.Tensor | None  # [N, P, Hkv] fp16 (int8 only); negative: a centred key
    v_scale: torch.Tensor | None
    k_mean: torch.Tensor | None = None  # [Hkv, D] fp32: the layer's mean key (centred keys)
    chunks: PageChunks | None = None  # a chunked pool's chunks (the caches above are chunk 0's)


def touched_zeros(shape, dtype, device) -> torch.Tensor:
    """Zeros; on the CPU in memory advised to be backed by 2 MiB pages (kernels/huge_pages.py):
    decode attention reads each row's keys at a 192-byte stride across a whole page of the pool,
    and with 4 KiB pages it took TLB misses all along (docs/cpu-backend.md, "CPU decode attention")."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    numel = math.prod(shape)
    return HugePageArena(numel, dtype).take(numel).view(shape).zero_()


class Store:
    """One paged tensor set (the pool or the arena)."""

    def __init__(self, num_blocks, num_layers, block_tokens, num_kv_heads, head_dim, dtype, device,
                 zeros=touched_zeros):
        shape = (num_blocks, num_layers, block_tokens, num_kv_heads, head_dim)
        self.block_tokens = block_tokens
        self.num_blocks = num_blocks
        # Filled with zeros: allocating and touching every byte now, not on first use.
        self.k = zeros(shape, dtype, device)
        self.v = zeros(shape, dtype, device)
        self.k_scale = self.v_scale = None
        if dtype == torch.int8:
            self.k_scale = torch.ones(shape[:-1], dtype=torch.float16, device=device)
            self.v_scale = torch.ones(shape[:-1], dtype=torch.float16, device=device)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v, self.k_scale, self.v_scale) if t is not None]

    def view(self, layer: int) -> StoreView:
        ks = self.k_scale[:, layer] if self.k_scale is not None else None
        vs = self.v_scale[:, layer] if self.v_scale is not None else None
        return StoreView(self.k[:, layer], self.v[:, layer], ks, vs)

    def index(self, flat_start: int, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        flat = torch.arange(flat_start, flat_start + num_tokens)
        return flat // self.block_tokens, flat % self.block_tokens

    def read(self, flat_start: int, num_tokens: int) -> list[torch.Tensor]:
        """Copies of tokens [flat_start, +num_tokens) of every tensor: [num_tokens, num_layers, ...]."""
        page, off = self.index(flat_start, num_tokens)
        return [t[page, :, off] for t in self.tensors()]

    def write(self, flat_start: int, values: list[torch.Tensor]) -> None:
        page, off = self.index(flat_start, values[0].shape[0] if values else 0)
        for t, x in zip(self.tensors(), values):
            t[page, :, off] = x

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())
