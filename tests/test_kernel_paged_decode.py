"""Page-tile decode attention (tools/gpu_lab/paged_decode.py, the GPU checks' baseline) under
TRITON_INTERPRET=1 against the torch reference.

The kernel computes in fp32 (q is not rounded to fp16, int8 values convert exactly), so the
tolerance is 1e-4 for every cache dtype; the reference dequantizes the same int8 values.
"""
import sys
from pathlib import Path

import pytest
import torch

from kernel_helpers import HAVE_TRITON, default_scale, key_mean, make_cache, random_block_table
from edge_runtime.kernels.paged_attention import merge_attention_ref, paged_attention_ref

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")

if HAVE_TRITON:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))  # the gpu_lab package
    from gpu_lab.paged_decode import paged_decode, supported, tile_rows

TOL = 1e-4


def _assert_close(got, want):
    out, lse = got
    w_out, w_lse = want
    assert torch.allclose(out, w_out, atol=TOL, rtol=TOL), float((out - w_out).abs().max())
    finite = torch.isfinite(w_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse[finite], w_lse[finite], atol=TOL, rtol=TOL)


@pytest.mark.parametrize("heads,kv_heads,dtype,block_n,magic", [
    (4, 4, torch.int8, 8, True), (6, 2, torch.int8, 16, True), (8, 2, torch.int8, 8, False),
    (6, 2, torch.float32, 8, True), (3, 1, torch.float16, 16, True)])
def test_one_segment_ragged(heads, kv_heads, dtype, block_n, magic):
    gen = torch.Generator().manual_seed(heads * 3 + kv_heads)
    d, page_tokens = 16, 16
    pool = make_cache(12, page_tokens, kv_heads, d, dtype, gen)
    bt = random_block_table(3, 4, 12, gen)
    seq_idx = torch.tensor([2, 0, 1, 0], dtype=torch.int32)  # rows out of order, one row twice
    kv_lens = torch.tensor([1, 16, 17, 61], dtype=torch.int32)  # length 1, a page, one past, ragged
    q = torch.randn(4, heads, d, generator=gen).to(torch.float16 if dtype == torch.float16 else torch.float32)
    assert supported(q, pool[0], bt, {"block_n": block_n})
    sc = default_scale(d)
    got = paged_decode(q, *pool, [(bt, seq_idx, kv_lens)], sc, tune={"block_n": block_n, "magic": magic})
    _assert_close(got, paged_attention_ref(q, *pool, bt, seq_idx, kv_lens, sc))
    got = paged_decode(q, *pool, [(bt, seq_idx, kv_lens)], sc, tune={"block_n": 64})  # tile halved to 16
    _assert_close(got, paged_attention_ref(q, *pool, bt, seq_idx, kv_lens, sc))


def test_two_segments_one_launch_with_empty_rows():
    """Shared prefix pages + private tails in one launch == merge of the two reference segments;
    a row whose tail is empty, and one with both segments empty (lse -inf, output 0)."""
    gen = torch.Generator().manual_seed(11)
    d, heads, kv_heads, page_tokens = 32, 6, 2, 8
    pool = make_cache(10, page_tokens, kv_heads, d, torch.int8, gen)
    q = torch.randn(3, heads, d, generator=gen)
    seq_idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    prefix = (torch.tensor([[7, 3], [7, 3], [7, 3]], dtype=torch.int32), seq_idx,
              torch.tensor([13, 13, 0], dtype=torch.int32))  # partial second prefix page
    tail = (random_block_table(3, 3, 7, gen), seq_idx, torch.tensor([19, 0, 0], dtype=torch.int32))
    sc = default_scale(d)
    out, lse = paged_decode(q, *pool, [prefix, tail], sc, tune={"block_n": 8})
    r1, l1 = paged_attention_ref(q, *pool, *prefix, sc)
    r2, l2 = paged_attention_ref(q, *pool, *tail, sc)
    want = merge_attention_ref([r1, r2], [l1, l2])
    assert torch.allclose(out, want, atol=TOL, rtol=TOL), float((out - want).abs().max())
    want_lse = torch.logaddexp(l1, l2)
    assert torch.allclose(lse[:2], want_lse[:2], atol=TOL)
    assert torch.isinf(lse[2]).all() and float(out[2].abs().max()) == 0.0


