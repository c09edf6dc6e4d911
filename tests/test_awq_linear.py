"""AWQLinear against the plain-torch dequantization reference, per backend, at several shapes."""

from __future__ import annotations

import pytest
import torch

from edge_runtime.quant import awq_pack
from edge_runtime.model.awq_linear import AWQLinear
from edge_runtime.quant.half_embed import HalfEmbedding, HalfLinear, halve_embeddings

SHAPES = [(64, 8, 32), (128, 40, 64), (576, 192, 64), (256, 96, 128)]  # K, N, G
INT4PACK_SHAPES = [(64, 16, 32), (128, 48, 64), (576, 192, 64), (256, 96, 128)]  # N % 16 == 0


def _random_awq(k, n, g, seed, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (k, n), generator=gen, dtype=torch.int32)
    z = torch.randint(0, 16, (k // g, n), generator=gen, dtype=torch.int32)
    s = (torch.rand(k // g, n, generator=gen) * 0.02 + 0.005).half()
    return (awq_pack.pack_int4(q).to(device), awq_pack.pack_int4(z).to(device), s.to(device))


@pytest.mark.parametrize("k,n,g", SHAPES)
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_reference_backend_is_exact(k, n, g, rows):
    qweight, qzeros, scales = _random_awq(k, n, g, seed=k + n + rows)
    bias = torch.randn(n)
    mod = AWQLinear.from_tensors(qweight, qzeros, scales, g, bias=bias, backend="reference")
    x = torch.randn(rows, k)
    want = x @ awq_pack.dequantize(qweight, qzeros, scales, g) + bias
    assert torch.allclose(mod(x), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k,n,g", INT4PACK_SHAPES)
@pytest.mark.parametrize("rows", [1, 5, 33])
def test_cpu_int4pack_backend_matches_reference(k, n, g, rows):
    qweight, qzeros, scales = _random_awq(k, n, g, seed=k * n + rows)
    mod = AWQLinear.from_tensors(qweight, qzeros, scales, g, backend="cpu-int4pack")
    assert mod.backend == "cpu-int4pack" and mod.qweight is None  # repacked once, original freed
    x = torch.randn(2, rows, k)  # leading dims are kept
    y = mod(x)
    assert y.shape == (2, rows, n) and y.dtype == torch.float32
    want = x @ awq_pack.dequantize(qweight, qzeros, scales, g)
    rel = (y - want).norm() / want.norm()
    assert rel < 6e-3, float(rel)  # bf16 activations and bf16 (scale, zero) pairs


def test_auto_falls_back_to_reference_for_ragged_out_features():
    qweight, qzeros, scales = _random_awq(64, 40, 32, seed=3)  # 40 % 16 != 0
    mod = AWQLinear.from_tensors(qweight, qzeros, scales, 32)
    assert mod.backend == "reference"
    x = torch.randn(3, 64)
    assert torch.allclose(mod(x), x @ awq_pack.dequantize(qweight, qzeros, scales, 32), atol=1e-5)


def test_from_linear_and_weight_bytes():
    torch.manual_seed(0)
    linear = torch.nn.Linear(256, 128, bias=False)
    mod = AWQLinear.from_linear(linear, 64)
    x = torch.randn(7, 256)
    rel = (mod(x) - linear(x)).norm() / linear(x).norm()
    assert rel < 0.1, float(rel)  # int4 RTN on a random matrix
    assert mod.weight_bytes() < 0.2 * linear.weight.numel() * 4
    assert not mod.state_dict()  # checkpoints are written by awq_model, not state_dict()


@pytest.mark.parametrize("rows", [1, 5])
def test_w4a16_backend_runs_the_prepared_layout(rows):
    """The CUDA backend's code path on CPU tensors: prepared once, checkpoint tensors dropped, the
    prepared reference gives the dequantized reference's result."""
    qweight, qzeros, scales = _random_awq(576, 192, 64, seed=rows)
    want_bytes = qweight.numel() * 4 + qzeros.numel() * 4 + scales.numel() * 2
    mod = AWQLinear.from_tensors(qweight, qzeros, scales, 64, backend="awq-gemm")
    assert mod.backend == "awq-gemm" and mod.qweight is None and mod.prepared is not None
    assert mod.weight_bytes() <= 1.1 * want_bytes  # the same bytes per weight (+ zeros as uint8)
    buffers = sum(b.numel() * b.element_size() for b in mod.buffers())
    assert buffers == mod.weight_bytes()  # what the loader's weight_bytes_of (and plan) counts
    x = torch.randn(rows, 576)
    want = x @ awq_pack.dequantize(qweight, qzeros, scales, 64)
    torch.testing.assert_close(mod(x), want, atol=1e-3, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (Triton W4A16 kernel)")
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_cuda_backend_matches_reference(rows):
    qweight, qzeros, scales = _random_awq(576, 192, 64, seed=rows, device="cuda")
    mod = AWQLinear.from_tensors(qweight, qzeros, scales, 64)
    assert mod.backend == "awq-gemm"
    x = torch.randn(rows, 576, device="cuda")
    want = x @ awq_pack.dequantize(qweight, qzeros, scales, 64)
    rel = (mod(x) - want).norm() / want.norm()
    assert rel < 1e-2, float(rel)


def test_halve_embeddings_keeps_tie_and_fp32_io():
    torch.manual_seed(1)
    model = torch.nn.Module()
    model.model = torch.nn.Module()
    model.model.embed_tokens = torch.nn.Embedding(50, 16)
    model.lm_head = torch.nn.Linear(16, 50, bias=False)
    model.lm_head.weight = model.model.embed_tokens.weight
    ids = torch.randint(0, 50, (9,))
    h = torch.randn(9, 16)
    want_e, want_l = model.model.embed_tokens(ids), model.lm_head(h)
    assert halve_embeddings(model) == ["model.embed_tokens", "lm_head"]
    assert isinstance(model.model.embed_tokens, HalfEmbedding)
    assert isinstance(model.lm_head, HalfLinear)
    assert model.lm_head.weight is model.model.embed_tokens.weight
    got_e, got_l = model.model.embed_tokens(ids), model.lm_head(h)
    assert got_e.dtype == torch.float32 and got_l.dtype == torch.float32
    assert torch.allclose(got_e, want_e, atol=1e-3) and torch.allclose(got_l, want_l, atol=2e-2)
