"""`edge-runtime bench threads` on a tiny random model: one row per thread mode, a table and JSON
(the times themselves are not checked)."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_helpers import make_tiny_llama  # noqa: E402

from edge_runtime.bench.threads_bench import MODES  # noqa: E402
from edge_runtime.cli import main  # noqa: E402


def test_every_mode_is_timed(tmp_path, capsys):
    model = make_tiny_llama(tmp_path / "m")
    out = tmp_path / "threads.json"
    rc = main(["bench", "threads", "--model", str(model), "--rounds", "2", "--prefix", "20",
               "--suffix", "3", "--requests", "2", "--gen", "3", "--json", str(out)])
    assert rc == 0
    assert "| thread | prefill step ms | decode step ms |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert [r["mode"] for r in result["rows"]] == list(MODES)
    assert all(r["prefill_step_ms"] > 0 and r["decode_step_ms"] > 0 for r in result["rows"])
