"""Triton W4A16 GEMM (under TRITON_INTERPRET=1) against dequantize + matmul, and the reference.

Tolerance: the kernel multiplies in fp16 (x and the dequantized weight rounded to fp16) with fp32
accumulation: rtol/atol 1e-2 relative to the output's scale. The reference is fp32 throughout: 1e-4.
"""
import pytest
import torch

from kernel_helpers import HAVE_TRITON, pack_awq_int4, random_awq
from edge_runtime.kernels.awq_gemm import (awq_dequantize_triton, awq_gemm_ref, awq_gemm_triton,
                                           dequantize_awq, unpack_awq_int4)

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")


def test_unpack_inverts_pack():
    vals = torch.randint(0, 16, (5, 24), generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_awq_int4(pack_awq_int4(vals)), vals.to(torch.int32))


@pytest.mark.parametrize("m,n,k,group,split,unpack,fma", [
    (1, 64, 128, 32, None, "gather", False), (3, 40, 64, 64, 2, "interleave", False),
    (16, 72, 128, 64, 1, "perm", False), (20, 24, 64, 16, None, "interleave", False),
    (1, 88, 64, 32, 2, "perm", True), (5, 40, 64, 16, None, "interleave", True),
    (3, 16, 32, 32, 1, "gather", True)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_matches_dense(m, n, k, group, split, unpack, fma, dtype):
    gen = torch.Generator().manual_seed(m * 100 + n)
    qweight, qzeros, scales, w = random_awq(k, n, group, gen)
    x = torch.randn(m, k, generator=gen).to(dtype)
    y = awq_gemm_triton(x, qweight, qzeros, scales, group, split_k=split,
                        tune={"unpack": unpack, "fma": fma})
    want = x.float() @ w
    assert y.dtype == dtype and y.shape == (m, n)
    scale = float(want.abs().max())
    assert torch.allclose(y.float(), want, atol=1e-2 * scale, rtol=1e-2), float((y.float() - want).abs().max())
    ref = awq_gemm_ref(x, qweight, qzeros, scales, group)
    assert torch.allclose(ref.float(), want, atol=1e-3 * scale, rtol=1e-3)


def test_dequantize_matches_encoded_weight():
    gen = torch.Generator().manual_seed(9)
    qweight, qzeros, scales, w = random_awq(64, 32, 32, gen)
    assert torch.allclose(dequantize_awq(qweight, qzeros, scales, 32), w)


def test_rejects_bad_inputs():
    gen = torch.Generator().manual_seed(1)
    qweight, qzeros, scales, _ = random_awq(64, 16, 32, gen)
    with pytest.raises(ValueError, match="contiguous"):
        awq_gemm_triton(torch.randn(64, 2).t(), qweight, qzeros, scales, 32)
    with pytest.raises(ValueError, match="int32"):
        awq_gemm_triton(torch.randn(2, 64), qweight.long(), qzeros, scales, 32)


def test_agrees_with_quant_packing():
    """Cross-check with the independently written pack/dequantize (quant/awq_pack.py)."""
    awq_pack = pytest.importorskip("edge_runtime.quant.awq_pack")
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(0, 16, (64, 48), generator=gen)
    z = torch.randint(0, 16, (2, 48), generator=gen)
    s = (torch.rand(2, 48, generator=gen) * 0.05 + 0.01).to(torch.float16)
    qweight, qzeros = awq_pack.pack_int4(q), awq_pack.pack_int4(z)
    assert torch.equal(qweight, pack_awq_int4(q))
    want = awq_pack.dequantize(qweight, qzeros, s, 32)
    assert torch.equal(dequantize_awq(qweight, qzeros, s, 32), want)
    x = torch.randn(2, 64, generator=gen)
    y = awq_gemm_triton(x, qweight, qzeros, s, 32)
    assert torch.allclose(y, x @ want, atol=1e-2 * float((x @ want).abs().max()))


@pytest.mark.parametrize("m", [1, 3, 17])
def test_default_configs_match_dense(m):
    """The TUNE defaults of each M class (gemv1 / gemv / gemm) on a ragged N."""
    gen = torch.Generator().manual_seed(30 + m)
    qweight, qzeros, scales, w = random_awq(128, 264, 64, gen)
    x = torch.randn(m, 128, generator=gen).half()
    want = x.float() @ w
    y = awq_gemm_triton(x, qweight, qzeros, scales, 64)
    assert torch.allclose(y.float(), want, atol=1e-2 * float(want.abs().max()), rtol=1e-2)


@pytest.mark.parametrize("unpack", ["gather", "interleave", "perm"])
def test_dequantize_kernel_and_dequant_gemm_mode(unpack):
    gen = torch.Generator().manual_seed(12)
    qweight, qzeros, scales, w = random_awq(64, 136, 32, gen)
    got = awq_dequantize_triton(qweight, qzeros, scales, 32, unpack=unpack)
    assert got.dtype == torch.float16 and torch.allclose(got.float(), w, atol=1e-3 * float(w.abs().max()))
    x = torch.randn(20, 64, generator=gen)
    y = awq_gemm_triton(x, qweight, qzeros, scales, 32, tune={"mode": "dequant"})
    want = x @ w
    assert torch.allclose(y, want, atol=1e-2 * float(want.abs().max()))
