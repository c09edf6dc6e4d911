"""The machine's memory bandwidth, measured with torch: the roofline for decode.

Decode at batch 1 reads every weight once per token, so its speed limit is how fast this machine can
*read* memory. Definitions (both reported, `read` is the roofline):

- read GB/s  = bytes of a large fp32 tensor / time of `tensor.sum()` (each byte read once, nothing
  written; the reduction's arithmetic is far below the memory time).
- copy GB/s  = (bytes read + bytes written) / time of `dst.copy_(src)`, the STREAM "copy" convention
  counting both directions.

Each is the best of `repeats` timed runs after one warm-up (best, not mean: the roofline is what the
hardware can do; noise only ever makes a run slower). The tensor must be much larger than the last
level cache (default 512 MiB) or the number measures cache, not DRAM. On a CPU the tensors live in
huge-page-backed memory (kernels/huge_pages.py), as the engine's packed weights do: with 4 KiB pages
the same sum reads slower (prefetchers stop at page boundaries), which would understate the limit.
`BandwidthProbe` keeps its tensors to measure again next to each benchmark point.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Bandwidth:
    read_gbps: float  # bytes read / s / 1e9 (roofline)
    copy_gbps: float  # (read + written) / s / 1e9
    tensor_bytes: int
    device: str
    threads: int

    def to_dict(self) -> dict:
        return asdict(self)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def _best_seconds(fn, device: str, repeats: int) -> float:
    fn()  # warm-up: page-faults the output, JIT-free but first touch is slow
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


class BandwidthProbe:
    """Source and destination tensors allocated (and faulted in) once, so the bandwidth can be
    measured again and again next to each measurement it is the roofline of: on a shared machine
    (a VM) the available bandwidth moves by tens of percent within minutes."""

    def __init__(self, size_mib: int = 512, device: str = "cpu") -> None:
        import torch

        assert size_mib > 0, size_mib
        numel = size_mib * 2**20 // 4
        self.device = device
        if device == "cpu":
            # start-up time: imports torch
            from edge_runtime.kernels.huge_pages import HugePageArena

            self._arena = HugePageArena(2 * numel)
            self.src = self._arena.take(numel).normal_()  # random, never zeros
            self.dst = self._arena.take(numel).zero_()
        else:
            self.src = torch.randn(numel, dtype=torch.float32, device=device)
            self.dst = torch.zeros_like(self.src)

    def measure(self, repeats: int = 5) -> Bandwidth:
        import torch

        assert repeats > 0, repeats
        src, dst, device = self.src, self.dst, self.device
        nbytes = src.numel() * src.element_size()
        t_read = _best_seconds(lambda: src.sum(), device, repeats)
        t_copy = _best_seconds(lambda: dst.copy_(src), device, repeats)
        assert torch.equal(dst, src), "copy benchmark produced a wrong result"
        return Bandwidth(
            read_gbps=nbytes / t_read / 1e9,
            copy_gbps=2 * nbytes / t_copy / 1e9,
            tensor_bytes=nbytes,
            device=device,
            threads=torch.get_num_threads(),
        )


def measure_bandwidth(size_mib: int = 512, repeats: int = 5, device: str = "cpu") -> Bandwidth:
    return BandwidthProbe(size_mib, device).measure(repeats)
