"""Prometheus rendering: cumulative histograms, engine stats passthrough, guard series."""

from __future__ import annotations

import random

from edge_runtime.guard_config import GuardConfig
from edge_runtime.guard.guard import MemoryGuard
from edge_runtime.guard.telemetry import ScriptedSource
from edge_runtime.service.metrics import Histogram, ServiceMetrics, render_prometheus


def _series(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_histogram_is_cumulative_against_a_direct_count():
    rng = random.Random(7)
    values = [rng.expovariate(5.0) for _ in range(500)]
    h = Histogram((0.01, 0.1, 0.5, 1.0))
    for v in values:
        h.observe(v)
    snap = h.snapshot()
    assert snap["counts"] == [sum(v <= b for v in values) for b in snap["bounds"]]
    assert snap["count"] == 500 and abs(snap["sum"] - sum(values)) < 1e-9


def test_render_engine_guard_and_backends():
    m = ServiceMetrics()
    m.record_request("/v1/completions", 200)
    m.record_request("/v1/completions", 429)
    m.record_result(prompt_tokens=30, cached=12, generated=11, first_token_s=0.2, total_s=1.2)
    guard = MemoryGuard(GuardConfig(), ScriptedSource([0.5, 0.9, 0.95]), None)
    for _ in range(3):
        guard.poll()
    engine = {"steps": 7, "running": 2, "kv_dtype": "int8", "kv": {"pages_free": 5,
                                                                  "prefix_hit_rate": 0.25}}
    state = {"status": "ready", "in_flight": 3, "running": 2, "queued": 1}
    backend = {"backend": "cuda", "device": "cuda", "kernels": {"paged_attention": "triton"}}
    text = render_prometheus(m.snapshot(engine, guard.snapshot(), backend, state))
    s = _series(text)
    assert s['edge_service_requests_total{endpoint="/v1/completions",status="429"}'] == 1
    assert s["edge_service_tokens_in_total"] == 30 and s["edge_service_tokens_out_total"] == 11
    assert s["edge_service_cached_prompt_tokens_total"] == 12
    assert s['edge_per_token_seconds_bucket{le="0.1"}'] == 1  # (1.2 - 0.2) / 10 tokens
    assert s['edge_ttft_seconds_bucket{le="0.1"}'] == 0 and s['edge_ttft_seconds_count'] == 1
    assert s["edge_engine_kv_pages_free"] == 5 and s["edge_engine_kv_prefix_hit_rate"] == 0.25
    assert "edge_engine_kv_dtype" not in text  # strings are not samples
    assert s['edge_guard_state{state="critical",source="scripted"}'] == 1
    assert s['edge_guard_transitions_total{from="ok",to="high"}'] == 1
    assert s['edge_guard_transitions_total{from="high",to="critical"}'] == 1
    assert s['edge_kernel_backend{op="paged_attention",backend="triton"}'] == 1
    assert s['edge_backend_info{backend="cuda",device="cuda"}'] == 1
    assert s["edge_service_queued"] == 1 and s["edge_service_ready"] == 1


def test_engine_counters_are_typed_counter_and_the_rest_gauge():
    """Engine counters (steps, requests_finished, KV admissions...) were exported as gauges. The set
    in metrics.ENGINE_COUNTERS is checked here against a real engine's counters."""
    from dataclasses import fields

    from engine_helpers import engine_for, tiny

    from edge_runtime.kv.observability import KVCounters
    from edge_runtime.engine.api import SamplingParams

    engine = engine_for(tiny(), num_pages=8, page_tokens=16)
    engine.generate([[1, 2, 3]], SamplingParams(max_tokens=2))
    stats = engine.stats()
    text = render_prometheus(ServiceMetrics().snapshot(stats, None, None, {"status": "ready"}))
    types = dict(line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE"))
    counters = [*engine.counters, "preemptions", "kv_evictions",
                *(f"kv_{f.name}" for f in fields(KVCounters))]
    assert stats["steps"] > 0 and stats["requests_finished"] == 1
    for key in counters:
        assert types[f"edge_engine_{key}"] == "counter", key
    for key in ("running", "waiting", "num_pages", "kv_pages_free", "kv_pages_live",
                "kv_prefix_hit_rate", "kv_inline_slots_used"):
        assert types[f"edge_engine_{key}"] == "gauge", key
    assert f"edge_engine_steps {stats['steps']}" in text  # the documented name is kept
