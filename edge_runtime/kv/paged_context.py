"""The CUDA back end's KVContext (edge_runtime/model/kv_interface.py): attention over the paged
storage for one engine step, in one canonical order over absolute positions.

A sequence's KV is two segments (docs/pool.md, "Design"): the shared prefix `[0, p)` in pool pages (read-only,
the last may be partial) and the private tail `[p, L)` starting at slot 0 of its first tail page;
an "inline" tail is F full tail pages followed by inline slots holding `[b, L)`, b = p + F * P
(F = 0: the slots start at p). Per layer, `attend` writes the new tokens' K/V into the tail
(write_kv), then reads, for a query at position i:

  keys [0, e):  from the int8 (or float) pool and arena by position, e = i + 1, or with a
                recent-key window (kv/recent_window.py; the read rule: query i reads its
                block [i - i % W, i] exact) e = i - i % W: kernels/positional_attention.py,
                spans of fixed absolute size, tiles aligned to absolute positions, each key's
                address found from its position (prefix page, tail page or inline slot);
  keys [e, i]:  the exact block, from a per-step store of every windowed sequence's current
                block in fp16 (the window's carried positions, then the step's own K/V), one
                program per query token (dispatch.exact_block_attention);

and merges the spans, then the exact block, in position order by one formula
(dispatch.merge_in_order). A local (sliding-window) layer reads its int8 keys from
`key_starts[W]` = max(0, i - W + 1) instead of 0 (kv/layer_windows.py); its exact block is
inside its window. Decode and prefill tokens go through the same launches with the same
tiles, so what a token computes depends on its position and the stored values alone: cold or
from the prefix cache, chunked any way, batched, preempted or forked, the logits are the same
bits (tests/test_determinism.py). Three attention launches per layer, whatever the segments.

The kernels are kernels/dispatch.py's: Triton on CUDA tensors, and on CPU tensors inside
`dispatch.prefer_triton()` (the CUDA back end under TRITON_INTERPRET=1, engine/backend.py); the
torch references otherwise (the same values, not the same bits). The CPU back end's context is
kv/flat_context.py.

Invariants:
- Every new token's position is >= its sequence's prefix length (new tokens are never in the
  shared prefix), and the tail storage was reserved (KVManager.reserve) before the step.
- All index tensors (position index, slot mappings, exact-block indices) are built once per step
  in `PagedKVContext.__init__`, never per layer.
- With layer groups (kv/layer_groups.py) a layer reads and writes its group's slices: the
  position index's pool table and the pool slot mapping are turned into each group's slices
  once per step (`group_index`, `group_slots`), after any padding.
- Built with a `DecodeShape` (a decode step padded to a batch-size bucket, engine/cuda_graphs.py),
  every index tensor has the shape's sizes and the host values are the shape's, whatever the
  sequences (kv/decode_shape.py); a step that does not fit raises DoesNotFit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from edge_runtime.kv.recent_window import exact_from, window_offset
from edge_runtime.kv import decode_shape, layer_windows
from edge_runtime.kv.decode_shape import DecodeShape
from edge_runtime.kv.step_context import StepKVContext
from edge_runtime.kv.storage import KVStorage
from edge_runtime.kernels import positional_attention
from edge_runtime.kernels.dispatch import (exact_block_attention, merge_in_order,
                                           positional_attention as read_by_position, write_kv)
from edge_runtime.kernels.positional_attention import NO_INLINE, PositionIndex


@dataclass(frozen=True)
class SeqStep:
    """One sequence's share of a step: new tokens at positions [start, start + num_new)."""

    prefix_pages: tuple[int, ...]
    prefix_len: int
    tail_kind: str  # "inline" | "pages"
    tail_ids: tuple[int, ...]  # inline: slot ids; pages: private page ids
    start: int
    num_new: int
    full_pages: tuple[int, ...] = ()  # inline: the full tail pages before the slots
    window: int | None = None  # its recent-key window (kv/recent_window.py)
    window_start: int = 0  # the window's offset 0: the first position the sequence computed

    @classmethod
    def from_segments(cls, seg, start: int, num_new: int) -> "SeqStep":
        tail_ids = seg.tail_ids if isinstance(seg.tail_ids, (list, tuple)) else (seg.tail_ids,)
        return cls(tuple(seg.prefix_pages), int(seg.prefix_len), seg.tail_kind,
                   tuple(int(i) for i in tail_ids), start, num_new,
                   tuple(int(i) for i in getattr(seg, "full_pages", ())),
                   getattr(seg, "window", None), int(getattr(seg, "window_start", 0)))

    def page_rows(self) -> tuple[int, ...]:
        """The tail's pool pages (all of a page tail, the full pages of an inline tail)."""
        return self.tail_ids if self.tail_kind == "pages" else self.full_pages


