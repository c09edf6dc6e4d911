"""The correctness + timing checks of tools/gpu_check.py, one function per kernel role: KV write;
decode attention (one check for both decode kernels on the same inputs: paged_attention_triton, a
launch per segment + merge, and paged_decode, whole-page tiles with both segments in one launch);
prefill attention; W4A16 on the AutoAWQ layout and on the prepared one (kernels/awq_prepared.py).

Each check compares a Triton kernel with its torch reference on the same random data (pass = max
error <= tol) and times it against the reference and a dense fp16 equivalent (SDPA / matmul).
`c` is a shape dict (tools/gpu_check.py REAL or TINY). Rows are dicts printed as one table.
"""
import math

import torch

from edge_runtime.kernels import awq_gemm as awq
from edge_runtime.kernels import awq_prepared as awp
from edge_runtime.kernels import kv_write as kvw
from edge_runtime.kernels import paged_attention as pa
from . import paged_decode as pd
from .timing import log, n_copies, time_us


def build_pool(c, dev, gen):
    """Region A: page 0 = shared prefix, then each sequence's tail pages; region B: each sequence in
    its own pages from position 0. Both hold the same K/V, so both layouts must give one answer."""
    s, length, pfx, p = c["seqs"], c["seq_len"], c["prefix"], c["page"]
    tail_pages, full_pages = math.ceil((length - pfx) / p), math.ceil(length / p)
    region_a = 1 + s * tail_pages
    pages = region_a + s * full_pages
    kv = torch.randn(2, s, length, c["kv_heads"], c["head_dim"], generator=gen).to(dev)
    kv[:, 1:, :pfx] = kv[:, :1, :pfx]  # the shared prefix
    tail_bt = torch.tensor([[1 + i * tail_pages + j for j in range(tail_pages)] for i in range(s)])
    full_bt = torch.tensor([[region_a + i * full_pages + j for j in range(full_pages)] for i in range(s)])
    pos = torch.arange(length)
    slots_a = torch.cat([pos[:pfx]] + [tail_bt[i][(pos[pfx:] - pfx) // p] * p + (pos[pfx:] - pfx) % p
                                       for i in range(s)])
    k_a = torch.cat([kv[0, 0, :pfx]] + [kv[0, i, pfx:] for i in range(s)])
    v_a = torch.cat([kv[1, 0, :pfx]] + [kv[1, i, pfx:] for i in range(s)])
    slots_b = torch.cat([full_bt[i][pos // p] * p + pos % p for i in range(s)])
    k_b, v_b = kv[0].reshape(-1, *kv.shape[3:]), kv[1].reshape(-1, *kv.shape[3:])
    layout = dict(pages=pages, tail_bt=tail_bt.to(torch.int32), full_bt=full_bt.to(torch.int32))
    writes = [(k_a, v_a, slots_a.to(dev)), (k_b, v_b, slots_b.to(dev))]
    return layout, writes, kv


def new_pool(pages, c, dev, layers=1):
    shape = (pages, layers, c["page"], c["kv_heads"], c["head_dim"])
    z = torch.zeros(shape, dtype=torch.int8, device=dev)
    s = torch.ones(shape[:-1], dtype=torch.float16, device=dev)
    return [z[:, 0], z.clone()[:, 0], s[:, 0], s.clone()[:, 0]]


def row(check, shape, err, tol, us, how, ref_us=None, dense_us=None, nbytes=None, copy_bw=None, **extra):
    r = dict(check=check, shape=shape, max_err=err, tol=tol, ok=bool(err <= tol), kernel_us=us, timing=how,
             ref_us=ref_us, dense_us=dense_us)
    if nbytes:
        r["GBps"] = nbytes / us / 1e3
        r["pct_copy"] = 100.0 * r["GBps"] / copy_bw
    r["speedup_vs_ref"] = ref_us / us if ref_us else None
    r["speedup_vs_dense"] = dense_us / us if dense_us else None
    r.update(extra)
    log(f"  {check:<34} {shape:<28} err {err:.2e} (tol {tol:.0e}) {'ok' if r['ok'] else 'FAIL'}"
        f"  {us:9.1f} us")
    return r


def check_kv_write(c, dev, cuda, layout, writes, copy_bw):
    log("KV write: quantize + scatter, Triton vs reference (bit-exact expected)")
    pool_t, pool_r = new_pool(layout["pages"], c, dev), new_pool(layout["pages"], c, dev)
    for k, v, slots in writes:
        kvw.write_kv_triton(k, v, *pool_t, slots)
        kvw.write_kv_ref(k, v, *pool_r, slots)
    diff = max(int((pool_t[i].int() - pool_r[i].int()).abs().max()) for i in (0, 1))
    bad = sum(int((pool_t[i] != pool_r[i]).sum()) for i in range(4))
    rows = []
    k_b, v_b, slots_b = writes[1]
    for name, t in (("write_kv decode", c["seqs"]), ("write_kv prefill", c["seq_len"])):
        k, v, sl = k_b[:t].half(), v_b[:t].half(), slots_b[:t]
        scratch = new_pool(layout["pages"], c, dev)
        us, how = time_us(lambda i: kvw.write_kv_triton(k, v, *scratch, sl), cuda)
        ref_us, _ = time_us(lambda i: kvw.write_kv_ref(k, v, *scratch, sl), cuda, graph=False)
        nbytes = 2 * t * c["kv_heads"] * (c["head_dim"] * 3 + 2)  # read fp16, write int8 + scale
        rows.append(row(name, f"T={t} Hkv={c['kv_heads']} D={c['head_dim']}", float(diff), 1.0, us, how,
                        ref_us=ref_us, nbytes=nbytes, copy_bw=copy_bw, mismatches=bad))
    return rows, pool_t


def decode_segments(c, dev, layout):
    """(block_table, seq_idx, kv_lens) of the whole sequences, of the shared prefix (page 0), and
    of the private tails."""
    s, pfx = c["seqs"], c["prefix"]
    idx = torch.arange(s, dtype=torch.int32, device=dev)
    lens = lambda n: torch.full((s,), n, dtype=torch.int32, device=dev)  # noqa: E731
    one = (layout["full_bt"].to(dev), idx, lens(c["seq_len"]))
    prefix = (torch.zeros(s, 1, dtype=torch.int32, device=dev), idx, lens(pfx))
    tail = (layout["tail_bt"].to(dev), idx, lens(c["seq_len"] - pfx))
    return one, prefix, tail


def dense_kv(pool, bt, length, c):
    """Dequantized fp16 K, V [B, Hkv, L, D] for SDPA."""
    out = []
    for cache, scale in ((pool[0], pool[2]), (pool[1], pool[3])):
        x = cache[bt.long()].float() * scale[bt.long()].float().unsqueeze(-1)  # [B, np, P, Hkv, D]
        out.append(x.flatten(1, 2)[:, :length].transpose(1, 2).half().contiguous())
    return out


def decode_ctx(c, dev, cuda, layout, pool, l2, gen):
    """What every decode kernel's check and sweep share: q, the segments (`one`: whole sequences;
    `two`: shared prefix + private tail), pools rotated past L2, the reference's output and time,
    and SDPA's time over the same K/V in fp16 (the dense baseline)."""
    sm = 1.0 / math.sqrt(c["head_dim"])
    q = torch.randn(c["seqs"], c["heads"], c["head_dim"], generator=gen).to(dev).half()
    one, prefix, tail = decode_segments(c, dev, layout)
    want, want_lse = pa.paged_attention_ref(q, *pool, *one, sm)
    nbytes = c["seqs"] * c["seq_len"] * c["kv_heads"] * (c["head_dim"] + 2) * 2
    pools = [pool] + [[x.clone() for x in pool] for _ in range(n_copies(nbytes, l2) - 1)]
    ref_us, _ = time_us(lambda i: pa.paged_attention_ref(q, *pools[i % len(pools)], *one, sm), cuda, graph=False)
    kd, vd = dense_kv(pool, one[0], c["seq_len"], c)
    q4 = q.unsqueeze(2)  # [B, H, 1, D]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    dense_us, _ = time_us(lambda i: sdpa(q4, kd, vd, enable_gqa=c["heads"] != c["kv_heads"]), cuda)
    return dict(q=q, sm=sm, one=one, two=[prefix, tail], pools=pools, want=want, want_lse=want_lse,
                nbytes=nbytes, ref_us=ref_us, dense_us=dense_us, dense_GBps=kd.numel() * 4 / dense_us / 1e3)


def attention_decode(ctx, pool, segs, tune):
    """paged_attention_triton per segment, merged by merge_attention_triton -> (out, lse or None:
    the merge returns no lse)."""
    parts = [pa.paged_attention_triton(ctx["q"], *pool, *seg, ctx["sm"], tune=tune) for seg in segs]
    if len(parts) == 1:
        return parts[0]
    return pa.merge_attention_triton([p[0] for p in parts], [p[1] for p in parts]), None


def page_tile_decode(ctx, pool, segs, tune):
    """paged_decode: every segment in one launch, then the split merge -> (out, lse)."""
    return pd.paged_decode(ctx["q"], *pool, segs, ctx["sm"], tune=tune)


# decode kernel -> (its call on a decode_ctx, its launch defaults); the names are the check rows'
# prefixes and the sweep's op names
DECODE_KERNELS = {"paged_attention decode": (attention_decode, pa.TUNE),
                  "paged_decode": (page_tile_decode, pd.TUNE)}


def decode_err(ctx, kernel, segs, tune):
    out, lse = DECODE_KERNELS[kernel][0](ctx, ctx["pools"][0], segs, tune)
    err = float((out - ctx["want"]).abs().max())
    return err if lse is None else max(err, float((lse - ctx["want_lse"]).abs().max()))


def decode_time(ctx, kernel, segs, cuda, tune):
    run, pools = DECODE_KERNELS[kernel][0], ctx["pools"]
    return time_us(lambda i: run(ctx, pools[i % len(pools)], segs, tune), cuda)


def check_decode(c, cuda, ctx, copy_bw, kernel, tune=None):
    """One decode kernel (a key of DECODE_KERNELS) on ctx's q and pages, as one segment and as
    shared prefix + private tail; tune: launch config (None: the kernel's TUNE)."""
    log(f"Paged int8 decode attention, {kernel}: one segment, and shared prefix + private tail")
    shape = f"B={c['seqs']} L={c['seq_len']} H={c['heads']}/{c['kv_heads']} D={c['head_dim']}"
    rows = []
    for label, segs, extra in (("1 segment", [ctx["one"]], ""), ("prefix+tail", ctx["two"], f" p={c['prefix']}")):
        err = decode_err(ctx, kernel, segs, tune)
        us, how = decode_time(ctx, kernel, segs, cuda, tune)
        rows.append(row(f"{kernel} {label}", shape + extra, err, 2e-2, us, how, ctx["ref_us"], ctx["dense_us"],
                        ctx["nbytes"], copy_bw, dense_GBps=ctx["dense_GBps"],
                        tune={**DECODE_KERNELS[kernel][1], **(tune or {})}))
    return rows


def check_prefill(c, dev, cuda, layout, pool, gen, tune=None):
    log("Paged prefill attention: new tokens against the cached sequence (causal kv_lens)")
    t, h, d, length = c["prefill"], c["heads"], c["head_dim"], c["seq_len"]
    sm = 1.0 / math.sqrt(d)
    q = torch.randn(t, h, d, generator=gen).to(dev).half()
    idx = torch.zeros(t, dtype=torch.int32, device=dev)
    lens = torch.arange(length - t + 1, length + 1, dtype=torch.int32, device=dev)
    args = (q, *pool, layout["full_bt"].to(dev), idx, lens, sm)
    want, _ = pa.paged_attention_ref(*args)
    got, _ = pa.paged_attention_triton(*args, tune=tune)
    err = float((got - want).abs().max())
    # prefill tiles are found on the host (a sync), which a CUDA graph cannot capture
    us, how = time_us(lambda i: pa.paged_attention_triton(*args, tune=tune), cuda, graph=False)
    ref_us, _ = time_us(lambda i: pa.paged_attention_ref(*args), cuda, graph=False)
    kd, vd = dense_kv(pool, layout["full_bt"][:1].to(dev), length, c)
    mask = torch.arange(length, device=dev)[None, :] < lens[:, None]  # [T, L]
    qd = q.transpose(0, 1).unsqueeze(0)  # [1, H, T, D]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    dense_us, _ = time_us(lambda i: sdpa(qd, kd, vd, attn_mask=mask, enable_gqa=h != c["kv_heads"]), cuda)
    return [row("paged_attention prefill", f"T={t} L={length} H={h}/{c['kv_heads']}", err, 2e-2, us, how, ref_us,
                dense_us)], (args, want)


def random_awq(k, n, group, dev, gen):
    qweight = torch.randint(-2**31, 2**31 - 1, (k, n // 8), generator=gen, dtype=torch.int64).to(torch.int32)
    qzeros = torch.randint(-2**31, 2**31 - 1, (k // group, n // 8), generator=gen, dtype=torch.int64)
    scales = (torch.rand(k // group, n, generator=gen) * 0.01 + 0.001).half()
    return qweight.to(dev), qzeros.to(torch.int32).to(dev), scales.to(dev)


def check_awq(c, dev, cuda, copy_bw, l2, gen, tunes=None):
    """tunes: optional {"m1": tune for M=1, "m": tune for 1 < M <= 16}."""
    log("W4A16 GEMM/GEMV on AutoAWQ packing vs dequantize + fp32 matmul; timed vs fp16 matmul")
    rows, g = [], c["group"]
    act = torch.float16 if cuda else torch.float32
    for k, n in c["awq"]:
        w4 = random_awq(k, n, g, dev, gen)
        w32 = awq.dequantize_awq(*w4, g)  # [K, N] fp32
        nbytes = k * n // 2 + (k // g) * n * 2 + (k // g) * n // 2
        w4s = [w4] + [tuple(x.clone() for x in w4) for _ in range(n_copies(nbytes, l2) - 1)]
        w16 = w32.to(act)
        w16s = [w16] + [w16.clone() for _ in range(n_copies(w16.numel() * 2, l2) - 1)]
        for m in c["ms"]:
            x = torch.randn(m, k, generator=gen).to(dev).to(act)
            want = x.float() @ w32
            dense_us, _ = time_us(lambda i: x @ w16s[i % len(w16s)], cuda)
            ref_us = None
            if m in (1, max(c["ms"])):
                ref_us, _ = time_us(lambda i: awq.awq_gemm_ref(x, *w4, g), cuda, graph=False)
            tune = None if not tunes or m > 16 else tunes["m1" if m == 1 else "m"]
            variants = [("w4a16 gemv" if m <= 16 else "w4a16 gemm", tune)]
            if m > 16:
                variants.append(("w4a16 gemm dequant+mm", {"mode": "dequant"}))
            for check, tn in variants:
                y = awq.awq_gemm_triton(x, *w4, g, tune=tn)
                err = float((y.float() - want).abs().max()) / float(want.abs().max())
                us, how = time_us(lambda i: awq.awq_gemm_triton(x, *w4s[i % len(w4s)], g, tune=tn), cuda)
                rows.append(row(check, f"M={m} K={k} N={n} G={g}", err, 1e-2, us, how, ref_us, dense_us,
                                nbytes + x.numel() * x.element_size(), copy_bw, m=m, k=k, n=n))
    return rows


def awq_ctx(k, n, g, dev, l2, gen):
    w4 = random_awq(k, n, g, dev, gen)
    w32 = awq.dequantize_awq(*w4, g)  # [K, N] fp32
    packed = awp.prepare_awq_weight(*w4, g)
    nbytes = k * n // 2 + (k // g) * n * 3  # int4 weights + fp16 scales + uint8 zeros
    copies = [packed] + [awp.prepare_awq_weight(*w4, g) for _ in range(n_copies(nbytes, l2) - 1)]
    return dict(w32=w32, packed=copies, nbytes=nbytes, g=g)


def prepared_err(x, want, ctx, tune):
    y = awp.awq_gemm_prepared_triton(x, ctx["packed"][0], tune=tune)
    return float((y.float() - want).abs().max()) / float(want.abs().max())


def prepared_time(x, ctx, cuda, tune):
    ps = ctx["packed"]
    return time_us(lambda i: awp.awq_gemm_prepared_triton(x, ps[i % len(ps)], tune=tune), cuda)


def check_awq_prepared(c, dev, cuda, copy_bw, l2, gen, tunes=None):
    """tunes: optional {"m1": tune for M=1, "m": tune for 1 < M <= 16}."""
    log("W4A16 on the prepared layout vs dequantize + fp32 matmul; timed vs fp16 matmul")
    rows, g = [], c["group"]
    act = torch.float16 if cuda else torch.float32
    for k, n in c["awq"]:
        ctx = awq_ctx(k, n, g, dev, l2, gen)
        w16 = ctx["w32"].to(act)
        w16s = [w16] + [w16.clone() for _ in range(n_copies(w16.numel() * 2, l2) - 1)]
        for m in c["ms"]:
            x = torch.randn(m, k, generator=gen).to(dev).to(act)
            want = x.float() @ ctx["w32"]
            dense_us, _ = time_us(lambda i: x @ w16s[i % len(w16s)], cuda)
            tune = None if not tunes or m > 16 else tunes["m1" if m == 1 else "m"]
            err = prepared_err(x, want, ctx, tune)
            us, how = prepared_time(x, ctx, cuda, tune)
            name = "w4a16 prepared gemv" if m <= 16 else "w4a16 prepared gemm"
            rows.append(row(name, f"M={m} K={k} N={n} G={g}", err, 1e-2, us, how, None, dense_us,
                            ctx["nbytes"] + x.numel() * x.element_size(), copy_bw, m=m, k=k, n=n))
    return rows
