"""Position-addressed attention (kernels/positional_attention.py; Triton under TRITON_INTERPRET=1)
against its torch reference, and the property it exists for: a token's partials are a function of
its position and the stored values alone, the same bits however its keys are split between prefix
pages, tail pages and inline slots, and whatever else is in the launch.

Tolerances as tests/test_kernel_paged_decode.py: int8 caches on the 15-bit fixed-point or magic
path 2e-2, fp32 caches 1e-4.
"""
import pytest
import torch

from kernel_helpers import HAVE_TRITON, key_mean
from edge_runtime.kernels.positional_attention import (PositionIndex, merge_in_order_ref,
                                                       merge_in_order_triton, positional_attention_ref,
                                                       positional_attention_triton)
from edge_runtime.kernels.quantize import quantize_int8, quantize_int8_keys

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")

D, P, SLOT = 16, 8, 4
TOL = {torch.int8: 2e-2, torch.float32: 1e-4}
TILES = {"block_n": 8}  # spans of 8 in the tests below: several spans on a few keys


def _store(blocks, block_tokens, hkv, dtype, gen, mean=None):
    """(k, v, k_scale, v_scale) of one layer of a 2-layer store, random."""
    shape = (blocks, 2, block_tokens, hkv, D)
    kf, vf = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    if mean is not None:
        kf = kf + (torch.rand(shape[:-1], generator=gen) < 0.5).unsqueeze(-1) * mean
    if dtype != torch.int8:
        return kf[:, 1].to(dtype), vf[:, 1].to(dtype), None, None
    (kq, ks), (vq, vs) = quantize_int8_keys(kf, mean), quantize_int8(vf)
    return kq[:, 1], vq[:, 1], ks[:, 1], vs[:, 1]


