"""Bounded launch-config sweep of the second-generation kernels for tools/gpu_check.py.

Spaces: tune_space.decode_v2_space() and prepared_space(m). Each space is visited in a fixed
shuffled order (seed 0), so a sweep cut short by its deadline still samples the whole space; every
config is checked against the reference before it is timed (gpu_sweep._try_config).
"""
import random
import time

import torch

from edge_runtime.kernels import tune_space
from edge_runtime.kernels.gpu_checks_v2 import (awq_ctx, decode_v2_err, decode_v2_time, prepared_err,
                                                prepared_time)
from edge_runtime.kernels.gpu_sweep import _try_config
from edge_runtime.kernels.gpu_timing import log


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
