"""Paged attention over int8 (or float) pages read through a block table; decode and prefill.

One Triton program handles one query token, one KV head (all its GQA query heads, padded to 16
rows for tl.dot) and one split of the sequence. It walks the block table directly: token j of the
row lives at page `block_table[row, j // P]`, offset `j % P`, so any page size (pool pages, inline
slots with a one-column table) and any split boundary work. int8 K/V are read as int8 and converted
in registers; the per-token scales factor out of q.k and p.v, so they multiply the [G, BLOCK_N]
score/probability tiles instead of the [BLOCK_N, D] values. Online softmax in base 2; lse is
returned in natural log so segments merge with `merge_attention`.

Prefill uses the same walk on a tile of several new tokens of one row (each with its own causal
kv_len, masked per row); the tiles are found on the host, so only a batch with more query tokens
than block-table rows pays a sync. Splits along the sequence are merged by a second kernel. The torch reference and the merge live in
paged_attention_ref.py (re-exported here with the same signatures).
"""
import torch

from edge_runtime.kernels import page_chunks as _chunks
from edge_runtime.kernels.paged_attention_ref import check_args as _check
from edge_runtime.kernels.paged_attention_ref import merge_attention_ref, paged_attention_ref

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover
    triton = None

LOG2E = 1.4426950408889634
# Launch defaults: the best configs of an H200 sweep (docs/perf-gpu.md, "Launch defaults: the H200
# sweep"); gpu_check.py
# sweeps tools/gpu_lab/tune_space.py again on any other card (an Orin should be re-swept).
# fma: decode tiles with fewer than 16 query rows use FMA + reductions instead of a padded tl.dot.
TUNE = {"block_n": 128, "num_warps": 4, "num_stages": 2, "programs_per_sm": 8, "fma": False,
        "prefill_rows": 128, "prefill_block_n": 64, "prefill_warps": 8}

