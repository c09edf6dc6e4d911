"""The CPU team's thread policy (kernels/cpu_threads.py): /proc parsing, the choice from the cores
other processes take, and the governor's re-checks, on fake samples and a fake clock (no timing)."""

import pytest

from edge_runtime.kernels import cpu_threads
from edge_runtime.kernels.cpu_threads import (CpuSample, ThreadGovernor, choose_threads,
                                              cores_taken_by_others, parse_own_ticks,
                                              parse_proc_stat)

PROC_STAT = """cpu  900 50 300 5000 40 5 5 10 0 0
cpu0 400 50 100 2000 20 2 3 5 7 0
cpu1 500 0 200 3000 20 3 2 5 0 0
cpu2 1 1 1 1 1 1 1 1 0 0
intr 12345 0 0
ctxt 999
"""


def test_proc_stat_sums_the_allowed_cpus_and_leaves_out_idle_iowait_and_nice():
    busy, total = parse_proc_stat(PROC_STAT, {0, 1})
    # cpu0: user 400 + system 100 + irq 2 + softirq 3 + steal 5; cpu1: 500 + 200 + 3 + 2 + 5
    assert busy == 510 + 710
    assert total == (400 + 50 + 100 + 2000 + 20 + 2 + 3 + 5) + (500 + 200 + 3000 + 20 + 3 + 2 + 5)
    assert parse_proc_stat(PROC_STAT, {2}) == (5, 8)
    assert parse_proc_stat(PROC_STAT, {7}) == (0, 0)


def test_own_ticks_read_after_a_command_name_with_spaces_and_parentheses():
    fields = ["S"] + [str(i) for i in range(4, 14)] + ["123", "45"] + ["0"] * 30
    assert parse_own_ticks("4242 (a (b) c) " + " ".join(fields)) == 168


def _sample(busy, total, own):
    return CpuSample(busy=busy, total=total, own=own)


@pytest.mark.parametrize("busy,own,allowed,want", [
    (200, 100, 2, 1.0),   # 2 cores for 100 ticks each: others kept one of them busy
    (200, 200, 2, 0.0),   # all of it was ours
    (50, 100, 2, 0.0),    # ours partly on other CPUs: floored at 0
    (200, 0, 4, 2.0),     # 4 cores for 100 ticks each, 200 of them others'
])
def test_cores_taken_by_others(busy, own, allowed, want):
    prev = _sample(1000, 10_000, 300)
    now = _sample(1000 + busy, 10_000 + 100 * allowed, 300 + own)
    assert cores_taken_by_others(prev, now, allowed) == pytest.approx(want)


def test_no_ticks_between_samples_means_nothing_taken():
    s = _sample(5, 10, 1)
    assert cores_taken_by_others(s, s, 2) == 0.0


@pytest.mark.parametrize("allowed,taken,cap,want", [
    (2, 0.0, None, 2), (2, 0.4, None, 2), (2, 0.6, None, 1), (2, 1.0, None, 1),
    (2, 2.0, None, 1),                      # everything taken: still one thread
    (8, 2.9, None, 5), (8, 0.0, 3, 3),      # a cap (voice: cores left after ASR)
    (8, 6.0, 3, 2),
])
def test_choose_threads(allowed, taken, cap, want):
    assert choose_threads(allowed, taken, cap) == want


class FakeMachine:
    """Two CPUs; `others` cores busy with other programs, this process using `ours` cores."""

    def __init__(self):
        self.t, self.others, self.ours = 0.0, 0.0, 1.0
        self.busy = self.total = self.own = 0

    def clock(self):
        return self.t

    def advance(self, seconds):
        self.t += seconds
        ticks = int(100 * seconds)
        self.total += 2 * ticks
        self.busy += int(ticks * (self.others + self.ours))
        self.own += int(ticks * self.ours)

    def sampler(self, cpus):
        return CpuSample(self.busy, self.total, self.own)


def _governor(machine, monkeypatch, **kw):
    monkeypatch.setattr(cpu_threads, "allowed_cpus", lambda: {0, 1})
    return ThreadGovernor(clock=machine.clock, sampler=machine.sampler, **kw)