def _pad_rows(rows: list[list[int]]) -> torch.Tensor:
    width = max(1, max((len(r) for r in rows), default=1))
    table = torch.zeros(len(rows), width, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    return table


def _position_index(seqs: list[SeqStep], page_tokens: int, seq_of_token: torch.Tensor,
                    key_end: torch.Tensor) -> PositionIndex:
    """Per row: the prefix pages then the tail's pages (one pool row), its inline slots, and where
    each segment starts (kernels/positional_attention_ref.py)."""
    bounds = [(s.prefix_len, -s.prefix_len % page_tokens,
               s.prefix_len + len(s.full_pages) * page_tokens if s.tail_kind == "inline" else NO_INLINE)
              for s in seqs]
    span = positional_attention.TUNE["span_tokens"]
    return PositionIndex(_pad_rows([list(s.prefix_pages) + list(s.page_rows()) for s in seqs]),
                         _pad_rows([list(s.tail_ids) if s.tail_kind == "inline" else [] for s in seqs]),
                         seq_of_token.to(torch.int32), key_end.to(torch.int32),
                         torch.tensor(bounds, dtype=torch.int32).view(-1, 3), span,
                         max(1, -(-int(key_end.max()) // span)) if key_end.numel() else 1)


class PagedKVContext(StepKVContext):
    """Per-step view of the paged storage (the CUDA back end); pass to CausalLM.forward as `kv`."""

    def __init__(self, storage: KVStorage, seqs: list[SeqStep], sm_scale: float,
                 shape: DecodeShape | None = None):
        super().__init__(storage, seqs, sm_scale)
        self.slot_mapping: dict[str, torch.Tensor] = {}
        self.window_slots: torch.Tensor | None = None  # window writes, -1 none
        self.exact: tuple | None = None  # _exact_blocks' indices
        self._shape = shape
        if shape is not None:
            decode_shape.check_fits(seqs, shape)
        self._build(seqs)
        if shape is not None:
            self._pad(shape)
        self._by_group()

    def _by_group(self) -> None:
        """Layer groups: per group its position index and pool slot mapping (its slices)."""
        self.group_index: dict[int, PositionIndex] = {}
        self.group_slots: dict[int, torch.Tensor] = {}
        groups = self.storage.groups
        if groups is None:
            return
        tables = self.storage.group_tables()
        P = self.storage.store("pages").block_tokens
        slots = self.slot_mapping.get("pages")
        for g in range(groups.num_groups):
            table = tables[g]
            self.group_index[g] = dataclasses.replace(
                self.index, pool_table=table[self.index.pool_table.long()].to(torch.int32))
            if slots is not None:
                at = slots.clamp(min=0)
                self.group_slots[g] = torch.where(slots >= 0, table[at // P] * P + at % P, -1)

    def _pad(self, shape: DecodeShape) -> None:
        """Every index tensor at the shape's size, padding rows reading and writing nothing."""
        self.index = decode_shape.padded_index(self.index, shape)
        self.key_starts = {w: decode_shape.pad(x, shape.rows, 0, torch.int32)
                           for w, x in self.key_starts.items()}
        stores = ("pages", "inline") if self.storage.inline is not None else ("pages",)
        self.slot_mapping = {k: decode_shape.pad(self.slot_mapping.get(k), shape.rows, -1)
                             for k in stores}
        if self.storage.window is not None:
            self.window_slots = decode_shape.pad(self.window_slots, shape.rows, -1)
            if self.exact is None:  # no windowed sequence in the step: every row reads none
                W = self.storage.store("window").block_tokens
                none = torch.zeros(0, dtype=torch.int64)
                self.exact = decode_shape.exact_blocks(none.bool(), none, none, W, shape.rows)
        self.num_tokens = shape.rows

    def _build(self, seqs: list[SeqStep]) -> None:
        """The position index of the int8 reads, slot_mapping per store, the exact blocks."""
        seq_of_token = torch.repeat_interleave(
            torch.arange(len(seqs)), torch.tensor([s.num_new for s in seqs], dtype=torch.int64)
        )  # [T]
        positions = torch.cat([torch.arange(s.start, s.start + s.num_new) for s in seqs]
                              + [torch.zeros(0, dtype=torch.int64)])  # [T]
        prefix_len = torch.tensor([s.prefix_len for s in seqs], dtype=torch.int64)[seq_of_token]
        assert bool((positions >= prefix_len).all()), "a new token lies inside the shared prefix"
        key_end = self._windows(seqs, seq_of_token, positions)
        P = self.storage.store("pages").block_tokens
        self.index = _position_index(seqs, P, seq_of_token, key_end)
        # per local window: each token's first key (kv/layer_windows.py); the same keys whatever
        # the step's sequences, so a captured decode graph's tensors are the same structure
        self.key_starts = {w: layer_windows.key_start(positions, w).to(torch.int32)
                           for w in sorted({w for w in self.layer_windows or () if w is not None})}
        tail_pos = positions - prefix_len  # [T] offset inside the tail
        # tokens before an inline tail's slots: its full pages ([p, b) in the pool)
        in_pages = torch.tensor([len(s.full_pages) * P if s.tail_kind == "inline" else 1 << 40
                                 for s in seqs], dtype=torch.int64)[seq_of_token]  # [T]
        for kind in ("pages", "inline"):
            rows = [list(s.page_rows()) if kind == "pages" else
                    list(s.tail_ids) if s.tail_kind == "inline" else [] for s in seqs]
            if not any(rows):
                continue
            if kind == "pages":
                pos_in, writes = tail_pos, tail_pos < in_pages
            else:
                pos_in, writes = tail_pos - in_pages, tail_pos >= in_pages
            self._slots(kind, rows, seq_of_token, pos_in, writes)
        assert sum(int((m >= 0).sum()) for m in self.slot_mapping.values()) == self.num_tokens

    def _slots(self, kind: str, rows: list[list[int]], seq_of_token, pos_in, writes) -> None:
        """slot_mapping[kind]: where each new token that `writes` there goes (-1: elsewhere)."""
        table = _pad_rows(rows)
        block = self.storage.store(kind).block_tokens
        has_rows = torch.tensor([len(r) > 0 for r in rows])[seq_of_token]
        writes = writes & has_rows
        if not bool(writes.any()):
            return
        idx = (pos_in // block).clamp(min=0, max=table.shape[1] - 1)
        block_id = table.long()[seq_of_token, idx]
        n_blocks = torch.tensor([len(r) for r in rows])[seq_of_token]
        assert bool((pos_in[writes] // block < n_blocks[writes]).all()), \
            "tail storage not reserved for every new token"
        slots = block_id * block + pos_in.clamp(min=0) % block
        self.slot_mapping[kind] = torch.where(writes, slots, -1).to(torch.int64)

    def _windows(self, seqs: list[SeqStep], seq_of_token: torch.Tensor,
                 positions: torch.Tensor) -> torch.Tensor:
        """Recent-key windows, by the read rule of kv/recent_window.py (query i reads its
        block [i - i % W, i] exact): every windowed token, decode or prefill, reads its block from
        the step's exact blocks (`_exact_blocks`); every new token in its sequence's last block is
        written to the window. Returns each token's key_end: the int8 keys it reads are
        [0, key_end) (all of [0, pos] without a window)."""
        limit = positions + 1
        if not any(s.window is not None for s in seqs):
            return limit
        W = self.storage.store("window").block_tokens
        per_seq = lambda f, dtype=torch.int64: torch.tensor([f(s) for s in seqs], dtype=dtype)[seq_of_token]
        has = per_seq(lambda s: s.window is not None, torch.bool)
        end, window = per_seq(lambda s: s.start + s.num_new), per_seq(lambda s: s.window or 0)
        limit = torch.where(has, exact_from(positions, W), limit)
        writes = has & (positions >= exact_from(end - 1, W))
        self.window_slots = torch.where(writes, window * W + window_offset(positions, W), -1)
        if self._shape is None:
            self._exact_blocks(seqs, seq_of_token, positions, has, W)
        else:  # a decode step: one token per sequence, one block per row
            self.exact = decode_shape.exact_blocks(has, window, positions, W, self._shape.rows)
        return limit

    def _exact_blocks(self, seqs, seq_of_token, positions, has, W: int) -> None:
        """One W-token block per block a windowed sequence reads exact in this step, [b, end)
        (b: its first new token's block start): the carried positions [b, start) from its window,
        then its new tokens. A token reads its block up to itself."""
        first_block = torch.zeros(len(seqs), dtype=torch.int64)  # the row's first exact block
        carry_src, carry_dst, num_blocks = [], [], 0
        for i, s in enumerate(seqs):
            if s.window is None:
                continue
            b = exact_from(s.start, W)
            first_block[i] = num_blocks - b // W  # + position // W: the position's block
            carried = torch.arange(b, s.start)
            carry_src.append(s.window * W + window_offset(carried, W))
            carry_dst.append(num_blocks * W + carried - b)
            num_blocks += (s.start + s.num_new - 1) // W - b // W + 1
        src = torch.nonzero(has).squeeze(1)  # the windowed tokens, in batch order
        row = first_block[seq_of_token] + positions // W  # [T] (meaningful where windowed)
        dst = row[src] * W + window_offset(positions[src], W)
        self.exact = (src, dst, torch.cat(carry_src), torch.cat(carry_dst), num_blocks, W,
                      torch.arange(num_blocks, dtype=torch.int32)[:, None],
                      torch.where(has, row, 0).to(torch.int32),
                      torch.where(has, window_offset(positions, W) + 1, 0).to(torch.int32))

    def _exact_store(self, x: torch.Tensor, window_cache: torch.Tensor) -> torch.Tensor:
        """The step's exact blocks as a paged store [B, W, Hkv, D] in the window's dtype: each
        block's carried positions copied from its window (window_cache: one layer's
        [num_windows, W, Hkv, D], before this step writes it), then the new tokens' K or V
        (x: [T, Hkv, D]), rounded as the window stores them."""
        src, dst, carry_src, carry_dst, blocks, width = self.exact[:6]
        out = x.new_zeros(blocks * width, *x.shape[1:], dtype=window_cache.dtype)
        out.index_copy_(0, carry_dst, window_cache.reshape(-1, *x.shape[1:])[carry_src])
        out.index_copy_(0, dst, x[src].to(window_cache.dtype))
        return out.view(blocks, width, *x.shape[1:])

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        exact = None
        if self.exact is not None:  # before the window writes: it reads carried positions
            window = self.storage.view("window", layer)
            exact = (self._exact_store(k, window.k_cache), self._exact_store(v, window.v_cache))
        group = self.storage.layer_slot(layer)[0]
        for store, slots in self.slot_mapping.items():
            if store == "pages" and self.group_slots:
                slots = self.group_slots[group]
            view = self.storage.view(store, layer)
            write_kv(k, v, view.k_cache, view.v_cache, view.k_scale, view.v_scale, slots, view.k_mean,
                     chunks=view.chunks)
        if self.window_slots is not None:
            view = self.storage.view("window", layer)
            write_kv(k, v, view.k_cache, view.v_cache, None, None, self.window_slots)
        pool = self.storage.view("pages", layer)
        arena = self.storage.view("inline", layer) if self.storage.inline is not None else None
        window = self.layer_window(layer)
        index = self.group_index.get(group, self.index)
        if window is not None:
            index = dataclasses.replace(index, key_start=self.key_starts[window])
        p_out, p_lse = read_by_position(
            q, (pool.k_cache, pool.v_cache, pool.k_scale, pool.v_scale),
            None if arena is None else (arena.k_cache, arena.v_cache, arena.k_scale, arena.v_scale),
            index, self.sm_scale, k_mean=pool.k_mean, chunks=pool.chunks)
        extra = None
        if exact is not None:
            extra = exact_block_attention(q, *exact, *self.exact[6:], self.sm_scale)
        return merge_in_order(p_out, p_lse, extra).to(q.dtype)
