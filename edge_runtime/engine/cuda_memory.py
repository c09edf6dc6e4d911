"""What a CUDA process holds besides weights and the KV pool, and how much memory is free, for the
budget (edge_runtime/plan.py) at start-up.

- `runtime_overhead(device)`: the CUDA context and the allocator/cuBLAS workspace, measured by
  creating them (one small fp16 matmul) and reading memory before and after. On a unified-memory
  device (a Jetson: `is_integrated`) CPU and GPU share RAM, so the cost is the fall of the
  kernel's `MemAvailable`; on a discrete GPU everything not free on the device after start-up
  (`cudaMemGetInfo`; other processes' memory included, which the pool cannot have either).
- `free_bytes(device)`: `MemAvailable` on unified memory, where `cudaMemGetInfo` reports only
  what the GPU allocator sees and misses memory the kernel can reclaim (page cache, swap; see
  ../shared/research notes on the ollama and vLLM Jetson issues); `cudaMemGetInfo`'s free bytes
  on a discrete GPU. 0 and None respectively on the CPU.
"""

from __future__ import annotations

from pathlib import Path

import torch

MEMINFO = Path("/proc/meminfo")


def mem_available(meminfo: Path = MEMINFO) -> int:
    """MemAvailable (else MemFree) of /proc/meminfo, in bytes."""
    fields = {}
    for line in meminfo.read_text().splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            fields[name] = int(parts[0]) * 1024  # kB
    value = fields.get("MemAvailable", fields.get("MemFree"))
    if value is None:
        raise RuntimeError(f"{meminfo} has neither MemAvailable nor MemFree")
    return value


def unified_memory(device) -> bool:
    return torch.cuda.get_device_properties(torch.device(device)).is_integrated


def runtime_overhead(device, meminfo: Path = MEMINFO) -> int:
    """Bytes the CUDA context and allocator workspace take on `device` (0 on the CPU); creates
    them, so call it once at start-up before the weights load."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    before = mem_available(meminfo)  # before any CUDA call: the context does not exist yet
    start_cuda(device)
    if unified_memory(device):
        return max(0, before - mem_available(meminfo))
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def start_cuda(device: torch.device) -> None:
    """Create the context, an allocator block and the cuBLAS workspace on `device`."""
    x = torch.ones(64, 64, dtype=torch.float16, device=device)
    (x @ x).sum().item()


def free_bytes(device, meminfo: Path = MEMINFO) -> int | None:
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if unified_memory(device):
        return mem_available(meminfo)
    return torch.cuda.mem_get_info(device)[0]
