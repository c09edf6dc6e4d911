"""Compile the decode-attention and W4A16 kernels for sm_90 on a machine WITHOUT a GPU and count the
SASS instructions of their main loop, per byte of K/V or per int4 weight a thread handles.

    python tools/gpu_lab/sass_probe.py            # (do not set TRITON_INTERPRET)

A proxy, not a timing: the kernels are memory-bound only if the chip can issue their instructions
faster than HBM delivers the bytes (an H200 issues ~132 SMs x 4 warps x 1.98 GHz warp-instructions
per second). Arguments are specialised as Triton's JIT does (pointers and ints divisible by 16 get
tt.divisibility=16, ints equal to 1 become constants). Uses ptxas/cuobjdump shipped with triton.
"""
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from edge_runtime.kernels import awq_gemm as awq
from edge_runtime.kernels import awq_prepared as awp
from edge_runtime.kernels import paged_attention as pa

TOOLS = Path(__file__).resolve().parents[1]  # tools/ (not the checkout root): the gpu_lab package
sys.path.insert(0, str(TOOLS))
from gpu_lab import paged_decode as pd  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
PTR = {"q_ptr": "*fp16", "k_ptr": "*i8", "v_ptr": "*i8", "ks_ptr": "*fp16", "vs_ptr": "*fp16", "out_ptr": "*fp32",
       "lse_ptr": "*fp32", "x_ptr": "*fp16", "qw_ptr": "*i32", "qz_ptr": "*i32", "sc_ptr": "*fp16",
       "y_ptr": "*fp16", "w_ptr": "*i32", "z_ptr": "*u8", "s_ptr": "*fp16", "part_ptr": "*fp32", "cnt_ptr": "*i32"}
ONES = {"s_ksh", "s_vsh"}  # stride 1 in the real pool layout (scales [N, P, Hkv])


def compile_cubin(fn, const, warps, stages) -> bytes:
    sig, attrs, consts = {}, {}, dict(const)
    for i, name in enumerate(fn.arg_names):
        if name in const:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = PTR.get(name, "*i32")
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name == "qk_scale":
            sig[name] = "fp32"
        elif name in ONES:
            sig[name], consts[name] = "constexpr", 1
        else:
            sig[name] = "i32"
            attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=attrs)
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
    return k.asm["cubin"]


def loop_stats(cubin: bytes) -> dict:
    """Registers, stack, and the opcode counts of the largest loop (a backward branch's body)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        res = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                             text=True, check=True).stdout
        sass = subprocess.run([str(BIN / "cuobjdump"), "--dump-sass", f.name], capture_output=True, text=True,
                              check=True).stdout
    ins = [(int(a, 16), t) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass)]
    best = []
    for addr, text in ins:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            best = max(best, body, key=len)
    ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0] for t in best)
    reg = re.search(r"REG:(\d+)", res)
    stack = re.search(r"STACK:(\d+)", res)
    return dict(regs=int(reg.group(1)), stack=int(stack.group(1)), loop=len(best), top=dict(ops.most_common(6)))


def cases():
    """(name, kernel, constexprs, warps, stages, work units per thread per loop iteration, unit)."""
    att, dec = pa.TUNE, pd.TUNE
    g1, g5, p1, p5 = awq.TUNE["gemv1"], awq.TUNE["gemv"], awp.TUNE["gemv1"], awp.TUNE["gemv"]
    thr = lambda w: 32 * w  # noqa: E731
    yield ("paged_attention decode (default)", pa._paged_attn_kernel,
           dict(GROUP=1, BLOCK_R=16, D=128, BLOCK_D=128, BLOCK_N=att["block_n"], QUANT=True, FP16_DOT=True,
                FMA=False, USE_QBLK=False), att["num_warps"], att["num_stages"],
           2 * att["block_n"] * 128 / thr(att["num_warps"]), "K/V byte")
    yield ("paged_decode (default)", pd._paged_decode_kernel,
           dict(H=32, GROUP=1, D=128, BLOCK_N=dec["block_n"], QUANT=True, MAGIC=True, TWO=True, IDOT=dec["idot"]),
           dec["num_warps"], dec["num_stages"], 2 * dec["block_n"] * 128 / thr(dec["num_warps"]), "K/V byte")
    for bn, w in ((64, 4), (128, 4), (64, 2)):
        yield (f"paged_decode idot block_n {bn}, {w} warps", pd._paged_decode_kernel,
               dict(H=32, GROUP=1, D=128, BLOCK_N=bn, QUANT=True, MAGIC=True, TWO=True, IDOT=True), w, 2,
               2 * bn * 128 / thr(w), "K/V byte")
    for m, t in ((1, g1), (5, g5)):
        bm = 1 if t["fma"] else 16
        yield (f"awq_gemm M={m} (default)", awq._awq_gemm_kernel,
               dict(BLOCK_M=bm, BLOCK_N=t["block_n"], BLOCK_K=t["block_k"], SPLIT_K=8,
                    UNPACK=awq.UNPACK_MODES[t["unpack"]], FMA=t["fma"]), t["num_warps"], t["num_stages"],
               t["block_n"] * t["block_k"] / thr(t["num_warps"]), "weight")
    for m, t in ((1, p1), (5, p5)):
        bm = 16 if t["dot"] else triton.next_power_of_2(m)
        yield (f"w4a16 prepared M={m} (default)", awp._prepared_kernel,
               dict(G=128, BLOCK_M=bm, BLOCK_N=t["block_n"], BLOCK_K=t["block_k"], SPLIT_K=8, DOT=t["dot"]),
               t["num_warps"], t["num_stages"], t["block_n"] * t["block_k"] / thr(t["num_warps"]), "weight")


def main():
    print("| kernel | regs | stack B | loop instrs/thread | units/thread | instrs per unit | top opcodes |")
    print("|---|---|---|---|---|---|---|")
    for name, fn, const, warps, stages, units, unit in cases():
        s = loop_stats(compile_cubin(fn, const, warps, stages))
        print(f"| {name} | {s['regs']} | {s['stack']} | {s['loop']} | {units:.0f} {unit}s | "
              f"{s['loop'] / units:.2f} | {s['top']} |", flush=True)


if __name__ == "__main__":
    main()
