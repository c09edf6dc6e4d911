"""Release the calling thread's OpenMP worker threads before another thread takes over torch work.

Why: GNU OpenMP (libgomp; torch's CPU wheels and our C kernels share one copy in the process) keeps
a pool of worker threads for every thread that has started a parallel region, and counts them all.
Once they outnumber the CPUs it throttles: an idle worker spins 100 times instead of 300,000
before it sleeps (libgomp's documented GOMP_SPINCOUNT rule), so every parallel region pays a futex
wake-up. Loading the model in one thread (the main thread, the service's loader thread) and
stepping the engine in another crosses that line on any machine where torch uses every core (a
Jetson too). Measured on a 2-vCPU VM: a step with short prefills ~1.8x slower, a decode step ~1.2x
(`edge-runtime bench threads`, docs/cpu-backend.md "Threads and OpenMP").

`omp_pause_resource_all(omp_pause_soft)` (OpenMP 5.0) frees the calling thread's pool and drops it
from the count; a later parallel region in that thread builds a new pool, so releasing is always
safe, only wasted if the thread goes on with parallel work. Only a runtime already in the process
is touched (RTLD_NOLOAD): this never loads a second OpenMP.
"""

from __future__ import annotations

import ctypes
import os

OMP_PAUSE_SOFT = 1  # omp_pause_resource_t: omp_pause_soft = 1, omp_pause_hard = 2
RUNTIMES = ("libgomp.so.1", "libiomp5.so", "libomp.so")  # GNU, Intel, LLVM OpenMP


def loaded_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime already loaded in this process that can release a pool, or None."""
    mode = getattr(os, "RTLD_NOLOAD", 0)
    if not mode:  # not a glibc-style loader: never risk loading a runtime of our own
        return None
    for name in RUNTIMES:
        try:
            lib = ctypes.CDLL(name, mode=mode | os.RTLD_LAZY)
        except OSError:
            continue
        if hasattr(lib, "omp_pause_resource_all"):
            return lib
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP workers. True when released; False where no OpenMP 5.0
    runtime is loaded (nothing to free) or it refused (called inside a parallel region)."""
    lib = loaded_runtime()
    if lib is None:
        return False
    lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
    lib.omp_pause_resource_all.restype = ctypes.c_int
    return lib.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
