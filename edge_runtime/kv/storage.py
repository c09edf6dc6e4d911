"""The K/V tensors: the page pool and the inline arena, allocated once and touched at start.

Layout (docs/interfaces.md):
  k_pages, v_pages: [num_pages, num_layers, page_tokens, num_kv_heads, head_dim]
      (on the CUDA back end one such tensor per chunk of `pool_chunk_pages` pages:
      kv/chunked_pool.py, addressed by the kernels through kernels/page_chunks.py)
      int8 (with k_scales, v_scales: [num_pages, num_layers, page_tokens, num_kv_heads] fp16),
      or fp16 / fp32 without scales (reference runs).
  k_inline, v_inline (+ scales): the same with num_slots / slot_tokens.
  k_window, v_window: [num_windows, num_layers, window_tokens, num_kv_heads, head_dim] fp16, no
      scales: each running sequence's most recent K/V kept exact next to its int8 copy (the
      recent-key window, kv/recent_window.py); int8 KV only, allocated when num_windows > 0.
  With layer groups (kv/layer_groups.py: a model with global and local layers) the pool is one of
  slices: [num_slices, layers_per_group, page_tokens, num_kv_heads, head_dim], a slice holding
  one group's layers; a layer's view is its index inside its group, and the page table it reads
  is its group's (`group_tables()`: group g's slice of each page, from the page pool's group
  map, which `bind_group_map` hands over). The arena and the windows keep every layer.
A flat slot is `page * page_tokens + offset` (or `slot * slot_tokens + offset` in the arena,
`window * window_tokens + offset` in the windows).
  k_means: [num_layers, num_kv_heads, head_dim] fp32, in the stores' (rotated) basis, or None:
      the mean key of each layer and kv head for centred int8 keys (kernels/quantize.py; measured
      by kv/key_means.py), set once before the first write and never changed after.

Invariants:
- Block tables address pages by page id forever. The flat stores are never reallocated; a
  chunked pool reallocates only a chunk the guard retired, when it is regrown.
- A page id addresses all layers, and a page's bytes are contiguous, so a range of page ids is a
  contiguous byte range of each tensor. `release_pages` gives such a range back: in the flat pool
  (CPU back end) with madvise(MADV_DONTNEED) (RSS really falls; whole OS pages inside the range
  read back as zeros, the unaligned edges keep their old bytes), in a chunked pool (CUDA back end)
  by dropping the chunk's tensors (the range must be a whole chunk). `regrow_pages` makes the
  range resident again, zeros.
- The caller (the memory guard through the engine) only releases pages that hold no live or cached
  K/V; this module does not know page states.
"""

from __future__ import annotations

import ctypes
import dataclasses
import mmap
import os

import torch

from edge_runtime.kv.chunked_pool import ChunkedStore
from edge_runtime.kv.layer_groups import LayerGroups
from edge_runtime.kv.store import Store, StoreView
from edge_runtime.kernels import hadamard

KV_DTYPES = {"int8": torch.int8, "fp16": torch.float16, "fp32": torch.float32}
_MADV_DONTNEED = 4


