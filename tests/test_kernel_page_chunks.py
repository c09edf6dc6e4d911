"""The pool-touching kernels (write_kv, paged_attention, paged_decode, positional attention) and their
torch references on
a pool split into chunks (kernels/page_chunks.py), under TRITON_INTERPRET=1: the same results as on
the one-tensor pool the chunks were copied from. The chunks lie in one buffer in shuffled order
with garbage between them (so chunk offsets are positive and negative, and a read of the wrong
bytes shows), and one chunk is retired (None, never named by a block table)."""
import sys
from pathlib import Path

import pytest
import torch

from kernel_helpers import HAVE_TRITON, default_scale, key_mean, make_cache
from edge_runtime.kernels import page_chunks
from edge_runtime.kernels.kv_write import write_kv_ref
from edge_runtime.kernels.paged_attention import paged_attention_ref
from edge_runtime.kernels.positional_attention_ref import PositionIndex, positional_attention_ref

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")

if HAVE_TRITON:
    from edge_runtime.kernels.kv_write import write_kv_triton
    from edge_runtime.kernels.paged_attention import paged_attention_triton
    from edge_runtime.kernels.positional_attention import positional_attention_triton

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the gpu_lab package
    from gpu_lab.paged_decode import paged_decode  # the GPU checks' page-tile decode kernel

NUM_PAGES, CHUNK_PAGES, RETIRED = 11, 3, 2  # chunks of 3, 3, 3 and 2 pages; chunk 2 retired
LAYERS, LAYER = 2, 1
ORDER = (3, 0, 2, 1)  # where each chunk lies in the shared buffer: chunk 3 first, ...


def _split(tensor, buffer_fill, gap):
    """One layer's view [N, ...] of a [N, LAYERS, ...] pool -> per-chunk views of copies of its
    chunks, laid in one buffer in ORDER with `gap` elements of `buffer_fill` before each (chunk
    RETIRED: None)."""
    full = tensor._base if tensor._base is not None else tensor  # [N, LAYERS, ...]
    sizes = [min(CHUNK_PAGES, NUM_PAGES - c * CHUNK_PAGES) for c in range(len(ORDER))]
    row = full[0].numel()
    buffer = torch.full((sum(sizes) * row + gap * len(ORDER),), buffer_fill, dtype=full.dtype)
    start, chunks = 0, [None] * len(ORDER)
    for c in ORDER:
        start += gap
        n = sizes[c]
        part = buffer[start:start + n * row].view(n, *full.shape[1:])
        part.copy_(full[c * CHUNK_PAGES:c * CHUNK_PAGES + n])
        chunks[c] = part[:, LAYER] if c != RETIRED else None
        start += n * row
    return tuple(chunks)


def _chunked(pool):
    """(chunk 0's views, PageChunks) of a make_cache pool split by _split."""
    # a different gap per tensor: K, V and their scales sit at different offsets in every chunk
    k, v, ks, vs = (None if t is None else _split(t, 99 if t.dtype == torch.int8 else 7.0, gap)
                    for t, gap in zip(pool, (40, 56, 24, 72)))
    cols = [(k[c], ks[c] if ks else None, v[c], vs[c] if vs else None) for c in range(len(ORDER))]
    offsets = torch.tensor(page_chunks.element_offsets(cols), dtype=torch.int64)
    chunks = page_chunks.PageChunks(CHUNK_PAGES, NUM_PAGES, offsets, k, ks, v, vs)
    assert (offsets[:, 0] < 0).any() and (offsets[:, 0] > 0).any()  # chunks on both sides of 0
    assert not torch.equal(offsets[:, 0], offsets[:, 2])  # a V read through K's column shows
    return (k[0], v[0], ks[0] if ks else None, vs[0] if vs else None), chunks