def test_governor_shrinks_under_a_busy_process_and_grows_back(monkeypatch):
    m = FakeMachine()
    gov = _governor(m, monkeypatch)
    assert gov.update() == 2
    m.others = 1.0
    m.advance(0.5)
    assert gov.update() == 2  # re-checked only once recheck_s has passed
    m.advance(0.6)
    assert gov.update() == 1
    m.others = 0.0
    m.ours = 1.0  # ours alone (one thread now) leaves the other core idle
    m.advance(1.5)
    assert gov.update() == 2


def test_pinned_threads_never_change(monkeypatch):
    m = FakeMachine()
    gov = _governor(m, monkeypatch, pinned=2)
    m.others = 2.0
    m.advance(5)
    assert gov.update() == 2


def test_cap_bounds_the_choice(monkeypatch):
    m = FakeMachine()
    gov = _governor(m, monkeypatch, cap=1)
    m.advance(2)
    assert gov.update() == 1


def test_unreadable_proc_keeps_the_cap(monkeypatch):
    m = FakeMachine()
    gov = _governor(m, monkeypatch)
    gov._sampler = lambda cpus: None
    m.others = 2.0
    m.advance(2)
    assert gov.update() == 2


def test_configure_rejects_zero_threads():
    with pytest.raises(ValueError, match="at least 1"):
        cpu_threads.configure(pinned=0)


def test_before_step_applies_the_choice_to_torch(monkeypatch):
    import torch

    before = torch.get_num_threads()
    try:
        cpu_threads.configure(pinned=1)
        assert cpu_threads.before_step() == 1 and torch.get_num_threads() == 1
    finally:
        cpu_threads.configure()
        torch.set_num_threads(before)


def test_thread_count_changing_between_steps_changes_no_logit(monkeypatch):
    """The policy may change the count between any two steps; the logits of every position stay
    the same bit for bit (C kernels and the BLAS prefill of the 60-token prompt alike)."""
    import itertools

    import torch

    from edge_runtime.engine import sampler as sampler_module
    from engine_helpers import engine_for, greedy, tiny, tiny_prompts

    prompts = tiny_prompts([9, 60, 37], seed=81)
    seen: dict[str, dict] = {}
    threads_seen: dict[str, set] = {}
    real = sampler_module.sample

    def sample(logits, rows):
        threads_seen.setdefault(name, set()).add(torch.get_num_threads())
        for i, row in enumerate(rows):
            seen[name][tuple(row.seen_ids)] = logits[i].clone()
        return real(logits, rows)

    monkeypatch.setattr(sampler_module, "sample", sample)  # HostSampler's
    try:
        for name, counts in (("one", [1]), ("two", [2]), ("alternating", [2, 1, 1, 2])):
            seen[name] = {}
            gov = cpu_threads.configure(pinned=1)
            sizes = itertools.cycle(counts)
            monkeypatch.setattr(gov, "update", lambda: next(sizes))
            eng = engine_for(tiny(), kv_dtype="int8", page_tokens=16, num_pages=64)
            eng.generate(prompts, greedy(8, ignore_eos=True))
    finally:
        cpu_threads.configure(pinned=1)  # as engine_helpers set it for the other tests
    assert threads_seen == {"one": {1}, "two": {2}, "alternating": {1, 2}}
    assert seen["one"].keys() == seen["two"].keys() == seen["alternating"].keys()
    for name in ("two", "alternating"):
        differ = [len(c) for c, row in seen[name].items() if not torch.equal(row, seen["one"][c])]
        assert not differ, f"{name}: logits differ at context lengths {differ}"


def test_a_command_configured_in_process_is_undone_by_policy_kept():
    import torch

    from edge_runtime.bench.engine_bench import set_threads

    before = cpu_threads.governor()
    with cpu_threads.policy_kept():
        set_threads(1)  # what `bench ... --threads 1` does to the process
        assert cpu_threads.governor().pinned == 1 and torch.get_num_threads() == 1
    assert cpu_threads.governor() is before and torch.get_num_threads() == before.threads
