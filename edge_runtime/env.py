"""Every environment switch edge-runtime reads, read here and nowhere else (docs/interfaces.md,
"Environment switches"). Ours share the prefix EDGE_RUNTIME_; TRITON_INTERPRET is Triton's own
(read here only to check that the CUDA back end can run on a CPU) and CC the usual C compiler.

Each accessor reads the environment when called (tests set variables with monkeypatch), and
a value it cannot use raises ConfigError naming the variable and what it may be.
"""

from __future__ import annotations

import os

from edge_runtime.errors import ConfigError

PREFIX = "EDGE_RUNTIME_"
KV_DEBUG = PREFIX + "KV_DEBUG"  # 1: log every page-state change of the KV bookkeeping
CPU_NATIVE = PREFIX + "CPU_NATIVE"  # 0: do not build/use kernels/csrc (torch paths)
CPU_MARCH = PREFIX + "CPU_MARCH"  # -march for kernels/csrc (default native)
CPU_PHASE_TIMES = PREFIX + "CPU_PHASE_TIMES"  # 1: build the C decode step with phase timers
CPU_LINEAR = PREFIX + "CPU_LINEAR"  # auto | c-blocked | onednn | dense (fp32 linears on CPU)
CPU_FUSED = PREFIX + "CPU_FUSED"  # 0: no one-call C layer stack for decode steps
AWQ_BACKEND = PREFIX + "AWQ_BACKEND"  # auto (= blocked) | blocked | cpu-int4pack | awq-gemm | reference
MODELS = PREFIX + "MODELS"  # the models folder (default $XDG_DATA_HOME/edge-runtime/models)
TRITON_INTERPRET = "TRITON_INTERPRET"  # Triton's: 1 runs the kernels in its interpreter
SWITCHES = (KV_DEBUG, CPU_NATIVE, CPU_MARCH, CPU_PHASE_TIMES, CPU_LINEAR, CPU_FUSED, AWQ_BACKEND,
            MODELS, TRITON_INTERPRET)


def _choice(name: str, default: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(name, "") or default
    if value not in allowed:
        raise ConfigError(f"{name}={value!r} is not one of {', '.join(allowed)}")
    return value


def _off(name: str) -> bool:
    return os.environ.get(name, "1") == "0"


def _on(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0", "false", "no")


def kv_debug() -> bool:
    return _on(KV_DEBUG)


def cpu_native_enabled() -> bool:
    return not _off(CPU_NATIVE)


def cpu_march() -> str | None:
    """The -march target for kernels/csrc, None when not set (native)."""
    return os.environ.get(CPU_MARCH) or None


def cpu_phase_times() -> bool:
    return os.environ.get(CPU_PHASE_TIMES) == "1"


def cpu_linear() -> str:
    return _choice(CPU_LINEAR, "auto", ("auto", "c-blocked", "onednn", "dense"))


def cpu_fused_decoder() -> bool:
    return not _off(CPU_FUSED)


def awq_backend(allowed: tuple[str, ...]) -> str:
    return _choice(AWQ_BACKEND, "auto", allowed)


def triton_interpret() -> bool:
    return os.environ.get(TRITON_INTERPRET, "0") == "1"


def c_compiler() -> str:
    return os.environ.get("CC", "cc")


def models_dir() -> str | None:
    """The models folder `--model NAME` and `edge-runtime models` look in, None when not set
    (paths.models_dir gives the default)."""
    return os.environ.get(MODELS) or None
