"""Build kernels/csrc/*.c once per machine with the system C compiler and call them via ctypes.

Why C: decode attention over int8 KV in torch ops materializes float copies of every gathered
key and value and runs M=3 matmuls; per (row, kv head) one pass over int8 keys and one over int8
values reads each byte once (docs/cpu-backend.md, "CPU decode attention"). And torch's fp32 GEMV (MKL,
oneDNN) reads weights at 40-55% of the machine's bandwidth, linear_f32.c's blocked layout at
~100% (docs/cpu-backend.md, "CPU linears"): decode speed is weight-read speed.

- The shared library is cached under $XDG_CACHE_HOME (default ~/.cache)/edge-runtime/native/, keyed
  by the sources, the compiler's version and the machine (it is built with -march=native), and
  written atomically (compile to a temporary name, then rename).
- No compiler, a failed build, or EDGE_RUNTIME_CPU_NATIVE=0: `library()` returns None and says
  why once on stderr; callers use the torch path (kernels/flat_kv_cpu.py), which computes the same.
- ctypes releases the GIL during a call, so the service's event loop keeps running.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from edge_runtime import env
from edge_runtime.paths import cache_dir

SOURCES = [Path(__file__).with_name("csrc") / name
           for name in ("edge_runtime_cpu.h", "flat_kv.c", "linear_f32.c", "linear_int4.c",
                        "decoder_ops.h", "decoder.c", "argmax.c")]
ENV_SWITCH = env.CPU_NATIVE
# build for another target than this machine, e.g. `haswell` or `x86-64-v3` to measure here what
# an AVX2-only machine gets (docs/cpu-backend.md, "AVX2 builds"); default: native
ENV_MARCH = env.CPU_MARCH
# "1": build decoder.c with per-phase timers (`bench step --decoder-phases`; own cache entry)
ENV_PHASE_TIMES = env.CPU_PHASE_TIMES
# reassociation lets the reductions vectorize; not -ffast-math, whose crtfastmath would set
# flush-to-zero for the whole process (torch included)
# -fopenmp: linear_f32.c splits output blocks over threads (libgomp comes with gcc)
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-fassociative-math", "-fno-signed-zeros",
          "-fno-trapping-math", "-fno-math-errno", "-fPIC", "-shared"]


class FlatPart(ctypes.Structure):
    _fields_ = [("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("ks", ctypes.c_void_p),
                ("vs", ctypes.c_void_p), ("index", ctypes.c_void_p), ("lens", ctypes.c_void_p),
                ("width", ctypes.c_int64), ("layer_offset", ctypes.c_int64),
                ("kmean", ctypes.c_void_p)]


def _say(msg: str) -> None:
    print(f"edge-runtime: {msg}", file=sys.stderr)


def _cache_dir() -> Path:
    return cache_dir("native")


def compile_to(compiler: str, target: Path, cflags: list[str]) -> None:
    """Compile kernels/csrc into the shared library `target` with `cflags` (`build_flags()`; tests
    build a portable variant with others); raises RuntimeError with the compiler's first errors."""
    run = subprocess.run([compiler, *cflags, "-o", str(target),
                          *(str(s) for s in SOURCES if s.suffix == ".c"), "-lm"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(_first_errors(run.stderr))


def _first_errors(stderr: str) -> str:
    """The compiler's first error lines (the cause; later lines are often long lists), or its
    output's end when no line says error."""
    errors = dict.fromkeys(line.strip() for line in stderr.splitlines() if "error" in line.lower())
    return " | ".join(list(errors)[:3])[:500] if errors else stderr.strip()[-500:]


def build_flags() -> list[str]:
    """CFLAGS with -march from EDGE_RUNTIME_CPU_MARCH when it is set, and the decode step's
    per-phase timers when EDGE_RUNTIME_CPU_PHASE_TIMES=1."""
    march = env.cpu_march() or "native"
    flags = [f"-march={march}" if f == "-march=native" else f for f in CFLAGS]
    if env.cpu_phase_times():
        flags.append("-DEDGE_RUNTIME_PHASE_TIMES")
    return flags


def _build(compiler: str) -> Path:
    flags = build_flags()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256(b"".join(src.read_bytes() for src in SOURCES) + version.encode()
                         + " ".join(flags).encode() + platform.machine().encode()
                         + platform.node().encode()).hexdigest()[:16]
    target = _cache_dir() / key / "edge_runtime_cpu.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    _say(f"compiling the CPU kernels (kernels/csrc) for this machine, once, into {target.parent}...")
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        compile_to(compiler, Path(tmp), flags)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if not target.exists() and not any(target.parent.iterdir()):
            target.parent.rmdir()  # a failed build leaves no empty cache entry
    return target


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of the kernels' entry points on a loaded library."""
    lib.write_kv_int8.restype = None
    lib.write_kv_int8.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                  ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                  ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_void_p]
    lib.write_kv_f16.restype = None
    lib.write_kv_f16.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                 ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                 ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
    fn = lib.decode_attention_int8
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.POINTER(FlatPart), ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_float,
                   ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    fn = lib.decode_attention_span
    fn.restype = None
    fn.argtypes = [ctypes.POINTER(FlatPart), ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                   ctypes.c_int, ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)]
    fn = lib.linear_blocked_f32
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                   ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                   ctypes.c_int]
    if hasattr(lib, "decoder_phase_times"):  # built with EDGE_RUNTIME_CPU_PHASE_TIMES=1
        lib.decoder_phase_times.restype = ctypes.c_int
        lib.decoder_phase_times.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.argmax_rows.restype = None
    lib.argmax_rows.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                ctypes.c_void_p]
    return lib


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (torch fallback) with the reason printed once."""
    if not env.cpu_native_enabled():
        return None
    compiler = shutil.which(env.c_compiler()) or shutil.which("gcc")
    if compiler is None:
        _say("no C compiler (install gcc); CPU decode attention and fp32 linears use the slower "
             "torch paths")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (OSError, RuntimeError) as exc:
        march = env.cpu_march()
        cause = f" with {ENV_MARCH}={march} (unset it, or name a target the compiler knows)" if march else ""
        _say(f"building kernels/csrc failed{cause} ({exc}); CPU decode attention and fp32 linears "
             "use the torch paths")
        return None
    return declare(lib)
