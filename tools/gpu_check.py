#!/usr/bin/env python3
"""Check every Triton kernel against its torch reference at real sizes on a CUDA GPU, and time it.

    python tools/gpu_check.py --json gpu_check.json            # CUDA: Llama-2-7B shapes
    python tools/gpu_check.py --tiny --json /tmp/tiny.json     # anywhere: tiny shapes; on CPU the
                                                               # kernels run under TRITON_INTERPRET=1
Shapes (real): 32 heads, head_dim 128, 32 KV heads, 512-token pages; 5 sequences of 2,000 tokens
sharing a 300-token prefix (one-segment and prefix+tail+merge layouts); a 256-token prefill;
W4A16 at K x N = 4096 x 4096 and 4096 x 11008, group 128, M = 1..16 and 512.

Timing: CUDA events around a CUDA graph of `ITERS` calls (plain stream loop where a graph cannot be
captured, e.g. the references, which sync), median of `REPS`, after a warm-up. Inputs rotate over
copies totalling > 2x the L2 size, so weights and pages come from DRAM as in a real decode step.
Bandwidth: GB/s = bytes the op must read (int8 K/V + fp16 scales; int4 weights + scales + zeros)
/ time; the card's copy bandwidth counts bytes read + written by a large device-to-device copy.
Exit status 1 when any kernel disagrees with its reference; targets are reported, not enforced.
"""
import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported by the kernels
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import edge_runtime  # noqa: E402

if not (Path(edge_runtime.__file__).parent / "kernels").exists():
    edge_runtime.__path__.append(str(ROOT))  # not installed: map kernels/ as edge_runtime.kernels
from edge_runtime.kernels import awq_gemm as awq  # noqa: E402
from edge_runtime.kernels import kv_write as kvw  # noqa: E402
from edge_runtime.kernels import paged_attention as pa  # noqa: E402
from edge_runtime.kernels import tune_space  # noqa: E402

REAL = dict(heads=32, kv_heads=32, head_dim=128, page=512, seqs=5, seq_len=2000, prefix=300, prefill=256,
            awq=[(4096, 4096), (4096, 11008)], ms=[1, 2, 3, 4, 5, 8, 16, 512], group=128)
TINY = dict(heads=4, kv_heads=2, head_dim=32, page=16, seqs=3, seq_len=40, prefix=12, prefill=8,
            awq=[(128, 64), (128, 88)], ms=[1, 3, 16, 20], group=32)
ITERS, REPS = 20, 7
TARGETS = {"paged_decode_pct_copy": 60.0, "gemv_speedup_vs_fp16_m1_5": 2.5}


def log(msg):
    print(msg, flush=True)


def time_us(fn, cuda, graph=True, iters=ITERS, reps=REPS):
    """Median microseconds per call of fn(i) (i = call index, for rotating inputs)."""
    if not cuda:
        fn(0)
        samples = []
        for _ in range(2):
            t0 = time.perf_counter()
            fn(1)
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples), "cpu-wall"
    for i in range(3):
        fn(i)
    torch.cuda.synchronize()
    run, how = (lambda: [fn(i) for i in range(iters)]), "stream"
    if graph:
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for i in range(iters):
                    fn(i)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                for i in range(iters):
                    fn(i)
            run, how = g.replay, "graph"
        except Exception as exc:  # noqa: BLE001 - reported, then the stream loop is used
            log(f"  (no CUDA graph: {type(exc).__name__}: {exc}; timing the stream loop)")
            torch.cuda.synchronize()
    run()
    torch.cuda.synchronize()
    samples = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1000.0 / iters)
    return statistics.median(samples), how


def copy_bandwidth(cuda, dev):
    n = (1 << 30) if cuda else (1 << 24)
    a = torch.empty(n, dtype=torch.uint8, device=dev).random_()
    b = torch.empty_like(a)
    us, _ = time_us(lambda i: b.copy_(a), cuda, graph=False, iters=5)
    return 2 * n / us / 1e3  # GB/s, read + write


