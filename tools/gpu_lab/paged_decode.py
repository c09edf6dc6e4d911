"""Page-tile decode attention: one query token per block-table row, whole-page tiles, many splits,
and optionally both segments (shared prefix + private tail) in one launch. The engine does not
launch it (it reads attention by position, kernels/positional_attention.py): it is the GPU
checks' and sweeps' baseline (tools/gpu_check.py, tools/gpu_lab/), outside the installed package.

Program (pid0 = token * H + query head, pid1 = split) walks `chunk` tokens of its segment in tiles of
BLOCK_N consecutive tokens (tile_rows: the tuned block_n halved until it divides the page size).
Invariant: BLOCK_N divides the page size and every chunk starts on a
BLOCK_N boundary, so a tile lies inside one page: the page id is ONE scalar load per tile and the
tile is BLOCK_N rows of D contiguous bytes at a fixed row stride (no per-token page lookups).
int8 values become fp32 with the magic-number trick (int32(b) + 0x4B000080 read as a float is
2^23 + 128 + b exactly, minus 8388736.0 gives b: an integer add and a float add, instead of the
quarter-rate int->float conversion). Dots are CUDA-core FMA reductions in fp32 over 2-D tiles, so
q is not rounded to fp16. Variant `idot`: both dots on int8 tensor cores over the raw K/V bytes,
with q and p * v_scale as 15-bit fixed point (hi and lo int8 rows of one 16-row operand; relative
error ~3e-5 of the row's max, below paged_attention_triton's fp16 rounding of q and p). One
program per query head: with GQA the G heads of a KV head read the same tile, from L2 when they
run together (group <= 8; Llama-2-7B has 1, SmolLM2 3). The per-token scales factor out of q.k and
p.v as in paged_attention.py.

Partial results of every (segment, split) go to [T, H, S, D] / [T, H, S] and are merged by
paged_attention's split-merge kernel, so two segments cost one attention launch + one merge.
A split with no tokens writes lse = -inf, which the merge ignores.
"""
import torch

from edge_runtime.kernels import page_chunks as _chunks
from edge_runtime.kernels import paged_attention as _pa
from edge_runtime.kernels.paged_attention_ref import check_args as _check

triton = _pa.triton
if triton is not None:
    import triton.language as tl

    # int8 -> fp32 in registers and the 15-bit fixed-point int8 dots: the engine's kernel's
    from edge_runtime.kernels.positional_attention import rows01, split16, to_f32

LOG2E = 1.4426950408889634
# Launch defaults. programs_per_sm sets the number of splits (never below one tile each).
# idot: q.k and p.v on int8 tensor cores (q and p*v_scale as 15-bit fixed point split into two int8
# rows; needs block_n >= 32), no per-byte conversion of K/V at all.
# Defaults: the best config of the H200 sweep (39.4 us, 50% of copy bandwidth; docs/perf-gpu.md,
# "Launch defaults: the H200 sweep"); the FMA path's best (block_n 64, 2 warps) was 41.2 us.
TUNE = {"block_n": 128, "num_warps": 4, "num_stages": 2, "programs_per_sm": 16, "magic": True, "idot": True}

