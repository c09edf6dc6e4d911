"""kernels/huge_pages.py: the arena's alignment, bounds and its fallback where madvise is missing;
and the bandwidth probe that uses it (bench/bandwidth.py)."""

import pytest
import torch

from edge_runtime.kernels import huge_pages
from edge_runtime.kernels.huge_pages import HUGE_PAGE, HugePageArena


def test_takes_are_aligned_disjoint_and_bounded():
    arena = HugePageArena(3 * 1000 + 5)
    a, b, c = arena.take(1000), arena.take(1000), arena.take(1000)
    assert a.data_ptr() % HUGE_PAGE == 0  # the first tensor starts on a 2 MiB boundary
    assert b.data_ptr() == a.data_ptr() + 4000 and c.data_ptr() == b.data_ptr() + 4000
    a.fill_(1), b.fill_(2), c.fill_(3)
    assert float(a.sum()) == 1000 and float(b.sum()) == 2000 and float(c.sum()) == 3000
    assert arena.remaining == 5
    with pytest.raises(AssertionError, match="arena exhausted"):
        arena.take(6)


def test_works_without_madvise(monkeypatch):
    monkeypatch.setattr(huge_pages.sys, "platform", "darwin")
    arena = HugePageArena(64, dtype=torch.float16)
    assert not arena.huge_pages
    t = arena.take(64).fill_(0.5)
    assert t.dtype == torch.float16 and float(t.float().sum()) == 32.0


def test_bandwidth_probe_measures_on_its_own_buffers():
    from edge_runtime.bench.bandwidth import BandwidthProbe

    probe = BandwidthProbe(size_mib=4)
    first, second = probe.measure(repeats=2), probe.measure(repeats=2)
    assert first.read_gbps > 0 and second.copy_gbps > 0 and first.tensor_bytes == 4 << 20
    assert torch.equal(probe.dst, probe.src)
