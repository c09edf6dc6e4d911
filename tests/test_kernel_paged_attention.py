"""Triton paged attention (under TRITON_INTERPRET=1 on CPU) against the torch reference.

Tolerances: int8 and fp16 caches run the dots in fp16 (q rounded to fp16): atol 2e-2 on outputs of
magnitude ~1, 2e-2 on lse; fp32 caches run IEEE fp32 dots: 1e-4.
"""
import pytest
import torch

from kernel_helpers import HAVE_TRITON, default_scale, key_mean, make_cache, random_block_table
from edge_runtime.kernels.paged_attention import (merge_attention, merge_attention_triton,
                                                  paged_attention_ref, paged_attention_triton)

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")

TOL = {torch.int8: 2e-2, torch.float16: 2e-2, torch.float32: 1e-4}


def _compare(args, dtype, k_mean=None, **kw):
    out, lse = paged_attention_triton(*args, k_mean=k_mean, **kw)
    want_out, want_lse = paged_attention_ref(*args, k_mean=k_mean)
    tol = TOL[dtype]
    assert torch.allclose(out, want_out, atol=tol, rtol=tol), float((out - want_out).abs().max())
    finite = torch.isfinite(want_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse[finite], want_lse[finite], atol=tol, rtol=tol)
    return out, lse


@pytest.mark.parametrize("heads,kv_heads,dtype,splits,fma", [
    (4, 4, torch.int8, 1, False), (6, 2, torch.int8, 3, False), (8, 2, torch.int8, 2, False),
    (6, 2, torch.float32, 2, False), (4, 1, torch.float16, 1, False),
    (4, 4, torch.int8, 2, True), (6, 2, torch.int8, 1, True), (8, 2, torch.float32, 2, True)])
def test_decode_ragged_lengths(heads, kv_heads, dtype, splits, fma):
    gen = torch.Generator().manual_seed(heads + 7 * kv_heads)
    d, page_tokens = 16, 8
    k_cache, v_cache, k_scale, v_scale = make_cache(16, page_tokens, kv_heads, d, dtype, gen)
    bt = random_block_table(4, 6, 16, gen)
    seq_idx = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    kv_lens = torch.tensor([1, 8, 9, 45], dtype=torch.int32)  # length 1, a full page, one past, ragged
    q = torch.randn(4, heads, d, generator=gen)
    _compare((q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, default_scale(d)), dtype,
             num_splits=splits, tune={"fma": fma})


def test_kv_len_zero_and_prefill_rows():
    gen = torch.Generator().manual_seed(11)
    d, page_tokens = 16, 4
    k_cache, v_cache, k_scale, v_scale = make_cache(10, page_tokens, 1, d, torch.int8, gen)
    bt = random_block_table(2, 5, 10, gen)
    # row 1: a causal prefill of 4 new tokens after 5 cached ones; row 0: a kv_len 0 query
    seq_idx = torch.tensor([0, 1, 1, 1, 1], dtype=torch.int32)
    kv_lens = torch.tensor([0, 6, 7, 8, 9], dtype=torch.int32)
    q = torch.randn(5, 3, d, generator=gen)
    out, lse = _compare((q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, 0.3), torch.int8,
                        num_splits=2)
    assert float(out[0].abs().max()) == 0.0 and bool(torch.isneginf(lse[0]).all())


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_mixed_batch_prefill_tiles(heads, kv_heads):
    """A decode token, then two causal prefills cut into several query tiles (tiles of 4 tokens)."""
    gen = torch.Generator().manual_seed(heads)
    d, page_tokens = 16, 4
    k_cache, v_cache, k_scale, v_scale = make_cache(16, page_tokens, kv_heads, d, torch.int8, gen)
    bt = random_block_table(3, 5, 16, gen)
    seq_idx = torch.tensor([0] + [1] * 7 + [2] * 5, dtype=torch.int32)
    kv_lens = torch.tensor([11] + list(range(4, 11)) + list(range(16, 21)), dtype=torch.int32)
    q = torch.randn(13, heads, d, generator=gen)
    group = heads // kv_heads
    _compare((q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, default_scale(d)), torch.int8,
             num_splits=2, tune={"prefill_rows": 4 * group, "prefill_block_n": 16})


