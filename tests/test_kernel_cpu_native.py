"""kernels/cpu_native.py: building for another target (EDGE_RUNTIME_CPU_MARCH) and what a failed
build says and leaves behind."""

import platform
import shutil

import pytest

from edge_runtime.kernels import cpu_native


@pytest.fixture
def fresh_library(tmp_path, monkeypatch):
    """library() built from scratch into a cache under tmp_path; the process's own afterwards."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cpu_native.library.cache_clear()
    yield tmp_path / "edge-runtime" / "native"
    cpu_native.library.cache_clear()


def test_an_unknown_march_falls_back_and_says_which_setting_to_fix(fresh_library, monkeypatch, capsys):
    monkeypatch.setenv(cpu_native.ENV_MARCH, "no-such-cpu")
    assert cpu_native.library() is None
    err = capsys.readouterr().err
    assert "EDGE_RUNTIME_CPU_MARCH=no-such-cpu" in err and "no-such-cpu" in err.split("(", 2)[-1]
    assert "torch paths" in err
    assert not any(fresh_library.iterdir()), "a failed build left a cache entry"


def test_another_march_is_its_own_cache_entry(fresh_library, monkeypatch):
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the baseline target named here is x86-64's")
    assert cpu_native.library() is not None
    cpu_native.library.cache_clear()
    monkeypatch.setenv(cpu_native.ENV_MARCH, "x86-64")
    assert "-march=x86-64" in cpu_native.build_flags() and "-march=native" not in cpu_native.build_flags()
    assert cpu_native.library() is not None
    assert len(list(fresh_library.iterdir())) == 2  # the native build and the x86-64 one
