"""Triton KV write (under TRITON_INTERPRET=1) against the torch reference: bit-exact for int8 caches
(same fp16 scale, same round-half-even), exact for float caches."""
import pytest
import torch

from kernel_helpers import HAVE_TRITON, make_cache
from edge_runtime.kernels.kv_write import write_kv_ref, write_kv_triton

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")


def _pair(dtype, gen):
    a = make_cache(6, 4, 3, 20, dtype, gen)  # head_dim 20: not a power of two
    return a, tuple(None if x is None else x.clone() for x in a)


@pytest.mark.parametrize("dtype", [torch.int8, torch.float16, torch.float32])
def test_write_matches_reference(dtype):
    gen = torch.Generator().manual_seed(2)
    (kc, vc, ks, vs), (kc2, vc2, ks2, vs2) = _pair(dtype, gen)
    k = torch.randn(7, 3, 20, generator=gen) * 3
    v = torch.randn(7, 3, 20, generator=gen)
    k[4, 2] = 0.0  # zero vector -> scale 1
    k[0, 0] = torch.tensor([127.0] + [i + 0.5 for i in range(-10, 9)])  # scale 1: exact .5 ties
    slots = torch.tensor([0, 3, 4, 11, 23, -1, 6], dtype=torch.int64)  # page boundaries, last slot, skip
    write_kv_ref(k, v, kc, vc, ks, vs, slots)
    write_kv_triton(k, v, kc2, vc2, ks2, vs2, slots)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)
    if dtype == torch.int8:
        assert torch.equal(ks, ks2) and torch.equal(vs, vs2)
        assert float(ks2[5, 3, 2]) == 1.0  # slot 23 = page 5 offset 3 got the zero vector
        assert kc2[0, 0, 0, 1:4].tolist() == [-10, -8, -8]  # half to even: -9.5, -8.5, -7.5


def test_write_rejects_missing_scales():
    gen = torch.Generator().manual_seed(0)
    kc, vc, ks, vs = make_cache(2, 4, 1, 16, torch.int8, gen)
    k = torch.randn(1, 1, 16)
    with pytest.raises(ValueError, match="k_scale"):
        write_kv_triton(k, k, kc, vc, None, None, torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv_triton(k, k, kc, vc, ks, vs, torch.zeros(2, dtype=torch.int64))
