"""Replay a trace on ONE system and return its row; run in a fresh process per system.

A fresh (spawned) process per system makes peak RSS mean something: it holds only that system's
weights and KV, not the previous system's leftovers. Returns plain dicts (picklable): the row, the
per-request records (with answer text), the TTFT list and the KV timeline for the plot.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys

from edge_runtime.bench.monitor import PeakSampler, process_rss_bytes
from edge_runtime.bench.replay import ReplayResult, replay
from edge_runtime.bench.stats import percentile
from edge_runtime.bench.trace import load_trace
from edge_runtime.bench.edge_systems import EdgeBackend, load_hf_backend
from edge_runtime.bench.engine_bench import set_threads
from edge_runtime.bench.http_client import OpenAIChatBackend
from edge_runtime.bench.jtop_cols import JtopRecorder, unavailable_columns


def later_turn_ttfts(turns) -> list[float]:
    """turns: (stream, turn, ttft_s) of every request -> the TTFTs of every turn after each
    stream's first (its cold start)."""
    turns = list(turns)
    first: dict = {}
    for stream, turn, _ in turns:
        first[stream] = min(first.get(stream, turn), turn)
    return [ttft for stream, turn, ttft in turns if ttft is not None and turn > first[stream]]


def summarize(system: str, result: ReplayResult, peak_kv, peak_rss, extra: dict) -> dict:
    recs = result.records
    ttfts = [r.ttft_s for r in recs if r.ttft_s is not None]
    later = later_turn_ttfts((r.stream, r.turn, r.ttft_s) for r in recs)
    tpots = [r.tpot_s for r in recs if r.tpot_s is not None]
    out_tokens = sum(r.output_tokens for r in recs)
    prompt = [r.prompt_tokens for r in recs if r.prompt_tokens is not None]
    cached = [r.cached_prompt_tokens for r in recs if r.cached_prompt_tokens is not None]
    span = result.makespan_s
    row = {
        "system": system, "requests": len(recs), "makespan_s": span,
        "requests_per_s": len(recs) / span, "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / span,
        "ttft_p50_s": percentile(ttfts, 50), "ttft_p95_s": percentile(ttfts, 95),
        "ttft_p95_later_turns_s": percentile(later, 95) if later else None,
        "tpot_p50_s": percentile(tpots, 50), "tpot_p95_s": percentile(tpots, 95),
        "peak_kv_bytes": peak_kv, "peak_rss_bytes": peak_rss,
        "prompt_tokens": sum(prompt) if len(prompt) == len(recs) else None,
        "cached_prompt_tokens": sum(cached) if len(cached) == len(recs) else None,
    }
    if row["prompt_tokens"] and row["cached_prompt_tokens"] is not None:
        row["cached_frac"] = row["cached_prompt_tokens"] / row["prompt_tokens"]
    else:
        row["cached_frac"] = None
    row.update(extra)
    return row


def _make_backend(system: str, opts: dict):
    if system.startswith(("unix:", "http://", "https://")):
        return OpenAIChatBackend(system, model=opts.get("target_model"))
    if system == "hf":
        return load_hf_backend(opts["model"], opts.get("model_path"))

    return EdgeBackend.create(opts["model"], system, opts)


def _progress_printer(system: str, total: int):
    done = [0]
    step = max(1, total // 10)

    def on_record(rec) -> None:
        done[0] += 1
        if done[0] % step == 0 or done[0] == total:
            print(f"[bench trace] {system}: {done[0]}/{total} requests", file=sys.stderr, flush=True)

    return on_record


async def _replay_async(backend, trace, opts, on_record):
    try:
        return await replay(trace, backend, arrivals=opts.get("arrivals", "ignore"),
                            on_record=on_record, history=opts.get("history", "generated"),
                            warm=opts.get("prewarm", False))
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            res = close()
            if asyncio.iscoroutine(res):
                await res


def run_system(system: str, trace_path: str, opts: dict) -> dict:
    """Load `system`, replay the trace, return {"row", "records", "ttft_s", "kv_timeline"}."""
    set_threads(opts.get("threads"))

    trace = load_trace(trace_path).limit_streams(opts.get("streams"))
    print(f"[bench trace] {system}: loading...", file=sys.stderr, flush=True)
    backend = _make_backend(system, opts)
    remote = system.startswith(("unix:", "http"))
    recorder, why = JtopRecorder.open()
    rss = PeakSampler(lambda: None if remote else process_rss_bytes(), interval_s=0.05)
    on_record = _progress_printer(system, trace.num_requests)
    with rss, (recorder if recorder is not None else contextlib.nullcontext()):
        result = asyncio.run(_replay_async(
            backend, trace, opts, on_record))
    kv = getattr(backend, "kv", None)
    if kv is not None:
        kv.rebase(result.t0)
    extra = dict(backend.extra_columns()) if hasattr(backend, "extra_columns") else {}
    out_tokens = sum(r.output_tokens for r in result.records)
    extra.update(recorder.columns(out_tokens, result.makespan_s) if recorder else
                 unavailable_columns(why))
    if recorder is not None:
        recorder.close()
    row = summarize(system, result, kv.peak if kv else None, rss.peak, extra)
    return {
        "row": row,
        "records": [r.to_dict() for r in result.records],
        "ttft_s": [r.ttft_s for r in result.records if r.ttft_s is not None],
        "kv_timeline": [list(s) for s in kv.samples] if kv else [],
    }