def n_copies(one_bytes, l2_bytes):
    return max(1, min(16, math.ceil(2 * l2_bytes / max(1, one_bytes))))


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
    log(f"  {check:<26} {shape:<28} err {err:.2e} (tol {tol:.0e}) {'ok' if r['ok'] else 'FAIL'}"
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


def decode_args(c, dev, layout, pool, q):
    s, pfx = c["seqs"], c["prefix"]
    idx = torch.arange(s, dtype=torch.int32, device=dev)
    lens = lambda n: torch.full((s,), n, dtype=torch.int32, device=dev)  # noqa: E731
    one = (layout["full_bt"].to(dev), idx, lens(c["seq_len"]))
    prefix = (torch.zeros(s, 1, dtype=torch.int32, device=dev), idx, lens(pfx))
    tail = (layout["tail_bt"].to(dev), idx, lens(c["seq_len"] - pfx))
    return [(q, *pool, *one), (q, *pool, *prefix), (q, *pool, *tail)]


def two_segments(q, pool, prefix, tail, sm, tune=None):
    o1, l1 = pa.paged_attention_triton(q, *pool, *prefix, sm, tune=tune)
    o2, l2 = pa.paged_attention_triton(q, *pool, *tail, sm, tune=tune)
    return pa.merge_attention_triton([o1, o2], [l1, l2])


def dense_kv(pool, bt, length, c):
    """Dequantized fp16 K, V [B, Hkv, L, D] for SDPA."""
    out = []
    for cache, scale in ((pool[0], pool[2]), (pool[1], pool[3])):
        x = cache[bt.long()].float() * scale[bt.long()].float().unsqueeze(-1)  # [B, np, P, Hkv, D]
        out.append(x.flatten(1, 2)[:, :length].transpose(1, 2).half().contiguous())
    return out


def check_decode(c, dev, cuda, layout, pool, copy_bw, l2, gen, tune=None):
    log("Paged int8 decode attention: one segment, and shared prefix + tail + merge")
    s, h, d, length = c["seqs"], c["heads"], c["head_dim"], c["seq_len"]
    sm = 1.0 / math.sqrt(d)
    q = torch.randn(s, h, d, generator=gen).to(dev).half()
    one, prefix, tail = decode_args(c, dev, layout, pool, q)
    want, want_lse = pa.paged_attention_ref(*one, sm)
    got, got_lse = pa.paged_attention_triton(*one, sm, tune=tune)
    merged = two_segments(q, pool, prefix[5:], tail[5:], sm, tune)
    err1 = max(float((got - want).abs().max()), float((got_lse - want_lse).abs().max()))
    err2 = float((merged - want).abs().max())
    nbytes = s * length * c["kv_heads"] * (d + 2) * 2
    pools = [pool] + [[x.clone() for x in pool] for _ in range(n_copies(nbytes, l2) - 1)]
    args_of = lambda i, a: (q, *pools[i % len(pools)], *a[5:])  # noqa: E731
    us1, how = time_us(lambda i: pa.paged_attention_triton(*args_of(i, one), sm, tune=tune), cuda)
    us2, _ = time_us(lambda i: two_segments(q, pools[i % len(pools)], prefix[5:], tail[5:], sm, tune), cuda)
    ref_us, _ = time_us(lambda i: pa.paged_attention_ref(*args_of(i, one), sm), cuda, graph=False)
    kd, vd = dense_kv(pool, layout["full_bt"].to(dev), length, c)
    q4 = q.unsqueeze(2)  # [B, H, 1, D]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    dense_us, _ = time_us(lambda i: sdpa(q4, kd, vd, enable_gqa=h != c["kv_heads"]), cuda)
    shape = f"B={s} L={length} H={h}/{c['kv_heads']} D={d}"
    dense_gbps = kd.numel() * 4 / dense_us / 1e3  # fp16 K and V
    return [row("paged decode 1 segment", shape, err1, 2e-2, us1, how, ref_us, dense_us, nbytes, copy_bw,
                dense_GBps=dense_gbps),
            row("paged decode prefix+tail", shape + f" p={c['prefix']}", err2, 2e-2, us2, how, ref_us,
                dense_us, nbytes, copy_bw, dense_GBps=dense_gbps)], (q, one, pools, want, nbytes)


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
    return [row("paged prefill", f"T={t} L={length} H={h}/{c['kv_heads']}", err, 2e-2, us, how, ref_us,
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
            tune = None if not tunes or m > 16 else tunes["m1" if m == 1 else "m"]
            y = awq.awq_gemm_triton(x, *w4, g, tune=tune)
            err = float((y.float() - want).abs().max()) / float(want.abs().max())
            us, how = time_us(lambda i: awq.awq_gemm_triton(x, *w4s[i % len(w4s)], g, tune=tune), cuda)
            dense_us, _ = time_us(lambda i: x @ w16s[i % len(w16s)], cuda)
            ref_us = None
            if m in (1, max(c["ms"])):
                ref_us, _ = time_us(lambda i: awq.awq_gemm_ref(x, *w4, g), cuda, graph=False)
            rows.append(row("w4a16 gemm" if m > 16 else "w4a16 gemv", f"M={m} K={k} N={n} G={g}", err, 1e-2,
                            us, how, ref_us, dense_us, nbytes + x.numel() * x.element_size(), copy_bw,
                            m=m, k=k, n=n))
    return rows


def _try_config(out, op, tune, check, timed, deadline, nbytes=None):
    """Check then time one config; failures (e.g. out of shared memory) are recorded, not raised."""
    if time.perf_counter() > deadline:
        return
    rec = dict(op=op, tune=tune)
    try:
        rec["ok"] = bool(check())
        rec["us"], _ = timed()
        if nbytes:
            rec["GBps"] = nbytes / rec["us"] / 1e3
    except Exception as exc:  # noqa: BLE001 - a config that cannot run is data, not a crash
        rec.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:160]}")
    out.append(rec)


def _sweep_attention(c, cuda, ctx, prefill_ctx, out, deadline):
    q, one, pools, want, nbytes = ctx
    sm = 1.0 / math.sqrt(c["head_dim"])
    for tune in tune_space.decode_space():
        _try_config(out, "paged_decode", tune,
                    lambda: float((pa.paged_attention_triton(*one, sm, tune=tune)[0] - want).abs().max()) <= 2e-2,
                    lambda: time_us(lambda i: pa.paged_attention_triton(q, *pools[i % len(pools)], *one[5:], sm,
                                                                        tune=tune), cuda), deadline, nbytes)
    args, want_p = prefill_ctx
    for tune in tune_space.prefill_space():
        _try_config(out, "paged_prefill", tune,
                    lambda: float((pa.paged_attention_triton(*args, tune=tune)[0] - want_p).abs().max()) <= 2e-2,
                    lambda: time_us(lambda i: pa.paged_attention_triton(*args, tune=tune), cuda, graph=False),
                    deadline)


def _sweep_gemv(c, dev, cuda, l2, gen, out, deadline):
    g = c["group"]
    for k, n in c["awq"]:
        w4 = random_awq(k, n, g, dev, gen)
        w32 = awq.dequantize_awq(*w4, g)
        w4s = [w4] + [tuple(x.clone() for x in w4) for _ in range(n_copies(k * n // 2, l2) - 1)]
        for m in (1, 5):
            x = torch.randn(m, k, generator=gen).to(dev).half()
            want_y = x.float() @ w32
            tol = 1e-2 * float(want_y.abs().max())
            for tune in tune_space.gemv_space(m):
                _try_config(out, f"gemv M={m} K={k} N={n}", tune,
                            lambda: float((awq.awq_gemm_triton(x, *w4, g, tune=tune).float() - want_y).abs().max())
                            <= tol,
                            lambda: time_us(lambda i: awq.awq_gemm_triton(x, *w4s[i % len(w4s)], g, tune=tune),
                                            cuda), deadline)


def sweep(c, dev, cuda, ctx, prefill_ctx, l2, gen, budget_s):
    """Time the search spaces of kernels/tune_space.py (each config also checked) within budget_s."""
    log(f"Sweep: launch configs (budget {budget_s:.0f} s)")
    out = []
    _sweep_attention(c, cuda, ctx, prefill_ctx, out, time.perf_counter() + 0.4 * budget_s)
    _sweep_gemv(c, dev, cuda, l2, gen, out, time.perf_counter() + 0.6 * budget_s)
    best = {}
    for rec in out:
        if rec.get("ok") and (rec["op"] not in best or rec["us"] < best[rec["op"]]["us"]):
            best[rec["op"]] = rec
    for op, rec in best.items():
        log(f"  best {op:<24} {rec['us']:8.1f} us  {rec['tune']}")
    for m in (1, 5):  # one config per M for every shape: least total time over the shapes
        totals = {}
        for rec in out:
            if rec["op"].startswith(f"gemv M={m} ") and rec.get("ok"):
                key = json.dumps(rec["tune"], sort_keys=True)
                totals.setdefault(key, []).append(rec["us"])
        full = {k: sum(v) for k, v in totals.items() if len(v) == len(c["awq"])}
        if full:
            best[f"gemv M={m} all shapes"] = dict(tune=json.loads(min(full, key=full.get)), us=min(full.values()))
    failed = [r for r in out if not r.get("ok")]
    log(f"  {len(out)} configs timed, {len(failed)} failed or wrong" + (f"; first: {failed[0]}" if failed else ""))
    return dict(configs=out, best=best)


def tuned_rows(c, dev, cuda, layout, pool, copy_bw, l2, gen, best):
    """The main checks again with the sweep's best configs (what TUNE defaults become)."""
    log("Main checks with the best swept configs")
    rows = []
    if "paged_decode" in best:
        rows += check_decode(c, dev, cuda, layout, pool, copy_bw, l2, gen, tune=best["paged_decode"]["tune"])[0]
    if "paged_prefill" in best:
        rows += check_prefill(c, dev, cuda, layout, pool, gen, tune=best["paged_prefill"]["tune"])[0]
    if "gemv M=1 all shapes" in best and "gemv M=5 all shapes" in best:
        tunes = {"m1": best["gemv M=1 all shapes"]["tune"], "m": best["gemv M=5 all shapes"]["tune"]}
        rows += check_awq(c, dev, cuda, copy_bw, l2, gen, tunes=tunes)
    for r in rows:
        r["tuned"] = True
    return rows


def print_table(rows, copy_bw):
    cols = ["check", "shape", "ok", "kernel_us", "ref_us", "dense_us", "GBps", "pct_copy", "speedup_vs_dense"]
    fmt = lambda v: "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))  # noqa: E731
    lines = [" | ".join(cols), " | ".join("---" for _ in cols)]
    lines += [" | ".join(fmt(r.get(col)) for col in cols) for r in rows]
    log(f"\ncopy bandwidth (read + write): {copy_bw:.0f} GB/s\n" + "\n".join(f"| {x} |" for x in lines))


def targets(rows):
    dec = [r for r in rows if r["check"].startswith("paged decode") and "pct_copy" in r]
    gemv = [r for r in rows if r["check"] == "w4a16 gemv" and r["m"] <= 5]
    return {"paged_decode_pct_copy": {"target": TARGETS["paged_decode_pct_copy"],
                                      "measured": {r["check"]: r["pct_copy"] for r in dec}},
            "gemv_speedup_vs_fp16_m1_5": {"target": TARGETS["gemv_speedup_vs_fp16_m1_5"],
                                          "min_measured": min((r["speedup_vs_dense"] for r in gemv), default=None)}}


def guarded(name, fn, errors):
    """Run one section; a crash is recorded (and fails the run) instead of losing the others."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - reported in the table and the JSON
        import traceback
        traceback.print_exc()
        errors.append(f"{name}: {type(exc).__name__}: {exc}")
        return None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the results")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes (CPU interpreter or a quick GPU smoke test)")
    ap.add_argument("--sweep", choices=("auto", "on", "off"), default="auto",
                    help="time alternative launch configs (auto: on CUDA only)")
    ap.add_argument("--sweep-budget", type=float, default=300.0, help="seconds the sweep may take")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        ap.error("no CUDA device: run with --tiny to check the kernels under TRITON_INTERPRET=1")
    dev = torch.device("cuda" if cuda else "cpu")
    c = TINY if args.tiny else REAL
    gen = torch.Generator().manual_seed(0)
    props = torch.cuda.get_device_properties(dev) if cuda else None
    l2 = getattr(props, "L2_cache_size", 64 << 20) if cuda else 0
    name = props.name if cuda else "cpu (TRITON_INTERPRET=1)"
    log(f"device: {name}; torch {torch.__version__}; triton {getattr(kvw.triton, '__version__', None)}")
    t0 = time.perf_counter()
    copy_bw = copy_bandwidth(cuda, dev)
    log(f"copy bandwidth: {copy_bw:.0f} GB/s")
    errors, rows, ctx, pre_ctx = [], [], None, None
    layout, writes, _ = build_pool(c, dev, gen)
    kv_res = guarded("kv_write", lambda: check_kv_write(c, dev, cuda, layout, writes, copy_bw), errors)
    if kv_res:
        rows += kv_res[0]
        dec = guarded("decode", lambda: check_decode(c, dev, cuda, layout, kv_res[1], copy_bw, l2, gen), errors)
        if dec:
            rows += dec[0]
            ctx = dec[1]
        pre = guarded("prefill", lambda: check_prefill(c, dev, cuda, layout, kv_res[1], gen), errors)
        if pre:
            rows += pre[0]
            pre_ctx = pre[1]
    rows += guarded("awq", lambda: check_awq(c, dev, cuda, copy_bw, l2, gen), errors) or []
    print_table(rows, copy_bw)
    result = dict(device=name, torch=torch.__version__, triton=getattr(kvw.triton, "__version__", None),
                  shapes="tiny" if args.tiny else "llama-2-7b", copy_GBps=copy_bw, l2_bytes=l2,
                  iters=ITERS, reps=REPS, tune_attention=pa.TUNE, tune_awq=awq.TUNE, rows=rows,
                  targets=targets(rows), sweep=[], errors=errors,
                  all_ok=bool(rows) and not errors and all(r["ok"] for r in rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    log(f"targets: {json.dumps(result['targets'])}\nerrors: {errors}\nall_ok={result['all_ok']}; "
        f"wrote {args.json} ({time.perf_counter() - t0:.0f} s)")
    if ctx and pre_ctx and (args.sweep == "on" or (args.sweep == "auto" and cuda)):
        result["sweep"] = guarded("sweep", lambda: sweep(c, dev, cuda, ctx, pre_ctx, l2, gen, args.sweep_budget),
                                  errors) or []
        args.json.write_text(json.dumps(result, indent=1))
        log(f"sweep written to {args.json} ({time.perf_counter() - t0:.0f} s)")
        if result["sweep"]:
            tuned = guarded("tuned", lambda: tuned_rows(c, dev, cuda, layout, kv_res[1], copy_bw, l2, gen,
                                                        result["sweep"]["best"]), errors) or []
            print_table(tuned, copy_bw)
            result.update(tuned_rows=tuned, tuned_targets=targets(tuned))
        result["errors"] = errors
        result["all_ok"] = result["all_ok"] and not errors and all(r["ok"] for r in result.get("tuned_rows", []))
        args.json.write_text(json.dumps(result, indent=1))
        log(f"tuned targets: {json.dumps(result.get('tuned_targets'))}\nerrors: {errors}\n"
            f"all_ok={result['all_ok']}; wrote {args.json} ({time.perf_counter() - t0:.0f} s)")
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
