"""The torch references (what the engine runs on CPU) against slow loop oracles, on random data."""
import pytest
import torch

from kernel_helpers import (default_scale, make_cache, naive_attention, random_awq,
                            random_block_table, row_kv)
from edge_runtime.kernels import dispatch
from edge_runtime.kernels.awq_gemm import awq_gemm_ref
from edge_runtime.kernels.kv_write import write_kv_ref
from edge_runtime.kernels.paged_attention import merge_attention, paged_attention_ref
from edge_runtime.kernels.quantize import dequantize_int8, quantize_int8


def test_quantize_roundtrip_and_zero_vector():
    x = torch.randn(7, 3, 16)
    x[2, 1] = 0.0
    q, s = quantize_int8(x)
    assert q.dtype == torch.int8 and s.dtype == torch.float16
    assert float(s[2, 1]) == 1.0 and int(q[2, 1].abs().max()) == 0
    assert int(q.abs().max()) == 127
    err = (dequantize_int8(q, s) - x).abs()
    assert bool((err <= s.float().unsqueeze(-1) * 0.5 + 1e-6).all())


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.float32])
def test_write_kv_ref_scatters_by_slot(dtype):
    gen = torch.Generator().manual_seed(1)
    k_cache, v_cache, k_scale, v_scale = make_cache(5, 4, 2, 8, dtype, gen)
    before_k = k_cache.clone()
    k, v = torch.randn(6, 2, 8, generator=gen), torch.randn(6, 2, 8, generator=gen)
    slots = torch.tensor([3, 4, 5, 17, -1, 8], dtype=torch.int64)  # crosses a page; -1 = skip
    write_kv_ref(k, v, k_cache, v_cache, k_scale, v_scale, slots)
    tol = {torch.int8: 0.02, torch.float16: 1e-3, torch.float32: 0.0}[dtype]
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        page, off = divmod(slot, 4)
        got = row_kv(k_cache, k_scale, [page], off + 1)[off]
        assert torch.allclose(got, k[t], atol=tol * float(k[t].abs().max()) + 1e-7)
    untouched = torch.ones(5, 4, dtype=torch.bool)
    for slot in (3, 4, 5, 17, 8):
        untouched[slot // 4, slot % 4] = False
    assert torch.equal(k_cache[untouched], before_k[untouched])


@pytest.mark.parametrize("dtype", [torch.int8, torch.float32])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (8, 2)])
def test_paged_attention_ref_matches_loop(dtype, heads, kv_heads):
    gen = torch.Generator().manual_seed(heads * 10 + kv_heads)
    d, page_tokens = 16, 4
    k_cache, v_cache, k_scale, v_scale = make_cache(12, page_tokens, kv_heads, d, dtype, gen)
    bt = random_block_table(3, 4, 12, gen)
    # decode rows 0 and 2 (one query each), a prefill of 3 causal queries on row 1, a kv_len 0
    seq_idx = torch.tensor([0, 1, 1, 1, 2, 2], dtype=torch.int32)
    kv_lens = torch.tensor([9, 5, 6, 7, 1, 0], dtype=torch.int32)
    seq_idx[5] = 0  # row 0 gets a second query with kv_len 0: still "single" after filtering
    q = torch.randn(6, heads, d, generator=gen)
    args = (q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, default_scale(d))
    out, lse = paged_attention_ref(*args)
    want_out, want_lse = naive_attention(*args)
    assert torch.allclose(out, want_out, atol=1e-5, rtol=1e-5)
    assert torch.allclose(lse, want_lse, atol=1e-5, rtol=1e-5)
    assert float(out[5].abs().max()) == 0.0 and bool(torch.isinf(lse[5]).all())


