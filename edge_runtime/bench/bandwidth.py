"""The machine's memory bandwidth, measured with torch: the roofline for decode.

Decode at batch 1 reads every weight once per token, so its speed limit is how fast this machine can
*read* memory. Definitions (both reported, `read` is the roofline):

- read GB/s  = bytes of a large fp32 tensor / time of `tensor.sum()` (each byte read once, nothing
  written; the reduction's arithmetic is far below the memory time).
- copy GB/s  = (bytes read + bytes written) / time of `dst.copy_(src)`, the STREAM "copy" convention
  counting both directions.

Each is the best of `repeats` timed runs after one warm-up (best, not mean: the roofline is what the
hardware can do; noise only ever makes a run slower). The tensor must be much larger than the last
level cache (default 512 MiB) or the number measures cache, not DRAM.
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


def measure_bandwidth(size_mib: int = 512, repeats: int = 5, device: str = "cpu") -> Bandwidth:
    import torch

    assert size_mib > 0 and repeats > 0, (size_mib, repeats)
    numel = size_mib * 2**20 // 4
    src = torch.randn(numel, dtype=torch.float32, device=device)  # random, never zeros
    dst = torch.empty_like(src)
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
