"""The code runs on Python 3.10 (JetPack 6's), while this machine and CI run 3.11: a 3.11-only
module or member (tomllib, asyncio.timeout, typing.Self, ...) would pass every other test here and
fail on the device. vermin reads the sources and reports what they need."""

import subprocess
from pathlib import Path

from edge_runtime.import_path import code_argv

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["edge_runtime", "kernels", "quant", "tools", "tests"]
VERMIN = code_argv("import sys; from vermin import main; sys.exit(main())")


def _vermin(*paths) -> subprocess.CompletedProcess:
    return subprocess.run([*VERMIN, "--no-tips", "-t=3.10-", "--violations", "--eval-annotations",
                           *map(str, paths)], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_sources_need_no_python_newer_than_3_10():
    run = _vermin(*SOURCES)
    assert run.returncode == 0, f"code needing Python > 3.10:\n{run.stdout}{run.stderr}"


def test_the_check_catches_a_3_11_api(tmp_path):
    (tmp_path / "uses_311.py").write_text("import tomllib\n")
    run = _vermin(tmp_path)
    assert run.returncode != 0 and "tomllib" in run.stdout
