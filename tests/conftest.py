"""Test-session settings that must exist before any test module is imported.

Triton decides at decoration time (when edge_runtime.kernels is first imported) whether a kernel
is compiled or interpreted. Engine, service and other tests import edge_runtime.kernels through the
dispatcher long before tests/test_kernel_*.py run, so TRITON_INTERPRET=1 must be set here, not in
the kernel tests' helper: otherwise the kernels are decorated for a GPU this machine does not have
and every kernel test fails when the whole suite runs. An explicit TRITON_INTERPRET=0 (a CUDA
machine running the kernel tests for real) is respected.

Each test also gets the CPU thread policy back as it found it: a bench command's `run` called
in-process configures the process's thread team as the command would (kernels/cpu_threads.py),
which would otherwise carry over into later tests.

edge_runtime is imported here, first, so a run that put the checkout root on sys.path (`python -m
pytest` started in the checkout) stops at once with edge_runtime/import_path.py's message instead
of failing test by test where transformers imports Hugging Face's `kernels`.
"""

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

import edge_runtime  # noqa: E402,F401 - after TRITON_INTERPRET; refuses the checkout on sys.path


@pytest.fixture(autouse=True)
def _thread_policy_kept():
    from edge_runtime.kernels import cpu_threads

    with cpu_threads.policy_kept():
        yield


if os.environ["TRITON_INTERPRET"] == "1":
    from interpreter_device_calls import install as _install_interpreter_device_calls

    _install_interpreter_device_calls()
