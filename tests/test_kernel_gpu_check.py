"""tools/gpu_check.py --tiny runs every check under TRITON_INTERPRET=1 and writes its JSON; the sweep
(tools/gpu_lab/sweep.py) picks the fastest correct configs."""
import importlib.util
import json
from pathlib import Path

import pytest

from kernel_helpers import HAVE_TRITON

pytestmark = pytest.mark.skipif(not HAVE_TRITON, reason="needs triton (TRITON_INTERPRET=1 on CPU)")


def _load_tool():
    path = Path(__file__).resolve().parents[1] / "tools" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_tool", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_run_checks_every_kernel(tmp_path):
    tool = _load_tool()
    out = tmp_path / "tiny.json"
    assert tool.main(["--tiny", "--sweep", "off", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    checks = {r["check"] for r in result["rows"]}
    assert {"write_kv decode", "write_kv prefill", "paged_attention decode 1 segment",
            "paged_attention decode prefix+tail", "paged_attention prefill", "w4a16 gemv", "w4a16 gemm",
            "paged_decode 1 segment", "paged_decode prefix+tail", "w4a16 prepared gemv",
            "w4a16 prepared gemm"} <= checks
    assert result["all_ok"] and not result["errors"]
    assert all(r["max_err"] <= r["tol"] for r in result["rows"])


def test_refuses_real_shapes_without_cuda(tmp_path):
    tool = _load_tool()
    if tool.torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the real-shape run is legitimate here")
    with pytest.raises(SystemExit) as exc:
        tool.main(["--json", str(tmp_path / "x.json")])
    assert exc.value.code == 2


def test_the_sweep_keeps_the_fastest_correct_config_and_one_w4a16_config_per_m_for_every_shape():
    _load_tool()  # puts tools/ on sys.path
    from gpu_lab.sweep import best_configs

    tune_a, tune_b, tune_c = {"block_n": 64}, {"block_n": 128}, {"block_n": 16}
    out = [dict(op="paged_decode", tune=tune_a, ok=True, us=5.0),
           dict(op="paged_decode", tune=tune_b, ok=True, us=4.0),
           dict(op="paged_decode", tune=tune_c, ok=False, us=1.0),  # faster but wrong
           # M=1: tune_a is the fastest on the first shape but fails the second
           dict(op="prepared M=1 K=128 N=64", tune=tune_a, ok=True, us=1.0),
           dict(op="prepared M=1 K=128 N=88", tune=tune_a, ok=False, error="OutOfResources"),
           dict(op="prepared M=1 K=128 N=64", tune=tune_b, ok=True, us=2.0),
           dict(op="prepared M=1 K=128 N=88", tune=tune_b, ok=True, us=3.0),
           dict(op="gemv M=5 K=128 N=64", tune=tune_a, ok=True, us=2.0)]  # one shape only: no pick
    best = best_configs(out, [(128, 64), (128, 88)])
    assert best["paged_decode"] == dict(op="paged_decode", tune=tune_b, ok=True, us=4.0)
    assert best["prepared M=1 K=128 N=64"]["tune"] == tune_a
    assert best["prepared M=1 all shapes"] == dict(op="prepared M=1 all shapes", tune=tune_b, us=5.0, ok=True)
    assert "gemv M=5 all shapes" not in best and "prepared M=5 all shapes" not in best
