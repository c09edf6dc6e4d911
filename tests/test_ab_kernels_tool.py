"""tools/ab_kernels.py: which run pairs of a `bench engine` JSON count as steady high- or low-mode,
the summary over them, and the checkout of kernels/csrc at a revision."""
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from edge_runtime.bench.engine_bench import decode_ratios

ROOT = Path(__file__).resolve().parents[1]


def _tool():
    spec = importlib.util.spec_from_file_location("ab_kernels_tool", ROOT / "tools" / "ab_kernels.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(batch, samples, gbps):
    bw = [({"read_gbps": a}, {"read_gbps": b}) for a, b in gbps]
    return {"prompt_tokens": 512, "batch": batch, "decode_samples": samples, "bandwidth": bw,
            "decode_tok_s": {"mean": sum(samples) / len(samples)}}


def _result():
    # pair 1: high and steady; 2: low and steady; 3: the mode switched (unsteady); 4: 45 GB/s
    one = _row(1, [80.0, 55.0, 70.0, 60.0], [(60, 61), (35, 35), (35, 62), (45, 45)])
    five = _row(5, [296.0, 250.0, 300.0, 240.0], [(62, 60), (36, 34), (60, 61), (45, 46)])
    rows = [one, five]
    return {"rows": rows, "decode_ratios": decode_ratios(rows)}


def test_pairs_are_classified_by_mode_and_steadiness():
    pairs = _tool().pairs(_result(), 5)
    assert [p["mode"] for p in pairs] == ["high", "low", "unsteady", "between"]
    assert pairs[0]["ratio"] == pytest.approx(3.7) and pairs[0]["tok_s"] == 296.0


def test_summary_counts_steady_pairs_per_mode():
    lines = _tool().summarize({"a": [_result()], "b": [_result(), _result()]}, 5)
    high = [line for line in lines if "| high |" in line]
    assert high[0].startswith("| a | high | 1 | 3.70 | 1 | 296.0 |")
    assert high[1].startswith("| b | high | 2 | 3.70 | 2 | 296.0 |")


def test_checkout_of_a_revision_has_the_committed_sources(tmp_path):
    if subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True).returncode:
        pytest.skip("not a git checkout")
    _tool().checkout_csrc("HEAD", tmp_path / "csrc")
    committed = subprocess.run(["git", "ls-tree", "--name-only", "HEAD:kernels/csrc"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.split()
    assert sorted(p.name for p in (tmp_path / "csrc").iterdir()) == sorted(committed)
    assert "decoder.c" in committed


def test_an_unknown_revision_is_refused_before_anything_runs(tmp_path, capsys):
    before = sorted((ROOT / "kernels" / "csrc").iterdir())
    with pytest.raises(SystemExit) as exc:
        _tool().main(["--revs", "HEAD,no-such-revision", "--rounds", "1", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "no-such-revision" in capsys.readouterr().err
    assert sorted((ROOT / "kernels" / "csrc").iterdir()) == before and not list(tmp_path.iterdir())


def test_a_run_on_the_torch_paths_is_recognized(monkeypatch, capsys):
    """A revision whose kernels/csrc lacks a file the working tree's Python compiles must stop the
    A/B instead of timing the torch fallback: the message kernels/cpu_native.py prints then is the
    one the tool looks for."""
    from edge_runtime.kernels import cpu_native

    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler: the library never builds here")
    monkeypatch.setattr(cpu_native, "SOURCES", [*cpu_native.SOURCES, ROOT / "kernels" / "csrc" / "gone.h"])
    cpu_native.library.cache_clear()
    try:
        assert cpu_native.library() is None
    finally:
        monkeypatch.undo()
        cpu_native.library.cache_clear()
    tool = _tool()
    assert "gone.h" in tool.native_failure(capsys.readouterr().err)
    assert tool.native_failure("edge-runtime: compiling the CPU kernels (kernels/csrc)...\n") is None
