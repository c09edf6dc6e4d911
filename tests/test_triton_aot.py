"""Every Triton kernel variant the engine can launch (kernels/launch_variants.py) compiles ahead of
time for sm_87 (Jetson Orin) and sm_90 on this GPU-less machine, within each target's shared
memory per block (kernels/aot_compile.py); and every kernel the launch wrappers launch is among the
recorded variants, so a new kernel or launch site without an entry fails here.

Compiling runs in a subprocess without TRITON_INTERPRET (this process's kernels are interpreted),
in parallel processes, with Triton's cache under the edge-runtime cache folder: ~176 variants take
a few minutes of CPU the first time, seconds after."""

from __future__ import annotations

import ast
import json
import os
import subprocess
from pathlib import Path

import pytest

from edge_runtime.import_path import module_argv
from edge_runtime.paths import cache_dir

ROOT = Path(__file__).resolve().parent.parent
ARCHES = (87, 90)
# launched by a wrapper the engine never calls: its W4A16 is awq_gemm_prepared
# (model/awq_linear.py); awq_gemm.py's kernels serve the GPU sweeps and cross-checks
NOT_LAUNCHED_BY_ENGINE = {"awq_gemm._awq_gemm_kernel", "awq_gemm._sum_splits_kernel",
                          "awq_gemm._awq_dequant_kernel",
                          # the engine reads attention by position (positional_attention.py); the
                          # SM-count split merge serves the GPU checks' kernels (tools/gpu_lab/)
                          "paged_attention._merge_splits_kernel"}

triton = pytest.importorskip("triton", reason="the gpu extra (triton) is not installed")


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> list[dict]:
    ptxas = Path(triton.__file__).parent / "backends/nvidia/bin/ptxas"
    if not ptxas.exists():
        pytest.skip(f"triton's wheel has no ptxas at {ptxas}")
    out = tmp_path_factory.mktemp("aot") / "variants.json"
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(cache_dir("triton-aot")),
           "TRITON_DEFAULT_FP_FUSION": "1"}
    cmd = module_argv("edge_runtime.kernels.aot_compile", "--jobs", str(os.cpu_count() or 1),
                      "--json", str(out), *[a for arch in ARCHES for a in ("--arch", str(arch))])
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, env=env)
    assert out.exists(), proc.stderr[-3000:]
    rows = json.loads(out.read_text())
    assert proc.returncode == 0 or any("error" in r or not r["fits"] for r in rows), proc.stderr[-3000:]
    return rows


def test_every_variant_compiles_for_orin_and_hopper_within_shared_memory(compiled):
    failed = [r for r in compiled if "error" in r]
    assert not failed, failed[:5]
    too_big = [r for r in compiled if not r["fits"]]
    assert not too_big, too_big[:5]
    per_arch = {arch: [r for r in compiled if r["arch"] == arch] for arch in ARCHES}
    assert len(per_arch[87]) == len(per_arch[90]) > 50, {a: len(r) for a, r in per_arch.items()}


def _launched_kernels() -> set[str]:
    """module-less 'file._kernel' of every @triton.jit function a kernels/*.py file launches
    (`name[grid](...)`)."""
    found = set()
    for path in sorted((ROOT / "kernels").glob("*.py")):
        tree = ast.parse(path.read_text())
        jitted = {f.name for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                  and any("jit" in ast.unparse(d) for d in f.decorator_list)}
        aliases = {a.asname or a.name: a.name for node in ast.walk(tree)
                   if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("kernels")
                   for a in node.names}  # `from edge_runtime.kernels import paged_attention as _pa`
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
                target = node.func.value
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
                module = path.stem
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                    module = aliases.get(target.value.id, module)
                if name in jitted or (module != path.stem and name):
                    found.add(f"{module}.{name}")
    return found


def test_every_kernel_a_wrapper_launches_has_recorded_variants(compiled):
    recorded = {r["qualified"].removeprefix("edge_runtime.kernels.") for r in compiled}
    launched = _launched_kernels()
    assert launched - recorded == NOT_LAUNCHED_BY_ENGINE, sorted(launched - recorded)
    assert recorded <= launched, sorted(recorded - launched)
