"""kernels/csrc on the Jetson's CPU (Arm Cortex-A78AE), from this x86 machine: every .c file of
kernels/csrc cross-compiled for aarch64 with the product's flags and -Wall -Wextra -Werror, and the
kernel tests' cases (tests/csrc_harness, a C harness of test_kernel_flat_kv_cpu.py,
test_kernel_cpu_linear.py, test_kernel_cpu_int4.py, test_kernel_argmax_cpu.py and
test_kernel_cpu_decoder.py) run under
qemu-user: the harness's own checks pass there, and every result equals the x86 build's (bit for
bit where the Python tests ask it of torch, within their tolerances elsewhere); the Python tests
check the x86 build against the torch references.

Needs gcc-aarch64-linux-gnu and qemu-user-static (Debian; tools/bootstrap.sh installs them). Without
them the tests skip, except under CI=true, where a skip would hide a missing install step."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from edge_runtime.kernels import cpu_native

ROOT = Path(__file__).resolve().parent.parent
CSRC, HARNESS = ROOT / "kernels/csrc", ROOT / "tests/csrc_harness"
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64-static", "/usr/aarch64-linux-gnu"
# Orin's cores; the baseline Armv8-A build takes no fp16/dotprod instructions
ARM_TARGETS = {"cortex-a78ae": ["-mcpu=cortex-a78ae"], "armv8-a": ["-march=armv8-a"]}
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
# the harness's own code: the same inputs on every machine (no contraction into FMAs)
HARNESS_FLAGS = ["-O2", "-ffp-contract=off", "-fopenmp", f"-I{CSRC}", *WARNINGS]
EXACT, F32_CLOSE, I8_WITHIN_ONE, F16_CLOSE = range(4)


def _kernel_flags(target: list[str]) -> list[str]:
    """cpu_native's flags for an object file of `target` (the library's own -O3, OpenMP and math
    flags), warnings as errors."""
    flags = [f for f in cpu_native.CFLAGS if f not in ("-march=native", "-shared")]
    return [*flags, *target, *WARNINGS]


def _compile(cc: str, source: Path, flags: list[str], obj: Path) -> None:
    run = subprocess.run([cc, *flags, "-c", str(source), "-o", str(obj)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0 and not run.stderr.strip(), \
        f"{cc} {' '.join(flags)} {source.name}:\n{run.stderr}"


def build(cc: str, target: list[str], folder: Path) -> Path:
    """Every kernels/csrc/*.c and the harness, compiled in parallel, linked into folder/harness;
    the kernels also linked as the shared library the runtime loads."""
    folder.mkdir(parents=True, exist_ok=True)
    jobs = [(src, _kernel_flags(target), folder / f"kernel_{src.stem}.o")
            for src in sorted(CSRC.glob("*.c"))]
    jobs += [(src, [*HARNESS_FLAGS, *target], folder / f"harness_{src.stem}.o")
             for src in sorted(HARNESS.glob("*.c"))]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        list(pool.map(lambda job: _compile(cc, *job), jobs))
    objects = [str(obj) for _, _, obj in jobs]
    kernels = [o for o in objects if Path(o).name.startswith("kernel_")]
    for out, extra, objs in ((folder / "harness", [], objects),
                             (folder / "edge_runtime_cpu.so", ["-shared"], kernels)):
        run = subprocess.run([cc, "-fopenmp", *extra, *objs, "-lm", "-o", str(out)],
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, f"linking {out.name}:\n{run.stderr}"
    return folder / "harness"


def run_harness(command: list[str], out: Path) -> dict[str, tuple]:
    """Run the harness; its self-checks must pass. -> {record name: (kind, tol, tol2, bytes)}."""
    run = subprocess.run([*command, str(out)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"{' '.join(command)}: exit {run.returncode}\n{run.stderr[-4000:]}"
    return read_records(out.read_bytes())


def read_records(data: bytes) -> dict[str, tuple]:
    records, at = {}, 0
    while at < len(data):
        name = data[at:at + 64].rstrip(b"\0").decode()
        kind, tol, tol2, size = struct.unpack_from("<iffq", data, at + 64)
        at += 84
        records[name] = (kind, tol, tol2, data[at:at + size])
        at += size
    return records


def mismatch(kind: int, tol: float, tol2: float, got: bytes, want: bytes) -> str | None:
    """Why `got` (aarch64) is not `want` (x86) for a record of `kind`, or None."""
    if kind == EXACT or len(got) != len(want):
        return None if got == want else "bytes differ"
    if kind == I8_WITHIN_ONE:
        diff = np.abs(np.frombuffer(got, np.int8).astype(int) - np.frombuffer(want, np.int8))
        flips = float((diff > 0).mean())
        return None if diff.max() <= 1 and flips < 1e-3 else f"int8 max diff {diff.max()}, {flips:.2%} differ"
    dtype = np.float32 if kind == F32_CLOSE else np.float16
    a, b = (np.frombuffer(x, dtype).astype(np.float64) for x in (got, want))
    if not np.array_equal(np.isfinite(a), np.isfinite(b)):
        return "non-finite values differ"
    a, b = a[np.isfinite(b)], b[np.isfinite(b)]
    scale = np.abs(b).max(initial=0.0)
    limit = tol * scale + tol2 * np.abs(b) if kind == F32_CLOSE else tol * np.abs(b) + tol2 * scale
    worst = float((np.abs(a - b) - limit).max(initial=-1.0))
    return None if worst <= 0 else f"max |diff| {np.abs(a - b).max():.3g} over the limit by {worst:.3g}"


def _cross_tools() -> tuple[str, str]:
    tools = [shutil.which(CROSS_CC), shutil.which(QEMU)]
    if None in tools or not Path(SYSROOT).is_dir():
        why = ("the aarch64 cross-compiler or qemu-user is missing (apt-get install "
               "gcc-aarch64-linux-gnu qemu-user-static; tools/bootstrap.sh does as root)")
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must run these tests")
        pytest.skip(why)
    return tools[0], tools[1]


@pytest.fixture(scope="module")
def x86_records(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    folder = tmp_path_factory.mktemp("csrc-native")
    return run_harness([str(build(cc, ["-march=native"], folder))], folder / "records.bin")


@pytest.fixture(scope="module", params=list(ARM_TARGETS))
def arm_build(request, tmp_path_factory):
    cc, qemu = _cross_tools()
    folder = tmp_path_factory.mktemp(f"csrc-{request.param}")
    harness = build(cc, ARM_TARGETS[request.param], folder)
    return request.param, folder, [qemu, "-L", SYSROOT, str(harness)]


def test_every_kernel_file_cross_builds_for_aarch64_without_warnings(arm_build):
    _, folder, _ = arm_build
    for binary in (folder / "harness", folder / "edge_runtime_cpu.so"):
        header = binary.read_bytes()[:20]
        assert header[:4] == b"\x7fELF" and struct.unpack_from("<H", header, 18)[0] == 183, \
            f"{binary.name} is not an aarch64 ELF file"  # EM_AARCH64
    built = {p.name[len("kernel_"):-2] for p in folder.glob("kernel_*.o")}
    assert built == {p.stem for p in CSRC.glob("*.c")}


def test_aarch64_results_equal_the_x86_build(arm_build, x86_records):
    target, folder, command = arm_build
    arm = run_harness(command, folder / "records.bin")
    assert arm.keys() == x86_records.keys() and len(arm) > 100, sorted(arm.keys() ^ x86_records.keys())
    bad = {name: why for name, rec in arm.items()
           if (why := mismatch(*rec, x86_records[name][3])) is not None}
    assert not bad, f"{target}: {len(bad)} of {len(arm)} records differ from x86: {bad}"


def test_comparison_catches_a_wrong_value():
    """The comparison is not vacuous: one flipped byte or a value past the tolerance fails it."""
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    assert mismatch(F32_CLOSE, 2e-5, 2e-4, x.tobytes(), x.tobytes()) is None
    y = x.copy()
    y[7] += 1e-3
    assert mismatch(F32_CLOSE, 2e-5, 2e-4, y.tobytes(), x.tobytes())
    q = np.arange(-100, 100, dtype=np.int8)
    assert mismatch(EXACT, 0, 0, (q + 1).tobytes(), q.tobytes())
    assert mismatch(I8_WITHIN_ONE, 0, 0, np.where(q == 5, 7, q).astype(np.int8).tobytes(), q.tobytes())
    h = x.astype(np.float16)
    assert mismatch(F16_CLOSE, 2e-3, 1e-4, (h * np.float16(1.01)).tobytes(), h.tobytes())
