"""tools/gpu_check.py checks of the second-generation kernels, next to the first ones' rows:
decode attention v2 (kernels/paged_decode.py, one and two segments in one launch) and W4A16 on the
prepared layout (kernels/awq_prepared.py). Same method as gpu_checks.py: compare with the torch
reference on the same random data, then time against the reference and dense fp16.
"""
import math

import torch

from edge_runtime.kernels import awq_gemm as awq
from edge_runtime.kernels import awq_prepared as awp
from edge_runtime.kernels import paged_attention as pa
from edge_runtime.kernels import paged_decode as pd
from edge_runtime.kernels.gpu_checks import decode_args, random_awq, row
from edge_runtime.kernels.gpu_timing import log, n_copies, time_us


def decode_v2_ctx(c, dev, layout, pool, l2, gen):
    """Inputs shared by the v2 check and its sweep: q, the segments, rotated pools, references."""
    sm = 1.0 / math.sqrt(c["head_dim"])
    q = torch.randn(c["seqs"], c["heads"], c["head_dim"], generator=gen).to(dev).half()
    one, prefix, tail = decode_args(c, dev, layout, pool, q)
    want, want_lse = pa.paged_attention_ref(*one, sm)
    nbytes = c["seqs"] * c["seq_len"] * c["kv_heads"] * (c["head_dim"] + 2) * 2
    pools = [pool] + [[x.clone() for x in pool] for _ in range(n_copies(nbytes, l2) - 1)]
    return dict(q=q, sm=sm, one=one[5:], two=[prefix[5:], tail[5:]], pools=pools, want=want,
                want_lse=want_lse, nbytes=nbytes)


def decode_v2_err(ctx, segs, tune):
    out, lse = pd.paged_decode(ctx["q"], *ctx["pools"][0], segs, ctx["sm"], tune=tune)
    err = float((out - ctx["want"]).abs().max())
    return max(err, float((lse - ctx["want_lse"]).abs().max()))


def decode_v2_time(ctx, segs, cuda, tune):
    q, pools, sm = ctx["q"], ctx["pools"], ctx["sm"]
    return time_us(lambda i: pd.paged_decode(q, *pools[i % len(pools)], segs, sm, tune=tune), cuda)


def check_decode_v2(c, dev, cuda, layout, pool, copy_bw, l2, gen, tune=None, ctx=None):
    log("Paged int8 decode attention v2: one segment, and prefix + tail in one launch")
    ctx = ctx or decode_v2_ctx(c, dev, layout, pool, l2, gen)
    shape = f"B={c['seqs']} L={c['seq_len']} H={c['heads']}/{c['kv_heads']} D={c['head_dim']}"
    rows = []
    for name, segs, extra in (("paged decode v2 1 segment", [ctx["one"]], ""),
                              ("paged decode v2 prefix+tail", ctx["two"], f" p={c['prefix']}")):
        err = decode_v2_err(ctx, segs, tune)
        us, how = decode_v2_time(ctx, segs, cuda, tune)
        rows.append(row(name, shape + extra, err, 2e-2, us, how, nbytes=ctx["nbytes"], copy_bw=copy_bw,
                        tune={**pd.TUNE, **(tune or {})}))
    return rows, ctx


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