if triton is not None:

    @triton.jit(do_not_specialize=["chunk_pages"])
    def _paged_decode_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, mean_ptr,
                             bt0_ptr, seq0_ptr, len0_ptr, bt1_ptr, seq1_ptr, len1_ptr,
                             out_ptr, lse_ptr, chunk_ptr, chunk_pages,
                             qk_scale, page_tokens, chunk0, splits0, chunk1,
                             s_qt, s_qh, s_kn, s_kp, s_kh, s_vn, s_vp, s_vh,
                             s_ksn, s_ksp, s_ksh, s_vsn, s_vsp, s_vsh, s_bt0, s_bt1,
                             s_ot, s_oh, s_os, s_lt, s_lh,
                             H: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
                             QUANT: tl.constexpr, MAGIC: tl.constexpr, TWO: tl.constexpr,
                             IDOT: tl.constexpr, CENTRED: tl.constexpr):
        # program: query token t, query head h (GQA: heads of one KV head re-read its tile, from L2
        # when they run together), split. 2-D tiles only: [BLOCK_N, D] and vectors.
        pid = tl.program_id(0)
        t = pid // H
        h = pid % H
        kvh = h // GROUP
        split = tl.program_id(1)
        if TWO and split >= splits0:  # second segment (private tail)
            row = tl.load(seq1_ptr + t).to(tl.int64)
            length = tl.load(len1_ptr + t)
            start = (split - splits0) * chunk1
            end = tl.minimum(length, start + chunk1)
            bt_row = bt1_ptr + row * s_bt1
        else:
            row = tl.load(seq0_ptr + t).to(tl.int64)
            length = tl.load(len0_ptr + t)
            start = split * chunk0
            end = tl.minimum(length, start + chunk0)
            bt_row = bt0_ptr + row * s_bt0
        d = tl.arange(0, D)
        q = tl.load(q_ptr + t * s_qt + h * s_qh + d).to(tl.float32) * qk_scale  # [D]
        qm = 0.0
        if CENTRED:  # q.m (mean_ptr: [Hkv, D] contiguous), added to the scores of centred keys
            qm = tl.sum(q * tl.load(mean_ptr + kvh * D + d), axis=0)
        if IDOT:
            q8, q_step = split16(q)  # [16, D] int8
        m_i = float("-inf")
        l_i = 0.0
        acc = tl.zeros([D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            page = tl.load(bt_row + n0 // page_tokens)  # one page id per tile
            off = (n0 % page_tokens + tl.arange(0, BLOCK_N)).to(tl.int64)  # [BLOCK_N]
            nmask = n0 + tl.arange(0, BLOCK_N) < end
            k_at = _chunks.page_start(page, chunk_ptr, chunk_pages, s_kn)  # scalar int64
            k = tl.load(k_ptr + k_at + kvh * s_kh + off[:, None] * s_kp + d[None, :],
                        mask=nmask[:, None], other=0)  # [BLOCK_N, D]
            if IDOT:  # int8 tensor cores on the raw K bytes: hi and lo rows of q in one dot
                s = rows01(tl.dot(q8, tl.trans(k)), q_step)  # [BLOCK_N]
            else:
                s = tl.sum(to_f32(k, MAGIC) * q[None, :], axis=1)  # [BLOCK_N]
            if QUANT:
                ks_at = _chunks.page_start(page, chunk_ptr + 1, chunk_pages, s_ksn)
                ks = tl.load(ks_ptr + ks_at + kvh * s_ksh + off * s_ksp, mask=nmask, other=0.0)
                ks = ks.to(tl.float32)
                if CENTRED:  # a negative scale marks a centred key: |ks| q.k + q.m
                    s = s * tl.abs(ks) + tl.where(ks < 0, qm, 0.0)
                else:
                    s = s * ks
            s = tl.where(nmask, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))  # finite: the tile has >= 1 valid token
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(s - m_new)  # [BLOCK_N]
            l_i = l_i * alpha + tl.sum(p, axis=0)
            if QUANT:
                vs_at = _chunks.page_start(page, chunk_ptr + 3, chunk_pages, s_vsn)
                vs = tl.load(vs_ptr + vs_at + kvh * s_vsh + off * s_vsp, mask=nmask, other=0.0)
                p = p * vs.to(tl.float32)
            v_at = _chunks.page_start(page, chunk_ptr + 2, chunk_pages, s_vn)
            v = tl.load(v_ptr + v_at + kvh * s_vh + off[:, None] * s_vp + d[None, :],
                        mask=nmask[:, None], other=0)  # [BLOCK_N, D]
            if IDOT:
                p8, p_step = split16(p)  # [16, BLOCK_N] int8
                acc = acc * alpha + rows01(tl.dot(p8, v), p_step)  # [D]
            else:
                acc = acc * alpha + tl.sum(p[:, None] * to_f32(v, MAGIC), axis=0)  # [D]
            m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
        tl.store(out_ptr + t * s_ot + h * s_oh + split * s_os + d, out)
        tl.store(lse_ptr + t * s_lt + h * s_lh + split, lse)


def tile_rows(page_tokens, block_n) -> int:
    """The tile actually used: block_n halved until it divides the page (0 when below 8 rows)."""
    while block_n >= 8 and page_tokens % block_n:
        block_n //= 2
    return block_n if block_n >= 8 else 0


def supported(q, k_cache, block_table, tune=None) -> bool:
    """paged_decode handles a power-of-two head_dim, GQA group <= 8 and pages that are a multiple
    of 8 tokens; anything else goes to paged_attention_triton. Every query token is independent
    (its own row and kv_len), so prefill is correct too, but it re-reads the cache once per query
    token: callers use paged_decode for decode steps (at most one query per block-table row)."""
    t, h, d = q.shape
    block_n = {**TUNE, **(tune or {})}["block_n"]
    return (triton is not None and d >= 16 and d & (d - 1) == 0
            and h // k_cache.shape[2] <= 8 and tile_rows(k_cache.shape[1], block_n) > 0)


def _splits(t, h, max_len, block_n, device, tune, share=1.0) -> int:
    if device.type != "cuda":
        return max(1, min(3, -(-max_len // block_n)))  # the interpreter: a few, to test merging
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-int(tune["programs_per_sm"] * sms * share) // max(1, t * h))
    return max(1, min(want, -(-max_len // block_n), 128))


def _segment(block_table, page_tokens, block_n, t, h, device, tune, share):
    """-> (chunk, splits) for one segment; chunk is a multiple of block_n."""
    max_len = max(1, block_table.shape[1] * page_tokens)  # upper bound: no sync on kv_lens
    splits = _splits(t, h, max_len, block_n, device, tune, share)
    chunk = -(-(-(-max_len // splits)) // block_n) * block_n
    return chunk, -(-max_len // chunk)


def paged_decode(q, k_cache, v_cache, k_scale, v_scale, segments, sm_scale, *, tune=None, k_mean=None,
                 chunks=None):
    """Decode attention over one or two segments [(block_table, seq_idx, kv_lens), ...] of the same
    pool -> (out fp32 [T, H, D], lse fp32 [T, H]) = merge of the per-segment attentions
    (paged_attention_ref of each segment, then merge_attention_ref). k_mean: the int8 store's mean
    key [Hkv, D] float32 (centred keys, kernels/quantize.py) or None. chunks: a chunked store's
    PageChunks (kernels/page_chunks.py; the caches are chunk 0's) or None."""
    assert 1 <= len(segments) <= 2, "one or two segments"
    for seg in segments:
        _check(q, k_cache, v_cache, k_scale, v_scale, *seg, k_mean=k_mean)
    tune = {**TUNE, **(tune or {})}
    if not all(supported(q, k_cache, seg[0], tune) for seg in segments):
        raise ValueError("paged_decode needs a power-of-two head_dim, "
                         "GQA group <= 8 and pages that are a multiple of 8 tokens; use paged_attention")
    t, h, d = q.shape
    hkv, page_tokens = k_cache.shape[2], k_cache.shape[1]
    bn = tile_rows(page_tokens, tune["block_n"])
    lens = [seg[0].shape[1] * page_tokens for seg in segments]
    plan = [_segment(seg[0], page_tokens, bn, t, h, q.device, tune, n / sum(lens))
            for seg, n in zip(segments, lens)]
    splits = sum(s for _, s in plan)
    p_out = torch.empty(t, h, splits, d, dtype=torch.float32, device=q.device)
    p_lse = torch.empty(t, h, splits, dtype=torch.float32, device=q.device)
    out = torch.empty(t, h, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    if t == 0:
        return out, lse
    quant = k_cache.dtype == torch.int8
    ks, vs = (k_scale, v_scale) if quant else (k_cache, v_cache)
    seg1 = segments[-1]
    group = h // hkv
    mean = q if k_mean is None else k_mean.contiguous()  # any pointer when not CENTRED
    offsets, chunk_pages = _chunks.table_of(k_cache, chunks)
    _paged_decode_kernel[(t * h, splits)](
        q, k_cache, v_cache, ks, vs, mean, *segments[0], *seg1, p_out, p_lse, offsets, chunk_pages,
        float(sm_scale) * LOG2E,
        page_tokens, plan[0][0], plan[0][1], plan[-1][0],
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], *ks.stride()[:3],
        *vs.stride()[:3], segments[0][0].stride(0), seg1[0].stride(0),
        p_out.stride(0), p_out.stride(1), p_out.stride(2), p_lse.stride(0), p_lse.stride(1),
        H=h, GROUP=group, D=d, BLOCK_N=bn, QUANT=quant,
        MAGIC=quant and bool(tune["magic"]), TWO=len(segments) == 2,
        IDOT=quant and bool(tune["idot"]) and bn >= 32, CENTRED=k_mean is not None,
        num_warps=tune["num_warps"], num_stages=tune["num_stages"])
    _pa.merge_splits(p_out, p_lse, out, lse)
    return out, lse
