"""The Jetson install path without a Jetson: tools/check_jetson_torch.py on stand-in torch
packages (NVIDIA's CUDA build, too old for transformers 5.x, a CPU-only wheel, none), and
tools/install-service.sh on a pretend Jetson (EDGE_RUNTIME_TEGRA_RELEASE), every system change
stubbed: it stops before any change when the torch will not do, and installs the `gpu` extra
when it will."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from service_helpers import fake_install_root

ROOT = Path(__file__).resolve().parent.parent
CHECK = ROOT / "tools/check_jetson_torch.py"


def _fake_torch(folder: Path, version: str | None, cuda: str | None) -> Path:
    """A package named torch with this version and CUDA (version None: importing it fails)."""
    pkg = folder / "torch"
    pkg.mkdir(parents=True)
    if version is None:
        (pkg / "__init__.py").write_text("raise ImportError('no torch here')\n")
    else:
        (pkg / "__init__.py").write_text(
            f"import types\n__version__ = {version!r}\nversion = types.SimpleNamespace(cuda={cuda!r})\n")
    return folder


def _check(tmp_path: Path, version, cuda) -> subprocess.CompletedProcess:
    path = _fake_torch(tmp_path / "site", version, cuda)
    return subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(path)})


@pytest.mark.parametrize("version,cuda,message", [
    ("2.5.0a0+872d972e41.nv24.08", "12.6", "older than transformers 5.x accepts (>= 2.6)"),
    ("2.13.0+cpu", None, "is a CPU-only build"),
    (None, None, "no torch for"),
])
def test_a_torch_that_will_not_do_says_what_to_install(tmp_path, version, cuda, message):
    proc = _check(tmp_path, version, cuda)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "JetPack 6" in proc.stderr and "then run this again" in proc.stderr


def test_nvidias_torch_new_enough_passes(tmp_path):
    proc = _check(tmp_path, "2.8.0", "12.6")
    assert proc.returncode == 0 and proc.stdout.strip() == "torch 2.8.0 (CUDA 12.6)", proc.stderr


def _pretend_jetson(tmp_path: Path, torch_site: Path) -> tuple[dict, Path]:
    """The installer's system commands stubbed (service_helpers.fake_install_root), the torch check
    run over `torch_site`, and a Jetson release file."""
    env, log = fake_install_root(
        tmp_path, f'case "$1" in *check_jetson_torch.py) export PYTHONPATH="{torch_site}" ;; esac\n')
    release = tmp_path / "nv_tegra_release"
    release.write_text("# R36 (release), REVISION: 4.3\n")
    return {**env, "EDGE_RUNTIME_TEGRA_RELEASE": str(release)}, log


def _install(tmp_path: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([str(ROOT / "tools/install-service.sh"), "--config", "cpu-dev",
                           "--prefix", str(tmp_path / "opt"), "--venv", str(tmp_path / "venv"),
                           "--user", "edge-test", "--memory-high", "3G", "--memory-max", "4G"],
                          capture_output=True, text=True, timeout=120, env=env)  # limits given: no plan


root_only = pytest.mark.skipif(os.geteuid() != 0, reason="the install path runs only as root "
                               "(every system change is stubbed)")


@root_only
def test_a_jetson_without_nvidias_torch_is_refused_before_any_change(tmp_path):
    env, log = _pretend_jetson(tmp_path, _fake_torch(tmp_path / "site", "2.13.0+cpu", None))
    proc = _install(tmp_path, env)
    assert proc.returncode == 2 and "CPU-only build" in proc.stderr, proc.stderr
    assert not log.exists(), log.read_text()  # no user, no pip, no unit


@root_only
def test_a_jetson_gets_the_gpu_extra_and_keeps_its_torch(tmp_path):
    env, log = _pretend_jetson(tmp_path, _fake_torch(tmp_path / "site", "2.8.0", "12.6"))
    proc = _install(tmp_path, env)
    assert proc.returncode == 0, proc.stderr
    pips = [c for c in log.read_text().splitlines() if c.startswith("pip ")]
    assert any(c.endswith("/src[service,jetson,gpu]") for c in pips), pips
    assert not any("torch" in c for c in pips), pips  # NVIDIA's torch stays
