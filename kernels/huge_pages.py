"""One 2 MiB-aligned allocation for many weight tensors, advised to be backed by huge pages.

Why: decode streams every weight once per step. With 4 KiB pages the CPU's hardware prefetchers
stop at every page boundary and the TLB misses every 4 KiB; with transparent huge pages (2 MiB) the
same blocked GEMV read 30-40% faster here (docs/cpu-backend.md, "CPU linears"). Linux backs a region
with huge pages on first touch when it was `madvise(MADV_HUGEPAGE)`d before (THP mode "madvise",
the default of many distributions, or "always"); elsewhere, or if the call fails, the arena is
ordinary memory and everything works the same, only slower.

Invariant: tensors handed out by `take` never overlap and all lie inside the advised range.
"""
from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # Linux, all architectures


def _advise_huge(address: int, length: int) -> bool:
    if not sys.platform.startswith("linux") or length <= 0:
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), MADV_HUGEPAGE) == 0
    except (OSError, AttributeError):
        return False


class HugePageArena:
    """`numel` elements of `dtype`, handed out front to back by `take`."""

    def __init__(self, numel: int, dtype: torch.dtype = torch.float32) -> None:
        elsize = torch.empty(0, dtype=dtype).element_size()
        align = HUGE_PAGE // elsize
        self._buffer = torch.empty(numel + align, dtype=dtype)  # not touched yet: no page faulted in
        first = (-self._buffer.data_ptr() % HUGE_PAGE) // elsize
        self.huge_pages = _advise_huge(self._buffer.data_ptr() + first * elsize, numel * elsize)
        self._next, self._end = first, first + numel

    def take(self, numel: int) -> torch.Tensor:
        """A 1-D tensor of `numel` elements from the arena (uninitialized)."""
        assert self._next + numel <= self._end, f"arena exhausted: {numel} more than it holds"
        out = self._buffer[self._next:self._next + numel]
        self._next += numel
        return out

    @property
    def remaining(self) -> int:
        return self._end - self._next
