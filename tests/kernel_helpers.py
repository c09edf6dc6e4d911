"""Helpers for the kernel tests: random paged caches and a naive (loop) attention oracle.

Importing this module sets TRITON_INTERPRET=1 unless already set, before triton is imported, so the
Triton kernels run on the CPU. The variable only changes how triton launches kernels; no other test
module uses triton, so it does not leak in a harmful way.
"""
import math
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

from edge_runtime.kernels.quantize import dequantize_int8_keys, quantize_int8, quantize_int8_keys  # noqa: E402

try:
    import triton  # noqa: F401,E402
    HAVE_TRITON = True
except ImportError:  # pragma: no cover
    HAVE_TRITON = False


def key_mean(num_kv_heads, head_dim, gen):
    """A mean key [Hkv, D] float32 for centred-key tests: large next to randn keys, as real ones are."""
    return (3.0 * torch.randn(num_kv_heads, head_dim, generator=gen)).contiguous()


def make_cache(num_pages, page_tokens, num_kv_heads, head_dim, dtype, gen, layers=2, layer=1,
               k_mean=None):
    """A pool with `layers` layers filled with random data; returns one layer's strided views.
    With k_mean (int8 only) about half the keys are k_mean + noise and stored centred (negative
    scale), the others plain noise stored as they are."""
    shape = (num_pages, layers, page_tokens, num_kv_heads, head_dim)
    kf = torch.randn(shape, generator=gen)
    vf = torch.randn(shape, generator=gen)
    if k_mean is not None:
        shifted = torch.rand(shape[:-1], generator=gen) < 0.5
        kf = kf + shifted.unsqueeze(-1) * k_mean
    if dtype == torch.int8:
        kq, ks = quantize_int8_keys(kf, k_mean)
        vq, vs = quantize_int8(vf)
        return kq[:, layer], vq[:, layer], ks[:, layer], vs[:, layer]
    return kf.to(dtype)[:, layer], vf.to(dtype)[:, layer], None, None


def row_kv(cache, scale, block_table_row, length, mean=None):
    """Walk pages token by token (slow, obviously right): -> float32 [length, Hkv, D]. mean: the
    keys' mean for a centred-key store (negative scales), None for values and plain stores."""
    page_tokens = cache.shape[1]
    rows = []
    for j in range(length):
        page, off = int(block_table_row[j // page_tokens]), j % page_tokens
        x = cache[page, off]
        rows.append(dequantize_int8_keys(x, scale[page, off], mean) if cache.dtype == torch.int8
                    else x.float())
    return torch.stack(rows) if rows else torch.zeros(0, *cache.shape[2:])


def naive_attention(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_idx, kv_lens, sm_scale,
                    k_mean=None):
    """Per-token loop oracle with the paged_attention contract (k_mean: centred int8 keys)."""
    t_count, heads, head_dim = q.shape
    group = heads // k_cache.shape[2]
    out = torch.zeros(t_count, heads, head_dim)
    lse = torch.full((t_count, heads), float("-inf"))
    for t in range(t_count):
        length = int(kv_lens[t])
        if length == 0:
            continue
        row = block_table[int(seq_idx[t])]
        k = row_kv(k_cache, k_scale, row, length, k_mean)  # [L, Hkv, D]
        v = row_kv(v_cache, v_scale, row, length)
        for h in range(heads):
            s = (k[:, h // group] @ q[t, h].float()) * sm_scale  # [L]
            lse[t, h] = torch.logsumexp(s, 0)
            out[t, h] = torch.softmax(s, 0) @ v[:, h // group]
    return out, lse


def random_block_table(num_rows, max_pages, num_pages, gen):
    """Distinct random page ids per row (rows may share pages only where a test says so)."""
    return torch.stack([torch.randperm(num_pages, generator=gen)[:max_pages] for _ in range(num_rows)]
                       ).to(torch.int32)


def default_scale(head_dim):
    return 1.0 / math.sqrt(head_dim)


def pack_awq_int4(vals: torch.Tensor) -> torch.Tensor:
    """int [R, C] in 0..15 -> int32 [R, C/8] in AutoAWQ order (independent of the kernel code)."""
    order = (0, 2, 4, 6, 1, 3, 5, 7)
    r, c = vals.shape
    packed = torch.zeros(r, c // 8, dtype=torch.int64)
    v = vals.to(torch.int64).view(r, c // 8, 8)
    for i in range(8):
        packed |= v[:, :, order[i]] << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # to signed int32 range
    return packed.to(torch.int32)


def random_awq(k, n, group, gen, device="cpu"):
    """Random qweight/qzeros/scales and the float32 W they encode."""
    q = torch.randint(0, 16, (k, n), generator=gen)
    z = torch.randint(0, 16, (k // group, n), generator=gen)
    s = (torch.rand(k // group, n, generator=gen) * 0.02 + 0.005).to(torch.float16)
    w = (q - z.repeat_interleave(group, 0)).float() * s.float().repeat_interleave(group, 0)
    return (pack_awq_int4(q).to(device), pack_awq_int4(z).to(device), s.to(device), w.to(device))
