"""The W4A16 Triton kernel on the runtime's blocked format (kernels/blocked_w4a16.py) under
TRITON_INTERPRET=1, against its plain-torch reference, on tiny shapes: ragged N, rows past a
BLOCK_M, 4-, 5- (signed and not) and 8-bit, fp16 and fp32 parameters, with and without offsets, groups of 16 to 64,
output tiles that reach past the last block (nothing read there), tiles from `tile_plan`."""
import pytest
import torch

from kernel_helpers import HAVE_TRITON
from edge_runtime.quant.int4_format import BlockedQuantWeight, GroupedRows

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")

if HAVE_TRITON:
    from edge_runtime.kernels.blocked_w4a16 import blocked_gemm_ref, blocked_gemm_triton


def _weight(n, k, bits, group, pdtype, offsets, gen) -> BlockedQuantWeight:
    """bits -5: signed 5-bit (Q5_0's form)."""
    if bits == 4:
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
    elif bits == 5:
        q = torch.randint(0, 32, (n, k), generator=gen, dtype=torch.uint8)
    elif bits == -5:
        q, bits = torch.randint(-16, 16, (n, k), generator=gen, dtype=torch.int8), 5
    else:
        q = torch.randint(-128, 128, (n, k), generator=gen, dtype=torch.int8)
    s = (torch.rand(n, k // group, generator=gen) * 0.05 + 0.01).to(pdtype)
    o = (torch.randn(n, k // group, generator=gen) * 0.1).to(pdtype) if offsets else None
    return BlockedQuantWeight.from_rows(GroupedRows(q, s, o, bits, group))


@pytest.mark.parametrize("m,n,k,bits,group,pdtype,offsets,xdtype", [
    (1, 37, 64, 4, 32, torch.float16, True, torch.float32),    # ragged N: a partial block
    (5, 48, 128, 4, 64, torch.float32, True, torch.float16),   # AWQ / Q4_K parameters
    (17, 32, 64, 8, 32, torch.float16, False, torch.float32),  # Q8_0, rows past BLOCK_M
    (3, 20, 96, 4, 32, torch.float16, True, torch.float16),
    (20, 80, 64, 8, 16, torch.float32, False, torch.float16),  # Q6_K's form; a tile past the blocks
    (3, 37, 64, -5, 32, torch.float16, False, torch.float32),  # Q5_0: signed 5-bit, no offset
    (18, 48, 64, 5, 32, torch.float32, True, torch.float16),   # Q5_K (Q5_1: fp16 parameters)
    (2, 32, 64, 4, 16, torch.float32, True, torch.float32),    # Q2_K / Q3_K: 4-bit, group 16
])
def test_matches_reference(m, n, k, bits, group, pdtype, offsets, xdtype):
    gen = torch.Generator().manual_seed(m * 7 + n)
    weight = _weight(n, k, bits, group, pdtype, offsets, gen)
    x = torch.randn(m, k, generator=gen).to(xdtype)
    got = blocked_gemm_triton(x, weight).float()
    want = blocked_gemm_ref(x, weight).float()
    tol = (1e-4 if xdtype == torch.float32 else 1e-2) * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
