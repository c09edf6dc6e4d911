"""The W4A16 Triton kernel on the runtime's blocked format (kernels/blocked_w4a16.py) under
TRITON_INTERPRET=1, against its plain-torch reference, on tiny shapes: ragged N, rows past a
BLOCK_M, 2-, 3- (signed and not), 4-, 5-, 6- (signed and not) and 8-bit, 4-bit codebook indices,
fp16, fp32 and two-level (int8 or 4-bit codes x fp16 per 256) parameters, with and without offsets, groups of 16 to 64,
output tiles that reach past the last block (nothing read there), tiles from `tile_plan`."""
import pytest
import torch

from kernel_helpers import HAVE_TRITON
from edge_runtime.quant.int4_format import BlockedQuantWeight
from quant_helpers import random_rows

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")

if HAVE_TRITON:
    from edge_runtime.kernels.blocked_w4a16 import blocked_gemm_ref, blocked_gemm_triton


def _weight(n, k, bits, group, pdtype, offsets, gen) -> BlockedQuantWeight:
    """quant_helpers.random_rows's forms (bits -5 / -6 signed, "iq4" codebook, pdtype int8
    two-level), blocked."""
    seed = int(torch.randint(0, 1 << 30, (1,), generator=gen))
    return BlockedQuantWeight.from_rows(random_rows(n, k, bits, group, pdtype, offsets, seed))


@pytest.mark.parametrize("m,n,k,bits,group,pdtype,offsets,xdtype", [
    (1, 37, 64, 4, 32, torch.float16, True, torch.float32),    # ragged N: a partial block
    (5, 48, 128, 4, 64, torch.float32, True, torch.float16),   # AWQ / Q4_K parameters
    (17, 32, 64, 8, 32, torch.float16, False, torch.float32),  # Q8_0, rows past BLOCK_M
    (3, 20, 96, 4, 32, torch.float16, True, torch.float16),
    (20, 80, 64, 8, 16, torch.float32, False, torch.float16),  # Q6_K's form; a tile past the blocks
    (3, 37, 64, -5, 32, torch.float16, False, torch.float32),  # Q5_0: signed 5-bit, no offset
    (18, 48, 64, 5, 32, torch.float32, True, torch.float16),   # Q5_K (Q5_1: fp16 parameters)
    (2, 32, 64, 4, 16, torch.float32, True, torch.float32),    # 4-bit, group 16
    (3, 37, 512, 4, 32, torch.int8, True, torch.float32),      # Q4_K: two-level parameters
    (18, 48, 256, 5, 32, torch.int8, True, torch.float16),     # Q5_K
    (2, 40, 256, -6, 16, torch.int8, False, torch.float32),    # Q6_K: signed 6-bit, two-level
    (3, 24, 256, 4, 16, torch.int8, True, torch.float16),      # Q2_K / Q3_K
    (5, 32, 64, 6, 32, torch.float16, True, torch.float32),    # unsigned 6-bit, one-level
    (3, 37, 64, "iq4", 32, torch.float16, False, torch.float32),  # IQ4_NL: codebook indices
    (17, 32, 512, "iq4", 32, torch.int8, False, torch.float16),   # IQ4_XS: codebook, two-level
    (3, 37, 256, 2, 16, torch.uint8, True, torch.float32),     # Q2_K: 2-bit, 4-bit codes
    (18, 24, 512, 2, 16, torch.uint8, True, torch.float16),
    (2, 37, 256, -3, 16, torch.int8, False, torch.float32),    # Q3_K: signed 3-bit, no offset
    (17, 20, 256, -3, 16, torch.int8, False, torch.float16),
    (3, 40, 512, -3, 16, torch.int8, True, torch.float32),     # Q2_K fused with Q3_K (as_signed3)
    (5, 32, 64, 3, 16, torch.float16, True, torch.float32),    # unsigned 3-bit, one-level
])
def test_matches_reference(m, n, k, bits, group, pdtype, offsets, xdtype):
    gen = torch.Generator().manual_seed(m * 7 + n)
    weight = _weight(n, k, bits, group, pdtype, offsets, gen)
    x = torch.randn(m, k, generator=gen).to(xdtype)
    got = blocked_gemm_triton(x, weight).float()
    want = blocked_gemm_ref(x, weight).float()
    tol = (1e-4 if xdtype == torch.float32 else 1e-2) * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
