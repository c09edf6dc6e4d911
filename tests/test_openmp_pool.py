"""kernels/openmp_pool.py: releasing a thread's OpenMP pool ends its worker threads and changes no
result; a later parallel op in that thread builds a new pool."""

import os
import threading
import time

import pytest
import torch

from edge_runtime.kernels.openmp_pool import loaded_runtime, release_thread_pool


def _num_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _parallel_op(x: torch.Tensor) -> torch.Tensor:
    return torch.rms_norm(x, (x.shape[-1],))  # large enough for torch to split over threads


def _wait_for(pred, timeout_s: float = 5.0) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


@pytest.fixture
def two_torch_threads():
    """Other tests (and silero's import) leave torch on one thread: no workers to release."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_release_ends_the_workers_and_keeps_results(two_torch_threads):
    x = torch.randn(512, 4096, generator=torch.Generator().manual_seed(0))
    assert loaded_runtime() is not None, "torch's CPU build loads an OpenMP 5.0 runtime here"
    seen = {}

    def worker():
        assert torch.get_num_threads() == 2  # torch applies the count to every new thread
        seen["before"] = _parallel_op(x)
        seen["with_pool"] = _num_threads()
        seen["released"] = release_thread_pool()
        seen["ended"] = _wait_for(lambda: _num_threads() <= seen["with_pool"] - 1)
        seen["after"] = _parallel_op(x)  # a new pool
        seen["released_again"] = release_thread_pool()

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen["released"] and seen["released_again"]
    assert seen["ended"], "the released pool's worker threads did not exit"
    assert torch.equal(seen["before"], seen["after"])


def test_release_without_a_pool_is_harmless():
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("rc", release_thread_pool()))
    t.start()
    t.join()
    assert out["rc"] is (loaded_runtime() is not None)  # nothing to free still succeeds
    assert torch.equal(_parallel_op(torch.ones(4, 8)), torch.ones(4, 8))
