"""The CUDA back end's KVContext (edge_runtime/model/kv_interface.py): per-segment attention over
the paged storage for one engine step.

A sequence's KV is two segments (docs/pool.md, "Design"): the shared prefix `[0, p)` in pool
pages (read-only, the last may be partial) and the private tail `[p, L)` starting at slot 0 of its first tail page;
an "inline" tail is F full tail pages followed by inline slots holding `[b, L)`, b = p + F * P
(F = 0: the slots start at p). Per layer, `attend` writes the new tokens' K/V into the tail
(write_kv), then runs paged_attention once per segment kind over the whole flattened batch and
merges the results by log-sum-exp:

  call "prefix":      pool,  row = the sequence's prefix pages,  kv_len = p
  call "tail_pages":  pool,  row = its tail pages,                kv_len = min(pos + 1, b) - p
  call "tail_inline": arena, row = its slots,                     kv_len = pos + 1 - b

A token that has no part in a call gets kv_len 0 there (out 0, lse -inf: merged away). With
recent-key windows (engine/recent_window.py; the read rule: query i reads its block
[i - i % W, i] exact) two more calls: "window" (a decode token's block, from its fp16 window) and
"fresh" (a prefill token's block, from the window's carried positions and the step's K/V in fp16),
and the int8 calls' kv_lens stop where the block begins.

The kernels are kernels/dispatch.py's: Triton on CUDA tensors, and on CPU tensors inside
`dispatch.prefer_triton()` (the CUDA back end under TRITON_INTERPRET=1, engine/backend.py); the
torch references otherwise. The CPU back end's context is engine/flat_kv.py.

The per-segment path reads the same values by the same rule as the CPU back end's one softmax
but merges its calls by log-sum-exp, so its float sums depend on where a sequence's keys are
split (prefix, tail, window, chunk).

Invariants:
- Every new token's position is >= its sequence's prefix length (new tokens are never in the
  shared prefix), and the tail storage was reserved (KVManager.reserve) before the step.
- All index tensors (block tables, seq_idx, kv_lens, slot mappings) are built once per step on
  the host in `PagedKVContext.__init__`, never per layer, and reach the device as one packed
  upload (engine/kv_context.py `metadata()` -> engine/step_transfers.py -> `bind()`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edge_runtime.cache.recent_windows import exact_from, window_offset
from edge_runtime.engine.kv_context import StepKVContext
from edge_runtime.engine.kv_storage import KVStorage
from edge_runtime.engine.kv_store import StoreView
from edge_runtime.kernels.dispatch import merge_attention, paged_attention, write_kv


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
    window: int | None = None  # its recent-key window (engine/recent_window.py)
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


# the calls a step may make, in the order `_build` appends them
CALL_KINDS = ("window", "fresh", "prefix", "tail_pages", "tail_inline")


@dataclass
class _Call:
    store: str
    block_table: torch.Tensor  # int32 [rows, max_blocks]
    seq_idx: torch.Tensor  # int32 [T]
    kv_lens: torch.Tensor  # int32 [T]
    kind: str = ""  # CALL_KINDS: which segment it reads (engine/cuda_graphs.py pads by kind)


def _pad_rows(rows: list[list[int]]) -> torch.Tensor:
    width = max(1, max((len(r) for r in rows), default=1))
    table = torch.zeros(len(rows), width, dtype=torch.int32)
    for i, r in enumerate(rows):
        table[i, : len(r)] = torch.tensor(r, dtype=torch.int32)
    return table


class PagedKVContext(StepKVContext):
    """Per-step view of the paged storage (the CUDA back end); pass to CausalLM.forward as `kv`."""

    def __init__(self, storage: KVStorage, seqs: list[SeqStep], sm_scale: float):
        super().__init__(storage, seqs, sm_scale)
        self.calls: list[_Call] = []
        self.slot_mapping: dict[str, torch.Tensor] = {}
        self.window_slots: torch.Tensor | None = None  # window writes, -1 none
        self.fresh: tuple | None = None  # _fresh_store's indices
        self._build(seqs)

    def _build(self, seqs: list[SeqStep]) -> None:
        """slot_mapping per store and the per-segment attention calls."""
        num_tokens = self.num_tokens
        seq_of_token = torch.repeat_interleave(
            torch.arange(len(seqs)), torch.tensor([s.num_new for s in seqs])
        )  # [T]
        positions = torch.cat([torch.arange(s.start, s.start + s.num_new) for s in seqs])  # [T]
        prefix_len = torch.tensor([s.prefix_len for s in seqs])[seq_of_token]  # [T]
        assert bool((positions >= prefix_len).all()), "a new token lies inside the shared prefix"
        tail_pos = positions - prefix_len  # [T] offset inside the tail
        tail_len = (tail_pos + 1).to(torch.int32)
        # int8 keys read by each token: positions < limit (recent-key windows cut it, below)
        limit = self._window_calls(seqs, seq_of_token, positions)
        has_prefix = [s.prefix_len > 0 for s in seqs]
        if any(has_prefix):
            lens = torch.tensor([s.prefix_len for s in seqs], dtype=torch.int32)[seq_of_token]
            lens = torch.minimum(lens, limit).to(torch.int32)
            self.calls.append(_Call("pages", _pad_rows([list(s.prefix_pages) for s in seqs]),
                                    seq_of_token.to(torch.int32), lens, "prefix"))
        P = self.storage.store("pages").block_tokens
        # tokens before an inline tail's slots: its full pages ([p, b) in the pool)
        in_pages = torch.tensor([len(s.full_pages) * P if s.tail_kind == "inline" else 1 << 40
                                 for s in seqs])[seq_of_token]  # [T]
        for kind in ("pages", "inline"):
            rows = [list(s.page_rows()) if kind == "pages" else
                    list(s.tail_ids) if s.tail_kind == "inline" else [] for s in seqs]
            if not any(rows):
                continue
            table = _pad_rows(rows)
            block = self.storage.store(kind).block_tokens
            tail_limit = (limit - prefix_len).clamp(min=0)  # int8 positions read in the tail
            if kind == "pages":
                lens = torch.minimum(torch.minimum(tail_len, in_pages), tail_limit)
                pos_in, writes = tail_pos, tail_pos < in_pages
            else:
                lens = torch.minimum((tail_len - in_pages).clamp(min=0),
                                     (tail_limit - in_pages).clamp(min=0))
                pos_in, writes = tail_pos - in_pages, tail_pos >= in_pages
            has_rows = torch.tensor([len(r) > 0 for r in rows])[seq_of_token]
            self.calls.append(_Call(kind, table, seq_of_token.to(torch.int32),
                                    torch.where(has_rows, lens, 0).to(torch.int32), f"tail_{kind}"))
            writes &= has_rows
            if not bool(writes.any()):
                continue
            idx = (pos_in // block).clamp(min=0, max=table.shape[1] - 1)
            block_id = table.long()[seq_of_token, idx]
            n_blocks = torch.tensor([len(r) for r in rows])[seq_of_token]
            assert bool((pos_in[writes] // block < n_blocks[writes]).all()), \
                "tail storage not reserved for every new token"
            slots = block_id * block + pos_in.clamp(min=0) % block
            self.slot_mapping[kind] = torch.where(writes, slots, -1).to(torch.int64)
        assert sum(int((m >= 0).sum()) for m in self.slot_mapping.values()) == num_tokens

    def _window_calls(self, seqs: list[SeqStep], seq_of_token: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:
        """Recent-key windows on the per-segment path, by the read rule of
        cache/recent_windows.py (query i reads its block [i - i % W, i] exact): a windowed
        decode token reads its block through a "window" call (its own K/V written there first),
        a windowed prefill token through a "fresh" call over a store of its sequence's exact
        blocks (the window's carried positions, then the step's own K/V in fp16; `_fresh_store`);
        every new token in its sequence's last block is written to the window. Returns the
        per-token limit of the int8 positions read (all of [0, pos] without a window)."""
        limit = positions + 1
        if not any(s.window is not None for s in seqs):
            return limit
        W = self.storage.store("window").block_tokens
        per_seq = lambda f, dtype=torch.int64: torch.tensor([f(s) for s in seqs], dtype=dtype)[seq_of_token]
        has = per_seq(lambda s: s.window is not None, torch.bool)
        decode = per_seq(lambda s: s.num_new == 1, torch.bool)
        end, window = per_seq(lambda s: s.start + s.num_new), per_seq(lambda s: s.window or 0)
        block = exact_from(positions, W)
        limit = torch.where(has, block, limit)
        self.calls.append(_Call("window", _pad_rows([[s.window or 0] for s in seqs]),
                                seq_of_token.to(torch.int32),
                                torch.where(has & decode, positions + 1 - block, 0).to(torch.int32),
                                "window"))
        writes = has & (positions >= exact_from(end - 1, W))
        self.window_slots = torch.where(writes, window * W + window_offset(positions, W), -1)
        fresh = [i for i, s in enumerate(seqs) if s.window is not None and s.num_new > 1]
        if fresh:
            self._fresh_call(seqs, fresh, seq_of_token, positions, has & ~decode, W)
        return limit

    def _fresh_call(self, seqs, fresh: list[int], seq_of_token, positions, is_fresh, W: int) -> None:
        """The "fresh" call: one W-token block per block a windowed prefill row reads exact,
        [b, end) (b: its first token's block start); a token reads its block up to itself."""
        first_block = torch.zeros(len(seqs), dtype=torch.int64)  # the row's first fresh block
        carry_src, carry_dst, num_blocks = [], [], 0
        for i in fresh:
            s = seqs[i]
            b = exact_from(s.start, W)
            first_block[i] = num_blocks - b // W  # + position // W: the position's block
            carried = torch.arange(b, s.start)
            carry_src.append(s.window * W + window_offset(carried, W))
            carry_dst.append(num_blocks * W + carried - b)
            num_blocks += (s.start + s.num_new - 1) // W - b // W + 1
        src = torch.nonzero(is_fresh).squeeze(1)  # the fresh tokens, in batch order
        row = first_block[seq_of_token] + positions // W  # [T] (meaningful where fresh)
        dst = row[src] * W + window_offset(positions[src], W)
        self.fresh = (src, dst, torch.cat(carry_src), torch.cat(carry_dst), num_blocks, W)
        self.calls.append(_Call("fresh", torch.arange(num_blocks, dtype=torch.int32)[:, None],
                                torch.where(is_fresh, row, 0).to(torch.int32),
                                torch.where(is_fresh, window_offset(positions, W) + 1, 0)
                                .to(torch.int32), "fresh"))

    def _fresh_store(self, x: torch.Tensor, window_cache: torch.Tensor) -> torch.Tensor:
        """The exact blocks of the windowed prefill rows as a paged store [B, W, Hkv, D] in the
        window's dtype for the "fresh" call: each row's carried positions copied from its window
        (window_cache: one layer's [num_windows, W, Hkv, D], before this step writes it), then
        its new tokens' K or V (x: [T, Hkv, D])."""
        src, dst, carry_src, carry_dst, blocks, width = self.fresh
        out = x.new_zeros(blocks * width, *x.shape[1:], dtype=window_cache.dtype)
        out.index_copy_(0, carry_dst, window_cache.reshape(-1, *x.shape[1:])[carry_src])
        out.index_copy_(0, dst, x[src].to(window_cache.dtype))
        return out.view(blocks, width, *x.shape[1:])

    def _attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        fresh = None
        if self.fresh is not None:  # before the window writes: it reads carried positions
            window = self.storage.view("window", layer)
            fresh = StoreView(self._fresh_store(k, window.k_cache),
                              self._fresh_store(v, window.v_cache), None, None)
        for store, slots in self.slot_mapping.items():
            view = self.storage.view(store, layer)
            write_kv(k, v, view.k_cache, view.v_cache, view.k_scale, view.v_scale, slots, view.k_mean,
                     chunks=view.chunks)
        if self.window_slots is not None:
            view = self.storage.view("window", layer)
            write_kv(k, v, view.k_cache, view.v_cache, None, None, self.window_slots)
        outs, lses = [], []
        for call in self.calls:
            if call.store == "fresh":
                view = fresh
            else:
                view = self.storage.view(call.store, layer)
            out, lse = paged_attention(q, view.k_cache, view.v_cache, view.k_scale, view.v_scale,
                                       call.block_table, call.seq_idx, call.kv_lens, self.sm_scale,
                                       k_mean=view.k_mean, chunks=view.chunks)
            outs.append(out)
            lses.append(lse)
        return merge_attention(outs, lses).to(q.dtype)
