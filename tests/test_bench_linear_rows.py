"""`edge-runtime bench linear-rows`: the C kernel and the batched matmul timed on the same rows,
a table on stdout and one JSON row per row count (tiny shapes: the numbers are not checked)."""
import json

import pytest

from edge_runtime.cli import main
from edge_runtime.kernels import cpu_native

pytestmark = pytest.mark.skipif(cpu_native.library() is None,
                                reason="no C compiler: the C kernel is not built")


def test_table_and_json(tmp_path, capsys):
    out = tmp_path / "rows.json"
    rc = main(["bench", "linear-rows", "--rows", "1,7,33", "--k", "32", "--n", "40",
               "--copies", "2", "--repeat", "1", "--json", str(out)])
    assert rc == 0
    assert "| rows | C kernel ms | batched matmul ms | C / matmul |" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert (result["bench"], result["k"], result["n"]) == ("linear-rows", 32, 40)
    assert [r["rows"] for r in result["rows"]] == [1, 7, 33]
    assert all(r["c_ms"] > 0 and r["matmul_ms"] > 0 for r in result["rows"])


def test_both_sides_compute_the_same_product():
    """What is timed is the same linear: the C kernel's output equals the batched matmul's."""
    import torch

    from edge_runtime.bench.linear_rows_bench import _packed_copies

    (linear,) = _packed_copies(32, 40, 1)
    x = torch.randn(9, 32)
    blocks = torch.matmul(x, linear.packed)  # [N/16, rows, 16]
    want = blocks.permute(1, 0, 2).reshape(9, -1)[:, :40]
    torch.testing.assert_close(linear.c_kernel(x), want, rtol=1e-5, atol=1e-5)
