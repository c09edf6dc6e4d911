"""Launch-config sweeps for tools/gpu_check.py over the spaces of tune_space.py.

`sweep`: paged attention and the AutoAWQ-layout W4A16; `sweep_v2`: the split decode kernel and the
prepared-layout W4A16, each space visited in a fixed shuffled order (seed 0), so a sweep cut short
by its deadline still samples the whole space.

Every config is checked against the reference before it is timed; a config that fails to compile or
disagrees is recorded, never raised. `tuned_rows` re-runs the main checks with the best configs.
"""
import json
import math
import random
import time

import torch

from edge_runtime.kernels import awq_gemm as awq
from edge_runtime.kernels import paged_attention as pa

from . import tune_space
from .checks import (awq_ctx, check_awq, check_decode, check_prefill, decode_v2_err, decode_v2_time,
                     prepared_err, prepared_time, random_awq)
from .timing import log, n_copies, time_us


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
    """Time the search spaces of tune_space.py (each config also checked) within budget_s."""
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


def _shuffled(space):
    space = list(space)
    random.Random(0).shuffle(space)
    return space


def _sweep_decode(ctx, cuda, out, deadline):
    for tune in _shuffled(tune_space.decode_v2_space()):
        _try_config(out, "decode_v2", tune, lambda: decode_v2_err(ctx, [ctx["one"]], tune) <= 2e-2,
                    lambda: decode_v2_time(ctx, [ctx["one"]], cuda, tune), deadline, ctx["nbytes"])


def _sweep_prepared(c, dev, cuda, l2, gen, out, deadline):
    g = c["group"]
    for k, n in c["awq"]:
        ctx = awq_ctx(k, n, g, dev, l2, gen)
        for m in (1, 5):
            x = torch.randn(m, k, generator=gen).to(dev).to(torch.float16 if cuda else torch.float32)
            want = x.float() @ ctx["w32"]
            for tune in _shuffled(tune_space.prepared_space(m)):
                _try_config(out, f"prepared M={m} K={k} N={n}", tune,
                            lambda: prepared_err(x, want, ctx, tune) <= 1e-2,
                            lambda: prepared_time(x, ctx, cuda, tune), deadline)


def _best(out):
    best = {}
    for rec in out:
        if rec.get("ok") and (rec["op"] not in best or rec["us"] < best[rec["op"]]["us"]):
            best[rec["op"]] = rec
    for m in (1, 5):  # one config per M over both shapes: least total time
        totals = {}
        for rec in out:
            if rec.get("ok") and rec["op"].startswith(f"prepared M={m} "):
                key = repr(sorted(rec["tune"].items()))
                totals.setdefault(key, [rec["tune"], 0.0, set()])
                totals[key][1] += rec["us"]
                totals[key][2].add(rec["op"])
        shapes = {rec["op"] for rec in out if rec["op"].startswith(f"prepared M={m} ")}
        full = [v for v in totals.values() if v[2] == shapes]
        if full:
            tune, us, _ = min(full, key=lambda v: v[1])
            best[f"prepared M={m} all shapes"] = dict(op=f"prepared M={m} all shapes", tune=tune, us=us, ok=True)
    return best


def sweep_v2(c, dev, cuda, decode_ctx, l2, gen, budget_s):
    """Decode v2 gets 40% of budget_s, the prepared W4A16 the rest."""
    log(f"Sweep v2: decode v2 and prepared W4A16 launch configs (budget {budget_s:.0f} s)")
    out = []
    t0 = time.perf_counter()
    if decode_ctx is not None:
        _sweep_decode(decode_ctx, cuda, out, t0 + 0.4 * budget_s)
    _sweep_prepared(c, dev, cuda, l2, gen, out, t0 + budget_s)
    best = _best(out)
    for op, rec in sorted(best.items()):
        log(f"  best {op:<34} {rec['us']:8.1f} us  {rec['tune']}")
    failed = [r for r in out if not r.get("ok")]
    log(f"  {len(out)} configs timed, {len(failed)} failed or wrong" + (f"; first: {failed[0]}" if failed else ""))
    return dict(configs=out, best=best)
