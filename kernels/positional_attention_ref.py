"""Position-addressed attention: the index, its torch reference, and the in-order merge.

Semantics (the Triton kernel in positional_attention.py computes the same): query token t belongs
to block-table row r = seq_idx[t] and reads the keys at absolute positions [0, key_end[t]) of its
sequence (from key_start[t] when the index has one: a sliding-window layer), cut into spans of
`span_tokens` absolute positions; it returns one partial (out, lse) per
span: out [T, H, S, D], lse [T, H, S] (an empty span: out 0, lse -inf). Where position n of row r
lives (row_bounds[r] = (prefix_len p, gap, inline_from b)):

  n < p:       the shared prefix: pool page pool_table[r, n // P], offset n % P
  p <= n < b:  the private tail's pages, from slot 0 of the page after the prefix's last one:
               v = n + gap (gap = ceil(p / P) * P - p), pool page pool_table[r, v // P], offset v % P
  n >= b:      inline slots: arena slot arena_table[r, (n - b) // S], offset (n - b) % S

so a row of pool_table is the prefix pages followed by the tail's pages, and a key's address is a
function of its position. `merge_in_order` merges the spans (and an optional extra partial, the
exact block of the recent-key window) in position order by one formula.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from edge_runtime.kernels import page_chunks as _chunks
from edge_runtime.kernels.quantize import dequantize_int8_keys

NO_INLINE = 1 << 30  # inline_from of a row without inline slots
_MAX_GATHERED = 1 << 24  # gathered key elements per chunk of tokens in the reference


@dataclass
class PositionIndex:
    """Where every key of a step lives, built once per step (kv/paged_context.py)."""

    pool_table: torch.Tensor  # int32 [R, pool pages]: prefix pages, then tail pages
    arena_table: torch.Tensor  # int32 [R, slots]: inline slots (one zero column if none)
    seq_idx: torch.Tensor  # int32 [T]: each token's row
    key_end: torch.Tensor  # int32 [T]: keys [0, key_end) are read
    row_bounds: torch.Tensor  # int32 [R, 3]: (prefix_len, gap, inline_from)
    span_tokens: int
    num_spans: int  # spans of the longest key_end (known on the host: no sync)
    # int32 [T] or None (0): keys [key_start, key_end) are read (a sliding-window layer's cut,
    # kv/layer_windows.py)
    key_start: torch.Tensor | None = None

    def to(self, device) -> "PositionIndex":
        return PositionIndex(self.pool_table.to(device), self.arena_table.to(device),
                             self.seq_idx.to(device), self.key_end.to(device),
                             self.row_bounds.to(device), self.span_tokens, self.num_spans,
                             None if self.key_start is None else self.key_start.to(device))


def check_index(q, pool, arena, index: PositionIndex) -> None:
    """ValueError naming what is wrong with the arguments of positional attention."""
    k, v, ks, vs = pool
    if q.dim() != 3 or k.dim() != 4 or k.shape != v.shape or k.shape[3] != q.shape[2]:
        raise ValueError(f"q [T, H, D] and a pool [N, P, Hkv, D] of the same D; got "
                         f"{tuple(q.shape)} and {tuple(k.shape)}")
    if q.shape[1] % k.shape[2]:
        raise ValueError(f"query heads ({q.shape[1]}) must be a multiple of kv heads ({k.shape[2]})")
    if (k.dtype == torch.int8) != (ks is not None and vs is not None):
        raise ValueError("int8 stores need k and v scales [N, P, Hkv]; float stores none")
    if arena is not None and (arena[0].dtype != k.dtype or arena[0].shape[2:] != k.shape[2:]):
        raise ValueError(f"the arena {arena[0].dtype} {tuple(arena[0].shape)} must match the pool "
                         f"{k.dtype} {tuple(k.shape)} in dtype, kv heads and head_dim")
    t = q.shape[0]
    named = [("seq_idx", index.seq_idx), ("key_end", index.key_end)]
    if index.key_start is not None:
        named.append(("key_start", index.key_start))
    for name, x in named:
        if x.shape != (t,) or x.dtype != torch.int32:
            raise ValueError(f"{name} must be int32 [T={t}]; got {x.dtype} {tuple(x.shape)}")
    rows = index.pool_table.shape[0]
    for name, x in (("pool_table", index.pool_table), ("arena_table", index.arena_table)):
        if x.dim() != 2 or x.dtype != torch.int32 or x.shape[0] != rows or x.stride(1) != 1:
            raise ValueError(f"{name} must be a row-contiguous int32 [R={rows}, n]; got "
                             f"{x.dtype} {tuple(x.shape)}")
    if index.row_bounds.shape != (rows, 3) or index.row_bounds.dtype != torch.int32:
        raise ValueError(f"row_bounds must be int32 [R={rows}, 3]; got {tuple(index.row_bounds.shape)}")
    if index.span_tokens <= 0 or index.num_spans <= 0:
        raise ValueError(f"span_tokens and num_spans must be positive; got {index.span_tokens}, "
                         f"{index.num_spans}")


def _addresses(index: PositionIndex, rows, length: int, page_tokens: int, slot_tokens: int):
    """-> (in_arena bool [t, L], (pool page, offset), (arena slot, offset)), each long [t, L]."""
    n = torch.arange(length, device=rows.device).unsqueeze(0)  # [1, L]
    p, gap, b = index.row_bounds.long()[rows].unbind(-1)  # [t] each
    vpos = torch.where(n < p[:, None], n, n + gap[:, None])
    pool_row = index.pool_table.long()[rows]
    page = pool_row.gather(1, (vpos // page_tokens).clamp(max=pool_row.shape[1] - 1))
    apos = (n - b[:, None]).clamp(min=0)
    arena_row = index.arena_table.long()[rows]
    slot = arena_row.gather(1, (apos // slot_tokens).clamp(max=arena_row.shape[1] - 1))
    return (n >= b[:, None], (page, vpos % page_tokens), (slot, apos % slot_tokens))


def _columns(store, chunks=None):
    """A (k, v, k_scale, v_scale) store -> ([each as (chunk tensors, chunk_pages) or None], pages):
    a plain store is one chunk; a chunked one's tensors are `chunks`' (kernels/page_chunks.py)."""
    if chunks is None:
        n = store[0].shape[0]
        return [None if t is None else ((t,), max(1, n)) for t in store], n
    tensors = (chunks.k, chunks.v, chunks.k_scale, chunks.v_scale)
    return [None if t is None else (t, chunks.chunk_pages) for t in tensors], chunks.num_pages


def _read(store, at, is_key, k_mean):
    """The float32 keys or values [t, L, Hkv, D] at (page, offset) `at` of a _columns store."""
    columns, pages = store
    cache, scale = (columns[0], columns[2]) if is_key else (columns[1], columns[3])
    page, off = at[0].clamp(0, pages - 1), at[1]
    x = _chunks.take_tokens(*cache, page, off)
    if scale is None:
        return x.float()
    return dequantize_int8_keys(x, _chunks.take_tokens(*scale, page, off), k_mean if is_key else None)


def _gather(pool, arena, addresses, is_key, k_mean):
    """pool, arena: _columns stores (arena None); addresses: _addresses'
    -> float32 keys or values [t, L, Hkv, D]."""
    in_arena, pool_at, arena_at = addresses
    x = _read(pool, pool_at, is_key, k_mean)
    if arena is not None:
        x = torch.where(in_arena[..., None, None], _read(arena, arena_at, is_key, k_mean), x)
    return x


def positional_attention_ref(q, pool, arena, index: PositionIndex, sm_scale, k_mean=None, chunks=None):
    """q [T, H, D]; pool, arena: (k, v, k_scale, v_scale) stores [N, P, Hkv, D] (arena may be None);
    chunks: the pool's PageChunks when it is chunked (pool: chunk 0's views; kernels/page_chunks.py)
    -> (out float32 [T, H, S, D], lse float32 [T, H, S]), S = index.num_spans."""
    check_index(q, pool, arena, index)
    pool_cols, arena_cols = _columns(pool, chunks), None if arena is None else _columns(arena)
    slot_tokens = arena[0].shape[1] if arena is not None else 1
    t_all, h, d = q.shape
    s_count, span = index.num_spans, index.span_tokens
    out = torch.zeros(t_all, h, s_count, d, dtype=torch.float32, device=q.device)
    lse = torch.full((t_all, h, s_count), float("-inf"), dtype=torch.float32, device=q.device)
    length = s_count * span
    g = h // pool[0].shape[2]
    chunk = max(1, _MAX_GATHERED // (length * pool[0].shape[2] * d))
    for a in range(0, t_all, chunk):
        rows = index.seq_idx[a:a + chunk].long()
        at = _addresses(index, rows, length, pool[0].shape[1], slot_tokens)
        k = _gather(pool_cols, arena_cols, at, True, k_mean).repeat_interleave(g, dim=2)
        v = _gather(pool_cols, arena_cols, at, False, None).repeat_interleave(g, dim=2)
        scores = torch.einsum("thd,tlhd->thl", q[a:a + chunk].float(), k) * sm_scale  # [t, H, L]
        valid = torch.arange(length, device=q.device) < index.key_end[a:a + chunk, None].long()
        if index.key_start is not None:
            valid &= torch.arange(length, device=q.device) >= index.key_start[a:a + chunk, None].long()
        scores = scores.masked_fill(~valid[:, None, :], float("-inf")).view(-1, h, s_count, span)
        part_lse = torch.logsumexp(scores, dim=-1)  # [t, H, S]; -inf for an empty span
        probs = torch.exp(scores - part_lse.nan_to_num(neginf=0.0)[..., None]).nan_to_num(0.0)
        out[a:a + chunk] = torch.einsum("thsl,tslhd->thsd", probs, v.view(-1, s_count, span, h, d))
        lse[a:a + chunk] = part_lse
    return out, lse


def merge_in_order_ref(p_out, p_lse, extra=None):
    """p_out [T, H, S, D], p_lse [T, H, S] (+ extra (out [T, H, D], lse [T, H]) as a last partial)
    -> out float32 [T, H, D]: partials weighted by exp(lse - max lse), summed in index order."""
    outs = list(p_out.float().unbind(2))
    lses = list(p_lse.float().unbind(2))
    if extra is not None:
        outs.append(extra[0].float())
        lses.append(extra[1].float())
    top = torch.stack(lses).amax(dim=0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    acc = torch.zeros_like(outs[0])
    den = torch.zeros_like(top)
    for o, x in zip(outs, lses):
        w = torch.exp(x - top)  # 0 for an empty partial
        acc = acc + w[..., None] * o
        den = den + w
    return torch.where(den[..., None] > 0, acc / den.clamp_min(1e-30)[..., None], torch.zeros_like(acc))
