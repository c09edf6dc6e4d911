"""The launch-config sweep of tools/gpu_check.py over the spaces of tune_space.py.

One budget, spent in STAGES order (the kernels with the most to gain first); each stage ends at its
cumulative share of the budget, so time a stage leaves unused goes to the next. Every space is
visited in a fixed shuffled order (seed 0), so a stage cut short by its deadline still samples its
whole space.

Every config is checked against the reference before it is timed; a config that fails to compile or
disagrees is recorded, never raised. `tuned_rows` re-runs the checks with the best configs.
"""
import json
import random
import time

import torch

from edge_runtime.kernels import awq_gemm as awq
from edge_runtime.kernels import paged_attention as pa

from . import tune_space
from .checks import (DECODE_KERNELS, awq_ctx, check_awq, check_awq_prepared, check_decode, check_prefill,
                     decode_err, decode_time, prepared_err, prepared_time, random_awq)
from .timing import log, n_copies, time_us

W4A16_MS = (1, 5)  # a GEMV config is swept per M class: M = 1, and M = 5 for 2..16


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


def _shuffled(space):
    space = list(space)
    random.Random(0).shuffle(space)
    return space


def _sweep_decode(kernel, space, ctx, cuda, out, deadline):
    one = [ctx["one"]]
    for tune in _shuffled(space):
        _try_config(out, kernel, tune, lambda: decode_err(ctx, kernel, one, tune) <= 2e-2,
                    lambda: decode_time(ctx, kernel, one, cuda, tune), deadline, ctx["nbytes"])


def _sweep_paged_decode(env, state, out, deadline):
    if "decode" in state:
        _sweep_decode("paged_decode", tune_space.paged_decode_space(), state["decode"], env["cuda"], out, deadline)


def _sweep_paged_attention(env, state, out, deadline):
    """Decode gets 40% of the stage's time, prefill the rest."""
    cuda = env["cuda"]
    if "decode" in state:
        _sweep_decode("paged_attention decode", tune_space.attention_decode_space(), state["decode"], cuda, out,
                      time.perf_counter() + 0.4 * (deadline - time.perf_counter()))
    if "prefill" not in state:
        return
    args, want = state["prefill"]
    for tune in _shuffled(tune_space.prefill_space()):
        _try_config(out, "paged_attention prefill", tune,
                    lambda: float((pa.paged_attention_triton(*args, tune=tune)[0] - want).abs().max()) <= 2e-2,
                    lambda: time_us(lambda i: pa.paged_attention_triton(*args, tune=tune), cuda, graph=False),
                    deadline)


