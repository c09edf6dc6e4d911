"""The timed runs of `bench engine`: random prompts, one batch run to completion, and the rows of
every batch size at one prompt length with their rooflines (definitions in docs/perf.md,
"Definitions"). bench/engine_bench.py (the command and its report) and bench/weights_compare.py
(the same runs per weight form) both build on these.
"""

from __future__ import annotations

import random
import time

from edge_runtime.bench.stats import Summary
from edge_runtime.engine.api import SamplingParams


def random_prompts(rng: random.Random, vocab_size: int, special_ids: set, batch: int, length: int):
    """`batch` lists of `length` random non-special token ids."""
    pool_hi = vocab_size - 1
    out = []
    for _ in range(batch):
        ids = []
        while len(ids) < length:
            t = rng.randint(0, pool_hi)
            if t not in special_ids:
                ids.append(t)
        out.append(ids)
    return out


def timed_run(engine, prompts: list[list[int]], gen_tokens: int) -> tuple[float, float]:
    """Run one batch to completion; returns (prefill seconds, decode seconds)."""
    params = SamplingParams(max_tokens=gen_tokens, temperature=0.0, ignore_eos=True)
    t0 = time.perf_counter()
    rids = [engine.add_request(p, params) for p in prompts]
    pending_first = set(rids)
    t_prefilled = None
    produced = {rid: 0 for rid in rids}
    while engine.has_unfinished():
        events = engine.step()
        now = time.perf_counter()
        for ev in events:
            if ev.request_id in produced:
                produced[ev.request_id] += len(ev.token_ids)
                if ev.token_ids:
                    pending_first.discard(ev.request_id)
        if t_prefilled is None and not pending_first:
            t_prefilled = now
    t_end = time.perf_counter()
    bad = {r: n for r, n in produced.items() if n != gen_tokens}
    assert not bad, f"requests produced a wrong number of tokens (wanted {gen_tokens}): {bad}"
    assert t_prefilled is not None
    return t_prefilled - t0, t_end - t_prefilled


def bench_prompt(engine, loaded, batches, prompt_len, gen_tokens, repeat, rng, progress,
                 measure=None) -> list[dict]:
    """Rows for every batch size at one prompt length. The timed runs are interleaved (run i of
    every batch size, then run i + 1), so on a machine whose speed drifts all batch sizes see the
    same conditions and their ratio is fair. measure(): a bandwidth reading (bench/bandwidth.py),
    taken after the warm-ups and after every timed run; each run keeps the readings around it."""
    vocab = loaded.config.vocab_size
    special = set(getattr(loaded.tokenizer, "all_special_ids", []) or [])
    for batch in batches:  # warm-up
        timed_run(engine, random_prompts(rng, vocab, special, batch, prompt_len), min(gen_tokens, 8))
    last = measure() if measure else None
    runs = {b: {"prefill": [], "decode": [], "bandwidth": []} for b in batches}
    for i in range(repeat):
        for batch in batches:
            progress(f"batch {batch} prompt {prompt_len}: run {i + 1}/{repeat}")
            t_pre, t_dec = timed_run(
                engine, random_prompts(rng, vocab, special, batch, prompt_len), gen_tokens)
            r = runs[batch]
            r["prefill"].append(batch * prompt_len / t_pre)
            r["decode"].append(batch * (gen_tokens - 1) / t_dec)
            if measure:
                now = measure()
                r["bandwidth"].append((last, now))
                last = now
    rows = []
    for batch in batches:
        r = runs[batch]
        gbps = [loaded.weight_bytes * d / batch / 1e9 for d in r["decode"]]  # steps/s x bytes
        row = {
            "batch": batch, "prompt_tokens": prompt_len, "gen_tokens": gen_tokens, "repeat": repeat,
            "prefill_tok_s": Summary.of(r["prefill"]).to_dict(),
            "decode_tok_s": Summary.of(r["decode"]).to_dict(),
            "weight_read_gbps": Summary.of(gbps).to_dict(),
            "prefill_samples": r["prefill"], "decode_samples": r["decode"],
            "weight_read_gbps_samples": gbps,
        }
        if measure:
            add_roofline(row, [max(x.read_gbps, y.read_gbps) for x, y in r["bandwidth"]])
            row["bandwidth"] = [[x.to_dict(), y.to_dict()] for x, y in r["bandwidth"]]
        rows.append(row)
    return rows


def add_roofline(row: dict, roofs: list[float]) -> None:
    """roofs: each timed run's roofline, the higher of the read GB/s measured just before and just
    after it (the VM's bandwidth changes within seconds; the higher reading gives the lower,
    conservative percentage)."""
    gbps = row["weight_read_gbps_samples"]
    assert len(roofs) == len(gbps) == row["repeat"], (len(roofs), len(gbps))
    row["roofline_read_gbps"] = Summary.of(roofs).to_dict()
    row["roofline_pct"] = Summary.of([100 * g / r for g, r in zip(gbps, roofs)]).to_dict()