class KVStorage:
    """Pool + arena tensors for one model."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_pages: int,
                 page_tokens: int, num_inline_slots: int = 0, inline_tokens: int = 0,
                 kv_dtype: str = "int8", device: str | torch.device = "cpu",
                 num_windows: int = 0, window_tokens: int = 0, pool_chunk_pages: int | None = None,
                 layer_windows: tuple[int | None, ...] | None = None):
        """pool_chunk_pages: None, the pool as one tensor per K/V/scales (the CPU back end's flat
        rows read it); else one per chunk of that many pages (the CUDA back end).
        layer_windows: per layer its sliding window, None global (kv/layer_windows.py: what a
        step context's local layers read); None: every layer global.
        num_pages: slices with layer groups (`LayerGroups.of(layer_windows)` not None)."""
        assert layer_windows is None or len(layer_windows) == num_layers, (layer_windows, num_layers)
        self.layer_windows = None if not any(w is not None for w in layer_windows or ()) else \
            tuple(layer_windows)
        self.groups = LayerGroups.of(self.layer_windows)
        pool_layers = num_layers if self.groups is None else self.groups.layers_per_group
        # group g's slice of every page: the page pool's map (bind_group_map), as a tensor
        # updated by the columns the pool changed
        self._group_map = None
        self._group_tables: torch.Tensor | None = None
        assert kv_dtype in KV_DTYPES, kv_dtype
        dtype = KV_DTYPES[kv_dtype]
        self.kv_dtype = kv_dtype
        # int8 stores hold each head's K and V rotated by the normalized Hadamard matrix
        # (kernels/hadamard.py): same attention, better int8 precision; readers and writers
        # rotate q/k/v in and the attention output back
        self.rotated = kv_dtype == "int8" and hadamard.applies(head_dim)
        self.device = torch.device(device)
        self.key_shape = (num_layers, num_kv_heads, head_dim)
        if pool_chunk_pages is None:
            self.pool = Store(num_pages, pool_layers, page_tokens, num_kv_heads, head_dim, dtype, device)
        else:
            self.pool = ChunkedStore(num_pages, pool_chunk_pages, pool_layers, page_tokens,
                                     num_kv_heads, head_dim, dtype, device)
        self.inline = None
        if num_inline_slots > 0:
            self.inline = Store(num_inline_slots, num_layers, inline_tokens, num_kv_heads,
                                 head_dim, dtype, device)
        self.window = None
        if num_windows > 0 and window_tokens > 0:
            assert kv_dtype == "int8", "the recent-key window is for int8 KV (float KV is exact)"
            self.window = Store(num_windows, num_layers, window_tokens, num_kv_heads, head_dim,
                                 torch.float16, device)
        self.released: set[int] = set()
        self.k_means: torch.Tensor | None = None

    def set_key_means(self, means: torch.Tensor) -> None:
        """Centre int8 keys on `means` [num_layers, num_kv_heads, head_dim] (rotated basis) from
        now on; only before anything is written, since stored keys are read with these means."""
        assert self.kv_dtype == "int8", "centred keys are an int8 store's"
        shape = self.key_shape
        assert tuple(means.shape) == shape, f"key means {tuple(means.shape)} for a store of {shape}"
        self.k_means = means.to(torch.float32, copy=True).contiguous()

    def key_mean(self, name: str, layer: int) -> torch.Tensor | None:
        """The layer's mean key for store `name`'s int8 keys; None for the fp16 window."""
        if self.k_means is None or name == "window":
            return None
        return self.k_means[layer]

    def bind_group_map(self, pool) -> None:
        """Read the page pool's group map (kv/page_pool.py) from now on (layer groups only)."""
        assert self.groups is not None and pool.page_slices == self.groups.num_groups, \
            (self.groups, pool.page_slices)
        self._group_map = pool

    def group_tables(self) -> torch.Tensor:
        """int64 [num_groups, num_slices]: group g's slice of the page whose head slice is h
        (kept in step with the pool's map by the columns it changed)."""
        pool = self._group_map
        assert pool is not None, "layer groups: bind_group_map was not called"
        # a normal tensor, whichever mode a step runs in: one made inside inference mode could
        # not be updated outside it
        with torch.inference_mode(False):
            if self._group_tables is None:
                pool.take_map_changes()
                self._group_tables = torch.tensor(pool.group_map, dtype=torch.int64)
            heads = pool.take_map_changes()
            if heads:
                self._group_tables[:, heads] = torch.tensor(
                    [[row[h] for h in heads] for row in pool.group_map], dtype=torch.int64)
        return self._group_tables

    def layer_slot(self, layer: int) -> tuple[int, int]:
        """(group, index inside the group's slice) of a layer; (0, layer) without groups."""
        return (0, layer) if self.groups is None else self.groups.slot_of(layer)

    def view(self, name: str, layer: int) -> StoreView:
        """One layer of a store; a pool view with layer groups is addressed by the layer's
        group's slices (`group_tables`)."""
        index = self.layer_slot(layer)[1] if name == "pages" else layer
        v = self.store(name).view(index)
        mean = self.key_mean(name, layer)
        return v if mean is None else dataclasses.replace(v, k_mean=mean)

    def nbytes(self) -> int:
        return sum(st.nbytes() for st in (self.pool, self.inline, self.window) if st is not None)

    def store(self, name: str) -> Store:
        if name == "slices":  # the pool by slice (kv/seq_kv.py)
            name = "pages"
        assert name in ("pages", "inline", "window"), name
        st = {"pages": self.pool, "inline": self.inline, "window": self.window}[name]
        assert st is not None, f"store {name!r} is not allocated"
        return st

    def copy(self, op) -> None:
        """Execute a CopyOp: num_tokens tokens (all layers, K, V and scales) from src to dst;
        with layer groups a "pages" end is each group's slice of the page, in turn."""
        if self.groups is None or "pages" not in (op.src_store, op.dst_store):
            src, dst = self.store(op.src_store), self.store(op.dst_store)
            dst.write(op.dst_slot_start, src.read(op.src_slot_start, op.num_tokens))
            return
        for g in range(self.groups.num_groups):
            for src, dst, n in self._runs(op, g):
                self._write_group(op.dst_store, g, dst, self._read_group(op.src_store, g, src, n))

    def _runs(self, op, g: int):
        """(src slot, dst slot, tokens) runs of a CopyOp for group g, each inside one page of
        either end, "pages" slots turned into the group's slice slots."""
        i = 0
        while i < op.num_tokens:
            src, dst = op.src_slot_start + i, op.dst_slot_start + i
            n = op.num_tokens - i
            for name, slot in ((op.src_store, src), (op.dst_store, dst)):
                block = self.store(name).block_tokens
                n = min(n, block - slot % block)
            yield self._group_slot(op.src_store, g, src), self._group_slot(op.dst_store, g, dst), n
            i += n

    def _group_slot(self, name: str, g: int, slot: int) -> int:
        if name != "pages":
            return slot
        P = self.pool.block_tokens
        return int(self.group_tables()[g, slot // P]) * P + slot % P

    def _read_group(self, name: str, g: int, slot: int, n: int) -> list[torch.Tensor]:
        values = self.store(name).read(slot, n)
        if name == "pages":
            return values
        return [t[:, list(self.groups.layers[g])] for t in values]

    def _write_group(self, name: str, g: int, slot: int, values: list[torch.Tensor]) -> None:
        st = self.store(name)
        if name != "pages":  # every layer there: this group's layers replaced
            whole = st.read(slot, values[0].shape[0])
            for t, x in zip(whole, values):
                t[:, list(self.groups.layers[g])] = x
            values = whole
        st.write(slot, values)

    def release_pages(self, start: int, end: int) -> int:
        """Give pages [start, end) back (a whole chunk in a chunked pool); returns the bytes
        released: madvise'd whole OS pages (flat pool), the chunk's tensor bytes (chunked)."""
        assert 0 <= start <= end <= self.pool.num_blocks, (start, end)
        if start == end:
            return 0
        if isinstance(self.pool, Store):
            if self.device.type != "cpu":
                return 0  # a flat pool on a device: no piecewise release (tests only)
            released = sum(_madvise_dontneed(t, start, end) for t in self.pool.tensors())
        else:
            released = self.pool.release(start, end)
        self.released.update(range(start, end))
        return released

    def regrow_pages(self, start: int, end: int) -> None:
        """Make pages [start, end) resident again (zeros), after release_pages."""
        assert 0 <= start <= end <= self.pool.num_blocks, (start, end)
        if isinstance(self.pool, Store):
            for t in self.pool.tensors():
                t[start:end].zero_()
        elif start < end:
            self.pool.regrow(start, end)
        self.released.difference_update(range(start, end))


def _madvise_dontneed(t: torch.Tensor, start: int, end: int) -> int:
    """madvise(MADV_DONTNEED) on the whole OS pages inside t[start:end]'s bytes."""
    assert t.is_contiguous()
    row = t[0].numel() * t.element_size()
    lo = t.data_ptr() + start * row
    hi = t.data_ptr() + end * row
    page = mmap.PAGESIZE
    lo_aligned = (lo + page - 1) // page * page  # round inward: never touch a neighbour's bytes
    hi_aligned = hi // page * page
    if hi_aligned <= lo_aligned:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    rc = libc.madvise(ctypes.c_void_p(lo_aligned), ctypes.c_size_t(hi_aligned - lo_aligned),
                      _MADV_DONTNEED)
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise(MADV_DONTNEED) failed: {os.strerror(err)}")
    return hi_aligned - lo_aligned
