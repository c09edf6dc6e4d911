"""The Triton interpreter's device-function calls without re-patching triton.language each time.

Under TRITON_INTERPRET=1 a kernel launch patches triton.language's builtins to their interpreted
forms once for the whole grid (`GridExecutor.__call__` -> `_patch_lang`, restored at the end), but
every call of a `@triton.jit` helper from inside the kernel patches them again
(`InterpretedFunction.__call__`): an `inspect.getmembers` walk over the language modules, ~1 ms,
for each call of each program instance. Our kernels call their helpers inside loops over pages
and blocks, so in the engine tests that run the CUDA back end through the interpreter this
re-patching was more than a quarter of the run (cProfile of
test_engine_families.py::test_int8_kv_back_ends_agree[smollm3]: 54,112 patches, 67 of 235 s).

`install()` makes a device call skip the patch when a launch is active and every language module
the helper sees is one that launch already patched (the kernel's and its helpers' modules all
import `triton.language as tl`; a helper seeing another one, such as Triton's own `tl.zeros` seeing
`triton.language.core`, is patched as before, once per launch). Nothing else
changes: the same interpreted builtins run the same code, so a kernel's results are the same bits.
tests/test_interpreter_device_calls.py checks both halves.
"""

from __future__ import annotations

import functools
import inspect

_active: list[set[int]] = []  # the language modules each running launch has patched (ids)


def _languages(fn) -> frozenset[int]:
    """The ids of the triton.language modules a jit function's globals hold, found as _patch_lang
    finds them, at the call (the interpreter adds names to a module's globals as it rewrites)."""
    import triton.language as tl

    return frozenset(id(value) for value in fn.__globals__.values()
                     if inspect.ismodule(value) and value in (tl, tl.core))


def install() -> bool:
    """Patch the interpreter's launch and device-call paths; False where they are not the shape
    this was written against (then nothing is changed)."""
    try:
        from triton.runtime import interpreter
    except ImportError:
        return False
    grid_call = getattr(interpreter.GridExecutor, "__call__", None)
    device_call = getattr(interpreter.InterpretedFunction, "__call__", None)
    if grid_call is None or device_call is None or not hasattr(interpreter, "_patch_lang") \
            or getattr(device_call, "_edge_runtime_skips_repatch", False):
        return False

    @functools.wraps(grid_call)
    def launch(self, *args, **kwargs):
        _active.append(set(_languages(self.fn)))
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _active.pop()

    @functools.wraps(device_call)
    def call(self, *args, **kwargs):
        if not _active:
            return device_call(self, *args, **kwargs)
        languages = _languages(self.fn)
        if not languages <= _active[-1]:  # e.g. tl.zeros: triton/language/standard.py's `core`
            result = device_call(self, *args, **kwargs)
            _active[-1] |= languages  # patched now, until the launch restores the language
            return result
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # as the interpreter's own device call reports it
            raise interpreter.InterpreterError(repr(e)) from e

    call._edge_runtime_skips_repatch = True
    interpreter.GridExecutor.__call__ = launch
    interpreter.InterpretedFunction.__call__ = call
    return True