def test_shared_partial_page_and_inline_tail_merge():
    """Two sequences share a 6-token prefix (second page partial); each has an inline-slot tail."""
    gen = torch.Generator().manual_seed(5)
    d, heads, kv_heads = 32, 6, 2
    pool = make_cache(6, 4, kv_heads, d, torch.int8, gen)
    arena = make_cache(3, 8, kv_heads, d, torch.int8, gen)  # inline slots of 8 tokens
    q = torch.randn(2, heads, d, generator=gen)
    seq_idx = torch.tensor([0, 1], dtype=torch.int32)
    prefix_bt = torch.tensor([[3, 1], [3, 1]], dtype=torch.int32)
    prefix_lens = torch.tensor([6, 6], dtype=torch.int32)
    tail_bt = torch.tensor([[2], [0]], dtype=torch.int32)  # one column: the slot id
    tail_lens = torch.tensor([3, 8], dtype=torch.int32)
    sc = default_scale(d)
    o1, l1 = _compare((q, *pool, prefix_bt, seq_idx, prefix_lens, sc), torch.int8)
    o2, l2 = _compare((q, *arena, tail_bt, seq_idx, tail_lens, sc), torch.int8, num_splits=1)
    merged = merge_attention_triton([o1, o2], [l1, l2])
    r1, rl1 = paged_attention_ref(q, *pool, prefix_bt, seq_idx, prefix_lens, sc)
    r2, rl2 = paged_attention_ref(q, *arena, tail_bt, seq_idx, tail_lens, sc)
    want = merge_attention([r1, r2], [rl1, rl2])
    assert torch.allclose(merged, want, atol=2e-2)


@pytest.mark.parametrize("heads,kv_heads,splits,fma", [
    (4, 4, 1, False), (6, 2, 3, False), (6, 2, 2, True)])
def test_centred_keys_decode(heads, kv_heads, splits, fma):
    """k_mean: about half the keys stored centred (negative scale); their scores gain q.m."""
    gen = torch.Generator().manual_seed(20 + heads)
    d, page_tokens = 16, 8
    mean = key_mean(kv_heads, d, gen)
    k_cache, v_cache, k_scale, v_scale = make_cache(16, page_tokens, kv_heads, d, torch.int8, gen,
                                                    k_mean=mean)
    assert 0.2 < float((k_scale < 0).float().mean()) < 0.8
    bt = random_block_table(3, 6, 16, gen)
    seq_idx = torch.tensor([0, 1, 2], dtype=torch.int32)
    kv_lens = torch.tensor([1, 9, 45], dtype=torch.int32)
    q = torch.randn(3, heads, d, generator=gen)
    _compare((q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, default_scale(d)), torch.int8,
             k_mean=mean, num_splits=splits, tune={"fma": fma})


