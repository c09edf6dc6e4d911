"""tests/interpreter_device_calls.py (installed by conftest.py under TRITON_INTERPRET=1): a kernel
calling a `@triton.jit` helper in a loop gives the same bits as the interpreter as Triton ships
it (and the torch reference to rounding), and the launch patches triton.language once instead of
once per helper call."""

import pytest
import torch

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402
from interpreter_device_calls import install  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

pytestmark = pytest.mark.skipif(not triton.knobs.runtime.interpret,
                                reason="the interpreter's device calls (TRITON_INTERPRET=1)")


@triton.jit
def _scaled(x, k):
    return x * k + tl.exp(x) / (k + 1)


@triton.jit
def _loop_kernel(x_ptr, out_ptr, n, STEPS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for step in range(STEPS):
        acc += _scaled(x, step + 1.0)
    tl.store(out_ptr + offs, acc, mask=mask)


def _reference(x: torch.Tensor, steps: int) -> torch.Tensor:  # to rounding (numpy's exp)
    acc = torch.zeros_like(x)
    for step in range(steps):
        k = torch.tensor(step + 1.0, dtype=torch.float32)
        acc += x * k + torch.exp(x) / (k + 1)
    return acc


def test_installed_once_by_the_suite():
    assert getattr(interpreter.InterpretedFunction.__call__, "_edge_runtime_skips_repatch", False)
    assert install() is False  # a second install changes nothing


def test_a_helper_in_a_loop_patches_once_per_launch_and_computes_the_same_bits(monkeypatch):
    patches = []
    original = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patches.append(fn) or original(fn))
    x = torch.randn(100, generator=torch.Generator().manual_seed(3))
    out = torch.empty_like(x)
    _loop_kernel[(4,)](x, out, 100, STEPS=6, BLOCK=32)
    # the launch's own, and one for tl.zeros (its module sees triton.language.core, which the
    # kernel's `tl` patch does not cover); none for the 4 programs x 6 calls of _scaled
    assert [fn.__name__ for fn in patches] == ["_loop_kernel", "zeros"]
    torch.testing.assert_close(out, _reference(x, 6))

    for cls in (interpreter.GridExecutor, interpreter.InterpretedFunction):  # as Triton ships
        monkeypatch.setattr(cls, "__call__", cls.__call__.__wrapped__)
    patches.clear()
    as_shipped = torch.empty_like(x)
    _loop_kernel[(4,)](x, as_shipped, 100, STEPS=6, BLOCK=32)
    assert len(patches) == 1 + 4 * (1 + 6)  # the launch, then per program tl.zeros and 6 calls
    assert torch.equal(out, as_shipped)

