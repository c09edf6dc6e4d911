"""Torch reference of paged attention (decode and prefill) and the log-sum-exp segment merge.

Semantics (docs/interfaces.md): query token t attends to the first `kv_lens[t]` tokens of block-table
row `seq_idx[t]`; token j of a row lives at page `block_table[row, j // P]`, offset `j % P`.
`kv_lens[t] == 0` gives out 0 and lse -inf. GQA: head h reads kv head `h // (H // Hkv)`.
`lse` is the natural-log log-sum-exp of the scaled scores, so segments merge exactly.

Efficiency on CPU (the engine runs on this in CI): no per-token Python loop. Rows with a single
query (decode) are attended in one batched pass; rows with several queries (prefill) are attended
one row at a time, each gathering its pages once, with queries chunked to bound the score memory.
Block-table entries past a row's length are never read for results (they are clamped and masked).
"""
import torch

from edge_runtime.kernels import page_chunks as _chunks

_MAX_SCORE_ELEMENTS = 1 << 25  # score-tensor budget per chunk (128 MiB of fp32)


def _gather(cache, scale, page_ids, length):
    """cache, scale: (chunk tensors, chunk_pages) of a store (kernels/page_chunks.py);
    page_ids: long [B, np] -> (float32 [B, Hkv, L, D] contiguous, scale float32 [B, Hkv, L] or None),
    L = length <= np*P: the tokens past the longest row are cut while still int8 (512-token pages
    are mostly empty at a sequence's end, so converting whole pages would multiply the work).

    Heads go before tokens while still int8 (a 1-byte copy), so the matmuls read the float copy
    without another transpose. The per-token scale is not applied here: it factors out of q.k and
    out of p.v, so applying it to the [.., L] scores/probabilities is D/g times cheaper.
    """
    x = _chunks.take_pages(*cache, page_ids)  # [B, np, P, Hkv, D]
    b, npg, p, hkv, d = x.shape
    quant = x.dtype == torch.int8
    x = x.reshape(b, npg * p, hkv, d)[:, :length].transpose(1, 2).contiguous().float()
    if not quant:
        return x, None
    s = _chunks.take_pages(*scale, page_ids)  # [B, np, P, Hkv]
    s = s.reshape(b, npg * p, hkv)[:, :length].transpose(1, 2).float()  # [B, Hkv, L]
    return x, s


def _attend(qb, lens, k, v, sm_scale, k_mean=None):
    """qb: [B, Tq, H, D] float32, lens: [B, Tq], k/v: (values [B, Hkv, L, D], scale [B, Hkv, L] | None),
    k_mean: [Hkv, D] or None -> out [B, Tq, H, D], lse [B, Tq, H]. A negative key scale marks a
    centred key (kernels/quantize.py): its score is |scale| q.k + q.m."""
    (k, k_scale), (v, v_scale) = k, v
    b, tq, h, d = qb.shape
    hkv, length = k.shape[1], k.shape[2]
    g = h // hkv
    q5 = qb.reshape(b, tq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * tq, d) * sm_scale
    scores = torch.matmul(q5, k.transpose(2, 3))  # [B, Hkv, g*Tq, L]
    if k_scale is not None:
        scores.mul_(k_scale.abs().unsqueeze(2))
        if k_mean is not None:  # + q.m for centred keys
            qm = torch.matmul(q5, k_mean.float().unsqueeze(-1))  # [B, Hkv, g*Tq, 1]
            scores.add_(qm * (k_scale < 0).unsqueeze(2))
    scores = scores.view(b, hkv, g, tq, length)
    valid = torch.arange(length, device=qb.device).view(1, 1, length) < lens.unsqueeze(-1)  # [B, Tq, L]
    scores.masked_fill_(~valid.view(b, 1, 1, tq, length), float("-inf"))
    top = scores.amax(dim=-1, keepdim=True)  # [B, Hkv, g, Tq, 1]; -inf for an empty row
    top.masked_fill_(top == float("-inf"), 0.0)
    probs = scores.sub_(top).exp_()  # one exp, in place: scores are not needed again
    total = probs.sum(dim=-1, keepdim=True)  # 0 for an empty row
    lse = (top + total.log()).squeeze(-1)  # [B, Hkv, g, Tq]; log 0 = -inf
    probs = probs.div_(total.clamp_min(torch.finfo(torch.float32).tiny)).view(b, hkv, g * tq, length)
    if v_scale is not None:
        probs.mul_(v_scale.unsqueeze(2))
    out = torch.matmul(probs, v)  # [B, Hkv, g*Tq, D]
    out = out.view(b, hkv, g, tq, d).permute(0, 3, 1, 2, 4).reshape(b, tq, h, d)
    lse = lse.permute(0, 3, 1, 2).reshape(b, tq, h)
    return out, lse


def _stores(k_cache, v_cache, k_scale, v_scale, chunks):
    """-> (K, V, K scales, V scales) as (chunk tensors, chunk_pages), and the store's page count."""
    if chunks is None:
        n = max(1, k_cache.shape[0])
        return [((t,), n) for t in (k_cache, v_cache, k_scale, v_scale)], k_cache.shape[0]
    c = chunks
    return [(t, c.chunk_pages) for t in (c.k, c.v, c.k_scale, c.v_scale)], c.num_pages


