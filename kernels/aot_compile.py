"""Compile every Triton kernel variant the engine can launch (kernels/launch_variants.py) ahead of
time for a GPU this machine does not have, and check each fits the target's shared memory.

    python -P -m edge_runtime.kernels.aot_compile --arch 87 --arch 90 [--jobs 2] [--json FILE]

(do not set TRITON_INTERPRET=1). Triton's own ptxas (shipped in its wheel) assembles the cubins.
Prints a table (kernel, variants, largest shared memory and registers per arch) and exits 1 when a
variant fails to compile or needs more shared memory than a block may have.

MAX_SHARED_PER_BLOCK: the opt-in maximum dynamic shared memory per block, the SM's shared memory
less the 1 KiB the driver reserves per block from sm_80 on: sm_87 (Orin) 164 KiB - 1 KiB = 166912
bytes, sm_90 228 KiB - 1 KiB = 232448 bytes (NVIDIA CCCL, libcudacxx cuda/__device/arch_traits.h:
max_shared_memory_per_block_optin; the CUDA C++ Programming Guide's compute capability table).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor

MAX_SHARED_PER_BLOCK = {87: 166912, 90: 232448}


def compile_variant(launch, arch: int) -> dict:
    """One variant compiled for sm_<arch> -> its shared memory, registers, or the error."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name = launch.kernel.rsplit(".", 1)
    fn = getattr(importlib.import_module(module), name)
    names = [p.name for p in fn.params]
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in launch.divisible}
    src = ASTSource(fn=fn, signature=dict(launch.signature), constexprs=dict(launch.constexprs),
                    attrs=attrs)
    row = {"kernel": name, "qualified": launch.kernel, "arch": arch, "constexprs": dict(launch.constexprs),
           "num_warps": launch.num_warps, "num_stages": launch.num_stages}
    try:
        kernel = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                options={"num_warps": launch.num_warps,
                                         "num_stages": launch.num_stages})
    except Exception as exc:  # reported per variant: one failure must not hide the others
        return {**row, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
    shared = int(kernel.metadata.shared)
    return {**row, "shared": shared, "registers": int(getattr(kernel, "n_regs", 0) or 0),
            "fits": shared <= MAX_SHARED_PER_BLOCK[arch]}


def _compile_one(job):
    return compile_variant(*job)


def compile_all(arches: list[int], jobs: int) -> list[dict]:
    from edge_runtime.kernels.launch_variants import engine_variants  # start-up time: imports torch

    work = [(launch, arch) for arch in arches for launch in engine_variants()]
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(_compile_one, work, chunksize=4))


def table(rows: list[dict]) -> str:
    lines = ["| kernel | arch | variants | failed | max shared (B) | limit (B) |",
             "|---|---|---|---|---|---|"]
    for kernel, arch in dict.fromkeys((r["kernel"], r["arch"]) for r in rows):
        mine = [r for r in rows if r["kernel"] == kernel and r["arch"] == arch]
        ok = [r for r in mine if "error" not in r]
        lines.append(f"| {kernel} | sm_{arch} | {len(mine)} | {len(mine) - len(ok)} | "
                     f"{max((r['shared'] for r in ok), default=0)} | {MAX_SHARED_PER_BLOCK[arch]} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arch", type=int, action="append", choices=sorted(MAX_SHARED_PER_BLOCK))
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--json", help="write every variant's result here")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        p.error("unset TRITON_INTERPRET: the interpreter has no compiler")
    rows = compile_all(args.arch or [87, 90], max(1, args.jobs))
    print(table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1, default=str)
    bad = [r for r in rows if "error" in r or not r["fits"]]
    for r in bad:
        print(f"FAILED: {r}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