def _sweep_awq_gemm(env, state, out, deadline):
    c, dev, cuda, l2, gen = (env[k] for k in ("c", "dev", "cuda", "l2", "gen"))
    g = c["group"]
    for k, n in c["awq"]:
        w4 = random_awq(k, n, g, dev, gen)
        w32 = awq.dequantize_awq(*w4, g)
        w4s = [w4] + [tuple(x.clone() for x in w4) for _ in range(n_copies(k * n // 2, l2) - 1)]
        for m in W4A16_MS:
            x = torch.randn(m, k, generator=gen).to(dev).half()
            want = x.float() @ w32
            tol = 1e-2 * float(want.abs().max())
            for tune in _shuffled(tune_space.gemv_space(m)):
                _try_config(out, f"gemv M={m} K={k} N={n}", tune,
                            lambda: float((awq.awq_gemm_triton(x, *w4, g, tune=tune).float() - want).abs().max())
                            <= tol,
                            lambda: time_us(lambda i: awq.awq_gemm_triton(x, *w4s[i % len(w4s)], g, tune=tune),
                                            cuda), deadline)


def _sweep_prepared(env, state, out, deadline):
    c, dev, cuda, l2, gen = (env[k] for k in ("c", "dev", "cuda", "l2", "gen"))
    g = c["group"]
    for k, n in c["awq"]:
        ctx = awq_ctx(k, n, g, dev, l2, gen)
        for m in W4A16_MS:
            x = torch.randn(m, k, generator=gen).to(dev).to(torch.float16 if cuda else torch.float32)
            want = x.float() @ ctx["w32"]
            for tune in _shuffled(tune_space.prepared_space(m)):
                _try_config(out, f"prepared M={m} K={k} N={n}", tune,
                            lambda: prepared_err(x, want, ctx, tune) <= 1e-2,
                            lambda: prepared_time(x, ctx, cuda, tune), deadline)


# (stage, share of the budget, sweep): page-tile decode and prepared W4A16 first, the kernels whose
# launch defaults the H200 sweep set; paged attention and awq_gemm serve checks and baselines
STAGES = (("paged_decode", 0.28, _sweep_paged_decode), ("awq_prepared", 0.42, _sweep_prepared),
          ("paged_attention", 0.12, _sweep_paged_attention), ("awq_gemm", 0.18, _sweep_awq_gemm))


def best_configs(out, shapes):
    """op -> its fastest correct record; and per W4A16 kernel and M class the one config with the
    least total time over every (K, N) in shapes, as "<kernel> M=<m> all shapes"."""
    best = {}
    for rec in out:
        if rec.get("ok") and (rec["op"] not in best or rec["us"] < best[rec["op"]]["us"]):
            best[rec["op"]] = rec
    for kernel in ("gemv", "prepared"):
        for m in W4A16_MS:
            ops = {f"{kernel} M={m} K={k} N={n}" for k, n in shapes}
            totals = {}  # config -> [tune, total us, ops it passed]
            for rec in out:
                if rec.get("ok") and rec["op"] in ops:
                    total = totals.setdefault(json.dumps(rec["tune"], sort_keys=True), [rec["tune"], 0.0, set()])
                    total[1] += rec["us"]
                    total[2].add(rec["op"])
            full = [v for v in totals.values() if v[2] == ops]
            if full:
                tune, us, _ = min(full, key=lambda v: v[1])
                name = f"{kernel} M={m} all shapes"
                best[name] = dict(op=name, tune=tune, us=us, ok=True)
    return best


def sweep(env, state, budget_s):
    """Check and time the spaces of tune_space.py within budget_s -> {configs, best}. state: the
    inputs run_checks kept ("decode": a decode_ctx, "prefill": check_prefill's)."""
    log(f"Sweep: launch configs (budget {budget_s:.0f} s)")
    out, t0, share = [], time.perf_counter(), 0.0
    for _, part, run in STAGES:
        share += part
        run(env, state, out, t0 + share * budget_s)
    best = best_configs(out, env["c"]["awq"])
    for op, rec in sorted(best.items()):
        log(f"  best {op:<34} {rec['us']:8.1f} us  {rec['tune']}")
    failed = [r for r in out if not r.get("ok")]
    log(f"  {len(out)} configs timed, {len(failed)} failed or wrong" + (f"; first: {failed[0]}" if failed else ""))
    return dict(configs=out, best=best)


def tuned_rows(env, state, best):
    """The checks again with the sweep's best configs (what TUNE defaults become)."""
    c, dev, cuda, copy_bw, l2, gen = (env[k] for k in ("c", "dev", "cuda", "copy_bw", "l2", "gen"))
    log("Checks with the best swept configs")
    rows = []
    for kernel in DECODE_KERNELS:
        if kernel in best and "decode" in state:
            rows += check_decode(c, cuda, state["decode"], copy_bw, kernel, tune=best[kernel]["tune"])
    if "paged_attention prefill" in best:
        rows += check_prefill(c, dev, cuda, state["layout"], state["pool"], gen,
                              tune=best["paged_attention prefill"]["tune"])[0]
    for kernel, check in (("gemv", check_awq), ("prepared", check_awq_prepared)):
        names = [f"{kernel} M={m} all shapes" for m in W4A16_MS]
        if all(name in best for name in names):
            rows += check(c, dev, cuda, copy_bw, l2, gen, tunes={"m1": best[names[0]]["tune"],
                                                                 "m": best[names[1]]["tune"]})
    for r in rows:
        r["tuned"] = True
    return rows
