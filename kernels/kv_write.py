"""KV write: quantize new K/V (int8 caches) and scatter them into pages/slots by slot_mapping.

Layout (docs/interfaces.md): caches `[N, P, Hkv, D]` (one layer's strided view of the pool),
scales `[N, P, Hkv]` fp16 (int8 caches only), `slot_mapping` int64 `[T]` with
`flat slot = page * P + offset`. A negative slot means "do not write" (padding rows), for both
implementations. Float caches (fp16/fp32 reference runs) store the values cast, no scales.
"""
import torch

from edge_runtime.kernels import page_chunks as _chunks
from edge_runtime.kernels.quantize import quantize_int8_keys

try:  # triton is optional on CPU machines
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None


def _check(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k_mean=None) -> None:
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"k and v must both be [T, Hkv, D]; got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must both be [N, P, Hkv, D]; got "
                         f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    if tuple(k_cache.shape[2:]) != tuple(k.shape[1:]):
        raise ValueError(f"cache heads/head_dim {tuple(k_cache.shape[2:])} do not match k {tuple(k.shape[1:])}")
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"slot_mapping must be int64 [T={k.shape[0]}]; got {slot_mapping.dtype} "
                         f"{tuple(slot_mapping.shape)}")
    if k_cache.dtype == torch.int8:
        if k_scale is None or v_scale is None:
            raise ValueError("int8 caches need k_scale and v_scale tensors [N, P, Hkv] fp16")
        if k_scale.shape != k_cache.shape[:3] or v_scale.shape != k_cache.shape[:3]:
            raise ValueError(f"scales must be [N, P, Hkv]={tuple(k_cache.shape[:3])}; got "
                             f"{tuple(k_scale.shape)} and {tuple(v_scale.shape)}")
        if k_scale.dtype != torch.float16 or v_scale.dtype != torch.float16:
            raise ValueError(f"scales must be float16; got {k_scale.dtype} and {v_scale.dtype}")
    if k_cache.stride(-1) != 1:
        raise ValueError("the cache's last dimension (head_dim) must be contiguous")
    if k_mean is not None and (k_cache.dtype != torch.int8 or tuple(k_mean.shape) != tuple(k.shape[1:])
                               or k_mean.dtype != torch.float32 or not k_mean.is_contiguous()):
        raise ValueError(f"k_mean (centred keys) is for int8 caches and must be contiguous float32 "
                         f"[Hkv, D]={tuple(k.shape[1:])}; got {k_mean.dtype} {tuple(k_mean.shape)} "
                         f"for a {k_cache.dtype} cache")


def _chunk_tensors(k_cache, v_cache, k_scale, v_scale, chunks):
    """-> (chunk_pages, per-chunk tuples of K, V, K scales, V scales) of a plain or chunked store."""
    if chunks is None:
        return max(1, k_cache.shape[0]), ((k_cache,), (v_cache,), (k_scale,), (v_scale,))
    return chunks.chunk_pages, (chunks.k, chunks.v, chunks.k_scale, chunks.v_scale)


def write_kv_ref(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k_mean=None, chunks=None) -> None:
    """Torch reference. k, v: [T, Hkv, D] float; writes caches (and scales) in place. k_mean:
    [Hkv, D] float32 or None: int8 keys centred where that lowers their absmax (kernels/quantize.py).
    chunks: a chunked store's PageChunks (kernels/page_chunks.py; the caches are chunk 0's) or None."""
    _check(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k_mean)
    page_tokens = k_cache.shape[1]
    keep = slot_mapping >= 0  # [T]
    slots = slot_mapping[keep].long()
    page, off = slots // page_tokens, slots % page_tokens
    assert slots.numel() == 0 or int(page.max()) < _chunks.num_pages(k_cache, chunks), \
        f"slot beyond the cache: {int(slots.max())}"
    chunk_pages, (ks, vs, kss, vss) = _chunk_tensors(k_cache, v_cache, k_scale, v_scale, chunks)
    if k_cache.dtype == torch.int8:
        for x, cache, scale, mean in ((k[keep], ks, kss, k_mean), (v[keep], vs, vss, None)):
            q, s = quantize_int8_keys(x, mean)  # q: [T', Hkv, D] int8, s: [T', Hkv] fp16
            _chunks.put_tokens(cache, chunk_pages, page, off, q)
            _chunks.put_tokens(scale, chunk_pages, page, off, s)
    else:
        _chunks.put_tokens(ks, chunk_pages, page, off, k[keep].to(k_cache.dtype))
        _chunks.put_tokens(vs, chunk_pages, page, off, v[keep].to(v_cache.dtype))


