"""W4A16 on the prepared layout (kernels/awq_prepared.py) under TRITON_INTERPRET=1.

The FMA path computes x * (q - z) in fp32 (exact weights, fp32 x): rtol/atol 1e-4 of the output's
scale for fp32 x; the dot path rounds x to fp16: 1e-2. The split-K semaphores must be back at 0
after every call.
"""
import pytest
import torch

from kernel_helpers import HAVE_TRITON, random_awq
from edge_runtime.kernels.awq_gemm import awq_gemm_ref

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")

if HAVE_TRITON:
    from edge_runtime.kernels.awq_prepared import (awq_gemm_prepared_ref, awq_gemm_prepared_triton,
                                                   dequantize_prepared, prepare_awq_weight)


def test_prepare_keeps_the_weight():
    gen = torch.Generator().manual_seed(1)
    qweight, qzeros, scales, w = random_awq(64, 48, 32, gen)
    packed = prepare_awq_weight(qweight, qzeros, scales, 32)
    assert packed.qweight8.shape == (8, 48) and packed.shape == (64, 48)
    assert torch.equal(dequantize_prepared(packed), w)
    x = torch.randn(3, 64, generator=gen)
    assert torch.allclose(awq_gemm_prepared_ref(x, packed), awq_gemm_ref(x, qweight, qzeros, scales, 32),
                          atol=1e-5)


@pytest.mark.parametrize("m,n,k,group,split,dot,block_n,dtype", [
    (1, 64, 256, 64, None, False, 32, torch.float32), (5, 40, 128, 32, 3, False, 16, torch.float32),
    (8, 72, 128, 128, 1, False, 32, torch.float16), (1, 88, 64, 16, 4, False, 8, torch.float16),
    (3, 48, 128, 32, 2, True, 16, torch.float16), (20, 24, 64, 32, None, True, 16, torch.float32)])
def test_matches_dense(m, n, k, group, split, dot, block_n, dtype):
    gen = torch.Generator().manual_seed(m * 31 + n)
    qweight, qzeros, scales, w = random_awq(k, n, group, gen)
    packed = prepare_awq_weight(qweight, qzeros, scales, group)
    x = torch.randn(m, k, generator=gen).to(dtype)
    want = x.float() @ w
    tol = (1e-2 if dot or dtype == torch.float16 else 1e-4) * float(want.abs().max())
    for _ in range(2):  # a second call sees the counters reset by the first
        y = awq_gemm_prepared_triton(x, packed, tune={"split_k": split, "dot": dot, "block_n": block_n,
                                                      "block_k": 32})
        assert y.dtype == dtype and y.shape == (m, n)
        assert torch.allclose(y.float(), want, atol=tol, rtol=0), float((y.float() - want).abs().max())
        assert int(packed.counters.abs().sum()) == 0


@pytest.mark.parametrize("m", [1, 5, 17])
def test_default_configs(m):
    gen = torch.Generator().manual_seed(40 + m)
    qweight, qzeros, scales, w = random_awq(256, 136, 128, gen)
    packed = prepare_awq_weight(qweight, qzeros, scales, 128)
    x = torch.randn(m, 256, generator=gen).half()
    want = x.float() @ w
    y = awq_gemm_prepared_triton(x, packed)
    assert torch.allclose(y.float(), want, atol=1e-2 * float(want.abs().max()), rtol=0)


def test_rejects_bad_inputs():
    gen = torch.Generator().manual_seed(3)
    packed = prepare_awq_weight(*random_awq(64, 16, 32, gen)[:3], 32)
    with pytest.raises(ValueError, match="K=64"):
        awq_gemm_prepared_triton(torch.randn(2, 32), packed)
    with pytest.raises(ValueError, match="contiguous"):
        awq_gemm_prepared_triton(torch.randn(64, 2).t(), packed)
    with pytest.raises(ValueError, match="K=64"):
        awq_gemm_prepared_ref(torch.randn(2, 63), packed)


def test_dequantize_kernel_and_large_m_mode():
    from edge_runtime.kernels.awq_prepared import dequantize_prepared_triton
    gen = torch.Generator().manual_seed(9)
    qweight, qzeros, scales, w = random_awq(128, 72, 64, gen)
    packed = prepare_awq_weight(qweight, qzeros, scales, 64)
    got = dequantize_prepared_triton(packed)
    assert got.dtype == torch.float16 and torch.allclose(got.float(), w, atol=1e-3 * float(w.abs().max()))
    x = torch.randn(40, 128, generator=gen)
    y = awq_gemm_prepared_triton(x, packed, tune={"dequant_above": 32})
    want = x @ w
    assert torch.allclose(y, want, atol=1e-2 * float(want.abs().max()))
