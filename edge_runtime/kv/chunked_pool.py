"""The CUDA back end's page pool: one tensor per chunk of pages (per K, V and scales), so a chunk
the memory guard retires gives its memory back (kv/pool_resize.py).

Chunk c holds pages [c * chunk_pages, min((c + 1) * chunk_pages, num_pages)) in the layout of
kv/storage.py's stores ([pages, num_layers, page_tokens, Hkv, D] + [.., Hkv] fp16 scales);
block tables keep global page ids. The kernels address the chunks through a PageChunks
(kernels/page_chunks.py): chunk 0's tensors as the base and the element offset of every chunk's
tensors from them. Why not one tensor: device memory cannot be handed back piecewise from inside
one allocation, and a chunk is exactly what the guard retires. Why not CUDA virtual memory
(cuMemMap of chunks into one reserved range, the kernels unchanged): torch's caching allocator
would not see it (the guard and /metrics read its statistics), and CI could not run it.

Invariants:
- chunk 0 is never released; a released chunk's tensors are dropped here, and nothing else keeps
  them: views are handed out per layer from a cache that release and regrow clear, the offsets
  table holds numbers, not tensors. On CUDA the caching allocator's free blocks then go back to the
  driver (torch.cuda.empty_cache). Regrowing allocates the chunk again (zeros, scales 1) and
  updates the offsets in place, so the pool never needs more than its own size.
- Callers release only pages that hold no live or cached K/V (the KVManager retired them), and
  never use views taken before a release or regrow (the engine lock: no step runs during one).
"""

from __future__ import annotations

import dataclasses

import torch

from edge_runtime.kv.store import Store, StoreView
from edge_runtime.kernels.page_chunks import PageChunks, element_offsets


def _plain_zeros(shape, dtype, device) -> torch.Tensor:
    return torch.zeros(shape, dtype=dtype, device=device)


class ChunkedStore:
    """A paged store of `num_blocks` blocks in chunks of `chunk_pages` (the last may be smaller)."""

    def __init__(self, num_blocks, chunk_pages, num_layers, block_tokens, num_kv_heads, head_dim,
                 dtype, device):
        assert 0 < chunk_pages <= num_blocks, (chunk_pages, num_blocks)
        self.num_blocks, self.chunk_pages, self.block_tokens = num_blocks, chunk_pages, block_tokens
        self._geometry = (num_layers, block_tokens, num_kv_heads, head_dim, dtype, device)
        num_chunks = -(-num_blocks // chunk_pages)
        self.chunks: list[Store | None] = [self._allocate(c) for c in range(num_chunks)]
        self.offsets = torch.zeros(num_chunks, 4, dtype=torch.int64, device=device)
        self._views: dict[int, StoreView] = {}
        self._refresh()

    def _pages_of(self, c: int) -> int:
        return min(self.chunk_pages, self.num_blocks - c * self.chunk_pages)

    def _allocate(self, c: int) -> Store:
        return Store(self._pages_of(c), *self._geometry, zeros=_plain_zeros)

    def _refresh(self) -> None:
        """Offsets of the chunks in service (in place: the table's address never changes); views
        are rebuilt on next use."""
        cols = [(st.k, st.k_scale, st.v, st.v_scale) if st is not None else (None,) * 4
                for st in self.chunks]
        self.offsets.copy_(torch.tensor(element_offsets(cols), dtype=torch.int64))
        self._views.clear()

    def chunk_range(self, c: int) -> tuple[int, int]:
        return c * self.chunk_pages, c * self.chunk_pages + self._pages_of(c)

    def view(self, layer: int) -> StoreView:
        view = self._views.get(layer)
        if view is None:
            per_chunk = [st.view(layer) if st is not None else None for st in self.chunks]
            col = lambda name: tuple(getattr(v, name) if v is not None else None for v in per_chunk)
            quant = per_chunk[0].k_scale is not None
            chunks = PageChunks(self.chunk_pages, self.num_blocks, self.offsets,
                                col("k_cache"), col("k_scale") if quant else None,
                                col("v_cache"), col("v_scale") if quant else None)
            view = self._views[layer] = dataclasses.replace(per_chunk[0], chunks=chunks)
        return view

    def _locate(self, flat_start: int, num_tokens: int):
        """-> [(chunk store, token indices into the range, local pages, offsets)] per chunk touched."""
        flat = torch.arange(flat_start, flat_start + num_tokens)
        page, off = flat // self.block_tokens, flat % self.block_tokens
        chunk = page // self.chunk_pages
        for c in torch.unique(chunk).tolist():
            st = self.chunks[c]
            assert st is not None, f"tokens {flat_start}.. lie in released chunk {c}"
            idx = (chunk == c).nonzero().flatten()
            yield st, idx, page[idx] - c * self.chunk_pages, off[idx]

    def read(self, flat_start: int, num_tokens: int) -> list[torch.Tensor]:
        """Copies of tokens [flat_start, +num_tokens) of every tensor: [num_tokens, num_layers, ...]."""
        out = None
        for st, idx, page, off in self._locate(flat_start, num_tokens):
            parts = [t[page, :, off] for t in st.tensors()]
            if out is None:
                out = [p.new_empty(num_tokens, *p.shape[1:]) for p in parts]
            for o, p in zip(out, parts):
                o[idx.to(o.device)] = p
        return out or []

    def write(self, flat_start: int, values: list[torch.Tensor]) -> None:
        for st, idx, page, off in self._locate(flat_start, values[0].shape[0] if values else 0):
            for t, x in zip(st.tensors(), values):
                t[page, :, off] = x[idx.to(x.device)]

    def nbytes(self) -> int:
        """The whole pool's bytes, every chunk in service (as the flat store's nbytes)."""
        one = self.chunks[0].nbytes() // self.chunk_pages
        return one * self.num_blocks

    def release(self, start: int, end: int) -> int:
        """Drop the chunk that is exactly pages [start, end) -> its bytes (0 if already released)."""
        c = start // self.chunk_pages
        assert c > 0 and (start, end) == self.chunk_range(c), \
            f"not a whole chunk past the first: {start, end}"
        st, self.chunks[c] = self.chunks[c], None
        if st is None:
            return 0
        released = st.nbytes()
        del st
        self._refresh()  # drops the cached views that held the chunk
        if self.offsets.is_cuda:
            torch.cuda.empty_cache()  # the allocator's now-free blocks back to the driver
        return released

    def regrow(self, start: int, end: int) -> None:
        """Allocate the chunk of pages [start, end) again (zeros; scales 1)."""
        c = start // self.chunk_pages
        assert (start, end) == self.chunk_range(c), f"not a whole chunk: {start, end}"
        if self.chunks[c] is None:
            self.chunks[c] = self._allocate(c)
            self._refresh()
