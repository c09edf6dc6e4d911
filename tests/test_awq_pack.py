"""AWQ GEMM packing: exact round trips, and bit-exact agreement with AutoAWQ's own code."""

from __future__ import annotations

import pytest
import torch

from edge_runtime.quant import awq_pack
from awq_helpers import import_autoawq

SHAPES = [(64, 8), (128, 64), (576, 192), (192, 24), (320, 136)]  # [K, N], N multiple of 8


@pytest.mark.parametrize("rows,cols", SHAPES)
def test_pack_unpack_round_trip_is_exact(rows, cols):
    g = torch.Generator().manual_seed(rows * 1000 + cols)
    q = torch.randint(0, 16, (rows, cols), generator=g, dtype=torch.int32)
    packed = awq_pack.pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (rows, cols // 8)
    assert torch.equal(awq_pack.unpack_int4(packed), q)


def test_nibble_order_matches_spec():
    q = torch.arange(8, dtype=torch.int32).view(1, 8) + 8  # values 8..15, sign bit used
    word = int(awq_pack.pack_int4(q)[0, 0]) & 0xFFFFFFFF
    nibbles = [(word >> (4 * i)) & 0xF for i in range(8)]
    assert nibbles == [8 + j for j in awq_pack.AWQ_ORDER]


@pytest.mark.parametrize("group_size", [32, 64])
def test_dequantize_matches_formula(group_size):
    g = torch.Generator().manual_seed(7)
    k, n = 4 * group_size, 40
    q = torch.randint(0, 16, (k, n), generator=g, dtype=torch.int32)
    z = torch.randint(0, 16, (k // group_size, n), generator=g, dtype=torch.int32)
    s = (torch.rand(k // group_size, n, generator=g) * 0.1 + 0.01).half()
    w = awq_pack.dequantize(awq_pack.pack_int4(q), awq_pack.pack_int4(z), s, group_size)
    for kk in (0, 1, k - 1):
        for nn in (0, 5, n - 1):
            want = (int(q[kk, nn]) - int(z[kk // group_size, nn])) * float(s[kk // group_size, nn])
            assert abs(float(w[kk, nn]) - want) < 1e-6


def test_rtn_error_is_within_half_step():
    torch.manual_seed(3)
    weight = torch.randn(48, 256)
    qweight, qzeros, scales = awq_pack.pack_linear_weight(weight, 64)
    w_hat = awq_pack.dequantize(qweight, qzeros, scales, 64).t()  # [N, K]
    step = scales.float().repeat_interleave(64, dim=0).t()
    assert torch.all((w_hat - weight).abs() <= step * 0.5 + 1e-4)
    assert torch.allclose(w_hat, awq_pack.fake_quantize(weight, 64), atol=1e-6)


# AutoAWQ sizes qweight as out // 32 * 4 words, so its from_linear needs out % 32 == 0.
@pytest.mark.parametrize("in_f,out_f,group_size", [(128, 64, 64), (256, 224, 128), (576, 192, 64)])
def test_packing_bit_exact_with_autoawq(in_f, out_f, group_size):
    WQLinear_GEMM, packing_utils = import_autoawq()
    torch.manual_seed(in_f + out_f)
    linear = torch.nn.Linear(in_f, out_f, bias=False)
    scales, zeros = awq_pack.group_scales_zeros(linear.weight.data, group_size)
    q = awq_pack.quantize_to_int(linear.weight.data, scales, zeros, group_size)
    # give AutoAWQ the fake-quantized weight, as its quantizer does before packing
    s_full = scales.float().repeat_interleave(group_size, dim=0)
    z_full = zeros.float().repeat_interleave(group_size, dim=0)
    linear.weight.data = ((q.float() - z_full) * s_full).t().contiguous()
    ref = WQLinear_GEMM.from_linear(linear, 4, group_size, scales=scales.float(), zeros=zeros)
    assert torch.equal(ref.qweight, awq_pack.pack_int4(q))
    assert torch.equal(ref.qzeros, awq_pack.pack_int4(zeros))
    assert torch.equal(ref.scales, scales)
    # and their unpack/dequant of our words equals ours
    iw, iz = packing_utils.unpack_awq(ref.qweight, ref.qzeros, 4)
    iw, iz = packing_utils.reverse_awq_order(iw, iz, 4)
    assert torch.equal(torch.bitwise_and(iw, 15).int(), awq_pack.unpack_int4(ref.qweight))
    want = packing_utils.dequantize_gemm(ref.qweight, ref.qzeros, ref.scales, 4, group_size)
    got = awq_pack.dequantize(ref.qweight, ref.qzeros, ref.scales, group_size)
    assert torch.allclose(want.float(), got, atol=0, rtol=1e-3)
