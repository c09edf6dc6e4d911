"""kernels/argmax_cpu.py (kernels/csrc/argmax.c) against torch.argmax: lengths around the 64-wide
blocks, ties (the first index wins), all -inf rows, strided rows, NaN rows (torch's answer), and
the baseline-ISA build."""


import pytest
import torch

from edge_runtime.kernels import cpu_native
from edge_runtime.kernels.argmax_cpu import argmax_rows
from native_helpers import portable_library

LENGTHS = [1, 7, 63, 64, 65, 200, 49152, 49157]


def _needs_c():
    if cpu_native.library() is None:
        pytest.skip("kernels/csrc not built (no C compiler)")


def _rows(n, gen):
    x = torch.randn(6, n, generator=gen)
    x[1] = torch.randint(-3, 3, (n,), generator=gen).float()  # many ties
    x[2] = float("-inf")
    x[3, -1] = 100.0  # the maximum in the tail after the last whole block
    x[4, 0] = 100.0
    x[5] = torch.randn(n, generator=gen).round(decimals=1)  # ties inside and across blocks
    return x


@pytest.mark.parametrize("n", LENGTHS)
def test_argmax_rows_equals_torch(n):
    _needs_c()
    x = _rows(n, torch.Generator().manual_seed(n))
    assert argmax_rows(x) == x.argmax(dim=-1).tolist()


def test_strided_rows_and_nan_rows():
    _needs_c()
    gen = torch.Generator().manual_seed(1)
    wide = torch.randn(4, 300, generator=gen)
    x = wide[:, :250]  # row stride 300
    x[2, 17] = float("nan")
    x[3, 249] = float("nan")  # in the tail
    assert argmax_rows(x) == x.argmax(dim=-1).tolist()
    assert argmax_rows(x)[2:] == [17, 249]


def test_other_dtypes_go_through_torch():
    x = torch.randn(3, 100, generator=torch.Generator().manual_seed(2))
    assert argmax_rows(x.double()) == x.argmax(dim=-1).tolist()
    assert argmax_rows(x.t().contiguous().t()) == x.argmax(dim=-1).tolist()  # column-major


@pytest.mark.parametrize("n", [63, 64, 49157])
def test_baseline_isa_build_matches(n):
    lib = portable_library()
    x = _rows(n, torch.Generator().manual_seed(3))
    out = torch.empty(x.shape[0], dtype=torch.int64)
    lib.argmax_rows(x.data_ptr(), x.shape[0], n, x.stride(0), out.data_ptr())
    assert out.tolist() == x.argmax(dim=-1).tolist()
