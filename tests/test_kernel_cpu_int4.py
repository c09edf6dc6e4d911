"""linear_int4.c through kernels/cpu_int4.py: against the plain-torch reference (quant/int4_format.py)
at several shapes, ragged ones included, every row count 1-12 and larger, every weight form (2- to
8-bit, codebook, one- and two-level parameters); bit for bit against the
fp32 kernel (linear_f32.c) over the dequantized weights; in the native, AVX2 and baseline-ISA
builds."""
from __future__ import annotations

import ctypes
import functools
import platform
import shutil
import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from edge_runtime.kernels import cpu_int4, cpu_native
from edge_runtime.kernels.cpu_int4 import QuantEmbedding, QuantLinear
from edge_runtime.quant.int4_format import BlockedQuantWeight, GroupedRows
from native_helpers import portable_library
from quant_helpers import random_rows

pytestmark = pytest.mark.skipif(cpu_native.library() is None, reason="kernels/csrc not built")


def quant_linear(rows: GroupedRows, bias: bool = False, seed: int = 0) -> QuantLinear:
    b = torch.randn(rows.shape[0], generator=torch.Generator().manual_seed(seed + 1)) if bias else None
    return QuantLinear(BlockedQuantWeight.from_rows(rows), b)


CASES = [  # (N, K, bits, group, param dtype, offsets, bias)
    (16, 64, 4, 32, torch.float16, True, False),
    (37, 96, 4, 32, torch.float16, True, True),  # ragged N: a partial last block
    (200, 256, 4, 64, torch.float32, True, False),  # AWQ / Q4_K parameters
    (72, 256, 4, 128, torch.float16, True, True),
    (51, 128, 8, 32, torch.float16, False, False),  # Q8_0
    (24, 64, 8, 16, torch.float32, True, True),
    (40, 256, 8, 16, torch.float32, False, False),
    (56, 128, 4, 32, torch.float16, True, True),  # two block pairs, the second one ragged
    (51, 128, -5, 32, torch.float16, False, False),  # Q5_0: signed 5-bit, no offset
    (37, 96, 5, 32, torch.float16, True, True),  # Q5_1
    (72, 256, 5, 32, torch.float32, True, False),
    (72, 512, 4, 32, torch.int8, True, False),  # Q4_K: two-level parameters
    (37, 512, 5, 32, torch.int8, True, True),  # Q5_K
    (40, 256, -6, 16, torch.int8, False, False),  # Q6_K: signed 6-bit, two-level, no offset
    (24, 256, 4, 16, torch.int8, True, False),  # 4-bit, group 16, two-level
    (56, 256, 6, 16, torch.float16, True, True),  # unsigned 6-bit, one-level
    (51, 128, "iq4", 32, torch.float16, False, False),  # IQ4_NL: codebook indices
    (40, 512, "iq4", 32, torch.int8, False, True),  # IQ4_XS: codebook, two-level
    (24, 256, 2, 16, torch.uint8, True, False),  # Q2_K: 2-bit, two-level 4-bit codes
    (37, 512, 2, 16, torch.uint8, True, True),
    (40, 256, -3, 16, torch.int8, False, False),  # Q3_K: signed 3-bit, two-level, no offset
    (37, 512, -3, 16, torch.int8, False, True),
    (40, 512, -3, 16, torch.int8, True, True),  # Q2_K q / k fused with a Q3_K v (as_signed3)
    (56, 64, 3, 16, torch.float16, True, True),  # unsigned 3-bit, one-level
    (51, 128, 2, 32, torch.float32, True, False),  # 2-bit, fp32
]


@pytest.mark.parametrize("n,k,bits,group,pdtype,offsets,bias", CASES)
def test_kernel_matches_reference_and_a_row_does_not_depend_on_its_neighbours(
        n, k, bits, group, pdtype, offsets, bias):
    """Against the dequantize-then-matmul reference (the kernel sums per group, scale and offset
    once per group: another order), and each row equal bit for bit to the same row computed
    alone, whatever the row count: 1-2 rows run four blocks a pass, 3-4 two, more one (and the
    ragged last blocks one), 40 rows go past a 12-row pass."""
    mod = quant_linear(random_rows(n, k, bits, group, pdtype, offsets, seed=n + k), bias, seed=n)
    x = torch.randn(40, k, generator=torch.Generator().manual_seed(k))
    alone = torch.cat([mod.c_kernel(x[i:i + 1]) for i in range(40)])
    ref = mod.reference_forward(x)
    torch.testing.assert_close(alone, ref, rtol=1e-5, atol=2e-6 * float(ref.abs().max()))
    for m in list(range(2, 13)) + [13, 25, 40]:
        got = mod.c_kernel(x[:m])
        assert torch.equal(got, alone[:m]), (m, (got - alone[:m]).abs().max(), (got != alone[:m]).sum())


