"""Position-addressed attention: one canonical reduction order over absolute key positions.

Why: attention whose float sums depend on where a sequence's keys are split (cached prefix vs own
tail, inline slots vs pages, chunk boundaries, decode vs prefill kernel, a split count chosen from
the SM count) gives a request different logits cold and from the cache. Here the order is a
function of the positions alone:

- one program per (query token, query head, span); a span is `span_tokens` absolute positions
  [s * span_tokens, (s + 1) * span_tokens), walked in tiles of BLOCK_N absolute positions (BLOCK_N
  divides span_tokens), so a tile holds the same keys however the sequence is stored;
- a tile gathers each key's address by position (positional_attention_ref.py: prefix pages, tail
  pages, inline slots), masked loads from the pool (its chunks: kernels/page_chunks.py) and the
  arena; nothing about the segments or chunks reaches the arithmetic;
- prefill and decode launch the same kernel with the same constexprs (a prefill token is one more
  query token), so a position's partials are the same bits in both;
- `merge_in_order` merges a token's spans in position order, then the exact block of the
  recent-key window (kv/paged_context.py), by one formula; an empty span adds exact zeros, so the
  number of spans in the step does not matter.

Arithmetic (`to_f32`, `split16`, `rows01`, which the GPU checks' page-tile decode kernel,
tools/gpu_lab/paged_decode.py, imports from here): int8 K/V converted in registers with the
magic-number trick, or ('idot') q.k and p.v on int8 tensor cores with q and p * v_scale as 15-bit
fixed point; per-token scales factor out of q.k and p.v; centred keys add q.m. Online softmax in
base 2; lse in natural log.
"""
import torch

from edge_runtime.kernels import page_chunks as _chunks
from edge_runtime.kernels.positional_attention_ref import (NO_INLINE, PositionIndex, check_index,
                                                           merge_in_order_ref, positional_attention_ref)

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

LOG2E = 1.4426950408889634
# span_tokens: fixed, never derived from the device (it is part of the reduction order). Not yet
# swept on a GPU (docs/perf-gpu.md).
TUNE = {"span_tokens": 256, "block_n": 64, "num_warps": 4, "num_stages": 2, "magic": True, "idot": True}

