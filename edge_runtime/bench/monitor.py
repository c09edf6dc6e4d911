"""Peaks over a run: a `Timeline` of (t, value) samples and a background `PeakSampler` thread.

The sampler calls a probe every `interval_s` (plus once at start and once at stop) and keeps the
timeline; used for process RSS and, where the backend cannot report at each step, for KV bytes.
Invariant: `peak` is the max of every recorded value (None when nothing was recorded).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable


class Timeline:
    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.samples: list[tuple[float, float]] = []  # (seconds since t0, value)
        self.peak: float | None = None
        self._lock = threading.Lock()

    def add(self, value: float | None, t: float | None = None) -> None:
        if value is None:
            return
        t = time.perf_counter() if t is None else t
        with self._lock:
            self.samples.append((t - self.t0, value))
            if self.peak is None or value > self.peak:
                self.peak = value

    def rebase(self, t0: float) -> None:
        """Express sample times relative to a new origin (e.g. the replay start)."""
        with self._lock:
            shift = self.t0 - t0
            self.samples = [(t + shift, v) for t, v in self.samples]
            self.t0 = t0

    def mean(self) -> float | None:
        with self._lock:
            return sum(v for _, v in self.samples) / len(self.samples) if self.samples else None


class PeakSampler:
    """Samples `probe()` in a daemon thread until `stop()`; use as a context manager."""

    def __init__(self, probe: Callable[[], float | None], interval_s: float = 0.05) -> None:
        assert interval_s > 0, interval_s
        self.probe = probe
        self.interval_s = interval_s
        self.timeline = Timeline()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-sampler", daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.timeline.add(self.probe())

    def start(self) -> "PeakSampler":
        self.timeline.add(self.probe())
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self.timeline.add(self.probe())

    def __enter__(self) -> "PeakSampler":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def peak(self) -> float | None:
        return self.timeline.peak


def process_rss_bytes(pid: int | None = None) -> int | None:
    """Resident set size of a process (this one by default); None if it cannot be read."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        return psutil.Process(pid or os.getpid()).memory_info().rss
    except psutil.NoSuchProcess:  # a server that exited: a missing sample, not a failure
        return None
