"""Triton KV write (under TRITON_INTERPRET=1) against the torch reference: bit-exact for int8 caches
(same fp16 scale, same round-half-even), exact for float caches."""
import pytest
import torch

from kernel_helpers import HAVE_TRITON, key_mean, make_cache
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


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float16])
def test_centred_keys_match_reference(in_dtype):
    """k_mean: keys centred where that lowers their absmax, bit-exact with write_kv_ref; values never."""
    gen = torch.Generator().manual_seed(3)
    (kc, vc, ks, vs), (kc2, vc2, ks2, vs2) = _pair(torch.int8, gen)
    mean = key_mean(3, 20, gen)
    near = torch.rand(7, 3, generator=gen) < 0.5  # about half the keys sit around the mean
    k = torch.randn(7, 3, 20, generator=gen) + near.unsqueeze(-1) * mean
    v = torch.randn(7, 3, 20, generator=gen) + mean
    k[1, 0] = mean[0]  # centred to zero: scale -1
    k[2, 1] = 0.0  # a zero key is not centred: scale 1
    k[3, 2] = mean[2] / 2  # centring keeps the absmax (|x - m| = |x|): not centred, strictly lower only
    k, v = k.to(in_dtype), v.to(in_dtype)
    slots = torch.tensor([0, 3, 4, 11, 23, -1, 6], dtype=torch.int64)
    write_kv_ref(k, v, kc, vc, ks, vs, slots, mean)
    write_kv_triton(k, v, kc2, vc2, ks2, vs2, slots, mean)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2) and torch.equal(ks, ks2) and torch.equal(vs, vs2)
    written = torch.tensor([0, 3, 4, 11, 23, 6])
    signs = ks2.flatten(0, 1)[written] < 0  # [6, Hkv]
    assert 0 < int(signs.sum()) < signs.numel() and not bool((vs2 < 0).any())
    assert float(ks2[0, 3, 0]) < 0 and float(ks2[1, 0, 1]) == 1.0  # slot 3: k = mean, slot 4: zero
    if in_dtype == torch.float32:  # exact only before rounding k to fp16
        assert float(ks2[0, 3, 0]) == -1.0 and float(ks2[2, 3, 2]) > 0  # slot 11: same absmax


def test_centred_keys_need_a_fitting_mean():
    gen = torch.Generator().manual_seed(4)
    caches = make_cache(2, 4, 2, 16, torch.int8, gen)
    k = torch.randn(2, 2, 16, generator=gen)
    slots = torch.tensor([0, 5])
    for bad in (torch.zeros(3, 16), torch.zeros(2, 16, dtype=torch.float16), torch.zeros(16, 2).t()):
        with pytest.raises(ValueError, match="k_mean"):
            write_kv_triton(k, k, *caches, slots, bad)
    with pytest.raises(ValueError, match="k_mean"):
        write_kv_triton(k, k, *make_cache(2, 4, 2, 16, torch.float32, gen), slots, torch.zeros(2, 16))