if triton is not None:

    @triton.jit
    def _qk(q, k, FMA: tl.constexpr, FP16_DOT: tl.constexpr):
        # q: [R, BLOCK_D], k: [BLOCK_N, BLOCK_D] -> [R, BLOCK_N] float32
        if FMA:
            return tl.sum(q[:, None, :] * k.to(tl.float32)[None, :, :], axis=2)
        elif FP16_DOT:
            return tl.dot(q, tl.trans(k.to(tl.float16)))
        else:
            return tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")

    @triton.jit
    def _pv(p, v, FMA: tl.constexpr, FP16_DOT: tl.constexpr):
        # p: [R, BLOCK_N] float32, v: [BLOCK_N, BLOCK_D] -> [R, BLOCK_D] float32
        if FMA:
            return tl.sum(p[:, :, None] * v.to(tl.float32)[None, :, :], axis=1)
        elif FP16_DOT:
            return tl.dot(p.to(tl.float16), v.to(tl.float16))
        else:
            return tl.dot(p, v.to(tl.float32), input_precision="ieee")

    @triton.jit
    def _key_scale(s, ks, qm, CENTRED: tl.constexpr):
        # s: [R, BLOCK_N] q.k of the stored rows, ks: [BLOCK_N] fp16 scales, qm: [R] q.m.
        # CENTRED: a negative scale marks a centred key, whose score is |ks| q.k + q.m
        ks = ks.to(tl.float32)
        if CENTRED:
            return s * tl.abs(ks)[None, :] + tl.where(ks < 0, 1.0, 0.0)[None, :] * qm[:, None]
        return s * ks[None, :]

    @triton.jit(do_not_specialize=["chunk_pages"])
    def _paged_attn_kernel(q_ptr, k_ptr, v_ptr, ks_ptr, vs_ptr, bt_ptr, seq_ptr, len_ptr, qblk_ptr,
                           mean_ptr, out_ptr, lse_ptr, chunk_ptr, chunk_pages,
                           qk_scale, page_tokens, chunk_tokens,
                           s_qt, s_qh, s_kn, s_kp, s_kh, s_vn, s_vp, s_vh,
                           s_ksn, s_ksp, s_ksh, s_vsn, s_vsp, s_vsh, s_bt,
                           s_ot, s_oh, s_os, s_lt, s_lh,
                           GROUP: tl.constexpr, BLOCK_R: tl.constexpr, D: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, QUANT: tl.constexpr,
                           FP16_DOT: tl.constexpr, FMA: tl.constexpr, USE_QBLK: tl.constexpr,
                           CENTRED: tl.constexpr):
        # program: query block b (decode: token b; prefill: qblk[b] = (first token, count), one
        # block-table row), KV head kvh, sequence split. Tile rows r = (token, GQA head) pairs.
        b = tl.program_id(0)
        kvh = tl.program_id(1)
        split = tl.program_id(2)
        if USE_QBLK:
            t0 = tl.load(qblk_ptr + 2 * b)
            count = tl.load(qblk_ptr + 2 * b + 1)
        else:
            t0 = b
            count = 1
        r = tl.arange(0, BLOCK_R)
        tok = t0 + r // GROUP
        heads = kvh * GROUP + r % GROUP
        rmask = r < count * GROUP
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        row = tl.load(seq_ptr + t0).to(tl.int64)
        lens = tl.load(len_ptr + tok, mask=rmask, other=0)  # [BLOCK_R] causal per row
        start = split * chunk_tokens
        end = tl.minimum(tl.max(lens, axis=0), start + chunk_tokens)
        q = tl.load(q_ptr + tok[:, None] * s_qt + heads[:, None] * s_qh + d[None, :],
                    mask=rmask[:, None] & dmask[None, :], other=0.0).to(tl.float32) * qk_scale
        qm = tl.zeros([BLOCK_R], tl.float32)
        if CENTRED:  # q.m in fp32, before q is rounded for the dot: mean_ptr is [Hkv, D] contiguous
            qm = tl.sum(q * tl.load(mean_ptr + kvh * D + d, mask=dmask, other=0.0)[None, :], axis=1)
        if FP16_DOT and not FMA:
            q = q.to(tl.float16)
        m_i = tl.full([BLOCK_R], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            nmask = n < end
            page = tl.load(bt_ptr + row * s_bt + n // page_tokens, mask=nmask, other=0)
            off = (n % page_tokens).to(tl.int64)
            kvmask = nmask[:, None] & dmask[None, :]
            k_at = _chunks.page_start(page, chunk_ptr, chunk_pages, s_kn)  # [BLOCK_N] int64
            k = tl.load(k_ptr + (k_at + off * s_kp + kvh * s_kh)[:, None] + d[None, :],
                        mask=kvmask, other=0)
            s = _qk(q, k, FMA, FP16_DOT)  # [BLOCK_R, BLOCK_N]
            if QUANT:
                ks_at = _chunks.page_start(page, chunk_ptr + 1, chunk_pages, s_ksn)
                ks = tl.load(ks_ptr + ks_at + off * s_ksp + kvh * s_ksh, mask=nmask, other=0.0)
                s = _key_scale(s, ks, qm, CENTRED)
            s = tl.where(nmask[None, :] & (n[None, :] < lens[:, None]), s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with nothing yet
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            v_at = _chunks.page_start(page, chunk_ptr + 2, chunk_pages, s_vn)
            v = tl.load(v_ptr + (v_at + off * s_vp + kvh * s_vh)[:, None] + d[None, :],
                        mask=kvmask, other=0)
            if QUANT:
                vs_at = _chunks.page_start(page, chunk_ptr + 3, chunk_pages, s_vsn)
                vs = tl.load(vs_ptr + vs_at + off * s_vsp + kvh * s_vsh, mask=nmask, other=0.0)
                p = p * vs.to(tl.float32)[None, :]
            acc = acc * alpha[:, None] + _pv(p, v, FMA, FP16_DOT)
            m_i = m_new
        has = l_i > 0
        out = acc / tl.where(has, l_i, 1.0)[:, None]
        lse = tl.where(has, (m_i + tl.log2(tl.where(has, l_i, 1.0))) / 1.4426950408889634, float("-inf"))
        tl.store(out_ptr + tok[:, None] * s_ot + heads[:, None] * s_oh + split * s_os + d[None, :], out,
                 mask=rmask[:, None] & dmask[None, :])
        tl.store(lse_ptr + tok * s_lt + heads * s_lh + split, lse, mask=rmask)

    @triton.jit
    def _merge_splits_kernel(po_ptr, pl_ptr, out_ptr, lse_ptr, num_splits,
                             s_pt, s_ph, s_ps, s_plt, s_plh, s_ot, s_oh, s_lt, s_lh,
                             D: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr):
        # partial out [T, H, S, D] and lse [T, H, S] -> out [T, H, D], lse [T, H]
        t = tl.program_id(0)
        h = tl.program_id(1)
        sp = tl.arange(0, BLOCK_S)
        d = tl.arange(0, BLOCK_D)
        smask = sp < num_splits
        lse = tl.load(pl_ptr + t * s_plt + h * s_plh + sp, mask=smask, other=float("-inf"))
        top = tl.max(lse, axis=0)
        top = tl.where(top == float("-inf"), 0.0, top)
        w = tl.where(lse == float("-inf"), 0.0, tl.exp(lse - top))  # [BLOCK_S]
        denom = tl.sum(w, axis=0)
        o = tl.load(po_ptr + t * s_pt + h * s_ph + sp[:, None] * s_ps + d[None, :],
                    mask=smask[:, None] & (d < D)[None, :], other=0.0)
        num = tl.sum(o * w[:, None], axis=0)
        res = tl.where(denom > 0, num / tl.where(denom > 0, denom, 1.0), 0.0)
        tl.store(out_ptr + t * s_ot + h * s_oh + d, res, mask=d < D)
        tl.store(lse_ptr + t * s_lt + h * s_lh,
                 tl.where(denom > 0, top + tl.log(tl.where(denom > 0, denom, 1.0)), float("-inf")))


def _num_splits(blocks, kv_heads, max_len, block_n, device, tune) -> int:
    """Enough programs to give each SM `programs_per_sm`, but each split at least 4 inner steps."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    want = -(-tune["programs_per_sm"] * sms // max(1, blocks * kv_heads))
    return max(1, min(want, -(-max_len // (4 * block_n)), 64))


def _query_blocks(seq_idx, tokens_per_block):
    """Prefill tiling: runs of equal seq_idx cut into blocks -> int32 [num_blocks, 2] = (first, count).
    Reads seq_idx on the host (one sync), which decode steps never pay."""
    s = seq_idx.cpu()
    change = torch.ones(s.numel(), dtype=torch.bool)
    change[1:] = s[1:] != s[:-1]
    bounds = change.nonzero().flatten().tolist() + [s.numel()]
    blocks = []
    for a, b in zip(bounds[:-1], bounds[1:]):  # one iteration per run (sequence), not per token
        first = torch.arange(a, b, tokens_per_block)
        blocks.append(torch.stack([first, (b - first).clamp(max=tokens_per_block)], dim=1))
    return torch.cat(blocks).to(torch.int32).to(seq_idx.device)


def _launch_plan(t, group, block_table, seq_idx, tune, per_token=False):
    """Decode (one program per token) or prefill (blocks of tokens of one row) launch parameters;
    per_token: one program per token whatever the rows (a token's result then never depends on
    which other tokens share its row)."""
    p2 = triton.next_power_of_2
    if t > block_table.shape[0] and not per_token:  # some row has several queries: tile them
        tokens_per_block = max(1, tune["prefill_rows"] // group)
        qblk = _query_blocks(seq_idx, tokens_per_block)
        return dict(qblk=qblk, blocks=qblk.shape[0], block_r=max(16, p2(tokens_per_block * group)),
                    block_n=tune["prefill_block_n"], warps=tune["prefill_warps"], fma=False)
    fma = bool(tune["fma"]) and group < 16
    return dict(qblk=seq_idx, blocks=t, block_r=p2(group) if fma else max(16, p2(group)),
                block_n=tune["block_n"], warps=tune["num_warps"], fma=fma)


def paged_attention_triton(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_idx, kv_lens, sm_scale,
                           *, num_splits=None, tune=None, k_mean=None, chunks=None, per_token=False):
    """Triton kernel with the reference's signature; `num_splits` overrides the sequence split and
    `tune` (keys of TUNE) the launch configuration. k_mean: [Hkv, D] float32 for centred keys.
    chunks: a chunked store's PageChunks (kernels/page_chunks.py; the caches are chunk 0's) or None.
    per_token: decode tiles (one program per query token) for prefill rows too."""
    _check(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_idx, kv_lens, k_mean)
    assert triton is not None, "triton is not installed"
    t, h, d = q.shape
    hkv, page_tokens = k_cache.shape[2], k_cache.shape[1]
    out = torch.empty(t, h, d, dtype=torch.float32, device=q.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=q.device)
    if t == 0:
        return out, lse
    tune = {**TUNE, **(tune or {})}
    plan = _launch_plan(t, h // hkv, block_table, seq_idx, tune, per_token)
    max_len = max(1, block_table.shape[1] * page_tokens)  # upper bound: no sync for kv_lens.max()
    splits = num_splits or _num_splits(plan["blocks"], hkv, max_len, plan["block_n"], q.device, tune)
    chunk = -(-max_len // splits)
    chunk = -(-chunk // plan["block_n"]) * plan["block_n"]
    splits = -(-max_len // chunk)
    if splits == 1:
        p_out, p_lse = out.unsqueeze(2), lse.unsqueeze(2)  # [T, H, 1, D], [T, H, 1]
    else:
        p_out = torch.empty(t, h, splits, d, dtype=torch.float32, device=q.device)
        p_lse = torch.empty(t, h, splits, dtype=torch.float32, device=q.device)
    quant = k_cache.dtype == torch.int8
    ks, vs = (k_scale, v_scale) if quant else (k_cache, v_cache)
    mean = q if k_mean is None else k_mean.contiguous()  # any pointer when not CENTRED
    offsets, chunk_pages = _chunks.table_of(k_cache, chunks)
    _paged_attn_kernel[(plan["blocks"], hkv, splits)](
        q, k_cache, v_cache, ks, vs, block_table, seq_idx, kv_lens, plan["qblk"], mean, p_out, p_lse,
        offsets, chunk_pages, float(sm_scale) * LOG2E, page_tokens, chunk,
        q.stride(0), q.stride(1), *k_cache.stride()[:3], *v_cache.stride()[:3], *ks.stride()[:3],
        *vs.stride()[:3], block_table.stride(0), p_out.stride(0), p_out.stride(1), p_out.stride(2),
        p_lse.stride(0), p_lse.stride(1),
        GROUP=h // hkv, BLOCK_R=plan["block_r"], D=d, BLOCK_D=max(16, triton.next_power_of_2(d)),
        BLOCK_N=plan["block_n"], QUANT=quant,
        FP16_DOT=quant or k_cache.dtype == torch.float16 or q.dtype != torch.float32,
        FMA=plan["fma"], USE_QBLK=plan["qblk"] is not seq_idx, CENTRED=k_mean is not None,
        num_warps=plan["warps"], num_stages=tune["num_stages"])
    if splits > 1:
        merge_splits(p_out, p_lse, out, lse)
    return out, lse


def merge_splits(p_out, p_lse, out, lse) -> None:
    """out[t, h], lse[t, h] = the log-sum-exp merge of the S partial results p_out [T, H, S, D]
    (normalized per split) and p_lse [T, H, S], on the GPU (one program per token and head)."""
    t, h, splits, d = p_out.shape
    _merge_splits_kernel[(t, h)](
        p_out, p_lse, out, lse, splits, p_out.stride(0), p_out.stride(1), p_out.stride(2),
        p_lse.stride(0), p_lse.stride(1), out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        D=d, BLOCK_S=triton.next_power_of_2(splits), BLOCK_D=triton.next_power_of_2(d))


def merge_attention_triton(outs, lses):
    """Segment merge on the GPU: stack to [T, H, S, D] and reuse the split-merge kernel."""
    assert triton is not None, "triton is not installed"
    if len(outs) != len(lses) or not outs:
        raise ValueError(f"need matching non-empty lists of outs and lses; got {len(outs)} and {len(lses)}")
    if len(outs) == 1:
        return outs[0].float()
    p_out = torch.stack([o.float() for o in outs], dim=2)  # [T, H, S, D]
    p_lse = torch.stack([x.float() for x in lses], dim=2)  # [T, H, S]
    t, h, splits, d = p_out.shape
    out = torch.empty(t, h, d, dtype=torch.float32, device=p_out.device)
    lse = torch.empty(t, h, dtype=torch.float32, device=p_out.device)
    if t:
        merge_splits(p_out, p_lse, out, lse)
    return out


merge_attention = merge_attention_ref

__all__ = ["paged_attention_ref", "paged_attention_triton", "merge_attention", "merge_attention_ref",
           "merge_attention_triton"]
