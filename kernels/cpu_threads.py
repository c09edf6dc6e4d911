"""How many threads the CPU back end's team runs, re-chosen from the cores other programs leave free.

Why: a step is one OpenMP region whose phases end in barriers (kernels/csrc/decoder.c), and every
torch op is a region of its own. When another program takes one of the cores the team runs on, every
barrier waits for the thread that shares its core with that program: the step runs at the speed of
the slowest time slice, and the other threads wait (spinning: burning the core the descheduled
thread needs). On a 2-vCPU VM with busy cores two spinning threads decoded ~1 token/s where one
thread decoded 10-16 (tools/cpu_wait_probe.py, docs/cpu-backend.md "The CPU thread team under co-located
load"). So the team is sized to the cores actually free:

    threads = clamp(round(allowed - taken_by_others), 1, cap)

- allowed: the CPUs this process may run on (sched_getaffinity), cap: at most that many, or what a
  caller sets (the voice loop leaves the ASR threads their cores; `--threads N` pins N);
- taken_by_others: CPU-seconds per second spent on the allowed CPUs by everything but this
  process, from /proc/stat and /proc/self/stat over the last interval (niced work is not counted:
  it yields its core to ours; time stolen by the hypervisor is);
- re-measured at most every `recheck_s` (1 s) between engine steps (`before_step`, called by the
  CPU back end's forward), so the team shrinks when a program starts and grows back when it ends.
Results do not depend on the thread count (each output is computed by the same code whichever
thread runs it; tests/test_kernel_cpu_*.py check it), so changing it between steps changes speed
only. Where /proc is missing (not Linux) the count stays at the cap.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass

RECHECK_S = 1.0


@dataclass(frozen=True)
class CpuSample:
    """Cumulative clock ticks since boot: busy (not idle, iowait or nice) and total over the
    allowed CPUs, and this process's own (user + system) ticks."""

    busy: int
    total: int
    own: int


def parse_proc_stat(text: str, cpus: set[int]) -> tuple[int, int]:
    """(busy ticks, total ticks) summed over the `cpuN` lines of /proc/stat whose N is in cpus.
    Columns: user nice system idle iowait irq softirq steal [guest guest_nice] (guest time is
    already inside user and nice, so it is not added again)."""
    busy = total = 0
    for line in text.splitlines():
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
            continue
        v = [int(x) for x in rest.split()[:8]] + [0] * 8
        user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
        total += user + nice + system + idle + iowait + irq + softirq + steal
        busy += user + system + irq + softirq + steal
    return busy, total


def parse_own_ticks(stat_text: str) -> int:
    """utime + stime of /proc/self/stat (fields 14 and 15, counted after the `(comm)` that may
    hold spaces)."""
    fields = stat_text.rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cores_taken_by_others(prev: CpuSample, now: CpuSample, allowed: int) -> float:
    """Cores' worth of the allowed CPUs that other processes kept busy between two samples.
    The own ticks are this process's on any CPU, so the result is floored at 0."""
    total = now.total - prev.total
    if total <= 0:
        return 0.0
    others = (now.busy - prev.busy) - (now.own - prev.own)
    return max(0.0, min(float(allowed), allowed * others / total))


def choose_threads(allowed: int, taken: float, cap: int | None = None) -> int:
    """The team size for `allowed` CPUs of which others keep `taken` cores busy: the free cores
    rounded to the nearest whole one (a core more than half free is worth a thread), at least 1,
    at most `cap` (default: allowed)."""
    assert allowed >= 1 and taken >= 0, (allowed, taken)
    limit = min(allowed, cap) if cap else allowed
    return max(1, min(limit, int(allowed - taken + 0.5)))


def allowed_cpus() -> set[int]:
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def read_sample(cpus: set[int]) -> CpuSample | None:
    """The current sample, or None where /proc cannot be read."""
    try:
        with open("/proc/stat") as f:
            busy, total = parse_proc_stat(f.read(), cpus)
        with open("/proc/self/stat") as f:
            own = parse_own_ticks(f.read())
    except (OSError, ValueError, IndexError):
        return None
    return CpuSample(busy, total, own)


class ThreadGovernor:
    """Keeps torch's (and so the C kernels') thread count at `choose_threads` of the last
    interval. `pinned` (a fixed count from `--threads`) turns the adaptation off."""

    def __init__(self, cap: int | None = None, pinned: int | None = None,
                 recheck_s: float = RECHECK_S, clock=time.monotonic, sampler=read_sample) -> None:
        self.cpus = allowed_cpus()
        self.cap, self.pinned, self.recheck_s = cap, pinned, recheck_s
        self._clock, self._sampler = clock, sampler
        self._last_t = clock()
        self._last = sampler(self.cpus)
        self.threads = pinned or choose_threads(len(self.cpus), 0.0, cap)

    def update(self) -> int:
        """Re-choose the count if `recheck_s` passed since the last sample; returns it."""
        if self.pinned:
            return self.pinned
        now_t = self._clock()
        if now_t - self._last_t < self.recheck_s:
            return self.threads
        sample = self._sampler(self.cpus)
        if sample is not None and self._last is not None:
            taken = cores_taken_by_others(self._last, sample, len(self.cpus))
            self.threads = choose_threads(len(self.cpus), taken, self.cap)
        self._last, self._last_t = sample, now_t
        return self.threads


_lock = threading.Lock()
_governor: ThreadGovernor | None = None


def configure(cap: int | None = None, pinned: int | None = None) -> ThreadGovernor:
    """Set the process's policy: `pinned` threads always, or adaptive up to `cap` (None: every
    allowed CPU), and apply it to torch in the calling thread. Commands call it once at start
    (`--threads N`, voice's cpu.engine_threads); code that fixes a thread count calls this, not
    torch.set_num_threads, which the next step would undo."""
    global _governor
    if pinned is not None and pinned < 1:
        raise ValueError(f"threads must be at least 1, got {pinned}")
    with _lock:
        _governor = ThreadGovernor(cap=cap, pinned=pinned)
    _apply(_governor.threads)
    return _governor


@contextlib.contextmanager
def policy_kept():
    """Whatever a block configures, the policy before it comes back after it (tests that run a
    command's `run` in-process, which configures the process as the command would)."""
    global _governor
    before = governor()
    try:
        yield
    finally:
        with _lock:
            _governor = before
        _apply(before.threads)


@contextlib.contextmanager
def pinned_threads(threads: int):
    """Pin the team to `threads` for a block, then restore the policy before it (tests, probes)."""
    with policy_kept():
        configure(pinned=threads)
        yield


def governor() -> ThreadGovernor:
    global _governor
    with _lock:
        if _governor is None:
            _governor = ThreadGovernor()
        return _governor


def before_step() -> int:
    """Called by the CPU back end before each model call, in the thread that runs it (OpenMP's
    thread count is per calling thread): applies the current choice; returns it."""
    threads = governor().update()
    _apply(threads)
    return threads


def _apply(threads: int) -> None:
    import torch

    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
