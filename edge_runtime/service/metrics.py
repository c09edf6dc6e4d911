"""Service counters and latency histograms, rendered as /v1/stats JSON and Prometheus text.

Invariants:
- /metrics and /v1/stats render the same `stats` dict (built by `ServiceMetrics.snapshot`), so the
  two never disagree.
- Histograms are cumulative Prometheus histograms: `counts[i]` counts observations <= `bounds[i]`
  (the +Inf bucket equals `count`).
- Engine statistics are passed through generically: every numeric value of `engine.stats()`
  (nested dicts flattened with '_') becomes `edge_engine_<key>`, so new engine numbers (pages
  free/cached/live, inline slots, hit rate, queue, running) show up without editing this file.
  They are gauges, except the monotone counters named in `ENGINE_COUNTERS`, typed `counter`. Those
  keep their documented names (`edge_engine_steps`, not `..._steps_total`): queries keep working.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections import Counter

# Monotone since start (Engine.counters, the scheduler's preemptions, KVCounters, the pool's
# evictions); tests/test_service_metrics.py checks this set against a real engine's stats.
ENGINE_COUNTERS = frozenset(
    ["steps", "prefill_tokens", "decode_tokens", "requests_finished", "requests_failed",
     "requests_cancelled", "requests_refused", "pool_bytes_released", "preemptions", "kv_evictions",
     "forced_tokens", "draft_tokens", "draft_tokens_kept"]
    + [f"kv_{name}" for name in ("admitted", "finished", "cancelled", "preemptions",
                                 "prompt_tokens", "cached_prompt_tokens", "copies", "copied_tokens",
                                 "inline_to_pages", "pages_to_slots", "take_overs",
                                 "failed_allocations", "local_pages_released")])
TTFT_BOUNDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
TOKEN_BOUNDS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        assert list(bounds) == sorted(bounds), bounds
        self.bounds = bounds
        self.buckets = [0] * len(bounds)  # non-cumulative per bucket
        self.count = 0
        self.sum = 0.0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.bounds, value)
        if i < len(self.bounds):
            self.buckets[i] += 1
        self.count += 1
        self.sum += value

    def snapshot(self) -> dict:
        cumulative, total = [], 0
        for n in self.buckets:
            total += n
            cumulative.append(total)
        return {"bounds": list(self.bounds), "counts": cumulative, "count": self.count,
                "sum": self.sum}


class ServiceMetrics:
    """Updated by the request handlers (event loop thread); read by /metrics and /v1/stats."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = Counter()  # (endpoint, status) -> n
        self.tokens_in = 0
        self.tokens_out = 0
        self.cached_tokens = 0
        self.cancelled = 0
        self.rejected_busy = 0
        self.connections_evicted = 0  # closed idle to make room under service.max_connections
        self.connections_refused = 0  # closed at once: every open connection was busy
        self.accept_errors = 0  # accept() failed (out of descriptors or memory)
        self.ttft = Histogram(TTFT_BOUNDS)
        self.per_token = Histogram(TOKEN_BOUNDS)

    def record_request(self, endpoint: str, status: int) -> None:
        with self._lock:
            self.requests[(endpoint, status)] += 1

    def record_result(self, prompt_tokens: int, cached: int, generated: int,
                      first_token_s: float, total_s: float) -> None:
        with self._lock:
            self.tokens_in += prompt_tokens
            self.cached_tokens += cached
            self.tokens_out += generated
            if generated:
                self.ttft.observe(first_token_s)
            if generated > 1:
                self.per_token.observe((total_s - first_token_s) / (generated - 1))

    def snapshot(self, engine_stats: dict, guard: dict | None, backends: dict | None,
                 state: dict) -> dict:
        with self._lock:
            return {
                "service": {**state, "tokens_in": self.tokens_in, "tokens_out": self.tokens_out,
                            "cached_prompt_tokens": self.cached_tokens,
                            "cancelled": self.cancelled, "rejected_busy": self.rejected_busy,
                            "connections_evicted": self.connections_evicted,
                            "connections_refused": self.connections_refused,
                            "accept_errors": self.accept_errors,
                            "requests": [{"endpoint": e, "status": s, "count": n}
                                         for (e, s), n in sorted(self.requests.items())]},
                "latency": {"ttft_seconds": self.ttft.snapshot(),
                            "per_token_seconds": self.per_token.snapshot()},
                "engine": engine_stats,
                "guard": guard,
                "kernel_backends": backends,
            }


