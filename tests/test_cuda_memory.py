"""engine/cuda_memory.py without a GPU: MemAvailable parsing, the unified-memory overhead as the fall
of MemAvailable across CUDA start-up, free memory from MemAvailable (not cudaMemGetInfo) on unified
memory, and the measured bytes deducted from the budget's pool."""

import pytest

from edge_runtime.engine import cuda_memory
from edge_runtime.plan import REFERENCE_MODELS, make_plan


def _meminfo(path, available_kb):
    path.write_text(f"MemTotal:       8000000 kB\nMemFree:         100000 kB\n"
                    f"MemAvailable:   {available_kb} kB\n")


def test_mem_available_reads_kilobytes(tmp_path):
    _meminfo(tmp_path / "meminfo", 123456)
    assert cuda_memory.mem_available(tmp_path / "meminfo") == 123456 * 1024
    (tmp_path / "bad").write_text("MemTotal: 1 kB\n")
    with pytest.raises(RuntimeError, match="neither MemAvailable nor MemFree"):
        cuda_memory.mem_available(tmp_path / "bad")


def test_unified_memory_overhead_is_the_fall_of_mem_available(tmp_path, monkeypatch):
    info = tmp_path / "meminfo"
    _meminfo(info, 4_000_000)
    monkeypatch.setattr(cuda_memory, "start_cuda", lambda device: _meminfo(info, 3_700_000))
    monkeypatch.setattr(cuda_memory, "unified_memory", lambda device: True)
    monkeypatch.setattr(cuda_memory.torch.cuda, "mem_get_info",
                        lambda device=None: pytest.fail("cudaMemGetInfo on unified memory"))
    assert cuda_memory.runtime_overhead("cuda", info) == 300_000 * 1024
    assert cuda_memory.free_bytes("cuda", info) == 3_700_000 * 1024
    assert cuda_memory.runtime_overhead("cpu", info) == 0 and cuda_memory.free_bytes("cpu") is None


def test_plan_deducts_the_measured_runtime_bytes():
    from edge_runtime.budget import load_budget

    budget, shape = load_budget("orin-nano-8gb"), REFERENCE_MODELS["smollm2-135m-shape"]
    without = make_plan(budget, shape, 10 * 2**20)
    with_runtime = make_plan(budget, shape, 10 * 2**20, runtime_bytes=600 * 2**20)
    assert with_runtime.runtime_bytes == 600 * 2**20
    assert without.pool_bytes - with_runtime.pool_bytes >= 600 * 2**20 - without.bytes_per_page