def test_merge_of_segments_equals_whole():
    gen = torch.Generator().manual_seed(3)
    k_cache, v_cache, k_scale, v_scale = make_cache(10, 4, 2, 16, torch.int8, gen)
    q = torch.randn(3, 4, 16, generator=gen)
    whole_bt = torch.tensor([[0, 1, 2, 3]] * 3, dtype=torch.int32)
    lens = torch.tensor([14, 9, 5], dtype=torch.int32)
    idx = torch.arange(3, dtype=torch.int32)
    sc = default_scale(16)
    out, _ = paged_attention_ref(q, k_cache, v_cache, k_scale, v_scale, whole_bt, idx, lens, sc)
    # prefix = first 6 tokens (a partial second page), tail = positions 6.. copied to pages 4..6
    tail_k, tail_v = k_cache.clone(), v_cache.clone()
    tail_ks, tail_vs = k_scale.clone(), v_scale.clone()
    for j in range(6, 14):
        src, dst = (j // 4, j % 4), (4 + (j - 6) // 4, (j - 6) % 4)
        tail_k[dst], tail_v[dst], tail_ks[dst], tail_vs[dst] = k_cache[src], v_cache[src], k_scale[src], v_scale[src]
    prefix_lens = lens.clamp(max=6)
    tail_lens = (lens - 6).clamp(min=0)
    tail_bt = torch.tensor([[4, 5]] * 3, dtype=torch.int32)
    o1, l1 = paged_attention_ref(q, k_cache, v_cache, k_scale, v_scale, whole_bt, idx, prefix_lens, sc)
    o2, l2 = paged_attention_ref(q, tail_k, tail_v, tail_ks, tail_vs, tail_bt, idx, tail_lens, sc)
    merged = merge_attention([o1, o2], [l1, l2])
    assert torch.allclose(merged, out, atol=1e-5)


@pytest.mark.parametrize("m,n", [(1, 64), (3, 40), (16, 24)])
def test_awq_gemm_ref_matches_dense(m, n):
    gen = torch.Generator().manual_seed(m + n)
    k, group = 128, 32
    qweight, qzeros, scales, w = random_awq(k, n, group, gen)
    x = torch.randn(m, k, generator=gen)
    y = awq_gemm_ref(x, qweight, qzeros, scales, group)
    assert torch.allclose(y, x @ w, atol=1e-4, rtol=1e-4)


def test_awq_gemm_ref_rejects_bad_shapes():
    gen = torch.Generator().manual_seed(0)
    qweight, qzeros, scales, _ = random_awq(64, 16, 32, gen)
    with pytest.raises(ValueError, match="qweight must be"):
        awq_gemm_ref(torch.randn(2, 32), qweight, qzeros, scales, 32)
    with pytest.raises(ValueError, match="group_size"):
        awq_gemm_ref(torch.randn(2, 64), qweight, qzeros, scales, 48)


def test_dispatch_uses_reference_on_cpu():
    from edge_runtime.engine.backend import CpuBackend

    names = dispatch.describe_backends("cpu")
    assert set(names) == set(dispatch.OPS)
    assert {names[op] for op in dispatch.OPS if op != "awq_gemm"} == {"torch-reference"}
    cpu = CpuBackend(torch.device("cpu")).describe()["kernels"]  # what the CPU back end runs
    assert cpu["linear"] in ("c-blocked-f32", "onednn-packed", "torch")
    assert cpu["decode_attention"] in ("c-flat-int8", "torch-flat")
    assert cpu["decode_step"] in ("c-fused-layers", "torch-layers")
    want = "torch-int4pack-cpu" if dispatch.cpu_int4pack_available() else "torch-reference"
    assert names["awq_gemm"] == want
    gen = torch.Generator().manual_seed(5)
    qweight, qzeros, scales, w = random_awq(64, 16, 32, gen)
    x = torch.randn(2, 64, generator=gen)
    assert torch.allclose(dispatch.awq_gemm(x, qweight, qzeros, scales, 32), x @ w, atol=1e-4)


def test_dispatch_prepared_awq_on_cpu():
    gen = torch.Generator().manual_seed(6)
    qweight, qzeros, scales, w = random_awq(64, 24, 32, gen)
    packed = dispatch.prepare_awq(qweight, qzeros, scales, 32)
    x = torch.randn(3, 64, generator=gen)
    assert torch.allclose(dispatch.awq_gemm_prepared(x, packed), x @ w, atol=1e-4)
