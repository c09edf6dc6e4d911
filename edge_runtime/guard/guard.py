"""Memory guard: telemetry -> ok/high/critical with hysteresis -> actions on the engine.

Invariants:
- State rises as soon as `used_fraction` reaches a threshold (ok -> critical may skip high) and
  falls only once it is `hysteresis` below that threshold, so a value hovering at a threshold does
  not flap.
- Every transition is logged and counted in `transitions[(from, to)]`; every action's effect
  (pages evicted, sequences preempted, chunks released/regrown) is summed in `action_counts`.
- high: admission paused, and each poll returns up to `shrink_chunks_on_high` whole pool chunks to
  the OS (their cached pages evicted, live pages moved below them: kv/pool_resize.py); on the
  CPU back end the pool is resident, so evicting pages alone would lower nothing.
  critical: additionally, each poll evicts every cached page, preempts the newest sequences and
  returns up to `shrink_chunks_on_critical` chunks. Back to ok: admission resumes, and each poll
  regrows the pool toward the budget one chunk at a time, only while the reading with that chunk
  resident again stays below the high band (high - hysteresis): regrowing everything at once put
  the memory straight back and the guard flapped between ok and high.
- The pause is bounded: once admission has been paused for `max_admission_pause_s`, each poll
  ends every request still waiting for its first admission with an error (the service answers
  503 with Retry-After; it also refuses new ones at once while `refusing_admission`). Requests
  already admitted are never refused: they run to the end (preempted ones resume).
- `poll()` is synchronous and cheap; the service calls it from a timer, tests call it directly.
- A failed telemetry read changes no state and runs no action (the last state holds); it is
  recorded in `telemetry_error` (shown by `snapshot()` until a read succeeds) and re-raised. The
  poll thread logs the first failure of a run of failures with its traceback, and the recovery,
  not every poll.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from typing import Protocol

from edge_runtime.guard_config import GuardConfig
from edge_runtime.guard.telemetry import MemorySample

log = logging.getLogger(__name__)
STATES = ("ok", "high", "critical")


class GuardActions(Protocol):
    """What the guard needs from the engine (docs/interfaces.md, "Memory guard hooks")."""

    def set_admission_paused(self, paused: bool) -> None: ...
    def evict_cached(self, max_pages: int | None) -> int: ...
    def preempt_newest(self, k: int) -> int: ...
    def shrink_pool(self, n_chunks: int) -> int: ...
    def grow_pool(self, n_chunks: int) -> int: ...
    def next_regrow_bytes(self) -> int: ...
    def refuse_waiting(self, message: str) -> int: ...


class MemoryGuard:
    def __init__(self, config: GuardConfig, source, actions: GuardActions | None) -> None:
        self.config = config
        self.source = source
        self.actions = actions
        self.state = "ok"
        self.reason = ""
        self.last_sample: MemorySample | None = None
        self.transitions: Counter[tuple[str, str]] = Counter()
        self.action_counts: Counter[str] = Counter()
        self.polls = 0
        self.telemetry_error: str | None = None
        self.failed_polls = 0  # consecutive failed reads
        self.paused_since: float | None = None  # time.monotonic() when admission was paused
        self._lock = threading.Lock()

    @property
    def source_name(self) -> str:
        return getattr(self.source, "name", type(self.source).__name__)

    def classify(self, used: float) -> str:
        """The state for `used`, given the current state (hysteresis on the way down)."""
        c = self.config
        if used >= c.critical_used_fraction:
            return "critical"
        if self.state == "critical" and used >= c.critical_used_fraction - c.hysteresis:
            return "critical"
        if used >= c.high_used_fraction:
            return "high"
        if self.state != "ok" and used >= c.high_used_fraction - c.hysteresis:
            return "high"
        return "ok"

    def poll(self) -> str:
        """Read the source once, update the state, run this state's actions; returns the state."""
        with self._lock:
            try:
                sample = self.source.read()
            except Exception as exc:
                self.failed_polls += 1
                self.telemetry_error = f"{type(exc).__name__}: {exc}"
                raise
            if self.failed_polls:
                log.warning("memory guard: telemetry (%s) works again after %d failed reads",
                            self.source_name, self.failed_polls)
            self.telemetry_error, self.failed_polls = None, 0
            self.last_sample = sample
            self.polls += 1
            used = sample.used_fraction
            new = self.classify(used)
            if new != self.state:
                self._transition(new, used)
            self._act()
            return self.state

    def _transition(self, new: str, used: float) -> None:
        old = self.state
        self.transitions[(old, new)] += 1
        self.state = new
        c = self.config
        threshold = c.high_used_fraction if new == "high" else c.critical_used_fraction
        self.reason = "" if new == "ok" else (
            f"memory {used:.1%} used ({new} from {threshold:.0%}, {self.source_name})")
        log.warning("memory guard: %s -> %s at %.1f%% used (%s)", old, new, used * 100,
                    self.source_name)
        if self.actions is None:
            return
        if new == "ok":
            self.actions.set_admission_paused(False)
            self.paused_since = None
            self.action_counts["resumed"] += 1
        elif old == "ok":
            self.actions.set_admission_paused(True)
            self.paused_since = time.monotonic()
            self.action_counts["paused"] += 1

    def paused_for(self) -> float:
        """Seconds admission has been paused (0 while admitting)."""
        since = self.paused_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def refusing_admission(self) -> bool:
        """True once the pause has lasted max_admission_pause_s: waiting requests get 503."""
        return self.paused_since is not None and \
            self.paused_for() >= self.config.max_admission_pause_s

    def _act(self) -> None:
        """Actions repeated on every poll while under pressure (pressure may keep rising)."""
        if self.actions is None:
            return
        if self.state == "ok":
            self._regrow()
            return
        c = self.config
        shrink = c.shrink_chunks_on_critical if self.state == "critical" else c.shrink_chunks_on_high
        if self.state == "critical":
            self.action_counts["pages_evicted"] += self.actions.evict_cached(None)
        if shrink:
            self.action_counts["chunks_released"] += self.actions.shrink_pool(shrink)
        if self.state == "critical" and c.preempt_on_critical:
            self.action_counts["preempted"] += self.actions.preempt_newest(c.preempt_on_critical)
        if self.refusing_admission:
            self.action_counts["requests_refused"] += self.actions.refuse_waiting(
                self.refusal_message())

    def _regrow(self) -> None:
        """Regrow chunks while each keeps the projected reading below the high band."""
        band = self.config.high_used_fraction - self.config.hysteresis
        while (chunk := self.actions.next_regrow_bytes()) and self._projected(chunk) < band:
            if not self.actions.grow_pool(1):
                return
            self.action_counts["chunks_regrown"] += 1
            self.last_sample = self.source.read()  # the next chunk is judged on a fresh reading

    def _projected(self, extra_bytes: int) -> float:
        """The used fraction if `extra_bytes` more became resident (machine and cgroup)."""
        s = self.last_sample
        fractions = [s.machine_fraction + extra_bytes / s.total_bytes]
        if s.cgroup is not None and s.cgroup.limit_bytes:
            fractions.append(s.cgroup_fraction + extra_bytes / s.cgroup.limit_bytes)
        return max(fractions)

    def refusal_message(self) -> str:
        return (f"the memory guard has paused admission for {self.paused_for():.0f} s "
                f"({self.reason or 'memory pressure'}); not started, retry later")

    def snapshot(self) -> dict:
        """JSON-able state for /health, /metrics and /v1/stats; `inputs` holds every number the
        used fraction is made of (machine and cgroup), so an operator sees why the guard acts."""
        s = self.last_sample
        inputs = s.inputs() if s else {}
        return {
            "state": self.state,
            "reason": self.reason,
            "source": self.source_name,
            "telemetry_error": self.telemetry_error,  # set while reads fail: the state is stale
            "polls": self.polls,
            **{k: inputs.get(k) for k in ("used_fraction", "available_bytes", "total_bytes",
                                          "gpu_shared_bytes", "swap_used_bytes")},
            "inputs": inputs,
            "cgroup_limit": s.limit_label() if s else "",
            "admission_paused_s": self.paused_for(),
            "transitions": {f"{a}->{b}": n for (a, b), n in sorted(self.transitions.items())},
            "actions": dict(self.action_counts),
        }


def run_guard_thread(guard: MemoryGuard, stop: threading.Event) -> threading.Thread:
    """Poll `guard` every poll_interval_s in a daemon thread until `stop` is set."""

    def loop() -> None:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                guard.poll()
            except Exception:  # a failing read must be visible, and must not kill the service
                guard.action_counts["poll_errors"] += 1
                if guard.failed_polls == 0:  # the read worked: an action raised
                    log.exception("memory guard poll failed in state %r", guard.state)
                elif guard.failed_polls == 1:  # once per run of failed reads, not every poll
                    log.exception("memory guard: no memory telemetry (%s failed); the guard "
                                  "cannot see memory pressure and keeps state %r until a read "
                                  "succeeds", guard.source_name, guard.state)
            stop.wait(max(guard.config.poll_interval_s - (time.monotonic() - t0), 0.0))

    thread = threading.Thread(target=loop, name="memory-guard", daemon=True)
    thread.start()
    return thread
