"""Centred int8 keys (kernels/quantize.py): the format, and the torch references that write and
read it, against float oracles. The C and Triton kernels are held to these references in their
own test files."""
import pytest
import torch

from kernel_helpers import default_scale, key_mean, make_cache, naive_attention, random_block_table, row_kv
from edge_runtime.kernels import dispatch
from edge_runtime.kernels.kv_write import write_kv_ref
from edge_runtime.kernels.paged_attention import paged_attention_ref
from edge_runtime.kernels.quantize import dequantize_int8_keys, quantize_int8, quantize_int8_keys


def test_a_key_is_centred_exactly_when_that_lowers_its_absmax():
    gen = torch.Generator().manual_seed(0)
    mean = key_mean(2, 16, gen)
    near = mean + 0.1 * torch.randn(5, 2, 16, generator=gen)  # centring shrinks these
    far = -mean + 0.1 * torch.randn(5, 2, 16, generator=gen)  # centring doubles these
    q, s = quantize_int8_keys(torch.cat([near, far]), mean)
    assert bool((s[:5] < 0).all()) and bool((s[5:] > 0).all())
    assert torch.equal(q[5:], quantize_int8(far)[0]) and torch.equal(s[5:], quantize_int8(far)[1])
    assert torch.equal(q[:5], quantize_int8(near - mean)[0])
    assert torch.equal(s[:5], -quantize_int8(near - mean)[1])
    back = dequantize_int8_keys(q, s, mean)
    step = s.float().abs().unsqueeze(-1)  # the error bound: half a step, plus rounding of the add
    assert bool(((back - torch.cat([near, far])).abs() <= step * 0.5 + 1e-5).all())
    # a centred key's error is that of x - m: 20x finer steps than the plain store here
    plain = quantize_int8(near)
    assert float((dequantize_int8_keys(*plain, None) - near).abs().max()) > \
        10 * float((back[:5] - near).abs().max())


def test_a_key_equal_to_the_mean_and_a_zero_key():
    mean = torch.ones(1, 8)
    q, s = quantize_int8_keys(torch.stack([mean, torch.zeros(1, 8)]), mean)
    assert float(s[0, 0]) == -1.0 and int(q[0].abs().max()) == 0  # centred to zero: scale -1
    assert float(s[1, 0]) == 1.0 and int(q[1].abs().max()) == 0  # zero key: not centred
    assert torch.equal(dequantize_int8_keys(q, s, mean), torch.stack([mean, torch.zeros(1, 8)]))


def test_no_mean_is_the_plain_store():
    x = torch.randn(4, 3, 16)
    for a, b in zip(quantize_int8_keys(x, None), quantize_int8(x)):
        assert torch.equal(a, b)
    zero = torch.zeros(3, 16)
    for a, b in zip(quantize_int8_keys(x, zero), quantize_int8(x)):  # nothing to gain: none centred
        assert torch.equal(a, b)


def test_write_kv_ref_centres_keys_not_values():
    gen = torch.Generator().manual_seed(1)
    mean = key_mean(2, 8, gen)
    k_cache, v_cache, k_scale, v_scale = make_cache(3, 4, 2, 8, torch.int8, gen)
    k = mean + 0.2 * torch.randn(5, 2, 8, generator=gen)
    v = mean + 0.2 * torch.randn(5, 2, 8, generator=gen)
    slots = torch.tensor([0, 1, 5, 6, 11])
    dispatch.write_kv(k, v, k_cache, v_cache, k_scale, v_scale, slots, k_mean=mean)
    page, off = slots // 4, slots % 4
    assert bool((k_scale[page, off] < 0).all()) and bool((v_scale[page, off] > 0).all())
    got = torch.stack([row_kv(k_cache, k_scale, [int(p)], int(o) + 1, mean)[int(o)] for p, o in zip(page, off)])
    assert torch.allclose(got, k, atol=0.01)


def test_write_kv_ref_refuses_a_mean_it_cannot_use():
    gen = torch.Generator().manual_seed(2)
    k = torch.randn(2, 2, 8)
    caches = make_cache(2, 4, 2, 8, torch.int8, gen)
    with pytest.raises(ValueError, match="k_mean"):
        write_kv_ref(k, k, *caches, torch.tensor([0, 1]), torch.zeros(3, 8))
    with pytest.raises(ValueError, match="k_mean"):
        write_kv_ref(k, k, *make_cache(2, 4, 2, 8, torch.float32, gen), torch.tensor([0, 1]),
                     torch.zeros(2, 8))


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_paged_attention_ref_reads_centred_keys(heads, kv_heads):
    gen = torch.Generator().manual_seed(heads + kv_heads)
    d, page_tokens = 16, 4
    mean = key_mean(kv_heads, d, gen)
    k_cache, v_cache, k_scale, v_scale = make_cache(12, page_tokens, kv_heads, d, torch.int8, gen,
                                                    k_mean=mean)
    assert 0.2 < float((k_scale < 0).float().mean()) < 0.8  # a mix of centred and plain keys
    bt = random_block_table(3, 4, 12, gen)
    seq_idx = torch.tensor([0, 1, 1, 1, 2], dtype=torch.int32)
    kv_lens = torch.tensor([9, 5, 6, 7, 1], dtype=torch.int32)
    q = torch.randn(5, heads, d, generator=gen)
    args = (q, k_cache, v_cache, k_scale, v_scale, bt, seq_idx, kv_lens, default_scale(d))
    out, lse = paged_attention_ref(*args, k_mean=mean)
    want_out, want_lse = naive_attention(*args, k_mean=mean)
    assert torch.allclose(out, want_out, atol=1e-4, rtol=1e-4)
    assert torch.allclose(lse, want_lse, atol=1e-4, rtol=1e-4)
    # read without the mean, the centred keys are wrong: the mean is not optional for such a store
    assert not torch.allclose(paged_attention_ref(*args)[1], want_lse, atol=1e-2)
