"""The dependency set a Jetson installs resolves for JetPack 6 (Python 3.10, aarch64, glibc 2.35)
from binary wheels: the runtime dependencies and the extras a Jetson uses (service, voice, gpu,
jetson), asked of the package index with `pip install --dry-run --python-version 3.10 --platform
manylinux_2_*_aarch64 --only-binary :all: --report`.

torch is not the index's: on a Jetson it is NVIDIA's wheel in JetPack's site packages (never pinned
in pyproject.toml). It stands in here as a metadata-only wheel at the oldest version
tools/check_jetson_torch.py accepts, so the rest must resolve against that torch.

Needs the package index (CI has it); skips with the reason when it cannot be reached."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
JETSON_EXTRAS = ("service", "voice", "gpu", "jetson")
# no aarch64 wheel on the index: pip builds it from its sdist on the Jetson (cmake, a C compiler)
BUILT_FROM_SOURCE = {"pocketsphinx"}
GLIBC_MINORS = range(17, 36)  # manylinux_2_17 .. manylinux_2_35 (Ubuntu 22.04, JetPack 6)
NETWORK_ERRORS = ("NewConnectionError", "Max retries exceeded", "Temporary failure in name resolution",
                  "Network is unreachable", "ConnectTimeout", "ReadTimeout", "Connection refused")


def _torch_min() -> str:
    """tools/check_jetson_torch.py's TORCH_MIN as a version, e.g. '2.6.0'."""
    spec = importlib.util.spec_from_file_location("check_jetson_torch", ROOT / "tools/check_jetson_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return ".".join(map(str, module.TORCH_MIN)) + ".0"


STUB_TORCH = f"{_torch_min()}+jetpack"  # a local version the index cannot have


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The installed project's requirements (pyproject.toml, as bootstrap installed it) that
    apply with these extras, markers dropped."""
    chosen = []
    for text in importlib.metadata.requires("edge-runtime") or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
            req.marker = None
            chosen.append(req)
    return chosen


def jetson_requirements() -> list[str]:
    return [str(r) for r in _requirements(("",) + JETSON_EXTRAS)
            if r.name.lower() not in BUILT_FROM_SOURCE | {"torch"}]


def _torch_stand_in(folder: Path) -> None:
    """torch-<TORCH_MIN>+jetpack-py3-none-any.whl: metadata only (JetPack's torch brings its own
    dependencies)."""
    info = f"torch-{STUB_TORCH}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{STUB_TORCH}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {STUB_TORCH}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def test_the_pyproject_names_the_source_built_packages():
    names = {r.name.lower() for r in _requirements(JETSON_EXTRAS)}
    assert BUILT_FROM_SOURCE <= names  # drop a name here once its extra drops it
    assert {"transformers", "triton", "aiohttp", "jetson-stats"} <= names


@pytest.mark.network
def test_jetson_dependency_set_resolves_for_python_310_aarch64(tmp_path):
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    _torch_stand_in(stubs)
    platforms = [arg for m in GLIBC_MINORS for arg in ("--platform", f"manylinux_2_{m}_aarch64")]
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--python-version", "3.10", *platforms, "--only-binary", ":all:",
           "--target", str(tmp_path / "target"), "--report", str(tmp_path / "report.json"),
           "--find-links", str(stubs), "--timeout", "30", "--retries", "2",
           f"torch=={STUB_TORCH}", *jetson_requirements()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    unreachable = [line for line in proc.stderr.splitlines() if any(e in line for e in NETWORK_ERRORS)]
    if proc.returncode != 0 and unreachable:
        pytest.skip(f"the package index is unreachable: {unreachable[0].strip()[:300]}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    resolved = {i["metadata"]["name"].lower(): i for i in
                json.loads((tmp_path / "report.json").read_text())["install"]}
    assert resolved["torch"]["metadata"]["version"] == STUB_TORCH  # nothing pulled another torch
    assert int(resolved["transformers"]["metadata"]["version"].split(".")[0]) >= 5
    for name in ("triton", "aiohttp", "jetson-stats", "faster-whisper", "gguf", "accelerate"):
        assert name in resolved, sorted(resolved)
    wheels = [i["download_info"]["url"] for n, i in resolved.items() if n != "torch"]
    assert all(url.endswith(".whl") for url in wheels), [u for u in wheels if not u.endswith(".whl")]