@pytest.mark.parametrize("n,k,bits,group,pdtype,offsets,bias", CASES[:3] + CASES[4:5] + CASES[11:])
def test_prefill_tiles_and_forward_dispatch(n, k, bits, group, pdtype, offsets, bias, monkeypatch):
    mod = quant_linear(random_rows(n, k, bits, group, pdtype, offsets, seed=3), bias)
    nb = mod.data.shape[0]
    full = mod.weight.dequantize()
    tile = mod.dequantized_blocks(0, nb)  # [NB, K, 16]
    assert torch.equal(tile.transpose(1, 2).reshape(-1, k)[:n], full)
    monkeypatch.setattr(cpu_int4, "TILE_FLOATS", 2 * k * 16)  # several tiles, a short last one
    x = torch.randn(2, 35, k)  # 70 rows: the BLAS path
    ref = nn.functional.linear(x, full, mod.bias)  # BLAS's order: within rounding of the largest
    torch.testing.assert_close(mod(x), ref, rtol=1e-5, atol=1e-5 * max(1.0, float(ref.abs().max())))
    x = torch.randn(3, k)
    assert torch.equal(mod(x), mod.c_kernel(x))


def test_more_groups_per_row_than_the_kernels_take_is_refused():
    rows = random_rows(16, 16 * (cpu_int4.MAX_GROUPS + 1), group=16)
    with pytest.raises(ValueError, match="larger group size"):
        quant_linear(rows)


def test_threads_do_not_change_results():
    mod = quant_linear(random_rows(333, 192, seed=5))
    x = torch.randn(7, 192)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mod.c_kernel(x)
        torch.set_num_threads(2)
        assert torch.equal(mod.c_kernel(x), one)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("bits,offsets,pdtype", [(8, False, torch.float16), (-5, False, torch.float16),
                                                 (5, True, torch.float16), (4, True, torch.int8),
                                                 (-6, False, torch.int8), ("iq4", False, torch.int8),
                                                 (2, True, torch.uint8), (-3, False, torch.int8)])
def test_embedding_reads_the_heads_rows(bits, offsets, pdtype):
    head = quant_linear(random_rows(70, 256, bits=bits, param_dtype=pdtype, offsets=offsets, seed=9))
    ids = torch.tensor([[0, 15, 16], [69, 8, 7]])
    torch.testing.assert_close(QuantEmbedding(head)(ids), head.weight.dequantize()[ids], rtol=0, atol=0)


@functools.lru_cache(maxsize=1)
def _library_for(march: str) -> ctypes.CDLL:
    compiler = shutil.which("cc") or shutil.which("gcc")
    target = Path(tempfile.mkdtemp(prefix=f"edge-runtime-{march}-")) / f"edge_runtime_cpu_{march}.so"
    flags = [f for f in cpu_native.CFLAGS if f != "-march=native"] + [f"-march={march}"]
    cpu_native.compile_to(compiler, target, flags)
    return cpu_native.declare(ctypes.CDLL(str(target)))


def _has_avx512() -> bool:
    try:
        return " avx512f " in Path("/proc/cpuinfo").read_text().replace("\n", " ")
    except OSError:
        return False


@pytest.mark.parametrize("build", ["skylake-avx512", "haswell", "baseline"])
def test_other_builds_compute_the_same(build):
    """AVX-512 without VBMI (integers widened and converted, not looked up), the AVX2 path (two
    8-lane halves, F16C) and the plain-C one (no AVX2, no F16C: what other CPUs compile) against
    the native build (a group's input sum is vectorized as each target's compiler tuning chooses,
    so builds agree to rounding, not bit for bit)."""
    if platform.machine() != "x86_64":
        pytest.skip("x86-64 builds")
    if build == "skylake-avx512" and not _has_avx512():
        pytest.skip("this CPU runs no AVX-512 code")
    lib = portable_library() if build == "baseline" else _library_for(build)
    cpu_int4.declare(lib)
    for n, k, bits, group, pdtype, offsets, bias in CASES:
        mod = quant_linear(random_rows(n, k, bits, group, pdtype, offsets, seed=k), bias)
        x = torch.randn(13, k)
        native = mod.c_kernel(x)
        mod._lib = lib
        other = mod.c_kernel(x)
        # no FMA there: the same sums rounded twice per term
        torch.testing.assert_close(other, native, rtol=1e-5, atol=1e-6 * float(native.abs().max()))
        tile = mod.dequantized_blocks(0, mod.data.shape[0])
        assert torch.equal(tile.transpose(1, 2).reshape(-1, k)[:n], mod.weight.dequantize())


def test_place_in_arena_keeps_outputs_and_puts_every_tensor_in_one_aligned_allocation():
    mods = [quant_linear(random_rows(n, k, bits, 32, pdtype, seed=n), bias=True, seed=n)
            for n, k, bits, pdtype in ((40, 64, 4, torch.float16), (16, 128, 8, torch.float16),
                                       (72, 96, 4, torch.float16), (32, 256, "iq4", torch.int8))]
    xs = [torch.randn(3, m.in_features, generator=torch.Generator().manual_seed(i))
          for i, m in enumerate(mods)]
    before = [m.c_kernel(x) for m, x in zip(mods, xs)]
    tensors = [t for m in mods for t in m.weight.tensors()]
    want = sum(t.numel() * t.element_size() for t in tensors)
    assert cpu_int4.place_in_arena(mods) == want
    tensors = [t for m in mods for t in m.weight.tensors()]
    assert len({t.untyped_storage().data_ptr() for t in tensors}) == 1
    assert all(t.data_ptr() % cpu_int4.ARENA_ALIGN == 0 for t in tensors)
    ends = sorted((t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) for t in tensors)
    assert all(a[1] <= b[0] for a, b in zip(ends, ends[1:])), "tensors overlap"
    for m, x, b in zip(mods, xs, before):
        assert torch.equal(m.c_kernel(x), b)
    assert cpu_int4.place_in_arena([]) == 0