def test_unsupported_layouts_are_refused():
    gen = torch.Generator().manual_seed(2)
    pool = make_cache(4, 12, 2, 16, torch.int8, gen)  # 12-token pages: no 8-row tile divides them
    q = torch.randn(2, 4, 16, generator=gen)
    bt = torch.zeros(2, 2, dtype=torch.int32)
    idx = torch.zeros(2, dtype=torch.int32)
    assert not supported(q, pool[0], bt, {"block_n": 8})
    assert tile_rows(512, 64) == 64 and tile_rows(24, 64) == 8 and tile_rows(16, 128) == 16
    with pytest.raises(ValueError, match="paged_attention"):
        paged_decode(q, *pool, [(bt, idx, idx)], 0.25, tune={"block_n": 8})
    assert not supported(torch.randn(2, 4, 24, generator=gen), make_cache(4, 16, 2, 24, torch.int8, gen)[0],
                         bt, {"block_n": 8})  # head_dim 24
    assert not supported(torch.randn(2, 32, 16, generator=gen), make_cache(4, 16, 2, 16, torch.int8, gen)[0],
                         bt, {"block_n": 8})  # GQA group 16


@pytest.mark.parametrize("heads,kv_heads,block_n", [(4, 4, 32), (6, 2, 64)])
def test_int8_tensor_core_variant(heads, kv_heads, block_n):
    """idot: 15-bit fixed-point q and p * v_scale on int8 dots: within 1e-3 of the reference."""
    gen = torch.Generator().manual_seed(block_n + heads)
    d, page_tokens = 32, 64
    pool = make_cache(8, page_tokens, kv_heads, d, torch.int8, gen)
    bt = random_block_table(3, 3, 8, gen)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    lens = torch.tensor([1, 70, 150], dtype=torch.int32)
    q = torch.randn(3, heads, d, generator=gen)
    sc = default_scale(d)
    out, lse = paged_decode(q, *pool, [(bt, idx, lens)], sc, tune={"block_n": block_n, "idot": True})
    w_out, w_lse = paged_attention_ref(q, *pool, bt, idx, lens, sc)
    assert torch.allclose(out, w_out, atol=1e-3), float((out - w_out).abs().max())
    assert torch.allclose(lse, w_lse, atol=1e-3)


@pytest.mark.parametrize("heads,kv_heads,block_n,tune", [
    (4, 4, 8, {"magic": True}), (6, 2, 16, {"magic": False}), (6, 2, 32, {"idot": True})])
def test_centred_keys(heads, kv_heads, block_n, tune):
    """k_mean: about half the keys stored centred (negative scale); their scores gain q.m. Two
    segments in one launch; idot (int8 dots) within its 1e-3."""
    gen = torch.Generator().manual_seed(30 + heads + block_n)
    d, page_tokens = 16, 32
    mean = key_mean(kv_heads, d, gen)
    pool = make_cache(8, page_tokens, kv_heads, d, torch.int8, gen, k_mean=mean)
    assert 0.2 < float((pool[2] < 0).float().mean()) < 0.8
    q = torch.randn(3, heads, d, generator=gen)
    seq_idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    prefix = (torch.tensor([[5], [5], [5]], dtype=torch.int32), seq_idx,
              torch.tensor([20, 20, 0], dtype=torch.int32))  # row 2: no prefix
    tail = (random_block_table(3, 2, 5, gen), seq_idx, torch.tensor([1, 45, 33], dtype=torch.int32))
    sc = default_scale(d)
    out, lse = paged_decode(q, *pool, [prefix, tail], sc, tune={"block_n": block_n, **tune}, k_mean=mean)
    r1, l1 = paged_attention_ref(q, *pool, *prefix, sc, k_mean=mean)
    r2, l2 = paged_attention_ref(q, *pool, *tail, sc, k_mean=mean)
    tol = 1e-3 if tune.get("idot") else TOL
    assert torch.allclose(out, merge_attention_ref([r1, r2], [l1, l2]), atol=tol, rtol=tol)
    assert torch.allclose(lse, torch.logaddexp(l1, l2), atol=tol, rtol=tol)


def test_a_store_without_centred_keys_reads_the_same_with_a_mean():
    gen = torch.Generator().manual_seed(31)
    d, heads, kv_heads = 16, 6, 2
    pool = make_cache(6, 16, kv_heads, d, torch.int8, gen)  # written without a mean: no negative scale
    q = torch.randn(2, heads, d, generator=gen)
    seg = (random_block_table(2, 3, 6, gen), torch.tensor([0, 1], dtype=torch.int32),
           torch.tensor([5, 40], dtype=torch.int32))
    plain = paged_decode(q, *pool, [seg], 0.25, tune={"block_n": 16})
    with_mean = paged_decode(q, *pool, [seg], 0.25, tune={"block_n": 16}, k_mean=key_mean(kv_heads, d, gen))
    assert torch.equal(plain[0], with_mean[0]) and torch.equal(plain[1], with_mean[1])
    with pytest.raises(ValueError, match="k_mean"):
        paged_decode(q, *pool, [seg], 0.25, k_mean=torch.zeros(kv_heads, d + 1))
