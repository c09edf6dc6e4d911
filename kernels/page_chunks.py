"""A paged store split into chunks of pages, one allocation per chunk, as the kernels address it.

The CUDA back end's pool is one tensor per chunk (per K, V and scales; kv/storage.py), so a
retired chunk's device memory goes back to the caching allocator and from there to the driver.
Block tables keep global page ids; page `p` lives in chunk `c = p // chunk_pages`, row
`p - c * chunk_pages`. The kernels get chunk 0's tensors (their pointers, strides, shapes) and
`offsets`, int64 [num_chunks, 4]: the element offset of chunk c's K, K scales, V and V scales from
chunk 0's, so a page's first element is `base + offsets[c, col] + row * page_stride`
(`page_start`: one table load per tile or page). The offsets are differences of addresses, so the
same code runs compiled (device addresses) and in the Triton interpreter on CPU tensors (host
addresses). A plain tensor [N, P, Hkv, D] is one chunk of N pages (`single_chunk`).

Invariants: every chunk has `chunk_pages` pages except the last (fewer); chunk 0 is never retired
(it is the kernels' base); `offsets` is updated in place (its address never changes) and a retired
chunk's row is 0 (chunk 0's first page: a block table never names a retired page, and a stray read
stays inside live memory); chunk tensors are None while retired, and nothing else here holds them.

The references (paged_attention_ref, positional_attention_ref, write_kv_ref) read and write the
chunk tensors themselves (`take_pages`, `take_tokens`, `put_tokens`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

COLUMNS = ("k", "k_scale", "v", "v_scale")  # offsets' columns; a V launch of write_kv reads 2, 3


@dataclass(frozen=True)
class PageChunks:
    """One layer of a chunked store: chunk c's [pages_c, P, Hkv, D] views (None: retired)."""

    chunk_pages: int
    num_pages: int
    offsets: torch.Tensor  # int64 [num_chunks, 4] on the store's device, columns COLUMNS
    k: tuple
    k_scale: tuple | None
    v: tuple
    v_scale: tuple | None


_SINGLE: dict[torch.device, torch.Tensor] = {}


def single_chunk(cache: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(offsets, chunk_pages) of a plain cache: one chunk at offset 0 holding all its pages."""
    table = _SINGLE.get(cache.device)
    if table is None:
        table = _SINGLE[cache.device] = torch.zeros(1, len(COLUMNS), dtype=torch.int64, device=cache.device)
    return table, max(1, cache.shape[0])


def table_of(cache: torch.Tensor, chunks: PageChunks | None) -> tuple[torch.Tensor, int]:
    """(offsets, chunk_pages) the kernels take for `cache` (chunk 0's view when chunked)."""
    if chunks is None:
        return single_chunk(cache)
    assert chunks.offsets.device == cache.device, (chunks.offsets.device, cache.device)
    assert cache.data_ptr() in (chunks.k[0].data_ptr(), chunks.v[0].data_ptr()), \
        "a chunked cache is passed as chunk 0's views"
    return chunks.offsets, chunks.chunk_pages


def num_pages(cache: torch.Tensor, chunks: PageChunks | None) -> int:
    return cache.shape[0] if chunks is None else chunks.num_pages


def element_offsets(chunk_tensors: list[tuple]) -> list[list[int]]:
    """Per chunk (k, k_scale, v, v_scale) tensors (None where absent or retired) -> offsets rows:
    each tensor's element offset from chunk 0's tensor of the same column (0 where None)."""
    base = chunk_tensors[0]
    rows = []
    for tensors in chunk_tensors:
        row = []
        for t, b in zip(tensors, base):
            if t is None or b is None:
                row.append(0)
                continue
            delta = t.data_ptr() - b.data_ptr()
            assert delta % t.element_size() == 0, f"chunk not aligned to its elements: {delta}"
            row.append(delta // t.element_size())
        rows.append(row)
    return rows


def _pieces(chunk_pages: int, page_ids: torch.Tensor):
    """-> [(chunk, mask, rows)] for the chunks that page_ids (long) touch."""
    chunk = page_ids // chunk_pages
    for c in torch.unique(chunk).tolist():
        mask = chunk == c
        yield c, mask, page_ids[mask] - c * chunk_pages


def take_pages(tensors: tuple, chunk_pages: int, page_ids: torch.Tensor) -> torch.Tensor:
    """tensors[c][p - c * chunk_pages] for every page id p (long, any shape): the pool's pages
    gathered across chunks -> [*page_ids.shape, *page shape]."""
    if len(tensors) == 1:
        return tensors[0][page_ids]
    out = tensors[0].new_empty(*page_ids.shape, *tensors[0].shape[1:])
    for c, mask, rows in _pieces(chunk_pages, page_ids):
        assert tensors[c] is not None, f"page in retired chunk {c}"
        out[mask] = tensors[c][rows]
    return out


def take_tokens(tensors: tuple, chunk_pages: int, page: torch.Tensor, off: torch.Tensor) -> torch.Tensor:
    """tensors[c][p - c * chunk_pages, off] per token (page, off long, any shape): single tokens
    gathered across chunks -> [*page.shape, *token shape]."""
    if len(tensors) == 1:
        return tensors[0][page, off]
    out = tensors[0].new_empty(*page.shape, *tensors[0].shape[2:])
    for c, mask, rows in _pieces(chunk_pages, page):
        assert tensors[c] is not None, f"page in retired chunk {c}"
        out[mask] = tensors[c][rows, off[mask]]
    return out


def put_tokens(tensors: tuple, chunk_pages: int, page: torch.Tensor, off: torch.Tensor,
               values: torch.Tensor) -> None:
    """tensors[c][p - c * chunk_pages, off] = values per token (page, off long [T])."""
    if len(tensors) == 1:
        tensors[0][page, off] = values
        return
    for c, mask, rows in _pieces(chunk_pages, page):
        assert tensors[c] is not None, f"page in retired chunk {c}"
        tensors[c][rows, off[mask]] = values[mask]


if triton is not None:

    @triton.jit
    def page_start(page, chunk_ptr, chunk_pages, page_stride):
        """Element offset of page `page` (int32 ids, a scalar or a block) from the base pointer of
        the tensor whose offsets column `chunk_ptr` points at: its chunk's offset + its row there."""
        c = page // chunk_pages
        return tl.load(chunk_ptr + c * 4) + (page - c * chunk_pages).to(tl.int64) * page_stride