if triton is not None:

    @triton.jit
    def to_f32(x, MAGIC: tl.constexpr):
        # int8 -> exact fp32; float caches pass through
        if MAGIC:
            u = x.to(tl.int32) + 0x4B000080
            return u.to(tl.float32, bitcast=True) - 8388736.0
        return x.to(tl.float32)

    @triton.jit
    def split16(x):
        # fp32 [N] -> (int8 [16, N]: row 0 = hi, row 1 = lo, other rows 0; step) with
        # x ~= (256 hi + lo) * step, |error| <= step / 2, step = max|x| / 32512 (15-bit fixed point)
        amax = tl.max(tl.abs(x), axis=0)
        step = tl.where(amax > 0, amax / 32512.0, 1.0)
        xi = tl.floor(x / step + 0.5).to(tl.int32)
        hi = (xi + 128) >> 8  # in [-127, 127]
        lo = xi - hi * 256  # in [-128, 127]
        r = tl.arange(0, 16)[:, None]
        return tl.where(r == 0, hi[None, :], tl.where(r == 1, lo[None, :], 0)).to(tl.int8), step

    @triton.jit
    def rows01(acc, step):
        # int32 [16, N] -> fp32 [N] = (256 row0 + row1) * step
        r = tl.arange(0, 16)[:, None]
        w = tl.where(r == 0, 256.0, tl.where(r == 1, 1.0, 0.0))
        return tl.sum(acc.to(tl.float32) * w, axis=0) * step

    @triton.jit
    def _key_slots(n, nmask, row, prefix, gap, inline_from, bt_ptr, s_bt, at_ptr, s_at,
                   page_tokens, slot_tokens, INLINE: tl.constexpr):
        # key positions n [BLOCK_N] -> (pool page, offset, in_pool, arena slot, offset, in_arena)
        vpos = tl.where(n < prefix, n, n + gap)
        in_pool = nmask & (n < inline_from)
        page = tl.load(bt_ptr + row * s_bt + vpos // page_tokens, mask=in_pool, other=0).to(tl.int64)
        off = (vpos % page_tokens).to(tl.int64)
        slot, slot_off, in_arena = page, off, nmask & (n < 0)
        if INLINE:
            in_arena = nmask & (n >= inline_from)
            apos = tl.maximum(n - inline_from, 0)
            slot = tl.load(at_ptr + row * s_at + apos // slot_tokens, mask=in_arena, other=0).to(tl.int64)
            slot_off = (apos % slot_tokens).to(tl.int64)
        return page, off, in_pool, slot, slot_off, in_arena

    @triton.jit
    def _load_rows(ptr, aptr, pool_at, in_pool, arena_at, in_arena, d, dmask, INLINE: tl.constexpr):
        # [BLOCK_N, BLOCK_D] rows at element offsets pool_at / arena_at [BLOCK_N] (+ d)
        x = tl.load(ptr + pool_at[:, None] + d[None, :], mask=in_pool[:, None] & dmask[None, :], other=0)
        if INLINE:
            a = tl.load(aptr + arena_at[:, None] + d[None, :], mask=in_arena[:, None] & dmask[None, :],
                        other=0)
            x = tl.where(in_arena[:, None], a, x)
        return x

    @triton.jit
    def _load_scales(ptr, aptr, pool_at, in_pool, arena_at, in_arena, INLINE: tl.constexpr):
        # fp32 [BLOCK_N] per-token scales at element offsets pool_at / arena_at
        x = tl.load(ptr + pool_at, mask=in_pool, other=0.0)
        if INLINE:
            x = tl.where(in_arena, tl.load(aptr + arena_at, mask=in_arena, other=0.0), x)
        return x.to(tl.float32)

    @triton.jit(do_not_specialize=["chunk_pages"])
    def _positional_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, ak_ptr, av_ptr, aks_ptr, avs_ptr,
                           mean_ptr, bt_ptr, at_ptr, seq_ptr, end_ptr, start_ptr, bounds_ptr, out_ptr,
                           lse_ptr,
                           chunk_ptr, chunk_pages, qk_scale, page_tokens, slot_tokens, span_tokens,
                           s_qt, s_qh, s_n, s_p, s_h, s_sn, s_sp, s_sh,
                           s_an, s_ap, s_asn, s_asp, s_bt, s_at, s_ot, s_oh, s_os, s_lt, s_lh,
                           H: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                           BLOCK_N: tl.constexpr, QUANT: tl.constexpr, MAGIC: tl.constexpr,
                           IDOT: tl.constexpr, CENTRED: tl.constexpr, INLINE: tl.constexpr,
                           WINDOWED: tl.constexpr):
        # program: query token t, query head h, span; K/V strides (s_n, s_p, s_h) shared by K and
        # V, scales (s_sn, s_sp, s_sh) by both scales; the arena's the same but its block strides.
        # The pool's pages are chunked (chunk_ptr: its offsets table, kernels/page_chunks.py), the
        # arena is one tensor.
        pid = tl.program_id(0)
        t = pid // H
        h = pid % H
        kvh = h // GROUP
        span = tl.program_id(1)
        row = tl.load(seq_ptr + t).to(tl.int64)
        prefix = tl.load(bounds_ptr + 3 * row)
        gap = tl.load(bounds_ptr + 3 * row + 1)
        inline_from = tl.load(bounds_ptr + 3 * row + 2)
        start = span * span_tokens
        end = tl.minimum(tl.load(end_ptr + t), start + span_tokens)
        first = 0  # the first key read (a sliding-window layer's cut)
        lo = start
        if WINDOWED:  # tiles stay aligned to absolute positions: start at first's tile
            first = tl.load(start_ptr + t)
            lo = tl.where(first >= end, end, tl.maximum(start, first - first % BLOCK_N))
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        q = tl.load(q_ptr + t * s_qt + h * s_qh + d, mask=dmask, other=0.0).to(tl.float32) * qk_scale
        qm = 0.0
        if CENTRED:  # q.m (mean_ptr: [Hkv, D] contiguous), added to the scores of centred keys
            qm = tl.sum(q * tl.load(mean_ptr + kvh * D + d, mask=dmask, other=0.0), axis=0)
        if IDOT:
            q8, q_step = split16(q)  # [16, BLOCK_D] int8
        m_i = float("-inf")
        l_i = 0.0
        acc = tl.zeros([BLOCK_D], tl.float32)
        for n0 in range(lo, end, BLOCK_N):  # every tile holds >= 1 key in [first, end)
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = (n < end) & (n >= first)
            page, off, in_pool, slot, slot_off, in_arena = _key_slots(
                n, nmask, row, prefix, gap, inline_from, bt_ptr, s_bt, at_ptr, s_at,
                page_tokens, slot_tokens, INLINE)
            kv_in_page = off * s_p + kvh * s_h
            k_at = _chunks.page_start(page, chunk_ptr, chunk_pages, s_n) + kv_in_page
            akv_at = slot * s_an + slot_off * s_ap + kvh * s_h
            k = _load_rows(k_ptr, ak_ptr, k_at, in_pool, akv_at, in_arena, d, dmask, INLINE)
            if IDOT:
                s = rows01(tl.dot(q8, tl.trans(k)), q_step)  # [BLOCK_N]
            else:
                s = tl.sum(to_f32(k, MAGIC) * q[None, :], axis=1)  # [BLOCK_N]
            sc_in_page = off * s_sp + kvh * s_sh
            asc_at = slot * s_asn + slot_off * s_asp + kvh * s_sh
            if QUANT:
                ks_at = _chunks.page_start(page, chunk_ptr + 1, chunk_pages, s_sn) + sc_in_page
                ks = _load_scales(ks_ptr, aks_ptr, ks_at, in_pool, asc_at, in_arena, INLINE)
                if CENTRED:  # a negative scale marks a centred key: |ks| q.k + q.m
                    s = s * tl.abs(ks) + tl.where(ks < 0, qm, 0.0)
                else:
                    s = s * ks
            s = tl.where(nmask, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new)  # [BLOCK_N]
            l_i = l_i * alpha + tl.sum(p, axis=0)
            if QUANT:
                vs_at = _chunks.page_start(page, chunk_ptr + 3, chunk_pages, s_sn) + sc_in_page
                p = p * _load_scales(vs_ptr, avs_ptr, vs_at, in_pool, asc_at, in_arena, INLINE)
            v_at = _chunks.page_start(page, chunk_ptr + 2, chunk_pages, s_n) + kv_in_page
            v = _load_rows(v_ptr, av_ptr, v_at, in_pool, akv_at, in_arena, d, dmask, INLINE)
            if IDOT:
                p8, p_step = split16(p)  # [16, BLOCK_N] int8
                acc = acc * alpha + rows01(tl.dot(p8, v), p_step)  # [BLOCK_D]
            else:
                acc = acc * alpha + tl.sum(p[:, None] * to_f32(v, MAGIC), axis=0)
            m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
        tl.store(out_ptr + t * s_ot + h * s_oh + span * s_os + d, out, mask=dmask)
        tl.store(lse_ptr + t * s_lt + h * s_lh + span, lse)

    @triton.jit
    def _merge_in_order_kernel(po_ptr, pl_ptr, eo_ptr, el_ptr, out_ptr, num_spans,
                               s_pt, s_ph, s_ps, s_plt, s_plh, s_et, s_eh, s_elt, s_elh, s_ot, s_oh,
                               H: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
                               BLOCK_D: tl.constexpr, EXTRA: tl.constexpr):
        # one program per token, all its heads: partials [T, H, S, D] / [T, H, S] (+ the extra
        # [T, H, D] / [T, H]) -> out [T, H, D]
        t = tl.program_id(0)
        h = tl.arange(0, BLOCK_H)
        hmask = h < H
        d = tl.arange(0, BLOCK_D)
        mask = hmask[:, None] & (d < D)[None, :]
        top = tl.full([BLOCK_H], float("-inf"), tl.float32)
        for s in range(0, num_spans):
            top = tl.maximum(top, tl.load(pl_ptr + t * s_plt + h * s_plh + s, mask=hmask, other=0.0))
        extra_lse = tl.full([BLOCK_H], float("-inf"), tl.float32)
        if EXTRA:
            extra_lse = tl.load(el_ptr + t * s_elt + h * s_elh, mask=hmask, other=0.0)
            top = tl.maximum(top, extra_lse)
        top = tl.where(top == float("-inf"), 0.0, top)
        acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
        den = tl.zeros([BLOCK_H], tl.float32)
        for s in range(0, num_spans):  # position order; an empty span has weight exactly 0
            w = tl.exp(tl.load(pl_ptr + t * s_plt + h * s_plh + s, mask=hmask, other=0.0) - top)
            o = tl.load(po_ptr + t * s_pt + h[:, None] * s_ph + s * s_ps + d[None, :], mask=mask, other=0.0)
            acc = acc + w[:, None] * o
            den = den + w
        if EXTRA:
            w = tl.exp(extra_lse - top)
            o = tl.load(eo_ptr + t * s_et + h[:, None] * s_eh + d[None, :], mask=mask, other=0.0)
            acc = acc + w[:, None] * o
            den = den + w
        res = tl.where(den[:, None] > 0, acc / tl.where(den > 0, den, 1.0)[:, None], 0.0)
        tl.store(out_ptr + t * s_ot + h[:, None] * s_oh + d[None, :], res, mask=mask)


def _store_args(store):
    """(k, v, scales...) of a (k, v, k_scale, v_scale) store; float stores pass k, v as scales."""
    k, v, ks, vs = store
    assert k.stride() == v.stride(), "k and v of a store share one layout"
    if ks is None:
        return k, v, k, v
    assert ks.stride() == vs.stride(), "k and v scales share one layout"
    return k, v, ks, vs


def positional_attention_triton(q, pool, arena, index: PositionIndex, sm_scale, *, k_mean=None,
                                chunks=None, tune=None):
    """Triton kernel with positional_attention_ref's signature -> (out [T, H, S, D], lse [T, H, S]).
    chunks: the pool's PageChunks when it is chunked (pool: chunk 0's views; kernels/page_chunks.py)."""
    check_index(q, pool, arena, index)
    assert triton is not None, "triton is not installed"
    tune = {**TUNE, **(tune or {})}
    block_n = tune["block_n"]
    if index.span_tokens % block_n:
        raise ValueError(f"span_tokens {index.span_tokens} must be a multiple of block_n {block_n}")
    t, h, d = q.shape
    s_count = index.num_spans
    out = torch.empty(t, h, s_count, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(t, h, s_count, dtype=torch.float32, device=q.device)
    if t == 0:
        return out, lse
    k, v, ks, vs = _store_args(pool)
    ak, av, aks, avs = _store_args(arena) if arena is not None else (k, v, ks, vs)
    quant = k.dtype == torch.int8
    mean = q if k_mean is None else k_mean.contiguous()  # any pointer when not CENTRED
    offsets, chunk_pages = _chunks.table_of(k, chunks)
    _positional_kernel[(t * h, s_count)](
        q, k, v, ks, vs, ak, av, aks, avs, mean, index.pool_table, index.arena_table, index.seq_idx,
        index.key_end, index.key_end if index.key_start is None else index.key_start,
        index.row_bounds, out, lse, offsets, chunk_pages, float(sm_scale) * LOG2E,
        k.shape[1], ak.shape[1], index.span_tokens, q.stride(0), q.stride(1), *k.stride()[:3],
        *ks.stride()[:3], *ak.stride()[:2], *aks.stride()[:2], index.pool_table.stride(0),
        index.arena_table.stride(0), out.stride(0), out.stride(1), out.stride(2), lse.stride(0),
        lse.stride(1),
        H=h, GROUP=h // k.shape[2], D=d, BLOCK_D=max(16, triton.next_power_of_2(d)), BLOCK_N=block_n,
        QUANT=quant, MAGIC=quant and bool(tune["magic"]), IDOT=quant and bool(tune["idot"]) and block_n >= 32,
        CENTRED=k_mean is not None, INLINE=arena is not None, WINDOWED=index.key_start is not None,
        num_warps=tune["num_warps"], num_stages=tune["num_stages"])
    return out, lse


def merge_in_order_triton(p_out, p_lse, extra=None):
    """merge_in_order_ref on the GPU: one program per token, partials in index order."""
    assert triton is not None, "triton is not installed"
    t, h, s_count, d = p_out.shape
    out = torch.empty(t, h, d, dtype=torch.float32, device=p_out.device)
    if t == 0:
        return out
    e_out, e_lse = extra if extra is not None else (out, p_lse[:, :, 0])
    _merge_in_order_kernel[(t,)](
        p_out, p_lse, e_out, e_lse, out, s_count, p_out.stride(0), p_out.stride(1), p_out.stride(2),
        p_lse.stride(0), p_lse.stride(1), e_out.stride(0), e_out.stride(1), e_lse.stride(0),
        e_lse.stride(1), out.stride(0), out.stride(1),
        H=h, BLOCK_H=triton.next_power_of_2(h), D=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
        EXTRA=extra is not None)
    return out


# the kernel's argument types (the KV contexts build them), its references and kernels
__all__ = ["NO_INLINE", "PositionIndex", "positional_attention_ref", "positional_attention_triton",
           "merge_in_order_ref", "merge_in_order_triton"]