def _live_pages(gen, count):
    live = [p for p in range(NUM_PAGES) if p // CHUNK_PAGES != RETIRED]
    return torch.tensor(live)[torch.randint(len(live), (count,), generator=gen)].to(torch.int32)


@pytest.mark.parametrize("dtype,centred", [(torch.int8, False), (torch.int8, True), (torch.float16, False)])
def test_attention_reads_chunked_pages_as_the_flat_pool(dtype, centred):
    gen = torch.Generator().manual_seed(5)
    d, heads, kv_heads, page_tokens = 16, 6, 2, 8
    mean = key_mean(kv_heads, d, gen) if centred else None
    flat = make_cache(NUM_PAGES, page_tokens, kv_heads, d, dtype, gen, layers=LAYERS, layer=LAYER,
                      k_mean=mean)
    base, chunks = _chunked(flat)
    bt = _live_pages(gen, 3 * 4).view(3, 4)
    seq_idx = torch.tensor([2, 0, 1], dtype=torch.int32)
    kv_lens = torch.tensor([1, 17, 29], dtype=torch.int32)
    q = torch.randn(3, heads, d, generator=gen)
    sc = default_scale(d)
    want = paged_attention_ref(q, *flat, bt, seq_idx, kv_lens, sc, k_mean=mean)
    got_ref = paged_attention_ref(q, *base, bt, seq_idx, kv_lens, sc, k_mean=mean, chunks=chunks)
    assert torch.equal(got_ref[0], want[0]) and torch.equal(got_ref[1], want[1])
    tol = dict(atol=2e-2, rtol=2e-2)  # paged_attention_triton's fp16 dot, as in its own tests
    out, lse = paged_attention_triton(q, *base, bt, seq_idx, kv_lens, sc, k_mean=mean, chunks=chunks)
    assert torch.allclose(out, want[0], **tol) and torch.allclose(lse, want[1], **tol)
    # prefill: several query tokens of one row, causal lengths
    pre_seq = torch.zeros(5, dtype=torch.int32)
    pre_lens = torch.arange(20, 25, dtype=torch.int32)
    qp = torch.randn(5, heads, d, generator=gen)
    want = paged_attention_ref(qp, *flat, bt, pre_seq, pre_lens, sc, k_mean=mean)
    out, lse = paged_attention_triton(qp, *base, bt, pre_seq, pre_lens, sc, k_mean=mean, chunks=chunks)
    assert torch.allclose(out, want[0], **tol) and torch.allclose(lse, want[1], **tol)
    # paged_decode, two segments in one launch
    tail = (_live_pages(gen, 3 * 2).view(3, 2), seq_idx, torch.tensor([5, 0, 16], dtype=torch.int32))
    segs = [(bt, seq_idx, kv_lens), tail]
    out, lse = paged_decode(q, *base, segs, sc, tune={"block_n": 8}, k_mean=mean, chunks=chunks)
    parts = [paged_attention_ref(q, *flat, *s, sc, k_mean=mean) for s in segs]
    want_lse = torch.logsumexp(torch.stack([p[1] for p in parts]), dim=0)
    assert torch.allclose(lse, want_lse, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype,centred", [(torch.int8, True), (torch.float32, False)])
def test_write_kv_into_chunks_matches_the_flat_pool(dtype, centred):
    gen = torch.Generator().manual_seed(9)
    d, kv_heads, page_tokens = 16, 2, 4
    mean = key_mean(kv_heads, d, gen) if centred else None
    flat = make_cache(NUM_PAGES, page_tokens, kv_heads, d, dtype, gen, layers=LAYERS, layer=LAYER)
    pages = _live_pages(gen, 6).long()
    slots = pages * page_tokens + torch.randint(page_tokens, (6,), generator=gen)
    slots = torch.unique(slots)
    slots = torch.cat([slots, torch.tensor([-1])])  # a padding row: not written
    k = torch.randn(slots.numel(), kv_heads, d, generator=gen) * 2 + (0 if mean is None else mean)
    v = torch.randn(slots.numel(), kv_heads, d, generator=gen)
    for write in (write_kv_ref, write_kv_triton):
        want = [None if t is None else t.clone() for t in flat]
        write_kv_ref(k, v, *want, slots, mean)
        base, chunks = _chunked(flat)
        write(k, v, *base, slots, mean, chunks=chunks)
        for name, col in (("k", chunks.k), ("v", chunks.v), ("k_scale", chunks.k_scale),
                          ("v_scale", chunks.v_scale)):
            if col is None:
                continue
            t = want[("k", "v", "k_scale", "v_scale").index(name)]
            for c, part in enumerate(col):
                if part is not None:  # bit-exact, and nothing outside the written rows moved
                    rows = t[c * CHUNK_PAGES:c * CHUNK_PAGES + part.shape[0]]
                    assert torch.equal(part, rows), (write, name, c)


def _position_index(gen, page_tokens):
    """Rows of live pages: a 5-token prefix + tail pages; a 9-token prefix, one full tail page, then
    inline slots from 9 + page_tokens; tail pages only. Spans of 16 positions."""
    pages = _live_pages(gen, 3 * 4).view(3, 4)
    assert len(set((pages // CHUNK_PAGES).flatten().tolist())) == 3  # every live chunk is read
    arena_table = torch.tensor([[0, 0, 0], [2, 0, 3], [0, 0, 0]], dtype=torch.int32)
    bounds = torch.tensor([[5, -5 % page_tokens, 1 << 30], [9, -9 % page_tokens, 16 + page_tokens],
                           [0, 0, 1 << 30]], dtype=torch.int32)
    seq_idx = torch.tensor([0, 1, 1, 2, 0], dtype=torch.int32)
    key_end = torch.tensor([27, 18, 35, 30, 6], dtype=torch.int32)
    return PositionIndex(pages, arena_table, seq_idx, key_end, bounds, 16, 3)


@pytest.mark.parametrize("dtype,centred", [(torch.int8, False), (torch.int8, True), (torch.float16, False)])
def test_positional_attention_reads_chunked_pages_bit_for_bit(dtype, centred):
    """Keys found by position in a chunked pool (and a one-tensor arena): the same bits as from the
    one-tensor pool, in the reference and in the Triton kernel (its reduction order is untouched)."""
    gen = torch.Generator().manual_seed(11)
    d, heads, kv_heads, page_tokens = 16, 6, 2, 8
    mean = key_mean(kv_heads, d, gen) if centred else None
    flat = make_cache(NUM_PAGES, page_tokens, kv_heads, d, dtype, gen, layers=LAYERS, layer=LAYER,
                      k_mean=mean)
    arena = make_cache(4, 4, kv_heads, d, dtype, gen, k_mean=mean)
    base, chunks = _chunked(flat)
    index = _position_index(gen, page_tokens)
    q = torch.randn(5, heads, d, generator=gen)
    args, sc = (arena, index, default_scale(d)), dict(k_mean=mean)
    want = positional_attention_ref(q, flat, *args, **sc)
    got = positional_attention_ref(q, base, *args, **sc, chunks=chunks)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    tune = dict(tune={"block_n": 8})
    want_t = positional_attention_triton(q, flat, *args, **sc, **tune)
    got_t = positional_attention_triton(q, base, *args, **sc, **tune, chunks=chunks)
    assert torch.equal(got_t[0], want_t[0]) and torch.equal(got_t[1], want_t[1])
    assert torch.allclose(got_t[0], want[0], atol=2e-2, rtol=2e-2)  # and it is attention
    assert torch.equal(torch.isfinite(got_t[1]), torch.isfinite(want[1]))
