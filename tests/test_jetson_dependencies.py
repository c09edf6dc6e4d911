"""The dependency set a Jetson installs resolves for JetPack 6 (Python 3.10, aarch64, glibc 2.35)
from binary wheels, at the versions of its lock (tools/lock/jetson-aarch64.txt): the runtime
dependencies and the extras bootstrap installs on a Jetson, asked of the package index with `pip
install --dry-run --python-version 3.10 --platform manylinux_2_*_aarch64 --only-binary :all:
--report` (tools/lock_jetson.py, which made the lock the same way).

torch is not the index's: on a Jetson it is NVIDIA's wheel in JetPack's site packages (never pinned
in pyproject.toml nor locked). It stands in here as a metadata-only wheel at the oldest version
tools/check_jetson_torch.py accepts, so the rest must resolve against that torch.

Needs the package index (CI has it); skips with the reason when it cannot be reached."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tool_helpers import load_tool

ROOT = Path(__file__).resolve().parent.parent
JETSON_LOCK = ROOT / "tools/lock/jetson-aarch64.txt"
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "Network is unreachable", "ConnectTimeout", "ReadTimeout", "Connection refused")


lock_jetson = load_tool("lock_jetson")


def test_the_pyproject_names_the_source_built_packages():
    names = {lock_jetson.canonical(r.name) for r in lock_jetson.requirements(lock_jetson.JETSON_EXTRAS)}
    assert lock_jetson.BUILT_FROM_SOURCE <= names  # drop a name here once its extra drops it
    assert {"transformers", "triton", "aiohttp", "jetson-stats"} <= names


def test_the_jetson_lock_pins_every_requirement_and_no_torch():
    pins = lock_jetson.read_lock(JETSON_LOCK)
    cuda_wheels = [n for n in pins if n.startswith(("nvidia-cu", "nvidia-nccl", "nvidia-nv"))]
    assert "torch" not in pins and not cuda_wheels, cuda_wheels  # what a PyPI torch would pull
    wanted = {lock_jetson.canonical(r.name) for r in lock_jetson.requirements(("",) + lock_jetson.JETSON_EXTRAS)}
    assert wanted - {"torch"} <= set(pins), sorted(wanted - {"torch"} - set(pins))
    assert int(pins["numpy"].split(".")[0]) < 2  # JetPack 6's torch is built against numpy 1.x


@pytest.mark.network
def test_jetson_lock_resolves_for_python_310_aarch64_and_is_complete(tmp_path):
    """With the lock as constraints the whole set resolves from wheels, and everything pip would
    install is pinned by the lock: a Jetson gets exactly the locked versions."""
    cmd = lock_jetson.dry_run_command(tmp_path, lock_jetson.jetson_requirements(), JETSON_LOCK)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    unreachable = [line for line in proc.stderr.splitlines() if any(e in line for e in NETWORK_ERRORS)]
    if proc.returncode != 0 and unreachable:
        pytest.skip(f"the package index is unreachable: {unreachable[0].strip()[:300]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = lock_jetson.resolved_versions(tmp_path / "report.json")
    assert resolved.pop("torch") == lock_jetson.STUB_TORCH  # nothing pulled another torch
    pins = lock_jetson.read_lock(JETSON_LOCK)
    unpinned = {n: v for n, v in resolved.items() if pins.get(n) != v}
    assert not unpinned, f"resolved but not at a locked version: {unpinned}"
    assert int(resolved["transformers"].split(".")[0]) >= 5
    for name in ("triton", "aiohttp", "jetson-stats", "faster-whisper", "gguf", "accelerate"):
        assert name in resolved, sorted(resolved)