def _run_rows(q, stores, bt_rows, lens, sm_scale, k_mean=None):
    """q: [B, Tq, H, D]; stores: _stores(...); bt_rows: [B, max_pages]; lens: [B, Tq] (max > 0)
    -> out, lse."""
    (k_cache, v_cache, k_scale, v_scale), num_store_pages = stores
    page_tokens = k_cache[0][0].shape[1]
    length = int(lens.max())
    num_pages = (length + page_tokens - 1) // page_tokens
    page_ids = bt_rows[:, :num_pages].long().clamp_(0, num_store_pages - 1)  # [B, np]
    k = _gather(k_cache, k_scale, page_ids, length)
    v = _gather(v_cache, v_scale, page_ids, length)
    return _attend(q.float(), lens, k, v, sm_scale, k_mean)


def check_args(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_idx, kv_lens, k_mean=None) -> None:
    if q.dim() != 3:
        raise ValueError(f"q must be [T, H, D]; got {tuple(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.dtype != v_cache.dtype:
        raise ValueError(f"k_cache and v_cache must be [N, P, Hkv, D] of one dtype; got "
                         f"{tuple(k_cache.shape)} {k_cache.dtype} and {tuple(v_cache.shape)} {v_cache.dtype}")
    t, h, d = q.shape
    hkv = k_cache.shape[2]
    if k_cache.shape[3] != d or h % hkv:
        raise ValueError(f"q heads/head_dim ({h}, {d}) do not fit cache ({hkv}, {k_cache.shape[3]}): "
                         f"H must be a multiple of Hkv and head_dim must match")
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("q and the caches need a contiguous last (head_dim) dimension")
    if k_cache.dtype == torch.int8 and (k_scale is None or v_scale is None
                                        or k_scale.shape != k_cache.shape[:3] or v_scale.shape != k_cache.shape[:3]):
        raise ValueError(f"int8 caches need k_scale/v_scale of shape [N, P, Hkv]={tuple(k_cache.shape[:3])}")
    if k_mean is not None and (k_cache.dtype != torch.int8 or tuple(k_mean.shape) != (hkv, d)
                               or k_mean.dtype != torch.float32):
        raise ValueError(f"k_mean (centred keys) is for int8 caches and must be float32 [Hkv, D]="
                         f"{(hkv, d)}; got {k_mean.dtype} {tuple(k_mean.shape)} for a {k_cache.dtype} cache")
    if block_table.dim() != 2 or block_table.dtype != torch.int32 or block_table.stride(1) != 1:
        raise ValueError(f"block_table must be a row-contiguous int32 [B, max_pages]; got "
                         f"{block_table.dtype} {tuple(block_table.shape)}")
    for name, x in (("seq_idx", seq_idx), ("kv_lens", kv_lens)):
        if x.shape != (t,) or x.dtype != torch.int32:
            raise ValueError(f"{name} must be int32 [T={t}]; got {x.dtype} {tuple(x.shape)}")


def paged_attention_ref(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_idx, kv_lens, sm_scale,
                        k_mean=None, chunks=None):
    """q: [T, H, D] -> (out float32 [T, H, D], lse float32 [T, H]). k_mean: the int8 store's mean
    key [Hkv, D] float32 (centred keys, kernels/quantize.py) or None. chunks: a chunked store's
    PageChunks (kernels/page_chunks.py; the caches are chunk 0's) or None."""
    check_args(q, k_cache, v_cache, k_scale, v_scale, block_table, seq_idx, kv_lens, k_mean)
    stores = _stores(k_cache, v_cache, k_scale, v_scale, chunks)
    num_tokens, num_heads, head_dim = q.shape
    out = torch.zeros(num_tokens, num_heads, head_dim, dtype=torch.float32, device=q.device)
    lse = torch.full((num_tokens, num_heads), float("-inf"), dtype=torch.float32, device=q.device)
    active = (kv_lens > 0).nonzero().flatten()  # [T'] token ids with something to attend to
    if active.numel() == 0:
        return out, lse
    rows = seq_idx[active].long()
    uniq, counts = torch.unique(rows, return_counts=True)
    single = uniq[counts == 1]
    is_single = torch.isin(rows, single)
    toks = active[is_single]  # decode-style rows: one query each, one batched pass
    if toks.numel():
        o, s = _run_rows(q[toks].unsqueeze(1), stores, block_table[seq_idx[toks].long()],
                         kv_lens[toks].unsqueeze(1), sm_scale, k_mean)
        out[toks], lse[toks] = o[:, 0], s[:, 0]
    for row in uniq[counts > 1].tolist():  # prefill rows: one gather per row
        toks = active[rows == row]
        chunk = max(1, _MAX_SCORE_ELEMENTS // (num_heads * int(kv_lens[toks].max())))
        for start in range(0, toks.numel(), chunk):
            part = toks[start:start + chunk]
            o, s = _run_rows(q[part].unsqueeze(0), stores, block_table[row:row + 1],
                             kv_lens[part].unsqueeze(0), sm_scale, k_mean)
            out[part], lse[part] = o[0], s[0]
    return out, lse


def merge_attention_ref(outs, lses):
    """Merge per-segment results by log-sum-exp. outs: list of [T, H, D], lses: list of [T, H]."""
    assert len(outs) == len(lses) and outs, f"need matching non-empty lists, got {len(outs)}/{len(lses)}"
    if len(outs) == 1:
        return outs[0].float()
    lse = torch.stack([x.float() for x in lses])  # [S, T, H]
    top = lse.max(dim=0).values
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    weight = torch.exp(lse - top)  # [S, T, H]; -inf segments weigh 0
    denom = weight.sum(dim=0)  # [T, H]
    num = (torch.stack([x.float() for x in outs]) * weight.unsqueeze(-1)).sum(dim=0)
    return torch.where(denom.unsqueeze(-1) > 0, num / denom.clamp_min(1e-30).unsqueeze(-1),
                       torch.zeros_like(num))