def render_prometheus(stats: dict) -> str:
    out: list[str] = []
    svc = stats["service"]
    _gauge(out, "edge_service_ready", "1 when the model is loaded and warm",
           1 if svc.get("status") == "ready" else 0)
    gauges = ("in_flight", "running", "queued", "outside_engine", "connections_open")
    for key in gauges + ("tokens_in", "tokens_out", "cached_prompt_tokens", "cancelled",
                         "rejected_busy", "connections_evicted", "connections_refused",
                         "accept_errors"):
        if key in svc:
            kind = "gauge" if key in gauges else "counter"
            suffix = "" if kind == "gauge" else "_total"
            _metric(out, f"edge_service_{key}{suffix}", kind, key.replace("_", " "), [("", svc[key])])
    _metric(out, "edge_service_requests_total", "counter", "HTTP requests by endpoint and status",
            [(f'{{endpoint="{r["endpoint"]}",status="{r["status"]}"}}', r["count"])
             for r in svc["requests"]])
    for name, h in stats["latency"].items():
        _histogram(out, f"edge_{name}", h)
    for key, value in _flatten(stats.get("engine") or {}):
        kind = "counter" if key in ENGINE_COUNTERS else "gauge"
        _metric(out, f"edge_engine_{key}", kind, f"engine stats: {key}", [("", value)])
    _render_guard(out, stats.get("guard"))
    backend = stats.get("kernel_backends") or {}  # engine/backend.py describe()
    if backend:
        _metric(out, "edge_backend_info", "gauge", "the engine's back end and device (labels), always 1",
                [(f'{{backend="{_label(backend["backend"])}",device="{_label(backend["device"])}"}}', 1)])
    kernels = backend.get("kernels", {})
    _metric(out, "edge_kernel_backend", "gauge", "kernel in use per op (label), always 1",
            [(f'{{op="{_label(op)}",backend="{_label(b)}"}}', 1) for op, b in sorted(kernels.items())])
    return "\n".join(out) + "\n"


GUARD_INPUTS = {
    "used_fraction": "memory guard pressure: max(machine_used_fraction, cgroup_used_fraction)",
    "machine_used_fraction": "1 - available_bytes / total_bytes",
    "cgroup_used_fraction": "cgroup_working_set_bytes / cgroup_limit_bytes",
    "total_bytes": "machine RAM (MemTotal, or jtop RAM tot)",
    "available_bytes": "machine RAM available (MemAvailable, or jtop tot - used): cache left out",
    "gpu_shared_bytes": "NvMap: RAM the GPU holds on Jetson (jtop RAM shared / NvMapMemUsed)",
    "swap_used_bytes": "swap in use",
    "cgroup_usage_bytes": "usage of the binding cgroup (memory.current / memory.usage_in_bytes)",
    "cgroup_inactive_file_bytes": "its inactive file pages (reclaimable cache), left out",
    "cgroup_working_set_bytes": "cgroup_usage_bytes - cgroup_inactive_file_bytes",
    "cgroup_limit_bytes": "tightest limit on the path to the root (memory.max/high, v1 limit)",
}


def _render_guard(out: list[str], guard: dict | None) -> None:
    if not guard:
        return
    states = ("ok", "high", "critical")
    _metric(out, "edge_guard_state", "gauge", "memory guard state (1 for the current one)",
            [(f'{{state="{s}",source="{_label(guard["source"])}"}}', int(guard["state"] == s))
             for s in states])
    transitions = [(f'{{from="{a}",to="{b}"}}', guard["transitions"].get(f"{a}->{b}", 0))
                   for a in states for b in states if a != b]
    _metric(out, "edge_guard_transitions_total", "counter", "memory guard transitions", transitions)
    _gauge(out, "edge_guard_telemetry_ok", "1 while the guard reads memory, 0 while its reads fail",
           int(not guard.get("telemetry_error")))
    _metric(out, "edge_guard_actions_total", "counter", "memory guard actions (units per action)",
            [(f'{{action="{k}"}}', v) for k, v in sorted(guard["actions"].items())])
    inputs = guard.get("inputs") or {}
    for key, value in inputs.items():  # the used fraction and every number it is made of
        if value is not None:
            _gauge(out, f"edge_guard_{key}", GUARD_INPUTS.get(key, f"last sample: {key}"), value)
    if guard.get("cgroup_limit"):
        _metric(out, "edge_guard_cgroup_limit_info", "gauge",
                "the cgroup limit the guard compares with (label), always 1",
                [(f'{{limit="{_label(guard["cgroup_limit"])}"}}', 1)])
    _gauge(out, "edge_guard_admission_paused_seconds",
           "seconds admission has been paused by the guard (0 while admitting)",
           guard.get("admission_paused_s") or 0.0)


def _histogram(out: list[str], name: str, h: dict) -> None:
    out.append(f"# HELP {name} {name.replace('_', ' ')}")
    out.append(f"# TYPE {name} histogram")
    for bound, count in zip(h["bounds"], h["counts"]):
        out.append(f'{name}_bucket{{le="{bound:g}"}} {count}')
    out.append(f'{name}_bucket{{le="+Inf"}} {h["count"]}')
    out.append(f"{name}_sum {h['sum']:.6f}")
    out.append(f"{name}_count {h['count']}")


def _gauge(out: list[str], name: str, help_: str, value) -> None:
    _metric(out, name, "gauge", help_, [("", value)])


def _metric(out: list[str], name: str, kind: str, help_: str, samples) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} {kind}")
    for labels, value in samples:
        out.append(f"{name}{labels} {_num(value)}")


def _flatten(d: dict, prefix: str = ""):
    for key, value in d.items():
        name = re.sub(r"[^a-zA-Z0-9_]", "_", f"{prefix}{key}")
        if isinstance(value, dict):
            yield from _flatten(value, name + "_")
        elif isinstance(value, (int, float)):  # bools are ints: exported as 0/1
            yield name, value


def _num(value) -> str:
    return repr(float(value)) if isinstance(value, float) else str(int(value))


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")
