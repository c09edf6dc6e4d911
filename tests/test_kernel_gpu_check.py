"""tools/gpu_check.py --tiny runs every check under TRITON_INTERPRET=1 and writes its JSON."""
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
    assert {"write_kv decode", "write_kv prefill", "paged decode 1 segment", "paged decode prefix+tail",
            "paged prefill", "w4a16 gemv", "w4a16 gemm", "paged decode v2 1 segment", "paged decode v2 prefix+tail",
            "w4a16 prepared gemv", "w4a16 prepared gemm"} <= checks
    assert result["all_ok"] and not result["errors"]
    assert all(r["max_err"] <= r["tol"] for r in result["rows"])


def test_refuses_real_shapes_without_cuda(tmp_path):
    tool = _load_tool()
    if tool.torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the real-shape run is legitimate here")
    with pytest.raises(SystemExit) as exc:
        tool.main(["--json", str(tmp_path / "x.json")])
    assert exc.value.code == 2
