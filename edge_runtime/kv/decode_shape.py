"""A decode step's index tensors at fixed shapes: kv/paged_context.py's PagedKVContext built with a
`DecodeShape`, so that every step of one batch-size bucket has the same tensor names, shapes and
dtypes and the same host values (span count, exact-block count), and a CUDA graph captured on one
replays any other with new contents (engine/cuda_graphs.py).

Rows n..rows-1 are padding (the caller pads ids and positions with 0): key_end 0 (an empty read:
every span's lse is -inf, merged with weight exactly 0), row_bounds (0, 0, NO_INLINE), empty
pool and arena rows, slot -1 in every store and in the window (nothing written). Tables have the
shape's widths; the span count is the shape's (an empty span adds exact zeros to the merge). The
exact-block store has one W-token block per row: block r receives row r's whole window (the
carried positions, and offsets past the token, which it does not read: kv_len = offset + 1), then
row r's new token; a row without a window copies window 0 and reads none of it (kv_len 0).

So a real row reads the same values as in the unpadded step, through per-token programs, and its
attention output is the same bits (tests/test_cuda_graphs.py checks the logits).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from edge_runtime.kv.page_math import pages_for_sequence_at_most
from edge_runtime.kernels import positional_attention
from edge_runtime.kernels.positional_attention import NO_INLINE, PositionIndex


class DoesNotFit(Exception):
    """The step cannot take the fixed shape (a prefill token, too many rows, a wider table, a
    longer read); it runs at its own shapes."""


@dataclass(frozen=True)
class DecodeShape:
    rows: int  # one token per row; rows past the step's sequences are padding
    pool_pages: int  # pool_table columns: prefix pages then tail pages of one sequence
    arena_slots: int  # arena_table columns: inline slots of one sequence
    num_spans: int  # spans of the longest read

    @classmethod
    def for_storage(cls, storage, rows: int, max_positions: int) -> "DecodeShape":
        """The widths that hold any sequence of up to max_positions tokens on `storage`: a
        partial prefix page and the tail's pages; at most a page's worth of inline slots."""
        page_tokens = storage.store("pages").block_tokens
        slots = 1
        if storage.inline is not None:
            slot_tokens = storage.store("inline").block_tokens
            slots = max(1, min(storage.store("inline").num_blocks, math.ceil(page_tokens / slot_tokens)))
        return cls(rows, pages_for_sequence_at_most(max_positions, page_tokens), slots,
                   math.ceil(max_positions / positional_attention.TUNE["span_tokens"]))


def check_fits(seqs, shape: DecodeShape) -> None:
    if len(seqs) > shape.rows or any(s.num_new != 1 for s in seqs):
        raise DoesNotFit(f"{len(seqs)} sequences, {sum(s.num_new for s in seqs)} tokens")


def padded_index(index: PositionIndex, shape: DecodeShape) -> PositionIndex:
    if (index.pool_table.shape[1] > shape.pool_pages or index.arena_table.shape[1] > shape.arena_slots
            or index.num_spans > shape.num_spans):
        raise DoesNotFit(f"tables {tuple(index.pool_table.shape)} {tuple(index.arena_table.shape)}, "
                         f"{index.num_spans} spans")
    bounds = torch.tensor([[0, 0, NO_INLINE]], dtype=torch.int32).expand(shape.rows, 3).clone()
    bounds[:index.row_bounds.shape[0]] = index.row_bounds
    return PositionIndex(_pad_table(index.pool_table, shape.rows, shape.pool_pages),
                         _pad_table(index.arena_table, shape.rows, shape.arena_slots),
                         torch.arange(shape.rows, dtype=torch.int32),
                         pad(index.key_end, shape.rows, 0, torch.int32), bounds,
                         index.span_tokens, shape.num_spans)


def _pad_table(table: torch.Tensor, rows: int, width: int) -> torch.Tensor:
    out = torch.zeros(rows, width, dtype=torch.int32)
    out[:table.shape[0], :table.shape[1]] = table
    return out


def pad(t: torch.Tensor | None, rows: int, fill: int, dtype=torch.int64) -> torch.Tensor:
    """t [n] (None: empty) -> [rows], `fill` past n."""
    out = torch.full((rows,), fill, dtype=dtype)
    if t is not None:
        out[:t.shape[0]] = t
    return out


def exact_blocks(has: torch.Tensor, window: torch.Tensor, positions: torch.Tensor, W: int,
                 rows: int) -> tuple:
    """The exact-block indices of kv/paged_context.py's `exact` for a decode step padded to `rows`:
    has, window, positions [n] (windowed, window id, position of each real token)."""
    n = positions.shape[0]
    offset = pad(torch.where(has, positions % W, 0), rows, 0)  # [rows]
    window_of_row = pad(torch.where(has, window, 0), rows, 0)  # [rows]
    src = torch.arange(rows)
    dst = src * W + offset
    carry_src = (window_of_row[:, None] * W + torch.arange(W)).reshape(-1)  # [rows * W]
    carry_dst = torch.arange(rows * W)
    kv_lens = pad(torch.where(has, positions % W + 1, 0), rows, 0, torch.int32)
    assert n <= rows, (n, rows)
    return (src, dst, carry_src, carry_dst, rows, W, src.to(torch.int32)[:, None],
            src.to(torch.int32), kv_lens)
