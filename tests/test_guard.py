"""Memory guard state machine with a scripted telemetry source: every transition and action."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from edge_runtime.errors import ConfigError
from edge_runtime.guard_config import GuardConfig
from edge_runtime.guard.cgroup_memory import CgroupReading
from edge_runtime.guard.guard import MemoryGuard
from edge_runtime.guard.telemetry import MemorySample, ScriptedSource

CFG = GuardConfig(high_used_fraction=0.80, critical_used_fraction=0.90, hysteresis=0.05,
                  preempt_on_critical=2, shrink_chunks_on_critical=1)


class RecordingActions:
    """Records calls; returns plausible amounts so counters can be checked."""

    def __init__(self, chunk_bytes: int = 0) -> None:  # 0: nothing to regrow
        self.calls: list[tuple] = []
        self.paused = False
        self.chunk_bytes = chunk_bytes
        self.retired = 0  # chunks shrunk and not regrown

    def set_admission_paused(self, paused):
        self.paused = paused
        self.calls.append(("paused", paused))

    def evict_cached(self, max_pages):
        self.calls.append(("evict", max_pages))
        return 3

    def preempt_newest(self, k):
        self.calls.append(("preempt", k))
        return k

    def shrink_pool(self, n):
        self.calls.append(("shrink", n))
        self.retired += n
        return n

    def grow_pool(self, n):
        self.calls.append(("grow", n))
        self.retired -= n
        return n

    def next_regrow_bytes(self):
        return self.chunk_bytes if self.retired > 0 else 0

    def refuse_waiting(self, message):
        self.calls.append(("refuse", message))
        return 2


def _run(values, actions=None):
    actions = actions or RecordingActions()
    guard = MemoryGuard(CFG, ScriptedSource(values), actions)
    states = [guard.poll() for _ in values]
    return guard, actions, states


def test_every_transition_with_hysteresis():
    values = [0.5, 0.81, 0.78, 0.74, 0.91, 0.87, 0.84, 0.79, 0.70, 0.95, 0.60]
    guard, actions, states = _run(values)
    assert states == ["ok", "high", "high", "ok", "critical", "critical", "high", "high", "ok",
                      "critical", "ok"]
    assert guard.transitions == {("ok", "high"): 1, ("high", "ok"): 2, ("ok", "critical"): 2,
                                 ("critical", "high"): 1, ("critical", "ok"): 1}


def test_actions_of_each_state():
    """high returns whole chunks (evicting alone lowers no RSS: the pool is resident);
    critical also evicts every cached page and preempts."""
    guard, actions, _ = _run([0.5, 0.82, 0.92, 0.5], RecordingActions(100 << 20))
    assert actions.calls == [
        ("paused", True), ("shrink", 1),                         # ok -> high
        ("evict", None), ("shrink", 1), ("preempt", 2),          # high -> critical
        ("paused", False), ("grow", 1), ("grow", 1),             # critical -> ok: one at a time
    ]
    assert not actions.paused
    assert guard.action_counts == {"paused": 1, "pages_evicted": 3, "chunks_released": 2,
                                   "preempted": 2, "resumed": 1, "chunks_regrown": 2}


def test_regrowth_stops_where_a_chunk_would_reach_the_high_band():
    """Back to ok at 0.70 (band from 0.75): a 0.5 GiB chunk of 8 GiB (+0.0625) would read 0.7625,
    so nothing regrows; at 0.60 two chunks regrow one by one (each judged on a fresh reading),
    then 0.72 + 0.0625 stops the third."""
    actions = RecordingActions(chunk_bytes=512 << 20)
    source = ScriptedSource([0.95, 0.95, 0.95, 0.70])
    guard = MemoryGuard(CFG, source, actions)
    for _ in range(4):
        guard.poll()
    assert guard.state == "ok" and actions.retired == 3  # one chunk per critical poll
    assert guard.action_counts.get("chunks_regrown", 0) == 0
    for v in (0.60, 0.65, 0.72):
        source.push(v)
    guard.poll()  # reads 0.60, regrows one; reads 0.65, regrows one; reads 0.72: stops
    assert guard.action_counts["chunks_regrown"] == 2 and actions.retired == 1


def test_critical_keeps_acting_while_pressure_lasts():
    guard, actions, _ = _run([0.95, 0.96, 0.97])
    assert [c[0] for c in actions.calls].count("shrink") == 3
    assert guard.action_counts["preempted"] == 6
    assert actions.calls[0] == ("paused", True)  # paused once, not on every poll


def test_snapshot_reports_source_and_reason():
    guard, _, _ = _run([0.5, 0.93])
    snap = guard.snapshot()
    assert snap["state"] == "critical" and snap["source"] == "scripted"
    assert "(critical from 90%, scripted)" in snap["reason"]
    assert snap["transitions"] == {"ok->critical": 1}


def test_cgroup_limit_dominates_when_tighter():
    s = MemorySample(total_bytes=100, available_bytes=90,
                     cgroup=CgroupReading("v2", "/svc", 95, 0, 100, "memory.max"))
    guard = MemoryGuard(CFG, ScriptedSource([s]), None)
    assert guard.poll() == "critical"  # device is 10% used, but the cgroup is at 95%


@given(st.lists(st.floats(0.0, 1.0), min_size=1, max_size=40))
def test_state_always_consistent_with_thresholds(values):
    guard = MemoryGuard(CFG, ScriptedSource(values), RecordingActions())
    for v in values:
        state = guard.poll()
        if v >= CFG.critical_used_fraction:
            assert state == "critical"
        elif v >= CFG.high_used_fraction:
            assert state in ("high", "critical")
        elif v < CFG.high_used_fraction - CFG.hysteresis:
            assert state == "ok"
    assert sum(guard.transitions.values()) <= len(values)
    assert guard.actions.paused == (guard.state != "ok")


@pytest.mark.parametrize("section", [
    {"high_used_fraction": 0.95, "critical_used_fraction": 0.9},
    {"hysteresis": -0.1},
    {"poll_interval_s": 0},
    {"treshold": 0.5},
    {"preempt_on_critical": 1.5},
    {"enabled": "yes"},
    {"poll_interval_s": float("nan")},  # waits never: an idle busy-poll
    {"poll_interval_s": float("inf")},  # OverflowError killed the guard thread
    {"high_used_fraction": float("nan")},
    {"hysteresis": True},
])
def test_bad_config_is_a_config_error(section):
    with pytest.raises(ConfigError):
        GuardConfig.from_dict(section)


def test_direct_construction_requires_finite_numbers():
    with pytest.raises(ConfigError, match="finite"):
        GuardConfig(poll_interval_s=float("nan"))


class _FlakySource:
    """Fails while `failing` is set (jtop's service stopping, a bad /proc read)."""

    name = "flaky"

    def __init__(self) -> None:
        self.inner = ScriptedSource([0.95])
        self.failing = False

    def read(self):
        if self.failing:
            raise OSError("jtop service stopped")
        return self.inner.read()


def _wait_until(condition, timeout_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the guard thread did not get there"
        time.sleep(0.01)


def test_failing_telemetry_is_reported_and_logged_once(caplog):
    import threading

    from edge_runtime.guard.guard import run_guard_thread

    source = _FlakySource()
    guard = MemoryGuard(GuardConfig(poll_interval_s=0.01, high_used_fraction=0.80,
                                    critical_used_fraction=0.90, preempt_on_critical=0,
                                    shrink_chunks_on_critical=0), source, None)
    assert guard.poll() == "critical"
    source.failing = True
    stop = threading.Event()
    with caplog.at_level("WARNING", logger="edge_runtime.guard.guard"):
        thread = run_guard_thread(guard, stop)
        _wait_until(lambda: guard.action_counts["poll_errors"] >= 5)
        snap = guard.snapshot()
        source.failing = False
        _wait_until(lambda: guard.snapshot()["telemetry_error"] is None)
        stop.set()
        thread.join(5)
    # the state is kept (no read, no transition) and /health, /metrics can say why
    assert snap["state"] == "critical" and snap["telemetry_error"] == "OSError: jtop service stopped"
    assert guard.snapshot()["telemetry_error"] is None and guard.action_counts["poll_errors"] >= 5
    failures = [r for r in caplog.records if "no memory telemetry (flaky failed)" in r.message]
    assert len(failures) == 1 and failures[0].exc_info  # once, with the traceback; not every poll
    assert any("works again after" in r.message for r in caplog.records)