def _index(rows, seq_idx, key_end, span):
    """rows: (pool pages, arena slots, prefix_len, inline_from or None) per row."""
    width = lambda xs: max(1, max(len(x) for x in xs))
    pool = torch.zeros(len(rows), width([r[0] for r in rows]), dtype=torch.int32)
    arena = torch.zeros(len(rows), width([r[1] for r in rows]), dtype=torch.int32)
    bounds = []
    for i, (pages, slots, prefix, inline_from) in enumerate(rows):
        pool[i, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
        arena[i, :len(slots)] = torch.tensor(slots, dtype=torch.int32)
        bounds.append((prefix, -prefix % P, 1 << 30 if inline_from is None else inline_from))
    key_end = torch.tensor(key_end, dtype=torch.int32)
    return PositionIndex(pool, arena, torch.tensor(seq_idx, dtype=torch.int32), key_end,
                         torch.tensor(bounds, dtype=torch.int32), span, -(-int(key_end.max()) // span))


# row 0: prefix 13 (a partial second page), tail pages; row 1: prefix 8, one full tail page, then
# inline slots from 16; row 2: no prefix, inline only; row 3: pages only
ROWS = [((3, 5, 9, 2), (), 13, None), ((7, 10), (1, 4, 0), 8, 16), ((), (2, 5, 3), 0, 0),
        ((12, 13, 14), (), 0, None)]
SEQ = [0, 0, 0, 1, 1, 2, 3, 3]
ENDS = [1, 14, 29, 9, 25, 11, 0, 24]


@pytest.mark.parametrize("heads,kv_heads,dtype,centred,tune", [
    (4, 2, torch.int8, False, {}), (6, 2, torch.int8, True, {}), (4, 4, torch.int8, False, {"idot": False}),
    (4, 1, torch.float32, False, {}), (6, 3, torch.float16, False, {})])
@pytest.mark.parametrize("span,block_n", [(8, 8), (32, 16)])
def test_matches_reference(heads, kv_heads, dtype, centred, tune, span, block_n):
    gen = torch.Generator().manual_seed(heads + 5 * kv_heads + span)
    mean = key_mean(kv_heads, D, gen) if centred else None
    pool = _store(16, P, kv_heads, dtype, gen, mean)
    arena = _store(6, SLOT, kv_heads, dtype, gen, mean)
    index = _index(ROWS, SEQ, ENDS, span)
    q = torch.randn(len(SEQ), heads, D, generator=gen)
    args = (q, pool, arena, index, D ** -0.5)
    out, lse = positional_attention_triton(*args, k_mean=mean, tune={"block_n": block_n, **tune})
    want, want_lse = positional_attention_ref(*args, k_mean=mean)
    tol = TOL.get(dtype, 2e-2)
    assert torch.allclose(out, want, atol=tol, rtol=tol), float((out - want).abs().max())
    assert torch.equal(torch.isfinite(lse), torch.isfinite(want_lse))
    finite = torch.isfinite(want_lse)
    assert torch.allclose(lse[finite], want_lse[finite], atol=tol, rtol=tol)
    merged = merge_in_order_triton(out, lse)
    assert torch.allclose(merged, merge_in_order_ref(out, lse), atol=1e-6, rtol=1e-5)
    assert float(merged[6].abs().max()) == 0.0  # key_end 0: nothing read


def test_a_tokens_partials_do_not_depend_on_where_its_keys_are_stored():
    """The same 21 keys (positions 0..20) of one sequence stored four ways: all in tail pages, a
    13-token cached prefix + tail pages, that prefix + inline slots, a 5-token prefix + a full
    tail page + inline slots; the query of position 20 read alone, and in a launch with other tokens."""
    gen = torch.Generator().manual_seed(3)
    kf, vf = torch.randn(21, 2, D, generator=gen), torch.randn(21, 2, D, generator=gen)
    (kq, ks), (vq, vs) = quantize_int8(kf), quantize_int8(vf)
    pool = [torch.zeros(16, P, 2, D, dtype=torch.int8) for _ in range(2)] + \
        [torch.ones(16, P, 2, dtype=torch.float16) for _ in range(2)]
    arena = [torch.zeros(8, SLOT, 2, D, dtype=torch.int8) for _ in range(2)] + \
        [torch.ones(8, SLOT, 2, dtype=torch.float16) for _ in range(2)]

    def place(store, block, offset, n):
        for x, src in zip(store, (kq, vq, ks, vs)):
            x[block, offset] = src[n]

    layouts = [((4, 6, 11), (), 0, None), ((1, 2, 9, 15), (), 13, None), ((1, 2), (3, 0, 6), 13, 13),
               ((1, 8), (5, 7, 2), 5, 13)]
    for pages, slots, prefix, inline_from in layouts:  # write each layout's copy of the keys
        for n in range(21):
            if inline_from is not None and n >= inline_from:
                a = n - inline_from
                place(arena, slots[a // SLOT], a % SLOT, n)
            else:
                v = n if n < prefix else n + (-prefix % P)
                place(pool, pages[v // P], v % P, n)
    q = torch.randn(3, 4, D, generator=gen)
    results = []
    for i in range(len(layouts)):
        alone = _index([layouts[i]], [0], [21], 8)
        crowd = _index([ROWS[0], layouts[i]], [0, 1, 0], [29, 21, 5], 8)  # a longer row: more spans
        o1, l1 = positional_attention_triton(q[1:2], pool, arena, alone, D ** -0.5, tune=TILES)
        o2, l2 = positional_attention_triton(q, pool, arena, crowd, D ** -0.5, tune=TILES)
        assert torch.equal(o1[0], o2[1, :, :3]) and torch.equal(l1[0], l2[1, :, :3])
        assert bool(torch.isneginf(l2[1, :, 3]).all())
        results.append((merge_in_order_triton(o1, l1)[0], merge_in_order_triton(o2, l2)[1]))
    for alone, crowd in results:
        assert torch.equal(alone, results[0][0]) and torch.equal(crowd, results[0][0])


def test_merge_puts_the_extra_partial_last_and_skips_empty_ones():
    gen = torch.Generator().manual_seed(5)
    p_out, p_lse = torch.randn(3, 2, 4, D, generator=gen), torch.randn(3, 2, 4, generator=gen)
    p_lse[0, :, 2:] = float("-inf")
    p_out[0, :, 2:] = 0.0
    extra = (torch.randn(3, 2, D, generator=gen), torch.randn(3, 2, generator=gen))
    extra[1][2] = float("-inf")
    got = merge_in_order_triton(p_out, p_lse, extra)
    assert torch.allclose(got, merge_in_order_ref(p_out, p_lse, extra), atol=1e-6, rtol=1e-5)
    dense = torch.softmax(torch.cat([p_lse, extra[1][..., None]], -1), -1)
    want = (dense[..., None] * torch.cat([p_out, extra[0][:, :, None]], 2)).sum(2)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    # trailing empty partials change nothing, bit for bit
    first = (extra[0][:1], extra[1][:1])
    assert torch.equal(merge_in_order_triton(p_out[:1, :, :2], p_lse[:1, :, :2], first), got[:1])


def test_bad_index_is_refused():
    gen = torch.Generator().manual_seed(1)
    pool = _store(4, P, 2, torch.int8, gen)
    index = _index(ROWS[:1], [0], [5], 8)
    with pytest.raises(ValueError, match="seq_idx"):
        positional_attention_ref(torch.randn(2, 4, D), pool, None, index, 1.0)
    with pytest.raises(ValueError, match="multiple of block_n"):
        positional_attention_triton(torch.randn(1, 4, D), pool, None, index, 1.0, tune={"block_n": 16})


@pytest.mark.parametrize("dtype,centred", [(torch.int8, False), (torch.int8, True), (torch.float32, False)])
@pytest.mark.parametrize("span,block_n", [(8, 8), (32, 16)])
def test_key_start_reads_only_the_window(dtype, centred, span, block_n):
    """A sliding-window layer's index (key_start): Triton equals the reference, and each token's
    merged output equals full attention over its keys [key_start, key_end) computed densely (a
    start inside a tile, on a tile edge, at 0, past the end: nothing read)."""
    gen = torch.Generator().manual_seed(11 + span)
    mean = key_mean(2, D, gen) if centred else None
    pool = _store(16, P, 2, dtype, gen, mean)
    arena = _store(6, SLOT, 2, dtype, gen, mean)
    index = _index(ROWS, SEQ, ENDS, span)
    starts = [0, 3, 21, 0, 16, 5, 0, 25]  # token 7: start 25 > end 24, reads nothing
    windowed = PositionIndex(*[getattr(index, f) for f in ("pool_table", "arena_table", "seq_idx",
                                                           "key_end", "row_bounds", "span_tokens",
                                                           "num_spans")],
                             key_start=torch.tensor(starts, dtype=torch.int32))
    q = torch.randn(len(SEQ), 4, D, generator=gen)
    args = (q, pool, arena, windowed, D ** -0.5)
    out, lse = positional_attention_triton(*args, k_mean=mean, tune={"block_n": block_n})
    want, want_lse = positional_attention_ref(*args, k_mean=mean)
    tol = TOL[dtype]
    assert torch.equal(torch.isfinite(lse), torch.isfinite(want_lse))
    assert torch.allclose(out, want, atol=tol, rtol=tol), float((out - want).abs().max())
    merged = merge_in_order_ref(want, want_lse)
    full, full_lse = positional_attention_ref(q, pool, arena, index, D ** -0.5, k_mean=mean)
    for t, (start, end) in enumerate(zip(starts, ENDS)):
        if start >= end:
            assert float(merged[t].abs().max()) == 0.0 and bool(torch.isneginf(want_lse[t]).all())
            continue
        one = PositionIndex(index.pool_table, index.arena_table, index.seq_idx[t:t + 1],
                            torch.tensor([end], dtype=torch.int32), index.row_bounds, 1, end,
                            key_start=None)
        parts, parts_lse = positional_attention_ref(q[t:t + 1], pool, arena, one, D ** -0.5, k_mean=mean)
        # one key per span: keep those in [start, end) and merge
        keep = torch.arange(end) >= start
        dense = merge_in_order_ref(parts[:, :, keep], parts_lse[:, :, keep])
        assert torch.allclose(merged[t], dense[0], atol=1e-5, rtol=1e-5), t
    assert not torch.allclose(merged, merge_in_order_ref(full, full_lse))  # the cut mattered