if triton is not None:

    @triton.jit
    def _round_half_even(x):
        # torch.round's rule; libdevice.rint would do, but the interpreter cannot run libdevice
        r = tl.floor(x + 0.5)
        odd = r * 0.5 != tl.floor(r * 0.5)
        return tl.where((r - x == 0.5) & odd, r - 1.0, r)

    @triton.jit
    def _centre(x, mean_ptr, h, d, dmask, D: tl.constexpr):
        # -> (row to store, its absmax, centred?): x - m where that lowers the absmax (strictly), in
        # fp32 as quantize_int8_keys does
        c = x - tl.load(mean_ptr + h * D + d, mask=dmask, other=0.0)
        amax = tl.max(tl.abs(x), axis=0)
        c_amax = tl.max(tl.abs(c), axis=0)
        pick = c_amax < amax
        return tl.where(pick, c, x), tl.where(pick, c_amax, amax), pick

    @triton.jit(do_not_specialize=["chunk_pages"])
    def _kv_write_kernel(x_ptr, cache_ptr, scale_ptr, slot_ptr, mean_ptr, chunk_ptr, chunk_pages,
                         stride_xt, stride_xh,
                         stride_cn, stride_cp, stride_ch,
                         stride_sn, stride_sp, stride_sh,
                         page_tokens, D: tl.constexpr, BLOCK_D: tl.constexpr, QUANT: tl.constexpr,
                         CENTRED: tl.constexpr):
        # one program per (token, kv head): x[t, h, :] -> cache[page, off, h, :] (+ scale);
        # CENTRED: mean_ptr is the contiguous [Hkv, D] fp32 mean key, a centred row's scale is negated;
        # chunk_ptr: the store's offsets row 0 at this cache's column, the scales' next to it
        t = tl.program_id(0)
        h = tl.program_id(1)
        slot = tl.load(slot_ptr + t).to(tl.int64)
        if slot >= 0:
            page = (slot // page_tokens).to(tl.int32)
            off = slot % page_tokens
            d = tl.arange(0, BLOCK_D)
            dmask = d < D
            x = tl.load(x_ptr + t * stride_xt + h * stride_xh + d, mask=dmask, other=0.0).to(tl.float32)
            dst = cache_ptr + _chunks.page_start(page, chunk_ptr, chunk_pages, stride_cn) \
                + off * stride_cp + h * stride_ch + d
            if QUANT:
                if CENTRED:
                    x, amax, centred = _centre(x, mean_ptr, h, d, dmask, D)
                else:
                    amax = tl.max(tl.abs(x), axis=0)
                scale = tl.where(amax > 0, amax / 127.0, 1.0).to(tl.float16)
                # IEEE division, as torch's: a plain `/` is approximate on CUDA and could flip a tie
                q = tl.math.div_rn(x, tl.zeros_like(x) + scale.to(tl.float32))
                q = _round_half_even(q)
                q = tl.minimum(tl.maximum(q, -127.0), 127.0)
                tl.store(dst, q.to(tl.int8), mask=dmask)
                if CENTRED:
                    scale = tl.where(centred, -scale, scale)
                scale_at = _chunks.page_start(page, chunk_ptr + 1, chunk_pages, stride_sn)
                tl.store(scale_ptr + scale_at + off * stride_sp + h * stride_sh, scale)
            else:
                tl.store(dst, x.to(cache_ptr.dtype.element_ty), mask=dmask)


def _launch(x, cache, scale, slot_mapping, columns, mean=None) -> None:
    """columns: the store's offsets from this cache's column on (2 columns: cache, scales)."""
    tokens, heads, head_dim = x.shape
    x = x if x.stride(-1) == 1 else x.contiguous()
    quant = cache.dtype == torch.int8
    s = scale if quant else cache  # any pointer; unused when QUANT is False
    s_strides = (scale.stride(0), scale.stride(1), scale.stride(2)) if quant else (0, 0, 0)
    offsets, chunk_pages = columns
    _kv_write_kernel[(tokens, heads)](
        x, cache, s, slot_mapping, x if mean is None else mean,  # mean: unused unless CENTRED
        offsets, chunk_pages, x.stride(0), x.stride(1),
        cache.stride(0), cache.stride(1), cache.stride(2),
        *s_strides,
        cache.shape[1], D=head_dim, BLOCK_D=triton.next_power_of_2(head_dim), QUANT=quant,
        CENTRED=mean is not None)


def write_kv_triton(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k_mean=None,
                    chunks=None) -> None:
    """Triton kernel with the reference's signature and semantics (bit-exact with write_kv_ref)."""
    _check(k, v, k_cache, v_cache, k_scale, v_scale, slot_mapping, k_mean)
    assert triton is not None, "triton is not installed"
    if k.shape[0] == 0:
        return
    offsets, chunk_pages = _chunks.table_of(k_cache, chunks)
    # columns (K, K scale) from offsets' start, (V, V scale) 16 bytes on: both 16-byte aligned
    _launch(k, k_cache, k_scale, slot_mapping, (offsets, chunk_pages), k_mean)
    _launch(v, v_cache, v_scale, slot_mapping, (offsets[:, 2:], chunk_pages))  # values never centred