def test_centred_keys_prefill_tiles():
    gen = torch.Generator().manual_seed(21)
    d, page_tokens, heads, kv_heads = 16, 4, 6, 2
    mean = key_mean(kv_heads, d, gen)
    k_cache, v_cache, k_scale, v_scale = make_cache(12, page_tokens, kv_heads, d, torch.int8, gen,
                                                    k_mean=mean)
    bt = random_block_table(2, 5, 12, gen)
    seq_idx = torch.tensor([0] + [1] * 5, dtype=torch.int32)  # a decode token, then a causal prefill
    kv_lens = torch.tensor([7] + list(range(10, 15)), dtype=torch.int32)
    q = torch.randn(6, heads, d, generator=gen)
    _compare((q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, default_scale(d)), torch.int8,
             k_mean=mean, num_splits=2, tune={"prefill_rows": 4 * heads // kv_heads, "prefill_block_n": 16})


@pytest.mark.parametrize("fma", [False, True])
def test_a_store_without_centred_keys_reads_the_same_with_a_mean(fma):
    gen = torch.Generator().manual_seed(22)
    d, heads, kv_heads = 16, 6, 2
    pool = make_cache(8, 8, kv_heads, d, torch.int8, gen)  # written without a mean: no negative scale
    bt = random_block_table(2, 3, 8, gen)
    args = (torch.randn(2, heads, d, generator=gen), *pool, bt, torch.tensor([0, 1], dtype=torch.int32),
            torch.tensor([5, 20], dtype=torch.int32), default_scale(d))
    plain = paged_attention_triton(*args, tune={"fma": fma})
    with_mean = paged_attention_triton(*args, tune={"fma": fma}, k_mean=key_mean(kv_heads, d, gen))
    assert torch.equal(plain[0], with_mean[0]) and torch.equal(plain[1], with_mean[1])


def test_wrapper_rejects_bad_inputs():
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache, k_scale, v_scale = make_cache(4, 4, 2, 16, torch.int8, gen)
    q = torch.randn(2, 5, 16)
    bt = torch.zeros(2, 2, dtype=torch.int32)
    idx = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="multiple of Hkv"):
        paged_attention_triton(q, k_cache, v_cache, k_scale, v_scale, bt, idx, idx, 0.25)
    with pytest.raises(ValueError, match="k_scale"):
        paged_attention_triton(torch.randn(2, 4, 16), k_cache, v_cache, None, None, bt, idx, idx, 0.25)
    with pytest.raises(ValueError, match="block_table"):
        paged_attention_triton(torch.randn(2, 4, 16), k_cache, v_cache, k_scale, v_scale, bt.long(), idx,
                               idx, 0.25)
    with pytest.raises(ValueError, match="k_mean"):
        paged_attention_triton(torch.randn(2, 4, 16), k_cache, v_cache, k_scale, v_scale, bt, idx, idx, 0.25,
                               k_mean=torch.zeros(16, 2))


def test_merge_kernel_matches_reference_with_empty_segments():
    gen = torch.Generator().manual_seed(8)
    outs = [torch.randn(3, 2, 20, generator=gen) for _ in range(3)]
    lses = [torch.randn(3, 2, generator=gen) * 3 for _ in range(3)]
    lses[1][0] = float("-inf")  # token 0: segment 1 empty
    for x in lses:
        x[2, 1] = float("-inf")  # token 2, head 1: every segment empty -> 0
    got = merge_attention_triton(outs, lses)
    assert torch.allclose(got, merge_attention(outs, lses), atol=1e-5)
    assert float(got[2, 1].abs().max()) == 0.0


def test_per_token_mode_reads_a_token_the_same_alone_or_in_its_row():
    """per_token (the exact-block call): one program per query token even when tokens share a row,
    so a token's result is the same bits alone and among its row's other tokens."""
    gen = torch.Generator().manual_seed(13)
    d, page_tokens = 16, 4
    k_cache, v_cache, _, _ = make_cache(6, page_tokens, 2, d, torch.float16, gen)
    bt = random_block_table(2, 3, 6, gen)
    seq_idx = torch.tensor([0, 0, 0, 1, 1], dtype=torch.int32)
    kv_lens = torch.tensor([1, 2, 3, 4, 9], dtype=torch.int32)
    q = torch.randn(5, 4, d, generator=gen)
    args = (q, k_cache, v_cache, None, None, bt, seq_idx, kv_lens, 0.3)
    out, lse = _compare(args, torch.float16, num_splits=1, per_token=True)
    for t in range(5):
        one = (q[t:t + 1], k_cache, v_cache, None, None, bt, seq_idx[t:t + 1], kv_lens[t:t + 1], 0.3)
        o1, l1 = paged_attention_triton(*one, num_splits=1, per_token=True)
        assert torch.equal(o1[0], out[t]) and torch.equal(l1[0], lse[t])
