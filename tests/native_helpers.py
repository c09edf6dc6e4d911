"""The C kernels built for the baseline x86-64 ISA (SSE2: no AVX2, no FMA, no F16C), next to the
machine's own -march=native build: kernels/csrc takes other code paths without AVX2 (the plain
int8 -> float conversion, 16 vector registers) and those are the paths other CPUs (Arm on a
Jetson) compile, so tests run both and compare."""

import ctypes
import functools
import platform
import shutil
import tempfile
from pathlib import Path

import pytest

from edge_runtime.kernels import cpu_native


@functools.lru_cache(maxsize=1)
def _portable_path() -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    folder = Path(tempfile.mkdtemp(prefix="edge-runtime-portable-"))
    flags = [f for f in cpu_native.CFLAGS if f != "-march=native"] + ["-march=x86-64"]
    target = folder / "edge_runtime_cpu_portable.so"
    cpu_native.compile_to(compiler, target, flags)
    return target


def portable_library() -> ctypes.CDLL:
    """The baseline-ISA build (skips off x86-64, where -march=native is the only build, or without
    a compiler)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the baseline-ISA comparison is for x86-64 builds")
    if cpu_native.library() is None:
        pytest.skip("kernels/csrc not built (no C compiler)")
    return cpu_native.declare(ctypes.CDLL(str(_portable_path())))
